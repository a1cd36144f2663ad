package main

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestTranslationCarriesToolStrictness checks a function tool's strict
// flag reaches a provider of another format as the caller set it (SPEC
// §7.6: function tools are carried), never silently flipped or lost.
func TestTranslationCarriesToolStrictness(t *testing.T) {
	d, fakes := translationDaemon(t)
	schema := `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}`
	tests := []struct {
		name, path, body, provider string
		wantUpstream               map[string]string
		wantBeta                   string
	}{
		{
			name: "chat to responses", path: "/v1/chat/completions", provider: "openai-responses",
			body:         `{"model":"openai-responses/gpt-test","messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":` + schema + `,"strict":true}}]}`,
			wantUpstream: map[string]string{"tools[0].name": `"get_weather"`, "tools[0].strict": `true`},
		},
		{
			name: "responses to chat", path: "/v1/responses", provider: "openai",
			body:         `{"model":"openai/gpt-test","input":"q","tools":[{"type":"function","name":"get_weather","parameters":` + schema + `,"strict":true}]}`,
			wantUpstream: map[string]string{"tools[0].function.name": `"get_weather"`, "tools[0].function.strict": `true`},
		},
		{
			name: "chat to messages", path: "/v1/chat/completions", provider: "anthropic",
			body:         `{"model":"anthropic/claude-test","max_tokens":9,"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":` + schema + `,"strict":true}}]}`,
			wantUpstream: map[string]string{"tools[0].name": `"get_weather"`, "tools[0].strict": `true`},
			wantBeta:     structuredOutputsBeta,
		},
		{
			name: "chat to messages, strict false", path: "/v1/chat/completions", provider: "anthropic",
			body:         `{"model":"anthropic/claude-test","max_tokens":9,"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":` + schema + `,"strict":false}}]}`,
			wantUpstream: map[string]string{"tools[0].name": `"get_weather"`, "tools[0].strict": `false`},
			wantBeta:     structuredOutputsBeta,
		},
		{
			name: "messages to responses", path: "/v1/messages", provider: "openai-responses",
			body:         `{"model":"openai-responses/gpt-test","max_tokens":9,"messages":[{"role":"user","content":"q"}],"tools":[{"name":"get_weather","input_schema":` + schema + `,"strict":true}]}`,
			wantUpstream: map[string]string{"tools[0].name": `"get_weather"`, "tools[0].strict": `true`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := fakes[tc.provider]
			status, hdr, body := d.call("POST", tc.path, d.token, tc.body)
			if status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
			for path, want := range tc.wantUpstream {
				if got := jsonAt(t, f.body(), path); got != want {
					t.Errorf("upstream %s = %s, want %s", path, got, want)
				}
			}
			if got := hdr.Get("Brama-Dropped"); got != "" {
				t.Errorf("Brama-Dropped = %q, want none", got)
			}
			f.mu.Lock()
			beta := f.header.Get("anthropic-beta")
			f.mu.Unlock()
			if beta != tc.wantBeta {
				t.Errorf("anthropic-beta = %q, want %q", beta, tc.wantBeta)
			}
		})
	}
}

// TestTranslationCarriesImageDetail checks an image part's detail reaches
// the other OpenAI format and is named where messages has no counterpart
// (SPEC §7.6: image parts are carried, nothing dropped silently).
func TestTranslationCarriesImageDetail(t *testing.T) {
	d, fakes := translationDaemon(t)
	chatBody := func(model string) string {
		return `{"model":"` + model + `","max_tokens":9,"messages":[{"role":"user","content":[{"type":"text","text":"what is this"},
			{"type":"image_url","image_url":{"url":"https://example.com/a.png","detail":"high"}}]}]}`
	}
	responsesBody := func(model string) string {
		return `{"model":"` + model + `","max_output_tokens":9,"input":[{"role":"user","content":[{"type":"input_text","text":"what is this"},
			{"type":"input_image","image_url":"https://example.com/a.png","detail":"low"}]}]}`
	}
	tests := []struct {
		name, path, body, provider string
		wantUpstream               map[string]string
		wantDropped                string
	}{
		{name: "chat to responses", path: "/v1/chat/completions", body: chatBody("openai-responses/gpt-test"), provider: "openai-responses",
			wantUpstream: map[string]string{"input[0].content[1].image_url": `"https://example.com/a.png"`, "input[0].content[1].detail": `"high"`}},
		{name: "responses to chat", path: "/v1/responses", body: responsesBody("openai/gpt-test"), provider: "openai",
			wantUpstream: map[string]string{"messages[0].content[1].image_url.url": `"https://example.com/a.png"`, "messages[0].content[1].image_url.detail": `"low"`}},
		{name: "chat to messages", path: "/v1/chat/completions", body: chatBody("anthropic/claude-test"), provider: "anthropic",
			wantUpstream: map[string]string{"messages[0].content[1].source.url": `"https://example.com/a.png"`},
			wantDropped:  "detail"},
		{name: "responses to messages", path: "/v1/responses", body: responsesBody("anthropic/claude-test"), provider: "anthropic",
			wantUpstream: map[string]string{"messages[0].content[1].source.url": `"https://example.com/a.png"`},
			wantDropped:  "detail"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := d.call("POST", tc.path, d.token, tc.body)
			if status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
			for path, want := range tc.wantUpstream {
				if got := jsonAt(t, fakes[tc.provider].body(), path); got != want {
					t.Errorf("upstream %s = %s, want %s", path, got, want)
				}
			}
			if got := hdr.Get("Brama-Dropped"); got != tc.wantDropped {
				t.Errorf("Brama-Dropped = %q, want %q", got, tc.wantDropped)
			}
		})
	}
}

