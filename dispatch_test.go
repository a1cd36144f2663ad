package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Planted direct keys: tests grep logs, bodies and state files for them.
const (
	plantedOpenAIKey    = "sk-planted-openai-key-0123456789"
	plantedAnthropicKey = "sk-ant-planted-anthropic-key-0123456789"
	plantedResponsesKey = "sk-planted-responses-key-0123456789"
)

// fakeProvider is a real HTTP server standing in for one provider. It
// counts calls and keeps the last request body.
type fakeProvider struct {
	*httptest.Server
	calls    atomic.Int64
	mu       sync.Mutex // guards lastBody
	lastBody []byte
}

func newFakeProvider(t testing.TB, h func(w http.ResponseWriter, r *http.Request, body []byte)) *fakeProvider {
	t.Helper()
	f := &fakeProvider{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.lastBody = body
		f.mu.Unlock()
		h(w, r, body)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeProvider) body() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastBody
}

// protocolFixture is what a fake provider answers for one protocol, and the
// neutral answer both forms must translate to.
type protocolFixture struct {
	protocol string
	provider string // provider id used to reach it
	model    string // canonical route the caller names
	path     string // upstream path the fake expects
	key      string
	buffered string // non-stream answer body
	stream   string // testdata/providers file
	want     chatAnswer
}

var protocolFixtures = []protocolFixture{
	{
		protocol: protoOpenAIChat, provider: "openai", model: "openai/gpt-test", path: "/chat/completions", key: plantedOpenAIKey,
		buffered: `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"Hello","tool_calls":[{"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},{"id":"call_def","type":"function","function":{"name":"get_time","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":31,"completion_tokens":17,"total_tokens":48}}`,
		stream:   "openai-chat.sse",
		want: chatAnswer{Text: "Hello", ToolCalls: []toolCall{{ID: "call_abc", Name: "get_weather", Arguments: `{"city":"Paris"}`}, {ID: "call_def", Name: "get_time", Arguments: `{}`}},
			Finish: finishToolCalls, Usage: usage{InputTokens: 31, OutputTokens: 17, Reported: true}},
	},
	{
		protocol: protoAnthropic, provider: "anthropic", model: "anthropic/claude-test", path: "/v1/messages", key: plantedAnthropicKey,
		buffered: `{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"Hello"},{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"city":"Paris"}},{"type":"tool_use","id":"toolu_02","name":"get_time","input":{}}],"stop_reason":"tool_use","usage":{"input_tokens":40,"output_tokens":42}}`,
		stream:   "anthropic-messages.sse",
		want: chatAnswer{Text: "Hello", ToolCalls: []toolCall{{ID: "toolu_01", Name: "get_weather", Arguments: `{"city":"Paris"}`}, {ID: "toolu_02", Name: "get_time", Arguments: `{}`}},
			Finish: finishToolCalls, Usage: usage{InputTokens: 40, OutputTokens: 42, Reported: true}},
	},
	{
		protocol: protoOpenAIResponses, provider: "openai-responses", model: "openai-responses/gpt-resp", path: "/responses", key: plantedResponsesKey,
		buffered: `{"id":"resp_1","object":"response","status":"completed","model":"gpt-resp","output":[{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Hello","annotations":[]}]},{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}","status":"completed"}],"usage":{"input_tokens":20,"output_tokens":9,"total_tokens":29}}`,
		stream:   "openai-responses.sse",
		want: chatAnswer{Text: "Hello", ToolCalls: []toolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}},
			Finish: finishToolCalls, Usage: usage{InputTokens: 20, OutputTokens: 9, Reported: true}},
	},
}

// fixtureProvider serves fx buffered or streamed, as the upstream request asks.
func fixtureProvider(t testing.TB, fx protocolFixture) *fakeProvider {
	stream := fixture(t, fx.stream)
	return newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path != fx.path {
			http.Error(w, `{"error":{"type":"not_found","message":"wrong path"}}`, 404)
			return
		}
		var req struct {
			Stream bool `json:"stream"`
		}
		json.Unmarshal(body, &req)
		if req.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, stream)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, fx.buffered)
	})
}

