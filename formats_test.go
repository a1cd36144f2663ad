package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// chatAnswer is one complete answer in no particular format: what the tests compare a dialect's body or a
// provider's answer by (production code writes a provider's answer straight into the caller's frames).
type chatAnswer struct {
	Model     string
	Text      string
	ToolCalls []toolCall
	Finish    string
	Usage     usage
}

// toolCall is one tool call of a chatAnswer (a tool_call part's facts).
type toolCall struct {
	ID        string
	Name      string // as the provider saw it (flattened)
	Arguments string
	Custom    bool
}

// callPart is tc as the tool_call part a caller stream takes.
func callPart(tc toolCall) part {
	return part{Type: partToolCall, ToolCallID: tc.ID, ToolName: tc.Name, Arguments: tc.Arguments, Custom: tc.Custom}
}

// answerOf gathers the answer a reader of protocol gives a caller stream that writes nothing: whole, a buffered body,
// else the stream body.
func answerOf(protocol string, body io.Reader, whole []byte) (chatAnswer, error) {
	s := &callerStream{frames: func(*callerStream, streamStep, *streamBlock, string) error { return nil }}
	if _, err := s.answer(call{res: resolution{Provider: providerInfo{protocol: protocol}}}, body, whole, true, false); err != nil {
		return chatAnswer{}, err
	}
	a := chatAnswer{Finish: s.rd.finish, Usage: s.rd.usage}
	for _, b := range s.blocks {
		if b.text {
			a.Text += b.buf.String()
		} else {
			a.ToolCalls = append(a.ToolCalls, toolCall{ID: b.id, Name: b.name, Arguments: b.buf.String(), Custom: b.custom})
		}
	}
	return a, nil
}

// decodeUpstreamAnswer is the answer a 2xx buffered body of protocol gives.
func decodeUpstreamAnswer(protocol string, body []byte) (chatAnswer, error) {
	return answerOf(protocol, nil, body)
}

// renderAnswer is a as dialect's buffered body, written through the dialect's frames as readAnswer writes a provider's.
func renderAnswer(dialect string, req chatRequest, a chatAnswer) ([]byte, error) {
	s := &callerStream{w: io.Discard, frames: formatOf(dialect).frames, req: req, model: a.Model}
	err := s.frames(s, stepBegin, nil, "")
	if err == nil {
		err = s.text(a.Text)
	}
	if err == nil {
		var calls []part
		for _, tc := range a.ToolCalls {
			calls = append(calls, callPart(tc))
		}
		s.rd = streamReader{out: s, finish: a.Finish, usage: a.Usage, held: calls}
	}
	if err == nil {
		err = s.finish(nil)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(s.whole)
}

// testSSEFrame is one parsed server-sent event; comment frames have only
// Comment set.
type testSSEFrame struct {
	Event   string
	Data    string
	Comment string
}

// newCallerStream writes dialect to w, flushing where the stream flushes (flush may be nil), reporting model.
func newCallerStream(dialect string, req chatRequest, w io.Writer, flush func(), model string) *callerStream {
	return &callerStream{w: w, flush: flush, frames: formatOf(dialect).frames, req: req, model: model}
}

// splitTestSSE parses an SSE body into frames. It is strict about the shape
// Brama writes: every frame ends with a blank line, lines are "event: ",
// "data: " or ": " comments, and at most one data line per frame.
func splitTestSSE(t *testing.T, body string) []testSSEFrame {
	t.Helper()
	if body != "" && !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("SSE body does not end with a blank line: %q", body)
	}
	var frames []testSSEFrame
	for _, block := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		if block == "" {
			continue
		}
		var f testSSEFrame
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				f.Event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: ") && f.Data == "":
				f.Data = strings.TrimPrefix(line, "data: ")
			case strings.HasPrefix(line, ": "):
				f.Comment = strings.TrimPrefix(line, ": ")
			default:
				t.Fatalf("unexpected SSE line %q", line)
			}
		}
		frames = append(frames, f)
	}
	return frames
}

