package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// seedReading records a reading for id as a usage pass would have, one
// window per reset, under the ids provider's report names (so a new reading
// replaces them all).
func (fx *maintFixture) seedReading(id, provider string, ok bool, resets ...time.Time) {
	ids := map[string][]string{
		"claude-code": {"anthropic:5h", "anthropic:7d"},
		"codex":       {"codex:primary", "codex:secondary"},
		"kimi":        {"kimi:usage", "kimi:limit-0"},
	}[provider]
	var ws []planWindow
	for i, r := range resets {
		w := planWindow{ID: ids[i], Label: "seeded", UsedFraction: 0.5, RecordedAtMs: fx.clock.now().UnixMilli(), Source: "usage_report"}
		if !r.IsZero() {
			w.ResetsAtMs = r.UnixMilli()
		}
		ws = append(ws, w)
	}
	fx.l.recordWindows(id, provider, ws)
	fx.l.recordCheck(id, provider, false, ok, "seeded")
}

// TestUsagePassReadsOnlyWhenDue proves SPEC §11.2's "read once when": a
// fresh reading naming its reset is read zero times, a reading whose reset
// passed (and each other due case) exactly once, a failed read is not
// retried within the pass (only by the next one) and keeps earlier windows.
func TestUsagePassReadsOnlyWhenDue(t *testing.T) {
	fx := newMaintFixture(t)
	now := fx.clock.now()
	type sub struct {
		name  string
		setup func(id string)
		key   string
		reads int // within one pass
	}
	subs := []sub{
		{name: "fresh reading naming its reset", reads: 0, setup: func(id string) { fx.seedReading(id, "kimi", true, now.Add(time.Hour)) }},
		{name: "a window's reset passed", reads: 1, setup: func(id string) { fx.seedReading(id, "kimi", true, now.Add(time.Hour), now.Add(-time.Minute)) }},
		{name: "reset exactly now", reads: 1, setup: func(id string) { fx.seedReading(id, "kimi", true, now) }},
		{name: "reading naming no reset", reads: 1, setup: func(id string) { fx.seedReading(id, "kimi", true, time.Time{}) }},
		{name: "failed last read", reads: 1, setup: func(id string) { fx.seedReading(id, "kimi", false, now.Add(time.Hour)) }},
		{name: "no reading yet", reads: 1, setup: func(string) {}},
		{name: "failing provider", reads: 1, setup: func(id string) { fx.seedReading(id, "kimi", true, now.Add(-time.Minute)) }},
		{name: "retired", reads: 0, setup: func(id string) {
			if err := fx.inv.setRetired("retire", "a1", id, "gone"); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "needs reauthorization", reads: 0, setup: func(id string) { fx.l.disown(id, "kimi", "refused") }},
	}
	ids := map[string]string{}
	for i := range subs {
		subs[i].key = "plantedKimiKey" + string(rune('A'+i))
		id := fx.donate(t, "kimi", vaultCredential{APIKey: subs[i].key})
		ids[subs[i].name] = id
		subs[i].setup(id)
	}
	fx.donate(t, "openai", vaultCredential{APIKey: "plantedOpenAIKey"}) // publishes no report
	failingKey := subs[6].key
	fx.fake.handle(fakeKimiUsage, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+failingKey {
			http.Error(w, "overloaded "+failingKey, http.StatusServiceUnavailable)
			return
		}
		fx.fake.defaultAnswer(w, r)
	})

	rep := fx.m.passOnce(context.Background(), "")
	for _, s := range subs {
		if got := fx.fake.count(fakeKimiUsage, s.key); got != s.reads {
			t.Errorf("%s: read %d times in one pass, want %d", s.name, got, s.reads)
		}
	}
	wantFailed := []usageFailure{{SubscriptionID: ids["failing provider"], Provider: "kimi",
		Error: "usage report GET " + fx.fake.URL + "/kimi/usages: HTTP 503, " + strconv.Itoa(len("overloaded ")+len(failingKey)+1) + " bytes received"}}
	if diff := cmp.Diff(wantFailed, rep.Usage.Failed); diff != "" {
		t.Errorf("failed reads (-want +got):\n%s", diff)
	}
	if rep.OK || rep.Usage.Subscriptions != 7 || rep.Usage.Read != 5 || rep.Credentials != (credentialSummary{}) {
		t.Errorf("report = %+v; want not ok, 7 subscriptions, 5 read", rep)
	}
	e := fx.l.entry(ids["failing provider"])
	if e.UsageRead.OK || len(e.Windows) != 1 || e.Windows[0].Label != "seeded" || strings.Contains(e.UsageRead.Detail, failingKey) {
		t.Errorf("failed read entry = %+v; want ok=false with the earlier window kept and no key", e)
	}
	e = fx.l.entry(ids["a window's reset passed"])
	if !e.UsageRead.OK || len(e.Windows) != 2 || e.Windows[0].Label == "seeded" || e.Windows[1].Label == "seeded" {
		t.Errorf("read entry = %+v; want both seeded windows replaced by the report's", e)
	}

	// The next pass reads the failed one again (once) and nothing else.
	rep = fx.m.passOnce(context.Background(), "")
	for _, s := range subs {
		want := s.reads
		if s.key == failingKey {
			want = 2
		}
		if got := fx.fake.count(fakeKimiUsage, s.key); got != want {
			t.Errorf("after the second pass %s was read %d times, want %d", s.name, got, want)
		}
	}
	if rep.Usage.Read != 0 || len(rep.Usage.Failed) != 1 {
		t.Errorf("second report = %+v", rep)
	}
	assertNoSecret(t, failingKey, fx.logs.String())
}

