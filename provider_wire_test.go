package main

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// SPEC §17: what Brama offers providers and what of their answer reaches
// the caller.

// TestNoCompressionOffered: no outbound call offers Accept-Encoding: gzip
// (SPEC §17, resources), so the bytes Brama holds are the bytes the
// provider sent: inference buffered and streamed, an OAuth refresh, a usage
// read and a catalogue read, each seen by a fake over real HTTP.
func TestNoCompressionOffered(t *testing.T) {
	fake := newMaintProviderFake(t, &testClock{t: time.Now()})
	var mu sync.Mutex
	seen := map[string][]string{} // path → the Accept-Encoding of every call
	catalogRead := make(chan struct{})
	var once sync.Once
	record := func(path string, answer http.HandlerFunc) {
		fake.handle(path, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen[path] = append(seen[path], r.Header.Get("Accept-Encoding"))
			mu.Unlock()
			answer(w, r)
		})
	}
	fx := protocolFixtures[0]
	stream := fixture(t, fx.stream)
	record("/openai"+fx.path, func(w http.ResponseWriter, r *http.Request) {
		if b, _ := io.ReadAll(r.Body); bytes.Contains(b, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, stream)
			return
		}
		io.WriteString(w, fx.buffered)
	})
	record("/catalog", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{}`)
		once.Do(func() { close(catalogRead) })
	})
	record("/token/claude-code", fake.defaultAnswer)
	record(fakeClaudeUsage, fake.defaultAnswer)

	env := fake.env(stateEnv(t))
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL + "/openai"
	env["BRAMA_MODEL_CATALOG_URL"] = fake.URL + "/catalog"
	addAgent(t, env, "a1")
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	for _, stream := range []bool{false, true} {
		if status, _, b := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", stream, "")); status != 200 {
			t.Fatalf("stream=%v: %d %s", stream, status, b)
		}
	}
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token,
		`{"provider":"claude-code","oauth":{"access_token":"plantedAccess","refresh_token":"plantedRefresh","expires_at_ms":1}}`)
	donatedID(t, status, b, "a1", "claude-code")
	if status, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); status != 200 {
		t.Fatalf("maintain: %d %s", status, b)
	}
	select {
	case <-catalogRead:
	case <-time.After(maintWait): // a failure deadline, not a wait for it
		t.Fatal("the daemon never read the catalogue")
	}

	mu.Lock()
	defer mu.Unlock()
	for path, n := range map[string]int{"/openai" + fx.path: 2, "/token/claude-code": 1, fakeClaudeUsage: 1, "/catalog": 1} {
		if len(seen[path]) < n {
			t.Errorf("%s: %d calls, want at least %d", path, len(seen[path]), n)
		}
		for _, ae := range seen[path] {
			if ae != "" {
				t.Errorf("%s: a call offered Accept-Encoding %q, want none", path, ae)
			}
		}
	}
}
