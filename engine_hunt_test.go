package main

import (
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

// TestACredentialMarkedDuringAWalkIsNotCalled: a request whose walk
// reaches a subscription that another request's 401 marked
// needs_reauthorization meanwhile skips it without a call (SPEC §10.3: such
// a credential is never called by a request).
func TestACredentialMarkedDuringAWalkIsNotCalled(t *testing.T) {
	d, fake, clock, tok := huntScene(t)
	body := chatBody(dialectChat, "kimi/k2", false, "")
	fake.set("key-a", answer429)
	fake.set("key-b", answerOK)
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, body); s != 200 {
		t.Fatalf("a blocked, b serves (and is pinned): %d %s", s, b)
	}
	clock.advance(121 * time.Second) // both order b (pinned), then a

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
	go func() {
		s, _, _ := d.call("POST", "/v1/chat/completions", tok, body)
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
	if n := fake.count("key-a"); n != 2 { // its 429 at the start, its 401 to the second request
		t.Errorf("a was called %d times, want 2; once marked needs_reauthorization it is never called again", n)
	}
}