// TestRefreshPassDefinitiveRefusal proves SPEC §11.2's refresh rules: one
// attempt per due grant per pass, no retry; invalid_grant marks the
// credential needs_reauthorization and no later pass calls its token
// endpoint (or reads its report) until a sign-in replaces the grant.
func TestRefreshPassDefinitiveRefusal(t *testing.T) {
	fx := newMaintFixture(t)
	now := fx.clock.now()
	cc := fx.donate(t, "claude-code", grant("CC", now.Add(-time.Minute)))
	fx.seedReading(cc, "claude-code", true, now.Add(time.Hour)) // isolate the refresh pass
	cx := fx.donate(t, "codex", grant("CX", time.Time{}))       // expiry unknown, never refreshed
	fx.seedReading(cx, "codex", true, now.Add(time.Hour))
	fresh := fx.donate(t, "kimi", grant("KO", now.Add(time.Hour))) // not due
	fx.seedReading(fresh, "kimi", true, now.Add(time.Hour))
	fx.fake.handle("/token/claude-code", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"invalid_grant","error_description":"Refresh token revoked"}`, http.StatusBadRequest)
	})

	rep := fx.m.passOnce(context.Background(), "")
	if want := (credentialSummary{Subscriptions: 3, Refreshed: 1, Refused: 1}); rep.Credentials != want || rep.OK {
		t.Errorf("first pass credentials = %+v ok=%v, want %+v and not ok", rep.Credentials, rep.OK, want)
	}
	if fx.l.entry(cc).Credential.State != credNeedsReauth {
		t.Fatalf("claude-code credential = %s, want needs_reauthorization", fx.l.entry(cc).Credential.State)
	}
	if n := fx.fake.count("/token/codex"); n != 1 {
		t.Errorf("codex token calls = %d, want 1 (expiry unknown, never refreshed)", n)
	}
	if n := fx.fake.count("/token/kimi"); n != 0 {
		t.Errorf("the fresh kimi grant was refreshed %d times", n)
	}

	for i := 0; i < 3; i++ {
		fx.clock.advance(2 * time.Hour) // every reading's reset passes: the usage pass reads the active ones
		rep = fx.m.passOnce(context.Background(), "")
		if rep.Credentials.Subscriptions != 2 {
			t.Errorf("pass %d counted %d active OAuth subscriptions, want 2", i, rep.Credentials.Subscriptions)
		}
	}
	if n := fx.fake.count("/token/claude-code"); n != 1 {
		t.Errorf("the refused grant's token endpoint was called %d times, want 1", n)
	}
	if n := fx.fake.count(fakeClaudeUsage); n != 0 {
		t.Errorf("the refused credential's report was read %d times", n)
	}
	if n := fx.fake.count("/token/codex"); n != 1 {
		t.Errorf("codex token calls = %d, want still 1 (refreshed once, expiry now known)", n)
	}

	// A sign-in replaces the grant: the next pass refreshes it (it is
	// expired) exactly once.
	fx.fake.handle("/token/claude-code", nil)
	signIn := grant("CC2", fx.clock.now().Add(-time.Second))
	if _, err := fx.inv.store(overlayItem{AgentID: "a1", ID: cc}, signIn, ""); err != nil {
		t.Fatal(err)
	}
	rep = fx.m.passOnce(context.Background(), "")
	if n := fx.fake.count("/token/claude-code"); n != 2 {
		t.Errorf("after the sign-in the token endpoint was called %d times in total, want 2", n)
	}
	if fx.l.entry(cc).Credential.State != credActive || rep.Credentials.Refreshed != 1 || !rep.OK {
		t.Errorf("after the sign-in: state %s, report %+v", fx.l.entry(cc).Credential.State, rep)
	}
	if n := fx.fake.count(fakeClaudeUsage, signIn.OAuth.AccessToken); n != 0 {
		t.Errorf("the expired signed-in token was sent to the usage report %d times; the refreshed one should be", n)
	}
	assertNoSecret(t, "plantedRefreshCC", fx.logs.String())
}

// TestRefreshPassTransportFailure proves a transport failure leaves the
// credential active and is tried again by the next pass, once per pass.
func TestRefreshPassTransportFailure(t *testing.T) {
	fx := newMaintFixture(t)
	now := fx.clock.now()
	id := fx.donate(t, "kimi", grant("KO", now.Add(-time.Minute)))
	fx.seedReading(id, "kimi", true, now.Add(24*time.Hour))
	fx.fake.handle("/token/kimi", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream unwell", http.StatusBadGateway)
	})
	for pass := 1; pass <= 2; pass++ {
		rep := fx.m.passOnce(context.Background(), "")
		if rep.OK || rep.Credentials != (credentialSummary{Subscriptions: 1, Refused: 1}) {
			t.Errorf("pass %d: %+v", pass, rep)
		}
		if n := fx.fake.count("/token/kimi"); n != pass {
			t.Errorf("after pass %d: %d token calls, want %d", pass, n, pass)
		}
		if st := fx.l.entry(id).Credential.State; st != credActive {
			t.Errorf("after pass %d: credential %s, want active", pass, st)
		}
	}
}

// TestUsageReadRequests proves each read sends its provider's chat-route
// headers to its report, stores usage_report windows, and that an expired
// grant is refreshed before its read (the pass's one attempt for it).
func TestUsageReadRequests(t *testing.T) {
	fx := newMaintFixture(t)
	now := fx.clock.now()
	cc := fx.donate(t, "claude-code", grant("CC", now.Add(30*time.Second))) // expired for a request
	cxGrant := grant("CX", now.Add(time.Hour))
	cxGrant.OAuth.AccountID = "acct-123"
	fx.donate(t, "codex", cxGrant)
	fx.donate(t, "kimi", grant("KO", now.Add(time.Hour)))
	fx.donate(t, "codex", vaultCredential{APIKey: "plantedCodexKey"}) // no report for an API key

	rep := fx.m.passOnce(context.Background(), "")
	if !rep.OK || rep.Usage.Subscriptions != 3 || rep.Usage.Read != 3 || rep.Credentials.Refreshed != 1 {
		t.Fatalf("report = %+v", rep)
	}
	cases := []struct {
		name string
		path string
		want map[string]string // header → value ("" must be absent)
	}{
		// A usage read is a GET without a body: the chat route's headers
		// but no Content-Type.
		{name: "claude-code", path: fakeClaudeUsage, want: map[string]string{
			"Anthropic-Version": "2023-06-01", "Anthropic-Beta": "oauth-2025-04-20", "Chatgpt-Account-Id": "", "Originator": "", "Content-Type": "", "Accept": "application/json"}},
		{name: "codex", path: fakeCodexUsage, want: map[string]string{
			"Authorization": "Bearer plantedAccessCX", "Chatgpt-Account-Id": "acct-123", "Openai-Beta": "responses=experimental",
			"Originator": "codex_cli_rs", "Anthropic-Beta": "", "Content-Type": "", "Accept": "application/json"}},
		{name: "kimi", path: fakeKimiUsage, want: map[string]string{
			"Authorization": "Bearer plantedAccessKO", "Anthropic-Beta": "", "Originator": "", "Content-Type": "", "Accept": "application/json"}},
		// A refresh asks for JSON, which some token endpoints send only when asked.
		{name: "claude-code refresh", path: "/token/claude-code", want: map[string]string{"Accept": "application/json"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := fx.fake.header(tc.path)
			if h == nil {
				t.Fatalf("%s was not read", tc.path)
			}
			for k, v := range tc.want {
				if got := h.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
	if fx.fake.count(fakeClaudeUsage, "plantedAccessCC") != 0 || fx.fake.count("/token/claude-code") != 1 {
		t.Errorf("the expiring claude-code grant was not refreshed before its read")
	}
	if !strings.HasPrefix(fx.fake.header(fakeClaudeUsage).Get("Authorization"), "Bearer renewedAccess") {
		t.Errorf("claude-code read with %q, want the renewed token", fx.fake.header(fakeClaudeUsage).Get("Authorization"))
	}
	if fx.fake.count(fakeCodexUsage, "plantedCodexKey") != 0 {
		t.Error("a codex API key was sent to the ChatGPT usage report")
	}
	e := fx.l.entry(cc)
	var ids []string
	for _, w := range e.Windows {
		ids = append(ids, w.ID+"/"+w.Source)
	}
	if diff := cmp.Diff([]string{"anthropic:5h/usage_report", "anthropic:7d/usage_report"}, ids); diff != "" {
		t.Errorf("claude-code windows (-want +got):\n%s", diff)
	}
}

// TestUsageReadAfterARefusedRefresh proves a grant expired for a request
// whose refresh (the pass's one attempt) is refused is not read with its
// expired token: the credential is needs_reauthorization, and SPEC §11.2
// reads only active ones; the failure names the refresh.
func TestUsageReadAfterARefusedRefresh(t *testing.T) {
	fx := newMaintFixture(t)
	id := fx.donate(t, "claude-code", grant("CC", fx.clock.now().Add(30*time.Second))) // expired for a request
	fx.fake.handle("/token/claude-code", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"invalid_grant","error_description":"Refresh token revoked"}`, http.StatusBadRequest)
	})
	rep := fx.m.passOnce(context.Background(), "")
	if n := fx.fake.count(fakeClaudeUsage); n != 0 {
		t.Errorf("the refused credential's report was read %d times", n)
	}
	if n := fx.fake.count("/token/claude-code"); n != 1 {
		t.Errorf("token endpoint called %d times, want 1 (the pass's one attempt)", n)
	}
	if len(rep.Usage.Failed) != 1 || !strings.HasPrefix(rep.Usage.Failed[0].Error, "not read: the expired grant could not be refreshed: ") {
		t.Errorf("failed = %+v, want the refresh's failure", rep.Usage.Failed)
	}
	if st := fx.l.entry(id).Credential.State; st != credNeedsReauth || rep.Credentials.Refused != 1 {
		t.Errorf("credential %s, report %+v; want needs_reauthorization, one refused", st, rep.Credentials)
	}
}

