package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
)

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
