package main

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The answer (SPEC §7.5, §7.6): the neutral answer and stream events, a buffered answer read whole or relayed
// as received, a stream written block by block in the caller's dialect, or relayed, and the keep-alive.

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

// answerOf builds one answer from the neutral events run emits, gathered by a caller stream that writes nothing.
func answerOf(run func(emit func(streamEvent) error) error) (chatAnswer, error) {
	s := &callerStream{frames: func(*callerStream, streamStep, *streamBlock, string) error { return nil }}
	if err := run(s.event); err != nil {
		return chatAnswer{}, err
	}
	a := chatAnswer{Finish: s.reason, Usage: s.usage}
	for _, b := range s.blocks {
		if b.text {
			a.Text += b.buf.String()
		} else {
			a.ToolCalls = append(a.ToolCalls, toolCall{ID: b.id, Name: b.flat, Arguments: b.buf.String(), Custom: b.custom})
		}
	}
	return a, nil
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

// relayBuffered answers a buffered passthrough call with the provider's body; a codex stream (SPEC §6.2) is read whole
// and assembled. A body that is not a JSON object is no answer of the format (provider_failure).
func relayBuffered(w http.ResponseWriter, c call, resp *http.Response, attempts int) (u usage, _ *apiError) {
	p, ct := c.res.Provider, cmp.Or(resp.Header.Get("Content-Type"), "application/json")
	var body []byte
	var err error
	if p.codex {
		pw := &streamReader{protocol: p.protocol, raw: map[int][]byte{}}
		if err = relayWatched(pw, resp.Body, nil); err == nil {
			body = assembledResponse(pw)
		}
		u, ct = pw.usage, "application/json" // an assembled answer is Brama's JSON
	} else if body, err = readWhole(p, resp); err == nil {
		o, notObject := parseRawObject(body) // not decoded: only its usage is read
		if u, err = usageOf(p.protocol, o.value("usage")); notObject != nil || err != nil {
			err = malformedAnswer(p.protocol, cmp.Or(notObject, err))
		}
	}
	if err != nil {
		return u, asAPIError(err).redactedFor(c.cred.bearer()).withAttempts(attempts)
	}
	providerFacts(w.Header(), resp.Header, true)
	writeAnswer(w, ct, attempts, body)
	return u, nil
}

// assembledResponse is a watched codex stream's final response, its output the output_item.done items in output_index order.
func assembledResponse(pw *streamReader) []byte {
	if len(pw.raw) == 0 {
		return pw.final
	}
	var items [][]byte
	for _, i := range slices.Sorted(maps.Keys(pw.raw)) {
		items = append(items, pw.raw[i])
	}
	o, _ := splitRaw(pw.final, '{', nil)
	return o.edit(memberEdit{"output", append(append([]byte("["), bytes.Join(items, []byte(","))...), ']')})
}

// writeAnswer writes a buffered 200 answer with its attempts.
func writeAnswer(w http.ResponseWriter, contentType string, attempts int, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Brama-Attempts", strconv.Itoa(attempts))
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// readProviderAnswer reads and closes a committed buffered answer, a codex stream (SPEC §6.2) assembled.
func readProviderAnswer(p providerInfo, resp *http.Response) (chatAnswer, error) {
	defer resp.Body.Close()
	if p.codex {
		return answerOf(func(emit func(streamEvent) error) error { return readUpstreamStream(p.protocol, resp.Body, emit) })
	}
	body, err := readWhole(p, resp)
	if err != nil {
		return chatAnswer{}, err
	}
	return decodeUpstreamAnswer(p.protocol, body)
}

// readWhole reads a committed answer's body, or SPEC §8.2's refusal of one cut mid-body.
func readWhole(p providerInfo, resp *http.Response) ([]byte, error) {
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, refuse("provider_incomplete", "provider %q answer was cut after %d bytes", p.id, len(body)).because(err)
	}
	return body, nil
}

// providerFacts gives the caller what SPEC §17 lets a provider's answer tell: its request id as request-id
// (X-Request-Id is Brama's own) and, for a same-format answer, its rate-limit headers as received; nothing else (no
// cookie, nothing naming the provider account).
func providerFacts(h, provider http.Header, same bool) {
	if id := cmp.Or(provider.Get("Request-Id"), provider.Get("X-Request-Id")); id != "" {
		h.Set("Request-Id", id)
	}
	for name, vs := range provider {
		if same && (name == "Retry-After" || strings.HasPrefix(name, "Anthropic-Ratelimit-") || strings.HasPrefix(name, "X-Ratelimit-")) {
			h[name] = vs
		}
	}
}

// keepAliveEvery is how long a stream may be silent before Brama writes an SSE comment (SPEC §7.5). It writes; it never cuts.
const keepAliveEvery = 15 * time.Second

// openStreamAnswer sends the 200 and starts the keep-alive timer, a comment after every silence of every
// (SPEC §7.5); model is what the dialect's events report, req's tools name translated calls.
func openStreamAnswer(w http.ResponseWriter, dialect string, req chatRequest, model string, attempts int, every time.Duration) *callerStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	h.Set("Brama-Attempts", strconv.Itoa(attempts))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	s := &callerStream{w: w, flush: func() { rc.Flush() }, frames: formatOf(dialect).frames, req: req, model: model}
	s.flush()   // committed: the caller has its 200 now, however long the provider stays silent
	s.mu.Lock() // the timer's first run reads s.timer, under mu
	defer s.mu.Unlock()
	s.every, s.timer = every, time.AfterFunc(every, func() { s.do(func() error { return s.write(": keep-alive\n\n") }) })
	return s
}