// chatBody is a minimal request with one tool in the caller's dialect.
func chatBody(dialect, model string, stream bool, extra string) string {
	switch dialect {
	case dialectChat:
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"max_tokens":100,"stream":%v%s}`, model, stream, extra)
	case dialectMessages:
		return fmt.Sprintf(`{"model":%q,"max_tokens":100,"messages":[{"role":"user","content":"weather in Paris?"}],"tools":[{"name":"get_weather","input_schema":{"type":"object"}}],"stream":%v%s}`, model, stream, extra)
	default:
		return fmt.Sprintf(`{"model":%q,"input":"weather in Paris?","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"max_output_tokens":100,"stream":%v%s}`, model, stream, extra)
	}
}

var dialectPaths = map[string]string{
	dialectChat:      "/v1/chat/completions",
	dialectMessages:  "/v1/messages",
	dialectResponses: "/v1/responses",
}

// decodeCallerAnswer reads a caller-side answer, buffered or streamed, back
// into the neutral shape using the dialect's own framing.
func decodeCallerAnswer(t *testing.T, dialect string, stream bool, body []byte) chatAnswer {
	t.Helper()
	if !stream {
		switch dialect {
		case dialectChat:
			return decodeChatAnswer(t, body)
		case dialectMessages:
			return decodeMessagesAnswer(t, body)
		}
		return decodeResponsesAnswer(t, body)
	}
	frames := splitTestSSE(t, string(body))
	switch dialect {
	case dialectChat:
		return assembleChatStream(t, frames)
	case dialectMessages:
		return assembleMessagesStream(t, frames)
	}
	return assembleResponsesStream(t, frames)
}

// compactArgs makes tool arguments comparable whatever their spacing.
func compactArgs(a chatAnswer) chatAnswer {
	for i, c := range a.ToolCalls {
		var buf bytes.Buffer
		if json.Compact(&buf, []byte(c.Arguments)) == nil {
			a.ToolCalls[i].Arguments = buf.String()
		}
	}
	return a
}

// providerEnv points every fixture provider at its fake and returns the
// stdin for -local-credentials-stdin.
func providerEnv(env map[string]string, fakes map[string]*fakeProvider) string {
	creds := map[string]string{}
	for _, fx := range protocolFixtures {
		if f := fakes[fx.provider]; f != nil {
			env["BRAMA_PROVIDER_"+strings.ToUpper(strings.ReplaceAll(fx.provider, "-", "_"))+"_BASE_URL"] = f.URL
			creds[fx.provider] = fx.key
		}
	}
	b, _ := json.Marshal(creds)
	return string(b)
}

func TestDialectProtocolMatrix(t *testing.T) {
	env := stateEnv(t)
	fakes := map[string]*fakeProvider{}
	for _, fx := range protocolFixtures {
		fakes[fx.provider] = fixtureProvider(t, fx)
	}
	d := startDaemon(t, env, providerEnv(env, fakes), "-local-credentials-stdin")
	for _, dialect := range []string{dialectChat, dialectMessages, dialectResponses} {
		for _, fx := range protocolFixtures {
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/stream=%v", dialect, fx.protocol, stream), func(t *testing.T) {
					before := fakes[fx.provider].calls.Load()
					status, hdr, body := d.call("POST", dialectPaths[dialect], d.token, chatBody(dialect, fx.model, stream, ""))
					if status != 200 {
						t.Fatalf("status %d: %s", status, body)
					}
					if got := fakes[fx.provider].calls.Load() - before; got != 1 {
						t.Errorf("provider saw %d calls, want 1", got)
					}
					if hdr.Get("Brama-Attempts") != "1" {
						t.Errorf("Brama-Attempts = %q, want 1", hdr.Get("Brama-Attempts"))
					}
					if hdr.Get("Brama-Route") != fx.model {
						t.Errorf("Brama-Route = %q, want %q", hdr.Get("Brama-Route"), fx.model)
					}
					if formatOf(dialect).protocol == fx.protocol { // passthrough: the provider's own answer
						want := fx.buffered
						if stream {
							want = relayedChatStream(fixture(t, fx.stream)) // Brama asked for usage itself
						}
						if string(body) != want {
							t.Errorf("passthrough answer differs from the provider's:\n got %q\nwant %q", body, want)
						}
						return
					}
					got := compactArgs(decodeCallerAnswer(t, dialect, stream, body))
					want := compactArgs(fx.want)
					want.Model = fx.model
					if dialect == dialectMessages && !stream {
						want.Usage.Reported = got.Usage.Reported // messages always reports usage
					}
					if dialect == dialectChat && stream {
						want.Usage = usage{} // the caller did not ask for the usage chunk
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("answer (-want +got):\n%s", diff)
					}
					if !strings.Contains(string(fakes[fx.provider].body()), "get_weather") {
						t.Errorf("upstream body lost the tool definition: %s", fakes[fx.provider].body())
					}
				})
			}
		}
	}
	logs := d.stderr.String()
	if !strings.Contains(logs, `"msg":"request"`) || !strings.Contains(logs, `"routing_mode":"direct"`) {
		t.Errorf("no per-request log line with routing_mode")
	}
	for _, fx := range protocolFixtures {
		assertNoSecret(t, fx.key, logs, env["BRAMA_STATE_DIR"])
	}
	assertOwnerOnly(t, env["BRAMA_STATE_DIR"])
}

