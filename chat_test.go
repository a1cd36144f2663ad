package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func dialectFloatPtr(f float64) *float64 { return &f }

func dialectUserText(s string) message {
	return message{Role: "user", Parts: []part{{Type: partText, Text: s}}}
}

func TestParseChatCompletions(t *testing.T) {
	tests := []struct {
		name string
		body string
		want chatRequest
	}{
		{
			name: "text",
			body: `{"model":"openai/gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
			want: chatRequest{Model: "openai/gpt-4o", Messages: []message{dialectUserText("hi")}},
		},
		{
			name: "system and developer stand where they are, limits, unknown members dropped and named",
			body: `{"model":"m","messages":[{"role":"system","content":"a"},{"role":"user","content":"q"},{"role":"developer","content":[{"type":"text","text":"b"}]}],
				"max_tokens":100,"temperature":0.5,"stream":true,"stream_options":{"include_usage":true},"n":3,"seed":{"x":[1]}}`,
			want: chatRequest{Model: "m", System: "a", Messages: []message{dialectUserText("q"), {Role: "system", Parts: []part{{Type: partText, Text: "b"}}}},
				MaxTokens: 100, LimitName: "max_tokens", Temperature: dialectFloatPtr(0.5), Stream: true, StreamUsage: true, Dropped: []string{"n", "seed"}},
		},
		{
			name: "a tool result after a user's text opens a turn: only tool results in a row share one",
			body: `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"tool","tool_call_id":"c","content":"r"}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q"),
				{Role: "user", Parts: []part{{Type: partToolResult, ToolCallID: "c", Text: "r"}}}}},
		},
		{
			name: "a file by id (no file_data) is a part Brama does not carry: dropped and named",
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"q"},{"type":"file","file":{"file_id":"file-1"}}]}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")}, Dropped: []string{"file"}},
		},
		{
			name: "images",
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},
				{"type":"image_url","image_url":{"url":"https://example.com/a.png","detail":"high"}},
				{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]}`,
			want: chatRequest{Model: "m", Messages: []message{{Role: "user", Parts: []part{
				{Type: partText, Text: "what is this"},
				{Type: partImage, URL: "https://example.com/a.png", Detail: "high"},
				{Type: partImage, URL: "data:image/png;base64,iVBORw0KGgo="},
			}}}},
		},
		{
			name: "tools and tool_choice required",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"tool_choice":"required",
				"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{ "type": "object", "properties": {} }}},
				{"type":"function","function":{"name":"noargs"}}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")}, ToolChoice: &toolChoice{Mode: toolChoiceRequired},
				Tools: []tool{{Type: toolFunction, Name: "get_weather", Description: "Weather now", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}, {Type: toolFunction, Name: "noargs"}}},
		},
		{
			name: "tool calls and tool results",
			body: `{"model":"m","messages":[{"role":"user","content":"q"},
				{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{}"}}]},
				{"role":"tool","tool_call_id":"c1","content":"one"},
				{"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"tw"},{"type":"text","text":"o"}]},
				{"role":"user","content":"thanks"},
				{"role":"assistant","content":"sure","tool_calls":[{"id":"c3","function":{"name":"h","arguments":""}}]}]}`,
			want: chatRequest{Model: "m", Messages: []message{
				dialectUserText("q"),
				{Role: "assistant", Parts: []part{
					{Type: partToolCall, ToolCallID: "c1", ToolName: "f", Arguments: `{"a":1}`},
					{Type: partToolCall, ToolCallID: "c2", ToolName: "g", Arguments: `{}`},
				}},
				{Role: "user", Parts: []part{
					{Type: partToolResult, ToolCallID: "c1", Text: "one"},
					{Type: partToolResult, ToolCallID: "c2", Text: "tw\no"},
				}},
				dialectUserText("thanks"),
				{Role: "assistant", Parts: []part{{Type: partText, Text: "sure"}, {Type: partToolCall, ToolCallID: "c3", ToolName: "h"}}},
			}},
		},
		{
			name: "named tool_choice, max_completion_tokens wins",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"tool_choice":{"type":"function","function":{"name":"f"}},"max_tokens":5,"max_completion_tokens":9}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")}, ToolChoice: &toolChoice{Mode: toolChoiceTool, Name: "f"}, MaxTokens: 9, LimitName: "max_completion_tokens"},
		},
		{
			name: "retired billingTarget is an unknown member, named (SPEC §7.2)",
			body: `{"model":"claude-code/claude-sonnet-4-5","messages":[{"role":"user","content":"q"}],"billingTarget":{"providerId":"claude-code","accountId":"acct","subscriptionId":"sub_1"}}`,
			want: chatRequest{Model: "claude-code/claude-sonnet-4-5", Messages: []message{dialectUserText("q")}, Dropped: []string{"billingTarget"}},
		},
		{
			name: "assistant refusal part dropped and named, null members absent",
			body: `{"model":"m","messages":[{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"refusal","refusal":"no"}]},{"role":"user","content":"q"}],"tool_choice":null,"max_tokens":null}`,
			want: chatRequest{Model: "m", Messages: []message{{Role: "assistant", Parts: []part{{Type: partText, Text: "a"}}}, dialectUserText("q")},
				Dropped: []string{"refusal"}},
		},
		{
			name: "an image beside tool calls is kept (only empty text is no content)",
			body: `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"image_url","image_url":{"url":"https://x/a.png"}},{"type":"text","text":""}],
				"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q"), {Role: "assistant", Parts: []part{
				{Type: partImage, URL: "https://x/a.png"}, {Type: partToolCall, ToolCallID: "c", ToolName: "f", Arguments: "{}"}}}}},
		},
		{
			name: "a lone image beside tool calls is kept",
			body: `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"image_url","image_url":{"url":"https://x/a.png"}}],
				"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q"), {Role: "assistant", Parts: []part{
				{Type: partImage, URL: "https://x/a.png"}, {Type: partToolCall, ToolCallID: "c", ToolName: "f", Arguments: "{}"}}}}},
		},
		{
			name: "stop as one sequence; unknown members of a message and of a tool named (SPEC §7.6)",
			body: `{"model":"m","messages":[{"role":"user","content":"q","name":"bob"}],"stop":"END",
				"tools":[{"type":"function","function":{"name":"f"},"cache_control":{"type":"ephemeral"}}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")}, Stop: []string{"END"}, StopName: "stop",
				Tools: []tool{{Type: toolFunction, Name: "f"}}, Dropped: []string{"name", "cache_control"}},
		},
		{
			name: "a custom tool's result stays custom with its call (SPEC §7.6)",
			body: `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"c1","type":"custom","custom":{"name":"p","input":"x"}}]},
				{"role":"tool","tool_call_id":"c1","content":"ok"}],"tools":[{"type":"custom","custom":{"name":"p"}}]}`,
			want: chatRequest{Model: "m", Tools: []tool{{Type: toolCustom, Name: "p"}}, Messages: []message{dialectUserText("q"),
				{Role: "assistant", Parts: []part{{Type: partToolCall, ToolCallID: "c1", ToolName: "p", Arguments: "x", Custom: true}}},
				{Role: "user", Parts: []part{{Type: partToolResult, ToolCallID: "c1", Text: "ok", Custom: true}}}}},
		},
		{
			name: "unknown members of response_format and its json_schema are named (SPEC §7.6)",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"response_format":{"type":"json_schema","x_a":1,
				"json_schema":{"name":"o","schema":{"type":"object"},"x_b":2}}}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")},
				Output: &outputFormat{Type: "json_schema", Name: "o", Schema: json.RawMessage(`{"type":"object"}`)}, Dropped: []string{"x_a", "x_b"}},
		},
		{
			name: "a tool of another type is named by its type",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"tools":[{"type":"web_search"},{"function":{"name":"f"}}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")}, Dropped: []string{"web_search", "tools"}},
		},
		{
			name: "a tool_choice object of another type (allowed_tools, a hosted tool) is dropped and named",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}}}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")}, Dropped: []string{"tool_choice"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCaller(dialectChat, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// dialectPromptText appears in malformed bodies; no refusal may quote it.
