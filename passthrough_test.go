package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordedCall is one request a recording provider received, as it arrived.
type recordedCall struct {
	path, query string
	header      http.Header
	body        []byte
}

// recordingProvider is a fake provider that keeps every request raw and
// answers with buffered or stream bytes, as the body's stream member asks
// (or always the stream when alwaysStream). refuse, when set, may answer
// instead: it returns a status and body, or 0 to answer normally.
type recordingProvider struct {
	*httptest.Server
	mu           sync.Mutex // guards calls
	calls        []recordedCall
	buffered     string
	stream       string
	alwaysStream bool
	refuse       func(c recordedCall) (int, string)
}

func newRecordingProvider(t *testing.T, buffered, stream string) *recordingProvider {
	t.Helper()
	p := &recordingProvider{buffered: buffered, stream: stream}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c := recordedCall{path: r.URL.Path, query: r.URL.RawQuery, header: r.Header.Clone(), body: body}
		p.mu.Lock()
		p.calls = append(p.calls, c)
		p.mu.Unlock()
		if p.refuse != nil {
			if status, b := p.refuse(c); status != 0 {
				http.Error(w, b, status)
				return
			}
		}
		var req struct {
			Stream bool `json:"stream"`
		}
		json.Unmarshal(body, &req)
		if req.Stream || p.alwaysStream {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, p.stream)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, p.buffered)
	}))
	t.Cleanup(p.Close)
	return p
}

// last is the last request received; the test fails when there was none.
func (p *recordingProvider) last(t *testing.T) recordedCall {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.calls) == 0 {
		t.Fatal("the provider received no call")
	}
	return p.calls[len(p.calls)-1]
}

func (p *recordingProvider) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls)
}

// Caller bodies in each format carrying members the neutral request never
// held, spaced as a person would write them: passthrough must keep every
// byte but the members Brama acts on.
const (
	passthroughChatBody = `{"model": "openai/gpt-test",
  "messages": [{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]},
    {"role":"assistant","content":"ok"},{"role":"system","content":"mid-conversation rule"},{"role":"user","content":"again"}],
  "response_format": {"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}},
  "store": false, "prompt_cache_key": "k1", "reasoning_effort": "high", "logit_bias": {"50256": -100},
  "future_member": {"nested": [1, 2.50, "\u00e9"]},
  "max_tokens": 100, "stream": %v}`
	passthroughMessagesBody = `{"model":"anthropic/claude-test","max_tokens":100,
  "system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],
  "thinking":{"type":"enabled","budget_tokens":2048},
  "messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral","ttl":"1h"}}]},
    {"role":"system","content":"mid-conversation rule"},{"role":"user","content":"go"}],
  "output_format":{"type":"json_schema","schema":{"type":"object"}},
  "metadata":{"user_id":"u"}, "future_member": [true], "stream": %v}`
	passthroughResponsesBody = `{"model":"openai-responses/gpt-resp",
  "input":[{"role":"developer","content":"rule"},{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}],
  "text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"},"strict":true}},
  "store":false,"include":["reasoning.encrypted_content"],"prompt_cache_key":"k2","reasoning":{"effort":"low","summary":"auto"},
  "tools":[{"type":"web_search"},{"type":"custom","name":"apply_patch"}],"future_member":true,"max_output_tokens":100,"stream":%v}`
)

