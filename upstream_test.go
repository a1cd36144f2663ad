package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// everyPart is a neutral request that uses every part kind.
func everyPart(stream bool) chatRequest {
	temp := 0.2
	return chatRequest{
		Model:  "my-alias",
		System: "Be brief.",
		Messages: []message{
			{Role: "user", Parts: []part{
				{Type: partText, Text: "What is in this picture, and the weather?"},
				{Type: partImage, URL: "data:image/png;base64,iVBORw0KGgo="},
				{Type: partImage, URL: "https://example.com/cat.jpg"},
			}},
			{Role: "assistant", Parts: []part{
				{Type: partText, Text: "Let me check."},
				{Type: partToolCall, ToolCallID: "call_1", ToolName: "get_weather", Arguments: `{"city":"Paris"}`},
			}},
			{Role: "user", Parts: []part{
				{Type: partToolResult, ToolCallID: "call_1", Text: "18C, sunny", IsError: false},
				{Type: partText, Text: "Thanks."},
			}},
		},
		Tools: []tool{
			{Type: toolFunction, Name: "get_weather", Description: "Weather for a city", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)},
			{Type: toolFunction, Name: "get_time"},
		},
		ToolChoice:  &toolChoice{Mode: toolChoiceTool, Name: "get_weather"},
		MaxTokens:   256,
		Temperature: &temp,
		Stream:      stream,
	}
}