// TestUsageReadFailuresQuoteNothing proves a failed read's recorded and
// logged sentence names the endpoint, status and size but never the body
// or a token, whatever the provider sent back.
func TestUsageReadFailuresQuoteNothing(t *testing.T) {
	cases := []struct {
		name   string
		answer http.HandlerFunc
		want   string
	}{
		{name: "refusal echoing the token", answer: func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad token "+r.Header.Get("Authorization"), http.StatusForbidden)
		}, want: "HTTP 403"},
		{name: "html", answer: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("<html>" + r.Header.Get("Authorization") + "</html>"))
		}, want: "HTTP 200, 41 bytes received: the usage report is not usable: the body is not a JSON object (syntax error at byte 1)"},
		{name: "no windows", answer: func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"account":"` + r.Header.Get("Authorization") + `"}`))
		}, want: "names no plan window"},
		{name: "hang-up", answer: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(200)
			w.Write([]byte(`{"five_hour":`))
		}, want: "the body ended early"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newMaintFixture(t)
			id := fx.donate(t, "claude-code", grant("CCsecret", fx.clock.now().Add(time.Hour)))
			fx.fake.handle(fakeClaudeUsage, tc.answer)
			rep := fx.m.passOnce(context.Background(), "")
			if len(rep.Usage.Failed) != 1 || !strings.Contains(rep.Usage.Failed[0].Error, tc.want) {
				t.Fatalf("failed = %+v, want an error containing %q", rep.Usage.Failed, tc.want)
			}
			e := fx.l.entry(id)
			if e.UsageRead.OK || e.UsageRead.Detail != rep.Usage.Failed[0].Error {
				t.Errorf("usage_read = %+v", e.UsageRead)
			}
			if strings.Contains(rep.Usage.Failed[0].Error, "plantedAccessCCsecret") {
				t.Errorf("the error quotes the token: %s", rep.Usage.Failed[0].Error)
			}
			assertNoSecret(t, "plantedAccessCCsecret", fx.logs.String())
		})
	}
}

func TestUsageAndRefreshDue(t *testing.T) {
	now := maintT0
	ms := now.UnixMilli()
	read := ledgerCheck{AtMs: ms - 1000, OK: true}
	win := func(reset int64) []planWindow { return []planWindow{{ID: "x", ResetsAtMs: reset}} }
	usage := []struct {
		name string
		e    ledgerEntry
		want bool
	}{
		{name: "never read", e: ledgerEntry{Windows: win(ms + 1)}, want: true},
		{name: "failed read", e: ledgerEntry{UsageRead: ledgerCheck{AtMs: 1}, Windows: win(ms + 1)}, want: true},
		{name: "no windows", e: ledgerEntry{UsageRead: read}, want: true},
		{name: "reset unknown", e: ledgerEntry{UsageRead: read, Windows: win(0)}, want: true},
		{name: "reset passed", e: ledgerEntry{UsageRead: read, Windows: win(ms)}, want: true},
		{name: "fresh", e: ledgerEntry{UsageRead: read, Windows: win(ms + 1)}, want: false},
	}
	for _, tc := range usage {
		t.Run("usage "+tc.name, func(t *testing.T) {
			if got := usageDue(tc.e, now); got != tc.want {
				t.Errorf("usageDue = %v, want %v", got, tc.want)
			}
		})
	}
	refresh := []struct {
		name        string
		expires     int64
		refreshedAt int64
		want        bool
	}{
		{name: "expired", expires: ms, want: true},
		{name: "expires within the request path's minute", expires: ms + 30_000, want: false},
		{name: "valid", expires: ms + 3_600_000, want: false},
		{name: "unknown, never refreshed", want: true},
		{name: "unknown, refreshed before", refreshedAt: ms - 1, want: false},
	}
	for _, tc := range refresh {
		t.Run("refresh "+tc.name, func(t *testing.T) {
			if got := refreshDue(oauthGrant{ExpiresAtMs: tc.expires}, tc.refreshedAt, now); got != tc.want {
				t.Errorf("refreshDue = %v, want %v", got, tc.want)
			}
		})
	}
	reportable := []struct {
		provider string
		cred     vaultCredential
		want     bool
	}{
		{"claude-code", vaultCredential{OAuth: &oauthGrant{}}, true},
		{"claude-code", vaultCredential{APIKey: "k"}, false},
		{"codex", vaultCredential{OAuth: &oauthGrant{}}, true},
		{"codex", vaultCredential{APIKey: "k"}, false},
		{"kimi", vaultCredential{OAuth: &oauthGrant{}}, true},
		{"kimi", vaultCredential{APIKey: "k"}, true},
		{"openai", vaultCredential{APIKey: "k"}, false},
		{"anthropic", vaultCredential{APIKey: "k"}, false},
	}
	for _, tc := range reportable {
		if p, _ := lookupProvider(tc.provider); p.usageReadable(tc.cred) != tc.want {
			t.Errorf("usageReadable(%s, api key %v) = %v", tc.provider, tc.cred.APIKey != "", !tc.want)
		}
	}
}

func TestUsageEndpoints(t *testing.T) {
	cases := []struct {
		name     string
		provider string
		env      map[string]string
		want     string // "" means refused
	}{
		{name: "claude-code default", provider: "claude-code", want: "https://api.anthropic.com/api/oauth/usage"},
		{name: "codex default", provider: "codex", want: "https://chatgpt.com/backend-api/wham/usage"},
		{name: "kimi default", provider: "kimi", want: "https://api.kimi.com/coding/v1/usages"},
		{name: "claude-code base override", provider: "claude-code", env: map[string]string{"BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL": "http://127.0.0.1:9/"}, want: "http://127.0.0.1:9/api/oauth/usage"},
		{name: "codex usage override", provider: "codex", env: map[string]string{"BRAMA_PROVIDER_CODEX_USAGE_URL": "https://proxy.example/wham"}, want: "https://proxy.example/wham"},
		{name: "codex base does not move the report", provider: "codex", env: map[string]string{"BRAMA_PROVIDER_CODEX_BASE_URL": "http://127.0.0.1:9"}, want: "https://chatgpt.com/backend-api/wham/usage"},
		{name: "codex usage over plain http", provider: "codex", env: map[string]string{"BRAMA_PROVIDER_CODEX_USAGE_URL": "http://example.com/wham"}},
		{name: "kimi bad base", provider: "kimi", env: map[string]string{"BRAMA_PROVIDER_KIMI_BASE_URL": "ftp://x"}},
		{name: "openai has none", provider: "openai"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := lookupProvider(tc.provider)
			got, err := p.usageEndpoint(func(k string) string { return tc.env[k] })
			if (err == nil) != (tc.want != "") || got != tc.want {
				t.Errorf("usageEndpoint = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// usageT0 is the injected "now" of the parser tests.
var usageT0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// uw is a usage_report window recorded at usageT0.
func uw(id, label string, frac float64, resetMs int64) planWindow {
	return planWindow{ID: id, Label: label, UsedFraction: frac, ResetsAtMs: resetMs, RecordedAtMs: usageT0.UnixMilli(), Source: "usage_report"}
}

func TestParseUsageReports(t *testing.T) {
	ms := usageT0.UnixMilli()
	const resetISO, resetMs = "2030-01-02T08:00:00.5+00:00", int64(1893571200500)
	cases := []struct {
		name     string
		provider string
		body     string
		want     []planWindow
		wantErr  string // substring; "" means accepted
	}{
		{name: "claude-code published shape", provider: "claude-code", body: `{
			"five_hour":{"utilization":24.0,"resets_at":"` + resetISO + `"},
			"seven_day":{"utilization":36,"resets_at":1893900000},
			"seven_day_sonnet":{"utilization":1.0,"resets_at":null},
			"seven_day_opus":null,
			"seven_day_oauth_apps":{"utilization":null,"resets_at":null},
			"extra_usage":{"is_enabled":true,"monthly_limit":100,"used_credits":5,"utilization":5.0}}`,
			want: []planWindow{
				uw("anthropic:5h", "5 hours", 0.24, resetMs),
				uw("anthropic:7d", "7 days", 0.36, 1893900000000),
				uw("anthropic:seven_day_sonnet", "seven day sonnet", 0.01, 0),
			}},
		{name: "claude-code clamps and reads epoch ms", provider: "claude-code",
			body: `{"five_hour":{"utilization":180,"resets_at":1893571200500},"seven_day":{"utilization":-4,"resets_at":"soon"}}`,
			want: []planWindow{uw("anthropic:5h", "5 hours", 1, resetMs), uw("anthropic:7d", "7 days", 0, 0)}},
		{name: "claude-code odd member names are not ids", provider: "claude-code",
			body: `{"Five Hour":{"utilization":10,"resets_at":null},"five_hour":{"utilization":"10","resets_at":null}}`,
			want: []planWindow{uw("anthropic:5h", "5 hours", 0.1, 0)}},
		{name: "claude-code no window", provider: "claude-code", body: `{"extra_usage":{"utilization":3}}`, wantErr: "names no plan window"},
		{name: "claude-code not an object", provider: "claude-code", body: `[1,2]`, wantErr: "not a JSON object"},
		{name: "claude-code null", provider: "claude-code", body: `null`, wantErr: "not a JSON object"},
		{name: "claude-code not JSON", provider: "claude-code", body: `<html>sk-ant-oat01-secret</html>`, wantErr: "syntax error"},

		{name: "codex published shape", provider: "codex", body: `{"plan_type":"pro","rate_limit":{"allowed":true,
			"primary_window":{"used_percent":3,"limit_window_seconds":18000,"reset_after_seconds":15858,"reset_at":1893571200},
			"secondary_window":{"used_percent":9.5,"limit_window_seconds":604800,"reset_after_seconds":489450}}}`,
			want: []planWindow{
				uw("codex:primary", "5 hours", 0.03, 1893571200000),
				uw("codex:secondary", "7 days", 0.095, ms+489450_000),
			}},
		{name: "codex secondary null, odd window, clamped", provider: "codex",
			body: `{"rate_limit":{"primary_window":{"used_percent":"250","limit_window_seconds":90,"reset_at":"2030-01-02T08:00:00.5Z"},"secondary_window":null}}`,
			want: []planWindow{uw("codex:primary", "primary window", 1, resetMs)}},
		{name: "codex bad resets are unknown", provider: "codex",
			body: `{"rate_limit":{"primary_window":{"used_percent":50,"reset_at":-5,"reset_after_seconds":-1}}}`,
			want: []planWindow{uw("codex:primary", "primary window", 0.5, 0)}},
		{name: "codex no rate_limit", provider: "codex", body: `{"detail":"Unauthorized"}`, wantErr: "names no plan window"},
		{name: "codex windows without used_percent", provider: "codex", body: `{"rate_limit":{"primary_window":{"limit_window_seconds":18000}}}`, wantErr: "names no plan window"},

		{name: "kimi published shape", provider: "kimi", body: `{
			"user":{"userId":"u1"},
			"usage":{"limit":"100","used":"4","remaining":"96","resetTime":"` + resetISO + `"},
			"limits":[
				{"window":{"duration":300,"timeUnit":"TIME_UNIT_MINUTE"},"detail":{"limit":"100","used":"18","remaining":"82","resetTime":"2030-01-02T04:00:00Z"}},
				{"window":{"duration":7,"timeUnit":"TIME_UNIT_DAY"},"detail":{"limit":"1000","remaining":"750"}}]}`,
			want: []planWindow{
				uw("kimi:usage", "plan usage", 0.04, resetMs),
				uw("kimi:limit-0", "5 hours", 0.18, 1893556800000),
				uw("kimi:limit-1", "7 days", 0.25, 0),
			}},
		{name: "kimi SPEC names, counters at top level", provider: "kimi", body: `{
			"usage":{"limit":500,"remaining":400,"reset_time":1893571200},
			"limits":[
				{"limit":100,"used":150,"reset_time":"1893571200500","window":{"duration":5,"timeUnit":"TIME_UNIT_HOUR"}},
				{"limit":0,"used":1},
				"junk",
				{"detail":{"limit":10,"used":1},"resetTime":1893571200,"window":{"duration":1,"timeUnit":"TIME_UNIT_FORTNIGHT"}}]}`,
			want: []planWindow{
				uw("kimi:usage", "plan usage", 0.2, 1893571200000),
				uw("kimi:limit-0", "5 hours", 1, resetMs),
				uw("kimi:limit-3", "limit 3", 0.1, 1893571200000),
			}},
		{name: "kimi limit without used or remaining names nothing", provider: "kimi", body: `{"usage":{"limit":"100"},"limits":[{"detail":{"limit":10}}]}`,
			wantErr: "names no plan window"},
		{name: "kimi limit 0 names nothing", provider: "kimi", body: `{"usage":{"limit":"0","used":"0"},"limits":{}}`, wantErr: "names no plan window"},
		{name: "kimi empty", provider: "kimi", body: `{}`, wantErr: "names no plan window"},
		{name: "kimi not JSON", provider: "kimi", body: ``, wantErr: "not a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := lookupProvider(tc.provider)
			got, err := p.readUsage([]byte(tc.body), usageT0)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if !strings.HasPrefix(err.Error(), "the usage report is not usable: ") {
					t.Errorf("err %v does not say the report is not usable", err)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Errorf("the error quotes the body: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("windows (-want +got):\n%s", diff)
			}
		})
	}
}

func TestUsageInstant(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		want int64 // 0: unknown
	}{
		{name: "rfc3339", raw: `"2030-01-02T03:04:05Z"`, want: 1893553445000},
		{name: "rfc3339 offset and fraction", raw: `"2030-01-02T04:04:05.25+01:00"`, want: 1893553445250},
		{name: "epoch seconds", raw: `1893553445`, want: 1893553445000},
		{name: "epoch seconds fraction", raw: `1893553445.5`, want: 1893553445500},
		{name: "epoch ms", raw: `1893553445123`, want: 1893553445123},
		{name: "just below the ms threshold is seconds", raw: `999999999999`, want: 0}, // year 33658: past the bound
		{name: "numeric string", raw: `" 1893553445 "`, want: 1893553445000},
		{name: "zero", raw: `0`},
		{name: "negative", raw: `-1893553445`},
		{name: "before the epoch", raw: `"1969-12-31T23:59:59Z"`},
		{name: "too far", raw: `1e15`},
		{name: "null", raw: `null`},
		{name: "bool", raw: `true`},
		{name: "words", raw: `"tomorrow"`},
		{name: "NaN string", raw: `"NaN"`},
		{name: "Inf string", raw: `"+Inf"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got number
			if err := json.Unmarshal([]byte(tc.raw), &got); err != nil || got.ms != tc.want || !got.set {
				t.Errorf("instant(%s) = %+v, %v; want %d", tc.raw, got, err, tc.want)
			}
		})
	}
}

