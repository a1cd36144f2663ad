package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// oauthSetup starts a daemon whose claude-code provider and token endpoint
// are fakes, with agent a1 and a bearer bound to it.
func oauthSetup(t *testing.T, provider, tokenEndpoint *fakeProvider) (*daemon, string) {
	env := stateEnv(t)
	env["BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL"] = provider.URL
	env["BRAMA_OAUTH_CLAUDE_CODE_TOKEN_URL"] = tokenEndpoint.URL + "/v1/oauth/token"
	d := startDaemon(t, env, "")
	return d, addClient(t, env, "a1-app", "-agent", "a1")
}

// donateGrant gives a1 a claude-code grant and returns its id.
func donateGrant(t *testing.T, d *daemon, access, refresh string, expiresAtMs int64) string {
	t.Helper()
	body := fmt.Sprintf(`{"provider":"claude-code","oauth":{"access_token":%q,"refresh_token":%q,"expires_at_ms":%d}}`, access, refresh, expiresAtMs)
	s, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, body)
	return donatedID(t, s, b, "a1", "claude-code")
}

// A 401 on the second call still refreshes the grant (no attempt remains
// to use it), and a refresh stopped by a transport failure never marks the
// credential needs_reauthorization (SPEC §7.2.4, §11.1).
func TestAuthRefusalRefreshesWithoutDisablingTheGrant(t *testing.T) {
	tests := []struct {
		name          string
		tokenStatus   int
		wantState     string
		wantTokenCall int64
		wantNote      string // the exhausted message's reason for the second subscription ({url}: the token endpoint's)
	}{
		{"refresh succeeds", 200, "active", 1, "refused the access token; refreshed"},
		{"refresh transport failure", 502, "active", 1, "grant refresh failed: OAuth token POST {url}/v1/oauth/token: HTTP 502, " +
			"12 bytes received: token endpoint answer is not a usable token answer: no 2xx JSON object with an access_token free of control characters"},
		{"refresh refused", 400, "needs_reauthorization", 1,
			"grant refresh failed: OAuth token POST {url}/v1/oauth/token: HTTP 400, 56 bytes received: revoked"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			behavior := map[string]int{"acc-one": 429, "acc-two": 401}
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				mu.Lock()
				status := behavior[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
				mu.Unlock()
				switch status {
				case 429:
					w.Header().Set("Retry-After", "60")
					http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}`, 429)
				case 401:
					http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"expired token"}}`, 401)
				default:
					io.WriteString(w, protocolFixtures[1].buffered)
				}
			})
			tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				switch tc.tokenStatus {
				case 200:
					io.WriteString(w, `{"access_token":"acc-two-new","refresh_token":"ref-two-new","expires_in":3600}`)
				case 400:
					http.Error(w, `{"error":"invalid_grant","error_description":"revoked"}`, 400)
				default:
					http.Error(w, `bad gateway`, tc.tokenStatus)
				}
			})
			d, tok := oauthSetup(t, provider, tokenEndpoint)
			future := time.Now().Add(time.Hour).UnixMilli()
			first := donateGrant(t, d, "acc-one", "ref-one", future)
			second := donateGrant(t, d, "acc-two", "ref-two", future)
			status, _, body := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
			e := envelopeOf(t, body)
			if status != 429 || e["attempts"] != float64(2) {
				t.Errorf("429 then 401: %d %s, want 429 provider_rate_limited after 2 calls", status, body)
			}
			note := strings.ReplaceAll(tc.wantNote, "{url}", tokenEndpoint.URL)
			if want := "the provider refused for rate: " + first + ": rate limited: slow; " + second + ": " + note; e["message"] != want {
				t.Errorf("message = %q, want %q", e["message"], want)
			}
			if n := tokenEndpoint.calls.Load(); n != tc.wantTokenCall {
				t.Errorf("token endpoint calls = %d, want %d (the 401 on the last call still refreshes)", n, tc.wantTokenCall)
			}
			if got := credentialStateOf(t, d, "a1", second); got != tc.wantState {
				t.Errorf("credential state = %q, want %q", got, tc.wantState)
			}
		})
	}
}

