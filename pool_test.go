package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// keyedFake answers by the bearer key a call presents: "200", "401",
// "429" (retry-after 120), "500", "400", "404", "cut" (the connection is
// closed after the request arrived) or "429cut" (a 429 whose body is cut).
// It counts calls per key and keeps the order of (key, model) seen.
type keyedFake struct {
	*fakeProvider
	mu       sync.Mutex // guards behavior, calls, seen
	behavior map[string]string
	calls    map[string]int
	seen     []string
}

func newKeyedFake(t *testing.T, behavior map[string]string) *keyedFake {
	k := &keyedFake{behavior: behavior, calls: map[string]int{}}
	k.fakeProvider = newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Method == http.MethodGet { // a maintenance pass reading kimi's usage report, not a call
			http.Error(w, `{"error":"no usage report here"}`, http.StatusNotFound)
			return
		}
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		var req struct {
			Model string `json:"model"`
		}
		json.Unmarshal(body, &req)
		k.mu.Lock()
		k.calls[key]++
		k.seen = append(k.seen, key+" "+req.Model)
		b := k.behavior[key]
		k.mu.Unlock()
		switch b {
		case "200":
			io.WriteString(w, protocolFixtures[0].buffered)
		case "401":
			http.Error(w, `{"error":{"type":"authentication_error","message":"bad key"}}`, 401)
		case "429":
			w.Header().Set("Retry-After", "120")
			http.Error(w, `{"error":{"type":"rate_limit_error","message":"slow down"}}`, 429)
		case "500":
			http.Error(w, `{"error":{"type":"server_error","message":"broken"}}`, 500)
		case "400", "404":
			code := 400
			if b == "404" {
				code = 404
			}
			http.Error(w, `{"error":{"type":"invalid_request_error","message":"no such model"}}`, code)
		case "cut":
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		case "429cut": // a refusal whose body is cut: no refusal Brama can read
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				io.WriteString(conn, "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 100\r\n\r\n{\"error\":")
				conn.Close()
			}
		default:
			http.Error(w, `{"error":{"message":"unknown key"}}`, 418)
		}
	})
	return k
}

func (k *keyedFake) set(key, behavior string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.behavior[key] = behavior
}

func (k *keyedFake) count(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls[key]
}

func (k *keyedFake) total() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, c := range k.calls {
		n += c
	}
	return n
}

// donate gives agent a subscription with an API key through the admin API
// and returns its id.
func donate(t *testing.T, d *daemon, agent, provider, key string) string {
	t.Helper()
	status, _, body := d.call("POST", "/v1/admin/subscriptions/"+agent, d.token, fmt.Sprintf(`{"provider":%q,"api_key":%q}`, provider, key))
	return donatedID(t, status, body, agent, provider)
}

// agentWithSubs makes a bearer bound to agent and one subscription
// of provider per key, in order.
func agentWithSubs(t *testing.T, d *daemon, agent, provider string, keys ...string) (token string, ids []string) {
	t.Helper()
	token = addClient(t, d.env, agent+"-app", "-agent", agent)
	for _, k := range keys {
		ids = append(ids, donate(t, d, agent, provider, k))
	}
	return token, ids
}

func TestSubscriptionRouteTwoCredentials(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	type want struct {
		status int
		code   string // "" for success
		calls  int
	}
	outcomes := []string{"200", "401", "429", "500", "cut", "429cut"}
	expect := func(first, second string) want {
		switch first {
		case "200":
			return want{200, "", 1}
		case "500":
			return want{503, "dependency_unavailable", 1}
		case "cut", "429cut":
			return want{502, "provider_incomplete", 1}
		}
		// first refused with a rotating class (401 or 429): the second is tried.
		switch second {
		case "200":
			return want{200, "", 2}
		case "500":
			return want{503, "dependency_unavailable", 2}
		case "cut", "429cut":
			return want{502, "provider_incomplete", 2}
		}
		if first == "429" || second == "429" { // §7.2.5 b before d
			return want{429, "provider_rate_limited", 2}
		}
		return want{503, "subscription_reauthorization_required", 2}
	}
	n := 0
	for _, first := range outcomes {
		for _, second := range outcomes {
			n++
			t.Run(first+"+"+second, func(t *testing.T) {
				agent := fmt.Sprintf("ag%d", n)
				k1, k2 := "key-"+agent+"-1", "key-"+agent+"-2"
				fake.set(k1, first)
				fake.set(k2, second)
				tok, _ := agentWithSubs(t, d, agent, "kimi", k1, k2)
				status, hdr, body := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/k2-test", false, ""))
				w := expect(first, second)
				calls := fake.count(k1) + fake.count(k2)
				if calls > 2 {
					t.Fatalf("the provider saw %d calls; never more than two", calls)
				}
				if status != w.status || calls != w.calls {
					t.Fatalf("status %d with %d calls, want %d with %d: %s", status, calls, w.status, w.calls, body)
				}
				if hdr.Get("Brama-Attempts") != fmt.Sprint(calls) {
					t.Errorf("Brama-Attempts = %q, provider saw %d", hdr.Get("Brama-Attempts"), calls)
				}
				if w.code == "" {
					return
				}
				e := envelopeOf(t, body)
				if e["code"] != w.code || e["attempts"] != float64(calls) {
					t.Errorf("code %v attempts %v, want %s with %d (the calls the fake saw)", e["code"], e["attempts"], w.code, calls)
				}
				if w.code == "provider_rate_limited" && hdr.Get("Retry-After") == "" {
					t.Errorf("429 without Retry-After")
				}
				if first == "500" && fake.count(k2) != 0 {
					t.Errorf("a 500 from the first credential still called the second")
				}
			})
		}
	}
}