// checkUsageParse is the fuzz invariant shared by the three reports: no
// panic, every error classified, every accepted window well-formed and
// re-encodable.
func checkUsageParse(t *testing.T, provider, prefix string, data []byte) {
	p, _ := lookupProvider(provider)
	ws, err := p.readUsage(data, usageT0)
	if err != nil {
		if !strings.HasPrefix(err.Error(), "the usage report is not usable: ") {
			t.Fatalf("unclassified error: %v", err)
		}
		if ws != nil {
			t.Fatalf("windows returned with an error")
		}
		return
	}
	if len(ws) == 0 {
		t.Fatal("accepted a report naming no window")
	}
	seen := map[string]bool{}
	for _, w := range ws {
		switch {
		case !(w.UsedFraction >= 0 && w.UsedFraction <= 1):
			t.Fatalf("window %s fraction %v outside [0,1]", w.ID, w.UsedFraction)
		case w.ResetsAtMs < 0 || w.ResetsAtMs > planMaxResetSeconds*1000:
			t.Fatalf("window %s reset %d out of range", w.ID, w.ResetsAtMs)
		case !strings.HasPrefix(w.ID, prefix) || seen[w.ID]:
			t.Fatalf("window id %q is not a fresh %s… id", w.ID, prefix)
		case w.Source != "usage_report" || w.RecordedAtMs != usageT0.UnixMilli():
			t.Fatalf("window %s has source %q recorded %d", w.ID, w.Source, w.RecordedAtMs)
		}
		seen[w.ID] = true
	}
	b, err := json.Marshal(ws)
	if err != nil {
		t.Fatalf("accepted windows do not encode: %v", err)
	}
	var back []planWindow
	if err := json.Unmarshal(b, &back); err != nil || !cmp.Equal(back, ws) {
		t.Fatalf("windows do not round-trip: %v", err)
	}
}