// The fake provider receives the caller's body byte for byte but the
// model (and, for a chat stream, the usage option Brama adds), and the
// caller receives the provider's answer bytes and events unchanged (SPEC
// §7.6). Format headers pass; the caller's credentials and cookies never.
func TestPassthroughKeepsTheCallersBytes(t *testing.T) {
	tests := []struct {
		dialect, body, route, model string
		fx                          protocolFixture
		header                      []string // caller headers that must reach the provider
		sendQuery, query            string   // the caller's ?query, and what the provider must see of it (Anthropic's only)
	}{
		{dialectChat, passthroughChatBody, "openai/gpt-test", "gpt-test", protocolFixtures[0], []string{"OpenAI-Beta", "assistants=v2"}, "api-version=2024-10-21", ""},
		{dialectMessages, passthroughMessagesBody, "anthropic/claude-test", "claude-test", protocolFixtures[1],
			[]string{"anthropic-beta", "interleaved-thinking-2025-05-14,structured-outputs-2025-11-13", "anthropic-version", "2023-06-01"}, "beta=true", "beta=true"},
		{dialectResponses, passthroughResponsesBody, "openai-responses/gpt-resp", "gpt-resp", protocolFixtures[2], []string{"OpenAI-Beta", "responses=v1"}, "api-version=1", ""},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tt.dialect, stream), func(t *testing.T) {
				env := stateEnv(t)
				prov := newRecordingProvider(t, tt.fx.buffered, fixture(t, tt.fx.stream))
				env["BRAMA_PROVIDER_"+strings.ToUpper(strings.ReplaceAll(tt.fx.provider, "-", "_"))+"_BASE_URL"] = prov.URL
				d := startDaemon(t, env, fmt.Sprintf(`{%q:%q}`, tt.fx.provider, tt.fx.key), "-local-credentials-stdin")

				sent := fmt.Sprintf(tt.body, stream)
				hdr := append([]string{"Cookie", "session=caller-cookie-secret", "Connection", "keep-alive", "X-Custom", "caller"}, tt.header...)
				path := dialectPaths[tt.dialect]
				path += "?" + tt.sendQuery
				status, h, got := d.call("POST", path, d.token, sent, hdr...)
				if status != 200 {
					t.Fatalf("status %d: %s", status, got)
				}
				want := tt.fx.buffered
				if stream {
					want = fixture(t, tt.fx.stream)
					if tt.dialect == dialectChat {
						want = relayedChatStream(want)
					}
				}
				if string(got) != want {
					t.Errorf("the caller got other bytes than the provider's:\n got %q\nwant %q", got, want)
				}
				if h.Get("Brama-Route") != tt.route || h.Get("Brama-Attempts") != "1" {
					t.Errorf("Brama-Route %q, Brama-Attempts %q; want %q, 1", h.Get("Brama-Route"), h.Get("Brama-Attempts"), tt.route)
				}

				c := prov.last(t)
				wantBody := strings.Replace(sent, fmt.Sprintf(`%q`, tt.route), fmt.Sprintf(`%q`, tt.model), 1)
				if stream && tt.dialect == dialectChat {
					wantBody = strings.TrimSuffix(wantBody, "}") + `,"stream_options":{"include_usage":true}}`
				}
				if string(c.body) != wantBody {
					t.Errorf("the provider got other bytes than the caller's:\n got %s\nwant %s", c.body, wantBody)
				}
				if c.query != tt.query {
					t.Errorf("provider query %q, want %q", c.query, tt.query)
				}
				for i := 0; i+1 < len(tt.header); i += 2 {
					if got := c.header.Get(tt.header[i]); got != tt.header[i+1] {
						t.Errorf("provider header %s = %q, want the caller's %q", tt.header[i], got, tt.header[i+1])
					}
				}
				if c.header.Get("Cookie") != "" || c.header.Get("X-Custom") != "" || strings.Contains(fmt.Sprint(c.header), d.token) {
					t.Errorf("a caller header that is not a format option reached the provider: %v", c.header)
				}
				if tt.dialect == dialectMessages && c.header.Get("x-api-key") != tt.fx.key ||
					tt.dialect != dialectMessages && c.header.Get("Authorization") != "Bearer "+tt.fx.key {
					t.Errorf("the provider did not get Brama's credential: %v", c.header)
				}
				assertNoSecret(t, "caller-cookie-secret", d.stderr.String(), env["BRAMA_STATE_DIR"])
			})
		}
	}
}

// A head Brama can act on is enough to pass through; a call across formats
// parses the whole body first, and its refusal is a 400 before any call.
func TestTranslationParseRefusedBeforeAnyCall(t *testing.T) {
	env := stateEnv(t)
	chat := newRecordingProvider(t, protocolFixtures[0].buffered, "")
	anth := newRecordingProvider(t, protocolFixtures[1].buffered, "")
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = chat.URL
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = anth.URL
	d := startDaemon(t, env, fmt.Sprintf(`{"openai":%q,"anthropic":%q}`, plantedOpenAIKey, plantedAnthropicKey), "-local-credentials-stdin")
	body := `{"model":%q,"max_tokens":10,"messages":"not a list the translation can read"}`

	status, _, b := d.call("POST", "/v1/messages", d.token, fmt.Sprintf(body, "openai/gpt-test"))
	if status != 400 || envelopeOf(t, b)["code"] != "invalid_request" || chat.count() != 0 {
		t.Errorf("across formats: %d %s with %d provider calls; want 400 invalid_request and none", status, b, chat.count())
	}
	if _, has := envelopeOf(t, b)["attempts"]; has {
		t.Errorf("a refusal before dispatch carries attempts: %s", b)
	}
	status, _, b = d.call("POST", "/v1/messages", d.token, fmt.Sprintf(body, "anthropic/claude-test"))
	if status != 200 || anth.count() != 1 {
		t.Errorf("same format: %d %s with %d provider calls; want the provider's answer", status, b, anth.count())
	}
	for _, bad := range []string{`[]`, `{"model":7}`, `{"model":"anthropic/claude-test","stream":"yes"}`, `{"model":"anthropic/claude-test","max_tokens":0}`, `{"model":"anthropic/claude-test"`} {
		if status, _, b := d.call("POST", "/v1/messages", d.token, bad); status != 400 || envelopeOf(t, b)["code"] != "invalid_request" {
			t.Errorf("%s: %d %s, want 400 invalid_request", bad, status, b)
		}
	}
	if anth.count() != 1 {
		t.Errorf("a refused head reached the provider")
	}
}

