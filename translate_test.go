package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// translationFake is a fake provider of one protocol that keeps the last
// request's headers and body and answers with answer (buffered).
type translationFake struct {
	*fakeProvider
	mu     sync.Mutex // guards header
	header http.Header
}

func newTranslationFake(t *testing.T, answer func(path string) string) *translationFake {
	f := &translationFake{}
	f.fakeProvider = newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		f.mu.Lock()
		f.header = r.Header.Clone()
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer(r.URL.Path))
	})
	return f
}

// translationDaemon starts serve on one translationFake per protocol's direct
// provider (openai, anthropic, openai-responses), each answering a tool call.
func translationDaemon(t *testing.T) (*daemon, map[string]*translationFake) {
	env := stateEnv(t)
	fakes := map[string]*translationFake{
		"openai":           newTranslationFake(t, func(string) string { return chatToolAnswer }),
		"anthropic":        newTranslationFake(t, func(string) string { return messagesToolAnswer }),
		"openai-responses": newTranslationFake(t, func(string) string { return responsesToolAnswer }),
	}
	plain := map[string]*fakeProvider{}
	for id, f := range fakes {
		plain[id] = f.fakeProvider
	}
	return startDaemon(t, env, providerEnv(env, plain), "-local-credentials-stdin"), fakes
}

