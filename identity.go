package main

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Roles a client may hold (SPEC §3.1).
const (
	roleAdmin  = "admin"
	roleCaller = "caller"
)

// client is one bearer-token holder. Only the token's SHA-256 is kept.
type client struct {
	ID            string   `json:"id"`
	TokenSHA256   string   `json:"token_sha256"`
	Role          string   `json:"role"`
	AgentID       string   `json:"agent_id,omitempty"`
	AllowedModels []string `json:"allowed_models,omitempty"`
}

// clientsDoc is clients.json.
type clientsDoc struct {
	Clients []client `json:"clients"`
}

// idPattern is the rule for client and agent ids.
var idPattern = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// parseClients strictly parses clients.json and applies SPEC §3.1's rules,
// naming the one that failed.
func parseClients(b []byte) (*clientsDoc, error) {
	doc := &clientsDoc{}
	if err := decodeStrict("clients file", b, doc); err != nil {
		return nil, err
	}
	ids, digests := map[string]bool{}, map[string]bool{}
	for i, c := range doc.Clients {
		switch {
		case !idPattern.MatchString(c.ID):
			return nil, fmt.Errorf("clients file: client %d: id %q must match [a-z0-9-]{1,64}", i, c.ID)
		case ids[c.ID]:
			return nil, fmt.Errorf("clients file: duplicate client id %q", c.ID)
		case len(c.TokenSHA256) != 64 || strings.ToLower(c.TokenSHA256) != c.TokenSHA256 || !isHex(c.TokenSHA256):
			return nil, fmt.Errorf("clients file: client %q: token_sha256 must be 64 lower-case hex characters", c.ID)
		case digests[c.TokenSHA256]:
			return nil, fmt.Errorf("clients file: client %q: duplicate token digest", c.ID)
		case c.Role != roleAdmin && c.Role != roleCaller:
			return nil, fmt.Errorf("clients file: client %q: role must be admin or caller", c.ID)
		case c.AgentID != "" && !idPattern.MatchString(c.AgentID):
			return nil, fmt.Errorf("clients file: client %q: agent_id must match [a-z0-9-]{1,64}", c.ID)
		}
		for _, m := range c.AllowedModels {
			if strings.TrimSpace(m) == "" || strings.Contains(m, "*") {
				return nil, fmt.Errorf("clients file: client %q: allowed_models entries must be exact names (no empty or wildcard entry)", c.ID)
			}
		}
		ids[c.ID], digests[c.TokenSHA256] = true, true
	}
	return doc, nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

// newToken makes a bearer token: "brama_" and 43 base64url characters.
func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return "brama_" + base64.RawURLEncoding.EncodeToString(b)
}

// tokenDigest is the stored form of a token.
func tokenDigest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// clientStore holds the clients file, re-read when its identity changes
// (SPEC §2.3), or the one process-only client when there is no file.
type clientStore struct {
	path    string
	pathErr error

	mu     sync.Mutex // guards doc, id, err, memory
	doc    *clientsDoc
	id     fileIdentity
	err    error
	memory *clientsDoc // process-only clients (no state directory)
}

// load returns the current clients, re-reading on change.
func (c *clientStore) load() (*clientsDoc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.memory != nil {
		return c.memory, nil
	}
	if c.pathErr != nil {
		return nil, c.pathErr
	}
	id, err := guardFile("clients file", c.path)
	if err != nil {
		return nil, err
	}
	if c.doc != nil && id == c.id {
		return c.doc, c.err
	}
	doc, err := readClients(c.path)
	c.doc, c.id, c.err = doc, id, err
	return doc, err
}

// readClients reads and validates the clients file.
func readClients(path string) (*clientsDoc, error) {
	b, _, err := readGuarded("clients file", path)
	if err != nil {
		return nil, err
	}
	return parseClients(b)
}

// authenticate finds the client presenting token, comparing its digest with
// every stored digest in constant time.
func (c *clientStore) authenticate(token string) (client, bool) {
	doc, err := c.load()
	if err != nil || token == "" {
		return client{}, false
	}
	want := []byte(tokenDigest(token))
	var found client
	ok := false
	for _, cl := range doc.Clients {
		if subtle.ConstantTimeCompare(want, []byte(cl.TokenSHA256)) == 1 {
			found, ok = cl, true
		}
	}
	return found, ok
}

// updateClients changes the clients file under its lock (SPEC §2.3).
func updateClients(path string, fn func(d *clientsDoc) error) error {
	read := func() (*clientsDoc, error) {
		doc, err := readClients(path)
		if errors.Is(err, errFileAbsent) {
			return &clientsDoc{Clients: []client{}}, nil
		}
		return doc, err
	}
	return editLocked(path, read, func(d *clientsDoc) error {
		if err := fn(d); err != nil {
			return err
		}
		b, err := marshalState(d) // the result must still be a valid clients file
		if err != nil {
			return err
		}
		_, err = parseClients(b)
		return err
	})
}

