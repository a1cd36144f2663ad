package main

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

// TestStreamSendsItsStatusAtCommit: the stream commits when the provider
// answers 2xx, and the caller then gets its 200 with Brama-Attempts (SPEC
// §1 "committed", §7.4, §7.5), even while the provider stays silent; not
// only with the provider's first event or the first keep-alive 15 s later.
func TestStreamSendsItsStatusAtCommit(t *testing.T) {
	release := make(chan struct{}, 1)
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select { // silent until the caller has its status
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, lfFixture(t, map[string]string{"/chat/completions": "openai-chat.sse",
			"/v1/messages": "anthropic-messages.sse", "/responses": "openai-responses.sse"}[r.URL.Path]))
	})
	env := stateEnv(t)
	for _, p := range []string{"OPENAI", "ANTHROPIC", "OPENAI_RESPONSES"} {
		env["BRAMA_PROVIDER_"+p+"_BASE_URL"] = fake.URL
	}
	d := startDaemon(t, env, `{"openai":"k1","anthropic":"k2","openai-responses":"k3"}`, "-local-credentials-stdin")
	for _, tc := range []struct{ dialect, model, terminal string }{
		{dialectChat, "openai/gpt-test", "data: [DONE]"},                             // passthrough
		{dialectMessages, "anthropic/claude-test", "event: message_stop"},            // passthrough
		{dialectResponses, "openai-responses/gpt-resp", "event: response.completed"}, // passthrough
		{dialectMessages, "openai/gpt-test", "event: message_stop"},                  // translated
	} {
		t.Run(tc.dialect+" from "+tc.model, func(t *testing.T) {
			resp := d.openStream(dialectPaths[tc.dialect], d.token, chatBody(tc.dialect, tc.model, true, ""))
			defer resp.Body.Close()
			release <- struct{}{} // the provider speaks only once the caller has its status
			got, err := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.Header.Get("Brama-Attempts") != "1" || err != nil {
				t.Fatalf("status %d, Brama-Attempts %q, read error %v", resp.StatusCode, resp.Header.Get("Brama-Attempts"), err)
			}
			if strings.HasPrefix(string(got), ": keep-alive") || !strings.Contains(string(got), tc.terminal) {
				t.Errorf("the caller's status came with the first keep-alive, not at commit, or the stream did not complete: %.200q", got)
			}
		})
	}
}

// lfFixture is a provider fixture with "\n" line ends, for tests that
// split it into events.
func lfFixture(t testing.TB, name string) string {
	return strings.ReplaceAll(fixture(t, name), "\r\n", "\n")
}

// TestMalformedEventFailsTheStream: an event whose data is JSON but no
// event object (null, a number, an array), or, in a format whose events
// are typed, an object naming no type, is malformed, in passthrough and in
// translation alike: provider_failure in-band, never passed through or
// skipped silently (SPEC §7.5).
func TestMalformedEventFailsTheStream(t *testing.T) {
	var current atomic.Value // the data line the fake sends after its first event
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		frames := strings.SplitAfter(lfFixture(t, map[string]string{"/chat/completions": "openai-chat.sse",
			"/v1/messages": "anthropic-messages.sse", "/responses": "openai-responses.sse"}[r.URL.Path]), "\n\n")
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, frames[0]+"data: "+current.Load().(string)+"\n\n"+strings.Join(frames[1:], ""))
	})
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0" // the cases repeat one body on purpose
	for _, p := range []string{"OPENAI", "ANTHROPIC", "OPENAI_RESPONSES"} {
		env["BRAMA_PROVIDER_"+p+"_BASE_URL"] = fake.URL
	}
	d := startDaemon(t, env, `{"openai":"k1","anthropic":"k2","openai-responses":"k3"}`, "-local-credentials-stdin")
	for _, model := range []string{"openai/gpt-test", "anthropic/claude-test", "openai-responses/gpt-resp"} {
		for _, dialect := range []string{dialectChat, dialectMessages, dialectResponses} {
			malformed := []string{"null", "7", "[]"}
			if model != "openai/gpt-test" { // a chat chunk has no type
				malformed = append(malformed, "{}")
			}
			for _, data := range malformed {
				t.Run(dialect+" from "+model+" "+data, func(t *testing.T) {
					current.Store(data)
					resp := d.openStream(dialectPaths[dialect], d.token, chatBody(dialect, model, true, ""))
					defer resp.Body.Close()
					got, err := io.ReadAll(resp.Body)
					if err == nil || !strings.Contains(string(got), `"code":"provider_failure"`) {
						t.Errorf("read error %v; want the stream aborted after provider_failure in-band: %s", err, got)
					}
				})
			}
		}
	}
}