// TestTranslatedChatStreamUsageOnlyWhenAsked: a chat caller's translated
// stream ends with the usage chunk (choices: []) only when the caller asked
// (stream_options.include_usage), as OpenAI's does; Brama counts the usage
// either way (SPEC §17).
func TestTranslatedChatStreamUsageOnlyWhenAsked(t *testing.T) {
	env := stateEnv(t)
	fakes := map[string]*fakeProvider{}
	for _, fx := range protocolFixtures {
		fakes[fx.provider] = fixtureProvider(t, fx)
	}
	d := startDaemon(t, env, providerEnv(env, fakes), "-local-credentials-stdin")
	for _, fx := range protocolFixtures[1:] { // messages and responses
		for _, tc := range []struct {
			extra      string
			usageChunk int
		}{
			{"", 0},
			{`,"stream_options":{"include_usage":false}`, 0},
			{`,"stream_options":{"include_usage":true}`, 1},
		} {
			status, _, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, fx.model, true, tc.extra))
			got := strings.Count(string(body), `"choices":[]`)
			if status != 200 || got != tc.usageChunk || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
				t.Errorf("%s%s: %d with %d usage chunks, want 200 with %d ending [DONE]:\n%s", fx.protocol, tc.extra, status, got, tc.usageChunk, body)
			}
			if tc.usageChunk == 1 && !strings.Contains(string(body), fmt.Sprintf(`"prompt_tokens":%d`, fx.want.Usage.InputTokens)) {
				t.Errorf("%s%s: the usage chunk lacks the provider's usage:\n%s", fx.protocol, tc.extra, body)
			}
		}
	}
	if want := fmt.Sprintf(`"output_tokens":%d`, protocolFixtures[1].want.Usage.OutputTokens); strings.Count(d.stderr.String(), want) < 3 {
		t.Errorf("the log lines do not all count the usage (%s):\n%s", want, d.stderr.String())
	}
}

// relayedChatStream is what a caller gets of a chat stream: no usage chunk
// (choices: []) when Brama asked for usage itself (SPEC §7.6), and no
// comment, which the SSE reader keeps none of (SPEC §17).
func relayedChatStream(stream string) string {
	var keep []string
	for _, block := range strings.SplitAfter(stream, "\n\n") {
		if !strings.Contains(block, `"choices":[]`) && !strings.HasPrefix(block, ":") {
			keep = append(keep, block)
		}
	}
	return strings.Join(keep, "")
}