func TestSubscriptionRouteStopsAtTwoCalls(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"k1": "401", "k2": "429", "k3": "200"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tok, _ := agentWithSubs(t, d, "a1", "kimi", "k1", "k2", "k3")
	status, _, body := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/k2-test", false, ""))
	if e := envelopeOf(t, body); status != 429 || e["attempts"] != float64(2) || fake.count("k3") != 0 {
		t.Errorf("three subscriptions, two refusals: %d %s, third called %d times; the walk stops at two calls", status, body, fake.count("k3"))
	}
}

func TestSubscriptionBlockUntilReset(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	testingOnlyNow = clock.now
	defer func() { testingOnlyNow = nil }()
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"key-a": "429", "key-b": "200"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tok, ids := agentWithSubs(t, d, "a1", "kimi", "key-a", "key-b")
	chat := func(d *daemon) (int, []byte) {
		s, _, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/k2-test", false, ""))
		return s, b
	}
	if s, b := chat(d); s != 200 || fake.count("key-a") != 1 || fake.count("key-b") != 1 {
		t.Fatalf("first request: %d %s; calls a=%d b=%d", s, b, fake.count("key-a"), fake.count("key-b"))
	}
	fake.set("key-a", "200")
	if s, _ := chat(d); s != 200 || fake.count("key-a") != 1 || fake.count("key-b") != 2 {
		t.Fatalf("while a is blocked the request must go to b first: a=%d b=%d", fake.count("key-a"), fake.count("key-b"))
	}

	// The block survives a restart: the ledger holds it.
	d.stop()
	d2 := startDaemon(t, env, "")
	fake.set("key-b", "429")
	s, b := chat(d2)
	if s != 429 || fake.count("key-a") != 1 {
		t.Fatalf("after a restart, a must still be blocked (skipped without a call): %d %s, a=%d", s, b, fake.count("key-a"))
	}
	if e := envelopeOf(t, b); e["code"] != "provider_rate_limited" || e["attempts"] != float64(1) {
		t.Errorf("b refused, a skipped as blocked: %s", b)
	}
	var ledgerDoc struct {
		Subscriptions map[string]ledgerEntry `json:"subscriptions"`
	}
	lb, _ := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], "ledger.json"))
	json.Unmarshal(lb, &ledgerDoc)
	if until := ledgerDoc.Subscriptions[ids[0]].Block.UntilMs; until != clock.now().Add(120*time.Second).UnixMilli() {
		t.Errorf("ledger block for a ends at %d, want now+120 s (retry-after)", until)
	}

	// Past the stated reset, a is eligible again.
	clock.advance(121 * time.Second)
	s, b = chat(d2)
	if s != 200 || fake.count("key-a") != 2 {
		t.Fatalf("after the block ended a must be called again: %d %s, a=%d", s, b, fake.count("key-a"))
	}
}

func TestAnySkipsRefusedProvider(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"ds-1": "401", "ds-2": "401", "groq-1": "200", "kimi-1": "200"})
	for _, p := range []string{"DEEPSEEK", "GROQ", "KIMI"} {
		env["BRAMA_PROVIDER_"+p+"_BASE_URL"] = fake.URL
	}
	d := startDaemon(t, env, "")
	for _, put := range []string{
		`{"alias":"d1","route":"deepseek/ds-a"}`, `{"alias":"d2","route":"deepseek/ds-b"}`,
		`{"alias":"g1","route":"groq/gq-a"}`, `{"alias":"k1","route":"kimi/km-a"}`,
	} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
			t.Fatalf("PUT %s: %d %s", put, s, b)
		}
	}
	tok, _ := agentWithSubs(t, d, "a1", "deepseek", "ds-1", "ds-2")
	donate(t, d, "a1", "groq", "groq-1")
	donate(t, d, "a1", "kimi", "kimi-1")
	status, hdr, body := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, ""))
	if status != 200 {
		t.Fatalf("any: %d %s", status, body)
	}
	fake.mu.Lock()
	seen := slices.Clone(fake.seen)
	fake.mu.Unlock()
	want := []string{"ds-1 ds-a", "ds-2 ds-a", "groq-1 gq-a"}
	if !slices.Equal(seen, want) {
		t.Errorf("calls = %v, want %v (deepseek's other model skipped without a call)", seen, want)
	}
	if hdr.Get("Brama-Attempts") != "3" {
		t.Errorf("Brama-Attempts = %q, want 3", hdr.Get("Brama-Attempts"))
	}
	if r := hdr.Get("Brama-Route"); r != "groq/gq-a" {
		t.Errorf("Brama-Route = %q, want the candidate route that answered", r)
	}

}