// TestTranslationNamesUnknownPartAndToolMembers checks the members of a
// content part or a chat tool that Brama does not carry are named in
// Brama-Dropped, as a message's or a Responses tool's are (SPEC §7.6:
// nothing is dropped silently).
func TestTranslationNamesUnknownPartAndToolMembers(t *testing.T) {
	env := stateEnv(t)
	f := newTranslationFake(t, func(string) string { return messagesToolAnswer })
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f.fakeProvider}), "-local-credentials-stdin")
	tests := []struct{ name, path, body, wantDropped string }{
		{
			name: "chat", path: "/v1/chat/completions",
			body: `{"model":"anthropic/claude-test","max_tokens":9,"messages":[{"role":"user","content":[{"type":"text","text":"q","cache_control":{"type":"ephemeral"}},
				{"type":"image_url","image_url":{"url":"https://example.com/a.png","format":"image/png"}},{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBE","file_id":"file_1"}}]}],
				"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"x_extra":1},"cache_control":{"type":"ephemeral"}}]}`,
			wantDropped: "cache_control, format, file_id, x_extra",
		},
		{
			name: "responses", path: "/v1/responses",
			body: `{"model":"anthropic/claude-test","max_output_tokens":9,"input":[{"role":"user","content":[{"type":"input_text","text":"q","x_extra":1},
				{"type":"input_image","image_url":"https://example.com/a.png","file_id":"file_1"},{"type":"input_file","file_data":"data:application/pdf;base64,JVBE","file_id":"file_2"}]}]}`,
			wantDropped: "x_extra, file_id",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := d.call("POST", tc.path, d.token, tc.body)
			if status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
			if got := hdr.Get("Brama-Dropped"); got != tc.wantDropped {
				t.Errorf("Brama-Dropped = %q, want %q", got, tc.wantDropped)
			}
		})
	}
}

// TestTranslationKeepsToolNamesOutsideAGroup checks a call to a tool whose
// own name starts with "__" comes back under that name: only a namespaced
// tool's flattened prefix is taken off (SPEC §7.6).
func TestTranslationKeepsToolNamesOutsideAGroup(t *testing.T) {
	env := stateEnv(t)
	f := newTranslationFake(t, func(string) string {
		return `{"id":"m","type":"message","role":"assistant","model":"m","content":[{"type":"tool_use","id":"toolu_1","name":"__init","input":{}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":1}}`
	})
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f.fakeProvider}), "-local-credentials-stdin")
	status, _, body := d.call("POST", "/v1/chat/completions", d.token, `{"model":"anthropic/claude-test","max_tokens":9,"messages":[{"role":"user","content":"q"}],
		"tools":[{"type":"function","function":{"name":"__init","parameters":{"type":"object"}}}]}`)
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	if got := jsonAt(t, body, "choices[0].message.tool_calls[0].function.name"); got != `"__init"` {
		t.Errorf("call name = %s, want \"__init\"", got)
	}
}

// TestTranslationNamesThinkingItCannotMap checks a Messages caller's thinking
// of a type Brama does not map to an effort (adaptive) is named in
// Brama-Dropped, not lost silently (SPEC §7.6).
func TestTranslationNamesThinkingItCannotMap(t *testing.T) {
	env := stateEnv(t)
	f := newTranslationFake(t, func(string) string { return chatToolAnswer })
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"openai": f.fakeProvider}), "-local-credentials-stdin")
	for _, tc := range []struct{ thinking, wantDropped, wantEffort string }{
		{`{"type":"adaptive"}`, "thinking", ``},
		{`{"type":"enabled","budget_tokens":2048}`, "", `"low"`},
		{`{"type":"disabled"}`, "", ``},
	} {
		status, hdr, body := d.call("POST", "/v1/messages", d.token, `{"model":"openai/gpt-test","max_tokens":9000,"thinking":`+tc.thinking+`,"messages":[{"role":"user","content":"q"}]}`)
		if status != 200 {
			t.Fatalf("%s: status %d: %s", tc.thinking, status, body)
		}
		if got := hdr.Get("Brama-Dropped"); got != tc.wantDropped {
			t.Errorf("%s: Brama-Dropped = %q, want %q", tc.thinking, got, tc.wantDropped)
		}
		if got := jsonAt(t, f.body(), "reasoning_effort"); got != tc.wantEffort {
			t.Errorf("%s: upstream reasoning_effort = %s, want %s", tc.thinking, got, tc.wantEffort)
		}
	}
}