// SPEC §6.4 through passthrough: the caller's limit is kept as sent; none
// given, the catalogue's limit is added under the provider's own name; an
// anthropic route with no known limit is refused before any call.
func TestPassthroughOutputLimit(t *testing.T) {
	env := stateEnv(t)
	env["BRAMA_MODEL_CATALOG_PATH"] = "testdata/catalog/api.json"
	chat := newRecordingProvider(t, protocolFixtures[0].buffered, "")
	anth := newRecordingProvider(t, protocolFixtures[1].buffered, "")
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = chat.URL
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = anth.URL
	d := startDaemon(t, env, fmt.Sprintf(`{"openai":%q,"anthropic":%q}`, plantedOpenAIKey, plantedAnthropicKey), "-local-credentials-stdin")
	tests := []struct {
		path, body string
		prov       *recordingProvider
		want       string // the provider's body; "" for a refusal
	}{
		{"/v1/messages", `{"model":"anthropic/claude-sonnet-4-5","messages":[]}`, anth, `{"model":"claude-sonnet-4-5","messages":[],"max_tokens":64000}`},
		{"/v1/messages", `{"model":"anthropic/claude-sonnet-4-5","max_tokens":null,"messages":[]}`, anth, `{"model":"claude-sonnet-4-5","max_tokens":64000,"messages":[]}`},
		{"/v1/messages", `{"max_tokens":5,"model":"anthropic/claude-sonnet-4-5"}`, anth, `{"max_tokens":5,"model":"claude-sonnet-4-5"}`},
		{"/v1/chat/completions", `{"model":"openai/gpt-5","messages":[]}`, chat, `{"model":"gpt-5","messages":[],"max_completion_tokens":128000}`},
		{"/v1/chat/completions", `{"model":"openai/gpt-5","max_tokens":7}`, chat, `{"model":"gpt-5","max_tokens":7}`},
		{"/v1/chat/completions", `{"model":"openai/unknown-model"}`, chat, `{"model":"unknown-model"}`},
		{"/v1/messages", `{"model":"anthropic/claude-no-limit","messages":[]}`, anth, ""},
	}
	for _, tt := range tests {
		before := tt.prov.count()
		status, _, b := d.call("POST", tt.path, d.token, tt.body)
		if tt.want == "" {
			if status != 400 || tt.prov.count() != before {
				t.Errorf("%s: %d %s; want 400 before any call", tt.body, status, b)
			}
			continue
		}
		if status != 200 {
			t.Fatalf("%s: %d %s", tt.body, status, b)
		}
		if got := string(tt.prov.last(t).body); got != tt.want {
			t.Errorf("%s: provider got %s, want %s", tt.body, got, tt.want)
		}
	}
}