// TestSelectorSkipsAProviderWhosePoolRefused: once every credential of a
// provider's pool refused on one candidate, the selector skips that
// provider's later candidates (seed: "skip the routes of a provider whose
// whole pool refused"), even when a refusal refreshed a grant that a later
// candidate could otherwise call again.
func TestSelectorSkipsAProviderWhosePoolRefused(t *testing.T) {
	provider, calls := tokenRecorder(t, func(w http.ResponseWriter, tok string) {
		switch tok {
		case "acc-one":
			w.Header().Set("Retry-After", "60")
			http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}`, 429)
		case "acc-two":
			http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"expired token"}}`, 401)
		default:
			io.WriteString(w, protocolFixtures[1].buffered)
		}
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		io.WriteString(w, `{"access_token":"acc-two-new","refresh_token":"ref-two-new","expires_in":3600}`)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	for _, put := range []string{`{"alias":"c1","route":"claude-code/cc-a"}`, `{"alias":"c2","route":"claude-code/cc-b"}`} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
			t.Fatalf("PUT %s: %d %s", put, s, b)
		}
	}
	later := time.Now().Add(time.Hour).UnixMilli()
	one, two := donateGrant(t, d, "acc-one", "ref-one", later), donateGrant(t, d, "acc-two", "ref-two", later)

	status, hdr, body := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "any", false, ""))
	seen := calls()
	if want := []string{"acc-one", "acc-two"}; !slices.Equal(seen, want) {
		t.Errorf("calls = %v, want %v (cc-b skipped: the whole claude-code pool refused on cc-a)", seen, want)
	}
	if e := envelopeOf(t, body); status == 200 || e["attempts"] != float64(2) || hdr.Get("Brama-Attempts") != "2" {
		t.Errorf("any: %d %s (Brama-Attempts %q), want a refusal after 2 calls", status, body, hdr.Get("Brama-Attempts"))
	}
	want := "the provider refused for rate: claude-code/cc-a: " + one + " rate limited: slow; claude-code/cc-a: " + two +
		` refused the access token; refreshed; claude-code/cc-b: skipped: no "claude-code" subscription left (none usable, or every one refused already)`
	if got := envelopeOf(t, body)["message"]; got != want { // SPEC §7.3: the skipped candidate is named
		t.Errorf("message = %q, want %q", got, want)
	}
	if n := tokenEndpoint.calls.Load(); n != 1 {
		t.Errorf("token endpoint calls = %d, want 1 (the 401 refreshed acc-two)", n)
	}
}

// TestRetiredSubscriptionIsNeverCalled: a retired subscription is skipped
// without a call; and the retired billingTarget (SPEC §7.2) is an unknown
// member like any other, so naming another agent's subscription in it
// spends only the caller's own.
func TestRetiredSubscriptionIsNeverCalled(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"a-kimi": "200", "a-kimi-2": "200", "b-kimi": "200"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tokA, idsA := agentWithSubs(t, d, "a1", "kimi", "a-kimi-2", "a-kimi")
	_, idsB := agentWithSubs(t, d, "b1", "kimi", "b-kimi")
	if s, _, b := d.call("DELETE", "/v1/admin/subscriptions/a1/"+idsA[0], d.token, ""); s != 200 {
		t.Fatalf("retire: %d %s", s, b)
	}
	for _, extra := range []string{"", "", fmt.Sprintf(`,"billingTarget":{"providerId":"kimi","subscriptionId":%q}`, idsB[0])} {
		if s, _, b := d.call("POST", "/v1/chat/completions", tokA, chatBody(dialectChat, "kimi/k2-test", false, extra)); s != 200 {
			t.Fatalf("%d %s", s, b)
		}
	}
	if fake.count("a-kimi-2") != 0 || fake.count("a-kimi") != 3 || fake.count("b-kimi") != 0 {
		t.Errorf("calls %v; want a-kimi's 3 alone", fake.calls)
	}
	for _, k := range []string{"a-kimi", "a-kimi-2", "b-kimi"} {
		assertNoSecret(t, k+`"`, d.stderr.String(), env["BRAMA_STATE_DIR"])
	}
}

// TestSubscriptionRouteNeedsAgent: a route an agent pays for, without a
// bearer bound to an agent, is 403 forbidden naming the fix (SPEC §5.3).
func TestSubscriptionRouteNeedsAgent(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	for _, model := range []string{"kimi/k2", "any", "best"} {
		status, _, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, model, false, ""))
		e := envelopeOf(t, body)
		if status != 403 || e["code"] != "forbidden" || !strings.Contains(fmt.Sprint(e["message"]), "use a bearer bound to an agent: brama clients add ID -agent AGENT") || e["attempts"] != nil {
			t.Errorf("%s without an agent: %d %s", model, status, body)
		}
	}
	tok := addClient(t, env, "lonely-app", "-agent", "lonely")
	for _, tc := range []struct{ model, msg string }{
		{"kimi/k2", `no "kimi" subscription for agent "lonely"`},
		{"any", `no subscription model can serve agent "lonely"`},
		{"best", `no subscription model can serve agent "lonely"`},
	} {
		status, _, body := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, tc.model, false, ""))
		if e := envelopeOf(t, body); status != 503 || e["code"] != "credential_unauthorized" || e["attempts"] != float64(0) || e["message"] != tc.msg {
			t.Errorf("%s with no subscription: %d %s", tc.model, status, body)
		}
	}
}