// TestTranslationCarriesAModelRefusal checks an OpenAI model's refusal
// (message.refusal, a refusal delta or part) reaches a caller of another
// format as its text with the refusal finish (messages stop_reason
// "refusal", chat content_filter), never as an empty, ordinary stop.
func TestTranslationCarriesAModelRefusal(t *testing.T) {
	env := stateEnv(t)
	chat := newTranslationFake(t, func(string) string {
		return `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`
	})
	responses := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m1","role":"assistant","content":[]}}`+"\n\n"+
			`data: {"type":"response.refusal.delta","output_index":0,"content_index":0,"delta":"I can't"}`+"\n\n"+
			`data: {"type":"response.output_item.done","output_index":0,"item":{"type":"message","id":"m1","role":"assistant","content":[{"type":"refusal","refusal":"I can't"}]}}`+"\n\n"+
			`data: {"type":"response.completed","response":{"status":"completed","output":[],"usage":{"input_tokens":1,"output_tokens":2}}}`+"\n\n")
	})
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"openai": chat.fakeProvider, "openai-responses": responses}), "-local-credentials-stdin")

	status, _, body := d.call("POST", "/v1/messages", d.token, `{"model":"openai/gpt-test","max_tokens":9,"messages":[{"role":"user","content":"q"}]}`)
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	if got, want := jsonAt(t, body, "content[0].text")+" "+jsonAt(t, body, "stop_reason"), `"I can't help with that." "refusal"`; got != want {
		t.Errorf("messages answer = %s, want %s", got, want)
	}

	status, _, body = d.call("POST", "/v1/chat/completions", d.token, `{"model":"openai-responses/gpt-test","stream":true,"messages":[{"role":"user","content":"q"}]}`)
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	var text, finish string
	for _, fr := range splitTestSSE(t, string(body)) {
		if fr.Data == "[DONE]" {
			continue
		}
		if s := jsonAt(t, []byte(fr.Data), "choices[0].delta.content"); s != "" && s != `""` {
			text += s
		}
		if f := jsonAt(t, []byte(fr.Data), "choices[0].finish_reason"); f != "" && f != "null" {
			finish = f
		}
	}
	if got, want := text+" "+finish, `"I can't" "content_filter"`; got != want {
		t.Errorf("chat stream = %s, want %s", got, want)
	}
}

// TestTranslationNamesAToolResultsErrorFlag checks a Messages tool result's
// is_error, which neither OpenAI format has, is named in Brama-Dropped, not
// lost silently (SPEC §7.6).
func TestTranslationNamesAToolResultsErrorFlag(t *testing.T) {
	env := stateEnv(t)
	f := newTranslationFake(t, func(string) string { return chatToolAnswer })
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"openai": f.fakeProvider}), "-local-credentials-stdin")
	for _, tc := range []struct{ isError, wantDropped string }{{"true", "is_error"}, {"false", ""}} {
		status, hdr, body := d.call("POST", "/v1/messages", d.token, `{"model":"openai/gpt-test","max_tokens":9,"messages":[{"role":"user","content":"q"},
			{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"f","input":{}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"boom","is_error":`+tc.isError+`}]}],
			"tools":[{"name":"f","input_schema":{"type":"object"}}]}`)
		if status != 200 {
			t.Fatalf("status %d: %s", status, body)
		}
		if got := hdr.Get("Brama-Dropped"); got != tc.wantDropped {
			t.Errorf("is_error %s: Brama-Dropped = %q, want %q", tc.isError, got, tc.wantDropped)
		}
	}
}

