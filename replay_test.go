package main

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestReplayGuard: within BRAMA_REPLAY_GUARD_SECS (default 120) the same
// request from the same client after a non-retryable refusal that followed
// a provider call is answered that refusal again without a call; a
// different body, another client, an Idempotency-Key request, a retryable
// refusal and the end of the window are not guarded (SPEC §8.1).
func TestReplayGuard(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	testingOnlyNow = clock.now
	defer func() { testingOnlyNow = nil }()
	env := stateEnv(t) // BRAMA_REPLAY_GUARD_SECS unset: 120 s
	fake := refusingProvider(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"`+plantedOpenAIKey+`"}`, "-local-credentials-stdin")
	other := addClient(t, env, "other")
	until := clock.now().Add(120 * time.Second).Format(time.RFC3339)

	// calls runs f and returns how many provider calls it made.
	calls := func(f func()) int64 {
		before := fake.calls.Load()
		f()
		return fake.calls.Load() - before
	}
	tests := []struct {
		name    string
		dialect string
		model   string
		stream  bool // the first request streams; its replay is asked buffered and streamed
		status  int
		code    string
		loose   bool // the provider may have generated: a lowered output limit is the same request
	}{
		{name: "cut stream", dialect: dialectChat, model: "openai/gpt-cutstream", stream: true, status: 502, code: "provider_incomplete", loose: true},
		{name: "provider 400", dialect: dialectChat, model: "openai/gpt-400", status: 400, code: "provider_rejected"},
		{name: "provider 404, messages", dialect: dialectMessages, model: "openai/gpt-404", status: 404, code: "provider_rejected"},
		{name: "malformed answer", dialect: dialectResponses, model: "openai/gpt-bad", status: 502, code: "provider_failure", loose: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := dialectPaths[tc.dialect]
			if n := calls(func() {
				if tc.stream {
					resp := d.openStream(path, d.token, chatBody(tc.dialect, tc.model, true, ""))
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || !strings.Contains(string(b), tc.code) {
						t.Fatalf("first stream: %d %q", resp.StatusCode, b)
					}
					return
				}
				status, _, b := d.call("POST", path, d.token, chatBody(tc.dialect, tc.model, false, ""))
				if e := envelopeOf(t, b); status != tc.status || e["code"] != tc.code || e["attempts"] != 1.0 {
					t.Fatalf("first: %d %s", status, b)
				}
			}); n != 1 {
				t.Fatalf("first request made %d provider calls", n)
			}

			replays := []bool{false}
			if tc.stream {
				replays = []bool{false, true} // Claude Code falls back to a buffered call of the same body
			}
			for _, stream := range replays {
				var (
					status int
					hdr    map[string][]string
					body   []byte
				)
				if n := calls(func() {
					status, hdr, body = d.call("POST", path, d.token, chatBody(tc.dialect, tc.model, stream, ""))
				}); n != 0 {
					t.Errorf("replay (stream %v) made %d provider calls, want 0", stream, n)
				}
				e := envelopeOf(t, body)
				if status != tc.status || e["code"] != tc.code || e["retryable"] != false || e["attempts"] != 0.0 {
					t.Errorf("replay (stream %v): %d %s, want %d %s, retryable false, attempts 0", stream, status, body, tc.status, tc.code)
				}
				h := func(k string) string { return strings.Join(hdr[k], ",") }
				if h("Brama-Replay-Refused") != "true" || h("Brama-Attempts") != "0" || h("X-Should-Retry") != "false" || h("Content-Type") != "application/json" {
					t.Errorf("replay (stream %v) headers: %v", stream, hdr)
				}
				if msg, _ := e["message"].(string); !strings.Contains(msg, "repeats one refused") || !strings.Contains(msg, until) {
					t.Errorf("the replay message does not say it repeats a refusal until %s: %q", until, msg)
				}
			}

			// Claude Code's buffered fallback after a failed stream asks for
			// fewer output tokens: the same request when the provider may
			// have generated, a new one when it refused the request itself.
			lowered := strings.Replace(chatBody(tc.dialect, tc.model, false, ""), ":100,", ":64,", 1)
			var lhdr map[string][]string
			n := calls(func() { _, lhdr, _ = d.call("POST", path, d.token, lowered) })
			guarded := len(lhdr["Brama-Replay-Refused"]) != 0
			if want := tc.loose; guarded != want || (n == 0) != want {
				t.Errorf("a lowered output limit after %s: %d provider calls, guarded %v; want guarded %v", tc.code, n, guarded, want)
			}

			for _, other := range []struct {
				name        string
				token, body string
				hdr         []string
			}{
				{"a different body", d.token, chatBody(tc.dialect, tc.model, false, `,"temperature":0.3`), nil},
				{"another client", other, chatBody(tc.dialect, tc.model, false, ""), nil},
				{"an Idempotency-Key", d.token, chatBody(tc.dialect, tc.model, false, ""), []string{"Idempotency-Key", "k-" + tc.name}},
				{"another beta header", d.token, chatBody(tc.dialect, tc.model, false, ""), []string{"OpenAI-Beta", "assistants=v2"}},
				{"another anthropic-version", d.token, chatBody(tc.dialect, tc.model, false, ""), []string{"anthropic-version", "2099-01-01"}},
			} {
				var hdr map[string][]string
				if n := calls(func() { _, hdr, _ = d.call("POST", path, other.token, other.body, other.hdr...) }); n != 1 || len(hdr["Brama-Replay-Refused"]) != 0 {
					t.Errorf("%s: %d provider calls, replay header %v; want 1 call, not guarded", other.name, n, hdr["Brama-Replay-Refused"])
				}
			}
		})
	}

	t.Run("retryable refusals", func(t *testing.T) {
		for _, model := range []string{"openai/gpt-500", "openai/gpt-429"} {
			body := chatBody(dialectChat, model, false, "")
			if n := calls(func() {
				d.call("POST", "/v1/chat/completions", d.token, body)
				d.call("POST", "/v1/chat/completions", d.token, body)
			}); n != 2 {
				t.Errorf("%s twice: %d provider calls, want 2 (a retryable refusal is not guarded)", model, n)
			}
		}
	})

	t.Run("after the window", func(t *testing.T) {
		clock.advance(120 * time.Second)
		for _, tc := range tests {
			var hdr map[string][]string
			if n := calls(func() {
				_, hdr, _ = d.call("POST", dialectPaths[tc.dialect], d.token, chatBody(tc.dialect, tc.model, false, ""))
			}); n != 1 || len(hdr["Brama-Replay-Refused"]) != 0 {
				t.Errorf("%s after 120 s: %d provider calls, replay header %v; want 1 call", tc.name, n, hdr["Brama-Replay-Refused"])
			}
		}
	})
	assertNoSecret(t, plantedOpenAIKey, d.stderr.String(), env["BRAMA_STATE_DIR"])
}

// TestReplayGuardForgetsAfterAFix: the operator's change to the route a
// refused request used forgets the refusal, so the caller's first request
// after the fix is dispatched (SPEC §17): a registry write of its alias
// (even to the same route), one by the CLI, a new direct key, and a
// replaced or newly donated credential of its provider. A write of another
// alias forgets nothing.
func TestReplayGuardForgetsAfterAFix(t *testing.T) {
	env := stateEnv(t)
	fake := refusingProvider(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	cli := func(stdin string, args ...string) func(t *testing.T) {
		return func(t *testing.T) {
			if _, errOut, code := runCLI(t, env, stdin, args...); code != 0 {
				t.Fatalf("%v: exit %d: %s", args, code, errOut)
			}
		}
	}
	cli("sk-direct-old-0123456789\n", "credentials", "set", "openai")(t)
	d := startDaemon(t, env, "")
	app := addClient(t, env, "app", "-agent", "a1")
	s, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"sk-kimi-old-0123456789"}`)
	kimi := donatedID(t, s, b, "a1", "kimi")
	admin := func(method, path, body string) func(t *testing.T) {
		return func(t *testing.T) {
			if s, _, b := d.call(method, path, d.token, body); s/100 != 2 {
				t.Fatalf("%s %s: %d %s", method, path, s, b)
			}
		}
	}
	putAlias := func(alias, route string) func(t *testing.T) {
		return admin("PUT", "/v1/admin/routes", fmt.Sprintf(`{"alias":%q,"route":%q}`, alias, route))
	}

	tests := []struct {
		name, model string
		setup, fix  func(t *testing.T)
		forgets     bool
	}{
		{name: "another alias written", model: "still", setup: putAlias("still", "openai/gpt-400"), fix: putAlias("unrelated", "openai/gpt-ok")},
		{name: "its alias written again", model: "same", setup: putAlias("same", "openai/gpt-400"), fix: putAlias("same", "openai/gpt-400"), forgets: true},
		{name: "its alias moved", model: "moved", setup: putAlias("moved", "openai/gpt-400"), fix: putAlias("moved", "openai/gpt-ok"), forgets: true},
		{name: "its alias removed and declared again", model: "again", setup: putAlias("again", "openai/gpt-400"),
			fix: func(t *testing.T) {
				admin("DELETE", "/v1/admin/routes", `{"alias":"again"}`)(t)
				putAlias("again", "openai/gpt-400")(t)
			}, forgets: true},
		{name: "its alias moved by the CLI", model: "bycli", setup: putAlias("bycli", "openai/gpt-400"), fix: cli("", "routes", "set", "bycli", "openai/gpt-404"), forgets: true},
		{name: "a new direct key", model: "openai/gpt-401", fix: cli("sk-direct-new-0123456789\n", "credentials", "set", "openai"), forgets: true},
		{name: "its subscription credential replaced", model: "kimi/gpt-400", fix: admin("PUT", "/v1/admin/subscriptions/a1/"+kimi+"/credential", `{"api_key":"sk-kimi-new-0123456789"}`), forgets: true},
		{name: "a subscription of its provider donated", model: "kimi/gpt-404", fix: admin("POST", "/v1/admin/subscriptions/a1", `{"provider":"kimi","api_key":"sk-kimi-more-0123456789"}`), forgets: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup(t)
			}
			body := chatBody(dialectChat, tc.model, false, "")
			// ask sends the request and returns how many provider calls it made.
			ask := func() (int64, http.Header) {
				before := fake.calls.Load()
				_, hdr, _ := d.call("POST", "/v1/chat/completions", app, body)
				return fake.calls.Load() - before, hdr
			}
			if n, _ := ask(); n != 1 {
				t.Fatalf("the first request made %d provider calls, want 1", n)
			}
			if n, hdr := ask(); n != 0 || hdr.Get("Brama-Replay-Refused") != "true" {
				t.Fatalf("the replay made %d provider calls (Brama-Replay-Refused %q), want 0, refused", n, hdr.Get("Brama-Replay-Refused"))
			}
			tc.fix(t)
			if n, hdr := ask(); (n == 1) != tc.forgets || (hdr.Get("Brama-Replay-Refused") == "") != tc.forgets {
				t.Errorf("after the fix: %d provider calls, Brama-Replay-Refused %q; want dispatched %v", n, hdr.Get("Brama-Replay-Refused"), tc.forgets)
			}
		})
	}
	assertNoSecret(t, "sk-kimi-new-0123456789", d.stderr.String(), filepath.Join(env["BRAMA_STATE_DIR"], "journal"))
}

