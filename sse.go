package main

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// The answer side of the three wire formats (SPEC §7.5, §7.6): the neutral answer, the provider
// side's SSE reader and translator loop, the caller side's stream writer.

// Finish reasons, in the neutral (OpenAI chat) vocabulary.
const (
	finishStop          = "stop"
	finishLength        = "length"
	finishToolCalls     = "tool_calls"
	finishContentFilter = "content_filter"
)

// chatAnswer is one complete answer in no particular format.
type chatAnswer struct {
	Model     string // the name reported to the caller (SPEC §7.6)
	Text      string
	ToolCalls []toolCall
	Finish    string
	Usage     usage
}

// toolCall is one tool call the model made.
type toolCall struct {
	ID        string
	Name      string // as the provider saw it (flattened)
	Arguments string // JSON text, or a custom tool's free-form input
	Custom    bool   // the provider called it as a custom tool
}

// usage counts tokens as the provider reported them.
type usage struct {
	InputTokens, OutputTokens int
	Reported                  bool // the provider sent usage at all
}

func newAnswerID(prefix string) string { return prefix + rand.Text() }

func answerIDOr(id, prefix string) string { return cmp.Or(id, newAnswerID(prefix)) }

func answerFinish(f string) string { return cmp.Or(f, finishStop) }

// Stream event kinds, from a provider protocol to a caller dialect.
const (
	eventText          = "text"            // Text
	eventToolCallStart = "tool_call_start" // Index, ToolCall's ID, Name and Custom
	eventToolCallArgs  = "tool_call_args"  // Index, Text: the next piece of arguments
	eventFinish        = "finish"
	eventUsage         = "usage"
)

// streamEvent is one translated piece of a stream; finish and usage only after its terminal signal (SPEC §7.5).
type streamEvent struct {
	Kind     string
	Text     string
	Index    int // tool call index, 0-based, in call order
	ToolCall toolCall
	Finish   string
	Usage    usage
}

// sseEvent is one dispatched server-sent event: its event name and its data lines joined with "\n".
type sseEvent struct{ Event, Data string }

// sseReader splits a text/event-stream body into blocks (an event's lines and the blank line
// ending it) as received, WHATWG grammar, with no line limit or timeout (SPEC §7.4).
type sseReader struct {
	sc        bufio.Scanner
	ends      string             // the bytes that end a line (a "\r\n" pair is one end)
	started   bool               // the byte-order mark check is done
	rest      []byte             // what the scanner holds past the last line, for ready
	searched  int                // bytes of the coming line already searched for its end
	raw, data []byte             // the last block and its data, reused by next
	buf       [16<<10 - 256]byte // the scanner's first buffer: with the reader, one 16 KiB allocation
}

// newSSEReader reads blocks from r, lines ending at a byte of ends: translation's "\r\n" (WHATWG), passthrough's "\n" (README: a bare "\r" is no line end).
func newSSEReader(r io.Reader, ends string) *sseReader {
	s := &sseReader{sc: *bufio.NewScanner(r), ends: ends, data: []byte{}} // data: non-nil, see next
	s.sc.Buffer(s.buf[:], math.MaxInt)
	s.sc.Split(s.split)
	return s
}

// split cuts one line with its terminator ("\r\n", or one byte of ends); a final line without one is
// io.ErrUnexpectedEOF (the body was cut). A long line comes a read at a time: the search resumes where the last one ended.
func (s *sseReader) split(data []byte, atEOF bool) (int, []byte, error) {
	i := bytes.IndexAny(data[s.searched:], s.ends)
	if i >= 0 {
		i += s.searched
	}
	switch {
	case i < 0 && atEOF && len(data) > 0 && (s.started || string(data) != "\ufeff"): // a lone BOM: an empty body
		return 0, nil, io.ErrUnexpectedEOF
	case i < 0:
		s.searched = len(data)
		return 0, nil, nil
	case data[i] == '\r' && i+1 == len(data) && !atEOF: // a "\n" may follow
		s.searched = i
		return 0, nil, nil
	case data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n':
		i++
	}
	s.rest, s.searched = data[i+1:], 0
	return i + 1, data[:i+1], nil
}

