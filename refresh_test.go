package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
)

func TestOperatorRefresh(t *testing.T) {
	env := stateEnv(t)
	addAgent(t, env, "a")
	addAgent(t, env, "b")
	te := newOpTokenEndpoint(t)
	var mu sync.Mutex
	byGrant := map[string]int{} // refresh calls per original grant (the prefix before "-n")
	failing := map[string]bool{"planted-r3": true}
	te.refresh = func(rt string) (int, string) {
		orig, _, _ := strings.Cut(rt, "-n")
		mu.Lock()
		defer mu.Unlock()
		byGrant[orig]++
		switch {
		case failing[orig]:
			return 400, `{"error":"invalid_grant","error_description":"refresh token revoked"}`
		case orig == "planted-r2" && byGrant[orig] > 1:
			return 503, `{"error":"temporarily_unavailable"}`
		}
		return 200, fmt.Sprintf(`{"access_token":"acc-%s-%d","refresh_token":"%s-n%d","expires_in":3600}`, orig, byGrant[orig], orig, byGrant[orig])
	}
	env["BRAMA_OAUTH_CLAUDE_CODE_TOKEN_URL"] = te.URL + "/token"
	env["BRAMA_OAUTH_CODEX_TOKEN_URL"] = te.URL + "/token"
	d := startDaemon(t, env, "")
	withToken := maps.Clone(env)
	withToken["BRAMA_TOKEN"] = d.token
	donate := func(agent, provider, cred string) string {
		s, _, b := d.call("POST", "/v1/admin/subscriptions/"+agent, d.token, fmt.Sprintf(`{"provider":%q,%s}`, provider, cred))
		return donatedID(t, s, b, agent, provider)
	}
	grant := func(n string) string {
		return fmt.Sprintf(`"oauth":{"access_token":"planted-a%s","refresh_token":"planted-r%s","expires_at_ms":4102444800000}`, n, n)
	}
	c1 := donate("a", "claude-code", grant("1"))
	donate("b", "claude-code", grant("2"))
	c3 := donate("a", "claude-code", grant("3"))
	c4 := donate("a", "claude-code", grant("4"))
	donate("a", "codex", grant("5"))
	donate("a", "claude-code", `"api_key":"sk-refresh-key-0123456789"`)
	if s, _, b := d.call("DELETE", "/v1/admin/subscriptions/a/"+c4, d.token, ""); s != 200 {
		t.Fatalf("retire: %d %s", s, b)
	}

	tests := []struct {
		name      string
		body      string
		want      int
		code      string
		result    string
		attempted int
		detail    string
		calls     map[string]int // refresh calls per grant after this step
	}{
		{name: "empty reason", body: `{"provider":"claude-code","reason":""}`, want: 400, code: "invalid_request"},
		{name: "no reason member", body: `{"provider":"claude-code"}`, want: 400, code: "invalid_request"},
		{name: "provider without grants", body: `{"provider":"openai","reason":"x"}`, want: 400, code: "invalid_request"},
		{name: "unknown member", body: `{"provider":"claude-code","reason":"x","force":true}`, want: 400, code: "invalid_request"},
		{name: "one refused", body: `{"provider":"claude-code","reason":"tokens revoked upstream"}`, want: 200,
			result: "failed", attempted: 3, detail: c3,
			calls: map[string]int{"planted-r1": 1, "planted-r2": 1, "planted-r3": 1}},
		{name: "refused grant waits for a sign-in", body: `{"provider":"claude-code","reason":"again"}`, want: 200,
			result: "failed", attempted: 2, detail: "HTTP 503",
			calls: map[string]int{"planted-r1": 2, "planted-r2": 2, "planted-r3": 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(opJournal(t, env, "subscription_refresh"))
			s, _, b := d.call("POST", "/v1/admin/subscriptions/refresh", d.token, tc.body)
			if s != tc.want {
				t.Fatalf("%d %s, want %d", s, b, tc.want)
			}
			recs := opJournal(t, env, "subscription_refresh")
			if tc.code != "" {
				if e := envelopeOf(t, b); e["code"] != tc.code {
					t.Errorf("code %v, want %s", e["code"], tc.code)
				}
				if len(recs) != before {
					t.Errorf("a refused refresh was journaled")
				}
				return
			}
			var out refreshOutcome
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatal(err)
			}
			if out.Provider != "claude-code" || out.Result != tc.result || out.Attempted != tc.attempted || !strings.Contains(out.Detail, tc.detail) {
				t.Errorf("answer %+v, want %s attempted %d mentioning %q", out, tc.result, tc.attempted, tc.detail)
			}
			if len(recs) != before+1 {
				t.Fatalf("%d subscription_refresh records, want %d", len(recs), before+1)
			}
			var body struct{ Reason string }
			json.Unmarshal([]byte(tc.body), &body)
			r := recs[len(recs)-1]
			if r.Provider != "claude-code" || r.Reason != body.Reason || r.Result != tc.result || r.Attempted == nil || *r.Attempted != tc.attempted || r.Detail != out.Detail {
				t.Errorf("journal record %+v does not match the answer %+v", r, out)
			}
			mu.Lock()
			got := maps.Clone(byGrant)
			mu.Unlock()
			if !maps.Equal(got, tc.calls) {
				t.Errorf("refresh calls per grant = %v, want %v (retired, codex and api-key subscriptions never)", got, tc.calls)
			}
		})
	}
	if st := credentialStateOf(t, d, "a", c3); st != credNeedsReauth {
		t.Errorf("the refused grant is %s, want needs_reauthorization", st)
	}
	if g := readVaultSubs(t, env)[c1].OAuth; g == nil || g.RefreshToken != "planted-r1-n2" {
		t.Errorf("c1's grant after two refreshes = %+v", g)
	}

	// The CLI goes through the same route and exits 1 unless every attempted
	// refresh succeeded.
	mu.Lock()
	failing["planted-r2"] = true // b's grant is refused now: only c1 stays active
	mu.Unlock()
	cli := []struct {
		name     string
		args     []string
		code     int
		mentions string
	}{
		{"one refused", []string{"claude-code", "-reason", "cli run"}, 1, "failed claude-code: attempted 2"},
		{"all refreshed", []string{"-reason", "cli again", "claude-code"}, 0, "refreshed claude-code: attempted 1"},
		{"no reason", []string{"claude-code"}, 2, "-reason"},
		{"no provider", []string{"-reason", "x"}, 2, "usage"},
	}
	for _, tc := range cli {
		t.Run("cli "+tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, withToken, "", append([]string{"subscription", "refresh", "-gateway", d.url}, tc.args...)...)
			if code != tc.code || !strings.Contains(out+errOut, tc.mentions) {
				t.Errorf("exit %d, %q %q; want %d mentioning %q", code, out, errOut, tc.code, tc.mentions)
			}
		})
	}
	if n := len(opJournal(t, env, "subscription_refresh")); n != 4 {
		t.Errorf("%d subscription_refresh records, want 4", n)
	}
	for _, secret := range []string{"planted-r1-n1", "planted-r1-n2", "acc-planted-r1-2", "planted-r3"} {
		assertNoSecret(t, secret, logsBesidesFirstStart(d.stderr.String()), env["BRAMA_STATE_DIR"])
	}
}