// claude-code passthrough gets SPEC §6.2's OAuth rules: the bearer, the
// oauth beta merged with the caller's, the identity as the first system
// block (the caller's system after it, cache_control kept).
func TestPassthroughClaudeCodeOAuth(t *testing.T) {
	const access = "oauth-access-passthrough-0123456789"
	prov := newRecordingProvider(t, protocolFixtures[1].buffered, fixture(t, protocolFixtures[1].stream))
	env := stateEnv(t)
	env["BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL"] = prov.URL
	d := startDaemon(t, env, "")
	tok := addClient(t, env, "a1-app", "-agent", "a1")
	donateGrant(t, d, access, "oauth-refresh-passthrough-0123", time.Now().Add(time.Hour).UnixMilli())
	ident := `{"text":"You are Claude Code, Anthropic's official CLI for Claude.","type":"text"}`
	const fine = "fine-grained-tool-streaming-2025-05-14"
	tests := []struct {
		name, system, wantSystem string
		beta, wantBeta           string // the caller's anthropic-beta, and the provider's: the caller's and Brama's, each once
	}{
		{"no system", ``, `"system":[` + ident + `]`, fine, fine + ",oauth-2025-04-20"},
		{"string", `"system":"Answer in French.",`, `"system":[` + ident + `,{"text":"Answer in French.","type":"text"}],`, fine, fine + ",oauth-2025-04-20"},
		{"blocks with cache_control", `"system":[{"type":"text","text":"long rules","cache_control":{"type":"ephemeral"}}],`,
			`"system":[` + ident + `,{"type":"text","text":"long rules","cache_control":{"type":"ephemeral"}}],`, fine, fine + ",oauth-2025-04-20"},
		{"already Claude Code's", `"system":[{"type":"text","text":"You are Claude Code, Anthropic's official CLI for Claude.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"more"}],`,
			`"system":[{"type":"text","text":"You are Claude Code, Anthropic's official CLI for Claude.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"more"}],`,
			"claude-code-20250219,oauth-2025-04-20, " + fine + "," + fine, "claude-code-20250219,oauth-2025-04-20," + fine},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"claude-code/claude-test","max_tokens":50,` + tt.system + `"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024}}`
			// The caller authenticates as Anthropic's clients do (x-api-key): Brama's token must not reach the provider.
			status, h, b := d.call("POST", "/v1/messages?beta=true", "", body, "anthropic-beta", tt.beta, "x-api-key", tok)
			if status != 200 || string(b) != protocolFixtures[1].buffered || h.Get("Brama-Route") != "claude-code/claude-test" {
				t.Fatalf("status %d route %q: %s", status, h.Get("Brama-Route"), b)
			}
			c := prov.last(t)
			want := `{"model":"claude-test","max_tokens":50,` + tt.system + `"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024}}`
			if tt.system == "" {
				want = strings.TrimSuffix(want, "}") + `,` + tt.wantSystem + `}`
			} else {
				want = strings.Replace(want, tt.system, tt.wantSystem, 1)
			}
			if string(c.body) != want {
				t.Errorf("provider body\n got %s\nwant %s", c.body, want)
			}
			if c.header.Get("Authorization") != "Bearer "+access || c.header.Get("x-api-key") != "" || strings.Contains(fmt.Sprint(c.header), tok) {
				t.Errorf("credential headers: Authorization %q x-api-key %q", c.header.Get("Authorization"), c.header.Get("x-api-key"))
			}
			if got := c.header.Get("anthropic-beta"); got != tt.wantBeta {
				t.Errorf("anthropic-beta = %q, want %q: the caller's merged with oauth-2025-04-20, each once", got, tt.wantBeta)
			}
			if c.header.Get("anthropic-version") != "2023-06-01" || c.query != "beta=true" {
				t.Errorf("anthropic-version %q (want Brama's default), query %q", c.header.Get("anthropic-version"), c.query)
			}
		})
	}
	assertNoSecret(t, access, d.stderr.String(), d.env["BRAMA_STATE_DIR"])
}