// next returns the next block, its event name and its data lines (nil: none), valid until
// the next call; io.EOF after the last, which needs no blank line after it.
func (s *sseReader) next() (raw []byte, event string, data []byte, err error) {
	s.raw, s.data = s.raw[:0], s.data[:0]
	for s.sc.Scan() {
		line := s.sc.Bytes()
		if !s.started {
			line, s.started = bytes.TrimPrefix(line, []byte("\ufeff")), true
		}
		content := bytes.TrimRight(line, "\r\n")
		if len(content) == 0 && len(s.raw) == 0 || bytes.HasPrefix(content, []byte(":")) {
			continue // blank lines between blocks and comments carry nothing: none is kept (SPEC §17)
		}
		s.raw = append(s.raw, line...)
		if len(content) == 0 {
			return s.raw, event, data, nil
		}
		field, value, _ := bytes.Cut(content, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			event = string(value)
		case "data":
			if data != nil {
				s.data = append(s.data, '\n')
			}
			s.data = append(s.data, value...)
			data = s.data // non-nil even for an empty line: s.data starts non-nil
		} // "id", "retry" and unknown fields carry nothing Brama uses
	}
	if err := s.sc.Err(); err != nil || len(s.raw) == 0 {
		return nil, "", nil, cmp.Or(err, io.EOF)
	}
	s.raw = append(s.raw, '\n') // the provider never ended the block; end it for the caller
	return s.raw, event, data, nil
}

// ready reports whether a whole next block is buffered (no wait to read it).
func (s *sseReader) ready() bool {
	b := bytes.TrimLeft(s.rest, "\r\n") // blank lines before a block are skipped, not an end
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\n\r\n"))
}

// event returns the next event for translation: a block without data dispatches nothing.
func (s *sseReader) event() (sseEvent, error) {
	for {
		_, event, data, err := s.next()
		if err != nil || data != nil {
			return sseEvent{event, string(data)}, err
		}
	}
}

// streamTranslator turns one protocol's events into neutral ones; handle and ended
// (at the body's end) report true once the terminal signal came and the tail went out.
type streamTranslator interface {
	handle(ev sseEvent, emit func(streamEvent) error) (bool, error)
	ended(emit func(streamEvent) error) (bool, error)
}

// readUpstreamStream emits a provider stream's neutral events, nil only after its terminal
// signal (SPEC §7.5): a cut or in-band error is provider_incomplete, a malformed event provider_failure.
func readUpstreamStream(protocol string, body io.Reader, emit func(streamEvent) error) error {
	f := formatOf(protocol)
	if f == nil {
		return refuse("provider_failure", "unknown wire format %q", protocol)
	}
	t, r := f.upstreamStream(), newSSEReader(body, "\r\n")
	for {
		ev, err := r.event()
		if err != nil {
			if done, terr := t.ended(emit); done || terr != nil {
				return terr
			}
			return streamCut(err)
		}
		if done, err := t.handle(ev, emit); err != nil || done {
			return err
		}
	}
}

// assembleStream is a whole stream as one answer: a buffered caller of codex, which only streams (SPEC §6.2).
func assembleStream(protocol string, body io.Reader) (chatAnswer, error) {
	return answerOf(func(emit func(streamEvent) error) error { return readUpstreamStream(protocol, body, emit) })
}