func TestAliasRefusalsAndOneAttempt(t *testing.T) {
	env := stateEnv(t)
	failing := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, `{"error":{"type":"server_error","message":"upstream broke for key `+plantedOpenAIKey+`"}}`, 500)
	})
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = failing.URL
	d := startDaemon(t, env, `{"openai":"`+plantedOpenAIKey+`"}`, "-local-credentials-stdin")
	for _, put := range []string{`{"alias":"broken","route":"openai/gpt-x"}`, `{"alias":"nokey","route":"anthropic/claude-x"}`} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
			t.Fatalf("PUT %s: %d %s", put, s, b)
		}
	}
	tests := []struct {
		name      string
		model     string
		status    int
		code      string
		details   *aliasDetails
		attempts  any // nil: no attempts key
		wantCalls int64
	}{
		{name: "unknown alias", model: "ghost", status: 404, code: "alias_unknown", details: &aliasDetails{Alias: "ghost", State: "no_route"}},
		{name: "no credential", model: "nokey", status: 503, code: "alias_unserviceable", details: &aliasDetails{Alias: "nokey", State: "capability_absent", Route: ptr("anthropic/claude-x")}},
		{name: "provider 500", model: "broken", status: 503, code: "dependency_unavailable", attempts: float64(1), wantCalls: 1},
		{name: "direct, no credential", model: "mistral/x", status: 503, code: "credential_unauthorized", attempts: float64(0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := failing.calls.Load()
			status, hdr, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, tc.model, false, ""))
			e := envelopeOf(t, body)
			if status != tc.status || e["code"] != tc.code {
				t.Fatalf("%d %s, want %d %s", status, body, tc.status, tc.code)
			}
			if diff := cmp.Diff(tc.attempts, e["attempts"]); diff != "" {
				t.Errorf("attempts (-want +got):\n%s", diff)
			}
			if tc.attempts != nil && hdr.Get("Brama-Attempts") != fmt.Sprint(tc.attempts) {
				t.Errorf("Brama-Attempts = %q", hdr.Get("Brama-Attempts"))
			}
			id := hdr.Get("X-Request-Id") // the log line counts as the envelope does, 0 too (SPEC §13)
			d.stderr.waitFor(t, `"msg":"request","request_id":"`+id)
			line := requestLine(t, d.stderr.String(), "request_id", id)
			if diff := cmp.Diff(tc.attempts, line["attempts"]); diff != "" {
				t.Errorf("log line attempts (-want +got):\n%s", diff)
			}
			// SPEC §13's members and no other (no empty key where attempts is left out), attempts only once dispatched.
			wantKeys := strings.Fields("time level msg request_id method path status client_id agent_id routing_mode " +
				"requested_model route outcome retryable latency_ms input_tokens output_tokens dropped streamed")
			if tc.attempts != nil {
				wantKeys = append(wantKeys, "attempts")
			}
			if slices.Sort(wantKeys); !slices.Equal(wantKeys, slices.Sorted(maps.Keys(line))) {
				t.Errorf("log line members: %q, want %q", slices.Sorted(maps.Keys(line)), wantKeys)
			}
			if got := failing.calls.Load() - before; got != tc.wantCalls {
				t.Errorf("provider saw %d calls, want %d", got, tc.wantCalls)
			}
			if tc.details != nil {
				var env struct {
					Error struct {
						Details *aliasDetails `json:"details"`
					} `json:"error"`
				}
				json.Unmarshal(body, &env)
				if diff := cmp.Diff(tc.details, env.Error.Details); diff != "" {
					t.Errorf("details (-want +got):\n%s", diff)
				}
			}
			if strings.Contains(string(body), plantedOpenAIKey) {
				t.Errorf("error body quotes the planted key: %s", body)
			}
		})
	}
	assertNoSecret(t, plantedOpenAIKey, d.stderr.String(), env["BRAMA_STATE_DIR"])
}

func ptr[T any](v T) *T { return &v }

