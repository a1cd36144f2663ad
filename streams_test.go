package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// assembleStream is a whole stream as one answer, as a buffered caller of codex gets it (SPEC §6.2).
func assembleStream(protocol string, body io.Reader) (chatAnswer, error) {
	return answerOf(protocol, body, nil)
}

// streamEvent is one call a stream reader makes of its caller stream, as a value the tests compare.
type streamEvent struct {
	Kind     string
	Text     string
	Index    int
	ToolCall toolCall
	Finish   string
	Usage    usage
}

const (
	eventText          = "text"
	eventToolCallStart = "tool_call_start"
	eventToolCallArgs  = "tool_call_args"
	eventFinish        = "finish"
	eventUsage         = "usage"
)

// feed makes ev's call of s.
func feed(s *callerStream, ev streamEvent) error {
	switch ev.Kind {
	case eventText:
		return s.text(ev.Text)
	case eventToolCallStart:
		return s.call(ev.Index, callPart(ev.ToolCall))
	case eventToolCallArgs:
		return s.call(ev.Index, part{Arguments: ev.Text})
	case eventFinish:
		s.rd.finish = ev.Finish
		return s.openBlock(nil)
	}
	s.rd.usage = ev.Usage
	return nil
}

// readEvents runs a translating reader of protocol over body into a caller stream whose frames record
// each call as an event (the tail: finish, then usage when reported) and give it to each, which may fail it.
func readEvents(protocol string, body io.Reader, each func(streamEvent) error) (*callerStream, error) {
	s := &callerStream{frames: func(s *callerStream, step streamStep, b *streamBlock, d string) error {
		switch {
		case step == stepOpen && !b.text:
			return each(streamEvent{Kind: eventToolCallStart, Index: b.index, ToolCall: toolCall{ID: b.id, Name: b.name, Custom: b.custom}})
		case step == stepDelta && b.text:
			return each(text(d))
		case step == stepDelta:
			return each(args(b.index, d))
		}
		return nil
	}}
	_, err := s.answer(call{res: resolution{Provider: providerInfo{protocol: protocol}}}, body, nil, true, false) // the finish and usage follow
	if err == nil {
		err = each(finish(s.rd.finish))
	}
	if err == nil && s.rd.usage.Reported {
		err = each(streamEvent{Kind: eventUsage, Usage: s.rd.usage})
	}
	return s, err
}

// collectStream runs a translating reader over body and returns the events it made.
func collectStream(t *testing.T, protocol string, body io.Reader) ([]streamEvent, error) {
	t.Helper()
	var got []streamEvent
	_, err := readEvents(protocol, body, func(ev streamEvent) error {
		got = append(got, ev)
		return nil
	})
	return got, err
}

func fixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "providers", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func text(s string) streamEvent { return streamEvent{Kind: eventText, Text: s} }
func start(i int, id, name string) streamEvent {
	return streamEvent{Kind: eventToolCallStart, Index: i, ToolCall: toolCall{ID: id, Name: name}}
}
func args(i int, s string) streamEvent {
	return streamEvent{Kind: eventToolCallArgs, Index: i, Text: s}
}
func finish(f string) streamEvent { return streamEvent{Kind: eventFinish, Finish: f} }
func used(in, out int) streamEvent {
	return streamEvent{Kind: eventUsage, Usage: usage{InputTokens: in, OutputTokens: out, Reported: true}}
}

