package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// count_tokens on an anthropic-messages route forwards to the provider's
// own count, one attempt, and relays {"input_tokens":n}; on any other
// route it answers the local estimate with no call (SPEC §15).
func TestCountTokens(t *testing.T) {
	anth := newRecordingProvider(t, `{"input_tokens":42}`, "")
	chat := newRecordingProvider(t, protocolFixtures[0].buffered, "")
	cc := newRecordingProvider(t, `{"input_tokens":7}`, "")
	env := stateEnv(t)
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = anth.URL
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = chat.URL
	env["BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL"] = cc.URL
	d := startDaemon(t, env, fmt.Sprintf(`{"anthropic":%q,"openai":%q}`, plantedAnthropicKey, plantedOpenAIKey), "-local-credentials-stdin")
	tok := addClient(t, env, "a1-app", "-agent", "a1")
	const access = "oauth-access-count-0123456789"
	s, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, fmt.Sprintf(`{"provider":"claude-code","oauth":{"access_token":%q,"refresh_token":"r-0123456789","expires_at_ms":%d}}`, access, time.Now().Add(time.Hour).UnixMilli()))
	donatedID(t, s, b, "a1", "claude-code")

	t.Run("anthropic forwards", func(t *testing.T) {
		body := `{"model":"anthropic/claude-test","messages":[{"role":"user","content":"hi"}],"system":"s"}`
		status, h, got := d.call("POST", "/v1/messages/count_tokens", d.token, body, "Idempotency-Key", "count-1", "anthropic-beta", "token-counting-2024-11-01")
		if status != 200 || string(got) != `{"input_tokens":42}`+"\n" || h.Get("Brama-Attempts") != "1" || h.Get("Brama-Route") != "anthropic/claude-test" {
			t.Fatalf("%d attempts %q route %q: %q", status, h.Get("Brama-Attempts"), h.Get("Brama-Route"), got)
		}
		if h.Get("Brama-Answer-Signature") != "" || h.Get("Brama-Estimate") != "" {
			t.Errorf("a forwarded count is signed or marked an estimate: %v", h)
		}
		c := anth.last(t)
		if c.path != "/v1/messages/count_tokens" || string(c.body) != strings.Replace(body, "anthropic/claude-test", "claude-test", 1) ||
			c.header.Get("x-api-key") != plantedAnthropicKey || c.header.Get("anthropic-beta") != "token-counting-2024-11-01" {
			t.Errorf("provider got %s %s %v", c.path, c.body, c.header)
		}
	})
	t.Run("claude-code forwards with the OAuth rules", func(t *testing.T) {
		body := `{"model":"claude-code/claude-test","messages":[{"role":"user","content":"hi"}]}`
		status, _, got := d.call("POST", "/v1/messages/count_tokens", tok, body)
		if status != 200 || string(got) != `{"input_tokens":7}`+"\n" {
			t.Fatalf("%d %s", status, got)
		}
		c := cc.last(t)
		want := `{"model":"claude-test","messages":[{"role":"user","content":"hi"}],"system":[{"text":"You are Claude Code, Anthropic's official CLI for Claude.","type":"text"}]}`
		if string(c.body) != want || c.header.Get("Authorization") != "Bearer "+access || c.header.Get("anthropic-beta") != "oauth-2025-04-20" {
			t.Errorf("provider got %s %v; want %s", c.body, c.header, want)
		}
	})
	t.Run("a refusal is one attempt", func(t *testing.T) {
		cc.refuse = func(recordedCall) (int, string) {
			return 429, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`
		}
		defer func() { cc.refuse = nil }()
		before := cc.count()
		status, h, got := d.call("POST", "/v1/messages/count_tokens", tok, `{"model":"claude-code/claude-test","messages":[]}`)
		if status != 429 || cc.count()-before != 1 || h.Get("Brama-Attempts") != "1" {
			t.Errorf("%d after %d calls: %s", status, cc.count()-before, got)
		}
	})
	t.Run("other routes estimate", func(t *testing.T) {
		tools := `[{"name":"t","input_schema":{"type":"object"}}]`
		body := `{"model":"openai/gpt-test","system":[{"type":"text","text":"abcd"}],"messages":[` +
			`{"role":"user","content":"hello world!"},` +
			`{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"x","name":"t","input":{"a":1}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":"result"}]}],"tools":` + tools + `}`
		n := len("abcd") + len("hello world!") + len("ok") + len(`{"a":1}`) + len("result") + len(tools)
		status, h, got := d.call("POST", "/v1/messages/count_tokens", d.token, body)
		if want := fmt.Sprintf(`{"input_tokens":%d}`+"\n", (n+3)/4); status != 200 || string(got) != want {
			t.Errorf("%d %q, want %q", status, got, want)
		}
		if h.Get("Brama-Estimate") != "true" || chat.count() != 0 {
			t.Errorf("Brama-Estimate %q, %d provider calls; want true and none", h.Get("Brama-Estimate"), chat.count())
		}
		if got := h.Get("Brama-Route"); got != "openai/gpt-test" { // REFERENCE: an estimate names the resolved route
			t.Errorf("Brama-Route %q, want openai/gpt-test", got)
		}
	})
	t.Run("refusals before any call", func(t *testing.T) {
		for _, bad := range []string{`{"messages":[]}`, `{"model":"nobody/x"}`, `not json`} {
			if status, _, got := d.call("POST", "/v1/messages/count_tokens", d.token, bad); status < 400 || status > 404 {
				t.Errorf("%s: %d %s", bad, status, got)
			}
		}
		if status, _, _ := d.call("POST", "/v1/messages/count_tokens", "", `{"model":"anthropic/claude-test"}`); status != http.StatusUnauthorized {
			t.Errorf("no bearer: %d", status)
		}
	})
	assertNoSecret(t, access, d.stderr.String(), env["BRAMA_STATE_DIR"])
}