func TestSubscriptionOAuthRefreshOnUse(t *testing.T) {
	const (
		oldToken = "oauth-access-old-0123456789"
		newToken = "oauth-access-new-0123456789"
		refresh1 = "oauth-refresh-one-0123456789"
		refresh2 = "oauth-refresh-two-0123456789"
	)
	fx := protocolFixtures[1] // anthropic-messages
	var mu sync.Mutex
	var tokensSeen []string
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		mu.Lock()
		tokensSeen = append(tokensSeen, tok)
		mu.Unlock()
		if tok != newToken {
			http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"invalid bearer token"}}`, 401)
			return
		}
		io.WriteString(w, fx.buffered)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if !strings.Contains(string(body), refresh1) {
			http.Error(w, `{"error":"invalid_grant"}`, 400)
			return
		}
		fmt.Fprintf(w, `{"access_token":%q,"refresh_token":%q,"expires_in":3600}`, newToken, refresh2)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	env := d.env
	donateGrant(t, d, oldToken, refresh1, time.Now().Add(time.Hour).UnixMilli())

	status, hdr, body := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
	if status != 200 || hdr.Get("Brama-Attempts") != "2" {
		t.Fatalf("401 then refresh then the same subscription: %d attempts %q %s", status, hdr.Get("Brama-Attempts"), body)
	}
	mu.Lock()
	seen := slices.Clone(tokensSeen)
	mu.Unlock()
	if !slices.Equal(seen, []string{oldToken, newToken}) || tokenEndpoint.calls.Load() != 1 {
		t.Errorf("provider saw tokens %v and the token endpoint %d calls; want old then new, one refresh", seen, tokenEndpoint.calls.Load())
	}
	if !strings.Contains(string(provider.body()), "You are Claude Code, Anthropic's official CLI for Claude.") {
		t.Errorf("claude-code request lacks the required first system block")
	}
	for _, secret := range []string{oldToken, newToken, refresh1, refresh2} {
		assertNoSecret(t, secret, d.stderr.String(), env["BRAMA_STATE_DIR"])
	}
	vb, _ := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], "vault.json"))
	if !strings.Contains(string(vb), newToken) || !strings.Contains(string(vb), refresh2) {
		t.Errorf("the vault does not hold the refreshed grant")
	}
}

func TestSubscriptionRefreshTransportFailure(t *testing.T) {
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		io.WriteString(w, protocolFixtures[1].buffered)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, `{"error":"server_error"}`, 502)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	id := donateGrant(t, d, "acc-expired-0123", "ref-0123456789", time.Now().Add(-time.Hour).UnixMilli())

	status, _, body := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
	e := envelopeOf(t, body)
	if status != 503 || e["code"] != "dependency_unavailable" || e["attempts"] != float64(0) || provider.calls.Load() != 0 {
		t.Fatalf("expired grant whose refresh failed in transport: %d %s, provider calls %d", status, body, provider.calls.Load())
	}
	if msg := fmt.Sprint(e["message"]); !strings.Contains(msg, "/v1/oauth/token") || !strings.Contains(msg, "502") || !strings.Contains(msg, "bytes received") {
		t.Errorf("message %q must name the token endpoint, the status and the bytes received", msg)
	}
	if got := credentialStateOf(t, d, "a1", id); got != "active" {
		t.Errorf("a transport failure changed the credential state to %q", got)
	}
	if !strings.Contains(d.stderr.String(), "maintenance_requested") {
		t.Errorf("a refresh stopped by a transport failure must request a maintenance pass")
	}
}

func TestSelectorAllNeedSignIn(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"k1": "401"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"coder","route":"kimi/k2"}`)
	tok, _ := agentWithSubs(t, d, "a1", "kimi", "k1")
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, "")); s != 503 || envelopeOf(t, b)["code"] != "subscription_reauthorization_required" {
		t.Fatalf("the only subscription refused 401: %d %s", s, b)
	}
	calls := fake.total()
	for _, model := range []string{"any", "kimi/k2"} {
		s, _, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, model, false, ""))
		if e := envelopeOf(t, b); s != 503 || e["code"] != "subscription_reauthorization_required" || e["attempts"] != float64(0) {
			t.Errorf("%s with every subscription needing sign-in: %d %s", model, s, b)
		}
	}
	if fake.total() != calls {
		t.Errorf("a needs_reauthorization credential was called")
	}
}