func TestRefusalsThatMakeNoCall(t *testing.T) {
	fx := protocolFixtures[1]
	fake := fixtureProvider(t, fx)
	kimi := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		io.WriteString(w, protocolFixtures[0].buffered)
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = kimi.URL
	d := startDaemon(t, env, `{"anthropic":"k"}`, "-local-credentials-stdin")
	d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"cc","route":"claude-code/claude-unknown"}`)
	tok := addClient(t, env, "a1-app", "-agent", "a1")
	s, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"kimi-key-0123"}`)
	donatedID(t, s, b, "a1", "kimi")
	donateGrant(t, d, "acc-cc", "ref-cc", time.Now().Add(time.Hour).UnixMilli())

	tests := []struct {
		name, path, token, body string
		status                  int
	}{
		{"tool arguments that are not an object", "/v1/chat/completions", d.token,
			`{"model":"anthropic/claude-x","max_tokens":10,"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"[1]"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`, 400},
		{"embeddings on a subscription route", "/v1/embeddings", tok, `{"model":"kimi/emb","input":"x"}`, 400},
		{"embeddings toward a provider that is not openai-chat", "/v1/embeddings", d.token, `{"model":"anthropic/emb","input":"x"}`, 400},
		{"selector whose candidates need max_tokens", "/v1/chat/completions", tok,
			`{"model":"any","messages":[{"role":"user","content":"hi"}]}`, 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := fake.calls.Load() + kimi.calls.Load()
			status, hdr, body := d.call("POST", tc.path, tc.token, tc.body)
			e := envelopeOf(t, body)
			if status != tc.status || e["code"] != "invalid_request" {
				t.Fatalf("%d %s, want %d invalid_request", status, body, tc.status)
			}
			if e["attempts"] != nil || hdr.Get("Brama-Attempts") != "" {
				t.Errorf("no call was made, yet attempts=%v header=%q", e["attempts"], hdr.Get("Brama-Attempts"))
			}
			if n := fake.calls.Load() + kimi.calls.Load() - before; n != 0 {
				t.Errorf("providers saw %d calls", n)
			}
		})
	}
	if strings.Contains(d.stderr.String(), "maintenance_requested") {
		t.Errorf("a max_tokens refusal asked for a maintenance pass")
	}
}

// TestShutdownWaitsForRefreshFlights: a refresh flight detached from its
// callers runs on through the first stop signal, so a refresh token the
// provider rotated is kept (SPEC §11.1, no time limit); the second signal
// cancels a flight whose token endpoint never answers.
func TestShutdownWaitsForRefreshFlights(t *testing.T) {
	for _, cut := range []bool{false, true} {
		t.Run(fmt.Sprintf("cut=%v", cut), func(t *testing.T) {
			arrived, release, cancelled := make(chan struct{}), make(chan struct{}), make(chan struct{})
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				io.WriteString(w, protocolFixtures[1].buffered)
			})
			tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				close(arrived)
				select { // never answers on its own
				case <-release:
					io.WriteString(w, `{"access_token":"acc-rotated","refresh_token":"ref-rotated","expires_in":3600}`)
				case <-r.Context().Done():
					close(cancelled)
				}
			})
			d, tok := oauthSetup(t, provider, tokenEndpoint)
			donateGrant(t, d, "acc-stale", "ref-stale", time.Now().Add(-time.Hour).UnixMilli())

			req, _ := http.NewRequest("POST", d.url+"/v1/messages", strings.NewReader(chatBody(dialectMessages, "claude-code/claude-test", false, "")))
			req.Header.Set("Authorization", "Bearer "+tok)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				if resp, err := http.DefaultClient.Do(req.WithContext(ctx)); err == nil {
					resp.Body.Close()
				}
			}()
			<-arrived
			cancel() // the caller hangs up; the flight goes on without it
			<-done
			stopped := make(chan struct{})
			go func() { d.stop(); close(stopped) }()
			d.stderr.waitFor(t, `"msg":"serve_waiting_for_refreshes"`)
			if cut {
				d.cut()
				<-cancelled
				<-stopped
				return
			}
			close(release)
			<-stopped
			vault, err := os.ReadFile(filepath.Join(d.env["BRAMA_STATE_DIR"], "vault.json"))
			if err != nil || !strings.Contains(string(vault), "ref-rotated") {
				t.Errorf("the rotated refresh token was not kept (%v):\n%s", err, vault)
			}
		})
	}
}