// TestReplayGuardOff: BRAMA_REPLAY_GUARD_SECS=0 turns the guard off.
func TestReplayGuardOff(t *testing.T) {
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0"
	fake := refusingProvider(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	body := chatBody(dialectChat, "openai/gpt-400", false, "")
	for range 2 {
		if status, hdr, b := d.call("POST", "/v1/chat/completions", d.token, body); status != 400 || len(hdr["Brama-Replay-Refused"]) != 0 {
			t.Errorf("%d %s %v", status, b, hdr)
		}
	}
	if n := fake.calls.Load(); n != 2 {
		t.Errorf("provider calls = %d, want 2 with the guard off", n)
	}
	g := newReplayGuard(testEnv(env), nil, time.Now) // off keeps nothing, not even until the next request
	refuseOnce(g, "c", rawBody(t, body), "no")
	if len(g.refused) != 0 || len(g.queue) != 0 {
		t.Errorf("an off guard holds %d refusals", len(g.refused))
	}
}

// TestReplayGuardForgets: the guard keeps one entry per refusal in the
// window and forgets each when its time passes; a key refused again later
// outlives its first queue entry.
func TestReplayGuardForgets(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	g := newReplayGuard(testEnv(map[string]string{"BRAMA_REPLAY_GUARD_SECS": "60"}), nil, clock.now)
	body := func(i int) rawObject { return rawBody(t, fmt.Sprintf(`{"n":%d}`, i)) }
	for i := range 10_000 {
		refuseOnce(g, "c", body(i), "")
	}
	if n := g.size(); n != 10_000 {
		t.Fatalf("size = %d, want 10000", n)
	}
	clock.advance(30 * time.Second)
	refuseOnce(g, "c", body(0), "") // refused again (two were in flight)
	clock.advance(30 * time.Second)
	if refusalOf(g, "c", body(1)) != nil {
		t.Error("an entry outlived its window")
	}
	if refusalOf(g, "c", body(0)) == nil {
		t.Error("the later refusal of key 0 was forgotten with its first entry")
	}
	if n, q := g.size(), len(g.queue); n != 1 || q != 1 {
		t.Errorf("after the window: %d entries, %d queued; want 1, 1", n, q)
	}
	if g.held["c"] != 1 || g.held["other"] != 0 {
		t.Errorf("held per client: %v", g.held)
	}
	clock.advance(30 * time.Second)
	if n := g.size(); n != 0 || g.queue != nil || len(g.held) != 0 {
		t.Errorf("after every window: %d entries, queue %v, per client %v", n, g.queue, g.held)
	}
}

// TestNewReplayGuardWindow: unset is 120 s, 0 is off, junk is logged and 120 s.
func TestNewReplayGuardWindow(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 120 * time.Second, "0": 0, "5": 5 * time.Second, "-1": 120 * time.Second, "x": 120 * time.Second} {
		var logs syncBuffer
		g := newReplayGuard(testEnv(map[string]string{"BRAMA_REPLAY_GUARD_SECS": v}), (&cliEnv{stderr: &logs, getenv: testEnv(nil)}).sys().log, time.Now)
		if g.window != want || (strings.Contains(logs.String(), "replay_guard_secs_invalid") != (v == "-1" || v == "x")) {
			t.Errorf("BRAMA_REPLAY_GUARD_SECS=%q: window %v, logs %q", v, g.window, logs.String())
		}
	}
}