func TestBuildUpstreamRequest(t *testing.T) {
	openai, _ := lookupProvider("openai")
	anthropic, _ := lookupProvider("anthropic")
	claudeCode, _ := lookupProvider("claude-code")
	responses, _ := lookupProvider("openai-responses")
	codex, _ := lookupProvider("codex")
	kimi, _ := lookupProvider("kimi")
	weatherSchema := `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`
	empty := `{"type":"object","properties":{}}`

	chatBody := func(stream bool) string {
		s := `{"model":"gpt-4o","max_tokens":256,"temperature":0.2,
		  "messages":[
		    {"role":"system","content":"Be brief."},
		    {"role":"user","content":[
		      {"type":"text","text":"What is in this picture, and the weather?"},
		      {"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},
		      {"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]},
		    {"role":"assistant","content":"Let me check.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
		    {"role":"tool","tool_call_id":"call_1","content":"18C, sunny"},
		    {"role":"user","content":"Thanks."}],
		  "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather for a city","parameters":` + weatherSchema + `}},
		           {"type":"function","function":{"name":"get_time"}}],
		  "tool_choice":{"type":"function","function":{"name":"get_weather"}}`
		if stream {
			s += `,"stream":true,"stream_options":{"include_usage":true}`
		}
		return s + "}"
	}
	anthropicBody := func(system string) string {
		return `{"model":"claude-sonnet-4-5","max_tokens":256,"temperature":0.2,"stream":true,"system":` + system + `,
		  "messages":[
		    {"role":"user","content":[
		      {"type":"text","text":"What is in this picture, and the weather?"},
		      {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
		      {"type":"image","source":{"type":"url","url":"https://example.com/cat.jpg"}}]},
		    {"role":"assistant","content":[
		      {"type":"text","text":"Let me check."},
		      {"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}}]},
		    {"role":"user","content":[
		      {"type":"tool_result","tool_use_id":"call_1","content":"18C, sunny"},
		      {"type":"text","text":"Thanks."}]}],
		  "tools":[{"name":"get_weather","description":"Weather for a city","input_schema":` + weatherSchema + `},
		           {"name":"get_time","input_schema":` + empty + `}],
		  "tool_choice":{"type":"tool","name":"get_weather"}}`
	}
	responsesInput := `[
	    {"type":"message","role":"user","content":[
	      {"type":"input_text","text":"What is in this picture, and the weather?"},
	      {"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo="},
	      {"type":"input_image","image_url":"https://example.com/cat.jpg"}]},
	    {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Let me check."}]},
	    {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
	    {"type":"function_call_output","call_id":"call_1","output":"18C, sunny"},
	    {"type":"message","role":"user","content":[{"type":"input_text","text":"Thanks."}]}]`
	responsesTools := `[{"type":"function","name":"get_weather","description":"Weather for a city","parameters":` + weatherSchema + `,"strict":false},
	    {"type":"function","name":"get_time","parameters":` + empty + `,"strict":false}]`

	tests := []struct {
		name    string
		p       providerInfo
		cred    upstreamCredential
		req     chatRequest
		model   string
		url     string
		headers map[string]string // "" means must be absent
		body    string
	}{
		{"openai buffered", openai, upstreamCredential{APIKey: "sk-direct"}, everyPart(false), "gpt-4o",
			"https://base.test/v1/chat/completions",
			map[string]string{"Authorization": "Bearer sk-direct", "Content-Type": "application/json", "x-api-key": ""},
			strings.Replace(chatBody(false), `"max_tokens"`, `"max_completion_tokens"`, 1)}, // its reasoning models refuse max_tokens
		{"openai stream", openai, upstreamCredential{APIKey: "sk-direct"}, everyPart(true), "gpt-4o",
			"https://base.test/v1/chat/completions",
			map[string]string{"Authorization": "Bearer sk-direct", "Accept": "text/event-stream"},
			strings.Replace(chatBody(true), `"max_tokens"`, `"max_completion_tokens"`, 1)},
		{"kimi oauth", kimi, upstreamCredential{AccessToken: "kimi-token"}, everyPart(true), "gpt-4o",
			"https://base.test/v1/chat/completions",
			map[string]string{"Authorization": "Bearer kimi-token"},
			chatBody(true)},
		{"anthropic", anthropic, upstreamCredential{APIKey: "sk-ant-direct"}, everyPart(true), "claude-sonnet-4-5",
			"https://base.test/v1/v1/messages",
			map[string]string{"x-api-key": "sk-ant-direct", "anthropic-version": "2023-06-01", "Authorization": "", "anthropic-beta": ""},
			anthropicBody(`"Be brief."`)},
		{"claude-code oauth", claudeCode, upstreamCredential{AccessToken: "oauth-access"}, everyPart(true), "claude-sonnet-4-5",
			"https://base.test/v1/v1/messages",
			map[string]string{"Authorization": "Bearer oauth-access", "anthropic-version": "2023-06-01", "anthropic-beta": "oauth-2025-04-20", "x-api-key": ""},
			anthropicBody(`[{"type":"text","text":"You are Claude Code, Anthropic's official CLI for Claude."},{"type":"text","text":"Be brief."}]`)},
		{"openai-responses", responses, upstreamCredential{APIKey: "sk-direct"}, everyPart(false), "o3-pro",
			"https://base.test/v1/responses",
			map[string]string{"Authorization": "Bearer sk-direct", "OpenAI-Beta": "", "originator": ""},
			`{"model":"o3-pro","instructions":"Be brief.","max_output_tokens":256,"temperature":0.2,
			  "input":` + responsesInput + `,"tools":` + responsesTools + `,
			  "tool_choice":{"type":"function","name":"get_weather"}}`},
		{"codex buffered caller", codex, upstreamCredential{AccessToken: "codex-access", AccountID: "acct-123"}, everyPart(false), "gpt-5-codex",
			"https://base.test/v1/responses",
			map[string]string{"Authorization": "Bearer codex-access", "chatgpt-account-id": "acct-123", "OpenAI-Beta": "responses=experimental", "originator": "codex_cli_rs", "Accept": "text/event-stream"},
			`{"model":"gpt-5-codex","instructions":"Be brief.","stream":true,"store":false,
			  "input":` + responsesInput + `,"tools":` + responsesTools + `,
			  "tool_choice":{"type":"function","name":"get_weather"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hr, err := buildUpstreamRequest(context.Background(), call{res: resolution{Provider: tt.p, Model: tt.model}, baseURL: "https://base.test/v1", cred: tt.cred}, &tt.req)
			if err != nil {
				t.Fatalf("buildUpstreamRequest: %v", err)
			}
			if hr.Method != http.MethodPost || hr.URL.String() != tt.url {
				t.Errorf("request = %s %s, want POST %s", hr.Method, hr.URL, tt.url)
			}
			for k, want := range tt.headers {
				if got := hr.Header.Get(k); got != want {
					t.Errorf("header %s = %q, want %q", k, got, want)
				}
			}
			got := decodeJSON(t, hr.Body)
			var want any
			if err := json.Unmarshal([]byte(tt.body), &want); err != nil {
				t.Fatalf("bad expected body: %v", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

func decodeJSON(t *testing.T, r io.Reader) any {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("body is not JSON: %v", err)
	}
	return v
}

func TestBuildUpstreamRequestDetails(t *testing.T) {
	codex, _ := lookupProvider("codex")
	anthropic, _ := lookupProvider("anthropic")
	claudeCode, _ := lookupProvider("claude-code")
	local, _ := lookupProvider("local-openai")
	plain := chatRequest{Messages: []message{{Role: "user", Parts: []part{{Type: partText, Text: "hi"}}}}}
	tests := []struct {
		name  string
		p     providerInfo
		cred  upstreamCredential
		req   chatRequest
		check func(t *testing.T, hr *http.Request, body map[string]any)
	}{
		{"codex default instructions and no max_output_tokens", codex, upstreamCredential{AccessToken: "t"},
			chatRequest{Messages: plain.Messages, MaxTokens: 99}, func(t *testing.T, hr *http.Request, body map[string]any) {
				if body["instructions"] != codexDefaultInstructions {
					t.Errorf("instructions = %v", body["instructions"])
				}
				if _, ok := body["max_output_tokens"]; ok {
					t.Errorf("codex body has max_output_tokens")
				}
				if hr.Header.Get("chatgpt-account-id") != "" {
					t.Errorf("chatgpt-account-id sent without an account")
				}
			}},
		{"claude-code without caller system", claudeCode, upstreamCredential{AccessToken: "t"}, plain,
			func(t *testing.T, hr *http.Request, body map[string]any) {
				want := []any{map[string]any{"type": "text", "text": claudeCodeIdentity}}
				if diff := cmp.Diff(want, body["system"]); diff != "" {
					t.Errorf("system (-want +got):\n%s", diff)
				}
			}},
		{"claude-code with an agent's API key", claudeCode, upstreamCredential{APIKey: "sk-ant-own"}, plain,
			func(t *testing.T, hr *http.Request, body map[string]any) {
				if hr.Header.Get("x-api-key") != "sk-ant-own" || hr.Header.Get("anthropic-beta") != "" {
					t.Errorf("headers = %v", hr.Header)
				}
			}},
		{"anthropic omits max_tokens 0 and empty system", anthropic, upstreamCredential{APIKey: "k"}, plain,
			func(t *testing.T, hr *http.Request, body map[string]any) {
				for _, k := range []string{"max_tokens", "system", "tools", "tool_choice", "temperature", "stream"} {
					if _, ok := body[k]; ok {
						t.Errorf("body has %s", k)
					}
				}
			}},
		{"local-openai sends no credential", local, upstreamCredential{}, plain,
			func(t *testing.T, hr *http.Request, body map[string]any) {
				if hr.Header.Get("Authorization") != "" {
					t.Errorf("Authorization sent")
				}
				if _, ok := body["max_tokens"]; ok {
					t.Errorf("body has max_tokens")
				}
			}},
		{"tool choice modes", anthropic, upstreamCredential{APIKey: "k"},
			chatRequest{Messages: plain.Messages, ToolChoice: &toolChoice{Mode: toolChoiceRequired}},
			func(t *testing.T, hr *http.Request, body map[string]any) {
				if diff := cmp.Diff(map[string]any{"type": "any"}, body["tool_choice"]); diff != "" {
					t.Errorf("tool_choice (-want +got):\n%s", diff)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hr, err := buildUpstreamRequest(context.Background(), call{res: resolution{Provider: tt.p, Model: "m"}, baseURL: "http://127.0.0.1:1/v1", cred: tt.cred}, &tt.req)
			if err != nil {
				t.Fatalf("buildUpstreamRequest: %v", err)
			}
			body, _ := decodeJSON(t, hr.Body).(map[string]any)
			tt.check(t, hr, body)
		})
	}
}

func TestBuildUpstreamRequestRefuses(t *testing.T) {
	anthropic, _ := lookupProvider("anthropic")
	tests := []struct {
		name string
		p    part
	}{
		{"data URL without base64", part{Type: partImage, URL: "data:image/png,abc"}},
		{"data URL without media type", part{Type: partImage, URL: "data:;base64,abc"}},
		{"arguments not an object", part{Type: partToolCall, ToolCallID: "c", ToolName: "f", Arguments: "[1]"}},
		{"arguments not JSON", part{Type: partToolCall, ToolCallID: "c", ToolName: "f", Arguments: "{"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := chatRequest{Messages: []message{{Role: "assistant", Parts: []part{tt.p}}}}
			_, err := buildUpstreamRequest(context.Background(), call{res: resolution{Provider: anthropic, Model: "m"}, baseURL: "https://x.test", cred: upstreamCredential{APIKey: "k"}}, &req)
			var ae *apiError
			if !errors.As(err, &ae) || ae.Code != "invalid_request" {
				t.Errorf("err = %v, want invalid_request", err)
			}
		})
	}
}

func TestDecodeUpstreamAnswer(t *testing.T) {
	tests := []struct {
		name     string
		protocol string
		body     string
		want     chatAnswer
	}{
		{"chat text", protoOpenAIChat,
			`{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello.","refusal":null},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`,
			chatAnswer{Text: "Hello.", Finish: finishStop, Usage: usage{9, 2, true}}},
		{"chat tool calls", protoOpenAIChat,
			`{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}]}`,
			chatAnswer{ToolCalls: []toolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}, Finish: finishToolCalls}},
		{"chat length, content parts", protoOpenAIChat,
			`{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
			chatAnswer{Text: "ab", Finish: finishLength, Usage: usage{1, 2, true}}},
		{"chat refusal part", protoOpenAIChat, // its text kept and the finish content_filter, as a refusal member's
			`{"choices":[{"message":{"content":[{"type":"refusal","refusal":"no"}]},"finish_reason":"stop"}]}`,
			chatAnswer{Text: "no", Finish: finishContentFilter}},
		{"anthropic text", protoAnthropic,
			`{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hello."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"cache_read_input_tokens":4,"output_tokens":3}}`,
			chatAnswer{Text: "Hello.", Finish: finishStop, Usage: usage{14, 3, true}}},
		{"anthropic tool use", protoAnthropic,
			`{"type":"message","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city": "Paris"}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":1}}`,
			chatAnswer{Text: "Checking.", ToolCalls: []toolCall{{ID: "toolu_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}, Finish: finishToolCalls, Usage: usage{1, 1, true}}},
		{"anthropic max tokens", protoAnthropic,
			`{"type":"message","content":[{"type":"text","text":"abc"}],"stop_reason":"max_tokens"}`,
			chatAnswer{Text: "abc", Finish: finishLength}},
		{"anthropic stop sequence", protoAnthropic,
			`{"type":"message","content":[],"stop_reason":"stop_sequence"}`,
			chatAnswer{Finish: finishStop}},
		{"responses text and call", protoOpenAIResponses,
			`{"id":"resp_1","object":"response","status":"completed","output":[{"type":"reasoning","summary":[]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]},{"type":"function_call","call_id":"call_1","name":"f","arguments":"{}"}],"usage":{"input_tokens":5,"output_tokens":6,"total_tokens":11}}`,
			chatAnswer{Text: "Hi", ToolCalls: []toolCall{{ID: "call_1", Name: "f", Arguments: "{}"}}, Finish: finishToolCalls, Usage: usage{5, 6, true}}},
		{"responses incomplete", protoOpenAIResponses,
			`{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","content":[{"type":"output_text","text":"cut"}]}]}`,
			chatAnswer{Text: "cut", Finish: finishLength}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeUpstreamAnswer(tt.protocol, []byte(tt.body))
			if err != nil {
				t.Fatalf("decodeUpstreamAnswer: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeUpstreamAnswerMalformed(t *testing.T) {
	tests := []struct {
		name, protocol, body string
	}{
		{"chat not JSON", protoOpenAIChat, `<html>bad gateway</html>`},
		{"chat no choices", protoOpenAIChat, `{"choices":[]}`},
		{"chat error body", protoOpenAIChat, `{"error":{"message":"x"},"choices":[{"message":{"content":"a"}}]}`},
		{"chat bad content", protoOpenAIChat, `{"choices":[{"message":{"content":7}}]}`},
		{"chat nameless tool call", protoOpenAIChat, `{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}}]}`},
		{"anthropic not a message", protoAnthropic, `{"type":"error","error":{"type":"api_error","message":"x"}}`},
		{"anthropic truncated", protoAnthropic, `{"type":"message","content":[`},
		{"anthropic nameless tool", protoAnthropic, `{"type":"message","content":[{"type":"tool_use","id":"t","input":{}}]}`},
		{"responses failed", protoOpenAIResponses, `{"status":"failed","error":{"code":"server_error"},"output":[]}`},
		{"responses wrong shape", protoOpenAIResponses, `{"status":"completed","output":{}}`},
		{"responses usage not an object", protoOpenAIResponses, `{"status":"completed","output":[],"usage":"many"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeUpstreamAnswer(tt.protocol, []byte(tt.body))
			var ae *apiError
			if !errors.As(err, &ae) || ae.Code != "provider_failure" {
				t.Fatalf("err = %v, want provider_failure", err)
			}
			if len(tt.body) > 8 && strings.Contains(ae.Message, tt.body) {
				t.Errorf("message %q quotes the body", ae.Message)
			}
		})
	}
}

func FuzzDecodeUpstream(f *testing.F) {
	f.Add(protoOpenAIChat, []byte(`{"choices":[{"message":{"content":"hi","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"stop"}]}`))
	f.Add(protoAnthropic, []byte(`{"type":"message","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}],"stop_reason":"tool_use","usage":{"input_tokens":1}}`))
	f.Add(protoOpenAIResponses, []byte(`{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}]}`))
	f.Fuzz(func(t *testing.T, protocol string, body []byte) {
		a, err := decodeUpstreamAnswer(protocol, body)
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) || ae.Code != "provider_failure" {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		switch a.Finish {
		case finishStop, finishLength, finishToolCalls, finishContentFilter:
		default:
			t.Fatalf("finish %q is not neutral", a.Finish)
		}
		for _, tc := range a.ToolCalls {
			if tc.Name == "" {
				t.Fatalf("accepted a tool call without a name")
			}
		}
	})
}

// TestCodexDropsWhatItsBackendRefuses: toward codex a translated request loses, and names, its output limit,
// temperature, top_p, metadata, safety_identifier and user, which the backend refuses (SPEC §6.2); store goes false.
func TestCodexDropsWhatItsBackendRefuses(t *testing.T) {
	codex, _ := lookupProvider("codex")
	half := 0.5
	req := chatRequest{MaxTokens: 100, LimitName: "max_completion_tokens", Temperature: &half, TopP: &half,
		Shared:   openAIShared{Store: json.RawMessage(`true`), Metadata: json.RawMessage(`{"a":"b"}`), SafetyIdentifier: json.RawMessage(`"s"`), User: json.RawMessage(`"u"`)},
		Messages: []message{{Role: "user", Parts: []part{{Type: partText, Text: "hi"}}}}}
	hr, err := buildUpstreamRequest(context.Background(), call{res: resolution{Provider: codex, Model: "gpt-5-codex"}, baseURL: "https://base.test/v1",
		cred: upstreamCredential{AccessToken: "codex-access", AccountID: "acct-123"}}, &req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(hr.Body)
	want := `{"model":"gpt-5-codex","stream":true,"instructions":"You are a helpful assistant.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}],"store":false}`
	if string(b) != want {
		t.Errorf("body\n got %s\nwant %s", b, want)
	}
	if diff := cmp.Diff([]string{"max_completion_tokens", "temperature", "top_p", "metadata", "safety_identifier", "user"}, req.Dropped); diff != "" {
		t.Errorf("dropped (-want +got):\n%s", diff)
	}
}