// do runs f under the lock, unless closed, and restarts the silence timer.
func (s *callerStream) do(f func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.timer.Reset(s.every)
	return f()
}

// relay writes one event as received (nil: none) and, when the relay may wait next, flushes what was written
// (SPEC §7.5) and restarts the silence timer; not per event: a timer reset per event costs CPU.
func (s *callerStream) relay(b []byte, flush bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	_, err := s.w.Write(b)
	s.unflushed = s.unflushed || len(b) > 0
	if flush && s.unflushed {
		s.flush()
		s.unflushed = false
		s.timer.Reset(s.every)
	}
	return err
}

// close stops the timer: nothing more is written.
func (s *callerStream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.timer.Stop()
}

// translate relays a committed stream of protocol translated to the caller's dialect.
func (s *callerStream) translate(protocol string, body io.Reader) (usage, error) {
	err := s.do(s.start)
	if err == nil {
		err = readUpstreamStream(protocol, body, func(ev streamEvent) error { return s.do(func() error { return s.event(ev) }) })
	}
	if err == nil {
		err = s.do(s.finish)
	}
	return s.usage, err
}

// errCallerStreamDone is returned by a callerStream used after finish or fail.
var errCallerStreamDone = errors.New("caller stream already ended")

// streamStep is what a dialect's frames function writes: the answer begins, a block opens, grows or closes,
// the finish event arrives (chat writes its finish chunk then), the answer ends or fails.
type streamStep int

const (
	stepBegin streamStep = iota
	stepOpen
	stepDelta
	stepClose
	stepFinish
	stepEnd
	stepFail
)

// callerStream writes a streamed answer in the caller's dialect (SPEC §7.5), one block at a time, each step
// framed by the dialect's frames function; the first write error sticks. A committed stream's writer also
// relays a same-format stream and keeps it alive, under one lock; the same writer, frames discarded, builds
// the messages and responses dialects' buffered answers (wholeAnswer) and gathers a provider's (answerOf).
type callerStream struct {
	mu        sync.Mutex // a committed stream's: guards everything below against the keep-alive timer
	closed    bool
	unflushed bool // relay wrote bytes not yet flushed
	every     time.Duration
	timer     *time.Timer
	w         io.Writer
	flush     func()
	err       error
	frames    func(s *callerStream, step streamStep, b *streamBlock, text string) error
	req       chatRequest
	model     string
	started   bool
	done      bool   // finish or fail ran
	reason    string // the tail: finish and usage arrive in either order, usage maybe never
	usage     usage
	failure   *apiError    // stepFail's
	open      *streamBlock // nil when none
	blocks    []*streamBlock
	// the dialect's own: chat's chunk id, creation time and whether its finish chunk went out,
	// responses' next sequence_number, and the message or response the last event repeats whole
	id         string
	created    int64
	finishSent bool
	seq        int
	msg        messagesAnswer
	resp       responsesObject
}