// TestCutStreamRecordsTheUsageReported: a stream cut after the provider
// reported its input (Anthropic's message_start) records that usage in the
// request's log line, translated as in passthrough (SPEC §7.5: spend is
// recorded once however the stream ended; §13).
func TestCutStreamRecordsTheUsageReported(t *testing.T) {
	frames := strings.SplitAfter(lfFixture(t, "anthropic-messages.sse"), "\n\n")
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, frames[0]+frames[5]+frames[7]) // message_start, a text block, "Hel"
		cutAfterFlush(w)
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"anthropic":"k"}`, "-local-credentials-stdin")
	for _, dialect := range []string{dialectMessages, dialectChat, dialectResponses} {
		t.Run(dialect, func(t *testing.T) {
			resp := d.openStream(dialectPaths[dialect], d.token, chatBody(dialect, "anthropic/claude-test", true, ""))
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil || !strings.Contains(string(got), "provider_incomplete") {
				t.Fatalf("read error %v; want provider_incomplete in-band, then the abort: %s", err, got)
			}
			id := resp.Header.Get("X-Request-Id")
			d.stderr.waitFor(t, `"msg":"request","request_id":"`+id)
			line := requestLine(t, d.stderr.String(), "request_id", id)
			if line["input_tokens"] != 40.0 || line["output_tokens"] != 1.0 || line["outcome"] != "provider_incomplete" {
				t.Errorf("log line %v; want the 40 input and 1 output tokens message_start reported", line)
			}
			if !strings.Contains(d.stderr.String(), `"msg":"stream_failed_after_commit","request_id":"`+id+`","code":"provider_incomplete"`) {
				t.Errorf("no stream_failed_after_commit line (AUTHORIZATION.md) for %s with its code:\n%s", id, d.stderr.String())
			}
		})
	}
}

// TestChatDoneBeforeFinishEndsTheStream: data: [DONE] ends a chat stream;
// before a finish_reason it is a cut, in translation as in passthrough
// (SPEC §7.5): what follows it is never read as the stream going on, and
// Brama does not wait for the provider to close a connection it may hold.
func TestChatDoneBeforeFinishEndsTheStream(t *testing.T) {
	frames := strings.SplitAfter(fixture(t, "openai-chat.sse"), "\n\n")
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, frames[0]+frames[1]+"data: [DONE]\n\n"+strings.Join(frames[2:], ""))
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	for _, dialect := range []string{dialectChat, dialectMessages, dialectResponses} {
		t.Run(dialect, func(t *testing.T) {
			resp := d.openStream(dialectPaths[dialect], d.token, chatBody(dialect, "openai/gpt-test", true, ""))
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil || !strings.Contains(string(got), `"code":"provider_incomplete"`) || strings.Contains(string(got), "get_weather") {
				t.Errorf("read error %v; want provider_incomplete in-band after Hel, nothing from after [DONE]: %s", err, got)
			}
		})
	}
}

// TestLongToolCallStreamsInLinearMemory: a long tool call (a file written
// through a tool, 2,000 argument deltas) streams to each dialect in memory
// linear in its size; the messages writer re-read the whole arguments at
// every delta. Measured in bytes allocated, never in time.
func TestLongToolCallStreamsInLinearMemory(t *testing.T) {
	const deltas, piece = 2000, `"line of a long file\n",`
	size := deltas * len(piece)
	for _, dialect := range []string{dialectChat, dialectMessages, dialectResponses} {
		t.Run(dialect, func(t *testing.T) {
			s := newCallerStream(dialect, chatRequest{}, io.Discard, nil, "m")
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			s.frames(s, stepBegin, nil, "")
			feed(s, streamEvent{Kind: eventToolCallStart, Index: 0, ToolCall: toolCall{ID: "call_1", Name: "write"}})
			feed(s, streamEvent{Kind: eventToolCallArgs, Index: 0, Text: `{"lines":[`})
			for range deltas {
				feed(s, streamEvent{Kind: eventToolCallArgs, Index: 0, Text: piece})
			}
			feed(s, streamEvent{Kind: eventToolCallArgs, Index: 0, Text: `""]}`})
			if err := s.finish(nil); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			if got := after.TotalAlloc - before.TotalAlloc; got > uint64(100*size) {
				t.Errorf("a %d-byte tool call in %d deltas allocated %d bytes (%d× its size); want linear", size, deltas, got, got/uint64(size))
			}
		})
	}
}