// rawBody splits a test's JSON object as readCallerRequest does.
func rawBody(t testing.TB, s string) rawObject {
	t.Helper()
	o, err := parseRawObject([]byte(s))
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return o
}

// TestReplayKey: the digest is the body's bytes without the top-level
// stream members (SPEC §17): a body differing only in them is the same
// request, one differing anywhere else (a nested "stream", a reordered or
// respaced member) is not; the loose key also leaves out the output limit.
func TestReplayKey(t *testing.T) {
	const base = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`
	meta := `{"model":"m","client_metadata":{"session_id":"s","turn_id":"t"},"input":"hi"}`
	tests := []struct {
		name, body string
		than       string // "": base
		same       bool
		looseSame  bool // under the loose key
	}{
		{name: "stream members last", body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"stream":true,"stream_options":{"include_usage":true}}`, same: true, looseSame: true},
		{name: "stream first", body: `{"stream":false,"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`, same: true, looseSame: true},
		{name: "stream between", body: `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"stream_options":null,"max_tokens":100}`, same: true, looseSame: true},
		{name: "stream twice", body: `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":100,"stream":false}`, same: true, looseSame: true},
		{name: "another output limit", body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true}`, looseSame: true},
		{name: "a nested stream", body: `{"model":"m","messages":[{"role":"user","content":"hi","stream":true}],"max_tokens":100}`},
		{name: "another message", body: `{"model":"m","messages":[{"role":"user","content":"ho"}],"max_tokens":100}`},
		{name: "reordered", body: `{"messages":[{"role":"user","content":"hi"}],"model":"m","max_tokens":100}`},
		{name: "respaced", body: `{"model": "m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`},
		// The Codex CLI re-sends a failed request with client_metadata's
		// members in another order: the same request.
		{name: "client_metadata reordered", than: meta, body: `{"model":"m","client_metadata":{"turn_id":"t","session_id":"s"},"input":"hi"}`, same: true, looseSame: true},
		{name: "client_metadata moved", than: meta, body: `{"client_metadata":{"session_id":"s","turn_id":"t"},"model":"m","input":"hi","stream":true}`, same: true, looseSame: true},
		{name: "client_metadata changed", than: meta, body: `{"model":"m","client_metadata":{"session_id":"s","turn_id":"u"},"input":"hi"}`},
		{name: "client_metadata absent", than: meta, body: `{"model":"m","input":"hi"}`},
		{name: "client_metadata key renamed", than: meta, body: `{"model":"m","client_metadata":{"session_id":"s","turn":"t"},"input":"hi"}`},
		{name: "client_metadata not an object", than: `{"model":"m","client_metadata":"a","input":"hi"}`, body: `{"model":"m","client_metadata":"b","input":"hi"}`},
	}
	for _, tt := range tests {
		for _, loose := range []bool{false, true} {
			want := tt.same || loose && tt.looseSame
			if got := replayKeyOf("c", "s", rawBody(t, tt.body), loose) == replayKeyOf("c", "s", rawBody(t, cmp.Or(tt.than, base)), loose); got != want {
				t.Errorf("%s (loose %v): same key %v, want %v", tt.name, loose, got, want)
			}
		}
	}
	k := replayKeyOf("c", "s", rawBody(t, base), false)
	if k == replayKeyOf("c2", "s", rawBody(t, base), false) || k == replayKeyOf("c", "s2", rawBody(t, base), false) || k == replayKeyOf("c", "s", rawBody(t, base), true) {
		t.Error("another client, scope or key kind gave the same key")
	}
}