// streamBlock is one block: text, or a tool call named as the caller declared it; a custom call made as a function is wrapped, its input held to the close.
type streamBlock struct {
	text            bool
	pos             int // its index among the blocks
	index           int // the call's index among calls
	id, name        string
	flat            string // the name providers saw
	custom, wrapped bool
	buf             strings.Builder
}

// wholeAnswer writes a through a dialect's frames, discarded, and returns the writer holding the whole
// answer, with the first refusal a block met (messages: arguments not an object).
func wholeAnswer(frames func(*callerStream, streamStep, *streamBlock, string) error, req chatRequest, a chatAnswer) (*callerStream, error) {
	s := &callerStream{w: io.Discard, frames: frames, req: req, model: a.Model}
	err := s.event(streamEvent{Kind: eventText, Text: a.Text})
	if err == nil {
		err = emitCalls(s.event, 0, a.ToolCalls)
	}
	if err == nil {
		err = emitTail(s.event, a.Finish, a.Usage)
	}
	if err == nil {
		err = s.finish()
	}
	return s, err
}

func (s *callerStream) start() error {
	if s.started {
		return nil
	}
	s.started = true
	return s.frames(s, stepBegin, nil, "")
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
		s.reason = ev.Finish
		if err := s.closeOpen(); err != nil {
			return err
		}
		return s.frames(s, stepFinish, nil, "")
	case eventUsage:
		s.usage, s.usage.Reported = ev.Usage, true
		return nil
	case eventText:
		if ev.Text == "" {
			return nil
		}
		if s.open == nil || !s.open.text {
			if err := s.openBlock(&streamBlock{text: true}); err != nil {
				return err
			}
		}
		s.open.buf.WriteString(ev.Text)
		return s.frames(s, stepDelta, s.open, ev.Text)
	case eventToolCallStart:
		name, _, custom := s.req.callerTool(ev.ToolCall)
		return s.openBlock(&streamBlock{index: ev.Index, id: ev.ToolCall.ID, name: name,
			flat: ev.ToolCall.Name, custom: custom, wrapped: custom && !ev.ToolCall.Custom})
	case eventToolCallArgs:
		i := slices.IndexFunc(s.blocks, func(b *streamBlock) bool { return !b.text && b.index == ev.Index })
		if i < 0 {
			return fmt.Errorf("arguments for tool call %d before its start", ev.Index)
		}
		b := s.blocks[i]
		if b.buf.WriteString(ev.Text); ev.Text == "" || b.wrapped {
			return nil
		}
		return s.frames(s, stepDelta, b, ev.Text)
	}
	return fmt.Errorf("unknown stream event kind %q", ev.Kind)
}

func (s *callerStream) openBlock(b *streamBlock) error {
	if err := s.closeOpen(); err != nil {
		return err
	}
	b.pos, s.open, s.blocks = len(s.blocks), b, append(s.blocks, b)
	return s.frames(s, stepOpen, b, "")
}

// closeOpen closes the open block; a wrapped call's input goes out first.
func (s *callerStream) closeOpen() error {
	b := s.open
	if b == nil {
		return nil
	}
	s.open = nil
	full := b.buf.String()
	if b.wrapped {
		full = customInput(full)
		b.buf.Reset()
		b.buf.WriteString(full)
		if err := s.frames(s, stepDelta, b, full); err != nil {
			return err
		}
	}
	return s.frames(s, stepClose, b, full)
}

// finish writes the dialect's terminal sequence.
func (s *callerStream) finish() error {
	for _, step := range []func() error{s.end, s.start, s.closeOpen} {
		if err := step(); err != nil {
			return err
		}
	}
	return s.frames(s, stepEnd, nil, "")
}

// fail writes the dialect's in-band error, never a terminal success event.
func (s *callerStream) fail(e *apiError) error {
	if err := s.end(); err != nil {
		return err
	}
	s.failure = e
	return s.frames(s, stepFail, nil, "")
}

func (s *callerStream) end() error {
	if s.done {
		return errCallerStreamDone
	}
	s.done = true
	return s.err
}

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
