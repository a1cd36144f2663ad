package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// What SPEC retired stays retired: the `task:` selector with its check
// recording (SPEC §7.3, §9), the operator refresh (SPEC §11.4), HMAC agent
// signatures (SPEC §3.2), GET /v1/answers/{key} (SPEC §12.5) and GET
// /stats (SPEC §13).

// TestTaskIsNoSelector: the `task:` selector is retired (SPEC §7.3, §9), so
// `task:x` is a name the registry never declared (SPEC §5.1 rule 5), even for
// an agent whose journal still holds passing `check` lines: 404
// alias_unknown before any provider call.
func TestTaskIsNoSelector(t *testing.T) {
	env := stateEnv(t)
	if err := os.MkdirAll(env["BRAMA_STATE_DIR"], 0o700); err != nil {
		t.Fatal(err)
	}
	old := `{"kind":"check","at":"2026-01-01T00:00:00.000Z","agent_id":"a1","task":"x","model":"kimi/k2","status":"pass","score":1}` + "\n"
	if err := os.WriteFile(filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl"), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	fake := newKeyedFake(t, map[string]string{"kimi-1": "200"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tok, _ := agentWithSubs(t, d, "a1", "kimi", "kimi-1")
	for _, model := range []string{"task:x", "task:Bad/Name"} {
		for _, caller := range []string{tok, d.token} {
			status, _, body := d.call("POST", "/v1/chat/completions", caller, chatBody(dialectChat, model, false, ""))
			e := envelopeOf(t, body)
			want := map[string]any{"alias": model, "state": "no_route", "route": nil}
			if status != 404 || e["code"] != "alias_unknown" || e["attempts"] != nil || !cmp.Equal(want, e["details"]) {
				t.Errorf("%s: %d %s; want 404 alias_unknown with details %v", model, status, body, want)
			}
		}
	}
	if fake.total() != 0 {
		t.Errorf("a retired task selector reached a provider: %d calls", fake.total())
	}
	if s, _, b := d.call("POST", "/v1/admin/checks", d.token, `{"agent_id":"a1","task":"x","model":"kimi/k2","status":"pass"}`); s != 404 || envelopeOf(t, b)["code"] != "not_found" {
		t.Errorf("POST /v1/admin/checks: %d %s; want 404 not_found (retired)", s, b)
	}
}

// TestRetiredCommandsAreUsageErrors: `brama subscription refresh`, `brama
// tasks record` and `brama agents add|rm` are unknown commands (exit 2, SPEC
// §3.2, §11.4, §16.1), even with a
// daemon to call and an agent to record for, and nothing is journaled.
func TestRetiredCommandsAreUsageErrors(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	withToken := map[string]string{"BRAMA_TOKEN": d.token}
	for k, v := range env {
		withToken[k] = v
	}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"subscription refresh", []string{"subscription", "refresh", "-gateway", d.url, "-reason", "rotated", "claude-code"}, `unknown command "subscription refresh"`},
		{"subscription refresh json", []string{"subscription", "refresh", "-json", "codex"}, `unknown command "subscription refresh"`},
		{"tasks record", []string{"tasks", "record", "-agent", "a1", "-model", "kimi/k2", "-status", "pass", "review"}, `unknown command "tasks"`},
		{"tasks", []string{"tasks"}, `unknown command "tasks"`},
		{"agents add", []string{"agents", "add", "a1"}, `unknown command "agents"`},
		{"agents rm", []string{"agents", "rm", "a1"}, `unknown command "agents"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, withToken, "", tc.args...)
			if code != 2 || !strings.Contains(errOut, tc.wantErr) || out != "" {
				t.Errorf("brama %v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.wantErr)
			}
		})
	}
	if _, errOut, _ := runCLI(t, env, "", "subscription"); strings.Contains(errOut, "refresh") {
		t.Errorf("`brama subscription` still offers refresh: %s", errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl")); strings.Contains(string(b), `"kind":"check"`) || strings.Contains(string(b), `"kind":"subscription_refresh"`) {
		t.Errorf("a retired command journaled: %s", b)
	}
}

// TestRefreshIsAnAgentName: with the operator refresh retired (SPEC §11.4),
// POST /v1/admin/subscriptions/refresh is the admin donation route for an
// agent named "refresh", no longer shadowed.
func TestRefreshIsAnAgentName(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	const key = "sk-refresh-agent-0123456789"
	status, _, body := d.call("POST", "/v1/admin/subscriptions/refresh", d.token, `{"provider":"kimi","api_key":"`+key+`"}`)
	id := donatedID(t, status, body, "refresh", "kimi")
	status, _, body = d.call("GET", "/v1/admin/subscriptions/refresh", d.token, "")
	if rows := listRows(t, body); status != 200 || len(rows) != 1 || rows[0].ID != id || rows[0].Provider != "kimi" {
		t.Errorf("agent refresh's listing: %d %s; want the one donated subscription %s", status, body, id)
	}
	// The old operator body is a donation body with an unknown member now.
	status, _, body = d.call("POST", "/v1/admin/subscriptions/refresh", d.token, `{"provider":"claude-code","reason":"rotate"}`)
	if e := envelopeOf(t, body); status != 400 || e["code"] != "invalid_request" {
		t.Errorf("the retired operator-refresh body: %d %s; want 400 invalid_request", status, body)
	}
	if b, _ := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl")); strings.Contains(string(b), "subscription_refresh") {
		t.Errorf("a donation journaled a refresh: %s", b)
	}
	assertNoSecret(t, key, d.stderr.String(), env["BRAMA_STATE_DIR"])
}

// TestRetiredRoutesAndAgentSignatures: GET /v1/answers/{key} and GET /stats
// are unknown paths (404 not_found, a kept answer there or not), and the
// X-Agent-* headers give no agent: only a bearer bound to one does (SPEC
// §3.2, §12.5, §13).
func TestRetiredRoutesAndAgentSignatures(t *testing.T) {
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	if s, _, b := d.call("POST", "/v1/chat/completions", d.token, answerBody("kept"), "Idempotency-Key", "k"); s != 200 {
		t.Fatalf("a kept answer: %d %s", s, b)
	}
	caller := addClient(t, env, "app")
	signed := []string{"X-Agent-Id", "a1", "X-Agent-Timestamp", "1764446400", "X-Agent-Signature", strings.Repeat("0", 64)}
	tests := []struct {
		name, method, path, token string
		hdr                       []string
		want                      int
		code                      string
	}{
		{"GET /v1/answers/{key}", "GET", "/v1/answers/k", d.token, nil, 404, "not_found"},
		{"GET /stats", "GET", "/stats", d.token, nil, 404, "not_found"},
		{"agent headers on an agent's route", "GET", "/v1/subscriptions/a1", caller, signed, 403, "forbidden"},
		{"agent headers elsewhere are ignored", "GET", "/v1/aliases", caller, signed, 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := d.call(tc.method, tc.path, tc.token, "", tc.hdr...)
			if status != tc.want || tc.code != "" && envelopeOf(t, body)["code"] != tc.code {
				t.Errorf("%d %s, want %d %s", status, body, tc.want, tc.code)
			}
		})
	}
	if n := fake.calls.Load(); n != 1 {
		t.Errorf("provider calls = %d, want the kept answer's 1", n)
	}
}

// TestVaultWithAgentSecretsIsRefused: a vault that still carries the retired
// `agents` member (HMAC signing secrets, SPEC §3.2) is refused by the strict
// decoder naming the member: /readyz says so and a vault writer exits 1;
// RELEASE.md says how to remove it.
func TestVaultWithAgentSecretsIsRefused(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	const secret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	vault := `{"schema_version":1,"direct":{},"agents":{"a1":{"signing_secret":"` + secret + `"}},"subscriptions":{}}`
	if err := os.WriteFile(filepath.Join(dir, "vault.json"), []byte(vault), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, env, "")
	status, _, body := d.call("GET", "/readyz", "", "")
	if status != 503 || !strings.Contains(string(body), `vault unusable: vault: json: unknown field \"agents\"`) {
		t.Errorf("/readyz: %d %s, want 503 naming the vault's agents member", status, body)
	}
	_, errOut, code := runCLI(t, env, "sk-test-0123456789\n", "credentials", "set", "openai")
	if code != 1 || !strings.Contains(errOut, `unknown field "agents"`) {
		t.Errorf("credentials set: exit %d %q, want 1 naming the agents member", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "vault.json")); string(b) != vault {
		t.Errorf("the refused vault was rewritten: %s", b)
	}
	assertNoSecret(t, secret, d.stderr.String()+errOut)
}
