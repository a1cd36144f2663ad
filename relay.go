package main

import (
	"cmp"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The answer (SPEC §7.5, §7.6): buffered or streamed, in the caller's dialect or relayed as received; the keep-alive;
// the one reader of a provider stream (streamReader), its failures and usage.

// Finish reasons, in the neutral (OpenAI chat) vocabulary.
const (
	finishStop          = "stop"
	finishLength        = "length"
	finishToolCalls     = "tool_calls"
	finishContentFilter = "content_filter"
)

// usage counts tokens as the provider reported them.
type usage struct {
	InputTokens, OutputTokens int
	Reported                  bool // the provider sent usage at all
}

// newAnswerID is id, else a fresh one: prefix and a random text, drawn only then (crypto/rand allocates).
func newAnswerID(prefix, id string) string {
	if id == "" {
		id = prefix + rand.Text()
	}
	return id
}

// writeAnswer writes a 200 answer with its attempts (a buffered body, or a stream's head) and what SPEC §17 lets it
// tell of the provider's: its request id (X-Request-Id is Brama's own) and, same-format, its rate-limit headers; no
// cookie, nothing naming the account. x-should-retry: false, as the call is paid: the Anthropic SDK (1.17+) sends
// again a buffered answer whose connection drops mid-body unless told not to.
func writeAnswer(w http.ResponseWriter, provider http.Header, same bool, ct string, attempts int, body []byte) {
	if id := cmp.Or(provider.Get("Request-Id"), provider.Get("X-Request-Id")); id != "" {
		w.Header().Set("Request-Id", id)
	}
	for name, vs := range provider {
		if same && (name == "Retry-After" || strings.HasPrefix(name, "Anthropic-Ratelimit-") || strings.HasPrefix(name, "X-Ratelimit-")) {
			w.Header()[name] = vs
		}
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Brama-Attempts", strconv.Itoa(attempts))
	w.Header().Set("X-Should-Retry", "false")
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// readWhole reads a committed answer's body, or SPEC §8.2's refusal of one cut mid-body.
func readWhole(p providerInfo, resp *http.Response) ([]byte, error) {
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, refuse("provider_incomplete", "provider %q answer was cut after %d bytes", p.id, len(body)).because(err)
	}
	return body, nil
}

var testingOnlyKeepAlive time.Duration // tests shorten the keep-alive's 15 s

// openStreamAnswer commits the 200 (writeAnswer's head) and starts the keep-alive (SPEC §7.5): an SSE comment after
// each 15 s of silence, never a cut. model is what the dialect's events report, req's tools name translated calls.
func openStreamAnswer(w http.ResponseWriter, provider http.Header, same bool, dialect string, req chatRequest, model string, attempts int) *callerStream {
	every := cmp.Or(testingOnlyKeepAlive, 15*time.Second)
	w.Header().Set("X-Accel-Buffering", "no")
	writeAnswer(w, provider, same, "text/event-stream", attempts, nil)
	rc := http.NewResponseController(w)
	rc.Flush() // the caller has its 200 now, however long the provider stays silent
	s := &callerStream{w: w, frames: formatOf(dialect).frames, req: req, model: model}
	s.mu.Lock() // the timer's first run reads s.flush
	defer s.mu.Unlock()
	s.timer = time.AfterFunc(every, func() { s.write([]byte(": keep-alive\n\n"), true) })
	s.flush = func() {
		rc.Flush()
		s.timer.Reset(every)
	}
	return s
}

// close stops the keep-alive: a run of it already waiting on the lock finds no writer.
func (s *callerStream) close() {
	s.mu.Lock()
	s.w = nil
	s.mu.Unlock()
	s.timer.Stop()
}

// answer reads a committed answer of c to its terminal signal: translated start to finish (whole: a buffered body, else
// the stream body), or a stream relayed as received but Brama's usage chunk.
func (s *callerStream) answer(c call, body io.Reader, whole []byte, translate, dropUsage bool) (_ usage, err error) {
	s.rd = streamReader{protocol: c.res.Provider.protocol, secret: c.cred.bearer(), dropUsage: dropUsage}
	if !translate {
		err = s.rd.run(body, "\n", s) // passthrough's line ends
		return s.rd.usage, err
	}
	s.rd.out, s.rd.calls = s, map[int]*upstreamCall{}
	if err = s.frames(s, stepBegin, nil, ""); err == nil && whole != nil {
		err = formatOf(c.res.Provider.protocol).decode(whole, &s.rd)
	} else if err == nil {
		err = s.rd.run(body, "\r\n", s) // translation's: WHATWG's
	}
	if err == nil {
		err = s.finish(nil)
	}
	return s.rd.usage, err
}

var errCallerStreamDone = errors.New("caller stream already ended")

// streamStep is a step of the answer a dialect's frames function writes; at stepEnd its finish and usage are known.
type streamStep int

const (
	stepBegin streamStep = iota
	stepOpen
	stepDelta
	stepClose
	stepEnd
	stepFail
)

// callerStream writes an answer in the caller's dialect (SPEC §7.5) one block at a time, each step framed by the
// dialect's frames function. A committed stream's writer also relays a same-format stream and keeps it alive, under
// one lock; without a writer, it builds every dialect's buffered answer (relayBuffered).
type callerStream struct {
	mu        sync.Mutex // a committed stream's: guards the writer (w, err, unflushed, flush) against the keep-alive
	unflushed bool
	timer     *time.Timer
	rd        streamReader // the provider stream's one reader
	w         io.Writer
	flush     func() // nil: a buffered answer
	err       error  // the first write error: it sticks
	frames    func(s *callerStream, step streamStep, b *streamBlock, text string) error
	req       chatRequest
	model     string
	done      bool         // finish ran
	failure   *apiError    // stepFail's
	open      *streamBlock // nil when none
	blocks    []*streamBlock
	// the dialect's own: chat's chunk id and creation time, responses' next sequence_number and whole response
	id      string
	created int64
	seq     int
	resp    responsesObject
	whole   any // the message messages' events fill in, and a buffered answer's body: it, the response, the chat.completion
}

// streamBlock is one block: text, or a tool call named as the caller declared it; a custom call made as a function is wrapped, its input held to the close.
type streamBlock struct {
	text            bool
	pos             int // its index among the blocks
	index           int // the call's index among calls
	id, name        string
	namespace       string // the caller's namespace of the tool, "" for none
	custom, wrapped bool
	buf             strings.Builder
}

// text writes the next piece of the answer's text, in the open text block or a new one.
func (s *callerStream) text(t string) (err error) {
	if t != "" && (s.open == nil || !s.open.text) {
		err = s.openBlock(&streamBlock{text: true})
	}
	if t == "" || err != nil {
		return err
	}
	s.open.buf.WriteString(t)
	return s.frames(s, stepDelta, s.open, t)
}

// call writes the next piece of tool call index's arguments (0-based, in call order), its start (tc named) opening its
// block, named as the caller declared the tool; a piece before the start is refused. A call whose block closed (a
// provider interleaving calls) still gets them at its index, where SDKs gather them.
func (s *callerStream) call(index int, tc part) error {
	i := slices.IndexFunc(s.blocks, func(b *streamBlock) bool { return !b.text && b.index == index })
	if i < 0 && tc.ToolName == "" {
		return fmt.Errorf("arguments for tool call %d before its start", index)
	} else if i < 0 {
		b := &streamBlock{index: index, id: tc.ToolCallID, name: tc.ToolName, custom: tc.Custom}
		if t := s.req.findTool(tc.ToolName); t != nil {
			b.name, b.namespace, b.custom = t.memberName(), t.Namespace, t.Type == toolCustom
		}
		b.wrapped, i = b.custom && !tc.Custom, len(s.blocks)
		if err := s.openBlock(b); err != nil {
			return err
		}
	}
	b := s.blocks[i]
	if b.buf.WriteString(tc.Arguments); tc.Arguments == "" || b.wrapped {
		return nil
	}
	return s.frames(s, stepDelta, b, tc.Arguments)
}

// openBlock closes the open block and opens b (nil: none). A wrapped call's input (the "input" member of the
// function made of a custom tool toward messages) goes out whole before it closes.
func (s *callerStream) openBlock(b *streamBlock) (err error) {
	if o := s.open; o != nil {
		if s.open = nil; o.wrapped {
			var in struct{ Input string }
			json.Unmarshal([]byte(o.buf.String()), &in)
			o.buf.Reset()
			o.buf.WriteString(in.Input)
			err = s.frames(s, stepDelta, o, in.Input)
		}
		if err == nil {
			err = s.frames(s, stepClose, o, o.buf.String())
		}
	}
	if err != nil || b == nil {
		return err
	}
	b.pos, s.open, s.blocks = len(s.blocks), b, append(s.blocks, b)
	return s.frames(s, stepOpen, b, "")
}

// finish writes, given a failure, the dialect's in-band error (no more after a write error: it sticks), never a
// terminal success event after it; else the whole calls chat's reader held back (those after the first, indexes from
// 1), the open block's close and the terminal sequence. Once, but for a close that fails: the failure's finish follows.
func (s *callerStream) finish(failure *apiError) (err error) {
	if s.done {
		return errCallerStreamDone
	} else if failure != nil {
		s.done, s.failure = true, failure
		return cmp.Or(s.frames(s, stepFail, nil, ""), s.write(nil, true))
	} else if s.rd.refusal {
		s.rd.finish = finishContentFilter
	}
	for i := 0; err == nil && i < len(s.rd.held); i++ {
		err = s.call(i+1, s.rd.held[i])
	}
	if err == nil {
		err = s.openBlock(nil)
	}
	if s.done = err == nil; s.done {
		err = cmp.Or(s.frames(s, stepEnd, nil, ""), s.write(nil, true))
	}
	return err
}

// frame writes one event unflushed (run flushes before it may wait, finish at the end), named when name is set; its
// data is Brama's own types, whose raw members it built valid. A buffered answer's frames are discarded unmarshalled.
func (s *callerStream) frame(name string, v any) error {
	if s.w == nil {
		return nil
	} else if name != "" {
		name = "event: " + name + "\n"
	}
	return s.write(slices.Concat([]byte(name+"data: "), must(json.Marshal(v)), []byte("\n\n")), false)
}

// write writes b and, when flush is set, flushes what is unflushed (SPEC §7.5), which restarts the keep-alive.
func (s *callerStream) write(b []byte, flush bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || s.w == nil {
		return s.err
	}
	_, s.err = s.w.Write(b)
	s.unflushed = s.unflushed || len(b) > 0
	if s.err == nil && flush && s.unflushed && s.flush != nil {
		s.flush()
		s.unflushed = false
	}
	return s.err
}

// streamReader is the one reader of a provider stream per protocol (SPEC §7.5): the terminal signal,
// the in-band error, usage and malformed events for every path, and, when translating, the text and
// tool calls given its caller stream (out). Passthrough relays the bytes and runs it for that bookkeeping only.
type streamReader struct {
	protocol  string
	secret    string        // the credential in use, redacted from an in-band error's code (SPEC §8.1)
	out       *callerStream // translation's writer; nil: text and tool calls are not decoded
	dropUsage bool          // chat passthrough: Brama asked for usage itself, so the usage chunk is not relayed
	finished  bool          // the terminal signal came (chat: every choice's finish_reason)
	finish    string
	usage     usage
	refusal   bool // a refusal came: the finish is content_filter
	// translation: the provider's calls (responses: its items) by the provider's index for them (chat's tool
	// index, messages' content block index, responses' output_index), and the tool calls started
	calls  map[int]*upstreamCall
	ncalls int
	// chat: the choice indexes seen and finished (n ≤ 128), the calls after the first, held to the end
	choices [2][2]uint64
	held    []part
	// a buffered codex caller (non-nil raw): output_item.done items by output_index, its answer (readResponses)
	raw     map[int][]byte
	final   json.RawMessage
	scratch [2][16]jsonMember // member storage for an event and one of its members
	elems   [2]jsonMember     // element storage for an event's choices
}

// upstreamCall is one of the provider's calls (or a responses message item) as translation follows it.
type upstreamCall struct {
	tool     int    // the neutral tool index; -1: a responses message item
	id       string // chat: the call's id, telling a new call at a reused index
	streamed bool   // text or arguments given: the end gives none
}

// run reads body's events (lines end at a byte of ends) to the terminal signal (SPEC §7.5), relaying them as received
// to w but when translating (w nil: the codex buffered answer's), and flushing w before a read that may wait (not per
// event: that costs CPU), so none waits in Brama for a later one. nil only after the terminal signal: a cut or in-band
// error is provider_incomplete, a malformed event provider_failure. A chat stream ended without [DONE] gets it.
func (r *streamReader) run(body io.Reader, ends string, w *callerStream) error {
	rd := newSSEReader(body, ends)
	for {
		if w != nil && !rd.ready() { // a write error sticks: the next write returns it
			w.write(nil, true)
		}
		raw, event, data, err := rd.next()
		if err != nil && !r.finished {
			return streamCut(err)
		} else if err != nil && w != nil && r.out == nil { // only chat is finished before its end ([DONE])
			return w.write([]byte("data: [DONE]\n\n"), false)
		} else if err != nil {
			return nil
		}
		keep, end, err := r.read(event, data)
		if err == nil && keep && w != nil && r.out == nil {
			err = w.write(raw, false)
		}
		if err != nil || end {
			return err
		}
	}
}

// read takes one event: whether to relay it, whether it ends the stream, or the failure; only
// the members named here are decoded, the rest only checked valid.
func (r *streamReader) read(event string, data []byte) (keep, end bool, err error) {
	done := r.protocol == protoOpenAIChat && string(data) == "[DONE]"
	e, ok := rawObject{}, data != nil && !done && json.Valid(data)
	if ok {
		e, ok = splitRaw(data, '{', r.scratch[0][:])
	}
	typeless := r.protocol == protoOpenAIChat || event == "error" && r.protocol == protoAnthropic // chat's events have no type
	typ := pick(typeless, event, cmp.Or(string(rawText(e.value("type"))), event))                 // a switch on it allocates nothing
	switch {
	case done && !r.finished:
		return false, false, streamCut(io.EOF)
	case data == nil || done: // no data line dispatches nothing (WHATWG); chat's [DONE] ends
		return true, done, nil
	case !ok:
		return false, false, eventWithout(r.protocol, "data", "one JSON object")
	case typ == "" && r.protocol != protoOpenAIChat:
		return false, false, eventWithout(r.protocol, "event", "a type")
	case typ == "error" || r.protocol == protoOpenAIResponses && typ == "response.failed" ||
		r.protocol == protoOpenAIChat && !rawIsNull(e.value("error")):
		return false, false, r.inBandError(e)
	case r.protocol == protoAnthropic: // a direct call, not through the format table: typ stays on the stack
		return r.readMessages(typ, e)
	case r.protocol == protoOpenAIResponses:
		return r.readResponses(typ, e)
	}
	return r.readChat(e)
}

// decode decodes o's member key into v (absent or null leaves v as it is); a failure is a malformed event.
func (r *streamReader) decode(o rawObject, key string, v any) error {
	if raw := o.value(key); !rawIsNull(raw) && json.Unmarshal(raw, v) != nil {
		return eventWithout(r.protocol, "event", "a valid "+key)
	}
	return nil
}

// upstreamStreamError is an in-band error's cause: its redacted code, and the refusalRate or refusalQuota class the
// dispatcher records a block for (SPEC §6.2).
type upstreamStreamError struct{ Code, Class string }

func (e *upstreamStreamError) Error() string { return "provider stream error " + e.Code }

// inBandError is provider_incomplete: the caller cannot know what was billed (SPEC §6.2, §7.5). Its code, the event's,
// its error's (Anthropic's names it in type) or its failed response's error's, is classified (the codes that say
// "rate", quotaCodes those that say "quota") before the credential is redacted from it.
func (r *streamReader) inBandError(e rawObject) *apiError {
	code, _ := jsonScalar(e.value("code"))
	f, _ := errorObject(e.value("error"))
	failed, _ := errorObject(rawMember(e.value("response"), "error"))
	code = cmp.Or(code, pick(r.protocol == protoAnthropic, f.typ, ""), f.code, f.typ, failed.code)
	rate := slices.Contains([]string{"rate_limit_exceeded", "rate_limit_error", "usage_limit_reached"}, code)
	class := pick(quotaCodes[code], refusalQuota, pick(rate, refusalRate, ""))
	se := &upstreamStreamError{Code: cmp.Or(cleanQuoted(code, r.secret, 64), "unspecified"), Class: class}
	return refuse("provider_incomplete", "the provider stream failed with error %q", se.Code).because(se)
}

// malformedAnswer refuses a 2xx body or stream event that is not the protocol's answer, never quoted.
func malformedAnswer(protocol string, cause error) *apiError {
	return refuse("provider_failure", "the provider answered with a malformed %s body", protocol).because(cause)
}

func eventWithout(protocol, typ, what string) *apiError {
	return malformedAnswer(protocol, errors.New(typ+" without "+what))
}

// streamCut fails a stream cut before its terminal signal: the provider may have generated and billed (§7.5, §8.2).
func streamCut(err error) *apiError {
	if errors.Is(err, io.EOF) {
		return refuse("provider_incomplete", "the provider stream ended before its terminal signal")
	} else if ae := classifyTransport(err); ae.Code == "client_cancelled" {
		return ae
	}
	return refuse("provider_incomplete", "the provider stream failed before its terminal signal: %s",
		cleanQuoted(err.Error(), "", 300)).because(err)
}

// usageOf reads a usage member in Brama's terms, absent or null unreported; Anthropic's cached input counts, as OpenAI's does.
func usageOf(protocol string, raw json.RawMessage) (usage, error) {
	if rawIsNull(raw) {
		return usage{}, nil
	}
	u := new(struct { // all three formats' members, after the null test (it escapes); flat: embedded types allocate
		PromptTokens             int `json:"prompt_tokens"`
		CompletionTokens         int `json:"completion_tokens"`
		InputTokens              int `json:"input_tokens"`
		OutputTokens             int `json:"output_tokens"`
		CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	})
	if err := json.Unmarshal(raw, u); err != nil {
		return usage{}, malformedAnswer(protocol, err)
	}
	if protocol == protoOpenAIChat {
		return usage{u.PromptTokens, u.CompletionTokens, true}, nil
	}
	return usage{u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens, u.OutputTokens, true}, nil
}