// answerOf builds one answer from the neutral events run emits.
func answerOf(run func(emit func(streamEvent) error) error) (chatAnswer, error) {
	var (
		a    chatAnswer
		text strings.Builder
		args []strings.Builder
	)
	err := run(func(ev streamEvent) error {
		switch ev.Kind {
		case eventText:
			text.WriteString(ev.Text)
		case eventToolCallStart:
			for len(a.ToolCalls) <= ev.Index {
				a.ToolCalls, args = append(a.ToolCalls, toolCall{}), append(args, strings.Builder{})
			}
			a.ToolCalls[ev.Index] = ev.ToolCall
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

// upstreamStreamError is an in-band error's cause: its redacted code, and the refusalRate or refusalQuota class the dispatcher records a block for (SPEC §6.2).
type upstreamStreamError struct{ Code, Class string }

func (e *upstreamStreamError) Error() string { return "provider stream error " + e.Code }

// streamErrorCodes classifies in-band error codes that say "rate" or "quota".
var streamErrorCodes = map[string]string{"rate_limit_exceeded": refusalRate, "rate_limit_error": refusalRate,
	"usage_limit_reached": refusalRate, "insufficient_quota": refusalQuota, "billing_error": refusalQuota}

const inBandMessage = "the provider stream failed with error %q"

// inBandError is provider_incomplete: the caller cannot know what was billed (SPEC §6.2, §7.5); the dispatcher redacts the credential (apiError.redactedFor).
func inBandError(code string) *apiError {
	class := streamErrorCodes[code]
	if quotaCodes[code] {
		class = refusalQuota
	}
	code = cmp.Or(cleanQuoted(code, "", 64), "unspecified")
	return refuse("provider_incomplete", inBandMessage, code).because(&upstreamStreamError{Code: code, Class: class})
}

func malformedEvent(protocol string, cause error) *apiError {
	return refuse("provider_failure", "the provider sent a malformed %s stream event", protocol).because(cause)
}

// malformedAnswer refuses a 2xx body that is not the protocol's answer, never quoted.
func malformedAnswer(protocol string, cause error) *apiError {
	return refuse("provider_failure", "the provider answered with a malformed %s body", protocol).because(cause)
}

// emitCalls emits whole calls, their neutral indexes from first on.
func emitCalls(emit func(streamEvent) error, first int, calls []toolCall) error {
	for i, tc := range calls {
		start := toolCall{ID: tc.ID, Name: tc.Name, Custom: tc.Custom}
		if err := emit(streamEvent{Kind: eventToolCallStart, Index: first + i, ToolCall: start}); err != nil {
			return err
		}
		if err := emit(streamEvent{Kind: eventToolCallArgs, Index: first + i, Text: tc.Arguments}); err != nil {
			return err
		}
	}
	return nil
}

func emitTail(emit func(streamEvent) error, finish string, u usage) error {
	if err := emit(streamEvent{Kind: eventFinish, Finish: finish}); err != nil || !u.Reported {
		return err
	}
	return emit(streamEvent{Kind: eventUsage, Usage: u})
}

// errCallerStreamDone is returned by a callerStream used after finish or fail.
var errCallerStreamDone = errors.New("caller stream already ended")

// callerStream writes a streamed answer in the caller's dialect (SPEC §7.5), one
// block at a time, framed by the dialect's blockWriter; the first write error sticks.
type callerStream struct {
	w            io.Writer
	flush        func()
	err          error
	bw           blockWriter
	req          chatRequest
	started      bool
	done         bool   // finish or fail ran
	finishReason string // the tail: finish and usage arrive in either order, usage maybe never
	usage        usage
	open         int // index of the open block, -1 when none
	blocks       []*streamBlock
	toolBlock    map[int]int // neutral tool call index → block index
}

// blockWriter is one dialect's framing of a streamed answer's blocks, in order.
type blockWriter interface {
	begin() error
	open(i int, b *streamBlock) error
	delta(i int, b *streamBlock, s string) error
	close(i int, b *streamBlock, full string) error
	finishNow(finish string) error    // the finish event arrived (chat writes its finish chunk)
	end(finish string, u usage) error // the terminal sequence
	fail(e *apiError) error
}

// streamBlock is one block: text, or a tool call named as the caller declared it; a custom call made as a function is wrapped, its input held to the close.
type streamBlock struct {
	text            bool
	index           int // the call's index among calls
	id, name        string
	flat            string // the name providers saw
	custom, wrapped bool
	buf             strings.Builder
}

// newCallerStream writes dialect to w, flushing every frame (flush may be nil), reporting model (SPEC §7.6).
func newCallerStream(dialect string, req chatRequest, w io.Writer, flush func(), model string) *callerStream {
	return newBlockStream(w, flush, req, model, formatOf(dialect).callerStream)
}

func newBlockStream(w io.Writer, flush func(), req chatRequest, model string, newWriter func(*callerStream, chatRequest, string) blockWriter) *callerStream {
	s := &callerStream{w: w, flush: flush, req: req, open: -1, toolBlock: map[int]int{}}
	s.bw = newWriter(s, req, model)
	return s
}

// wholeAnswerThrough writes a through newWriter's block writer, frames discarded, and returns it,
// holding the whole answer, with the first refusal a block met (messages: arguments not an object).
func wholeAnswerThrough(req chatRequest, a chatAnswer, newWriter func(*callerStream, chatRequest, string) blockWriter) (blockWriter, error) {
	s := newBlockStream(io.Discard, nil, req, a.Model, newWriter)
	err := s.event(streamEvent{Kind: eventText, Text: a.Text})
	if err == nil {
		err = emitCalls(s.event, 0, a.ToolCalls)
	}
	if err == nil {
		err = emitTail(s.event, a.Finish, a.Usage)
	}
	if err != nil {
		return s.bw, err
	}
	return s.bw, s.finish()
}

func (s *callerStream) start() error {
	if s.started {
		return nil
	}
	s.started = true
	return s.bw.begin()
}

// event writes one neutral event. Arguments for a call whose block closed (a provider interleaving calls) still go to its index, where SDKs gather them.
func (s *callerStream) event(ev streamEvent) error {
	if s.done {
		return errCallerStreamDone
	}
	if err := s.start(); err != nil {
		return err
	}
	switch ev.Kind {
	case eventFinish:
		s.finishReason = ev.Finish
		if err := s.closeOpen(); err != nil {
			return err
		}
		return s.bw.finishNow(s.finishReason)
	case eventUsage:
		s.usage, s.usage.Reported = ev.Usage, true
		return nil
	case eventText:
		if ev.Text == "" {
			return nil
		}
		if s.open < 0 || !s.blocks[s.open].text {
			if _, err := s.openBlock(&streamBlock{text: true}); err != nil {
				return err
			}
		}
		b := s.blocks[s.open]
		b.buf.WriteString(ev.Text)
		return s.bw.delta(s.open, b, ev.Text)
	case eventToolCallStart:
		name, _, custom := s.req.callerTool(ev.ToolCall)
		i, err := s.openBlock(&streamBlock{index: ev.Index, id: ev.ToolCall.ID, name: name,
			flat: ev.ToolCall.Name, custom: custom, wrapped: custom && !ev.ToolCall.Custom})
		s.toolBlock[ev.Index] = i
		return err
	case eventToolCallArgs:
		i, ok := s.toolBlock[ev.Index]
		if !ok {
			return fmt.Errorf("arguments for tool call %d before its start", ev.Index)
		}
		b := s.blocks[i]
		if b.buf.WriteString(ev.Text); ev.Text == "" || b.wrapped {
			return nil
		}
		return s.bw.delta(i, b, ev.Text)
	}
	return fmt.Errorf("unknown stream event kind %q", ev.Kind)
}

func (s *callerStream) openBlock(b *streamBlock) (int, error) {
	if err := s.closeOpen(); err != nil {
		return 0, err
	}
	s.open, s.blocks = len(s.blocks), append(s.blocks, b)
	return s.open, s.bw.open(s.open, b)
}

// closeOpen closes the open block; a wrapped call's input goes out first.
func (s *callerStream) closeOpen() error {
	i := s.open
	if i < 0 {
		return nil
	}
	s.open = -1
	b := s.blocks[i]
	full := b.buf.String()
	if b.wrapped {
		full = customInput(full)
		b.buf.Reset()
		b.buf.WriteString(full)
		if err := s.bw.delta(i, b, full); err != nil {
			return err
		}
	}
	return s.bw.close(i, b, full)
}

// finish writes the dialect's terminal sequence.
func (s *callerStream) finish() error {
	for _, step := range []func() error{s.end, s.start, s.closeOpen} {
		if err := step(); err != nil {
			return err
		}
	}
	return s.bw.end(s.finishReason, s.usage)
}

// fail writes the dialect's in-band error, never a terminal success event.
func (s *callerStream) fail(e *apiError) error {
	if err := s.end(); err != nil {
		return err
	}
	return s.bw.fail(e)
}

func (s *callerStream) end() error {
	if s.done {
		return errCallerStreamDone
	}
	s.done = true
	return s.err
}

// keepAlive writes the SSE comment sent after 15 s without an event.
func (s *callerStream) keepAlive() error { return s.write(": keep-alive\n\n") }

// frame writes one event: "event: <name>\n" when name is set, then the data.
func (s *callerStream) frame(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if name != "" {
		name = "event: " + name + "\n"
	}
	return s.write(name + "data: " + string(b) + "\n\n")
}

func (s *callerStream) write(frame string) error {
	if s.err != nil {
		return s.err
	}
	if _, s.err = io.WriteString(s.w, frame); s.err == nil && s.flush != nil {
		s.flush()
	}
	return s.err
}

// droppedFor names every caller member the request to p loses, each once: those with no
// counterpart in any other format, and those p's format or p itself lacks (SPEC §7.6).
func (req chatRequest) droppedFor(p providerInfo) []string {
	d := slices.Clone(req.Dropped)
	add := func(cond bool, names ...string) {
		if cond {
			d = append(d, names...)
		}
	}
	sampling := slices.DeleteFunc([]string{"temperature", "top_p"}, func(n string) bool {
		return n == "temperature" && req.Temperature == nil || n == "top_p" && req.TopP == nil
	})
	anthropic, budget := p.protocol == protoAnthropic, req.thinkingBudget()
	add(anthropic, req.Shared.names()...)
	add(anthropic && req.Effort != "" && budget == 0, req.EffortName)
	add(anthropic && budget > 0, sampling...)
	add(anthropic && req.Verbosity != "", "verbosity")
	for _, t := range req.Tools {
		add(anthropic && t.Type == toolCustom && t.Format != nil, "format")
	}
	add(p.protocol == protoOpenAIResponses && len(req.Stop) > 0, req.StopName)
	for _, m := range req.Messages {
		for _, pt := range m.Parts {
			for _, q := range append([]part{pt}, pt.Media...) {
				add(anthropic && q.Detail != "", "detail")
				add(p.protocol == protoOpenAIChat && q.Type != pt.Type, q.Type) // a tool message holds only text
			}
		}
	}
	codex := p.id == "codex" // it never gets an output limit, and its backend refuses these (SPEC §6.2)
	add(codex && req.LimitName != "", req.LimitName)
	add(codex, sampling...)
	add(codex, openAIShared{Metadata: req.Shared.Metadata, SafetyIdentifier: req.Shared.SafetyIdentifier, User: req.Shared.User}.names()...)
	seen := map[string]bool{}
	return slices.DeleteFunc(d, func(n string) bool { dup := seen[n]; seen[n] = true; return dup })
}

func textOf(ps []part) string {
	var b strings.Builder
	for _, p := range ps {
		if p.Type == partText {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

func jsonText(s string) json.RawMessage { return must(json.Marshal(s)) }

func ptrTo[T any](v T) *T { return &v }

func valueOr[T any](p *T, or T) T {
	if p == nil {
		return or
	}
	return *p
}

// must is v for marshalling that cannot fail (plain values).
func must(v []byte, err error) json.RawMessage {
	if err != nil {
		panic(err)
	}
	return v
}

// rawIsNull reports an absent or null value (raw is valid JSON: only null starts with n).
func rawIsNull(raw json.RawMessage) bool { s := rawShape(raw); return s == 0 || s == 'n' }

// rawShape is the first byte of a JSON value ('"', '[', '{', …); 0 when absent.
func rawShape(raw json.RawMessage) byte {
	if raw = bytes.TrimSpace(raw); len(raw) == 0 {
		return 0
	}
	return raw[0]
}

func rawItems(raw json.RawMessage) (items []json.RawMessage) {
	json.Unmarshal(raw, &items)
	return items
}

// rawMember is raw's member name (any case, as encoding/json matches), nil when none.
func rawMember(raw json.RawMessage, name string) json.RawMessage {
	var m map[string]json.RawMessage
	json.Unmarshal(raw, &m)
	for k, v := range m {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return nil
}