// TestConcurrentRequestsShareOneRefresh sends 50 requests at once on one
// expired grant: exactly one token-endpoint call. The token endpoint holds
// its first call until a second one arrives (single flight broken) or a
// moment passes, so the requests pile up behind the flight.
func TestConcurrentRequestsShareOneRefresh(t *testing.T) {
	const newToken = "oauth-access-fresh-0123456789"
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Header.Get("Authorization") != "Bearer "+newToken {
			http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"stale"}}`, 401)
			return
		}
		io.WriteString(w, protocolFixtures[1].buffered)
	})
	second := make(chan struct{})
	var once, closeOnce sync.Once
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		fakeCalls := 0
		once.Do(func() { fakeCalls = 1 })
		if fakeCalls == 0 {
			closeOnce.Do(func() { close(second) }) // a second concurrent refresh: the test fails on the count
		} else {
			select {
			case <-second:
			case <-time.After(500 * time.Millisecond):
			}
		}
		fmt.Fprintf(w, `{"access_token":%q,"refresh_token":"oauth-refresh-fresh-0123","expires_in":3600}`, newToken)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	donateGrant(t, d, "oauth-access-expired-0123", "oauth-refresh-old-0123", time.Now().Add(-time.Minute).UnixMilli())

	var wg sync.WaitGroup
	statuses := make([]int, 50)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _, _ = d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
		}()
	}
	wg.Wait()
	if n := tokenEndpoint.calls.Load(); n != 1 {
		t.Errorf("50 concurrent requests on one expired grant made %d token-endpoint calls, want 1", n)
	}
	for i, st := range statuses {
		if st != 200 {
			t.Errorf("request %d: %d", i, st)
		}
	}
	if n := provider.calls.Load(); n != 50 {
		t.Errorf("provider saw %d calls, want 50 (each with the refreshed token)", n)
	}
}

// TestSelectorSkipsAFailedRefreshForTheWholeRequest: a grant whose refresh
// failed is skipped for the rest of the request (SPEC §7.2.3), on a later
// candidate of the same provider too, never called with its expired token.
// The first candidate spends its two calls on two 429s, so the second
// candidate walks the same pool again.
func TestSelectorSkipsAFailedRefreshForTheWholeRequest(t *testing.T) {
	provider, calls := tokenRecorder(t, func(w http.ResponseWriter, tok string) {
		if tok == "acc-live-200" {
			io.WriteString(w, protocolFixtures[1].buffered)
			return
		}
		w.Header().Set("Retry-After", "120")
		http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, 429)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, `{"error":"server_error"}`, 502)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	for _, put := range []string{`{"alias":"c1","route":"claude-code/cc-a"}`, `{"alias":"c2","route":"claude-code/cc-b"}`} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
			t.Fatalf("PUT %s: %d %s", put, s, b)
		}
	}
	later := time.Now().Add(time.Hour).UnixMilli()
	donateGrant(t, d, "acc-expired-0123", "ref-0123456789", time.Now().Add(-time.Hour).UnixMilli())
	donateGrant(t, d, "acc-live-429a", "ref-a", later)
	donateGrant(t, d, "acc-live-429b", "ref-b", later)
	donateGrant(t, d, "acc-live-200", "ref-c", later)

	status, hdr, body := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "any", false, ""))
	seen := calls()
	if status != 200 || hdr.Get("Brama-Attempts") != "3" {
		t.Fatalf("any: %d, Brama-Attempts %q, %s (calls %v)", status, hdr.Get("Brama-Attempts"), body, seen)
	}
	if slices.Contains(seen, "acc-expired-0123") {
		t.Errorf("calls %v: the grant whose refresh failed was called with its expired token", seen)
	}
	if want := []string{"acc-live-429a", "acc-live-429b", "acc-live-200"}; !slices.Equal(seen, want) {
		t.Errorf("calls = %v, want %v", seen, want)
	}
}

// TestSignInRefusalAsksForAPassOnEveryRoute: a refusal for want of a
// signed-in subscription asks for a maintenance pass (seed, SPEC §11.2),
// whichever route met it: chat and count_tokens alike.
func TestSignInRefusalAsksForAPassOnEveryRoute(t *testing.T) {
	for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
		t.Run(path, func(t *testing.T) {
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				io.WriteString(w, protocolFixtures[1].buffered)
			})
			tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				http.Error(w, `{"error":"invalid_grant","error_description":"revoked"}`, 400)
			})
			d, tok := oauthSetup(t, provider, tokenEndpoint)
			donateGrant(t, d, "acc-expired-0123", "ref-0123456789", time.Now().Add(-time.Hour).UnixMilli())
			status, _, body := d.call("POST", path, tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
			if e := envelopeOf(t, body); status != 503 || e["code"] != "subscription_reauthorization_required" || provider.calls.Load() != 0 {
				t.Fatalf("%s with a revoked grant: %d %s, provider calls %d", path, status, body, provider.calls.Load())
			}
			if !strings.Contains(d.stderr.String(), `"msg":"maintenance_requested","reason":"subscription_reauthorization_required"`) {
				t.Errorf("no maintenance pass was asked for:\n%s", d.stderr.String())
			}
		})
	}
}

// TestReinstateCountsARefusalAgain: a refusal's pass request is dropped while nothing changed since a pass covering
// the agent started, and counts again after an operator retires and reinstates a subscription (SPEC §11.2, §17).
func TestReinstateCountsARefusalAgain(t *testing.T) {
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		io.WriteString(w, protocolFixtures[1].buffered)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, `{"error":"invalid_grant","error_description":"revoked"}`, 400)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	id := donateGrant(t, d, "acc-expired-0123", "ref-0123456789", time.Now().Add(-time.Hour).UnixMilli())
	refuse := func(step string, wantRequests, wantDropped int) {
		t.Helper()
		if status, _, body := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, "")); status != 503 {
			t.Fatalf("%s: %d %s, want the sign-in refusal", step, status, body)
		}
		_, _, metrics := d.call("GET", "/metrics", d.token, "")
		requests := strings.Count(d.stderr.String(), `"msg":"maintenance_requested"`)
		if dropped := fmt.Sprintf("brama_maintenance_requests_dropped_total %d\n", wantDropped); requests != wantRequests || !strings.Contains(string(metrics), dropped) {
			t.Errorf("%s: %d maintenance_requested lines, want %d; metrics want %q:\n%s", step, requests, wantRequests, dropped, metrics)
		}
	}
	refuse("first refusal", 1, 0)
	d.stderr.waitFor(t, `"msg":"maintenance_pass_done","agent_id":"a1"`)
	refuse("no change since", 1, 1)
	for _, c := range [][2]string{{"DELETE", ""}, {"POST", "/reinstate"}} {
		if s, _, b := d.call(c[0], "/v1/admin/subscriptions/a1/"+id+c[1], d.token, `{"reason":"back"}`); s != 200 {
			t.Fatalf("%s %s: %d %s", c[0], c[1], s, b)
		}
	}
	refuse("after a reinstatement", 2, 1)
}

// TestListingShowsARequestsCredentialChangeAtOnce: a credential state the
// request path changed shows in the next listing, not after the listing
// cache's TTL (SPEC §10.2): a 401 on one key marks it while the next key
// answers, so no refusal (and no maintenance pass) follows.
func TestListingShowsARequestsCredentialChangeAtOnce(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"kimi-refused": "401", "kimi-good": "200"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tok, ids := agentWithSubs(t, d, "a1", "kimi", "kimi-refused", "kimi-good")
	if got := credentialStateOf(t, d, "a1", ids[0]); got != credActive { // now cached
		t.Fatalf("before: %s", got)
	}
	s, _, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/k2-test", false, ""))
	if s != 200 || fake.count("kimi-refused") != 1 || fake.count("kimi-good") != 1 {
		t.Fatalf("the pool in donation order: %d %s, calls %v", s, b, fake.calls)
	}
	if got := credentialStateOf(t, d, "a1", ids[0]); got != credNeedsReauth {
		t.Errorf("listing after the 401: credential %s, want %s", got, credNeedsReauth)
	}
}

// tokenRecorder answers each call by the bearer it presents, and calls
// returns the bearers of the calls in order (a maintenance pass's usage
// reads, GETs, are not calls).
func tokenRecorder(t *testing.T, answer func(w http.ResponseWriter, token string)) (*fakeProvider, func() []string) {
	var mu sync.Mutex
	var seen []string
	p := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if r.Method == http.MethodPost {
			mu.Lock()
			seen = append(seen, tok)
			mu.Unlock()
		}
		answer(w, tok)
	})
	return p, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// TestCountTokensSkipsAGrantItCannotRefresh: count_tokens makes one call, no
// rotation (SPEC §15), but a grant whose refresh failed before any call is
// skipped for the pool's next subscription, as on a chat route.
func TestCountTokensSkipsAGrantItCannotRefresh(t *testing.T) {
	provider, calls := tokenRecorder(t, func(w http.ResponseWriter, tok string) {
		io.WriteString(w, `{"input_tokens":7}`)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, `{"error":"server_error"}`, 502)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	donateGrant(t, d, "acc-expired-0123", "ref-expired-0123", time.Now().Add(-time.Hour).UnixMilli())
	donateGrant(t, d, "acc-live-0123", "ref-live-0123", time.Now().Add(time.Hour).UnixMilli())
	status, hdr, body := d.call("POST", "/v1/messages/count_tokens", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
	if status != 200 || hdr.Get("Brama-Attempts") != "1" || !slices.Equal(calls(), []string{"acc-live-0123"}) {
		t.Errorf("count_tokens: %d %s (Brama-Attempts %q, calls %v), want 200 from the live grant after 1 call", status, body, hdr.Get("Brama-Attempts"), calls())
	}
}

// oneCandidateDaemon is a daemon whose agent a1 holds one subscription of
// provider, key "<provider>-1" that its fake answers 200, and an alias to
// route, a selector's one candidate; tok is a1's bound bearer.
func oneCandidateDaemon(t *testing.T, provider, route string) (d *daemon, env map[string]string, fake *keyedFake, tok string) {
	t.Helper()
	env = stateEnv(t)
	fake = newKeyedFake(t, map[string]string{provider + "-1": "200"})
	env["BRAMA_PROVIDER_"+strings.ToUpper(provider)+"_BASE_URL"] = fake.URL
	d = startDaemon(t, env, "")
	if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"c1","route":"`+route+`"}`); s != 200 {
		t.Fatalf("PUT: %d %s", s, b)
	}
	tok, _ = agentWithSubs(t, d, "a1", provider, provider+"-1")
	return d, env, fake, tok
}