func FuzzUsageClaudeCode(f *testing.F) {
	f.Add([]byte(`{"five_hour":{"utilization":24.0,"resets_at":"2026-01-02T19:59:59.600956+00:00"},"seven_day":{"utilization":36.0,"resets_at":null}}`))
	f.Add([]byte(`{"five_hour":{"utilization":1e309,"resets_at":1e300},"x":{"utilization":-1,"resets_at":"1893553445123"}}`))
	f.Add([]byte(`{"seven_day_opus":null,"extra_usage":{"utilization":null}}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkUsageParse(t, "claude-code", "anthropic:", data) })
}

func FuzzUsageCodex(f *testing.F) {
	f.Add([]byte(`{"rate_limit":{"primary_window":{"used_percent":3,"limit_window_seconds":18000,"reset_at":1767385852},"secondary_window":{"used_percent":9,"limit_window_seconds":604800,"reset_after_seconds":489450}}}`))
	f.Add([]byte(`{"rate_limit":{"primary_window":{"used_percent":"NaN","reset_after_seconds":1e308},"secondary_window":{"used_percent":-1e308,"limit_window_seconds":-60}}}`))
	f.Add([]byte(`{"rate_limit":null}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkUsageParse(t, "codex", "codex:", data) })
}

func FuzzUsageKimi(f *testing.F) {
	f.Add([]byte(`{"usage":{"limit":"100","used":"4","remaining":"96","resetTime":"2026-02-11T17:32:50.757941Z"},"limits":[{"window":{"duration":300,"timeUnit":"TIME_UNIT_MINUTE"},"detail":{"limit":"100","remaining":"85","resetTime":"2026-02-07T12:32:50Z"}}]}`))
	f.Add([]byte(`{"usage":{"limit":1e-320,"used":1e308},"limits":[{"limit":"1","remaining":"-1e308","window":{"duration":1e308,"timeUnit":"TIME_UNIT_DAY"}},null,[]]}`))
	f.Add([]byte(`{"limits":"none","usage":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkUsageParse(t, "kimi", "kimi:", data) })
}
