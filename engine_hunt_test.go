package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// scriptedFake is an openai-chat provider that answers each call by the
// bearer key it presents, through answer; it counts calls per key.
type scriptedFake struct {
	*fakeProvider
	mu     sync.Mutex // guards answer, calls
	answer map[string]func(w http.ResponseWriter)
	calls  map[string]int
}

func newScriptedFake(t *testing.T) *scriptedFake {
	s := &scriptedFake{answer: map[string]func(http.ResponseWriter){}, calls: map[string]int{}}
	s.fakeProvider = newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Method != http.MethodPost { // a maintenance pass's usage read is no call
			http.Error(w, `{"error":"no usage report here"}`, 404)
			return
		}
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		s.mu.Lock()
		s.calls[key]++
		answer := s.answer[key]
		s.mu.Unlock()
		if answer == nil {
			http.Error(w, `{"error":{"message":"unknown key"}}`, 418)
			return
		}
		answer(w)
	})
	return s
}

func (s *scriptedFake) set(key string, answer func(w http.ResponseWriter)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answer[key] = answer
}

func (s *scriptedFake) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[key]
}

// Scripted answers.
func answerOK(w http.ResponseWriter) { okAnswer(w) }
func answer401(w http.ResponseWriter) {
	http.Error(w, `{"error":{"type":"authentication_error","message":"bad key"}}`, 401)
}
func answer429(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "120")
	http.Error(w, `{"error":{"type":"rate_limit_error","message":"slow down"}}`, 429)
}
func answerMalformed(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"choices": not json`)
}

// huntScene starts a daemon whose kimi provider is a scripted fake, with a
// test clock, and an agent with kimi subscriptions key-a then key-b.
func huntScene(t *testing.T) (*daemon, *scriptedFake, *testClock, string) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	testingOnlyNow = clock.now
	t.Cleanup(func() { testingOnlyNow = nil })
	fake := newScriptedFake(t)
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0"
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tok, _ := agentWithSubs(t, d, "ag", "kimi", "key-a", "key-b")
	return d, fake, clock, tok
}

// TestAFailedAnswerPinsNothing: only a success pins its subscription (SPEC
// §7.2.4); a 200 whose body is malformed is answered provider_failure and
// must not make that subscription go first among equals next time.
func TestAFailedAnswerPinsNothing(t *testing.T) {
	d, fake, clock, tok := huntScene(t)
	fake.set("key-a", answer429)
	fake.set("key-b", answerMalformed)
	body := chatBody(dialectChat, "kimi/k2", false, "")
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, body); s != 502 {
		t.Fatalf("a blocked, b malformed: %d %s, want 502 provider_failure", s, b)
	}
	clock.advance(121 * time.Second) // a's block is over: a and b are equals again
	fake.set("key-a", answerOK)
	fake.set("key-b", answerOK)
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, body); s != 200 {
		t.Fatalf("%d %s", s, b)
	}
	if a, b := fake.count("key-a"), fake.count("key-b"); a != 2 || b != 1 {
		t.Errorf("a called %d, b %d times; want a (overlay order: b never served) called again, b not", a, b)
	}
}

// pinnedScene is huntScene after one request: a refused for rate, b served and pinned; then a's block ends, so the two
// are equals but for b's pin. It returns the request's body too.
func pinnedScene(t *testing.T) (*daemon, *scriptedFake, *testClock, string, string) {
	d, fake, clock, tok := huntScene(t)
	body := chatBody(dialectChat, "kimi/k2", false, "")
	fake.set("key-a", answer429)
	fake.set("key-b", answerOK)
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, body); s != 200 {
		t.Fatalf("a blocked, b serves (and is pinned): %d %s", s, b)
	}
	clock.advance(121 * time.Second)
	return d, fake, clock, tok, body
}

// TestAPinOnACredentialRefusedSinceIsPassedOver: the pinned subscription's
// credential refused by a later call leaves the pool; its pin, still live,
// orders nothing, and the next request is served by the other (SPEC §7.2.2).
func TestAPinOnACredentialRefusedSinceIsPassedOver(t *testing.T) {
	d, fake, clock, tok, body := pinnedScene(t) // b, pinned, goes first
	fake.set("key-b", answer401)
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, body); s != 429 {
		t.Fatalf("b refused (and marked), a blocked again: %d %s", s, b)
	}
	clock.advance(121 * time.Second) // a alone is in the pool, though b's pin lives
	fake.set("key-a", answerOK)
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, body); s != 200 {
		t.Fatalf("a alone: %d %s", s, b)
	}
	if a, b := fake.count("key-a"), fake.count("key-b"); a != 3 || b != 2 {
		t.Errorf("a called %d, b %d times; want a 3 (429, 429, served), b 2 (served, then refused)", a, b)
	}
}

// TestACredentialMarkedDuringAWalkIsNotCalled: a request whose walk
// reaches a subscription that another request's 401 marked
// needs_reauthorization meanwhile skips it without a call (SPEC §10.3: such
// a credential is never called by a request).
func TestACredentialMarkedDuringAWalkIsNotCalled(t *testing.T) {
	d, fake, _, tok, body := pinnedScene(t) // both order b (pinned), then a

	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fake.set("key-b", func(w http.ResponseWriter) {
		held := false
		once.Do(func() { held = true })
		if held { // the first request's call on b waits until the second is done
			close(arrived)
			<-release
		}
		answer429(w)
	})
	fake.set("key-a", answer401)
	first := make(chan int)
	var firstBody []byte // written before first is sent
	go func() {
		s, _, b := d.call("POST", "/v1/chat/completions", tok, body)
		firstBody = b
		first <- s
	}()
	<-arrived
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, body); s != 429 {
		t.Fatalf("second request: b 429, a 401: %d %s", s, b)
	}
	close(release)
	if s := <-first; s != 429 {
		t.Errorf("first request: %d, want 429 from b, a skipped", s)
	}
	_, _, b := d.call("GET", "/v1/admin/subscriptions/ag", d.token, "")
	var listing struct {
		Subscriptions []struct{ ID string } `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &listing); err != nil || len(listing.Subscriptions) != 2 {
		t.Fatalf("listing: %v %s", err, b)
	}
	a, bID := listing.Subscriptions[0].ID, listing.Subscriptions[1].ID // overlay order: key-a, key-b
	want := "the provider refused for rate: " + bID + ": rate limited: slow down; " + a + ": credential refused meanwhile; sign in again"
	if got := envelopeOf(t, firstBody)["message"]; got != want { // SPEC §7.2.5: every skip named
		t.Errorf("first request's message = %q, want %q", got, want)
	}
	if n := fake.count("key-a"); n != 2 { // its 429 at the start, its 401 to the second request
		t.Errorf("a was called %d times, want 2; once marked needs_reauthorization it is never called again", n)
	}
}