const dialectPromptText = "PROMPT-TEXT-never-echoed"

func TestParseChatCompletionsRefuses(t *testing.T) {
	const u = `{"role":"user","content":"` + dialectPromptText + `"}`
	tests := []struct{ name, body string }{
		{"not JSON", `{"model":`},
		{"trailing garbage", `{"model":"m","messages":[` + u + `]} x`},
		{"array body", `[` + u + `]`},
		{"no model", `{"messages":[` + u + `]}`},
		{"numeric model", `{"model":4,"messages":[` + u + `]}`},
		{"empty model", `{"model":"","messages":[` + u + `]}`},
		{"no messages", `{"model":"m"}`},
		{"empty messages", `{"model":"m","messages":[]}`},
		{"only system", `{"model":"m","messages":[{"role":"system","content":"` + dialectPromptText + `"}]}`},
		{"messages not an array", `{"model":"m","messages":{"role":"user"}}`},
		{"bad role", `{"model":"m","messages":[{"role":"function","content":"` + dialectPromptText + `"}]}`},
		{"user content null", `{"model":"m","messages":[{"role":"user","content":null}]}`},
		{"user content number", `{"model":"m","messages":[{"role":"user","content":5}]}`},
		{"user content empty parts", `{"model":"m","messages":[{"role":"user","content":[]}]}`},
		{"audio part", `{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + dialectPromptText + `"}}]}]}`},
		{"text part without text", `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`},
		{"image_url missing", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`},
		{"image_url without url", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"detail":"low"}}]}]}`},
		{"image_url string", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":"https://x/a.png"}]}]}`},
		{"image_url http", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/` + dialectPromptText + `"}}]}]}`},
		{"system content parts of images", `{"model":"m","messages":[{"role":"system","content":[{"type":"image_url"}]},` + u + `]}`},
		{"system text part without text", `{"model":"m","messages":[{"role":"system","content":[{"type":"text"}]},` + u + `]}`},
		{"system image part holding text", `{"model":"m","messages":[{"role":"system","content":[{"type":"image_url","text":"` + dialectPromptText + `"}]},` + u + `]}`},
		{"assistant with nothing", `{"model":"m","messages":[{"role":"assistant","content":null},` + u + `]}`},
		{"tool call in a user message", `{"model":"m","messages":[{"role":"user","content":"","tool_calls":[{"id":"0","function":{"name":"0"}}]}]}`},
		{"tool call without id", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f"}}]},` + u + `]}`},
		{"tool call of another type", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"custom","function":{"name":"f"}}]},` + u + `]}`},
		{"tool call arguments object", `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":{}}}]},` + u + `]}`},
		{"tool without id", `{"model":"m","messages":[{"role":"tool","content":"r"}]}`},
		{"max_tokens 0", `{"model":"m","messages":[` + u + `],"max_tokens":0}`},
		{"max_tokens negative", `{"model":"m","messages":[` + u + `],"max_tokens":-3}`},
		{"max_tokens fraction", `{"model":"m","messages":[` + u + `],"max_tokens":1.5}`},
		{"max_completion_tokens 0", `{"model":"m","messages":[` + u + `],"max_completion_tokens":0}`},
		{"temperature string", `{"model":"m","messages":[` + u + `],"temperature":"hot"}`},
		{"stream string", `{"model":"m","messages":[` + u + `],"stream":"yes"}`},
		{"tool of another type", `{"model":"m","messages":[` + u + `],"tools":[{"type":"custom","function":{"name":"f"}}]}`},
		{"tools not an array", `{"model":"m","messages":[` + u + `],"tools":{"type":"function","function":{"name":"f"}}}`},
		{"tool without name", `{"model":"m","messages":[` + u + `],"tools":[{"type":"function","function":{}}]}`},
		{"tool parameters array", `{"model":"m","messages":[` + u + `],"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]}`},
		{"tool_choice unknown", `{"model":"m","messages":[` + u + `],"tool_choice":"sometimes"}`},
		{"tool_choice without name", `{"model":"m","messages":[` + u + `],"tool_choice":{"type":"function"}}`},
		{"tool_choice number", `{"model":"m","messages":[` + u + `],"tool_choice":1}`},
		{"response_format of another type", `{"model":"m","messages":[` + u + `],"response_format":{"type":"xml","json_schema":{"name":"o","schema":{"type":"object"}}}}`},
		{"response_format json_schema without a schema", `{"model":"m","messages":[` + u + `],"response_format":{"type":"json_schema","json_schema":{"name":"o"}}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseCaller(dialectChat, []byte(tc.body))
			wantInvalidRequest(t, err)
			if strings.Contains(err.Error(), dialectPromptText) {
				t.Errorf("refusal quotes the prompt: %v", err)
			}
		})
	}
}

func TestRenderChatAnswer(t *testing.T) {
	tests := []struct {
		name        string
		answer      chatAnswer
		wantContent *string
		wantFinish  string
		wantUsage   bool
	}{
		{"text", chatAnswer{Model: "alias", Text: "hi", Finish: finishStop, Usage: usage{1, 2, true}}, dialectStrPtr("hi"), "stop", true},
		{"tool calls only: content null", chatAnswer{Model: "alias", ToolCalls: []toolCall{{ID: "c", Name: "f", Arguments: "{}"}}, Finish: finishToolCalls}, nil, "tool_calls", false},
		{"empty answer: content empty string, finish defaults to stop", chatAnswer{Model: "alias"}, dialectStrPtr(""), "stop", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := renderAnswer(dialectChat, chatRequest{}, tc.answer)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				ID      string
				Object  string
				Created int64
				Model   string
				Choices []struct {
					Message struct {
						Role    string
						Content *string
					}
					FinishReason string `json:"finish_reason"`
				}
				Usage *map[string]int
			}
			mustUnmarshalDialect(t, string(b), &got)
			if !strings.HasPrefix(got.ID, "chatcmpl-") || got.Object != "chat.completion" || got.Created == 0 || got.Model != "alias" || len(got.Choices) != 1 {
				t.Fatalf("envelope wrong: %s", b)
			}
			c := got.Choices[0]
			if c.Message.Role != "assistant" || !cmp.Equal(tc.wantContent, c.Message.Content) || c.FinishReason != tc.wantFinish {
				t.Errorf("choice = %s", b)
			}
			if (got.Usage != nil) != tc.wantUsage {
				t.Errorf("usage present = %v, want %v: %s", got.Usage != nil, tc.wantUsage, b)
			}
			if tc.wantUsage && (*got.Usage)["total_tokens"] != 3 {
				t.Errorf("usage = %v", *got.Usage)
			}
		})
	}
}

func dialectStrPtr(s string) *string { return &s }

// testChatChunk is the part of a chat.completion.chunk the tests read.
type testChatChunk struct {
	Object  string
	Model   string
	Choices []struct {
		Delta struct {
			Role      string
			Content   *string
			ToolCalls []struct {
				Index    int
				ID       string
				Function struct{ Name, Arguments string }
			} `json:"tool_calls"`
		}
		FinishReason *string `json:"finish_reason"`
	}
	Usage *chatUsage
}

// assembleChatStream rebuilds the answer from chunks as the OpenAI SDKs
// do, checking the order SPEC §7.5 fixes: role delta first, finish chunk,
// usage chunk with no choices, then [DONE] last.
func assembleChatStream(t *testing.T, frames []testSSEFrame) chatAnswer {
	t.Helper()
	var a chatAnswer
	var calls []toolCall
	finished := false
	for i, f := range frames {
		if f.Event != "" {
			t.Errorf("chat frame with an event name: %+v", f)
		}
		if f.Data == "[DONE]" {
			if i != len(frames)-1 {
				t.Errorf("[DONE] at %d of %d frames", i, len(frames))
			}
			continue
		}
		if i == len(frames)-1 {
			t.Errorf("last frame is %q, want [DONE]", f.Data)
		}
		var c testChatChunk
		mustUnmarshalDialect(t, f.Data, &c)
		a.Model = c.Model
		if c.Object != "chat.completion.chunk" {
			t.Errorf("object = %q", c.Object)
		}
		if c.Usage != nil {
			if len(c.Choices) != 0 || !finished {
				t.Errorf("usage chunk with choices or before the finish chunk: %s", f.Data)
			}
			a.Usage = usage{InputTokens: c.Usage.PromptTokens, OutputTokens: c.Usage.CompletionTokens, Reported: true}
			if c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
				t.Errorf("total_tokens wrong: %s", f.Data)
			}
			continue
		}
		if len(c.Choices) != 1 {
			t.Fatalf("chunk with %d choices: %s", len(c.Choices), f.Data)
		}
		ch := c.Choices[0]
		if (i == 0) != (ch.Delta.Role == "assistant") {
			t.Errorf("role delta at frame %d: %s", i, f.Data)
		}
		if finished {
			t.Errorf("delta after the finish chunk: %s", f.Data)
		}
		if ch.Delta.Content != nil {
			a.Text += *ch.Delta.Content
		}
		for _, tc := range ch.Delta.ToolCalls {
			if tc.ID != "" {
				if tc.Index != len(calls) {
					t.Errorf("tool call index %d out of order", tc.Index)
				}
				calls = append(calls, toolCall{ID: tc.ID, Name: tc.Function.Name})
			}
			calls[tc.Index].Arguments += tc.Function.Arguments
		}
		if ch.FinishReason != nil {
			a.Finish, finished = *ch.FinishReason, true
		}
	}
	a.ToolCalls = calls
	return a
}

// decodeChatAnswer reads a buffered chat.completion back into an answer.
func decodeChatAnswer(t *testing.T, body []byte) chatAnswer {
	t.Helper()
	var c struct {
		Model   string
		Choices []struct {
			Message struct {
				Content   *string
				ToolCalls []chatToolCall `json:"tool_calls"`
			}
			FinishReason string `json:"finish_reason"`
		}
		Usage *chatUsage
	}
	mustUnmarshalDialect(t, string(body), &c)
	a := chatAnswer{Model: c.Model, Finish: c.Choices[0].FinishReason}
	if p := c.Choices[0].Message.Content; p != nil {
		a.Text = *p
	}
	for _, tc := range c.Choices[0].Message.ToolCalls {
		a.ToolCalls = append(a.ToolCalls, toolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: *tc.Function.Arguments})
	}
	if c.Usage != nil {
		a.Usage = usage{InputTokens: c.Usage.PromptTokens, OutputTokens: c.Usage.CompletionTokens, Reported: true}
	}
	return a
}

// TestChatStreamFinishOnce checks the finish chunk is written once, at
// finish(), after a finish event or without one (then defaulting to stop).
func TestChatStreamFinishOnce(t *testing.T) {
	for _, events := range [][]streamEvent{{{Kind: eventFinish, Finish: finishLength}}, nil} {
		body, _ := runCallerStream(t, dialectChat, events)
		if n := strings.Count(body, `"finish_reason":"`); n != 1 {
			t.Errorf("%d finish chunks in %q", n, body)
		}
		if len(events) == 0 && !strings.Contains(body, `"finish_reason":"stop"`) {
			t.Errorf("finish() without a finish event did not default to stop: %q", body)
		}
	}
}

