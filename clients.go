package main

// Clients (SPEC §3.1): who may call, kept as digests of their bearer tokens in
// clients.json; the HTTP face that reads a presented token is server.go.

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// client is one bearer-token holder (SPEC §3.1), kept in clients.json; only the token's SHA-256 is kept.
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

// Roles of a client (SPEC §3.1), and the 401 of a token no client holds.
const (
	roleAdmin, roleCaller = "admin", "caller"
	notAClient            = "this token is not one of this gateway's clients"
)

// clientsDoc is clients.json: every client, each with its token's digest only.
type clientsDoc struct {
	Clients []client `json:"clients"`
}

// parseClients strictly parses clients.json; nil, no file, is no clients.
func parseClients(b []byte) (*clientsDoc, error) {
	doc := &clientsDoc{Clients: []client{}}
	if b == nil {
		return doc, nil
	}
	return doc, decodeStrict("clients file", b, doc)
}

// validate applies SPEC §3.1's rules, naming the first one a client breaks.
func (doc *clientsDoc) validate() error {
	ids, digests := map[string]bool{}, map[string]bool{}
	for i, c := range doc.Clients {
		if err := firstBroken([]rule{
			{!idPattern.MatchString(c.ID), "id must match [a-z0-9-]{1,64}"},
			{ids[c.ID], "duplicate client id"},
			{!isHexDigest(c.TokenSHA256), "token_sha256 must be 64 lower-case hex characters"},
			{digests[c.TokenSHA256], "duplicate token digest"},
			{c.Role != roleAdmin && c.Role != roleCaller, "role must be admin or caller"},
			{c.AgentID != "" && !idPattern.MatchString(c.AgentID), "agent_id must match [a-z0-9-]{1,64}"},
			{slices.ContainsFunc(c.AllowedModels, func(m string) bool { return strings.TrimSpace(m) == "" || strings.Contains(m, "*") }),
				"allowed_models entries must be exact names (no empty or wildcard entry)"},
		}); err != nil {
			return fmt.Errorf("clients file: client %d (%q): %v", i, c.ID, err)
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

func tokenDigest(token string) string { return hexSHA256([]byte(token)) }

// clientStore is the clients file, re-read on change (SPEC §2.3), or without a state directory the process's memory.
type clientStore struct {
	stateFile[*clientsDoc]
	memory *clientsDoc
}

func newClientStore(path string, pathErr error) *clientStore {
	return &clientStore{stateFile: stateFile[*clientsDoc]{role: "clients file", path: path, pathErr: pathErr, parse: parseClients, absentErr: true}}
}

func (c *clientStore) load() (*clientsDoc, error) {
	if c.memory != nil {
		return c.memory, nil
	}
	return c.stateFile.load()
}

// authenticate finds token's client, comparing every digest in constant time; a refusal never says whose a token is (SPEC §3.1).
func (c *clientStore) authenticate(token string) (found client, err error) {
	doc, err := c.load()
	if err != nil {
		return found, refuse("unauthenticated", "the clients file is unusable, so no token can be checked (GET /readyz says why)").because(err)
	}
	want := []byte(tokenDigest(token))
	for _, cl := range doc.Clients {
		if subtle.ConstantTimeCompare(want, []byte(cl.TokenSHA256)) == 1 {
			found = cl
		}
	}
	if found.ID == "" { // every client has an id
		err = refuse("unauthenticated", notAClient)
	}
	return found, err
}

// update changes the clients file under its lock (SPEC §2.3); an absent file is an empty one.
func (c *clientStore) update(fn func(d *clientsDoc) error) error {
	return (&stateFile[*clientsDoc]{role: "clients file", path: c.path, pathErr: c.pathErr, parse: parseClients}).update(fn)
}

// ensureFirstClient creates the admin client "local", its token printed once, when no clients file exists (SPEC
// §3.1); in memory with no state (§2.1).
func ensureFirstClient(c *clientStore, stderr io.Writer) error {
	tok := newToken()
	local, kept, created := client{ID: "local", TokenSHA256: tokenDigest(tok), Role: roleAdmin}, "", c.pathErr != nil
	if created {
		c.memory, kept = &clientsDoc{Clients: []client{local}}, fmt.Sprintf(" for this process only (not kept: %v)", c.pathErr)
	} else if _, err := c.load(); !errors.Is(err, errFileAbsent) {
		return err // nil, or a clients file that must be repaired before serving
	} else if err := c.update(func(d *clientsDoc) error {
		if created = len(d.Clients) == 0; created {
			d.Clients = append(d.Clients, local)
		}
		return nil
	}); err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stderr, "brama: created admin client \"local\"%s; bearer token (shown once): %s\n", kept, tok)
	}
	return nil
}

func hexSHA256(b []byte) string { return fmt.Sprintf("%x", sha256.Sum256(b)) }

func isHexDigest(s string) bool { return len(s) == 64 && strings.Trim(s, "0123456789abcdef") == "" }