// bearerToken extracts the one bearer token of r; a missing or repeated
// Authorization header, or another scheme, gives "".
func bearerToken(r *http.Request) string {
	vals := r.Header.Values("Authorization")
	if len(vals) != 1 {
		return ""
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" || strings.Contains(tok, ",") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// signatureWindow is how far an agent timestamp may be from now (SPEC §3.2);
// replayMemory is how long an accepted signature is remembered.
const (
	signatureWindow = 300 * time.Second
	replayMemory    = 600 * time.Second
)

// agentVerifier checks HMAC agent signatures and refuses replays. The
// memory of accepted signatures lives only in this process.
type agentVerifier struct {
	secret func(agent string) (string, bool)
	now    func() time.Time

	mu   sync.Mutex           // guards seen
	seen map[string]time.Time // signature hex → when it may be forgotten
}

// errAgentSignature is every agent-signature refusal; the client learns
// only "unauthorized".
var errAgentSignature = errors.New("agent signature refused")

// verify checks the agent headers of r against body and returns the agent
// id. A request without X-Agent-Id returns "" and no error.
func (a *agentVerifier) verify(r *http.Request, body []byte) (string, error) {
	agent := r.Header.Get("X-Agent-Id")
	ts := r.Header.Get("X-Agent-Timestamp")
	sig := r.Header.Get("X-Agent-Signature")
	if agent == "" && ts == "" && sig == "" {
		return "", nil
	}
	if agent == "" || ts == "" || sig == "" {
		return "", fmt.Errorf("%w: missing header", errAgentSignature)
	}
	if !idPattern.MatchString(agent) {
		return "", fmt.Errorf("%w: bad agent id", errAgentSignature)
	}
	at, err := parseAgentTimestamp(ts)
	if err != nil {
		return "", fmt.Errorf("%w: %v", errAgentSignature, err)
	}
	now := a.now()
	if d := now.Sub(at); d > signatureWindow || d < -signatureWindow {
		return "", fmt.Errorf("%w: timestamp outside the ±300 s window", errAgentSignature)
	}
	secret, ok := a.secret(agent)
	if !ok {
		return "", fmt.Errorf("%w: unknown agent", errAgentSignature)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || strings.ToLower(sig) != sig {
		return "", fmt.Errorf("%w: signature is not lower-case hex", errAgentSignature)
	}
	if !hmac.Equal(got, agentSignature(secret, agent, ts, r.Method, r.URL.EscapedPath(), body)) {
		return "", fmt.Errorf("%w: bad signature", errAgentSignature)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, until := range a.seen {
		if now.After(until) {
			delete(a.seen, k)
		}
	}
	if _, dup := a.seen[sig]; dup {
		return "", fmt.Errorf("%w: replayed signature", errAgentSignature)
	}
	a.seen[sig] = now.Add(replayMemory)
	return agent, nil
}

// agentSignature is HMAC-SHA256 over `<agent>:<ts>:<METHOD>:<path>:<hex sha256(body)>`.
func agentSignature(secret, agent, ts, method, path string, body []byte) []byte {
	sum := sha256.Sum256(body)
	m := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(m, "%s:%s:%s:%s:%s", agent, ts, strings.ToUpper(method), path, hex.EncodeToString(sum[:]))
	return m.Sum(nil)
}

// agentTimestamp is unix seconds with an optional 1–9 digit fraction.
var agentTimestamp = regexp.MustCompile(`^[0-9]{1,12}(\.[0-9]{1,9})?$`)

func parseAgentTimestamp(ts string) (time.Time, error) {
	if !agentTimestamp.MatchString(ts) {
		return time.Time{}, errors.New("malformed timestamp")
	}
	f, err := strconv.ParseFloat(ts, 64)
	if err != nil || math.IsInf(f, 0) {
		return time.Time{}, errors.New("malformed timestamp")
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), nil
}

// transportGuard decides whether a peer may speak plain HTTP (SPEC §3.3):
// loopback peers always; trusted proxies only when they say the client used
// https. Forwarded headers from anyone else are ignored.
type transportGuard struct {
	trusted map[string]bool // canonical IP strings from BRAMA_TRUSTED_PROXY_IPS
}

func newTransportGuard(list string) (transportGuard, error) {
	g := transportGuard{trusted: map[string]bool{}}
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' }) {
		ip := net.ParseIP(f)
		if ip == nil {
			return g, fmt.Errorf("BRAMA_TRUSTED_PROXY_IPS: %q is not an IP address", f)
		}
		g.trusted[ip.String()] = true
	}
	return g, nil
}

// allows reports whether r came over an acceptable transport.
func (g transportGuard) allows(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	if !g.trusted[ip.String()] {
		return false
	}
	if strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https") {
		return true
	}
	for _, el := range strings.Split(r.Header.Get("Forwarded"), ";") {
		if k, v, ok := strings.Cut(strings.TrimSpace(el), "="); ok && strings.EqualFold(k, "proto") && strings.EqualFold(strings.Trim(v, `"`), "https") {
			return true
		}
	}
	return false
}