func answerQuota(w http.ResponseWriter) {
	http.Error(w, `{"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"out of credit"}}`, 429)
}
func answer402(w http.ResponseWriter) {
	http.Error(w, `{"error":{"type":"billing_error","message":"no credit"}}`, 402)
}

// TestMixedRefusalsPrecedence: two credentials refused differently get
// SPEC §7.2.5's first match (b 429, c quota, d authentication), both calls
// counted, and a 429 says Retry-After (the earliest block's end).
func TestMixedRefusalsPrecedence(t *testing.T) {
	answers := map[string]func(http.ResponseWriter){"401": answer401, "429": answer429, "quota": answerQuota, "402": answer402}
	for _, tc := range []struct {
		first, second string
		status        int
		code          string
		retryAfter    string
	}{
		{"401", "quota", 502, "provider_quota_exhausted", ""},
		{"quota", "401", 502, "provider_quota_exhausted", ""},
		{"402", "401", 502, "provider_quota_exhausted", ""},
		{"quota", "429", 429, "provider_rate_limited", "120"},
		{"429", "402", 429, "provider_rate_limited", "120"},
		{"401", "429", 429, "provider_rate_limited", "120"},
	} {
		t.Run(tc.first+"+"+tc.second, func(t *testing.T) {
			d, fake, _, tok := huntScene(t)
			fake.set("key-a", answers[tc.first])
			fake.set("key-b", answers[tc.second])
			s, h, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/k2", false, ""))
			e := envelopeOf(t, b)
			if s != tc.status || e["code"] != tc.code || e["attempts"] != float64(2) || h.Get("Brama-Attempts") != "2" {
				t.Errorf("%d %s (Brama-Attempts %q), want %d %s after 2 calls", s, b, h.Get("Brama-Attempts"), tc.status, tc.code)
			}
			if h.Get("Retry-After") != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", h.Get("Retry-After"), tc.retryAfter)
			}
			if n := fake.count("key-a") + fake.count("key-b"); n != 2 {
				t.Errorf("the provider saw %d calls, want 2", n)
			}
		})
	}
}