// BenchmarkReplayGuardMemory reports the heap held by 10,000 distinct
// refused bodies inside one window (SPEC §8.1: bounded by what was refused).
func BenchmarkReplayGuardMemory(b *testing.B) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		g := newReplayGuard(testEnv(nil), nil, clock.now)
		for i := range 10_000 {
			msg := truncateUTF8(fmt.Sprintf("provider \"openai\" answered 400 (context_length_exceeded): request %d %s", i, strings.Repeat("x", maxReplayMessage)), maxReplayMessage)
			refuseOnce(g, "client", rawBody(b, fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"question %d"}]}`, i)), msg)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/10_000, "B/entry")
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "MiB/10k")
		runtime.KeepAlive(g)
	}
}

// replayBenchBody is a chat body of about size bytes: many one-KiB messages
// (a long conversation) and the stream members last.
func replayBenchBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"openai/gpt-400","messages":[`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"role":"user","content":"turn %d %s"}`, i, strings.Repeat("lorem ipsum ", 85))
	}
	b.WriteString(`],"max_tokens":100,"stream":true,"stream_options":{"include_usage":true}}`)
	return b.Bytes()
}

// BenchmarkReplayDigest: what the guard spends on one request of a client
// holding a remembered refusal (SPEC §17: proportional to the body, no
// generic maps): B/body is the bytes allocated per request over the body's
// size, ns/byte the time per body byte.
func BenchmarkReplayDigest(b *testing.B) {
	for _, mib := range []int{8, 32} {
		body := replayBenchBody(mib << 20)
		b.Run(fmt.Sprintf("%dMiB", mib), func(b *testing.B) {
			g := newReplayGuard(testEnv(nil), nil, time.Now)
			refuseOnce(g, "c", rawBody(b, `{"model":"m"}`), "")
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				o, err := parseRawObject(body) // as readCallerRequest, before the guard
				if err != nil {
					b.Fatal(err)
				}
				if refusalOf(g, "c", o) != nil {
					b.Fatal("a different body matched")
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			runtime.ReadMemStats(&m1)
			b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(b.N)/float64(len(body)), "B/body")
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N)/float64(len(body)), "ns/byte")
		})
	}
}

// refusalOf is the guard's refusal of a request of client with body (no agent, headers or call).
func refusalOf(g *replayGuard, client string, body rawObject) *apiError {
	refusal, _ := g.check(client, "", nil, body, call{}, nil)
	return refusal
}

// rememberOf is the guard's remember for a request of client with body on c.
func rememberOf(g *replayGuard, client string, body rawObject, c call) func(ae *apiError, attempts int, hungUp, streamed bool) {
	_, remember := g.check(client, "", nil, body, c, nil)
	return remember
}

// size is the number of refusals remembered now.
func (g *replayGuard) size() (n int) {
	g.locked(func(time.Time) { n = len(g.refused) })
	return n
}

// refuseOnce has g remember a provider 400 with message after one call, as a request's engine would.
func refuseOnce(g *replayGuard, client string, body rawObject, message string) {
	rememberOf(g, client, body, call{})(refuse("provider_rejected", "%s", message).withStatus(400), 1, false, false)
}

// TestReplayGuardFixReleasesClient: after the operator's fixes forget a
// client's last refusal, its requests take no digest again (SPEC §17).
func TestReplayGuardFixReleasesClient(t *testing.T) {
	g := newReplayGuard(testEnv(nil), nil, time.Now)
	refused := refuse("provider_rejected", "no").withStatus(400)
	rememberOf(g, "c", rawBody(t, `{"n":1}`), call{res: resolution{Alias: "fixme"}})(refused, 1, false, false)
	rememberOf(g, "c", rawBody(t, `{"n":2}`), call{res: resolution{Provider: providerInfo{id: "kimi"}}})(refused, 1, false, false)
	g.forget("fixme", "")
	if g.size() != 1 || g.held["c"] != 1 {
		t.Fatalf("after the alias's fix: %d entries, held %v; want 1, c:1", g.size(), g.held)
	}
	g.forget("", "kimi")
	if g.size() != 0 || len(g.held) != 0 {
		t.Errorf("after the provider's fix: %d entries, held %v; want none", g.size(), g.held)
	}
}

// TestReplayGuardForgetsOnlyWhatAFixTouches: an alias written forgets the refusals through that alias, a provider's
// credential changed those that walked that provider (a selector's candidates too), and nothing else (SPEC §17).
func TestReplayGuardForgetsOnlyWhatAFixTouches(t *testing.T) {
	refused := refuse("provider_rejected", "no").withStatus(400)
	requests := []struct {
		c     call
		cands []resolution
	}{
		{call{res: resolution{Alias: "chat", Provider: providerInfo{id: "openai"}}}, nil},
		{call{res: resolution{Provider: providerInfo{id: "anthropic"}}}, nil},
		{call{res: resolution{Mode: modeAny}}, []resolution{{Provider: providerInfo{id: "kimi"}}}},
	}
	for _, tc := range []struct {
		name, alias, provider string
		forgotten             []int
	}{
		{"another alias", "other", "", nil},
		{"another provider", "", "groq", nil},
		{"the alias", "chat", "", []int{0}},
		{"a provider", "", "anthropic", []int{1}},
		{"a selector candidate's provider", "", "kimi", []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newReplayGuard(testEnv(nil), nil, time.Now)
			for i, r := range requests {
				_, remember := g.check("c", "", nil, rawBody(t, fmt.Sprintf(`{"n":%d}`, i)), r.c, r.cands)
				remember(refused, 1, false, false)
			}
			g.forget(tc.alias, tc.provider)
			for i, r := range requests {
				refusal, _ := g.check("c", "", nil, rawBody(t, fmt.Sprintf(`{"n":%d}`, i)), r.c, r.cands)
				if forgotten := refusal == nil; forgotten != slices.Contains(tc.forgotten, i) {
					t.Errorf("request %d forgotten %v, want %v", i, forgotten, !forgotten)
				}
			}
		})
	}
}

// TestReplayGuardRemembersOnlyAFinalRefusalAfterACall: the guard keeps a refusal met after a provider call that the same
// request would meet again; not one before any call, a hang-up, a retryable one, a client_cancelled, or a sign-in's
// subscription_reauthorization_required, which signing in must let pass (SPEC §8.1, §17).
func TestReplayGuardRemembersOnlyAFinalRefusalAfterACall(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ae       *apiError
		attempts int
		hungUp   bool
		kept     bool
	}{
		{"a refusal after a call", refuse("provider_rejected", "no").withStatus(400), 1, false, true},
		{"an answer", nil, 1, false, false},
		{"before any call", refuse("provider_rejected", "no").withStatus(400), 0, false, false},
		{"the caller hung up", refuse("provider_failure", "cut"), 1, true, false},
		{"retryable", refuse("provider_rate_limited", "slow"), 1, false, false},
		{"client_cancelled", refuse("client_cancelled", "gone"), 1, false, false},
		{"a sign-in is due", refuse("subscription_reauthorization_required", "sign in"), 1, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newReplayGuard(testEnv(nil), nil, time.Now)
			body := rawBody(t, `{"n":1}`)
			rememberOf(g, "c", body, call{})(tc.ae, tc.attempts, tc.hungUp, false)
			if kept := refusalOf(g, "c", body) != nil; kept != tc.kept {
				t.Errorf("remembered %v, want %v", kept, tc.kept)
			}
		})
	}
}