// wantInvalidRequest fails t unless err is an *apiError with code invalid_request.
func wantInvalidRequest(t *testing.T, err error) {
	t.Helper()
	var ae *apiError
	if !errors.As(err, &ae) || ae.Code != "invalid_request" {
		t.Fatalf("error = %v, want an invalid_request *apiError", err)
	}
}

// dialectStreamCases are the neutral event sequences every dialect's stream must
// carry through unchanged, with the answer they add up to.
var dialectStreamCases = []struct {
	name   string
	events []streamEvent
	want   chatAnswer
}{
	{
		name: "text, two tool calls, usage before finish",
		events: []streamEvent{
			{Kind: eventText, Text: "Let me "},
			{Kind: eventText, Text: "check."},
			{Kind: eventToolCallStart, Index: 0, ToolCall: toolCall{ID: "call_1", Name: "get_weather"}},
			{Kind: eventToolCallArgs, Index: 0, Text: `{"city":`},
			{Kind: eventToolCallArgs, Index: 0, Text: `"Paris"}`},
			{Kind: eventToolCallStart, Index: 1, ToolCall: toolCall{ID: "call_2", Name: "get_time"}},
			{Kind: eventToolCallArgs, Index: 1, Text: `{}`},
			{Kind: eventUsage, Usage: usage{InputTokens: 11, OutputTokens: 7, Reported: true}},
			{Kind: eventFinish, Finish: finishToolCalls},
		},
		want: chatAnswer{Model: "m", Text: "Let me check.", Finish: finishToolCalls,
			ToolCalls: []toolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}, {ID: "call_2", Name: "get_time", Arguments: `{}`}},
			Usage:     usage{InputTokens: 11, OutputTokens: 7, Reported: true}},
	},
	{
		name: "text only, finish before usage",
		events: []streamEvent{
			{Kind: eventText, Text: "Hello"},
			{Kind: eventText, Text: ", world"},
			{Kind: eventFinish, Finish: finishStop},
			{Kind: eventUsage, Usage: usage{InputTokens: 3, OutputTokens: 2, Reported: true}},
		},
		want: chatAnswer{Model: "m", Text: "Hello, world", Finish: finishStop, Usage: usage{InputTokens: 3, OutputTokens: 2, Reported: true}},
	},
	{
		name: "cut by length, no usage",
		events: []streamEvent{
			{Kind: eventText, Text: "Once upon"},
			{Kind: eventFinish, Finish: finishLength},
		},
		want: chatAnswer{Model: "m", Text: "Once upon", Finish: finishLength},
	},
	{
		name: "tool call only",
		events: []streamEvent{
			{Kind: eventToolCallStart, Index: 0, ToolCall: toolCall{ID: "call_9", Name: "lookup"}},
			{Kind: eventToolCallArgs, Index: 0, Text: `{"q":"x"}`},
			{Kind: eventFinish, Finish: finishToolCalls},
			{Kind: eventUsage, Usage: usage{InputTokens: 5, OutputTokens: 1, Reported: true}},
		},
		want: chatAnswer{Model: "m", Finish: finishToolCalls, ToolCalls: []toolCall{{ID: "call_9", Name: "lookup", Arguments: `{"q":"x"}`}},
			Usage: usage{InputTokens: 5, OutputTokens: 1, Reported: true}},
	},
}

// runCallerStream feeds events through a caller stream of dialect and returns
// the body and how many of its bytes the last flush sent.
func runCallerStream(t *testing.T, dialect string, events []streamEvent) (string, int) {
	t.Helper()
	var buf bytes.Buffer
	flushed := -1
	s := newCallerStream(dialect, chatRequest{StreamUsage: true}, &buf, func() { flushed = buf.Len() }, "m")
	if err := s.frames(s, stepBegin, nil, ""); err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		if err := feed(s, ev); err != nil {
			t.Fatalf("event %+v: %v", ev, err)
		}
	}
	if err := s.finish(nil); err != nil {
		t.Fatal(err)
	}
	return buf.String(), flushed
}