// TestCodexInBandLimitBlocks: codex's in-band usage_limit_reached after the
// 2xx is provider_incomplete for this request and records a block on the
// subscription (SPEC §6.2), so the next request makes no call into it.
func TestCodexInBandLimitBlocks(t *testing.T) {
	for _, tc := range []struct {
		dialect, path string
		stream        bool
	}{
		{dialectChat, "/v1/chat/completions", false}, {dialectChat, "/v1/chat/completions", true},
		{dialectResponses, "/v1/responses", false}, {dialectResponses, "/v1/responses", true},
	} {
		stream := tc.stream
		t.Run(fmt.Sprint(tc.dialect, " stream=", stream), func(t *testing.T) {
			d, fake, tok, _ := codexAtItsLimit(t)
			body := chatBody(tc.dialect, "codex/gpt-5", stream, "")
			req, _ := http.NewRequest("POST", d.url+tc.path, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			first, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(first), "provider_incomplete") {
				t.Fatalf("first answer %d %s, want provider_incomplete", resp.StatusCode, first)
			}
			s, h, b := d.call("POST", tc.path, tok, body)
			if e := envelopeOf(t, b); s != 429 || e["code"] != "subscription_unavailable" || fake.calls.Load() != 1 || h.Get("Retry-After") == "" {
				t.Errorf("after an in-band usage limit: %d %s (Retry-After %q), %d calls; want 429 subscription_unavailable, no second call", s, b, h.Get("Retry-After"), fake.calls.Load())
			}
		})
	}
}

// TestSelectorSkipsACandidateThatCannotExpressTheRequest: JSON mode cannot
// be expressed toward messages (SPEC §7.6), so a selector's messages
// candidate is skipped without a call and the next candidate, which speaks
// chat, serves it; only when no candidate can is the 400 the answer. When
// the other candidates refuse, the message names the skipped one and why
// (so too one skipped for want of a max_tokens, SPEC §6.4).
func TestSelectorSkipsACandidateThatCannotExpressTheRequest(t *testing.T) {
	fake := newKeyedFake(t, map[string]string{"ds-1": "200"})
	never := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, `{"type":"error","error":{"type":"api_error","message":"unexpected"}}`, 500)
	})
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0"
	env["BRAMA_PROVIDER_DEEPSEEK_BASE_URL"] = fake.URL
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = never.URL
	d := startDaemon(t, env, "")
	for _, put := range []string{`{"alias":"a1","route":"anthropic/claude-x"}`, `{"alias":"a2","route":"deepseek/ds-chat"}`} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
			t.Fatalf("PUT %s: %d %s", put, s, b)
		}
	}
	tok, _ := agentWithSubs(t, d, "a1", "anthropic", "an-1")
	jsonMode := `,"max_tokens":100,"response_format":{"type":"json_object"}`
	s, h, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, jsonMode))
	if e := envelopeOf(t, b); s != 400 || e["code"] != "invalid_request" || never.calls.Load() != 0 {
		t.Fatalf("only a messages candidate: %d %s, %d calls; want 400 invalid_request before any call", s, b, never.calls.Load())
	}
	donate(t, d, "a1", "deepseek", "ds-1")
	s, h, b = d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, jsonMode))
	if s != 200 || h.Get("Brama-Route") != "deepseek/ds-chat" || h.Get("Brama-Attempts") != "1" || never.calls.Load() != 0 {
		t.Errorf("any with JSON mode: %d %s (route %q, attempts %q); want deepseek's answer after 1 call", s, b, h.Get("Brama-Route"), h.Get("Brama-Attempts"))
	}
	fake.set("ds-1", "404") // every candidate refused: the message names the skipped one and why (REFERENCE "Selectors")
	s, _, b = d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, jsonMode))
	want := "every candidate refused the request: anthropic/claude-x: skipped: structured output without a JSON Schema (JSON mode) " +
		"cannot be expressed to an anthropic-messages provider; send a JSON Schema; deepseek/ds-chat: refused the request: no such model"
	if e := envelopeOf(t, b); s != 404 || e["code"] != "provider_rejected" || e["message"] != want {
		t.Errorf("every candidate refused: %d %s; want 404 provider_rejected with message %q", s, b, want)
	}
	s, _, b = d.call("POST", "/v1/chat/completions", tok, `{"model":"any","messages":[{"role":"user","content":"hi"}]}`)
	want = "every candidate refused the request: anthropic/claude-x: skipped: max_tokens is required: the model's own limit is " +
		"unknown (the model catalogue is unavailable: live reads are off (BRAMA_MODEL_CATALOG_URL=off) and there is no cached copy); " +
		"deepseek/ds-chat: refused the request: no such model"
	if e := envelopeOf(t, b); s != 404 || e["code"] != "provider_rejected" || e["message"] != want { // SPEC §6.4's skip named
		t.Errorf("no max_tokens known for anthropic: %d %s; want 404 provider_rejected with message %q", s, b, want)
	}
}

