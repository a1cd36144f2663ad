package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
)

// The provider side of streams (SPEC §7.5): the SSE reader, and the
// plumbing every format's stream translator (chat.go, messages.go,
// responses.go) shares.

// sseEvent is one dispatched server-sent event: its event name ("" when the
// stream named none) and its data lines joined with "\n".
type sseEvent struct{ Event, Data string }

// sseReader splits a provider's text/event-stream body into events following
// the WHATWG event-stream grammar. It has no line-length limit of its own
// (bufio.Scanner's 64 KiB cap would cut a large tool-call argument or an
// image echo), and it never times out: SPEC §7.4.
type sseReader struct {
	r       *bufio.Reader
	pending []string // lines split out of the last physical line, not yet consumed
	line    []byte   // scratch for one physical line
	started bool     // the byte-order mark check is done
	ended   error    // the read error once the body ended
}

// newSSEReader reads events from r.
func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 16<<10)}
}

// next returns the next event. It returns io.EOF when the body ended
// cleanly and any other read error as it came. An event whose last line
// was terminated is dispatched at the end of the body even without the
// blank line after it; a partial last line is discarded as cut.
func (s *sseReader) next() (sseEvent, error) {
	var (
		ev      sseEvent
		data    strings.Builder
		hasData bool
		seen    bool // a field of this event was seen
	)
	for {
		line, err := s.nextLine()
		if err != nil {
			if seen && hasData && errors.Is(err, io.EOF) {
				ev.Data = data.String()
				return ev, nil
			}
			return sseEvent{}, err
		}
		if line == "" {
			if hasData {
				ev.Data = data.String()
				return ev, nil
			}
			// A block without data dispatches nothing and resets the name.
			ev, seen = sseEvent{}, false
			continue
		}
		if line[0] == ':' {
			continue // comment, e.g. ": keep-alive"
		}
		field, value, found := strings.Cut(line, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		seen = true
		switch field {
		case "event":
			ev.Event = value
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.WriteString(value)
			hasData = true
		}
		// "id", "retry" and unknown fields carry nothing Brama uses.
	}
}

// nextLine returns the next line without its terminator (\r\n, \n or \r).
// A final line without a terminator is reported as io.ErrUnexpectedEOF.
func (s *sseReader) nextLine() (string, error) {
	for len(s.pending) == 0 {
		if s.ended != nil {
			return "", s.ended
		}
		if err := s.readPhysical(); err != nil {
			s.ended = err
		}
	}
	l := s.pending[0]
	s.pending = s.pending[1:]
	return l, nil
}

// readPhysical reads up to the next '\n' (or the end of the body) and splits
// it at lone '\r's into pending lines. It returns the read error when the
// body ended; a trailing fragment without a terminator then makes the error
// io.ErrUnexpectedEOF.
func (s *sseReader) readPhysical() error {
	s.line = s.line[:0]
	var err error
	for {
		var chunk []byte
		chunk, err = s.r.ReadSlice('\n')
		s.line = append(s.line, chunk...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			break
		}
	}
	if !s.started && len(s.line) > 0 {
		s.line = bytes.TrimPrefix(s.line, []byte("\ufeff"))
		s.started = true
	}
	b := s.line
	for len(b) > 0 {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			// Unterminated: the body ended mid-line.
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		s.pending = append(s.pending, string(b[:i]))
		if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i++
		}
		b = b[i+1:]
	}
	return err
}

// streamTranslator turns one protocol's events into neutral events. handle
// returns true once the provider's own terminal signal arrived (and the
// final finish and usage were emitted). ended is called when the body ends
// or fails first: a translator that already saw its terminal signal emits
// its tail and returns nil, every other returns false.
type streamTranslator interface {
	handle(ev sseEvent, emit func(streamEvent) error) (bool, error)
	ended(emit func(streamEvent) error) (bool, error)
}