// codex passthrough gets SPEC §6.2's body rules from a backend that
// refuses anything else: stream and store forced, instructions from the
// caller's system text, never max_output_tokens; include, reasoning and
// prompt_cache_key kept. A buffered caller gets the response assembled
// from the stream's items; a streamed one the events as sent.
func TestPassthroughCodexBody(t *testing.T) {
	prov := newRecordingProvider(t, "", fixture(t, "codex.sse"))
	prov.alwaysStream = true
	prov.refuse = func(c recordedCall) (int, string) {
		var b struct {
			Stream          *bool           `json:"stream"`
			Store           *bool           `json:"store"`
			Instructions    *string         `json:"instructions"`
			MaxOutputTokens json.RawMessage `json:"max_output_tokens"`
		}
		switch {
		case json.Unmarshal(c.body, &b) != nil, c.path != "/responses":
			return 400, `{"detail":"bad request"}`
		case b.Stream == nil || !*b.Stream:
			return 400, `{"detail":"Stream must be set to true"}`
		case b.Store == nil || *b.Store:
			return 400, `{"detail":"Store must be set to false"}`
		case b.Instructions == nil || *b.Instructions == "":
			return 400, `{"detail":"Instructions are required"}`
		case b.MaxOutputTokens != nil:
			return 400, `{"detail":"Unsupported parameter: max_output_tokens"}`
		case c.header.Get("chatgpt-account-id") != "acct-1" || c.header.Get("originator") != "codex_cli_rs":
			return 400, `{"detail":"missing account"}`
		}
		return 0, ""
	}
	d, tok, _ := codexDaemon(t, prov.URL)

	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			body := fmt.Sprintf(`{"model":"codex/gpt-5-codex","input":[{"role":"developer","content":"Be terse."},{"role":"user","content":"weather?"}],"store":true,"include":["reasoning.encrypted_content"],"reasoning":{"effort":"high"},"prompt_cache_key":"conv-9","max_output_tokens":500,"stream":%v}`, stream)
			status, h, got := d.call("POST", "/v1/responses", tok, body, "OpenAI-Beta", "caller-beta")
			if status != 200 {
				t.Fatalf("status %d: %s", status, got)
			}
			c := prov.last(t)
			want := `{"model":"gpt-5-codex","input":[{"role":"developer","content":"Be terse."},{"role":"user","content":"weather?"}],"store":false,"include":["reasoning.encrypted_content"],"reasoning":{"effort":"high"},"prompt_cache_key":"conv-9","stream":true,"instructions":"Be terse."}`
			if string(c.body) != want {
				t.Errorf("provider body\n got %s\nwant %s", c.body, want)
			}
			if c.header.Get("OpenAI-Beta") != "caller-beta,responses=experimental" {
				t.Errorf("OpenAI-Beta = %q", c.header.Get("OpenAI-Beta"))
			}
			if h.Get("Brama-Route") != "codex/gpt-5-codex" {
				t.Errorf("Brama-Route = %q", h.Get("Brama-Route"))
			}
			if stream {
				if string(got) != fixture(t, "codex.sse") {
					t.Errorf("streamed events differ from the provider's:\n%s", got)
				}
				return
			}
			var resp struct {
				ID     string            `json:"id"`
				Status string            `json:"status"`
				Output []json.RawMessage `json:"output"`
				Usage  struct {
					InputTokens int `json:"input_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(got, &resp); err != nil || resp.ID != "resp_c" || resp.Status != "completed" || len(resp.Output) != 3 || resp.Usage.InputTokens != 1200 {
				t.Errorf("assembled answer %s (err %v); want resp_c with the three output items", got, err)
			}
			if !strings.Contains(string(resp.Output[2]), `"call_id":"call_c"`) {
				t.Errorf("output not in output_index order: %s", got)
			}
		})
	}
	if s, _, b := d.call("POST", "/v1/responses", tok, `{"model":"codex/gpt-5-codex","input":"hi"}`); s != 200 || !strings.Contains(string(prov.last(t).body), `"instructions":"You are a helpful assistant."`) {
		t.Errorf("no system text: %d %s, provider got %s", s, b, prov.last(t).body)
	}
	// System and developer items, a string or text parts, become the instructions in order.
	sys := `{"model":"codex/gpt-5-codex","input":[{"role":"system","content":[{"type":"input_text","text":"Rules."}]},{"role":"developer","content":"Be terse."},{"role":"user","content":"hi"}]}`
	if s, _, b := d.call("POST", "/v1/responses", tok, sys); s != 200 || !strings.Contains(string(prov.last(t).body), `"instructions":"Rules.\n\nBe terse."`) {
		t.Errorf("system and developer text: %d %s, provider got %s", s, b, prov.last(t).body)
	}
}

// A passthrough stream is relayed event by event until the provider's
// terminal signal; anything else after commit writes the dialect's in-band
// error (never the provider's own error event, never a clean end) and
// aborts the response (SPEC §7.5, §7.6).
func TestPassthroughStreamEnds(t *testing.T) {
	const (
		chatChunk  = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}],\"usage\":null}\n\n"
		chatFinish = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"
		chatUsage  = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n"
		msgStart   = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\n"
		msgDelta   = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n"
		msgError   = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
		msgStop    = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
		rsCreated  = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n"
	)
	tests := []struct {
		name, dialect, model, stream, extra string
		cut                                 bool   // the provider closes the connection after stream
		want                                string // the caller's bytes, exactly
		wantAbort                           bool
		wantCode                            string // the in-band error's code when aborted
	}{
		{name: "chat without [DONE] gets it", dialect: dialectChat, model: "openai/gpt-test", stream: chatChunk + chatFinish + chatUsage,
			want: chatChunk + chatFinish + "data: [DONE]\n\n"},
		{name: "chat usage the caller asked for is relayed", dialect: dialectChat, model: "openai/gpt-test", extra: `,"stream_options":{"include_usage":true}`,
			stream: chatChunk + chatFinish + chatUsage + "data: [DONE]\n\n", want: chatChunk + chatFinish + chatUsage + "data: [DONE]\n\n"},
		{name: "chat finish then a cut is complete", dialect: dialectChat, model: "openai/gpt-test", stream: chatChunk + chatFinish, cut: true,
			want: chatChunk + chatFinish + "data: [DONE]\n\n"},
		{name: "chat cut before finish", dialect: dialectChat, model: "openai/gpt-test", stream: chatChunk, cut: true,
			want: chatChunk, wantAbort: true, wantCode: "provider_incomplete"},
		{name: "chat n=2: a cut after one choice finished", dialect: dialectChat, model: "openai/gpt-test", extra: `,"n":2`,
			stream: chatChunk + strings.Replace(chatChunk, `"index":0`, `"index":1`, 1) + chatFinish, cut: true,
			want: chatChunk + strings.Replace(chatChunk, `"index":0`, `"index":1`, 1) + chatFinish, wantAbort: true, wantCode: "provider_incomplete"},
		{name: "chat n=2: both choices finished", dialect: dialectChat, model: "openai/gpt-test", extra: `,"n":2`,
			stream: chatChunk + strings.Replace(chatChunk, `"index":0`, `"index":1`, 1) + chatFinish + strings.Replace(chatFinish, `"index":0`, `"index":1`, 1),
			want:   chatChunk + strings.Replace(chatChunk, `"index":0`, `"index":1`, 1) + chatFinish + strings.Replace(chatFinish, `"index":0`, `"index":1`, 1) + "data: [DONE]\n\n"},
		{name: "chat [DONE] before finish", dialect: dialectChat, model: "openai/gpt-test", stream: chatChunk + "data: [DONE]\n\n",
			want: chatChunk, wantAbort: true, wantCode: "provider_incomplete"},
		{name: "messages in-band error", dialect: dialectMessages, model: "anthropic/claude-test", stream: msgStart + msgDelta + msgError,
			want: msgStart + msgDelta, wantAbort: true, wantCode: "provider_incomplete"},
		{name: "messages in-band rate limit on a direct route (no subscription to block)", dialect: dialectMessages, model: "anthropic/claude-test",
			stream: msgStart + msgDelta + strings.Replace(msgError, "overloaded_error", "rate_limit_error", 1),
			want:   msgStart + msgDelta, wantAbort: true, wantCode: "provider_incomplete"},
		{name: "messages: a block without data is no event, relayed", dialect: dialectMessages, model: "anthropic/claude-test",
			stream: msgStart + "event: ping\n\n" + msgDelta + msgStop, want: msgStart + "event: ping\n\n" + msgDelta + msgStop},
		{name: "messages ends before message_stop", dialect: dialectMessages, model: "anthropic/claude-test", stream: msgStart + msgDelta,
			want: msgStart + msgDelta, wantAbort: true, wantCode: "provider_incomplete"},
		{name: "responses malformed event", dialect: dialectResponses, model: "openai-responses/gpt-resp", stream: rsCreated + "data: {not json\n\n",
			want: rsCreated, wantAbort: true, wantCode: "provider_failure"},
	}
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0" // the cases repeat one body on purpose
	var mu sync.Mutex
	current := map[string]int{} // model → test index
	prov := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req struct {
			Model string `json:"model"`
		}
		json.Unmarshal(body, &req)
		mu.Lock()
		tt := tests[current[req.Model]]
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, tt.stream)
		w.(http.Flusher).Flush()
		if tt.cut {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		}
	})
	for _, p := range []string{"OPENAI", "ANTHROPIC", "OPENAI_RESPONSES"} {
		env["BRAMA_PROVIDER_"+p+"_BASE_URL"] = prov.URL
	}
	d := startDaemon(t, env, `{"openai":"k1","anthropic":"k2","openai-responses":"k3"}`, "-local-credentials-stdin")
	outcomes := map[string]string{} // request id → the outcome its log line must say
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, upstream, _ := strings.Cut(tt.model, "/")
			mu.Lock()
			current[upstream] = i
			mu.Unlock()
			resp := d.openStream(dialectPaths[tt.dialect], d.token, chatBody(tt.dialect, tt.model, true, tt.extra))
			defer resp.Body.Close()
			got, readErr := io.ReadAll(resp.Body)
			outcomes[resp.Header.Get("X-Request-Id")] = cmp.Or(tt.wantCode, "ok")
			if resp.StatusCode != 200 || resp.Header.Get("Brama-Route") != tt.model {
				t.Fatalf("status %d, Brama-Route %q: %s", resp.StatusCode, resp.Header.Get("Brama-Route"), got)
			}
			if !tt.wantAbort {
				if readErr != nil || string(got) != tt.want {
					t.Errorf("caller got %q (read error %v), want exactly %q", got, readErr, tt.want)
				}
				return
			}
			if readErr == nil {
				t.Errorf("the caller's stream ended cleanly; it must be aborted")
			}
			rest, ok := strings.CutPrefix(string(got), tt.want)
			if !ok {
				t.Fatalf("caller got %q, want the relayed %q first", got, tt.want)
			}
			if !strings.Contains(rest, `"code":"`+tt.wantCode+`"`) || strings.Contains(rest, `"message":"Overloaded"`) || strings.Contains(rest, "[DONE]") {
				t.Errorf("after the relayed events: %q; want only Brama's in-band %s", rest, tt.wantCode)
			}
		})
	}
	d.stop() // every request has written its log line: the outcome the stream ended with
	for _, path := range []string{"/v1/chat/completions", "/v1/messages", "/v1/responses"} {
		for _, l := range requestLines(d.stderr.String(), path) {
			if id, _ := l["request_id"].(string); l["outcome"] != outcomes[id] {
				t.Errorf("request %s logged outcome %v, want %s", id, l["outcome"], outcomes[id])
			}
		}
	}
}

// A selector parses for translation at plan time when any candidate needs
// it: a body only passthrough can carry is refused before any call when a
// candidate crosses formats, and passes through when none does.
func TestSelectorParsesForTranslationAtPlanTime(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"groq-1": "200"})
	anth := newRecordingProvider(t, protocolFixtures[1].buffered, "")
	env["BRAMA_PROVIDER_GROQ_BASE_URL"] = fake.URL
	env["BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL"] = anth.URL
	d := startDaemon(t, env, "")
	for _, put := range []string{`{"alias":"g1","route":"groq/gq-a"}`, `{"alias":"c1","route":"claude-code/claude-test"}`} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
			t.Fatalf("PUT %s: %d %s", put, s, b)
		}
	}
	across, _ := agentWithSubs(t, d, "a1", "groq", "groq-1")
	same, _ := agentWithSubs(t, d, "a2", "claude-code", "cc-1")
	body := `{"model":"any","max_tokens":10,"messages":"only passthrough carries this"}`
	status, _, b := d.call("POST", "/v1/messages", across, body)
	if status != 400 || envelopeOf(t, b)["code"] != "invalid_request" || fake.total() != 0 {
		t.Errorf("a candidate across formats: %d %s after %d calls; want 400 before any call", status, b, fake.total())
	}
	status, h, b := d.call("POST", "/v1/messages", same, body)
	if status != 200 || anth.count() != 1 || h.Get("Brama-Route") != "claude-code/claude-test" {
		t.Errorf("every candidate in the caller's format: %d %s, route %q, %d calls; want passthrough", status, b, h.Get("Brama-Route"), anth.count())
	}
	if got := anth.last(t).body; !strings.Contains(string(got), `"messages":"only passthrough carries this"`) || anth.last(t).header.Get("x-api-key") != "cc-1" {
		t.Errorf("the provider got %s", got)
	}
}

// setProviderHeaders without caller headers is exactly what a translated
// call sends, for every provider and credential kind, so both paths can
// share it.
func TestProviderHeadersMatchTranslation(t *testing.T) {
	creds := []upstreamCredential{{APIKey: "sk-key"}, {AccessToken: "oauth-token", AccountID: "acct"}, {}}
	for _, p := range providerTable {
		for _, cred := range creds {
			for _, stream := range []bool{false, true} {
				req := chatRequest{Model: "m", Stream: stream, MaxTokens: 10, Messages: []message{{Role: "user", Parts: []part{{Type: partText, Text: "hi"}}}}}
				hr, err := buildUpstreamRequest(t.Context(), call{res: resolution{Provider: p, Model: "m"}, baseURL: "http://127.0.0.1:9", cred: cred}, &req)
				if err != nil {
					t.Fatalf("%s: %v", p.id, err)
				}
				got := http.Header{}
				setProviderHeaders(got, p, cred, nil, req.Stream || p.codex)
				if fmt.Sprint(got) != fmt.Sprint(hr.Header) {
					t.Errorf("%s %+v stream=%v:\n got %v\nwant %v", p.id, cred, stream, got, hr.Header)
				}
			}
		}
	}
}

// The passthrough body edits, one rule per row: everything not named by a
// rule stays as the caller sent it.
func TestPassthroughBodyEdits(t *testing.T) {
	openai, _ := lookupProvider("openai")
	codex, _ := lookupProvider("codex")
	claude, _ := lookupProvider("claude-code")
	oauth := upstreamCredential{AccessToken: "tok"}
	tests := []struct {
		name, dialect string
		p             providerInfo
		cred          upstreamCredential
		limit         int // the output limit planned for the call
		body, want    string
	}{
		{"chat stream without stream_options", dialectChat, openai, upstreamCredential{}, 0,
			`{"model":"x","stream":true}`, `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{"chat stream_options false: set in place, others kept", dialectChat, openai, upstreamCredential{}, 0,
			`{"model":"x","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`,
			`{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`},
		{"chat stream_options true: unchanged", dialectChat, openai, upstreamCredential{}, 0,
			`{"stream_options":{"include_usage":true},"model":"x","stream":true}`, `{"stream_options":{"include_usage":true},"model":"m","stream":true}`},
		{"chat buffered: no stream_options", dialectChat, openai, upstreamCredential{}, 0,
			`{"model":"x"}`, `{"model":"m"}`},
		{"retired billingTarget passes as any unknown member", dialectChat, openai, upstreamCredential{}, 0,
			`{"billingTarget":{"subscriptionId":"s"},"model":"x", "n":1}`, `{"billingTarget":{"subscriptionId":"s"},"model":"m", "n":1}`},
		{"catalogue limit added for openai", dialectChat, openai, upstreamCredential{}, 99,
			`{"model":"x"}`, `{"model":"m","max_completion_tokens":99}`},
		{"claude-code string system equal to the identity: unchanged", dialectMessages, claude, oauth, 0,
			`{"model":"x","system":"You are Claude Code, Anthropic's official CLI for Claude."}`,
			`{"model":"m","system":"You are Claude Code, Anthropic's official CLI for Claude."}`},
		{"claude-code with an API key: no identity", dialectMessages, claude, upstreamCredential{APIKey: "k"}, 0,
			`{"model":"x","system":"s"}`, `{"model":"m","system":"s"}`},
		{"codex: developer parts become instructions, tools items skipped", dialectResponses, codex, oauth, 0,
			`{"model":"x","input":[{"type":"additional_tools","role":"developer","tools":[]},{"role":"developer","content":[{"type":"input_text","text":"A"},{"type":"input_text","text":"B"}]}]}`,
			`{"model":"m","input":[{"type":"additional_tools","role":"developer","tools":[]},{"role":"developer","content":[{"type":"input_text","text":"A"},{"type":"input_text","text":"B"}]}],"stream":true,"store":false,"instructions":"A\n\nB"}`},
		{"codex: the caller's instructions kept, its limit removed", dialectResponses, codex, oauth, 0,
			`{"model":"x","instructions":"mine","max_output_tokens":5,"stream":false,"store":true}`,
			`{"model":"m","instructions":"mine","stream":true,"store":false}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", nil)
			cr, err := readCallerRequest(tt.dialect, r, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if tt.limit > 0 {
				cr.head.MaxTokens = tt.limit
			}
			hr, err := buildChatRequest(t.Context(), call{res: resolution{Provider: tt.p, Model: "m"}, baseURL: "http://127.0.0.1:9", cred: tt.cred}, cr)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(hr.Body)
			if string(got) != tt.want {
				t.Errorf("\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// A caller that hangs up as soon as it reads a stream's in-band error (as
// Claude Code does before falling back to a buffered call of the same
// conversation) still had a refusal: the fallback is refused by the replay
// guard without a second provider call (SPEC §8.1).
func TestStreamFailureThenHangUpIsRemembered(t *testing.T) {
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4}}}\n\n")
		cutAfterFlush(w)
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"anthropic":"k"}`, "-local-credentials-stdin")
	resp := d.openStream("/v1/messages", d.token, chatBody(dialectMessages, "anthropic/claude-test", true, ""))
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended without an in-band error: %v", err)
		}
		if strings.HasPrefix(line, "event: error") {
			break
		}
	}
	resp.Body.Close() // hang up at once, before Brama is done with the request
	status, h, b := d.call("POST", "/v1/messages", d.token, chatBody(dialectMessages, "anthropic/claude-test", false, ""))
	if status != 502 || h.Get("Brama-Replay-Refused") != "true" || fake.calls.Load() != 1 {
		t.Errorf("the buffered fallback: %d %s after %d provider calls; want the replayed 502 and one call", status, b, fake.calls.Load())
	}
}

