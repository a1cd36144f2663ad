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
	"slices"
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

// mayUse applies allowed_models (SPEC §3.1): none listed, any model.
func (c client) mayUse(model string) bool {
	return c.AllowedModels == nil || slices.Contains(c.AllowedModels, model)
}

// clientsDoc is clients.json.
type clientsDoc struct {
	Clients []client `json:"clients"`
}

// idPattern is the rule for client and agent ids.
var idPattern = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// parseClients strictly parses clients.json (decodeStrict, then validate);
// nil, no file, is no clients.
func parseClients(b []byte) (*clientsDoc, error) {
	if b == nil {
		return &clientsDoc{Clients: []client{}}, nil
	}
	doc := &clientsDoc{}
	if err := decodeStrict("clients file", b, doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// validate applies SPEC §3.1's rules, naming the one that failed.
func (doc *clientsDoc) validate() error {
	ids, digests := map[string]bool{}, map[string]bool{}
	for i, c := range doc.Clients {
		switch {
		case !idPattern.MatchString(c.ID):
			return fmt.Errorf("clients file: client %d: id %q must match [a-z0-9-]{1,64}", i, c.ID)
		case ids[c.ID]:
			return fmt.Errorf("clients file: duplicate client id %q", c.ID)
		case !isHexDigest(c.TokenSHA256):
			return fmt.Errorf("clients file: client %q: token_sha256 must be 64 lower-case hex characters", c.ID)
		case digests[c.TokenSHA256]:
			return fmt.Errorf("clients file: client %q: duplicate token digest", c.ID)
		case c.Role != roleAdmin && c.Role != roleCaller:
			return fmt.Errorf("clients file: client %q: role must be admin or caller", c.ID)
		case c.AgentID != "" && !idPattern.MatchString(c.AgentID):
			return fmt.Errorf("clients file: client %q: agent_id must match [a-z0-9-]{1,64}", c.ID)
		case slices.ContainsFunc(c.AllowedModels, func(m string) bool { return strings.TrimSpace(m) == "" || strings.Contains(m, "*") }):
			return fmt.Errorf("clients file: client %q: allowed_models entries must be exact names (no empty or wildcard entry)", c.ID)
		}
		ids[c.ID], digests[c.TokenSHA256] = true, true
	}
	return nil
}

// newToken makes a bearer token: "brama_" and 43 base64url characters.
func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return "brama_" + base64.RawURLEncoding.EncodeToString(b)
}

// tokenDigest is the stored form of a token.
func tokenDigest(token string) string { return hexSHA256([]byte(token)) }

// hexSHA256 is b's SHA-256 in lower-case hex.
func hexSHA256(b []byte) string {
	d := sha256.Sum256(b)
	return hex.EncodeToString(d[:])
}

// isHexDigest reports whether s is a SHA-256 in lower-case hex.
func isHexDigest(s string) bool { return len(s) == 64 && isLowerHex(s) }

// isLowerHex reports whether s is bytes in lower-case hex.
func isLowerHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// clientStore is the clients file, re-read on change (SPEC §2.3), or the
// process-only client when there is no state directory.
type clientStore struct {
	stateFile[*clientsDoc]
	memory *clientsDoc // process-only clients (no state directory); set before serving
}

// newClientStore opens the clients file at path; pathErr says why there is none.
func newClientStore(path string, pathErr error) *clientStore {
	return &clientStore{stateFile: stateFile[*clientsDoc]{role: "clients file", path: path, pathErr: pathErr, parse: parseClients, absentErr: true}}
}

// load returns the current clients, re-reading on change.
func (c *clientStore) load() (*clientsDoc, error) {
	if c.memory != nil {
		return c.memory, nil
	}
	return c.stateFile.load()
}

// authenticate finds token's client, comparing every digest in constant time.
func (c *clientStore) authenticate(token string) (client, bool) {
	doc, err := c.load()
	if err != nil || token == "" {
		return client{}, false
	}
	want := []byte(tokenDigest(token))
	var found client
	for _, cl := range doc.Clients {
		if subtle.ConstantTimeCompare(want, []byte(cl.TokenSHA256)) == 1 {
			found = cl
		}
	}
	return found, found.ID != "" // every client has an id
}

// updateClients changes the clients file under its lock (SPEC §2.3).
func updateClients(path string, fn func(d *clientsDoc) error) error {
	f := stateFile[*clientsDoc]{role: "clients file", path: path, parse: parseClients}
	return f.update(fn)
}

// presentedToken is the one `Authorization: Bearer` or `x-api-key` token
// (SPEC §3.1); anything else is "", which no client matches.
func presentedToken(h http.Header) string {
	auth, key := h.Values("Authorization"), h.Values("X-Api-Key")
	if len(auth)+len(key) != 1 {
		return ""
	}
	tok := strings.Join(key, "") // the one x-api-key, or ""
	if len(auth) == 1 {
		scheme, rest, ok := strings.Cut(auth[0], " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return ""
		}
		tok = rest
	}
	tok = strings.TrimSpace(tok)
	if strings.ContainsAny(tok, " \t,") { // one token, never a list
		return ""
	}
	return tok
}

// signatureWindow bounds an agent timestamp's distance from now (SPEC §3.2);
// replayMemory is how long an accepted signature is remembered.
const (
	signatureWindow = 300 * time.Second
	replayMemory    = 600 * time.Second
)

// agentVerifier checks HMAC agent signatures and refuses replays, from a
// memory kept only in this process.
type agentVerifier struct {
	secret func(agent string) (string, error)
	now    func() time.Time
	seen   signatureMemory
}

// newAgentVerifier checks signatures with the agents' secrets on clock now.
func newAgentVerifier(secret func(agent string) (string, error), now func() time.Time) *agentVerifier {
	return &agentVerifier{secret: secret, now: now, seen: signatureMemory{until: map[string]time.Time{}}}
}

// errAgentSignature is every agent-signature refusal; the client learns only 401.
var errAgentSignature = errors.New("agent signature refused")

// agentClaim is what a request's agent headers say, checked before the body
// its signature covers is read.
type agentClaim struct {
	agent, ts, sig, secret string
	now                    time.Time
}

// claim checks r's agent headers before its body is read (SPEC §3.2); no
// agent headers give a zero claim.
func (a *agentVerifier) claim(r *http.Request) (agentClaim, error) {
	c := agentClaim{agent: r.Header.Get("X-Agent-Id"), ts: r.Header.Get("X-Agent-Timestamp"), sig: r.Header.Get("X-Agent-Signature")}
	if c.agent == "" && c.ts == "" && c.sig == "" {
		return c, nil
	}
	c.now = a.now()
	var secretErr error
	known := func() bool { c.secret, secretErr = a.secret(c.agent); return c.secret != "" }
	var why string
	switch {
	case c.agent == "" || c.ts == "" || c.sig == "":
		why = "missing header"
	case !idPattern.MatchString(c.agent):
		why = "bad agent id"
	case !agentTimestamp.MatchString(c.ts):
		why = "malformed timestamp"
	case c.now.Sub(agentTime(c.ts)).Abs() > signatureWindow:
		why = "timestamp outside the ±300 s window"
	case !known():
		if secretErr != nil {
			return c, vaultUnreadable(secretErr) // the vault failed, not the signature (SPEC §2.2)
		}
		why = "unknown agent"
	case !isLowerHex(c.sig):
		why = "signature is not lower-case hex"
	case a.seen.holds(c.sig, c.now):
		why = "replayed signature"
	default:
		return c, nil
	}
	return c, fmt.Errorf("%w: %s", errAgentSignature, why)
}

// confirm checks c's signature over r and body and accepts it once, returning
// the agent id ("" for a zero claim).
func (a *agentVerifier) confirm(r *http.Request, c agentClaim, body []byte) (string, error) {
	if c.agent == "" {
		return "", nil
	}
	got, _ := hex.DecodeString(c.sig) // claim checked the form
	if !hmac.Equal(got, agentSignature(c.secret, c.agent, c.ts, r.Method, r.URL.EscapedPath(), body)) {
		return "", fmt.Errorf("%w: bad signature", errAgentSignature)
	}
	if !a.seen.remember(c.sig, c.now) {
		return "", fmt.Errorf("%w: replayed signature", errAgentSignature)
	}
	return c.agent, nil
}

// signatureMemory remembers accepted signatures for replayMemory, a map and a
// queue to forget in order (issue 10: a whole scan cut throughput sevenfold).
type signatureMemory struct {
	mu    sync.Mutex           // guards until, queue, head
	until map[string]time.Time // signature hex → when it may be forgotten
	queue []string             // signatures in acceptance order; queue[head:] is live
	head  int
}

// holds reports whether sig is remembered at now.
func (m *signatureMemory) holds(sig string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	until, ok := m.until[sig]
	return ok && !now.After(until)
}

// remember forgets expired signatures, then records sig unless it is held (a
// replay: false).
func (m *signatureMemory) remember(sig string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ; m.head < len(m.queue) && now.After(m.until[m.queue[m.head]]); m.head++ {
		delete(m.until, m.queue[m.head])
		m.queue[m.head] = ""
	}
	if m.head > len(m.queue)/2 {
		m.queue, m.head = append(m.queue[:0], m.queue[m.head:]...), 0
	}
	if until, ok := m.until[sig]; ok && !now.After(until) {
		return false
	}
	m.until[sig] = now.Add(replayMemory)
	m.queue = append(m.queue, sig)
	return true
}

// agentSignature is HMAC-SHA256 over `<agent>:<ts>:<METHOD>:<path>:<hex sha256(body)>`.
func agentSignature(secret, agent, ts, method, path string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(m, "%s:%s:%s:%s:%s", agent, ts, strings.ToUpper(method), path, hexSHA256(body))
	return m.Sum(nil)
}

// agentTimestamp is unix seconds with an optional 1–9 digit fraction.
var agentTimestamp = regexp.MustCompile(`^[0-9]{1,12}(\.[0-9]{1,9})?$`)

// agentTime is a timestamp agentTimestamp matched, as a time.
func agentTime(ts string) time.Time {
	f, _ := strconv.ParseFloat(ts, 64) // the pattern admits only finite decimals
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9))
}