// TestBufferedAnswerTextAfterACall: a provider's buffered answer goes into the caller's frames in its order; text
// after a call opens a new block, and a chat caller's message still holds all of the text and the call.
func TestBufferedAnswerTextAfterACall(t *testing.T) {
	body := `{"id":"r","object":"response","status":"completed","model":"m","output":[
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a"}]},
		{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"b"}]}]}`
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body))}
	rec, c := httptest.NewRecorder(), call{res: resolution{Provider: providerInfo{id: "openai", protocol: protoOpenAIResponses}}}
	if _, ae := relayBuffered(rec, c, resp, 1, &callerStream{frames: formatOf(dialectChat).frames, model: "alias"}); ae != nil {
		t.Fatal(ae)
	}
	want := chatAnswer{Model: "alias", Text: "ab", Finish: finishToolCalls, ToolCalls: []toolCall{{ID: "c1", Name: "f", Arguments: "{}"}}}
	if diff := cmp.Diff(want, decodeChatAnswer(t, rec.Body.Bytes())); diff != "" {
		t.Errorf("answer mismatch (-want +got):\n%s", diff)
	}
}

// TestBufferedCustomCallWithoutInput: a buffered answer's custom call without input is read as the same call
// streamed is, a custom call with empty input (it was refused as a nameless function call).
func TestBufferedCustomCallWithoutInput(t *testing.T) {
	body := `{"choices":[{"message":{"tool_calls":[{"id":"c1","type":"custom","custom":{"name":"p"}}]}}]}`
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body))}
	rec, c := httptest.NewRecorder(), call{res: resolution{Provider: providerInfo{id: "openai", protocol: protoOpenAIChat}}}
	if _, ae := relayBuffered(rec, c, resp, 1, &callerStream{frames: formatOf(dialectChat).frames, model: "alias"}); ae != nil {
		t.Fatal(ae)
	}
	for _, want := range []string{`"custom":{"name":"p","input":""}`, `"finish_reason":"tool_calls"`} {
		if out := rec.Body.String(); !strings.Contains(out, want) {
			t.Errorf("answer %s lacks %s", out, want)
		}
	}
}

// TestBufferedChatUsageMalformed: a buffered answer whose usage is not one refuses the answer, as a chunk's does a stream.
func TestBufferedChatUsageMalformed(t *testing.T) {
	for _, u := range []string{`"x"`, `{"prompt_tokens":"3"}`} {
		body := `{"choices":[{"message":{"content":"a"}}],"usage":` + u + `}`
		resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body))}
		c := call{res: resolution{Provider: providerInfo{id: "openai", protocol: protoOpenAIChat}}}
		_, ae := relayBuffered(httptest.NewRecorder(), c, resp, 1, &callerStream{frames: formatOf(dialectChat).frames, model: "alias"})
		if ae == nil || ae.Code != "provider_failure" {
			t.Errorf("usage %s: err = %v, want provider_failure", u, ae)
		}
	}
}
