package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
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

// providerFactHeaders are what a fake provider answers with besides its
// body: facts for the caller, and what names its account (never relayed).
var providerFactHeaders = map[string]string{
	"x-ratelimit-remaining-requests":       "99",
	"anthropic-ratelimit-tokens-remaining": "1000",
	"retry-after":                          "3",
	"set-cookie":                           "__cf_bm=planted-cookie; Path=/",
	"openai-organization":                  "planted-org",
	"openai-project":                       "proj_planted",
	"anthropic-organization-id":            "planted-org-uuid",
}

// TestProviderFactsReachTheCaller (SPEC §17, headers): a same-format answer
// carries the provider's request id and rate-limit headers as received, a
// translated one the request id; neither a cookie nor the account. Brama's
// own X-Request-Id stays its own: a provider's x-request-id arrives as
// request-id.
func TestProviderFactsReachTheCaller(t *testing.T) {
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		fx, idHeader := protocolFixtures[0], "x-request-id"
		if strings.HasPrefix(r.URL.Path, protocolFixtures[1].path) { // messages and count_tokens
			fx, idHeader = protocolFixtures[1], "request-id"
		}
		for k, v := range providerFactHeaders {
			w.Header().Set(k, v)
		}
		w.Header().Set(idHeader, "req_from_"+fx.provider)
		if strings.HasSuffix(r.URL.Path, "/count_tokens") {
			io.WriteString(w, `{"input_tokens":5}`)
			return
		}
		if bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, fixture(t, fx.stream))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, fx.buffered)
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"], env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL, fake.URL
	d := startDaemon(t, env, `{"openai":"k1","anthropic":"k2"}`, "-local-credentials-stdin")
	check := func(t *testing.T, h http.Header, provider string, same bool) {
		t.Helper()
		if got := h.Get("request-id"); got != "req_from_"+provider {
			t.Errorf("request-id = %q, want the provider's %q", got, "req_from_"+provider)
		}
		if id := h.Get("X-Request-Id"); id == "" || strings.HasPrefix(id, "req_from_") || len(h.Values("X-Request-Id")) != 1 {
			t.Errorf("X-Request-Id = %q, want Brama's own, once", h.Values("X-Request-Id"))
		}
		if got := h.Values("X-Should-Retry"); len(got) != 1 || got[0] != "false" { // the call is paid: no resend
			t.Errorf("X-Should-Retry = %q, want false", got)
		}
		for name, v := range providerFactHeaders {
			want := ""
			if same && (name == "retry-after" || strings.Contains(name, "ratelimit")) {
				want = v
			}
			if got := strings.Join(h.Values(name), ","); got != want {
				t.Errorf("%s = %q, want %q", name, got, want)
			}
		}
	}
	for _, tc := range []struct {
		dialect, route string
		same           bool
	}{
		{dialectChat, "openai/gpt-test", true},
		{dialectMessages, "anthropic/claude-test", true},
		{dialectMessages, "openai/gpt-test", false},
		{dialectChat, "anthropic/claude-test", false},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s to %s stream=%v", tc.dialect, tc.route, stream), func(t *testing.T) {
				status, h, b := d.call("POST", dialectPaths[tc.dialect], d.token, chatBody(tc.dialect, tc.route, stream, ""))
				if status != 200 {
					t.Fatalf("%d %s", status, b)
				}
				provider, _, _ := strings.Cut(tc.route, "/")
				check(t, h, provider, tc.same)
			})
		}
	}
	t.Run("count_tokens", func(t *testing.T) {
		status, h, b := d.call("POST", "/v1/messages/count_tokens", d.token, `{"model":"anthropic/claude-test","messages":[{"role":"user","content":"hi"}]}`)
		if status != 200 || h.Get("Brama-Estimate") != "" {
			t.Fatalf("%d %s, want the provider's count", status, b)
		}
		check(t, h, "anthropic", true)
	})
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