// transportGuard decides whether a peer may speak plain HTTP (SPEC §3.3):
// loopback always, a trusted proxy that says the client used https.
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

// allows reports whether r came over an acceptable transport. A forwarded
// header counts by its last element, the trusted proxy's own (RFC 7239 §4),
// and every one that names a proto must say https: a proxy passes on the
// header it does not set as the client wrote it.
func (g transportGuard) allows(r *http.Request) bool {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	ip := net.ParseIP(host) // nil when RemoteAddr is not host:port
	switch {
	case ip == nil:
		return false
	case ip.IsLoopback():
		return true
	case !g.trusted[ip.String()]:
		return false
	}
	last := func(name string) string {
		v := strings.Join(r.Header.Values(name), ",")
		return strings.TrimSpace(v[strings.LastIndex(v, ",")+1:])
	}
	xfp, fwd := last("X-Forwarded-Proto"), ""
	for _, el := range strings.Split(last("Forwarded"), ";") {
		if k, v, ok := strings.Cut(strings.TrimSpace(el), "="); ok && strings.EqualFold(k, "proto") {
			fwd = strings.Trim(v, `"`)
		}
	}
	https := func(proto string) bool { return proto == "" || strings.EqualFold(proto, "https") }
	return xfp+fwd != "" && https(xfp) && https(fwd)
}
