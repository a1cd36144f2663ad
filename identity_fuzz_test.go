package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// FuzzParseClients: the clients file parser never panics, and an accepted
// file re-encodes to one that parses to the same clients.
func FuzzParseClients(f *testing.F) {
	dig := strings.Repeat("a", 64)
	f.Add([]byte(`{"clients":[{"id":"local","token_sha256":"` + dig + `","role":"admin"}]}`))
	f.Add([]byte(`{"clients":[{"id":"app","token_sha256":"` + dig + `","role":"caller","agent_id":"a1","allowed_models":["chat"]}]}`))
	f.Add([]byte(`{"clients":[],"clients":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		doc, err := parseClients(b)
		if err != nil {
			return
		}
		again, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		doc2, err := parseClients(again)
		if err != nil {
			t.Fatalf("re-encoded clients file refused: %v", err)
		}
		if diff := cmp.Diff(doc, doc2); diff != "" {
			t.Fatalf("round trip changed the clients (-first +second):\n%s", diff)
		}
	})
}

// FuzzParseVault: the vault parser never panics, and an accepted vault
// re-encodes to one that parses the same.
func FuzzParseVault(f *testing.F) {
	f.Add([]byte(`{"schema_version":1,"direct":{"openai":{"api_key":"sk-x"}},"subscriptions":{}}`))
	f.Add([]byte(`{"schema_version":1,"subscriptions":{"sub_0123456789abcdef":{"oauth":{"access_token":"a","refresh_token":"r","expires_at_ms":1}}}}`))
	f.Add([]byte(``))
	f.Add([]byte(`{"schema_version":1,"direct":{"openai":{"api_key":"A"}},"Direct":{"openai":{"API_KEY":"B"}}}`)) // refused: names are exact
	f.Fuzz(func(t *testing.T, b []byte) {
		doc, err := newVault("", nil).parse(b)
		if err != nil {
			return
		}
		again, err := marshalState(doc)
		if err != nil {
			t.Fatal(err)
		}
		doc2, err := newVault("", nil).parse(again)
		if err != nil {
			t.Fatalf("re-encoded vault refused: %v", err)
		}
		if diff := cmp.Diff(doc, doc2); diff != "" {
			t.Fatalf("round trip changed the vault (-first +second):\n%s", diff)
		}
	})
}