func TestReadUpstreamStreamFixtures(t *testing.T) {
	tests := []struct {
		name     string
		protocol string
		file     string
		want     []streamEvent
	}{
		{"openai-chat", protoOpenAIChat, "openai-chat.sse", []streamEvent{
			text("Hel"), text("lo"),
			start(0, "call_abc", "get_weather"), args(0, `{"city":`), args(0, `"Paris"}`),
			start(1, "call_def", "get_time"), args(1, "{}"),
			finish(finishToolCalls), used(31, 17),
		}},
		{"anthropic-messages", protoAnthropic, "anthropic-messages.sse", []streamEvent{
			text("Hel"), text("lo"),
			start(0, "toolu_01", "get_weather"), args(0, `{"city": `), args(0, `"Paris"}`),
			start(1, "toolu_02", "get_time"), args(1, "{}"),
			finish(finishToolCalls), used(40, 42),
		}},
		{"openai-responses", protoOpenAIResponses, "openai-responses.sse", []streamEvent{
			text("Hel"), text("lo"),
			start(0, "call_1", "get_weather"), args(0, `{"city":`), args(0, `"Paris"}`),
			finish(finishToolCalls), used(20, 9),
		}},
		{"codex", protoOpenAIResponses, "codex.sse", []streamEvent{
			text("Checking "), text("the weather."),
			start(0, "call_c", "get_weather"), args(0, `{"city":"Oslo"}`),
			finish(finishToolCalls), used(1200, 64),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := collectStream(t, tt.protocol, strings.NewReader(fixture(t, tt.file)))
			if err != nil {
				t.Fatalf("readUpstreamStream: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// cutAt returns body up to (not including) the first occurrence of marker.
func cutAt(t *testing.T, body, marker string) string {
	t.Helper()
	i := strings.Index(body, marker)
	if i < 0 {
		t.Fatalf("marker %q not in fixture", marker)
	}
	return body[:i]
}

func TestReadUpstreamStreamFailures(t *testing.T) {
	chat := fixture(t, "openai-chat.sse")
	anth := fixture(t, "anthropic-messages.sse")
	resp := fixture(t, "openai-responses.sse")
	tests := []struct {
		name     string
		protocol string
		body     io.Reader
		code     string
		inMsg    string // the message must contain this
	}{
		{"chat cut before finish", protoOpenAIChat, strings.NewReader(cutAt(t, chat, `data: {"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1735689600,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},`)), "provider_incomplete", "terminal"},
		{"chat DONE before finish", protoOpenAIChat, strings.NewReader("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"), "provider_incomplete", "terminal"},
		{"chat cut mid line", protoOpenAIChat, strings.NewReader("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choi"), "provider_incomplete", ""},
		{"chat connection reset", protoOpenAIChat, io.MultiReader(strings.NewReader("data: {\"choices\":[]}\n\n"), errReader{errors.New("connection reset by peer")}), "provider_incomplete", "connection reset"},
		{"chat in-band error", protoOpenAIChat, strings.NewReader("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"error\":{\"message\":\"Rate limit reached for sk-abcdefghijklmnop\",\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}}\n\n"), "provider_incomplete", `"rate_limit_exceeded"`},
		{"chat error event without error member", protoOpenAIChat, strings.NewReader("event: error\ndata: {\"message\":\"boom\"}\n\n"), "provider_incomplete", "unspecified"},
		{"chat error event, its data typed", protoOpenAIChat, strings.NewReader("event: error\ndata: {\"type\":\"server_error\",\"code\":\"boom\"}\n\n"), "provider_incomplete", `"boom"`},
		{"chat caller hung up", protoOpenAIChat, io.MultiReader(strings.NewReader("data: {\"choices\":[]}\n\n"), errReader{context.Canceled}), "client_cancelled", "caller went away"},
		{"chat malformed", protoOpenAIChat, strings.NewReader("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {not json\n\n"), "provider_failure", "malformed"},
		{"chat tool call without name", protoOpenAIChat, strings.NewReader("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]}}]}\n\n"), "provider_failure", "malformed"},
		{"chat wrong shape", protoOpenAIChat, strings.NewReader("data: {\"choices\":\"nope\"}\n\n"), "provider_failure", "malformed"},
		{"chat usage not an object", protoOpenAIChat, strings.NewReader("data: {\"choices\":[],\"usage\":\"lots\"}\n\n"), "provider_failure", "malformed"},
		{"anthropic cut before message_stop", protoAnthropic, strings.NewReader(cutAt(t, anth, "event: message_stop")), "provider_incomplete", "terminal"},
		{"anthropic in-band error", protoAnthropic, strings.NewReader(cutAt(t, anth, "event: content_block_start") + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"), "provider_incomplete", `"overloaded_error"`},
		{"anthropic error event, its data typed", protoAnthropic, strings.NewReader("event: error\ndata: {\"type\":\"overloaded_error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n"), "provider_incomplete", `"overloaded_error"`},
		{"anthropic malformed", protoAnthropic, strings.NewReader("event: message_start\ndata: {\"type\":\"message_start\",\"message\":\n\n"), "provider_failure", "malformed"},
		{"anthropic json delta outside tool", protoAnthropic, strings.NewReader("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n"), "provider_failure", "malformed"},
		{"anthropic block start without its block", protoAnthropic, strings.NewReader("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0}\n\n"), "provider_failure", "malformed"},
		{"anthropic block delta without its delta", protoAnthropic, strings.NewReader("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0}\n\n"), "provider_failure", "malformed"},
		{"anthropic block with a bad index", protoAnthropic, strings.NewReader("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":\"0\"}\n\n"), "provider_failure", "malformed"},
		{"responses cut before completed", protoOpenAIResponses, strings.NewReader(cutAt(t, resp, "event: response.completed")), "provider_incomplete", "terminal"},
		{"responses error event", protoOpenAIResponses, strings.NewReader("event: error\ndata: {\"type\":\"error\",\"code\":\"usage_limit_reached\",\"message\":\"The usage limit has been reached\",\"param\":null,\"sequence_number\":3}\n\n"), "provider_incomplete", `"usage_limit_reached"`},
		{"responses failed", protoOpenAIResponses, strings.NewReader("event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":5,\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"insufficient_quota\",\"message\":\"You exceeded your current quota\"},\"output\":[]}}\n\n"), "provider_incomplete", `"insufficient_quota"`},
		{"responses malformed", protoOpenAIResponses, strings.NewReader("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":7}\n\n"), "provider_failure", "malformed"},
		{"responses event without type", protoOpenAIResponses, strings.NewReader("data: {}\n\n"), "provider_failure", "malformed"},
		{"responses call item without a name", protoOpenAIResponses, strings.NewReader("data: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"function_call\",\"call_id\":\"c1\",\"arguments\":\"\"}}\n\n"), "provider_failure", "malformed"},
		{"responses args outside function call", protoOpenAIResponses, strings.NewReader("data: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":4,\"delta\":\"{}\"}\n\n"), "provider_failure", "malformed"},
		{"empty body", protoOpenAIResponses, strings.NewReader(""), "provider_incomplete", "terminal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := collectStream(t, tt.protocol, tt.body)
			var ae *apiError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, want an *apiError", err)
			}
			if ae.Code != tt.code {
				t.Errorf("code = %q, want %q (%v)", ae.Code, tt.code, err)
			}
			if !strings.Contains(ae.Message, tt.inMsg) {
				t.Errorf("message %q does not contain %q", ae.Message, tt.inMsg)
			}
			if strings.Contains(ae.Message, "sk-abcdefghijklmnop") {
				t.Errorf("message %q quotes a secret", ae.Message)
			}
			for _, ev := range got { // a usage reported before the failure is emitted: spend is recorded (SPEC §7.5)
				if ev.Kind == eventFinish {
					t.Errorf("a failed stream emitted %q", ev.Kind)
				}
			}
		})
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func TestReadUpstreamStreamChatEndsWithoutDone(t *testing.T) {
	// A finish_reason is the terminal signal even when [DONE] never comes and
	// the connection then fails; the usage chunk in between is kept.
	body := io.MultiReader(strings.NewReader(
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n"+
			"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"+
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n"),
		errReader{errors.New("connection reset by peer")})
	got, err := collectStream(t, protoOpenAIChat, body)
	if err != nil {
		t.Fatalf("readUpstreamStream: %v", err)
	}
	want := []streamEvent{text("hi"), finish(finishLength), used(3, 4)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestReadUpstreamStreamResponsesIncomplete(t *testing.T) {
	body := "data: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"abc\"}\n\n" +
		"data: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"output\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":16}}}\n\n"
	got, err := collectStream(t, protoOpenAIResponses, strings.NewReader(body))
	if err != nil {
		t.Fatalf("readUpstreamStream: %v", err)
	}
	want := []streamEvent{text("abc"), finish(finishLength), used(5, 16)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestReadUpstreamStreamEmitError(t *testing.T) {
	errStop := errors.New("caller went away")
	for _, tt := range []struct{ name, protocol, file string }{
		{"openai-chat", protoOpenAIChat, "openai-chat.sse"},
		{"anthropic-messages", protoAnthropic, "anthropic-messages.sse"},
		{"openai-responses", protoOpenAIResponses, "openai-responses.sse"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := 0
			_, err := readEvents(tt.protocol, strings.NewReader(fixture(t, tt.file)), func(streamEvent) error {
				n++
				if n == 2 {
					return errStop
				}
				return nil
			})
			if err != errStop {
				t.Errorf("err = %v, want emit's own error", err)
			}
			if n != 2 {
				t.Errorf("emit called %d times after its error, want it to stop at 2", n)
			}
		})
	}
}

func TestReadUpstreamStreamInBandClass(t *testing.T) {
	tests := []struct {
		name, body, class string
	}{
		{"usage limit", `{"type":"error","code":"usage_limit_reached","message":"x","sequence_number":1}`, refusalRate},
		{"quota", `{"type":"response.failed","response":{"error":{"code":"insufficient_quota","message":"x"}}}`, refusalQuota},
		{"server error", `{"type":"response.failed","response":{"error":{"code":"server_error","message":"x"}}}`, ""},
		{"nested error", `{"type":"error","error":{"type":"invalid_request_error","code":"rate_limit_exceeded","message":"x"}}`, refusalRate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := collectStream(t, protoOpenAIResponses, strings.NewReader("data: "+tt.body+"\n\n"))
			var se *upstreamStreamError
			if !errors.As(err, &se) {
				t.Fatalf("err = %v, want an upstreamStreamError cause", err)
			}
			if se.Class != tt.class {
				t.Errorf("class = %q, want %q", se.Class, tt.class)
			}
		})
	}
}

func TestAssembleStream(t *testing.T) {
	tests := []struct {
		name, protocol, file string
		want                 chatAnswer
	}{
		{"codex", protoOpenAIResponses, "codex.sse", chatAnswer{
			Text:      "Checking the weather.",
			ToolCalls: []toolCall{{ID: "call_c", Name: "get_weather", Arguments: `{"city":"Oslo"}`}},
			Finish:    finishToolCalls, Usage: usage{InputTokens: 1200, OutputTokens: 64, Reported: true},
		}},
		{"anthropic", protoAnthropic, "anthropic-messages.sse", chatAnswer{
			Text: "Hello",
			ToolCalls: []toolCall{
				{ID: "toolu_01", Name: "get_weather", Arguments: `{"city": "Paris"}`},
				{ID: "toolu_02", Name: "get_time", Arguments: `{}`},
			},
			Finish: finishToolCalls, Usage: usage{InputTokens: 40, OutputTokens: 42, Reported: true},
		}},
		{"openai-chat", protoOpenAIChat, "openai-chat.sse", chatAnswer{
			Text: "Hello",
			ToolCalls: []toolCall{
				{ID: "call_abc", Name: "get_weather", Arguments: `{"city":"Paris"}`},
				{ID: "call_def", Name: "get_time", Arguments: `{}`},
			},
			Finish: finishToolCalls, Usage: usage{InputTokens: 31, OutputTokens: 17, Reported: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := assembleStream(tt.protocol, strings.NewReader(fixture(t, tt.file)))
			if err != nil {
				t.Fatalf("assembleStream: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("cut", func(t *testing.T) {
		_, err := assembleStream(protoOpenAIResponses, strings.NewReader(cutAt(t, fixture(t, "codex.sse"), "event: response.completed")))
		var ae *apiError
		if !errors.As(err, &ae) || ae.Code != "provider_incomplete" {
			t.Errorf("err = %v, want provider_incomplete", err)
		}
	})
}

func FuzzUpstreamStream(f *testing.F) {
	for _, s := range []struct{ protocol, file string }{
		{protoOpenAIChat, "openai-chat.sse"},
		{protoAnthropic, "anthropic-messages.sse"},
		{protoOpenAIResponses, "openai-responses.sse"},
		{protoOpenAIResponses, "codex.sse"},
	} {
		b, err := os.ReadFile(filepath.Join("testdata", "providers", s.file))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(s.protocol, b)
	}
	f.Fuzz(func(t *testing.T, protocol string, body []byte) {
		var evs []streamEvent
		started := map[int]bool{}
		_, err := readEvents(protocol, bytes.NewReader(body), func(ev streamEvent) error {
			if ev.Kind == eventToolCallArgs && !started[ev.Index] {
				t.Fatalf("arguments for tool call %d before its start", ev.Index)
			}
			if ev.Kind == eventToolCallStart {
				if started[ev.Index] || ev.Index != len(started) {
					t.Fatalf("tool call index %d out of order", ev.Index)
				}
				started[ev.Index] = true
			}
			evs = append(evs, ev)
			return nil
		})
		finishes := 0
		for _, ev := range evs {
			if ev.Kind == eventFinish {
				finishes++
			}
		}
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) || (ae.Code != "provider_failure" && ae.Code != "provider_incomplete") {
				t.Fatalf("unclassified error: %v", err)
			}
			if finishes != 0 {
				t.Fatalf("a failed stream emitted a finish")
			}
			return
		}
		if finishes != 1 {
			t.Fatalf("a complete stream emitted %d finishes", finishes)
		}
		last := evs[len(evs)-1]
		if last.Kind == eventUsage {
			last = evs[len(evs)-2]
		}
		if last.Kind != eventFinish {
			t.Fatalf("the stream did not end with its finish: %+v", evs)
		}
	})
}

func TestReadUpstreamStreamAnthropicCumulativeUsage(t *testing.T) {
	body := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":100,\"cache_read_input_tokens\":20,\"output_tokens\":8}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	got, err := collectStream(t, protoAnthropic, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]streamEvent{finish(finishLength), used(120, 8)}, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	// message_start's usage reaches the caller stream at once: a stream cut later still records it
	s, err := readEvents(protoAnthropic, strings.NewReader(cutAt(t, body, "event: message_delta")), func(streamEvent) error { return nil })
	if want := (usage{5, 1, true}); err == nil || s.rd.usage != want {
		t.Errorf("cut after message_start: usage %+v, err %v; want %+v and an error", s.rd.usage, err, want)
	}
}
