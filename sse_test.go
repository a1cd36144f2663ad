package main

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

// readAllSSE reads events until the reader's first error.
// sseEvent is one dispatched server-sent event: its event name and its data lines joined with "\n".
type sseEvent struct{ Event, Data string }

func readAllSSE(r io.Reader) ([]sseEvent, error) {
	s := newSSEReader(r, "\r\n")
	var evs []sseEvent
	for {
		_, event, data, err := s.next()
		if err != nil {
			return evs, err
		}
		if data != nil { // a block without data dispatches nothing
			evs = append(evs, sseEvent{event, string(data)})
		}
	}
}

func TestSSEReader(t *testing.T) {
	long := strings.Repeat("x", 200<<10) // past bufio.Scanner's 64 KiB cap and our buffer
	tests := []struct {
		name    string
		in      string
		want    []sseEvent
		wantErr error
	}{
		{"lf", "event: a\ndata: 1\n\ndata: 2\n\n", []sseEvent{{"a", "1"}, {"", "2"}}, io.EOF},
		{"crlf", "event: a\r\ndata: 1\r\n\r\n", []sseEvent{{"a", "1"}}, io.EOF},
		{"cr", "event: a\rdata: 1\r\r", []sseEvent{{"a", "1"}}, io.EOF},
		{"multi-line data", "data: a\ndata:b\ndata:  c\n\n", []sseEvent{{"", "a\nb\n c"}}, io.EOF},
		{"comments and unknown fields", ": keep-alive\n\nid: 7\nretry: 10\nfoo\nevent: x\n: inner\ndata: y\n\n", []sseEvent{{"x", "y"}}, io.EOF},
		{"no data dispatches nothing", "event: x\n\ndata: y\n\n", []sseEvent{{"", "y"}}, io.EOF},
		{"empty data line", "data:\n\n", []sseEvent{{"", ""}}, io.EOF},
		{"bom", "\ufeffdata: y\n\n", []sseEvent{{"", "y"}}, io.EOF},
		{"last event without blank line", "data: a\n\ndata: [DONE]\n", []sseEvent{{"", "a"}, {"", "[DONE]"}}, io.EOF},
		{"partial last line", "data: a\n\ndata: [DO", []sseEvent{{"", "a"}}, io.ErrUnexpectedEOF},
		{"long line", "data: " + long + "\n\n", []sseEvent{{"", long}}, io.EOF},
		{"empty", "", nil, io.EOF},
		{"a lone bom is an empty body", "\ufeff", nil, io.EOF},
		{"a bom then a cut line", "\ufeffdata: y", nil, io.ErrUnexpectedEOF},
		{"a bom after the start is a cut line", "data: a\n\n\ufeff", []sseEvent{{"", "a"}}, io.ErrUnexpectedEOF},
		{"a last line ended by a lone cr", "data: a\r", []sseEvent{{"", "a"}}, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readAllSSE(strings.NewReader(tt.in))
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}

// oneChunk delivers one chunk, then fails the test's reader: an event complete in it must come without a second read.
type oneChunk struct {
	chunk string
	reads int
}

func (r *oneChunk) Read(p []byte) (int, error) {
	if r.reads++; r.reads > 1 {
		return 0, errors.New("read past the first chunk")
	}
	return copy(p, r.chunk), nil
}

// TestSSEReaderDeliversAnEventWithoutReadingAhead: an event whose lines end in a lone CR (WHATWG), followed by more of
// the stream, is delivered from what was read: the reader waits for more only when a CR ends the bytes it has.
func TestSSEReaderDeliversAnEventWithoutReadingAhead(t *testing.T) {
	r := &oneChunk{chunk: "data: a\r\rdata: b"}
	_, _, data, err := newSSEReader(r, "\r\n").next()
	if string(data) != "a" || err != nil || r.reads != 1 {
		t.Errorf("first event %q, %v after %d reads; want a after one read", data, err, r.reads)
	}
}

// The reader keeps no comment line (SPEC §17): a relayed block holds none,
// and a run of comments without a blank line is no block at all.
func TestSSEReaderKeepsNoComment(t *testing.T) {
	in := ": keep-alive\n\nevent: x\n: inner\ndata: y\n\n" + strings.Repeat(": ping\n", 1000) + "data: z\n\n"
	blocks, evs, err := readAllRaw([]byte(in))
	if err != io.EOF {
		t.Errorf("err = %v, want EOF", err)
	}
	if diff := cmp.Diff([][]byte{[]byte("event: x\ndata: y\n\n"), []byte("data: z\n\n")}, blocks); diff != "" {
		t.Errorf("blocks (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]sseEvent{{"x", "y"}, {"", "z"}}, evs); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestSSEReaderKeepsReadError(t *testing.T) {
	errCut := errors.New("connection reset")
	for _, in := range []string{"data: a\n\ndata: b\n", "data: a\n\ndata: b"} { // the cut after a line, in one
		got, err := readAllSSE(io.MultiReader(strings.NewReader(in), errReader{errCut}))
		if !errors.Is(err, errCut) {
			t.Errorf("%q: err = %v, want the read error", in, err)
		}
		if diff := cmp.Diff([]sseEvent{{"", "a"}}, got); diff != "" {
			t.Errorf("%q: events (-want +got):\n%s", in, diff)
		}
	}
}

// serializeSSE writes events back in the canonical form.
func serializeSSE(evs []sseEvent) []byte {
	var b bytes.Buffer
	for _, ev := range evs {
		if ev.Event != "" {
			b.WriteString("event: " + ev.Event + "\n")
		}
		for _, l := range strings.Split(ev.Data, "\n") {
			b.WriteString("data: " + l + "\n")
		}
		b.WriteString("\n")
	}
	return b.Bytes()
}

func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("event: a\ndata: 1\n\ndata: 2\r\n\r\n"))
	f.Add([]byte(": c\rdata:x\rdata: y\r\rid: 1\n\n"))
	f.Add([]byte("\ufeffevent:\ndata\n\ndata: [DONE]"))
	f.Fuzz(func(t *testing.T, in []byte) {
		evs, err := readAllSSE(bytes.NewReader(in))
		if err != io.EOF && err != io.ErrUnexpectedEOF {
			t.Fatalf("unclassified error: %v", err)
		}
		for _, ev := range evs {
			if strings.ContainsAny(ev.Event, "\r\n") || strings.ContainsAny(ev.Data, "\r") {
				t.Fatalf("line terminator inside %q", ev)
			}
		}
		// A byte a read, a line's end is searched for where the last read left off.
		if bytewise, _ := readAllSSE(iotest.OneByteReader(bytes.NewReader(in))); !cmp.Equal(evs, bytewise) {
			t.Fatalf("read a byte at a time: %q, whole: %q", bytewise, evs)
		}
		again, err := readAllSSE(bytes.NewReader(serializeSSE(evs)))
		if err != io.EOF {
			t.Fatalf("re-read: %v", err)
		}
		if diff := cmp.Diff(evs, again); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}

// TestSSEReaderEndsTheLastBlock: a provider's last block without its blank line is relayed ended by one, or the caller's
// SSE parser (which dispatches an event only at a blank line) loses the terminal event the provider sent (SPEC §7.5).
func TestSSEReaderEndsTheLastBlock(t *testing.T) {
	blocks, _, err := readAllRaw([]byte("data: a\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n"))
	if err != io.EOF {
		t.Errorf("err = %v, want EOF", err)
	}
	want := [][]byte{[]byte("data: a\n\n"), []byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")}
	if diff := cmp.Diff(want, blocks); diff != "" {
		t.Errorf("blocks (-want +got):\n%s", diff)
	}
}
