package main

import (
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseMessages(t *testing.T) {
	tests := []struct {
		name string
		body string
		want chatRequest
	}{
		{
			name: "text, string system, limits, unknown members dropped",
			body: `{"model":"anthropic/claude-sonnet-4-5","system":"be brief","max_tokens":1024,"temperature":0.2,"stream":true,
				"metadata":{"user_id":"u"},"stop_sequences":["x"],"thinking":{"type":"enabled","budget_tokens":100},
				"messages":[{"role":"user","content":"hi"}]}`,
			want: chatRequest{Model: "anthropic/claude-sonnet-4-5", System: "be brief", MaxTokens: 1024, LimitName: "max_tokens", Temperature: dialectFloatPtr(0.2), Stream: true,
				Stop: []string{"x"}, StopName: "stop_sequences", Effort: "minimal", EffortName: "thinking", Messages: []message{dialectUserText("hi")}, Dropped: []string{"metadata"}},
		},
		{
			name: "system blocks join, max_tokens may be absent",
			body: `{"model":"m","system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],
				"messages":[{"role":"user","content":[{"type":"text","text":"q"}]}]}`,
			want: chatRequest{Model: "m", System: "a\n\nb", Messages: []message{dialectUserText("q")}, Dropped: []string{"cache_control"}},
		},
		{
			name: "images",
			body: `{"model":"m","messages":[{"role":"user","content":[
				{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"/9j/4AAQ"}},
				{"type":"image","source":{"type":"url","url":"https://example.com/b.png"}},
				{"type":"text","text":"compare"}]}]}`,
			want: chatRequest{Model: "m", Messages: []message{{Role: "user", Parts: []part{
				{Type: partImage, URL: "data:image/jpeg;base64,/9j/4AAQ"},
				{Type: partImage, URL: "https://example.com/b.png"},
				{Type: partText, Text: "compare"},
			}}}},
		},
		{
			name: "tools, tool_use, tool_result, thinking dropped",
			body: `{"model":"m","tools":[{"name":"get_weather","description":"Weather","input_schema":{"type":"object", "properties":{"city":{"type":"string"}}}}],
				"tool_choice":{"type":"any"},
				"messages":[{"role":"user","content":"weather?"},
				{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"text","text":"checking"},
					{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city": "Paris"}},{"type":"tool_use","id":"toolu_2","name":"get_weather"}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"},
					{"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"rain"},{"type":"text","text":"cold"}],"is_error":true},
					{"type":"text","text":"and?"}]}]}`,
			want: chatRequest{Model: "m",
				Tools:      []tool{{Type: toolFunction, Name: "get_weather", Description: "Weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)}},
				ToolChoice: &toolChoice{Mode: toolChoiceRequired},
				Messages: []message{
					dialectUserText("weather?"),
					{Role: "assistant", Parts: []part{
						{Type: partText, Text: "checking"},
						{Type: partToolCall, ToolCallID: "toolu_1", ToolName: "get_weather", Arguments: `{"city":"Paris"}`},
						{Type: partToolCall, ToolCallID: "toolu_2", ToolName: "get_weather", Arguments: `{}`},
					}},
					{Role: "user", Parts: []part{
						{Type: partToolResult, ToolCallID: "toolu_1", Text: "sunny"},
						{Type: partToolResult, ToolCallID: "toolu_2", Text: "rain\ncold", IsError: true},
						{Type: partText, Text: "and?"},
					}},
				},
				Dropped: []string{"thinking", "is_error"}},
		},
		{
			name: "unknown members of output_config and of either format are named (SPEC §7.6)",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"output_config":{"x_a":1,"format":{"type":"json_schema","schema":{},"name":"o"}},
				"output_format":{"type":"json_schema","schema":{},"strict":true}}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")},
				Output: &outputFormat{Type: "json_schema", Schema: json.RawMessage(`{}`)}, Dropped: []string{"x_a", "name", "strict", "output_format"}},
		},
		{
			// output_config.format is carried; output_format beside it is named, never ignored silently.
			name: "output_format beside output_config.format is named",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"output_config":{"format":{"type":"json_schema","schema":{"a":1}}},
				"output_format":{"type":"json_schema","schema":{"b":2}}}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")},
				Output: &outputFormat{Type: "json_schema", Schema: json.RawMessage(`{"a":1}`)}, Dropped: []string{"output_format"}},
		},
		{
			name: "unknown members of a turn, a source, thinking and tool_choice are named (SPEC §7.6)",
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://a/b","x_src":1}}],"x_turn":1}],
				"thinking":{"type":"enabled","budget_tokens":2048,"x_th":1},"tool_choice":{"type":"auto","x_tc":1}}`,
			want: chatRequest{Model: "m", Messages: []message{{Role: "user", Parts: []part{{Type: partImage, URL: "https://a/b"}}}},
				ToolChoice: &toolChoice{Mode: toolChoiceAuto}, Effort: "low", EffortName: "thinking", Dropped: []string{"x_turn", "x_src", "x_tc", "x_th"}},
		},
		{
			name: "tool_choice kinds",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":true}}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")}, ToolChoice: &toolChoice{Mode: toolChoiceTool, Name: "f"}, ParallelToolCalls: new(false)},
		},
		{
			name: "tool_choice none",
			body: `{"model":"m","messages":[{"role":"user","content":"q"}],"tool_choice":{"type":"none"}}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")}, ToolChoice: &toolChoice{Mode: toolChoiceNone}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCaller(dialectMessages, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseMessagesRefuses(t *testing.T) {
	const u = `{"role":"user","content":"` + dialectPromptText + `"}`
	tests := []struct{ name, body string }{
		{"not JSON", `{"model":"m","messages":[` + u},
		{"no model", `{"messages":[` + u + `]}`},
		{"output_config.format of another type", `{"model":"m","messages":[` + u + `],"output_config":{"format":{"type":"xml","schema":{"type":"object"}}}}`},
		{"output_config.format json_schema without a schema", `{"model":"m","messages":[` + u + `],"output_config":{"format":{"type":"json_schema"}}}`},
		{"model object", `{"model":{},"messages":[` + u + `]}`},
		{"no messages", `{"model":"m"}`},
		{"empty messages", `{"model":"m","messages":[]}`},
		{"system role in messages", `{"model":"m","messages":[{"role":"system","content":"` + dialectPromptText + `"}]}`},
		{"bad role", `{"model":"m","messages":[{"role":"tool","content":"` + dialectPromptText + `"},` + u + `]}`},
		{"system number", `{"model":"m","system":3,"messages":[` + u + `]}`},
		{"system image block", `{"model":"m","system":[{"type":"image"}],"messages":[` + u + `]}`},
		{"content null", `{"model":"m","messages":[{"role":"user","content":null}]}`},
		{"content empty", `{"model":"m","messages":[{"role":"user","content":[]}]}`},
		{"only thinking", `{"model":"m","messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"x"}]}]}`},
		{"text block without text", `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`},
		{"image without source", `{"model":"m","messages":[{"role":"user","content":[{"type":"image"}]}]}`},
		{"image base64 without data", `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png"}}]}]}`},
		{"image file source", `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`},
		{"image url not https", `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"ftp://x"}}]}]}`},
		{"tool_use in a user turn", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]}`},
		{"tool_result in an assistant turn", `{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t"}]}]}`},
		{"tool_use without id", `{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}]}`},
		{"tool_use input array", `{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":[1]}]}]}`},
		{"tool_result without id", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","content":"r"}]}]}`},
		{"tool_result image content", `{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image"}]}]}]}`},
		{"max_tokens 0", `{"model":"m","max_tokens":0,"messages":[` + u + `]}`},
		{"max_tokens string", `{"model":"m","max_tokens":"9","messages":[` + u + `]}`},
		{"tool without name", `{"model":"m","messages":[` + u + `],"tools":[{"input_schema":{"type":"object"}}]}`},
		{"tool schema string", `{"model":"m","messages":[` + u + `],"tools":[{"name":"f","input_schema":"object"}]}`},
		{"tool_choice string", `{"model":"m","messages":[` + u + `],"tool_choice":"auto"}`},
		{"tool_choice tool without name", `{"model":"m","messages":[` + u + `],"tool_choice":{"type":"tool"}}`},
		{"tool_choice unknown type", `{"model":"m","messages":[` + u + `],"tool_choice":{"type":"some"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseCaller(dialectMessages, []byte(tc.body))
			wantInvalidRequest(t, err)
			if strings.Contains(err.Error(), dialectPromptText) {
				t.Errorf("refusal quotes the prompt: %v", err)
			}
		})
	}
}

func TestRenderMessagesAnswer(t *testing.T) {
	tests := []struct {
		name       string
		answer     chatAnswer
		wantStop   string
		wantBlocks []messagesBlock
	}{
		{"text", chatAnswer{Model: "alias", Text: "hi", Finish: finishStop}, "end_turn",
			[]messagesBlock{{Type: "text", Text: dialectStrPtr("hi")}}},
		{"length", chatAnswer{Model: "alias", Text: "cut", Finish: finishLength}, "max_tokens",
			[]messagesBlock{{Type: "text", Text: dialectStrPtr("cut")}}},
		{"tool calls, none of arguments is {}", chatAnswer{Model: "alias", Text: "x", Finish: finishToolCalls, ToolCalls: []toolCall{
			{ID: "toolu_1", Name: "f", Arguments: `{ "a": [1, 2] }`},
			{ID: "toolu_2", Name: "g", Arguments: ``},
		}}, "tool_use", []messagesBlock{
			{Type: "text", Text: dialectStrPtr("x")},
			{Type: "tool_use", ID: "toolu_1", Name: "f", Input: json.RawMessage(`{"a":[1,2]}`)},
			{Type: "tool_use", ID: "toolu_2", Name: "g", Input: json.RawMessage(`{}`)},
		}},
		{"content filter, empty", chatAnswer{Model: "alias", Finish: finishContentFilter}, "refusal", []messagesBlock{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := renderAnswer(dialectMessages, chatRequest{}, tc.answer)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				ID, Type, Role, Model string
				Content               []messagesBlock
				StopReason            string  `json:"stop_reason"`
				StopSequence          *string `json:"stop_sequence"`
				Usage                 *messagesUsage
			}
			mustUnmarshalDialect(t, string(b), &got)
			if !strings.HasPrefix(got.ID, "msg_") || got.Type != "message" || got.Role != "assistant" || got.Model != "alias" ||
				got.StopReason != tc.wantStop || got.StopSequence != nil || got.Usage == nil {
				t.Errorf("message = %s", b)
			}
			if diff := cmp.Diff(tc.wantBlocks, got.Content); diff != "" {
				t.Errorf("content mismatch (-want +got):\n%s", diff)
			}
		})
	}
	for _, args := range []string{`{"a":`, `[1]`, `text`} { // never {} in their place (SPEC §17)
		_, err := renderAnswer(dialectMessages, chatRequest{}, chatAnswer{Finish: finishToolCalls, ToolCalls: []toolCall{{ID: "toolu_1", Name: "f", Arguments: args}}})
		if asAPIError(err).Code != "provider_incomplete" {
			t.Errorf("arguments %s: %v, want provider_incomplete", args, err)
		}
	}
}

// finishFromTestStopReason inverts messagesStopReasons (else end_turn) for the tests.
func finishFromTestStopReason(t *testing.T, r string) string {
	t.Helper()
	for _, f := range []string{finishStop, finishLength, finishToolCalls, finishContentFilter} {
		if want, ok := messagesStopReasons[f]; ok && want == r || !ok && r == "end_turn" {
			return f
		}
	}
	t.Fatalf("unknown stop_reason %q", r)
	return ""
}

// testMessagesEvent is the part of a Messages stream event the tests read.
type testMessagesEvent struct {
	Type         string
	Index        int
	Message      struct{ Model string }
	ContentBlock messagesBlock `json:"content_block"`
	Delta        struct {
		Type        string
		Text        string
		PartialJSON string `json:"partial_json"`
		StopReason  string `json:"stop_reason"`
	}
	Usage messagesUsage
}

// assembleMessagesStream rebuilds the answer as Anthropic's SDKs do and
// checks the framing of SPEC §7.5: message_start first, blocks started in
// index order and stopped one at a time, message_delta, message_stop last.
func assembleMessagesStream(t *testing.T, frames []testSSEFrame) chatAnswer {
	t.Helper()
	var a chatAnswer
	var blocks []messagesBlock
	args := map[int]string{}
	open := -1
	for i, f := range frames {
		var ev testMessagesEvent
		mustUnmarshalDialect(t, f.Data, &ev)
		if ev.Type != f.Event {
			t.Errorf("event name %q carries data type %q", f.Event, ev.Type)
		}
		if (i == 0) != (ev.Type == "message_start") || (i == len(frames)-1) != (ev.Type == "message_stop") {
			t.Errorf("%s at %d of %d", ev.Type, i, len(frames))
		}
		switch ev.Type {
		case "message_start":
			a.Model = ev.Message.Model
		case "content_block_start":
			if ev.Index != len(blocks) || open != -1 {
				t.Errorf("block %d started with block %d open", ev.Index, open)
			}
			if n := len(blocks); n > 0 && blocks[n-1].Type == "text" && ev.ContentBlock.Type == "text" {
				t.Errorf("text block %d follows text block %d: a run of text is one block", ev.Index, n-1)
			}
			blocks, open = append(blocks, ev.ContentBlock), ev.Index
		case "content_block_delta":
			switch ev.Delta.Type {
			case "text_delta":
				a.Text += ev.Delta.Text
			case "input_json_delta":
				args[ev.Index] += ev.Delta.PartialJSON
			}
		case "content_block_stop":
			if ev.Index != open {
				t.Errorf("stop of block %d with %d open", ev.Index, open)
			}
			open = -1
		case "message_delta":
			if open != -1 {
				t.Errorf("message_delta with block %d open", open)
			}
			a.Finish = finishFromTestStopReason(t, ev.Delta.StopReason)
			a.Usage = usage{InputTokens: ev.Usage.InputTokens, OutputTokens: ev.Usage.OutputTokens, Reported: true}
		}
	}
	for i, b := range blocks {
		if b.Type == "tool_use" {
			a.ToolCalls = append(a.ToolCalls, toolCall{ID: b.ID, Name: b.Name, Arguments: args[i]})
		}
	}
	return a
}

// decodeMessagesAnswer reads a buffered message back into an answer.
func decodeMessagesAnswer(t *testing.T, body []byte) chatAnswer {
	t.Helper()
	var m struct {
		Model      string
		Content    []messagesBlock
		StopReason string `json:"stop_reason"`
		Usage      messagesUsage
	}
	mustUnmarshalDialect(t, string(body), &m)
	a := chatAnswer{Model: m.Model, Finish: finishFromTestStopReason(t, m.StopReason),
		Usage: usage{InputTokens: m.Usage.InputTokens, OutputTokens: m.Usage.OutputTokens, Reported: true}}
	for _, b := range m.Content {
		switch b.Type {
		case "text":
			a.Text += *b.Text
		case "tool_use":
			a.ToolCalls = append(a.ToolCalls, toolCall{ID: b.ID, Name: b.Name, Arguments: string(b.Input)})
		}
	}
	return a
}

// TestDecodeMessagesBlockOrder: a buffered message reaches a Messages caller with its blocks in the provider's order,
// as its stream does: text after a call is a block of its own, not joined to the text before the call.
func TestDecodeMessagesBlockOrder(t *testing.T) {
	body := `{"type":"message","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"toolu_1","name":"f","input":{ "x": 1 }},
		{"type":"text","text":"b"}],"stop_reason":"tool_use","usage":{"input_tokens":3,"output_tokens":4}}`
	s := &callerStream{w: io.Discard, frames: formatOf(dialectMessages).frames}
	if _, err := s.answer(call{res: resolution{Provider: providerInfo{protocol: protoAnthropic}}}, nil, []byte(body), true, false); err != nil {
		t.Fatal(err)
	}
	want := []messagesBlock{{Type: "text", Text: new("a")},
		{Type: "tool_use", ID: "toolu_1", Name: "f", Input: json.RawMessage(`{"x":1}`)}, {Type: "text", Text: new("b")}}
	if diff := cmp.Diff(want, s.whole.(*messagesAnswer).Content); diff != "" {
		t.Errorf("content mismatch (-want +got):\n%s", diff)
	}
}