// jsonAt reads the member at path ("a.b[0].c") of a JSON document, as
// compact JSON text; "" when absent.
func jsonAt(t *testing.T, doc []byte, path string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	for _, step := range regexp.MustCompile(`[^.\[\]]+|\[\d+\]`).FindAllString(path, -1) {
		if strings.HasPrefix(step, "[") {
			i, _ := strconv.Atoi(strings.Trim(step, "[]"))
			a, ok := v.([]any)
			if !ok || i >= len(a) {
				return ""
			}
			v = a[i]
			continue
		}
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		if v, ok = m[step]; !ok {
			return ""
		}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// Answers of each protocol that call the Codex-like request's tools.
const (
	messagesToolAnswer = `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"{\"ok\":true}"},` +
		`{"type":"tool_use","id":"toolu_1","name":"mcp__srv__lookup","input":{"q":"x"}},{"type":"tool_use","id":"toolu_2","name":"apply_patch","input":{"input":"*** Begin Patch"}}],` +
		`"stop_reason":"tool_use","usage":{"input_tokens":3,"output_tokens":4}}`
	chatToolAnswer = `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"{\"ok\":true}","tool_calls":[` +
		`{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`
	responsesToolAnswer = `{"id":"r","object":"response","status":"completed","model":"m","output":[{"type":"message","id":"m1","status":"completed","role":"assistant",` +
		`"content":[{"type":"output_text","text":"{\"ok\":true}","annotations":[]}]},{"type":"function_call","id":"fc","call_id":"call_1","name":"Read","arguments":"{\"file_path\":\"a\"}"}],` +
		`"usage":{"input_tokens":1,"output_tokens":2}}`
)

// Caller bodies modelled on what real clients send.
const (
	claudeCodeLikeBody = `{"model":"openai-responses/gpt-test","max_tokens":32000,"stream":false,
		"system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],
		"metadata":{"user_id":"u"},"thinking":{"type":"enabled","budget_tokens":4096},
		"tools":[{"name":"Read","description":"Read a file","input_schema":{"type":"object","properties":{"file_path":{"type":"string"}}},"cache_control":{"type":"ephemeral"}}],
		"messages":[{"role":"user","content":[{"type":"text","text":"read a","cache_control":{"type":"ephemeral"}}]},
			{"role":"system","content":"Reminder: be careful."},
			{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"tool_use","id":"toolu_0","name":"Read","input":{"file_path":"a"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_0","content":"hello"}]}]}`
	codexLikeBody = `{"model":"anthropic/claude-test","instructions":"You are Codex.","max_output_tokens":32000,"stream":false,"store":false,
		"include":["reasoning.encrypted_content"],"prompt_cache_key":"k","reasoning":{"effort":"high","summary":"auto"},"parallel_tool_calls":false,
		"tools":[{"type":"custom","name":"apply_patch","description":"Patch files","format":{"type":"grammar","syntax":"lark","definition":"start: x"}},
			{"type":"namespace","name":"mcp__srv","description":"A server","tools":[{"type":"function","name":"lookup","description":"Look up","strict":false,"parameters":{"type":"object","properties":{"q":{"type":"string"}}}}]},
			{"type":"web_search","external_web_access":false},
			{"type":"tool_search","execution":"client","description":"Find tools","parameters":{"type":"object"}},
			{"type":"function","name":"exec_command","parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}}],
		"input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"sandbox rules"}]},
			{"type":"message","role":"user","content":[{"type":"input_text","text":"fix it"}]},
			{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"opaque"},
			{"type":"function_call","call_id":"call_0","namespace":"mcp__srv","name":"lookup","arguments":"{\"q\":\"y\"}"},
			{"type":"function_call_output","call_id":"call_0","output":"found"},
			{"type":"custom_tool_call","call_id":"call_p","name":"apply_patch","input":"*** Begin Patch"},
			{"type":"custom_tool_call_output","call_id":"call_p","output":"done"}]}`
)

// TestTranslationAcrossFormats drives real clients' requests through Brama
// to a provider of another format and checks what the provider received,
// what Brama-Dropped names, and what the caller got back.
func TestTranslationAcrossFormats(t *testing.T) {
	d, fakes := translationDaemon(t)

	tests := []struct {
		name, path, body, provider string
		wantUpstream               map[string]string // member path → compact JSON
		wantDropped                string
		wantAnswer                 map[string]string // in the caller's answer
		wantBeta                   string
	}{
		{
			name: "Claude-Code-like messages to openai-responses", path: "/v1/messages", body: claudeCodeLikeBody, provider: "openai-responses",
			wantUpstream: map[string]string{
				"instructions": `"You are Claude Code."`, "max_output_tokens": `32000`, "reasoning.effort": `"medium"`,
				"input[0].content[0].text": `"read a"`, "input[1].role": `"system"`, "input[1].content[0].text": `"Reminder: be careful."`,
				"input[2].type": `"function_call"`, "input[2].name": `"Read"`, "input[2].arguments": `"{\"file_path\":\"a\"}"`,
				"input[3].type": `"function_call_output"`, "input[3].output": `"hello"`,
				"tools[0].name": `"Read"`, "tools[0].parameters.properties.file_path.type": `"string"`,
			},
			wantDropped: "metadata, cache_control, thinking",
			wantAnswer:  map[string]string{"content[1].type": `"tool_use"`, "content[1].name": `"Read"`, "content[1].input.file_path": `"a"`, "stop_reason": `"tool_use"`},
		},
		{
			name: "Codex-like responses to anthropic", path: "/v1/responses", body: codexLikeBody, provider: "anthropic",
			wantUpstream: map[string]string{
				"system": `"You are Codex.\n\nsandbox rules"`, "max_tokens": `32000`, "thinking": ``,
				"messages[0].content[0].text": `"fix it"`,
				"messages[1].content[0].name": `"mcp__srv__lookup"`, "messages[1].content[0].input.q": `"y"`,
				"messages[2].content[0].content": `"found"`,
				"messages[3].content[0].name":    `"apply_patch"`, "messages[3].content[0].input.input": `"*** Begin Patch"`,
				"tools[0].name": `"apply_patch"`, "tools[0].input_schema.properties.input.type": `"string"`,
				"tools[1].name": `"mcp__srv__lookup"`, "tools[2].name": `"exec_command"`,
				"tool_choice.type": `"auto"`, "tool_choice.disable_parallel_tool_use": `true`,
			},
			// A turn continuing a tool loop asks for no thinking: Anthropic
			// wants the earlier thinking blocks back, which responses lacks.
			wantDropped: "include, summary, reasoning, description, web_search, tool_search, store, prompt_cache_key, effort, format",
			wantAnswer: map[string]string{
				"output[1].type": `"function_call"`, "output[1].namespace": `"mcp__srv"`, "output[1].name": `"lookup"`, "output[1].arguments": `"{\"q\":\"x\"}"`,
				"output[2].type": `"custom_tool_call"`, "output[2].name": `"apply_patch"`, "output[2].input": `"*** Begin Patch"`,
			},
		},
		{
			name: "reasoning effort to a thinking budget, which takes temperature's place", path: "/v1/responses", provider: "anthropic",
			body:         `{"model":"anthropic/claude-test","max_output_tokens":32000,"input":"think","reasoning":{"effort":"high"},"temperature":0.3}`,
			wantUpstream: map[string]string{"thinking.type": `"enabled"`, "thinking.budget_tokens": `24576`, "temperature": ``},
			wantDropped:  "temperature",
		},
		{
			name: "reasoning effort to Claude 4.6 and later: adaptive thinking with output_config.effort", path: "/v1/responses", provider: "anthropic",
			body:         `{"model":"anthropic/claude-opus-4-7","max_output_tokens":32000,"input":"think","reasoning":{"effort":"minimal"},"temperature":0.3}`,
			wantUpstream: map[string]string{"thinking.type": `"adaptive"`, "thinking.budget_tokens": ``, "output_config.effort": `"low"`, "temperature": ``},
			wantDropped:  "temperature",
			wantBeta:     effortBeta,
		},
		{
			name: "reasoning effort to a dated Claude 4.5: a budget", path: "/v1/responses", provider: "anthropic",
			body:         `{"model":"anthropic/claude-sonnet-4-5-20250929","max_output_tokens":32000,"input":"think","reasoning":{"effort":"high"}}`,
			wantUpstream: map[string]string{"thinking.type": `"enabled"`, "thinking.budget_tokens": `24576`, "output_config": ``},
		},
		{
			// Found by FuzzParseMessages: a thinking budget must be at least
			// 1024 and below max_tokens, so a small max_tokens leaves none.
			name: "reasoning effort with no room for a thinking budget is named", path: "/v1/chat/completions", provider: "anthropic",
			body:         `{"model":"anthropic/claude-test","max_tokens":500,"messages":[{"role":"user","content":"q"}],"reasoning_effort":"high","temperature":0.3}`,
			wantUpstream: map[string]string{"thinking": ``, "temperature": `0.3`, "max_tokens": `500`},
			wantDropped:  "reasoning_effort",
		},
		{
			name: "reasoning effort none is carried as no thinking, not named", path: "/v1/chat/completions", provider: "anthropic",
			body:         `{"model":"anthropic/claude-test","max_tokens":500,"messages":[{"role":"user","content":"q"}],"reasoning_effort":"none"}`,
			wantUpstream: map[string]string{"thinking": ``, "max_tokens": `500`},
		},
		{
			// The API refuses temperature and top_p beside thinking: both go, named.
			name: "sampling beside a thinking budget is named", path: "/v1/chat/completions", provider: "anthropic",
			body:         `{"model":"anthropic/claude-test","max_tokens":30000,"messages":[{"role":"user","content":"q"}],"reasoning_effort":"high","temperature":0.3,"top_p":0.9}`,
			wantUpstream: map[string]string{"thinking": `{"budget_tokens":24576,"type":"enabled"}`, "temperature": ``, "top_p": ``},
			wantDropped:  "temperature, top_p",
		},
		{
			name: "a messages tool's members with no counterpart are named", path: "/v1/messages", provider: "openai-responses",
			body: `{"model":"openai-responses/gpt-test","max_tokens":100,"messages":[{"role":"user","content":"q"}],
				"tools":[{"name":"f","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}]}`,
			wantUpstream: map[string]string{"tools[0].name": `"f"`, "tools[0].cache_control": ``},
			wantDropped:  "cache_control",
		},
		{
			name: "a member of text with no counterpart is named", path: "/v1/responses", provider: "anthropic",
			body:         `{"model":"anthropic/claude-test","max_output_tokens":100,"input":"q","text":{"format":{"type":"text"},"future_member":1}}`,
			wantUpstream: map[string]string{"future_member": ``, "output_config": ``},
			wantDropped:  "future_member",
		},
		{
			name: "a hosted tool toward chat is named", path: "/v1/responses", provider: "openai",
			body:         `{"model":"openai/gpt-test","input":"hi","tools":[{"type":"web_search"},{"type":"custom","name":"apply_patch"}],"tool_choice":{"type":"custom","name":"apply_patch"},"logit_bias":{"1":2}}`,
			wantUpstream: map[string]string{"tools[0].type": `"custom"`, "tools[0].custom.name": `"apply_patch"`, "tool_choice.custom.name": `"apply_patch"`},
			wantDropped:  "logit_bias, web_search",
		},
		{
			name: "a call without arguments toward chat gets {}, as OpenAI writes none", path: "/v1/responses", provider: "openai",
			body: `{"model":"openai/gpt-test","input":[{"role":"user","content":"q"},{"type":"function_call","call_id":"c","name":"f"},
				{"type":"function_call_output","call_id":"c","output":"r"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]}`,
			wantUpstream: map[string]string{"messages[1].tool_calls[0].function.arguments": `"{}"`},
		},
		{
			name: "chat stop and custom tool toward responses", path: "/v1/chat/completions", provider: "openai-responses",
			body: `{"model":"openai-responses/gpt-test","messages":[{"role":"user","content":[{"type":"text","text":"q"},{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBE","filename":"a.pdf"}}]}],
				"stop":["END"],"top_p":0.5,"seed":7,"reasoning_effort":"low","tools":[{"type":"custom","custom":{"name":"apply_patch","format":{"type":"text"}}}]}`,
			wantUpstream: map[string]string{"top_p": `0.5`, "reasoning.effort": `"low"`, "tools[0].type": `"custom"`, "tools[0].format.type": `"text"`,
				"input[0].content[1].type": `"input_file"`, "input[0].content[1].file_data": `"data:application/pdf;base64,JVBE"`, "input[0].content[1].filename": `"a.pdf"`},
			wantDropped: "seed, stop",
		},
		{
			// Claude Code's Read of a picture: the tool result holds an image.
			name: "a tool result's image toward responses", path: "/v1/messages", provider: "openai-responses",
			body: `{"model":"openai-responses/gpt-test","max_tokens":100,"messages":[{"role":"user","content":"map?"},
				{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Read","input":{"file_path":"m.png"}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"the map"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}]}],
				"tools":[{"name":"Read","input_schema":{"type":"object"}}]}`,
			wantUpstream: map[string]string{"input[2].type": `"function_call_output"`, "input[2].output[0].text": `"the map"`,
				"input[2].output[1].type": `"input_image"`, "input[2].output[1].image_url": `"data:image/png;base64,iVBO"`},
		},
		{
			name: "a tool result's image toward messages", path: "/v1/responses", provider: "anthropic",
			body: `{"model":"anthropic/claude-test","max_output_tokens":100,"input":[{"role":"user","content":"map?"},
				{"type":"function_call","call_id":"call_1","name":"Read","arguments":"{}"},
				{"type":"function_call_output","call_id":"call_1","output":[{"type":"input_text","text":"the map"},{"type":"input_image","image_url":"data:image/png;base64,iVBO","detail":"high"}]}],
				"tools":[{"type":"function","name":"Read","parameters":{"type":"object"}}]}`,
			wantUpstream: map[string]string{"messages[2].content[0].type": `"tool_result"`, "messages[2].content[0].content[0].text": `"the map"`,
				"messages[2].content[0].content[1].source": `{"data":"iVBO","media_type":"image/png","type":"base64"}`},
			wantDropped: "detail",
		},
		{
			name: "a tool result's image toward chat is named", path: "/v1/messages", provider: "openai",
			body: `{"model":"openai/gpt-test","max_tokens":100,"messages":[{"role":"user","content":"map?"},
				{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Read","input":{}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"the map"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}]}],
				"tools":[{"name":"Read","input_schema":{"type":"object"}}]}`,
			wantUpstream: map[string]string{"messages[2].role": `"tool"`, "messages[2].content": `"the map"`},
			wantDropped:  "image",
		},
		{
			// Chat's assistant content is text only: an earlier answer's image or document is named, never lost silently.
			name: "an assistant's image or document toward chat is named", path: "/v1/messages", provider: "openai",
			body: `{"model":"openai/gpt-test","max_tokens":10,"messages":[{"role":"user","content":"hi"},
				{"role":"assistant","content":[{"type":"text","text":"see"},{"type":"image","source":{"type":"url","url":"https://x/y.png"}},
				{"type":"document","source":{"type":"url","url":"https://x/y.pdf"}}]},{"role":"user","content":"ok"}]}`,
			wantUpstream: map[string]string{"messages[1]": `{"content":"see","role":"assistant"}`},
			wantDropped:  "image, document",
		},
		{
			// Anthropic takes a base64 document only as a PDF: a text one is a text source (SPEC §7.6 carries document parts).
			name: "a text document toward messages is a text source, a PDF stays base64", path: "/v1/chat/completions", provider: "anthropic",
			body: `{"model":"anthropic/claude-test","max_tokens":100,"messages":[{"role":"user","content":[{"type":"text","text":"q"},
				{"type":"file","file":{"file_data":"data:text/plain;base64,aGVsbG8=","filename":"a.txt"}},{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBE","filename":"a.pdf"}}]}]}`,
			wantUpstream: map[string]string{"messages[0].content[1].type": `"document"`, "messages[0].content[1].title": `"a.txt"`,
				"messages[0].content[1].source": `{"data":"hello","media_type":"text/plain","type":"text"}`,
				"messages[0].content[2].source": `{"data":"JVBE","media_type":"application/pdf","type":"base64"}`},
		},
		{
			// Claude takes a system message mid-conversation, its content a string or text blocks; an empty one is left out.
			name: "a later system message toward messages is a system turn of text blocks", path: "/v1/chat/completions", provider: "anthropic",
			body: `{"model":"anthropic/claude-test","max_tokens":100,"messages":[{"role":"user","content":"q"},{"role":"system","content":"stay brief"},
				{"role":"assistant","content":"a"},{"role":"developer","content":""},{"role":"user","content":"again"}]}`,
			wantUpstream: map[string]string{"messages[1]": `{"content":[{"text":"stay brief","type":"text"}],"role":"system"}`,
				"messages[2].role": `"assistant"`, "messages[3].role": `"user"`, "messages[4]": ``},
		},
		{
			name: "a text document from messages is a text/plain data URL", path: "/v1/messages", provider: "openai-responses",
			body: `{"model":"openai-responses/gpt-test","max_tokens":100,"messages":[{"role":"user","content":[{"type":"text","text":"q"},
				{"type":"document","source":{"type":"text","media_type":"text/plain","data":"hello"}}]}]}`,
			wantUpstream: map[string]string{"input[0].content[1].type": `"input_file"`, "input[0].content[1].file_data": `"data:text/plain;base64,aGVsbG8="`},
		},
		{
			name: "a document by URL from messages is an input_file's file_url", path: "/v1/messages", provider: "openai-responses",
			body: `{"model":"openai-responses/gpt-test","max_tokens":100,"messages":[{"role":"user","content":[{"type":"text","text":"q"},
				{"type":"document","source":{"type":"url","url":"https://example.com/a.pdf"},"title":"a.pdf"}]}]}`,
			wantUpstream: map[string]string{"input[0].content[1]": `{"file_url":"https://example.com/a.pdf","filename":"a.pdf","type":"input_file"}`},
		},
		{
			name: "a server tool toward chat is named, not made a function", path: "/v1/messages", provider: "openai",
			body: `{"model":"openai/gpt-test","max_tokens":100,"messages":[{"role":"user","content":"q"}],
				"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":3},{"name":"f","input_schema":{"type":"object"}}]}`,
			wantUpstream: map[string]string{"tools[0].function.name": `"f"`, "tools[1]": ``},
			wantDropped:  "web_search_20250305",
		},
		{
			name: "output_config.effort to reasoning effort", path: "/v1/messages", provider: "openai-responses",
			body:         `{"model":"openai-responses/gpt-test","max_tokens":100,"messages":[{"role":"user","content":"q"}],"output_config":{"effort":"high"}}`,
			wantUpstream: map[string]string{"reasoning.effort": `"high"`},
		},
		{
			name: "structured output: chat to messages", path: "/v1/chat/completions", provider: "anthropic",
			body:         `{"model":"anthropic/claude-test","max_tokens":100,"messages":[{"role":"user","content":"q"}],"response_format":{"type":"json_schema","json_schema":{"name":"o","schema":{"type":"object","properties":{"ok":{"type":"boolean"}}},"strict":true}}}`,
			wantUpstream: map[string]string{"output_config.format.type": `"json_schema"`, "output_config.format.schema.properties.ok.type": `"boolean"`},
			wantDropped:  "name", // messages' format has none (SPEC §7.6)
			wantBeta:     structuredOutputsBeta,
			wantAnswer:   map[string]string{"choices[0].message.content": `"{\"ok\":true}"`},
		},
		{
			name: "structured output: chat to responses", path: "/v1/chat/completions", provider: "openai-responses",
			body:         `{"model":"openai-responses/gpt-test","messages":[{"role":"user","content":"q"}],"response_format":{"type":"json_schema","json_schema":{"name":"o","schema":{"type":"object"},"strict":true}}}`,
			wantUpstream: map[string]string{"text.format.type": `"json_schema"`, "text.format.name": `"o"`, "text.format.schema": `{"type":"object"}`, "text.format.strict": `true`},
		},
		{
			name: "JSON mode: chat to responses", path: "/v1/chat/completions", provider: "openai-responses",
			body:         `{"model":"openai-responses/gpt-test","messages":[{"role":"user","content":"q"}],"response_format":{"type":"json_object"}}`,
			wantUpstream: map[string]string{"text.format": `{"type":"json_object"}`},
		},
		{
			name: "JSON mode: responses to chat", path: "/v1/responses", provider: "openai",
			body:         `{"model":"openai/gpt-test","input":"q","text":{"format":{"type":"json_object"}}}`,
			wantUpstream: map[string]string{"response_format": `{"type":"json_object"}`},
		},
		{
			name: "structured output: messages to chat", path: "/v1/messages", provider: "openai",
			body:         `{"model":"openai/gpt-test","max_tokens":100,"messages":[{"role":"user","content":"q"}],"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}}`,
			wantUpstream: map[string]string{"response_format.type": `"json_schema"`, "response_format.json_schema.schema": `{"type":"object"}`, "response_format.json_schema.name": `"output"`},
			wantAnswer:   map[string]string{"content[0].text": `"{\"ok\":true}"`},
		},
		{
			name: "structured output: messages (beta name) to responses", path: "/v1/messages", provider: "openai-responses",
			body:         `{"model":"openai-responses/gpt-test","max_tokens":100,"messages":[{"role":"user","content":"q"}],"output_format":{"type":"json_schema","schema":{"type":"object"}}}`,
			wantUpstream: map[string]string{"text.format.type": `"json_schema"`, "text.format.schema": `{"type":"object"}`},
		},
		{
			name: "structured output: responses to chat", path: "/v1/responses", provider: "openai",
			body:         `{"model":"openai/gpt-test","input":"q","text":{"format":{"type":"json_schema","name":"o","schema":{"type":"object"}}}}`,
			wantUpstream: map[string]string{"response_format.json_schema.name": `"o"`, "response_format.json_schema.schema": `{"type":"object"}`},
			wantAnswer:   map[string]string{"output[0].content[0].text": `"{\"ok\":true}"`},
		},
		{
			name: "structured output: responses to messages", path: "/v1/responses", provider: "anthropic",
			body:         `{"model":"anthropic/claude-test","max_output_tokens":100,"input":"q","text":{"format":{"type":"json_schema","name":"o","description":"d","schema":{"type":"object"}}}}`,
			wantUpstream: map[string]string{"output_config.format.schema": `{"type":"object"}`},
			wantDropped:  "name, description",
			wantBeta:     structuredOutputsBeta,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := fakes[tc.provider]
			before := f.calls.Load()
			status, hdr, body := d.call("POST", tc.path, d.token, tc.body)
			if status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
			if n := f.calls.Load() - before; n != 1 {
				t.Fatalf("provider saw %d calls, want 1", n)
			}
			up := f.body()
			for path, want := range tc.wantUpstream {
				if got := jsonAt(t, up, path); got != want {
					t.Errorf("upstream %s = %s, want %s", path, got, want)
				}
			}
			if got := hdr.Values("Brama-Dropped"); strings.Join(got, ",") != tc.wantDropped || (got == nil) != (tc.wantDropped == "") {
				t.Errorf("Brama-Dropped = %q, want %q (absent when nothing is dropped)", got, tc.wantDropped)
			}
			for path, want := range tc.wantAnswer {
				if got := jsonAt(t, body, path); got != want {
					t.Errorf("answer %s = %s, want %s", path, got, want)
				}
			}
			f.mu.Lock()
			beta := f.header.Get("anthropic-beta")
			f.mu.Unlock()
			if tc.wantBeta != "" && !strings.Contains(beta, tc.wantBeta) {
				t.Errorf("anthropic-beta = %q, want it to hold %q", beta, tc.wantBeta)
			}
		})
	}
	if !strings.Contains(d.stderr.String(), `dropped="metadata, cache_control, thinking"`) && !strings.Contains(d.stderr.String(), `"dropped":"metadata, cache_control, thinking"`) {
		t.Errorf("the log line does not name what was dropped")
	}
}

// TestTranslationRefusesInexpressibleOutput checks JSON mode toward
// messages is refused 400 before any call (SPEC §7.6), as is a tool
// result's image whose data URL is not base64: dropped, it would go silently.
func TestTranslationRefusesInexpressibleOutput(t *testing.T) {
	env := stateEnv(t)
	f := newTranslationFake(t, func(string) string { return messagesToolAnswer })
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f.fakeProvider}), "-local-credentials-stdin")
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"anthropic/claude-test","max_tokens":9,"messages":[{"role":"user","content":"q"}],"response_format":{"type":"json_object"}}`},
		{"/v1/responses", `{"model":"anthropic/claude-test","max_output_tokens":9,"input":"q","text":{"format":{"type":"json_object"}}}`},
		{"/v1/responses", `{"model":"anthropic/claude-test","max_output_tokens":9,"input":[{"role":"user","content":"map?"},
			{"type":"function_call","call_id":"c","name":"Read","arguments":"{}"},
			{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"the map"},{"type":"input_image","image_url":"data:image/png,iVBO"}]}]}`},
	} {
		status, _, body := d.call("POST", tc.path, d.token, tc.body)
		if env := envelopeOf(t, body); status != 400 || env["code"] != "invalid_request" {
			t.Errorf("%s: status %d %v, want 400 invalid_request", tc.path, status, env)
		}
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("provider saw %d calls, want 0", n)
	}
}

// messagesToolStream is an Anthropic stream calling a namespaced tool and
// a custom one, the custom input split across deltas.
const messagesToolStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n" +
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"mcp__srv__lookup\",\"input\":{}}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"q\\\":\\\"x\\\"}\"}}\n\n" +
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"apply_patch\",\"input\":{}}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"input\\\":\\\"*** Begin\"}}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\" Patch\\\"}\"}}\n\n" +
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n" +
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

// TestTranslationStreamsCallsInTheCallersForm checks a streamed answer
// names a namespaced call in its group and gives a custom call its string
// input (held back while the provider streams it as a JSON member), in the
// Responses events and in the chat chunks.
func TestTranslationStreamsCallsInTheCallersForm(t *testing.T) {
	env := stateEnv(t)
	f := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, messagesToolStream)
	})
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f}), "-local-credentials-stdin")

	body := strings.Replace(codexLikeBody, `"stream":false`, `"stream":true`, 1)
	status, _, out := d.call("POST", "/v1/responses", d.token, body)
	if status != 200 {
		t.Fatalf("status %d: %s", status, out)
	}
	var completed []byte
	var customDeltas []string
	for _, fr := range splitTestSSE(t, string(out)) {
		switch fr.Event {
		case "response.completed":
			completed = []byte(fr.Data)
		case "response.custom_tool_call_input.delta":
			customDeltas = append(customDeltas, jsonAt(t, []byte(fr.Data), "delta"))
		case "response.function_call_arguments.delta":
			if got := jsonAt(t, []byte(fr.Data), "delta"); strings.Contains(got, "input") {
				t.Errorf("a custom call's JSON wrapper reached the caller: %s", got)
			}
		}
	}
	if want := []string{`"*** Begin Patch"`}; !slices.Equal(customDeltas, want) {
		t.Errorf("custom input deltas = %v, want %v", customDeltas, want)
	}
	for path, want := range map[string]string{
		"response.output[0].type": `"function_call"`, "response.output[0].namespace": `"mcp__srv"`, "response.output[0].name": `"lookup"`,
		"response.output[0].arguments": `"{\"q\":\"x\"}"`, "response.output[1].type": `"custom_tool_call"`, "response.output[1].name": `"apply_patch"`,
		"response.output[1].input": `"*** Begin Patch"`, "response.status": `"completed"`,
	} {
		if got := jsonAt(t, completed, path); got != want {
			t.Errorf("completed %s = %s, want %s", path, got, want)
		}
	}

	chat := `{"model":"anthropic/claude-test","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"patch"}],
		"tools":[{"type":"custom","custom":{"name":"apply_patch"}},{"type":"function","function":{"name":"mcp__srv__lookup"}}]}`
	status, _, out = d.call("POST", "/v1/chat/completions", d.token, chat)
	if status != 200 {
		t.Fatalf("chat status %d: %s", status, out)
	}
	var input, kinds []string
	for _, fr := range splitTestSSE(t, string(out)) {
		if fr.Data == "[DONE]" {
			continue
		}
		if k := jsonAt(t, []byte(fr.Data), "choices[0].delta.tool_calls[0].type"); k != "" {
			kinds = append(kinds, k)
		}
		if in := jsonAt(t, []byte(fr.Data), "choices[0].delta.tool_calls[0].custom.input"); in != "" && in != `""` {
			input = append(input, in)
		}
	}
	if want := []string{`"function"`, `"custom"`}; !slices.Equal(kinds, want) {
		t.Errorf("chat call kinds = %v, want %v", kinds, want)
	}
	if want := []string{`"*** Begin Patch"`}; !slices.Equal(input, want) {
		t.Errorf("chat custom input = %v, want %v", input, want)
	}
}

// codexCLIBody is what the Codex CLI 0.171 sends (examples/clients): its
// tools in an additional_tools input item, exec a custom tool of the
// functions namespace, a tool turn whose output is an array of parts.
const codexCLIBody = `{"model":"anthropic/claude-test","max_output_tokens":9000,"stream":false,"store":false,"parallel_tool_calls":false,"tool_choice":"auto",
	"reasoning":{"effort":"low","context":"all_turns"},"text":{"verbosity":"low"},"client_metadata":{"a":"b"},
	"input":[{"type":"additional_tools","role":"developer","id":"at_1","tools":[
			{"type":"namespace","name":"functions","tools":[{"type":"custom","name":"exec","description":"Run JavaScript","format":{"type":"text"}},
				{"type":"function","name":"wait","parameters":{"type":"object","properties":{}}}]}]},
		{"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"cat note.txt"}]},
		{"type":"custom_tool_call","id":"ct_1","status":"completed","namespace":"functions","name":"exec","call_id":"call_1","input":"text(1)"},
		{"type":"custom_tool_call_output","call_id":"call_1","output":[{"type":"input_text","text":"hello"}]}]}`

// TestTranslationCodexCLIToMessages checks the Codex CLI's own request
// reaches a messages provider with its tools and comes back in its form.
func TestTranslationCodexCLIToMessages(t *testing.T) {
	env := stateEnv(t)
	f := newTranslationFake(t, func(string) string {
		return `{"id":"m","type":"message","role":"assistant","model":"m","content":[{"type":"tool_use","id":"toolu_9","name":"functions__exec","input":{"input":"text(2)"}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":1}}`
	})
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f.fakeProvider}), "-local-credentials-stdin")
	status, hdr, body := d.call("POST", "/v1/responses", d.token, codexCLIBody)
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	up := f.body()
	for path, want := range map[string]string{
		"tools[0].name": `"functions__exec"`, "tools[0].input_schema.properties.input.type": `"string"`, "tools[1].name": `"functions__wait"`,
		"system": `"You are Codex."`, "messages[1].content[0].name": `"functions__exec"`, "messages[1].content[0].input.input": `"text(1)"`,
		"messages[2].content[0].content": `"hello"`, "tool_choice.disable_parallel_tool_use": `true`,
	} {
		if got := jsonAt(t, up, path); got != want {
			t.Errorf("upstream %s = %s, want %s", path, got, want)
		}
	}
	for path, want := range map[string]string{
		"output[0].type": `"custom_tool_call"`, "output[0].namespace": `"functions"`, "output[0].name": `"exec"`, "output[0].input": `"text(2)"`,
		"output[0].call_id": `"toolu_9"`,
	} {
		if got := jsonAt(t, body, path); got != want {
			t.Errorf("answer %s = %s, want %s", path, got, want)
		}
	}
	if got, want := hdr.Get("Brama-Dropped"), "client_metadata, context, store, effort, verbosity, format"; got != want {
		t.Errorf("Brama-Dropped = %q, want %q", got, want)
	}
}