// TestConcurrentRequestsAccountEveryCall: requests racing on one pool
// (blocks and refusals recorded while others walk) each make at most two
// calls, and together state exactly the calls the provider saw (SPEC §7.2,
// §7.4).
func TestConcurrentRequestsAccountEveryCall(t *testing.T) {
	fake := newKeyedFake(t, map[string]string{"k1": "429", "k2": "401", "k3": "200", "k4": "500"})
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0"
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tok, _ := agentWithSubs(t, d, "ag", "kimi", "k1", "k2", "k3", "k4")
	const n = 16
	attempts := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", d.url+"/v1/chat/completions", strings.NewReader(chatBody(dialectChat, "kimi/k2", false, "")))
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				attempts <- "error: " + err.Error()
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			attempts <- resp.Header.Get("Brama-Attempts")
		}()
	}
	wg.Wait()
	close(attempts)
	sum := 0
	for a := range attempts {
		var k int
		if _, err := fmt.Sscan(a, &k); err != nil || k > 2 {
			t.Errorf("Brama-Attempts %q: want 0, 1 or 2", a)
		}
		sum += k
	}
	if total := fake.total(); sum != total {
		t.Errorf("the answers state %d calls, the provider saw %d", sum, total)
	}
	if c := fake.count("k2"); c > n {
		t.Errorf("k2 (401) called %d times", c)
	}
}

// TestInBandLimitBlocksUntilTheStatedReset: a committed codex answer whose
// headers state its window spent until a reset, then ends with an in-band
// usage limit, blocks the subscription until that reset (SPEC §7.2.4:
// reset headers, 15 min only when none is stated), not for 15 min.
func TestInBandLimitBlocksUntilTheStatedReset(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	testingOnlyNow = clock.now
	defer func() { testingOnlyNow = nil }()
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("X-Codex-Primary-Used-Percent", "100")
		w.Header().Set("X-Codex-Primary-Window-Minutes", "300")
		w.Header().Set("X-Codex-Primary-Reset-After-Seconds", "3600")
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: error\ndata: {\"type\":\"error\",\"code\":\"usage_limit_reached\",\"message\":\"The usage limit has been reached\",\"sequence_number\":1}\n\n")
	})
	d, tok, _ := codexDaemon(t, fake.URL)
	body := chatBody(dialectChat, "codex/gpt-5", false, "")
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, body); s != 502 {
		t.Fatalf("first answer %d %s, want 502 provider_incomplete", s, b)
	}
	clock.advance(20 * time.Minute) // past the 15-minute default, inside the stated hour
	s, h, b := d.call("POST", "/v1/chat/completions", tok, body)
	if e := envelopeOf(t, b); s != 429 || e["code"] != "subscription_unavailable" || fake.calls.Load() != 1 || h.Get("Retry-After") != "2400" {
		t.Errorf("20 min later: %d %s (Retry-After %q), %d calls; want 429 subscription_unavailable, Retry-After 2400, no second call", s, b, h.Get("Retry-After"), fake.calls.Load())
	}
}

// codexAtItsLimit starts serve on a codex provider whose every stream ends
// in-band with usage_limit_reached, and gives agent a1 (its bound client's
// token tok) one codex grant, id; fake counts the calls.
func codexAtItsLimit(t *testing.T) (d *daemon, fake *fakeProvider, tok, id string) {
	fake = newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"status\":\"in_progress\",\"output\":[]}}\n\n")
		io.WriteString(w, "event: error\ndata: {\"type\":\"error\",\"code\":\"usage_limit_reached\",\"message\":\"The usage limit has been reached\",\"sequence_number\":2}\n\n")
	})
	d, tok, id = codexDaemon(t, fake.URL)
	return d, fake, tok, id
}

// codexDaemon starts serve (the replay guard off) on a codex provider at url
// and gives agent a1 (its bound client's token tok) one codex grant, id, of
// account acct-1.
func codexDaemon(t *testing.T, url string) (d *daemon, tok, id string) {
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0"
	env["BRAMA_PROVIDER_CODEX_BASE_URL"] = url
	d = startDaemon(t, env, "")
	tok = addClient(t, env, "a1-app", "-agent", "a1")
	s, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"codex","oauth":{"access_token":"codex-access-0123456789","refresh_token":"codex-refresh-0123","account_id":"acct-1","expires_at_ms":4102444800000}}`)
	return d, tok, donatedID(t, s, b, "a1", "codex")
}