func TestInvalidRegistryThenRepaired(t *testing.T) {
	env := stateEnv(t)
	fx := protocolFixtures[0]
	fake := fixtureProvider(t, fx)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"`+fx.key+`"}`, "-local-credentials-stdin")
	path := filepath.Join(env["BRAMA_STATE_DIR"], "routes.json")
	good := `{"schema_version":1,"deployments":[],"routes":{"chat":"openai/gpt-test","other":"openai/gpt-test"}}`
	bad := `{"schema_version":1,"deployments":[],"routes":{"chat":"openai/gpt-test","other":"openai/gpt-test"},"fallbacks":{}}`
	for i, step := range []struct {
		content string
		status  int
	}{{bad, 503}, {good, 200}, {bad + " ", 503}, {good + "  ", 200}} {
		os.WriteFile(path, []byte(step.content), 0o600)
		for _, alias := range []string{"chat", "other"} {
			status, _, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, alias, false, ""))
			if status != step.status {
				t.Fatalf("step %d alias %s: %d %s, want %d", i, alias, status, body, step.status)
			}
			if status == 503 {
				if e := envelopeOf(t, body); e["code"] != "alias_unserviceable" || !strings.Contains(string(body), `"state":"routes_file_invalid"`) {
					t.Errorf("step %d: %s, want alias_unserviceable with state routes_file_invalid", i, body)
				}
			}
		}
		for _, read := range []struct { // the registry's readers refuse an invalid file, never answer an empty one
			path, code string
			status     int
		}{{"/v1/aliases", "dependency_unavailable", 503}, {"/v1/admin/routes", "state_conflict", 409}} {
			status, _, body := d.call("GET", read.path, d.token, "")
			if step.status == 503 && (status != read.status || envelopeOf(t, body)["code"] != read.code) || step.status == 200 && status != 200 {
				t.Errorf("step %d GET %s: %d %s, want %d %s while the file is invalid, else 200", i, read.path, status, body, read.status, read.code)
			}
		}
	}
}

// TestNoCutoff proves Brama adds no elapsed-time limit: a provider whose
// first byte comes after 5 s and one that pauses 5 s between stream events
// both complete. The two run in parallel to keep the suite fast.
func TestNoCutoff(t *testing.T) {
	const pause = 5 * time.Second
	fx := protocolFixtures[0]
	env := stateEnv(t)
	slowFirst := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		time.Sleep(pause) // the behaviour under test: a slow provider
		io.WriteString(w, fx.buffered)
	})
	slowBetween := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		frames := strings.SplitAfter(fixture(t, fx.stream), "\n\n")
		for i, f := range frames {
			io.WriteString(w, f)
			w.(http.Flusher).Flush()
			if i == 2 {
				time.Sleep(pause)
			}
		}
	})
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = slowFirst.URL
	env["BRAMA_PROVIDER_GROQ_BASE_URL"] = slowBetween.URL
	d := startDaemon(t, env, `{"openai":"k1","groq":"k2"}`, "-local-credentials-stdin")
	t.Run("group", func(t *testing.T) {
		t.Run("slow first byte", func(t *testing.T) {
			t.Parallel()
			status, _, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", false, ""))
			if status != 200 || decodeChatAnswer(t, body).Text != "Hello" {
				t.Errorf("%d %s", status, body)
			}
		})
		t.Run("pause between events", func(t *testing.T) {
			t.Parallel()
			status, _, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "groq/llama-test", true, ""))
			if status != 200 || !strings.HasSuffix(strings.TrimSpace(string(body)), "data: [DONE]") {
				t.Errorf("%d %s", status, body)
			}
		})
	})
}

// cutAfterFrames serves the first n SSE frames of a fixture, then cuts the
// connection without finishing the stream.
func cutAfterFrames(t *testing.T, file string, n int) *fakeProvider {
	frames := strings.SplitAfter(fixture(t, file), "\n\n")
	return newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for _, f := range frames[:n] {
			io.WriteString(w, f)
		}
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
}

func TestStreamCutAfterCommit(t *testing.T) {
	env := stateEnv(t)
	fake := cutAfterFrames(t, "openai-chat.sse", 2)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	tests := []struct {
		dialect    string
		wantFailed string // the in-band failure marker
		terminal   []string
	}{
		{dialectChat, `"code":"provider_incomplete"`, []string{"[DONE]"}},
		{dialectMessages, "event: error", []string{"message_stop"}},
		{dialectResponses, "response.failed", []string{"response.completed"}},
	}
	for _, tc := range tests {
		t.Run(tc.dialect, func(t *testing.T) {
			before := fake.calls.Load()
			resp := d.openStream(dialectPaths[tc.dialect], d.token, chatBody(tc.dialect, "openai/gpt-test", true, ""))
			defer resp.Body.Close()
			body, readErr := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d before commit? %s", resp.StatusCode, body)
			}
			if readErr == nil {
				t.Errorf("the caller's stream ended cleanly; it must be aborted")
			}
			s := string(body)
			if !strings.Contains(s, "Hel") {
				t.Errorf("the events before the cut did not reach the caller: %q", s)
			}
			for _, after := range []string{`"content":"lo"`, `"text":"lo"`, `"delta":"lo"`} {
				if strings.Contains(s, after) {
					t.Errorf("an event the provider never sent reached the caller: %q", s)
				}
			}
			if !strings.Contains(s, tc.wantFailed) {
				t.Errorf("no in-band failure %q in %q", tc.wantFailed, s)
			}
			for _, term := range tc.terminal {
				if strings.Contains(s, term) {
					t.Errorf("terminal success %q written after a failure: %q", term, s)
				}
			}
			if got := fake.calls.Load() - before; got != 1 {
				t.Errorf("provider saw %d calls, want 1 (nothing is retried after commit)", got)
			}
		})
	}
}

func TestClientHangUpCancelsProviderCall(t *testing.T) {
	env := stateEnv(t)
	cancelled := make(chan struct{})
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(cancelled)
	})
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	resp := d.openStream("/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", true, ""))
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q", line)
	}
	resp.Body.Close() // hang up mid-stream
	select {
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Fatal("the provider request was not cancelled after the caller hung up")
	}
}

func TestAnthropicMaxTokensRule(t *testing.T) {
	env := stateEnv(t)
	fx := protocolFixtures[1]
	fake := fixtureProvider(t, fx)
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL
	catalogue := filepath.Join(t.TempDir(), "models.json")
	os.WriteFile(catalogue, []byte(`{"anthropic":{"id":"anthropic","models":{"claude-known":{"id":"claude-known","limit":{"context":200000,"output":4321}}}}}`), 0o600)
	env["BRAMA_MODEL_CATALOG_PATH"] = catalogue
	d := startDaemon(t, env, `{"anthropic":"`+fx.key+`"}`, "-local-credentials-stdin")
	noMax := func(model string) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model)
	}

	status, _, body := d.call("POST", "/v1/chat/completions", d.token, noMax("anthropic/claude-unknown"))
	e := envelopeOf(t, body)
	if status != 400 || e["code"] != "invalid_request" || !strings.Contains(fmt.Sprint(e["message"]), "max_tokens is required") {
		t.Errorf("no max_tokens, unknown limit: %d %s", status, body)
	}
	if _, ok := e["attempts"]; ok || fake.calls.Load() != 0 {
		t.Errorf("refused before dispatch, yet attempts=%v and %d calls", e["attempts"], fake.calls.Load())
	}

	status, _, body = d.call("POST", "/v1/chat/completions", d.token, noMax("anthropic/claude-known"))
	if status != 200 {
		t.Fatalf("with a catalogue limit: %d %s", status, body)
	}
	var up struct {
		MaxTokens int `json:"max_tokens"`
	}
	json.Unmarshal(fake.body(), &up)
	if up.MaxTokens != 4321 {
		t.Errorf("upstream max_tokens = %d, want the catalogue's 4321", up.MaxTokens)
	}
}

// TestBudgets pins the one table of attempt limits to SPEC §7.1–§7.3,
// §11.3 and §15: one call on a direct route (embeddings take one), the probe
// and count_tokens; at most two on a subscription route and on each selector
// candidate; only those two rotate.
func TestBudgets(t *testing.T) {
	want := budgets // every row set below
	want.direct = budget{calls: 1, spends: true}
	want.subscription = budget{calls: 2, rotate: true, spends: true}
	want.selector = budget{calls: 2, rotate: true, spends: true, selects: true}
	want.oneCall = budget{calls: 1} // the probe and count_tokens
	if diff := cmp.Diff(want, budgets, cmp.AllowUnexported(want, budget{})); diff != "" {
		t.Errorf("budgets (-SPEC +table):\n%s", diff)
	}
}