// TestPoolOrder pins SPEC §7.2.2 over real HTTP with a claude-code fake that records the key each call carried and
// states each key's 5-hour window: lower fullness first, the pinned subscription (the last to serve) first among equals
// until its window resets, ties in overlay order; each call is the subscription's measured use (§10.3); and a
// credential not active is no member of the pool, so any's provider order (§7.3) is its eligible ones' fullness.
func TestPoolOrder(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	testingOnlyNow = clock.now
	t.Cleanup(func() { testingOnlyNow = nil })
	reset := clock.now().Add(3 * time.Hour) // the fake states every window's reset 3 h after its answer
	used := map[string]string{"key-a": "0.5", "key-b": "0.2", "key-c": "0.2", "key-y": "0.5"}
	var mu sync.Mutex
	var seen []string
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		key := cmp.Or(r.Header.Get("x-api-key"), strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		mu.Lock()
		seen = append(seen, key)
		mu.Unlock()
		switch {
		case key == "key-x":
			http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"bad key"}}`, 401)
		case strings.HasPrefix(key, "kimi"):
			io.WriteString(w, protocolFixtures[0].buffered)
		default:
			w.Header().Set("anthropic-ratelimit-unified-5h-utilization", used[key])
			w.Header().Set("anthropic-ratelimit-unified-5h-reset", fmt.Sprint(clock.now().Add(3*time.Hour).Unix()))
			io.WriteString(w, protocolFixtures[1].buffered)
		}
	})
	calls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		defer func() { seen = nil }()
		return seen
	}
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0"
	env["BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL"], env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL, fake.URL
	d := startDaemon(t, env, "")
	tok, ids := agentWithSubs(t, d, "a1", "claude-code", "key-a", "key-b", "key-c")
	route := chatBody(dialectMessages, "claude-code/claude-test", false, "")
	for i, want := range []string{"key-a", "key-b", "key-c", "key-c"} { // a .5; then b, c unread (0); then c, b equal: c pinned
		if s, _, b := d.call("POST", "/v1/messages", tok, route); s != 200 {
			t.Fatalf("request %d: %d %s", i+1, s, b)
		}
		if got := calls(); !slices.Equal(got, []string{want}) {
			t.Errorf("request %d called %v, want %s", i+1, got, want)
		}
	}
	_, _, b := d.call("GET", "/v1/admin/subscriptions/a1", d.token, "")
	var listing struct {
		Subscriptions []struct {
			ID       string         `json:"id"`
			Measured ledgerMeasured `json:"measured"`
		} `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &listing); err != nil || len(listing.Subscriptions) != 3 {
		t.Fatalf("listing: %v %s", err, b)
	}
	for _, s := range listing.Subscriptions {
		n := int64(map[string]int{ids[0]: 1, ids[1]: 1, ids[2]: 2}[s.ID])
		if m := s.Measured; m.Requests != n || m.Failures != 0 || m.InputTokens != 40*n || m.OutputTokens != 42*n {
			t.Errorf("%s measured %+v, want %d requests of 40 input and 42 output tokens, no failure", s.ID, m, n)
		}
	}
	clock.set(reset.Add(time.Minute)) // every window and the pin are over: overlay order again
	if s, _, b := d.call("POST", "/v1/messages", tok, route); s != 200 || !slices.Equal(calls(), []string{"key-a"}) {
		t.Errorf("after the reset: %d %s, want key-a (overlay order; the pin on key-c ended with its window)", s, b)
	}

	// any: claude-code's freest eligible subscription is y (.5), kimi's is unread (0): kimi goes first, though x (not
	// active since its 401, never read) would put claude-code first by provider id
	tok2, _ := agentWithSubs(t, d, "a2", "claude-code", "key-x", "key-y")
	donate(t, d, "a2", "kimi", "kimi-1")
	for _, put := range []string{`{"alias":"c1","route":"claude-code/cc-a"}`, `{"alias":"k1","route":"kimi/km-a"}`} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
			t.Fatalf("PUT %s: %d %s", put, s, b)
		}
	}
	if s, _, b := d.call("POST", "/v1/messages", tok2, route); s != 200 || !slices.Equal(calls(), []string{"key-x", "key-y"}) {
		t.Fatalf("x refuses, y serves: %d %s", s, b)
	}
	if s, _, b := d.call("POST", "/v1/messages", tok2, chatBody(dialectMessages, "any", false, "")); s != 200 ||
		!slices.Equal(calls(), []string{"kimi-1"}) {
		t.Errorf("any: %d %s, want kimi-1 called first (claude-code's eligible pool is y alone, .5 used)", s, b)
	}
}