// chatInterleavedStream is an OpenAI-compatible stream that starts two
// parallel calls in one chunk, then alternates their arguments.
const chatInterleavedStream = `data: {"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[` +
	`{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}},` +
	`{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":""}}]}}]}` + "\n\n" +
	`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}` + "\n\n" +
	`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"city\":"}}]}}]}` + "\n\n" +
	`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Oslo\"}"}}]}}]}` + "\n\n" +
	`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"Rome\"}"}}]}}]}` + "\n\n" +
	`data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\n" + "data: [DONE]\n\n"

// TestTranslationInterleavedParallelCalls checks that parallel calls whose
// arguments a chat provider interleaves reach a messages caller as blocks
// whose every delta comes before their stop, and a responses caller as items
// whose every delta comes before their done: Claude Code and the Vercel AI
// SDK take a call's input at its stop and ignore what follows.
func TestTranslationInterleavedParallelCalls(t *testing.T) {
	env := stateEnv(t)
	f := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, chatInterleavedStream)
	})
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"openai": f}), "-local-credentials-stdin")
	tools := `"tools":[{"name":"get_weather","input_schema":{"type":"object"}},{"name":"get_time","input_schema":{"type":"object"}}]`
	for _, tc := range []struct{ path, body, delta, end, index string }{
		{"/v1/messages", `{"model":"openai/gpt-test","max_tokens":99,"stream":true,"messages":[{"role":"user","content":"q"}],` + tools + `}`,
			"content_block_delta", "content_block_stop", "index"},
		{"/v1/responses", `{"model":"openai/gpt-test","stream":true,"input":"q","tools":[{"type":"function","name":"get_weather"},{"type":"function","name":"get_time"}]}`,
			"response.function_call_arguments.delta", "response.output_item.done", "output_index"},
	} {
		status, _, out := d.call("POST", tc.path, d.token, tc.body)
		if status != 200 {
			t.Fatalf("%s: status %d: %s", tc.path, status, out)
		}
		args, ended := map[string]string{}, map[string]bool{}
		for _, fr := range splitTestSSE(t, string(out)) {
			i := jsonAt(t, []byte(fr.Data), tc.index)
			switch fr.Event {
			case tc.delta:
				if ended[i] {
					t.Errorf("%s: a delta for %s %s after its end: %s", tc.path, tc.index, i, fr.Data)
				}
				var d string
				json.Unmarshal([]byte(cmp.Or(jsonAt(t, []byte(fr.Data), "delta.partial_json"), jsonAt(t, []byte(fr.Data), "delta"))), &d)
				args[i] += d
			case tc.end:
				ended[i] = true
			}
		}
		if got := slices.Sorted(maps.Values(args)); !slices.Equal(got, []string{`{"city":"Oslo"}`, `{"city":"Rome"}`}) {
			t.Errorf("%s: the calls' arguments = %q, want both cities", tc.path, got)
		}
	}
}

// TestToolArgumentsNotAnObject: a chat provider's call arguments that are
// not a JSON object (cut at max_tokens, or plain text) never reach a
// Messages caller as input {} (the tool would run on nothing): its answer is
// refused provider_incomplete, buffered with the 502 after the one call,
// streamed in-band before the block's end (SPEC §17). A Responses caller
// gets them as the provider sent them: its arguments are a string.
func TestToolArgumentsNotAnObject(t *testing.T) {
	var args atomic.Value
	chunk := func(delta, finish string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}` + "\n\n"
	}
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		a := args.Load().(string)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,
				"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":`+strconv.Quote(a)+`}}]},"finish_reason":"length"}],
				"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}`, "null")+
			chunk(`{"tool_calls":[{"index":0,"function":{"arguments":`+strconv.Quote(a)+`}}]}`, "null")+
			chunk(`{}`, `"length"`)+`data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`+"\n\ndata: [DONE]\n\n")
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	env["BRAMA_REPLAY_GUARD_SECS"] = "0" // each case repeats the request
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	for _, a := range []string{`{"city":`, `Paris, please`, `["Paris"]`, `{"city":"Paris"}`} {
		args.Store(a)
		usable := a == `{"city":"Paris"}`
		for _, dialect := range []string{dialectMessages, dialectResponses} {
			for _, stream := range []bool{false, true} {
				before := fake.calls.Load()
				resp := d.openStream(dialectPaths[dialect], d.token, chatBody(dialect, "openai/gpt-test", stream, ""))
				body, readErr := io.ReadAll(resp.Body) // an error: the stream was aborted
				resp.Body.Close()
				status, hdr := resp.StatusCode, resp.Header
				what := fmt.Sprintf("%s stream=%v arguments %s", dialect, stream, a)
				if got := fake.calls.Load() - before; got != 1 || hdr.Get("Brama-Attempts") != "1" {
					t.Errorf("%s: provider saw %d calls, Brama-Attempts %q; want 1", what, got, hdr.Get("Brama-Attempts"))
				}
				s := string(body)
				switch {
				case dialect == dialectResponses:
					quoted := strconv.Quote(a)
					if status != 200 || !strings.Contains(s, `"arguments":`+quoted) || strings.Contains(s, `"arguments":"{}"`) {
						t.Errorf("%s: %d %s, want 200 carrying the arguments as sent", what, status, s)
					}
				case usable:
					if status != 200 || !strings.Contains(strings.ReplaceAll(s, `\"`, `"`), `"city":"Paris"`) || !strings.Contains(s, "tool_use") {
						t.Errorf("%s: %d %s, want 200 with the call's input", what, status, s)
					}
				case !stream:
					if status != 502 || envelopeOf(t, body)["code"] != "provider_incomplete" {
						t.Errorf("%s: %d %s, want 502 provider_incomplete", what, status, s)
					}
				default:
					if status != 200 || readErr == nil || !strings.Contains(s, "event: error") || !strings.Contains(s, `"code":"provider_incomplete"`) ||
						strings.Contains(s, "message_stop") || strings.Contains(s, "content_block_stop") {
						t.Errorf("%s: %d %s, want the in-band provider_incomplete before the block's end, no message_stop", what, status, s)
					}
				}
				if !stream && strings.Contains(s, `"input":{}`) { // a stream's content_block_start always holds input {}
					t.Errorf("%s: the call reached the caller as input {}: %s", what, s)
				}
			}
		}
	}
}