func TestUncleanPathsAreEnvelopedNotRedirected(t *testing.T) {
	d := startDaemon(t, stateEnv(t), "")
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, p := range []string{"/v1//models", "/v1/./aliases", "/v1/admin/../aliases", "//health"} {
		req, _ := http.NewRequest("GET", d.url+p, nil)
		req.Header.Set("Authorization", "Bearer "+d.token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || envelopeOf(t, body)["code"] != "not_found" {
			t.Errorf("GET %s = %d %s, want a 404 envelope", p, resp.StatusCode, body)
		}
	}
}

func TestSignedAnswerNeverKeepsAPreDispatchRefusal(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"kimi-1": "200"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tok, _ := agentWithSubs(t, d, "a1", "kimi", "kimi-1")
	body := chatBody(dialectChat, "summarize", false, "")
	status, hdr, b := d.call("POST", "/v1/chat/completions", tok, body, "Idempotency-Key", "k1")
	if status != 404 || hdr.Get("Brama-Answer-Signature") != "" {
		t.Fatalf("an undeclared alias, with a key: %d %s (signature %q); want 404, not kept", status, b, hdr.Get("Brama-Answer-Signature"))
	}
	if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"summarize","route":"kimi/k2"}`); s != 200 {
		t.Fatalf("declare the alias: %d %s", s, b)
	}
	status, hdr, b = d.call("POST", "/v1/chat/completions", tok, body, "Idempotency-Key", "k1")
	if status != 200 || hdr.Get("Brama-Answer-Replayed") != "" || fake.total() != 1 {
		t.Errorf("the same key after the alias was declared: %d %s replayed=%q calls=%d; want a fresh dispatch", status, b, hdr.Get("Brama-Answer-Replayed"), fake.total())
	}
}

// TestDonatingOneGrantTwiceIsRefused: two subscriptions holding one OAuth
// grant would spend each other's rotating refresh token, so the second
// donation of a grant is 409 state_conflict and nothing is stored for it.
func TestDonatingOneGrantTwiceIsRefused(t *testing.T) {
	noCall := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, "not called", 500)
	})
	d, _ := oauthSetup(t, noCall, noCall)
	later := time.Now().Add(time.Hour).UnixMilli()
	first := donateGrant(t, d, "acc-one-0123", "ref-shared-0123", later)
	body := fmt.Sprintf(`{"provider":"claude-code","oauth":{"access_token":"acc-two-0123","refresh_token":"ref-shared-0123","expires_at_ms":%d}}`, later)
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, body)
	if e := envelopeOf(t, b); status != 409 || e["code"] != "state_conflict" || strings.Contains(string(b), "ref-shared-0123") {
		t.Errorf("second donation of one grant: %d %s, want 409 state_conflict, the token unquoted", status, b)
	}
	// A credential replacement onto another subscription is the same clash;
	// the holder itself may take its grant again.
	other := donateGrant(t, d, "acc-other-0123", "ref-other-0123", later)
	put := fmt.Sprintf(`{"oauth":{"access_token":"acc-put-0123","refresh_token":"ref-shared-0123","expires_at_ms":%d}}`, later)
	if status, _, b := d.call("PUT", "/v1/admin/subscriptions/a1/"+other+"/credential", d.token, put); status != 409 || envelopeOf(t, b)["code"] != "state_conflict" {
		t.Errorf("PUT of a held grant onto another subscription: %d %s, want 409 state_conflict", status, b)
	}
	if status, _, b := d.call("PUT", "/v1/admin/subscriptions/a1/"+first+"/credential", d.token, put); status != 200 {
		t.Errorf("PUT of its own grant onto the holder: %d %s, want 200", status, b)
	}
	vault, err := os.ReadFile(filepath.Join(d.env["BRAMA_STATE_DIR"], "vault.json"))
	if n := strings.Count(string(vault), "ref-shared-0123"); err != nil || n != 1 {
		t.Errorf("the vault holds the grant %d times (%v), want once", n, err)
	}
}

// TestFailedRefreshAfterA401MakesNoSecondCall: a subscription's access token refused on the first call, with calls
// left, is refreshed once; when the refresh fails, the refused token is never sent again (SPEC §7.2, §11.1).
func TestFailedRefreshAfterA401MakesNoSecondCall(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
	}{{502, "bad gateway"}, {400, `{"error":"invalid_grant","error_description":"revoked"}`}} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			var calls atomic.Int64 // the maintenance pass a failed refresh asks for reads usage from the same server
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if r.URL.Path == "/v1/messages" {
					calls.Add(1)
				}
				http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"expired token"}}`, 401)
			})
			tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				http.Error(w, tc.body, tc.status)
			})
			d, tok := oauthSetup(t, provider, tokenEndpoint)
			donateGrant(t, d, "acc-one", "ref-one", time.Now().Add(time.Hour).UnixMilli())
			status, _, body := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
			if n, m := calls.Load(), tokenEndpoint.calls.Load(); n != 1 || m != 1 || envelopeOf(t, body)["attempts"] != float64(1) {
				t.Errorf("%d provider calls, %d token calls, answer %d %s; want 1 call, 1 refresh, attempts 1", n, m, status, body)
			}
		})
	}
}