// TestStreamsReassemble checks that each dialect's stream, parsed back the
// way an SDK would, carries the same text, tool calls, finish and usage as
// the events, and the same as the dialect's buffered answer for them.
func TestStreamsReassemble(t *testing.T) {
	dialects := []struct {
		dialect  string
		stream   func(t *testing.T, frames []testSSEFrame) chatAnswer
		buffered func(t *testing.T, body []byte) chatAnswer
	}{
		{dialectChat, assembleChatStream, decodeChatAnswer},
		{dialectMessages, assembleMessagesStream, decodeMessagesAnswer},
		{dialectResponses, assembleResponsesStream, decodeResponsesAnswer},
	}
	for _, d := range dialects {
		for _, tc := range dialectStreamCases {
			t.Run(d.dialect+"/"+tc.name, func(t *testing.T) {
				body, flushed := runCallerStream(t, d.dialect, tc.events)
				frames := splitTestSSE(t, body)
				if flushed != len(body) { // finish flushes what is left (TestTranslatedStreamHoldsNoEvent: the rest)
					t.Errorf("the last flush sent %d of the stream's %d bytes", flushed, len(body))
				}
				want := tc.want
				if d.dialect == dialectMessages && !want.Usage.Reported {
					want.Usage = usage{Reported: true} // Anthropic always carries usage: zeros
				}
				if diff := cmp.Diff(want, d.stream(t, frames)); diff != "" {
					t.Errorf("streamed answer mismatch (-want +got):\n%s", diff)
				}
				b, err := renderAnswer(d.dialect, chatRequest{}, tc.want)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, d.buffered(t, b)); diff != "" {
					t.Errorf("buffered answer mismatch (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// TestStreamFail checks each dialect's in-band error (SPEC §7.5): the last
// event carries the error, no terminal success event appears, and the
// stream refuses to finish afterwards.
func TestStreamFail(t *testing.T) {
	tests := []struct {
		name    string
		dialect string
		check   func(t *testing.T, last testSSEFrame)
	}{
		{"chat", dialectChat, func(t *testing.T, last testSSEFrame) {
			var got envelope
			mustUnmarshalDialect(t, last.Data, &got)
			want := envelope{Error: apiError{Message: "stream ended early", Type: "provider_error", Code: "provider_incomplete", Attempts: dialectIntPtr(2)}}
			if last.Event != "" || !cmp.Equal(want, got, cmp.AllowUnexported(apiError{})) {
				t.Errorf("in-band error = %q %+v, want %+v", last.Event, got, want)
			}
		}},
		{"messages", dialectMessages, func(t *testing.T, last testSSEFrame) {
			var got struct {
				Type  string
				Error map[string]any
			}
			mustUnmarshalDialect(t, last.Data, &got)
			want := map[string]any{"type": "provider_error", "message": "stream ended early", "code": "provider_incomplete", "retryable": false, "attempts": 2.0}
			if last.Event != "error" || got.Type != "error" || !cmp.Equal(want, got.Error) {
				t.Errorf("in-band error = %q %+v, want event error with %v", last.Event, got, want)
			}
		}},
		{"responses", dialectResponses, func(t *testing.T, last testSSEFrame) {
			var got struct {
				Type     string
				Response struct {
					Status string
					Error  map[string]any
				}
			}
			mustUnmarshalDialect(t, last.Data, &got)
			want := map[string]any{"code": "provider_incomplete", "message": "stream ended early"}
			if last.Event != "response.failed" || got.Type != "response.failed" || got.Response.Status != "failed" || !cmp.Equal(want, got.Response.Error) {
				t.Errorf("in-band error = %q %+v, want response.failed with %v", last.Event, got, want)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			flushed := -1
			s := newCallerStream(tc.dialect, chatRequest{}, &buf, func() { flushed = buf.Len() }, "m")
			s.frames(s, stepBegin, nil, "")
			feed(s, streamEvent{Kind: eventText, Text: "partial"})
			feed(s, streamEvent{Kind: eventToolCallStart, ToolCall: toolCall{ID: "c", Name: "f"}})
			feed(s, streamEvent{Kind: eventFinish, Finish: finishStop})
			if err := s.finish(refuse("provider_incomplete", "stream ended early").withAttempts(2)); err != nil {
				t.Fatal(err)
			}
			if err := s.finish(nil); !errors.Is(err, errCallerStreamDone) {
				t.Errorf("finish after fail = %v, want errStreamDone", err)
			}
			frames := splitTestSSE(t, buf.String())
			if flushed != buf.Len() { // SPEC §7.5: the in-band error is flushed, then the response aborted
				t.Errorf("the last flush sent %d of the stream's %d bytes", flushed, buf.Len())
			}
			for _, f := range frames {
				if f.Data == "[DONE]" || f.Event == "message_stop" || f.Event == "response.completed" || f.Event == "message_delta" {
					t.Errorf("terminal success event after a failure: %+v", f)
				}
			}
			tc.check(t, frames[len(frames)-1])
		})
	}
}

func dialectIntPtr(n int) *int { return &n }

func mustUnmarshalDialect(t *testing.T, data string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(data), v); err != nil {
		t.Fatalf("unmarshal %q: %v", data, err)
	}
}

// TestStreamKeepAliveAndErrors checks the keep-alive comment, that a write
// error sticks, and that an unknown event or arguments before a tool call's
// start are refused rather than written.
func TestStreamKeepAliveAndErrors(t *testing.T) {
	for _, d := range []string{dialectChat, dialectMessages, dialectResponses} {
		t.Run(d, func(t *testing.T) {
			var buf bytes.Buffer
			flushes := 0
			s := newCallerStream(d, chatRequest{}, &buf, func() { flushes++ }, "m")
			if err := s.write([]byte(": keep-alive\n\n"), true); err != nil || buf.String() != ": keep-alive\n\n" || flushes != 1 {
				t.Errorf("write wrote %q, %d flushes, err %v", buf.String(), flushes, err)
			}
			if d != dialectChat {
				if err := feed(s, streamEvent{Kind: eventToolCallArgs, Index: 4, Text: "{}"}); err == nil {
					t.Error("arguments before the tool call's start accepted")
				}
			}

			w := &dialectBrokenWriter{}
			s = newCallerStream(d, chatRequest{}, w, nil, "m")
			if err := s.frames(s, stepBegin, nil, ""); !errors.Is(err, errDialectBrokenPipe) {
				t.Fatalf("start on a broken writer = %v", err)
			}
			if err := feed(s, streamEvent{Kind: eventText, Text: "x"}); !errors.Is(err, errDialectBrokenPipe) || w.writes != 1 {
				t.Errorf("event after a write error = %v after %d writes, want the same error and no new write", err, w.writes)
			}
		})
	}
}

var errDialectBrokenPipe = errors.New("broken pipe")

type dialectBrokenWriter struct{ writes int }

func (w *dialectBrokenWriter) Write(p []byte) (int, error) {
	w.writes++
	return 0, errDialectBrokenPipe
}

// TestParseRequestDispatch checks formatOf routes each dialect to its
// parser (the server routes only the table's dialects).
func TestParseRequestDispatch(t *testing.T) {
	tests := []struct {
		dialect string
		body    string
	}{
		{dialectChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{dialectMessages, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		{dialectResponses, `{"model":"m","input":"hi"}`},
	}
	want := []message{{Role: "user", Parts: []part{{Type: partText, Text: "hi"}}}}
	for _, tc := range tests {
		req, err := parseCaller(tc.dialect, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.dialect, err)
		}
		if diff := cmp.Diff(want, req.Messages); diff != "" {
			t.Errorf("%s messages (-want +got):\n%s", tc.dialect, diff)
		}
	}
}

// parseCaller parses body in dialect as the plan does: its head read once (readCallerRequest), then the whole.
func parseCaller(dialect string, body []byte) (chatRequest, error) {
	cr, err := readCallerRequest(dialect, nil, body)
	if err != nil {
		return chatRequest{}, err
	}
	return formatOf(dialect).parse(cr)
}

// fuzzDialectParse is the shared body of the three parser fuzz targets: no panic,
// every error an invalid_request *apiError, and an accepted request has a
// model and at least one message whose parts are all of a known kind. It
// also checks the round trip caller body → neutral → caller body → neutral
// gives the same neutral request.
func fuzzDialectParse(f *testing.F, dialect string, seeds ...string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	wf := formatOf(dialect)
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseCaller(dialect, body)
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) || ae.Code != "invalid_request" {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		if req.Model == "" || len(req.Messages) == 0 {
			t.Fatalf("accepted a request without model or messages: %+v", req)
		}
		for _, m := range req.Messages {
			if (m.Role != "user" && m.Role != "assistant" && m.Role != "system") || len(m.Parts) == 0 {
				t.Fatalf("accepted a bad message %+v", m)
			}
			for _, p := range m.Parts {
				switch p.Type {
				case partText, partImage, partDocument, partToolCall, partToolResult:
				default:
					t.Fatalf("accepted a part of kind %q", p.Type)
				}
			}
		}
		if req.MaxTokens < 0 {
			t.Fatalf("accepted max tokens %d", req.MaxTokens)
		}
		enc, err := wf.encode(&req, call{res: resolution{Model: req.Model}}, http.Header{})
		if err != nil || len(roundTripNeutral(req).Messages) == 0 || roundTripNeutral(req).Messages[0].Role == "system" { // nothing a provider takes
			return // not every accepted request can be sent (JSON mode toward messages, arguments that are not an object)
		}
		again, err := parseCaller(dialect, enc)
		if err != nil {
			t.Fatalf("the re-encoded request is refused: %v", err)
		}
		if diff := cmp.Diff(roundTripNeutral(req), roundTripNeutral(again)); diff != "" {
			t.Fatalf("round trip changed the request (-first +second):\n%s", diff)
		}
	})
}

// roundTripNeutral leaves out of a neutral request what a caller body
// carries by design no further than one hop: what was dropped and where
// it stood, empty text (providers
// refuse it), empty arguments (sent as {}) and a reasoning effort (between
// budget steps, or dropped and named where max_tokens leaves no room for a
// thinking budget); a tool group goes flattened, a schema gets a name, and
// JSON is compared as encoding/json writes it.
func roundTripNeutral(req chatRequest) chatRequest {
	req.Dropped, req.Effort, req.EffortName, req.LimitName = nil, "", "", ""
	if req.Output != nil {
		req.Output = openAIOutput(req.Output) // the schema's name the OpenAI formats require
	}
	var msgs []message
	for _, m := range req.Messages {
		var parts []part
		for _, p := range m.Parts {
			if p.Type == partText && p.Text == "" {
				continue
			}
			p.ToolCallID = messagesToolID(p.ToolCallID) // as messages takes it
			if p.Type == partToolCall && !p.Custom {
				if p.Arguments = argumentsText(p.Arguments); json.Valid([]byte(p.Arguments)) {
					p.Arguments = string(canonicalJSON(json.RawMessage(p.Arguments)))
				}
			}
			parts = append(parts, p)
		}
		if m.Role == "user" { // tool results go first in a user turn
			slices.SortStableFunc(parts, func(a, b part) int { return boolRank(b.Type == partToolResult) - boolRank(a.Type == partToolResult) })
		}
		switch {
		case len(parts) == 0:
		case m.Role == "system" && len(msgs) == 0: // a system turn with no turn before it leads
			req.System = joinText(req.System, textOf(parts, ""))
		default:
			msgs = append(msgs, message{m.Role, parts})
		}
	}
	req.Messages = msgs
	if len(req.Tools) == 0 {
		req.ParallelToolCalls = nil // says nothing without tools; messages cannot send it then
	}
	req.Tools = slices.Clone(req.Tools)
	for i, tl := range req.Tools {
		req.Tools[i].Namespace = "" // flattened toward every provider
		if tl.Type == toolFunction && tl.Parameters == nil {
			req.Tools[i].Parameters = orEmptySchema(nil) // the schema a protocol that requires one gets
		}
		if !valueOr(tl.Strict, false) {
			req.Tools[i].Strict = nil // responses gets strict false written out (its own default is true)
		}
		req.Tools[i].Parameters, req.Tools[i].Format = canonicalJSON(req.Tools[i].Parameters), canonicalJSON(tl.Format)
	}
	if req.Output != nil {
		req.Output.Schema = canonicalJSON(req.Output.Schema)
	}
	return req
}

// canonicalJSON is raw as encoding/json writes it (compact, HTML-escaped).
func canonicalJSON(raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return nil
	}
	return must(json.Marshal(raw))
}

func FuzzParseChatCompletions(f *testing.F) {
	fuzzDialectParse(f, dialectChat,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"f"}},"max_tokens":5}`,
		`{"model":1}`, `[]`, `{"model":"m","messages":[]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"q"},{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBE","filename":"a.pdf"}}]},{"role":"system","content":"later"},{"role":"assistant","tool_calls":[{"id":"c","type":"custom","custom":{"name":"p","input":"x"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}],"tools":[{"type":"custom","custom":{"name":"p","format":{"type":"text"}}}],"stop":"END","top_p":0.5,"reasoning_effort":"low","parallel_tool_calls":false,"store":false,"response_format":{"type":"json_schema","json_schema":{"name":"o","schema":{"type":"object"}}}}`)
}

func FuzzParseMessages(f *testing.F) {
	fuzzDialectParse(f, dialectMessages,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]},{"role":"assistant","content":[{"type":"tool_use","id":"t.0","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t.0","content":[{"type":"text","text":"r"}],"is_error":true}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}}`,
		`{"model":"m","messages":[{"role":"system","content":"x"}]}`, `null`,
		`{"model":"m","max_tokens":9000,"thinking":{"type":"enabled","budget_tokens":2048},"stop_sequences":["E"],"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}},"tool_choice":{"type":"auto","disable_parallel_tool_use":true},"tools":[{"name":"f","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":[{"type":"text","text":"q","cache_control":{"type":"ephemeral"}},{"type":"document","source":{"type":"text","media_type":"text/plain","data":"doc"},"title":"d"}]},{"role":"system","content":"later"},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"text","text":"a"}]}]}`)
}

func FuzzParseResponses(f *testing.F) {
	fuzzDialectParse(f, dialectResponses,
		`{"model":"m","input":"hi"}`,
		`{"model":"m","instructions":"s","input":[{"role":"developer","content":"d"},{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"data:image/png;base64,AA=="}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},"max_output_tokens":9}`,
		`{"model":"m","input":[]}`, `{"model":"m","input":[{"type":"item_reference","id":"x"}]}`,
		`{"model":"m","input":[{"type":"additional_tools","role":"developer","tools":[{"type":"namespace","name":"functions","tools":[{"type":"custom","name":"exec"}]}]},{"role":"user","content":"q"},{"type":"custom_tool_call","call_id":"c","namespace":"functions","name":"exec","input":"x"},{"type":"custom_tool_call_output","call_id":"c","output":[{"type":"input_text","text":"ok"}]}]}`,
		`{"model":"m","input":[{"role":"user","content":"q"},{"role":"developer","content":"later"},{"type":"function_call","call_id":"c","namespace":"ns","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"},{"type":"custom_tool_call","call_id":"p","name":"patch","input":"x"},{"type":"custom_tool_call_output","call_id":"p","output":"ok"},{"type":"web_search_call","id":"w"}],"tools":[{"type":"custom","name":"patch"},{"type":"namespace","name":"ns","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]},{"type":"web_search"}],"tool_choice":{"type":"function","namespace":"ns","name":"f"},"reasoning":{"effort":"high"},"text":{"format":{"type":"json_schema","name":"o","schema":{"type":"object"}}},"store":false}`)
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestAdaptiveThinking: Claude 4.6 and later take adaptive thinking, as
// Claude Code decides; earlier, dated and unknown models take a budget.
func TestAdaptiveThinking(t *testing.T) {
	for model, want := range map[string]bool{
		"claude-opus-4-7": true, "claude-sonnet-4-6": true, "claude-opus-4-6-20260101": true, "claude-opus-5": true, "claude-haiku-5-1": true,
		"claude-sonnet-4-5-20250929": false, "claude-opus-4-20250514": false, "claude-haiku-4-5": false, "claude-opus-4-1": false,
		"claude-3-7-sonnet-latest": false, "claude-test": false, "kimi-for-coding": false, "": false,
	} {
		if got := adaptiveModels.MatchString(model); got != want {
			t.Errorf("adaptiveModels.MatchString(%q) = %v, want %v", model, got, want)
		}
	}
}

// joinText joins two instruction texts as the parsers do (chatRequest.addSystemOf).
func joinText(sys, more string) string {
	return strings.Join(slices.DeleteFunc([]string{sys, more}, func(s string) bool { return s == "" }), "\n\n")
}

// flushCounter is a ResponseWriter that counts its flushes.
type flushCounter struct {
	httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() { f.flushes++ }

// TestCallerStreamFlushesOnlyWhatIsUnflushed: a flushing write flushes only bytes written since the last flush, and
// each flush restarts the keep-alive timer; close stops it, and after close nothing reaches the writer.
func TestCallerStreamFlushesOnlyWhatIsUnflushed(t *testing.T) {
	testingOnlyKeepAlive = time.Hour
	t.Cleanup(func() { testingOnlyKeepAlive = 0 })
	w := &flushCounter{ResponseRecorder: *httptest.NewRecorder()}
	s := openStreamAnswer(w, nil, false, dialectChat, chatRequest{}, "m", 1)
	for i, step := range []struct {
		b     string
		flush bool
		want  int // flushes after the write, the head's included
	}{{"a", false, 1}, {"", true, 2}, {"", true, 2}, {"b", true, 3}} {
		if err := s.write([]byte(step.b), step.flush); err != nil || w.flushes != step.want {
			t.Fatalf("write %d: %d flushes (%v), want %d", i, w.flushes, err, step.want)
		}
	}
	if s.timer.Stop(); s.write([]byte("c"), true) != nil || !s.timer.Stop() { // Stop reports whether it was armed
		t.Errorf("a flush did not restart the keep-alive")
	}
	s.write([]byte("d"), true)
	s.close()
	if s.timer.Stop() {
		t.Errorf("the keep-alive is still armed after close")
	}
	if err := s.write([]byte(": keep-alive\n\n"), true); err != nil || w.Body.String() != "abcd" || w.flushes != 5 {
		t.Fatalf("a write after close: err %v, body %q, %d flushes; want nothing written", err, w.Body.String(), w.flushes)
	}
}

// TestResponsesCallItemsWhole: a call item is added with empty arguments, and a call whose pieces go on after its
// item was done (a provider interleaving text and a call) ends with its whole arguments, in the events and the response.
func TestResponsesCallItemsWhole(t *testing.T) {
	var buf bytes.Buffer
	s := newCallerStream(dialectResponses, chatRequest{}, &buf, func() {}, "m")
	for i, step := range []func() error{
		func() error { return s.frames(s, stepBegin, nil, "") },
		func() error { return s.call(0, part{ToolCallID: "c1", ToolName: "f", Arguments: `{"a"`}) },
		func() error { return s.text("hi") },
		func() error { return s.call(0, part{Arguments: `:1}`}) },
		func() error { return s.finish(nil) },
	} {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	var added, completed string
	var indexed []string // delta events: a text delta names its content part (0), a call's arguments delta none
	for _, f := range splitTestSSE(t, buf.String()) {
		switch f.Event {
		case "response.output_item.added":
			if added == "" {
				added = f.Data
			}
		case "response.completed":
			completed = f.Data
		case "response.output_text.delta", "response.function_call_arguments.delta":
			indexed = append(indexed, fmt.Sprintf("%s %v", f.Event, strings.Contains(f.Data, `"content_index":0`)))
		}
	}
	want := []string{"response.function_call_arguments.delta false", "response.output_text.delta true", "response.function_call_arguments.delta false"}
	if diff := cmp.Diff(want, indexed); diff != "" {
		t.Errorf("delta events with content_index 0 (-want +got):\n%s", diff)
	}
	if !strings.Contains(added, `"type":"function_call"`) || !strings.Contains(added, `"arguments":""`) {
		t.Errorf("the call's output_item.added %s, want a function_call with empty arguments", added)
	}
	if !strings.Contains(completed, `"arguments":"{\"a\":1}"`) {
		t.Errorf("response.completed %s, want the call's whole arguments", completed)
	}
}

// TestResponsesEncodesEmptyCallInput: toward a Responses provider a function call with no arguments carries "{}" (JSON
// text the provider parses), a custom tool call its input as is, even empty.
func TestResponsesEncodesEmptyCallInput(t *testing.T) {
	req := chatRequest{Model: "m", Messages: []message{
		{Role: "user", Parts: []part{{Type: partText, Text: "q"}}},
		{Role: "assistant", Parts: []part{{Type: partToolCall, ToolCallID: "c1", ToolName: "f"},
			{Type: partToolCall, ToolCallID: "c2", ToolName: "p", Custom: true}}},
	}}
	body, err := encodeResponses(&req, call{res: resolution{Model: "m"}}, http.Header{})
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Input []map[string]any }
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	var calls []map[string]any
	for _, it := range out.Input {
		if it["call_id"] != nil {
			delete(it, "namespace")
			calls = append(calls, it)
		}
	}
	want := []map[string]any{{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
		{"type": "custom_tool_call", "call_id": "c2", "name": "p", "input": ""}}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("call items (-want +got):\n%s", diff)
	}
}

// TestTranslatedStreamHoldsNoEvent: a translated stream flushes what it wrote before Brama next waits on the provider
// (SPEC §7.5, REFERENCE), as a relay does (the last row), so no event waits in Brama for a later one, also when the
// last event of a read writes nothing (a chat chunk of an empty delta, Anthropic's ping) or a comment ends it
// (OpenRouter's ": OPENROUTER PROCESSING", which is no block and so no reason not to flush). The provider sends its first
// read, then waits until the caller has the text; if Brama held it, the provider gives up after 10 s (a failure
// detector, not a clock).
func TestTranslatedStreamHoldsNoEvent(t *testing.T) {
	const (
		chatFirst = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n" +
			"data: {\"choices\":[{\"index\":0,\"delta\":{}}]}\n\n"
		chatRest = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
		msgFirst = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1}}}\n\n" +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n" +
			"event: ping\ndata: {\"type\":\"ping\"}\n\n"
		msgRest = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n" +
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	)
	seen := make(chan chan struct{}, 1) // the running case's: closed once its caller has the first text
	provider := func(first, rest string) *fakeProvider {
		return newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, first)
			w.(http.Flusher).Flush()
			select {
			case <-<-seen:
			case <-time.After(10 * time.Second):
				t.Errorf("the caller did not get the first read's text while the provider waited")
			}
			io.WriteString(w, rest)
		})
	}
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = provider(chatFirst, chatRest).URL
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = provider(msgFirst, msgRest).URL
	env["BRAMA_PROVIDER_OPENROUTER_BASE_URL"] = provider(chatFirst[:strings.Index(chatFirst, "\n\n")+2]+": OPENROUTER PROCESSING\n\n", chatRest).URL
	d := startDaemon(t, env, `{"openai":"k1","anthropic":"k2","openrouter":"k3"}`, "-local-credentials-stdin")
	for _, tc := range []struct{ dialect, model, text string }{
		{dialectMessages, "openai/gpt-test", `"text":"Hel"`},
		{dialectResponses, "openai/gpt-test", `"delta":"Hel"`},
		{dialectChat, "anthropic/claude-test", `"content":"Hel"`},
		{dialectChat, "openai/gpt-test", `"content":"Hel"`}, // passthrough: relayed as received, flushed the same way
		{dialectMessages, "openrouter/gpt-test", `"text":"Hel"`},
		{dialectChat, "openrouter/gpt-test", `"content":"Hel"`},
	} {
		t.Run(tc.dialect+" from "+tc.model, func(t *testing.T) {
			got := make(chan struct{})
			seen <- got
			resp := d.openStream(dialectPaths[tc.dialect], d.token, chatBody(tc.dialect, tc.model, true, ""))
			defer resp.Body.Close()
			var body []byte
			for buf := make([]byte, 4096); ; {
				n, err := resp.Body.Read(buf)
				if body = append(body, buf[:n]...); got != nil && bytes.Contains(body, []byte(tc.text)) {
					close(got)
					got = nil
				}
				if err != nil {
					break
				}
			}
			if got != nil || !bytes.Contains(body, []byte(`lo"`)) {
				t.Errorf("caller got %q; want the first read's text before the provider went on, then the rest", body)
			}
		})
	}
}
