package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// readAllRaw reads every block of a passthrough stream.
func readAllRaw(in []byte) (blocks [][]byte, evs []sseEvent, err error) {
	rd := newSSEReader(bytes.NewReader(in), "\n")
	for {
		raw, event, data, err := rd.next()
		if err != nil {
			return blocks, evs, err
		}
		blocks, evs = append(blocks, bytes.Clone(raw)), append(evs, sseEvent{event, string(data)})
	}
}

// FuzzPassthroughStream checks the passthrough stream parser: blocks are
// whole (each ends with a line terminator), relaying them frames the same
// events again, and the reader of every format, relaying or translating,
// classifies every event without panicking: a refusal is provider_incomplete
// or provider_failure.
func FuzzPassthroughStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"))
	f.Add([]byte(": keep-alive\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n"))
	f.Add([]byte("\ufeffdata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":1}}}\n\ndata: cut"))
	f.Fuzz(func(t *testing.T, in []byte) {
		blocks, evs, err := readAllRaw(in)
		if err != io.EOF && err != io.ErrUnexpectedEOF {
			t.Fatalf("unclassified error: %v", err)
		}
		for _, b := range blocks {
			if !bytes.HasSuffix(b, []byte("\n")) {
				t.Fatalf("block %q does not end a line", b)
			}
		}
		_, again, err := readAllRaw(bytes.Join(blocks, nil))
		if err != io.EOF {
			t.Fatalf("re-read of the relayed blocks: %v", err)
		}
		if diff := cmp.Diff(evs, again); diff != "" {
			t.Fatalf("relayed blocks frame other events (-first +second):\n%s", diff)
		}
		for i, proto := range []string{protoOpenAIChat, protoAnthropic, protoOpenAIResponses, protoOpenAIChat, protoAnthropic, protoOpenAIResponses} {
			pw := &streamReader{protocol: proto, dropUsage: true, calls: map[int]*upstreamCall{}, raw: map[int][]byte{}}
			if i >= 3 { // the same reader translating too
				pw.out = &callerStream{frames: func(*callerStream, streamStep, *streamBlock, string) error { return nil }}
			}
			for _, ev := range evs {
				_, end, err := pw.read(ev.Event, []byte(ev.Data))
				var ae *apiError
				if err != nil && (!errors.As(err, &ae) || (ae.Code != "provider_incomplete" && ae.Code != "provider_failure")) {
					t.Fatalf("%s: unclassified refusal %v", proto, err)
				}
				if err != nil || end {
					break
				}
			}
		}
		codex := call{res: resolution{Provider: providerInfo{protocol: protoOpenAIResponses, codex: true}}}
		resp := &http.Response{Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(in))}
		relayBuffered(nil, codex, resp, 1, nil) // a codex stream assembled: must not panic whatever the items are
	})
}

// FuzzPassthroughBody checks the body editor: with no edit the body is
// unchanged; with edits it is valid JSON holding the edited members and
// every other member's value exactly as before.
func FuzzPassthroughBody(f *testing.F) {
	f.Add([]byte(`{"model":"a/b","max_output_tokens":{"n":"s"},"x":[1,{"y":"\"}"}]}`))
	f.Add([]byte(" {\n \"max_\\u006futput_tokens\" : null , \"model\":1}\n"))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"model":"m","model":"n","stream_options":{"include_usage":false}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		o, err := parseRawObject(in)
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) || ae.Code != "invalid_request" {
				t.Fatalf("unclassified refusal %v", err)
			}
			return
		}
		if !bytes.Equal(o.edit(), in) {
			t.Fatalf("an empty edit changed the body")
		}
		out := o.edit(memberEdit{"model", []byte(`"upstream"`)}, memberEdit{"max_output_tokens", nil}, memberEdit{"max_tokens", []byte("7")})
		var before, after map[string]json.RawMessage
		if json.Unmarshal(in, &before) != nil {
			t.Fatalf("parseRawObject accepted %q that is no object", in)
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("edited body is not an object: %v\n%s", err, out)
		}
		if string(after["model"]) != `"upstream"` || after["max_output_tokens"] != nil {
			t.Fatalf("edits not applied: %s", out)
		}
		if _, had := before["max_tokens"]; !had && string(after["max_tokens"]) != "7" {
			t.Fatalf("added member missing: %s", out)
		}
		for k, v := range before {
			if k == "model" || k == "max_output_tokens" || k == "max_tokens" {
				continue
			}
			if !bytes.Equal(after[k], v) {
				t.Fatalf("member %q changed: %s → %s", k, v, after[k])
			}
		}
	})
}

// watchedEvents are one relayed event per format, as the relay watches them.
var watchedEvents = []struct{ proto, data string }{
	{protoOpenAIChat, `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hello"},"finish_reason":null}]}`},
	{protoAnthropic, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello"}}`},
	{protoOpenAIResponses, `{"type":"response.output_text.delta","item_id":"x","output_index":0,"content_index":0,"delta":"hello"}`},
}

// TestPassthroughWatchAllocatesNothing: the relay reads each event of a same-format stream without an allocation, in
// each format (TESTING.md); a member's type or key without escapes is read in place (rawText).
func TestPassthroughWatchAllocatesNothing(t *testing.T) {
	if bi, _ := debug.ReadBuildInfo(); bi != nil && slices.Contains(bi.Settings, debug.BuildSetting{Key: "-race", Value: "true"}) {
		t.Skip("the race detector's runtime allocates on its own")
	}
	for _, tc := range watchedEvents {
		pw, data := &streamReader{protocol: tc.proto}, []byte(tc.data)
		if n := testing.AllocsPerRun(100, func() { pw.read("", data) }); n != 0 {
			t.Errorf("%s: %v allocations per event, want 0", tc.proto, n)
		}
	}
}

// BenchmarkPassthroughWatchEvent measures the watch of one relayed event per
// format: it allocates nothing (a usage struct that escapes, declared before
// its null test, would cost one allocation per event).
func BenchmarkPassthroughWatchEvent(b *testing.B) {
	for _, tc := range watchedEvents {
		b.Run(tc.proto, func(b *testing.B) {
			pw, data := &streamReader{protocol: tc.proto}, []byte(tc.data)
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := pw.read("", data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(testing.AllocsPerRun(100, func() { pw.read("", data) })), "allocs/event")
		})
	}
}