// TestPassthroughCodexMinimalStream: a buffered codex caller whose stream ended no item before response.completed
// gets that response as sent, its output included.
func TestPassthroughCodexMinimalStream(t *testing.T) {
	completed := `{"type":"response.completed","response":{"id":"resp_m","object":"response","status":"completed","output":[{"type":"message","id":"msg_m","role":"assistant","content":[{"type":"output_text","text":"hi there","annotations":[]}]}],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}}`
	prov := newRecordingProvider(t, "", "event: response.completed\ndata: "+completed+"\n\n")
	prov.alwaysStream = true
	d, tok, _ := codexDaemon(t, prov.URL)
	status, _, got := d.call("POST", "/v1/responses", tok, `{"model":"codex/gpt-5-codex","input":"hi"}`)
	if want := rawMember([]byte(completed), "response"); status != 200 || string(got) != string(want) {
		t.Fatalf("status %d, body %s; want 200 and the response as sent: %s", status, got, want)
	}
}

// TestRawMemberAsEncodingJSON: rawMember finds the member encoding/json
// decodes: its name in any case, and the last of that name.
func TestRawMemberAsEncodingJSON(t *testing.T) {
	for _, doc := range []string{`{"error":1}`, `{"Error":1}`, `{"error":1,"ERROR":2}`, `{"error":{"a":1},"error":null}`, `{"x":1}`} {
		var want struct {
			Error json.RawMessage `json:"error"`
		}
		json.Unmarshal([]byte(doc), &want)
		if got := rawMember([]byte(doc), "error"); string(got) != string(want.Error) {
			t.Errorf("rawMember(%s) = %s, want %s", doc, got, want.Error)
		}
	}
}
