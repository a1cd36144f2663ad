package main

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
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

// commentStreamHeapGrowthMB streams 64 MiB of SSE comment lines with no
// blank line between them (a provider's keep-alives) from a fake provider
// through a real daemon, then a whole answer, and returns how far the
// in-use heap stood above idle after the comments were sent.
func commentStreamHeapGrowthMB(tb testing.TB, dialect string) float64 {
	tb.Helper()
	heapInuse := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	chunk := bytes.Repeat([]byte(": keepalive\n"), 64<<10/len(": keepalive\n"))
	stream := fixture(tb, protocolFixtures[0].stream)
	var during atomic.Uint64 // set by the fake, read after the answer
	fake := newFakeProvider(tb, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for sent := 0; sent < 64<<20; sent += len(chunk) {
			w.Write(chunk)
		}
		w.(http.Flusher).Flush()
		during.Store(heapInuse())
		io.WriteString(w, stream)
	})
	env := stateEnv(tb)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"], env["BRAMA_LOG_LEVEL"] = fake.URL, "error"
	d := startDaemon(tb, env, `{"openai":"k"}`, "-local-credentials-stdin")
	idle := heapInuse()
	resp := d.openStream(dialectPaths[dialect], d.token, chatBody(dialect, "openai/gpt-test", true, ""))
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || !bytes.Contains(b, []byte("get_weather")) {
		tb.Fatalf("the stream did not complete: %d %v %.300q", resp.StatusCode, err, b)
	}
	return (float64(during.Load()) - float64(idle)) / (1 << 20)
}

// TestCommentStreamHoldsConstantMemory: the SSE reader keeps no comment
// line (SPEC §17), passthrough and translated.
func TestCommentStreamHoldsConstantMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("streams 64 MiB twice")
	}
	for _, dialect := range []string{dialectChat, dialectMessages} {
		if mb := commentStreamHeapGrowthMB(t, dialect); mb > 20 {
			t.Errorf("%s: the heap grew %.1f MiB over idle during 64 MiB of comments, want at most 20", dialect, mb)
		}
	}
}

// BenchmarkCommentStream reports the heap growth over idle while 64 MiB of
// comment lines pass (passthrough: chat to openai; translated: messages).
// Run one at a time: go test -run '^$' -bench 'CommentStream/chat' -benchtime 1x
func BenchmarkCommentStream(b *testing.B) {
	for _, dialect := range []string{dialectChat, dialectMessages} {
		b.Run(dialect, func(b *testing.B) {
			var worst float64
			for b.Loop() {
				worst = max(worst, commentStreamHeapGrowthMB(b, dialect))
			}
			b.ReportMetric(worst, "heap-growth-MiB")
			b.ReportMetric(processPeakRSSMB(), "peak-RSS-MiB") // the whole process: run one at a time
		})
	}
}
