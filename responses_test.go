package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseResponses(t *testing.T) {
	tests := []struct {
		name string
		body string
		want chatRequest
	}{
		{
			name: "string input, instructions, limits, unknown members dropped",
			body: `{"model":"openai-responses/o3","instructions":"be brief","input":"hi","max_output_tokens":50,"temperature":1,"stream":true,
				"store":false,"reasoning":{"effort":"low"},"previous_response_id":null}`,
			want: chatRequest{Model: "openai-responses/o3", System: "be brief", MaxTokens: 50, LimitName: "max_output_tokens", Temperature: dialectFloatPtr(1), Stream: true,
				Effort: "low", EffortName: "effort", Shared: openAIShared{Store: json.RawMessage("false")}, Dropped: []string{"previous_response_id"},
				Messages: []message{dialectUserText("hi")}},
		},
		{
			name: "system items before the first turn join instructions, later ones stand where they are; images",
			body: `{"model":"m","instructions":"a","input":[{"role":"system","content":"b"},
				{"type":"message","role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"https://example.com/c.png","detail":"auto"},
					{"type":"input_image","image_url":"data:image/webp;base64,UklGR"}]},
				{"role":"developer","content":[{"type":"input_text","text":"c"}]}]}`,
			want: chatRequest{Model: "m", System: "a\n\nb", Messages: []message{{Role: "user", Parts: []part{
				{Type: partText, Text: "look"},
				{Type: partImage, URL: "https://example.com/c.png", Detail: "auto"},
				{Type: partImage, URL: "data:image/webp;base64,UklGR"},
			}}, {Role: "system", Parts: []part{{Type: partText, Text: "c"}}}}},
		},
		{
			name: "function calls join the assistant turn, outputs join one user turn, reasoning dropped",
			body: `{"model":"m","input":[{"role":"user","content":"weather?"},
				{"type":"reasoning","id":"rs_1","summary":[]},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"checking","annotations":[]},{"type":"refusal","refusal":"x"}]},
				{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}","status":"completed"},
				{"type":"function_call","call_id":"call_2","name":"get_time","arguments":"{}"},
				{"type":"function_call_output","call_id":"call_1","output":"sunny"},
				{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"noon"}]},
				{"type":"function_call","call_id":"call_3","name":"again"}],
				"tools":[{"type":"function","name":"get_weather","description":"Weather","parameters":{"type":"object"},"strict":true}],
				"tool_choice":"auto"}`,
			want: chatRequest{Model: "m",
				Tools:      []tool{{Type: toolFunction, Name: "get_weather", Description: "Weather", Parameters: json.RawMessage(`{"type":"object"}`), Strict: new(true)}},
				ToolChoice: &toolChoice{Mode: toolChoiceAuto},
				Messages: []message{
					dialectUserText("weather?"),
					{Role: "assistant", Parts: []part{
						{Type: partText, Text: "checking"},
						{Type: partToolCall, ToolCallID: "call_1", ToolName: "get_weather", Arguments: `{"city":"Paris"}`},
						{Type: partToolCall, ToolCallID: "call_2", ToolName: "get_time", Arguments: `{}`},
					}},
					{Role: "user", Parts: []part{
						{Type: partToolResult, ToolCallID: "call_1", Text: "sunny"},
						{Type: partToolResult, ToolCallID: "call_2", Text: "noon"},
					}},
					{Role: "assistant", Parts: []part{{Type: partToolCall, ToolCallID: "call_3", ToolName: "again"}}},
				},
				Dropped: []string{"reasoning", "refusal"}},
		},
		{
			name: "a member of the other tool kind is named",
			body: `{"model":"m","input":"q","tools":[{"type":"custom","name":"c","parameters":{"type":"object"},"strict":true},
				{"type":"function","name":"f","format":{"type":"text"}}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")},
				Tools: []tool{{Type: toolCustom, Name: "c"}, {Type: toolFunction, Name: "f"}}, Dropped: []string{"parameters", "strict", "format"}},
		},
		{
			name: "unknown members of text.format are named (SPEC §7.6)",
			body: `{"model":"m","input":"q","text":{"format":{"type":"json_schema","name":"o","schema":{"type":"object"},"x_a":1}}}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")},
				Output: &outputFormat{Type: "json_schema", Name: "o", Schema: json.RawMessage(`{"type":"object"}`)}, Dropped: []string{"x_a"}},
		},
		{
			name: "a custom tool's parameters are dropped unread",
			body: `{"model":"m","input":"q","tools":[{"type":"custom","name":"c","parameters":"not an object"}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")},
				Tools: []tool{{Type: toolCustom, Name: "c"}}, Dropped: []string{"parameters"}},
		},
		{
			name: "a namespace names what it loses",
			body: `{"model":"m","input":"q","tools":[{"type":"namespace","name":"ns","x_extra":1,"description":"d","tools":[{"type":"function","name":"f"}]}]}`,
			want: chatRequest{Model: "m", Messages: []message{dialectUserText("q")},
				Tools: []tool{{Type: toolFunction, Name: "ns__f", Namespace: "ns"}}, Dropped: []string{"x_extra", "description"}},
		},
		{
			name: "named tool_choice",
			body: `{"model":"codex/gpt-5","input":[{"role":"user","content":"q"}],"tool_choice":{"type":"function","name":"f"}}`,
			want: chatRequest{Model: "codex/gpt-5", Messages: []message{dialectUserText("q")}, ToolChoice: &toolChoice{Mode: toolChoiceTool, Name: "f"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCaller(dialectResponses, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseResponsesRefuses(t *testing.T) {
	const u = `{"role":"user","content":"` + dialectPromptText + `"}`
	tests := []struct{ name, body string }{
		{"not JSON", `{"model":"m","input":"` + dialectPromptText},
		{"no model", `{"input":"x"}`},
		{"text.format of another type", `{"model":"m","input":"x","text":{"format":{"type":"xml","name":"o","schema":{"type":"object"}}}}`},
		{"text.format json_schema with a schema not an object", `{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"o","schema":[]}}}`},
		{"model array", `{"model":["m"],"input":"x"}`},
		{"no input", `{"model":"m"}`},
		{"empty input string", `{"model":"m","input":""}`},
		{"empty input array", `{"model":"m","input":[]}`},
		{"input number", `{"model":"m","input":4}`},
		{"only instructions-like items", `{"model":"m","input":[{"role":"system","content":"` + dialectPromptText + `"}]}`},
		{"bad role", `{"model":"m","input":[{"role":"tool","content":"` + dialectPromptText + `"}]}`},
		{"item_reference to a call", `{"model":"m","input":[` + u + `,{"type":"item_reference","id":"fc_1"}]}`},
		{"item_reference without an id", `{"model":"m","input":[` + u + `,{"type":"item_reference"}]}`},
		{"previous_response_id", `{"model":"m","input":[` + u + `],"previous_response_id":"resp_1"}`},
		{"conversation id", `{"model":"m","input":[` + u + `],"conversation":"conv_1"}`},
		{"previous_response_id beside a null conversation", `{"model":"m","input":[` + u + `],"conversation":null,"previous_response_id":"resp_1"}`},
		{"conversation object", `{"model":"m","input":[` + u + `],"conversation":{"id":"conv_1"}}`},
		{"unknown item", `{"model":"m","input":[{"type":"web_search_call","id":"w"}]}`},
		{"content null", `{"model":"m","input":[{"role":"user","content":null}]}`},
		{"content empty", `{"model":"m","input":[{"role":"user","content":[]}]}`},
		{"content empty beside a full message", `{"model":"m","input":[` + u + `,{"role":"user","content":[]}]}`},
		{"input_file part", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_data":"` + dialectPromptText + `"}]}]}`},
		{"input_file with both file_data and file_url", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_data":"data:application/pdf;base64,AAA","file_url":"https://x.test/a.pdf"}]}]}`},
		{"input_text without text", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text"}]}]}`},
		{"input_image by file id", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"file_1"}]}]}`},
		{"input_image http", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x/y"}]}]}`},
		{"function_call without call_id", `{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`},
		{"function_call arguments object", `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":{}}]}`},
		{"function_call_output without call_id", `{"model":"m","input":[{"type":"function_call_output","output":"r"}]}`},
		{"function_call_output number", `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":1}]}`},
		{"max_output_tokens 0", `{"model":"m","input":"x","max_output_tokens":0}`},
		{"instructions array", `{"model":"m","input":"x","instructions":["a"]}`},
		{"tool without name", `{"model":"m","input":"x","tools":[{"type":"function"}]}`},
		{"nested tool_choice shape", `{"model":"m","input":"x","tool_choice":{"type":"function","function":{"name":"f"}}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseCaller(dialectResponses, []byte(tc.body))
			wantInvalidRequest(t, err)
			if strings.Contains(err.Error(), dialectPromptText) {
				t.Errorf("refusal quotes the prompt: %v", err)
			}
		})
	}
}

// testResponsesObject is the part of a Responses response object the tests
// read.
type testResponsesObject struct {
	ID                string
	Object            string
	Status            string
	Model             string
	IncompleteDetails *struct{ Reason string } `json:"incomplete_details"`
	Output            []struct {
		Type, ID, Status, Role, Name, Arguments string
		CallID                                  string `json:"call_id"`
		Content                                 []responsesPart
	}
	Usage *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
}

// answerFromTestResponse turns a response object back into an answer. The
// Responses API has no finish reason: a length stop is an incomplete
// response, and a completed one with function calls stopped for them.
func answerFromTestResponse(t *testing.T, r testResponsesObject) chatAnswer {
	t.Helper()
	a := chatAnswer{Model: r.Model, Finish: finishStop}
	for _, it := range r.Output {
		if it.Status != "completed" {
			t.Errorf("output item %s status %q", it.ID, it.Status)
		}
		switch it.Type {
		case "message":
			for _, c := range it.Content {
				a.Text += *c.Text
			}
		case "function_call":
			a.ToolCalls = append(a.ToolCalls, toolCall{ID: it.CallID, Name: it.Name, Arguments: it.Arguments})
			a.Finish = finishToolCalls
		}
	}
	switch {
	case r.Status == "incomplete" && r.IncompleteDetails != nil && r.IncompleteDetails.Reason == "max_output_tokens":
		a.Finish = finishLength
	case r.Status != "completed" || r.IncompleteDetails != nil:
		t.Errorf("status %q, incomplete_details %+v", r.Status, r.IncompleteDetails)
	}
	if r.Usage != nil {
		a.Usage = usage{InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens, Reported: true}
		if r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
			t.Errorf("total_tokens wrong: %+v", r.Usage)
		}
	}
	return a
}

// decodeResponsesAnswer reads a buffered response object back.
func decodeResponsesAnswer(t *testing.T, body []byte) chatAnswer {
	t.Helper()
	var r testResponsesObject
	mustUnmarshalDialect(t, string(body), &r)
	if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" {
		t.Errorf("response envelope = %s", body)
	}
	return answerFromTestResponse(t, r)
}

// testResponsesEvent is the part of a Responses stream event the tests read.
type testResponsesEvent struct {
	Type           string
	SequenceNumber int `json:"sequence_number"`
	Response       testResponsesObject
	OutputIndex    int    `json:"output_index"`
	ItemID         string `json:"item_id"`
	Item           struct {
		Type, ID, Name string
		CallID         string `json:"call_id"`
	}
	Delta     string
	Text      string
	Arguments string
}

// assembleResponsesStream rebuilds the answer from the deltas, as a client
// rendering the stream does, checks it against response.completed, which
// SDK helpers keep as the final response, and checks the framing of SPEC
// §7.5: response.created first, response.completed last, sequence numbers
// in order, every item added before its deltas and done exactly once.
func assembleResponsesStream(t *testing.T, frames []testSSEFrame) chatAnswer {
	t.Helper()
	var a chatAnswer
	type item struct {
		typ, id, callID, name, text string
		partDone, textDone, done    bool
	}
	var items []*item
	var completed testResponsesObject
	for i, f := range frames {
		var ev testResponsesEvent
		mustUnmarshalDialect(t, f.Data, &ev)
		if ev.Type != f.Event || ev.SequenceNumber != i {
			t.Errorf("frame %d: event %q, data type %q, sequence %d", i, f.Event, ev.Type, ev.SequenceNumber)
		}
		if (i == 0) != (ev.Type == "response.created") || (i == len(frames)-1) != (ev.Type == "response.completed") {
			t.Errorf("%s at %d of %d", ev.Type, i, len(frames))
		}
		var it *item
		if strings.HasPrefix(ev.Type, "response.output") || strings.HasPrefix(ev.Type, "response.content") || strings.HasPrefix(ev.Type, "response.function") {
			if ev.Type == "response.output_item.added" {
				if ev.OutputIndex != len(items) {
					t.Errorf("item added at %d, want %d", ev.OutputIndex, len(items))
				}
				items = append(items, &item{typ: ev.Item.Type, id: ev.Item.ID, callID: ev.Item.CallID, name: ev.Item.Name})
			}
			if ev.OutputIndex >= len(items) {
				t.Fatalf("%s for unknown output %d", ev.Type, ev.OutputIndex)
			}
			it = items[ev.OutputIndex]
			wantID := it.id // an event within the item names it; the item's own carry it whole
			if strings.HasPrefix(ev.Type, "response.output_item.") {
				wantID = ""
			}
			if it.done || ev.ItemID != wantID {
				t.Errorf("%s for item %q (done %v), want %q", ev.Type, ev.ItemID, it.done, wantID)
			}
		}
		switch ev.Type {
		case "response.created":
			a.Model = ev.Response.Model
			if ev.Response.Status != "in_progress" {
				t.Errorf("created with status %q", ev.Response.Status)
			}
		case "response.output_text.delta", "response.function_call_arguments.delta":
			it.text += ev.Delta
		case "response.output_item.added", "response.content_part.added":
		case "response.content_part.done":
			it.partDone = true
		case "response.output_text.done":
			it.textDone = true
			if ev.Text != it.text {
				t.Errorf("output_text.done %q, deltas %q", ev.Text, it.text)
			}
		case "response.function_call_arguments.done":
			it.textDone, it.partDone = true, true
			if ev.Arguments != it.text {
				t.Errorf("arguments.done %q, deltas %q", ev.Arguments, it.text)
			}
		case "response.output_item.done":
			if !it.textDone || !it.partDone {
				t.Errorf("item %s done before its text/arguments and part were", it.id)
			}
			it.done = true
		case "response.completed":
			completed = ev.Response
		default:
			t.Errorf("unexpected event %q", ev.Type)
		}
	}
	for _, it := range items {
		if !it.done {
			t.Errorf("item %s never done", it.id)
		}
		switch it.typ {
		case "message":
			a.Text += it.text
		case "function_call":
			a.ToolCalls = append(a.ToolCalls, toolCall{ID: it.callID, Name: it.name, Arguments: it.text})
		}
	}
	final := answerFromTestResponse(t, completed)
	a.Finish, a.Usage = final.Finish, final.Usage
	if diff := cmp.Diff(final, a); diff != "" {
		t.Errorf("deltas and response.completed disagree (-completed +deltas):\n%s", diff)
	}
	return a
}

func TestRenderResponsesAnswer(t *testing.T) {
	b, err := renderAnswer(dialectResponses, chatRequest{}, chatAnswer{Model: "alias", Text: "partial", Finish: finishLength,
		ToolCalls: []toolCall{{ID: "call_1", Name: "f", Arguments: `{"a":1}`}}, Usage: usage{4, 5, true}})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	mustUnmarshalDialect(t, string(b), &got)
	out := got["output"].([]any)
	msg, fc := out[0].(map[string]any), out[1].(map[string]any)
	want := map[string]any{
		"status": "incomplete", "incomplete_details": map[string]any{"reason": "max_output_tokens"}, "model": "alias",
		"usage": map[string]any{"input_tokens": 4.0, "output_tokens": 5.0, "total_tokens": 9.0,
			"input_tokens_details": map[string]any{"cached_tokens": 0.0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0.0}},
	}
	for k, v := range want {
		if !cmp.Equal(v, got[k]) {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if msg["type"] != "message" || msg["role"] != "assistant" || !strings.HasPrefix(msg["id"].(string), "msg_") ||
		!cmp.Equal(msg["content"], []any{map[string]any{"type": "output_text", "text": "partial", "annotations": []any{}}}) {
		t.Errorf("message item = %v", msg)
	}
	wantFC := map[string]any{"type": "function_call", "id": fc["id"], "status": "completed", "call_id": "call_1", "name": "f", "arguments": `{"a":1}`}
	if !strings.HasPrefix(fc["id"].(string), "fc_") || !cmp.Equal(wantFC, fc) {
		t.Errorf("function_call item = %v", fc)
	}
	b, _ = renderAnswer(dialectResponses, chatRequest{}, chatAnswer{Model: "alias", Text: "done"})
	mustUnmarshalDialect(t, string(b), &got)
	if got["status"] != "completed" || got["incomplete_details"] != nil || got["usage"] != nil || got["error"] != nil {
		t.Errorf("completed response without usage = %s", b)
	}
}

// TestResponsesMalformedMessageContent: a message item whose content is neither a string nor parts is a malformed
// answer (SPEC §8.2: provider_failure), as a chat message's is; it was read as no text.
func TestResponsesMalformedMessageContent(t *testing.T) {
	for _, content := range []string{`5`, `[{"type":"output_text","text":5}]`} {
		body := `{"status":"completed","output":[{"type":"message","role":"assistant","content":` + content + `}]}`
		_, err := decodeUpstreamAnswer(protoOpenAIResponses, []byte(body))
		if ae, _ := err.(*apiError); ae == nil || ae.Code != "provider_failure" {
			t.Errorf("content %s: err = %v, want provider_failure", content, err)
		}
	}
	a, err := decodeUpstreamAnswer(protoOpenAIResponses, []byte(`{"status":"completed","output":[{"type":"message",`+
		`"content":[{"type":"output_text","text":"a"},{"type":"refusal","refusal":"b"}]}]}`))
	if err != nil || a.Text != "ab" || a.Finish != finishContentFilter {
		t.Errorf("text and refusal parts: %+v, %v; want text ab, finish content_filter", a, err)
	}
}