// TestTranslationGivesAnthropicToolIDsItTakes checks a chat history whose
// call ids came from another provider (kimi's "functions.get_weather:0")
// reaches a messages provider with ids of Anthropic's pattern, the call and
// its result still linked; the fake refuses any other id, as Anthropic does.
func TestTranslationGivesAnthropicToolIDsItTakes(t *testing.T) {
	env := stateEnv(t)
	idPattern := regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	f := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		use, result := jsonAt(t, body, "messages[1].content[0].id"), jsonAt(t, body, "messages[2].content[0].tool_use_id")
		if id := strings.Trim(use, `"`); !idPattern.MatchString(id) || use != result {
			w.WriteHeader(400)
			io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"messages.1.content.0.tool_use.id: String should match pattern"}}`)
			return
		}
		io.WriteString(w, messagesToolAnswer)
	})
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f}), "-local-credentials-stdin")
	status, _, body := d.call("POST", "/v1/chat/completions", d.token, `{"model":"anthropic/claude-test","max_tokens":9,"messages":[{"role":"user","content":"q"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"functions.get_weather:0","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"functions.get_weather:0","content":"sunny"}],
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`)
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
}

// TestTranslationSendsOpenAIItsOutputLimit checks a translated request
// reaches the openai provider with max_completion_tokens, as a passthrough
// one does: its reasoning models refuse max_tokens (SPEC §6.4, §7.6). The
// fake refuses max_tokens as those models do.
func TestTranslationSendsOpenAIItsOutputLimit(t *testing.T) {
	env := stateEnv(t)
	f := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if jsonAt(t, body, "max_tokens") != "" {
			w.WriteHeader(400)
			io.WriteString(w, `{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens","code":"unsupported_parameter"}}`)
			return
		}
		io.WriteString(w, chatToolAnswer)
	})
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"openai": f}), "-local-credentials-stdin")
	for _, tc := range []struct{ path, body string }{
		{"/v1/messages", `{"model":"openai/gpt-5","max_tokens":900,"messages":[{"role":"user","content":"q"}]}`},
		{"/v1/responses", `{"model":"openai/gpt-5","max_output_tokens":900,"input":"q"}`},
	} {
		status, _, body := d.call("POST", tc.path, d.token, tc.body)
		if status != 200 {
			t.Fatalf("%s: status %d: %s", tc.path, status, body)
		}
		if got := jsonAt(t, f.body(), "max_completion_tokens"); got != "900" {
			t.Errorf("%s: upstream max_completion_tokens = %s, want 900", tc.path, got)
		}
	}
}

// TestTranslationSeparatesParallelCallsAtOneIndex checks a chat stream whose
// parallel calls all come at index 0 (Ollama) or without an index (other
// OpenAI-compatible servers) reaches a Messages caller as separate calls,
// each with its own input, not one call of concatenated arguments.
func TestTranslationSeparatesParallelCallsAtOneIndex(t *testing.T) {
	env := stateEnv(t)
	f := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		index := `"index":0,`
		if jsonAt(t, body, "max_completion_tokens") == "7" { // a call whose id comes after its name: one call
			for _, c := range []string{
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"arguments":"\"Paris\"}"}}]}}]}`,
				`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
			} {
				io.WriteString(w, "data: "+c+"\n\n")
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		if jsonAt(t, body, "max_completion_tokens") == "8" { // the caller's max_tokens says: no index
			index = ``
		}
		for _, c := range []string{
			`{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{` + index + `"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{` + index + `"function":{"arguments":"\"Paris\"}"}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{` + index + `"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}]}}]}`,
			`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		} {
			io.WriteString(w, "data: "+c+"\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"openai": f}), "-local-credentials-stdin")
	for _, limit := range []string{"9", "8", "7"} {
		status, _, body := d.call("POST", "/v1/messages", d.token, `{"model":"openai/gpt-test","max_tokens":`+limit+`,"stream":true,"messages":[{"role":"user","content":"q"}],
			"tools":[{"name":"get_weather","input_schema":{"type":"object"}},{"name":"get_time","input_schema":{"type":"object"}}]}`)
		if status != 200 {
			t.Fatalf("status %d: %s", status, body)
		}
		var calls []string
		inputs := map[string]string{}
		for _, fr := range splitTestSSE(t, string(body)) {
			switch fr.Event {
			case "content_block_start":
				calls = append(calls, jsonAt(t, []byte(fr.Data), "content_block.id"))
			case "content_block_delta":
				in, _ := strconv.Unquote(jsonAt(t, []byte(fr.Data), "delta.partial_json"))
				inputs[jsonAt(t, []byte(fr.Data), "index")] += in
			}
		}
		if limit == "7" {
			if len(calls) != 1 || inputs["0"] != `{"city":"Paris"}` {
				t.Errorf("an id after its call's name: calls %v, input %q; want one call with {\"city\":\"Paris\"}: %s", calls, inputs["0"], body)
			}
			continue
		}
		if got, want := strings.Join(calls, " ")+" "+inputs["0"]+" "+inputs["1"], `"call_a" "call_b" {"city":"Paris"} {}`; got != want {
			t.Errorf("max_tokens %s: calls and inputs = %s, want %s", limit, got, want)
		}
	}
}