// TestAGrantRefreshedThenRefusedIsMarked: an expired grant is refreshed before its call (SPEC §7.2.3); a 401 on the
// refreshed token then marks it needs_reauthorization (§7.2.4: refreshed in this request), with no second refresh and
// no second call on it.
func TestAGrantRefreshedThenRefusedIsMarked(t *testing.T) {
	provider, calls := tokenRecorder(t, func(w http.ResponseWriter, tok string) {
		http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"invalid bearer token"}}`, 401)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		io.WriteString(w, `{"access_token":"acc-new","refresh_token":"ref-new","expires_in":3600}`)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	id := donateGrant(t, d, "acc-old", "ref-old", time.Now().Add(-time.Hour).UnixMilli())
	status, _, body := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
	if e := envelopeOf(t, body); status != 503 || e["code"] != "subscription_reauthorization_required" || e["attempts"] != float64(1) {
		t.Errorf("%d %s, want 503 subscription_reauthorization_required after 1 call", status, body)
	}
	if seen, n := calls(), tokenEndpoint.calls.Load(); !slices.Equal(seen, []string{"acc-new"}) || n != 1 {
		t.Errorf("provider saw %v, token endpoint %d calls; want acc-new once after one refresh", seen, n)
	}
	if got := credentialStateOf(t, d, "a1", id); got != "needs_reauthorization" {
		t.Errorf("credential state = %q, want needs_reauthorization", got)
	}
}

// TestSubscriptionRouteWithAnUnreadableVault: a vault that became unreadable after the donation (a newer schema, or
// failing a guard) answers a subscription route 503 credential_unauthorized naming the vault (SPEC §2.2), with no
// provider call: never a call without its credential.
func TestSubscriptionRouteWithAnUnreadableVault(t *testing.T) {
	for _, tc := range []struct {
		name, vault string // vault "": the donated one, made group-readable
	}{
		{"vault of schema 2", `{"schema_version":2,"direct":{},"subscriptions":{}}`},
		{"group-readable vault", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := stateEnv(t)
			fake := newKeyedFake(t, map[string]string{"kimi-1": "200"})
			env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
			d := startDaemon(t, env, "")
			tok, _ := agentWithSubs(t, d, "a1", "kimi", "kimi-1")
			path := filepath.Join(env["BRAMA_STATE_DIR"], "vault.json")
			var err error
			if tc.vault != "" {
				err = os.WriteFile(path, []byte(tc.vault), 0o600)
			} else {
				err = os.Chmod(path, 0o640)
			}
			if err != nil {
				t.Fatal(err)
			}
			status, _, body := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/k2-test", false, ""))
			if e := envelopeOf(t, body); status != 503 || e["code"] != "credential_unauthorized" || e["message"] != "the vault is unreadable" || fake.total() != 0 {
				t.Errorf("%d %s after %d calls, want 503 credential_unauthorized naming the vault and no call", status, body, fake.total())
			}
		})
	}
}

// TestSelectorCandidatesTakeTheirOwnOutputLimit: a selector's candidate without the caller's max_tokens gets its own
// model's output limit (SPEC §6.4, §7.3), not the limit an earlier candidate was sent.
func TestSelectorCandidatesTakeTheirOwnOutputLimit(t *testing.T) {
	env := stateEnv(t)
	var mu sync.Mutex
	var sent []string
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var up struct {
			Model     string `json:"model"`
			MaxTokens int    `json:"max_tokens"`
		}
		json.Unmarshal(body, &up)
		mu.Lock()
		sent = append(sent, fmt.Sprint(up.Model, " ", up.MaxTokens))
		mu.Unlock()
		if up.Model == "cc-a" {
			http.Error(w, `{"type":"error","error":{"type":"not_found_error","message":"no such model"}}`, 404)
			return
		}
		io.WriteString(w, protocolFixtures[1].buffered)
	})
	env["BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL"] = fake.URL
	catalogue := filepath.Join(t.TempDir(), "models.json")
	os.WriteFile(catalogue, []byte(`{"anthropic":{"models":{"cc-a":{"limit":{"output":111}},"cc-b":{"limit":{"output":222}}}}}`), 0o600)
	env["BRAMA_MODEL_CATALOG_PATH"] = catalogue
	d := startDaemon(t, env, "")
	for _, put := range []string{`{"alias":"c1","route":"claude-code/cc-a"}`, `{"alias":"c2","route":"claude-code/cc-b"}`} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
			t.Fatalf("PUT %s: %d %s", put, s, b)
		}
	}
	tok, _ := agentWithSubs(t, d, "a1", "claude-code", "key-1")
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, `{"model":"any","messages":[{"role":"user","content":"hi"}]}`); s != 200 {
		t.Fatalf("any: %d %s", s, b)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"cc-a 111", "cc-b 222"}; !slices.Equal(sent, want) {
		t.Errorf("the provider was sent %v, want %v (each candidate its own model's output limit)", sent, want)
	}
}

// TestSelectorCountsCallsOnACandidateItCannotFinish: a selector's candidate whose first subscription was called and
// refused, and whose next one cannot carry the request (claude-code's OAuth system edit refuses a numeric system),
// still counts its call: the refusal states it and classifies what the provider said (SPEC §8.1), not the unfit 400.
func TestSelectorCountsCallsOnACandidateItCannotFinish(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"": "200"}) // an API key goes in x-api-key: no bearer
	env["BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"c1","route":"claude-code/claude-a"}`); s != 200 {
		t.Fatalf("PUT: %d %s", s, b)
	}
	tok, _ := agentWithSubs(t, d, "a1", "claude-code", "cc-key")
	donateGrant(t, d, "cc-access-0123", "cc-refresh-0123", time.Now().Add(time.Hour).UnixMilli())
	if s, _, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "any", false, "")); s != 200 { // the route served: its perf entry
		t.Fatalf("first request: %d %s", s, b)
	}
	fake.set("", "429")
	status, hdr, body := d.call("POST", "/v1/messages", tok, `{"model":"any","max_tokens":10,"system":5,"messages":[{"role":"user","content":"hi"}]}`)
	var got struct{ Error apiError }
	json.Unmarshal(body, &got)
	if status != 429 || hdr.Get("Brama-Attempts") != "1" || got.Error.Attempts == nil || *got.Error.Attempts != 1 ||
		got.Error.Code != "provider_rate_limited" || fake.total() != 2 {
		t.Errorf("%d Brama-Attempts %q %s after %d calls; want the 429 refusal stating its one call", status, hdr.Get("Brama-Attempts"), body, fake.total()-1)
	}
	_, _, m := d.call("GET", "/metrics", d.token, "")
	if want := `brama_route_failures_total{route="claude-code/claude-a"} 1`; !strings.Contains(string(m), want) {
		t.Errorf("metrics lack %q (the route's refused call counts, SPEC §13):\n%s", want, m)
	}
}
