package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// probeAnswer decodes a probe's 200 body.
type probeAnswer struct {
	OK    bool `json:"ok"`
	Probe struct {
		AtMs   int64  `json:"at_ms"`
		OK     bool   `json:"ok"`
		Detail string `json:"detail"`
	} `json:"probe"`
	Subscription struct {
		ID         string `json:"id"`
		Credential struct {
			State string `json:"state"`
		} `json:"credential"`
	} `json:"subscription"`
}

// upstreamSeen is one call a fake provider received.
type upstreamSeen struct {
	path, auth string
	body       map[string]any
}

func TestProbe(t *testing.T) {
	env := stateEnv(t)
	var mode atomic.Value // "", "401", "429", "500"
	mode.Store("")
	var mu sync.Mutex
	var seen []upstreamSeen
	prov := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var m map[string]any
		json.Unmarshal(body, &m)
		auth := r.Header.Get("Authorization")
		if auth == "" {
			auth = r.Header.Get("x-api-key")
		}
		mu.Lock()
		seen = append(seen, upstreamSeen{r.URL.Path, auth, m})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch mode.Load() {
		case "401":
			w.WriteHeader(401)
			io.WriteString(w, `{"error":{"type":"authentication_error","message":"token expired"}}`)
			return
		case "429":
			w.Header().Set("Retry-After", "600")
			w.WriteHeader(429)
			io.WriteString(w, `{"error":{"type":"rate_limit_error","message":"slow down"}}`)
			return
		case "500":
			w.WriteHeader(500)
			io.WriteString(w, `{"error":{"type":"server_error","message":"upstream down"}}`)
			return
		}
		if r.URL.Path == "/v1/messages" {
			io.WriteString(w, opAnthropicAnswer)
			return
		}
		io.WriteString(w, opChatAnswer)
	})
	te := newOpTokenEndpoint(t)
	for _, p := range []string{"KIMI", "OPENAI", "CLAUDE_CODE"} {
		env["BRAMA_PROVIDER_"+p+"_BASE_URL"] = prov.URL
	}
	env["BRAMA_OAUTH_CLAUDE_CODE_TOKEN_URL"] = te.URL + "/token"
	d := startDaemon(t, env, "")
	app := addClient(t, env, "app-a", "-agent", "a")
	donate := func(agent, body string) string {
		s, _, b := d.call("POST", "/v1/admin/subscriptions/"+agent, d.token, body)
		var req donation
		json.Unmarshal([]byte(body), &req)
		return donatedID(t, s, b, agent, req.Provider)
	}
	k1 := donate("a", `{"provider":"kimi","api_key":"sk-probe-k1-0123456789"}`)
	k2 := donate("a", `{"provider":"kimi","api_key":"sk-probe-k2-0123456789"}`)
	oa := donate("a", `{"provider":"openai","api_key":"sk-probe-oa-0123456789"}`)
	gone := donate("a", `{"provider":"kimi","api_key":"sk-probe-gone-0123456789"}`)
	cc := donate("a", `{"provider":"claude-code","oauth":{"access_token":"probe-cc-access-0123456789","refresh_token":"probe-cc-refresh-0123456789","expires_at_ms":4102444800000}}`)
	kb := donate("b", `{"provider":"kimi","api_key":"sk-probe-b-0123456789"}`)
	if s, _, b := d.call("DELETE", "/v1/admin/subscriptions/a/"+gone, d.token, "{not read"); s != 200 { // a DELETE's body is never read
		t.Fatalf("retire: %d %s", s, b)
	}
	probePath := func(agent, id string) string { return "/v1/admin/subscriptions/" + agent + "/" + id + "/probe" }

	// A real request rate-limited on both kimi subscriptions records blocks.
	blockK1 := func() {
		mode.Store("429")
		s, _, b := d.call("POST", "/v1/chat/completions", app, chatBody(dialectChat, "kimi/kimi-for-coding", false, ""))
		mode.Store("")
		if s != 429 {
			t.Fatalf("rate-limited request: %d %s", s, b)
		}
	}

	tests := []struct {
		name      string
		setup     func()
		mode      string
		path      string
		body      string
		want      int
		code      string
		calls     int    // provider calls the probe makes
		wantAuth  string // the credential the one call presented
		wantModel string
		probeOK   bool
		credState string
	}{
		{name: "default model on the named subscription", path: probePath("a", k2), want: 200, calls: 1,
			wantAuth: "Bearer sk-probe-k2-0123456789", wantModel: "kimi-for-coding", probeOK: true, credState: credActive},
		{name: "another agent's subscription", path: probePath("a", kb), want: 404, code: "not_found"},
		{name: "unknown id", path: probePath("a", "sub_0000000000000000"), want: 404, code: "not_found"},
		{name: "retired", path: probePath("a", gone), want: 409, code: "state_conflict"},
		{name: "no probe model", path: probePath("a", oa), want: 409, code: "state_conflict"},
		{name: "named model", path: probePath("a", oa), body: `{"model":"gpt-test"}`, want: 200, calls: 1,
			wantAuth: "Bearer sk-probe-oa-0123456789", wantModel: "gpt-test", probeOK: true, credState: credActive},
		{name: "a model no route can name", path: probePath("a", oa), body: `{"model":"gpt\ttest"}`, want: 404, code: "alias_unknown"},
		{name: "unknown body member", path: probePath("a", oa), body: `{"model":"gpt-test","max_tokens":5}`, want: 400, code: "invalid_request"},
		{name: "provider 500 is an answered probe", mode: "500", path: probePath("a", k2), want: 200, calls: 1,
			wantAuth: "Bearer sk-probe-k2-0123456789", probeOK: false, credState: credActive},
		{name: "401 recorded, not retried", mode: "401", path: probePath("a", cc), want: 200, calls: 1,
			wantAuth: "Bearer probe-cc-access-0123456789", wantModel: "claude-haiku-4-5", probeOK: false, credState: credNeedsReauth},
		{name: "success reactivates", path: probePath("a", cc), want: 200, calls: 1,
			wantAuth: "Bearer probe-cc-access-0123456789", wantModel: "claude-haiku-4-5", probeOK: true, credState: credActive},
		{name: "429 recorded as a block", mode: "429", path: probePath("a", k2), want: 200, calls: 1,
			wantAuth: "Bearer sk-probe-k2-0123456789", probeOK: false, credState: credActive},
		{name: "the next probe meets that block", path: probePath("a", k2), want: 409, code: "state_conflict"},
		{name: "inside a block", setup: blockK1, path: probePath("a", k1), want: 409, code: "state_conflict"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			mode.Store(tc.mode)
			defer mode.Store("")
			before, tokensBefore := prov.calls.Load(), te.calls.Load()
			s, hdr, b := d.call("POST", tc.path, d.token, tc.body)
			if got := int(prov.calls.Load() - before); got != tc.calls {
				t.Errorf("the probe made %d provider calls, want %d", got, tc.calls)
			}
			if tc.want == 200 && hdr.Get("Brama-Attempts") != fmt.Sprint(tc.calls) {
				t.Errorf("Brama-Attempts %q, want %d (SPEC §7.4)", hdr.Get("Brama-Attempts"), tc.calls)
			}
			if te.calls.Load() != tokensBefore {
				t.Errorf("the probe called the token endpoint")
			}
			if s != tc.want {
				t.Fatalf("%d %s, want %d", s, b, tc.want)
			}
			if tc.code != "" {
				if e := envelopeOf(t, b); e["code"] != tc.code {
					t.Errorf("code %v, want %s", e["code"], tc.code)
				}
				return
			}
			var ans probeAnswer
			if err := json.Unmarshal(b, &ans); err != nil || !ans.OK || ans.Probe.AtMs == 0 || ans.Probe.Detail == "" {
				t.Fatalf("probe answer: %s", b)
			}
			if ans.Probe.OK != tc.probeOK || ans.Subscription.Credential.State != tc.credState {
				t.Errorf("probe ok %v, credential %s; want %v, %s: %s", ans.Probe.OK, ans.Subscription.Credential.State, tc.probeOK, tc.credState, b)
			}
			if st := credentialStateOf(t, d, "a", ans.Subscription.ID); st != tc.credState {
				t.Errorf("listing shows %s, want %s", st, tc.credState)
			}
			mu.Lock()
			last := seen[len(seen)-1]
			mu.Unlock()
			if last.auth != tc.wantAuth {
				t.Errorf("the call presented %q, want %q", last.auth, tc.wantAuth)
			}
			if tc.wantModel != "" && last.body["model"] != tc.wantModel {
				t.Errorf("model %v, want %s", last.body["model"], tc.wantModel)
			}
			limit := "max_tokens"
			if strings.HasPrefix(tc.wantAuth, "Bearer sk-probe-oa") {
				limit = "max_completion_tokens" // openai: its reasoning models refuse max_tokens
			}
			if mt, _ := last.body[limit].(float64); mt != 16 { // SPEC §11.3
				t.Errorf("%s %v, want 16", limit, last.body[limit])
			}
			if !strings.Contains(string(mustJSON(last.body["messages"])), `"ping"`) {
				t.Errorf("the probe did not send ping: %v", last.body["messages"])
			}
			if strings.Contains(string(b), "0123456789") {
				t.Errorf("the probe answer carries a credential: %s", b)
			}
		})
	}
	// A probe refused before any call (here: a vault its guard refuses) is the probe's own refusal: no attempts key.
	vault := filepath.Join(env["BRAMA_STATE_DIR"], "vault.json")
	os.Chmod(vault, 0o644)
	before := prov.calls.Load()
	s, _, b := d.call("POST", probePath("a", oa), d.token, `{"model":"gpt-test"}`)
	os.Chmod(vault, 0o600)
	if e := envelopeOf(t, b); s != 503 || e["code"] != "credential_unauthorized" || e["attempts"] != nil || prov.calls.Load() != before {
		t.Errorf("a probe with an unreadable vault: %d %s, want 503 credential_unauthorized without attempts and no call", s, b)
	}
	logs := d.stderr.String()
	if !strings.Contains(logs, `"msg":"usage_probe_ok"`) || !strings.Contains(logs, `"msg":"usage_probe_failed"`) {
		t.Errorf("probes are not logged as usage_probe_ok / usage_probe_failed")
	}
	for _, secret := range []string{"sk-probe-k2-0123456789", "probe-cc-access-0123456789", "probe-cc-refresh-0123456789"} {
		assertNoSecret(t, secret, logsBesidesFirstStart(logs), env["BRAMA_STATE_DIR"])
	}
	// A probe is no request's use: only requests count, in the ledger (SPEC §10.3) and the perf registry (§13).
	if _, _, m := d.call("GET", "/metrics", d.token, ""); strings.Contains(string(m), `route="claude-code/`) || strings.Contains(string(m), `route="openai/`) {
		t.Errorf("/metrics counts a probe's calls:\n%s", m)
	}
	d.stop() // the ledger is written
	ledger := readLedgerFile(t, env["BRAMA_STATE_DIR"])
	if oaUse, ccUse := ledger[oa].Measured, ledger[cc].Measured; oaUse.Requests != 0 || ccUse.Requests != 0 {
		t.Errorf("measured use after probes alone: openai %+v, claude-code %+v; want none", oaUse, ccUse)
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestProbeInBandLimitBlocks: a codex probe whose answer ends with an in-band
// usage limit records the block a request's would (97aaef9), so the next probe
// is refused inside it and a request makes no call (SPEC §11.3, §7.2.4).
func TestProbeInBandLimitBlocks(t *testing.T) {
	d, fake, tok, id := codexAtItsLimit(t)
	probe := "/v1/admin/subscriptions/a1/" + id + "/probe"
	if s, _, b := d.call("POST", probe, d.token, ""); s != 200 || !strings.Contains(string(b), `"ok":false`) {
		t.Fatalf("first probe: %d %s, want 200 with probe ok false", s, b)
	}
	s, _, b := d.call("POST", probe, d.token, "")
	if e := envelopeOf(t, b); s != 409 || e["code"] != "state_conflict" {
		t.Errorf("second probe: %d %s, want 409 state_conflict inside the recorded block", s, b)
	}
	s, _, b = d.call("POST", "/v1/responses", tok, chatBody(dialectResponses, "codex/gpt-5", false, ""))
	if e := envelopeOf(t, b); s != 429 || e["code"] != "subscription_unavailable" {
		t.Errorf("a request after the probe: %d %s, want 429 subscription_unavailable", s, b)
	}
	if n := fake.calls.Load(); n != 1 {
		t.Errorf("the provider saw %d calls, want the probe's 1", n)
	}
}

// TestProbeWhoseGrantCannotBeRefreshed: a probe of an expired grant whose refresh is refused makes no call and is an
// answered probe (probe.ok false, naming the refresh), not the probe's own refusal (SPEC §11.3).
func TestProbeWhoseGrantCannotBeRefreshed(t *testing.T) {
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) { io.WriteString(w, opAnthropicAnswer) })
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, `{"error":"invalid_grant","error_description":"revoked"}`, 400)
	})
	d, _ := oauthSetup(t, provider, tokenEndpoint)
	id := donateGrant(t, d, "acc-old", "ref-old", 1) // expired long ago
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1/"+id+"/probe", d.token, "")
	var ans probeAnswer
	if json.Unmarshal(b, &ans) != nil || status != 200 || !ans.OK || ans.Probe.OK || !strings.Contains(ans.Probe.Detail, "grant refresh failed") ||
		provider.calls.Load() != 0 || tokenEndpoint.calls.Load() != 1 {
		t.Errorf("probe: %d %s, %d calls, %d refreshes; want an answered probe, ok false naming the refresh, no call",
			status, b, provider.calls.Load(), tokenEndpoint.calls.Load())
	}
}