// chunkReader reads at most n bytes a call, as a TLS record or an HTTP/2
// frame arrives.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	return c.r.Read(p[:min(len(p), c.n)])
}

// BenchmarkSSEReaderLongLine reads one event whose data line is 1 or 8 MiB
// (a base64 image, a long response.completed), arriving 16 KiB a read; its
// time per byte stays flat when the reader resumes its search for the line
// end where the previous read left it.
func BenchmarkSSEReaderLongLine(b *testing.B) {
	for _, size := range []int{1 << 20, 8 << 20} {
		for _, ends := range []string{"\n", "\r\n"} {
			body := "data: \"" + strings.Repeat("a", size) + "\"\n\n"
			b.Run(fmt.Sprintf("%dMiB/ends=%q", size>>20, ends), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					if _, _, _, err := newSSEReader(&chunkReader{strings.NewReader(body), 16 << 10}, ends).next(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestChatStreamContentPartsAreTranslated: a compatible provider that sends
// a chunk's content as text parts, as decodeChat reads a buffered answer's,
// reaches a caller of another format with that text; it was dropped
// silently, the stream still "complete" (SPEC §7.5, §7.6).
func TestChatStreamContentPartsAreTranslated(t *testing.T) {
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":[{"type":"text","text":"Hel"},{"type":"reference","reference_ids":[1]}]}}]}`+"\n\n"+
			`data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_MISTRAL_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"mistral":"k"}`, "-local-credentials-stdin")
	for _, dialect := range []string{dialectMessages, dialectResponses} {
		t.Run(dialect, func(t *testing.T) {
			s, _, b := d.call("POST", dialectPaths[dialect], d.token, chatBody(dialect, "mistral/magistral-test", true, ""))
			if a := decodeCallerAnswer(t, dialect, true, b); s != 200 || a.Text != "Hello" {
				t.Errorf("%d: text %q, want Hello: %s", s, a.Text, b)
			}
		})
	}
}

// TestEventNamedByItsEventLine: an event whose data carries no "type" is
// the type its event: line names, translated as in passthrough (SPEC
// §7.5): a message_stop so named ends the stream, an error so named is the
// provider's in-band error (provider_incomplete, its code quoted, so a
// limit blocks the subscription), not a malformed event.
func TestEventNamedByItsEventLine(t *testing.T) {
	msgFrames := strings.SplitAfter(lfFixture(t, "anthropic-messages.sse"), "\n\n")
	rsFrames := strings.SplitAfter(lfFixture(t, "openai-responses.sse"), "\n\n")
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		if r.URL.Path == "/v1/messages" {
			io.WriteString(w, strings.Join(msgFrames[:len(msgFrames)-2], "")+"event: message_stop\ndata: {}\n\n")
			return
		}
		io.WriteString(w, rsFrames[0]+"event: error\ndata: {\"code\":\"usage_limit_reached\",\"message\":\"The usage limit has been reached\"}\n\n")
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL
	env["BRAMA_PROVIDER_OPENAI_RESPONSES_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"anthropic":"k1","openai-responses":"k2"}`, "-local-credentials-stdin")
	for _, dialect := range []string{dialectMessages, dialectChat, dialectResponses} {
		t.Run(dialect, func(t *testing.T) {
			resp := d.openStream(dialectPaths[dialect], d.token, chatBody(dialect, "anthropic/claude-test", true, ""))
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || strings.Contains(string(got), "provider_failure") {
				t.Errorf("a message_stop named by its event line: read error %v: %s", err, got)
			}
			resp = d.openStream(dialectPaths[dialect], d.token, chatBody(dialect, "openai-responses/gpt-resp", true, ""))
			got, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil || !strings.Contains(string(got), "provider_incomplete") || !strings.Contains(string(got), "usage_limit_reached") {
				t.Errorf("an error named by its event line: read error %v: %s", err, got)
			}
		})
	}
}