// readUpstreamStream reads the provider's SSE body and calls emit for each
// neutral event in order (SPEC §7.5). It returns nil only when the
// provider sent its own terminal signal. An end or connection failure
// before that, or an in-band error event, is provider_incomplete; a
// malformed event is provider_failure; emit's own error is returned as is.
func readUpstreamStream(protocol string, body io.Reader, emit func(streamEvent) error) error {
	f := formatOf(protocol)
	if f == nil {
		return refuse("provider_failure", "unknown provider protocol %q", protocol)
	}
	t := f.upstreamStream()
	r := newSSEReader(body)
	for {
		ev, err := r.next()
		if err != nil {
			if done, terr := t.ended(emit); done || terr != nil {
				return terr
			}
			if errors.Is(err, io.EOF) {
				return refuse("provider_incomplete", "the provider stream ended before its terminal signal")
			}
			if ae := classifyTransport(err); ae.Code == "client_cancelled" {
				return ae
			}
			// The request was sent long ago: whatever broke, the provider may
			// have generated and billed (SPEC §8.2).
			return refuse("provider_incomplete", "the provider stream failed before its terminal signal: %s",
				cleanQuoted(err.Error(), "", 300)).because(err)
		}
		done, err := t.handle(ev, emit)
		if err != nil || done {
			return err
		}
	}
}

// assembleStream builds one answer from a whole stream: a buffered caller
// of a provider that only streams (codex, SPEC §6.2).
func assembleStream(protocol string, body io.Reader) (chatAnswer, error) {
	var (
		a    chatAnswer
		text strings.Builder
		args []strings.Builder
	)
	err := readUpstreamStream(protocol, body, func(ev streamEvent) error {
		switch ev.Kind {
		case eventText:
			text.WriteString(ev.Text)
		case eventToolCallStart:
			for len(a.ToolCalls) <= ev.Index {
				a.ToolCalls = append(a.ToolCalls, toolCall{})
				args = append(args, strings.Builder{})
			}
			a.ToolCalls[ev.Index].ID = ev.ToolCall.ID
			a.ToolCalls[ev.Index].Name = ev.ToolCall.Name
		case eventToolCallArgs:
			if ev.Index >= len(args) {
				return refuse("provider_failure", "the provider stream sent arguments for a tool call it never started")
			}
			args[ev.Index].WriteString(ev.Text)
		case eventFinish:
			a.Finish = ev.Finish
		case eventUsage:
			a.Usage = ev.Usage
		}
		return nil
	})
	if err != nil {
		return chatAnswer{}, err
	}
	a.Text = text.String()
	for i := range a.ToolCalls {
		a.ToolCalls[i].Arguments = args[i].String()
	}
	return a, nil
}

// upstreamStreamError is the cause of a provider_incomplete raised by an
// in-band error event. Code is the event's error code or type (redacted);
// Class is refusalRate or refusalQuota when that code says so, so the
// dispatcher can still record a block on the subscription (SPEC §6.2).
type upstreamStreamError struct {
	Code  string
	Class string
}

func (e *upstreamStreamError) Error() string { return "provider stream error " + e.Code }

// streamErrorCodes classifies in-band error codes that say "rate" or "quota".
var streamErrorCodes = map[string]string{
	"rate_limit_exceeded": refusalRate,
	"rate_limit_error":    refusalRate,
	"usage_limit_reached": refusalRate,
	"insufficient_quota":  refusalQuota,
	"billing_error":       refusalQuota,
}

// inBandError is the refusal for a provider's in-band error event: after
// commit the caller cannot know what was billed, so it is
// provider_incomplete whatever the event says (SPEC §6.2, §7.5).
func inBandError(code string) *apiError {
	code = cleanQuoted(code, "", 64)
	if code == "" {
		code = "unspecified"
	}
	class := streamErrorCodes[code]
	if quotaCodes[code] {
		class = refusalQuota
	}
	return refuse("provider_incomplete", "the provider stream failed with error %q", code).
		because(&upstreamStreamError{Code: code, Class: class})
}

// malformedEvent is the refusal for an event that is not the protocol's.
func malformedEvent(protocol string, cause error) *apiError {
	e := refuse("provider_failure", "the provider sent a malformed %s stream event", protocol)
	if cause != nil {
		e = e.because(cause)
	}
	return e
}

// emitTail emits the finish and, when reported, the usage.
func emitTail(emit func(streamEvent) error, finish string, u usage) error {
	if err := emit(streamEvent{Kind: eventFinish, Finish: finish}); err != nil {
		return err
	}
	if u.Reported {
		return emit(streamEvent{Kind: eventUsage, Usage: u})
	}
	return nil
}

// malformedAnswer is the refusal for a 2xx body that is not the protocol's
// answer. The body itself is never quoted.
func malformedAnswer(protocol string, cause error) *apiError {
	e := refuse("provider_failure", "the provider answered with a malformed %s body", protocol)
	if cause != nil {
		e = e.because(cause)
	}
	return e
}
