package main

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
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

// authenticate finds token's client, comparing every digest in constant
// time; a refusal never says whose a token is (SPEC §3.1).
func (c *clientStore) authenticate(token string) (client, error) {
	doc, err := c.load()
	if err != nil {
		return client{}, refuse("unauthenticated", "the clients file is unusable, so no token can be checked (GET /readyz says why)").because(err)
	}
	want := []byte(tokenDigest(token))
	var found client
	for _, cl := range doc.Clients {
		if subtle.ConstantTimeCompare(want, []byte(cl.TokenSHA256)) == 1 {
			found = cl
		}
	}
	if found.ID == "" { // every client has an id
		return found, refuse("unauthenticated", notAClient)
	}
	return found, nil
}

// updateClients changes the clients file under its lock (SPEC §2.3).
func updateClients(path string, fn func(d *clientsDoc) error) error {
	f := stateFile[*clientsDoc]{role: "clients file", path: path, parse: parseClients}
	return f.update(fn)
}

// notAClient is the 401 of a token no client holds (SPEC §3.1).
const notAClient = "this token is not one of this gateway's clients"

// presentedToken is the one `Authorization: Bearer` or `x-api-key` token
// (SPEC §3.1; both carrying the same one count as one), or the 401 saying
// what was wrong without quoting it.
func presentedToken(h http.Header) (string, error) {
	const twoTokens = "two tokens: send one (ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN both set?)"
	auth, toks := h.Values("Authorization"), slices.Clone(h.Values("X-Api-Key")) // never edit r.Header
	if len(auth) > 1 || len(toks) > 1 {
		return "", refuse("unauthenticated", twoTokens)
	}
	for _, a := range auth {
		scheme, tok, ok := strings.Cut(a, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			tok = "" // another scheme carries no token of Brama's
		}
		toks = append(toks, tok)
	}
	for i := range toks {
		toks[i] = strings.TrimSpace(toks[i])
	}
	toks = slices.Compact(slices.DeleteFunc(toks, func(t string) bool { return t == "" }))
	switch {
	case len(toks) == 0:
		return "", refuse("unauthenticated", "no token: send Authorization: Bearer <token> or x-api-key")
	case len(toks) > 1 || strings.Contains(toks[0], ","): // one token, never a list
		return "", refuse("unauthenticated", twoTokens)
	case strings.ContainsAny(toks[0], " \t"): // e.g. x-api-key: Bearer …
		return "", refuse("unauthenticated", notAClient)
	}
	return toks[0], nil
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
