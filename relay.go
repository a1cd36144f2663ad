package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The passthrough answer (SPEC §7.6): the provider's own bytes. A buffered
// body is relayed as received and read only for usage (§13); a stream's
// events are relayed as received, each flushed at once, and read only for
// what §7.5 needs (commit, terminal signal, in-band error) and usage.

// passthroughUsageBody is the one member of a buffered answer Brama reads.
type passthroughUsageBody struct {
	Usage *passthroughUsage `json:"usage"`
}

// passthroughUsage holds the usage members of all three formats: chat's
// prompt/completion tokens, messages' input/output and cache tokens,
// responses' input/output tokens.
type passthroughUsage struct {
	PromptTokens             int `json:"prompt_tokens"`
	CompletionTokens         int `json:"completion_tokens"`
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// count is the usage in Brama's terms; Anthropic reports cached input
// apart, and Brama's count includes it, as OpenAI's does.
func (u *passthroughUsage) count(protocol string) usage {
	if u == nil {
		return usage{}
	}
	if protocol == protoOpenAIChat {
		return usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, Reported: true}
	}
	return usage{InputTokens: u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens, OutputTokens: u.OutputTokens, Reported: true}
}

// bufferedUsage reads the usage of a buffered answer; a body that is not a
// JSON object is no answer of the format (provider_failure).
func bufferedUsage(protocol string, body []byte) (usage, error) {
	var b passthroughUsageBody
	if err := json.Unmarshal(body, &b); err != nil || rawShape(body) != '{' {
		return usage{}, malformedAnswer(protocol, err)
	}
	return b.Usage.count(protocol), nil
}

// rawSSEReader splits a provider's event stream into blocks kept as
// received: every line of an event up to and including the blank line that
// ends it. Lines end at "\n" ("\r\n" too). Like sseReader it has no length
// limit and never times out (SPEC §7.4).
type rawSSEReader struct {
	r         *bufio.Reader
	started   bool   // the byte-order mark check is done
	raw, data []byte // the last block and its data, reused by next
}

func newRawSSEReader(r io.Reader) *rawSSEReader {
	return &rawSSEReader{r: bufio.NewReaderSize(r, 16<<10)}
}

// next returns the next block's bytes, its event name and its data lines
// joined with "\n"; the slices are valid until the next call. A block of
// comments only has no name and no data. The last block is returned,
// terminated, when the body ends after a complete line; then io.EOF. A
// body cut mid-line is io.ErrUnexpectedEOF.
func (s *rawSSEReader) next() (raw []byte, event string, data []byte, err error) {
	s.raw, s.data = s.raw[:0], s.data[:0]
	hasData := false
	for {
		line, err := s.line()
		if n := len(line); n > 0 && line[n-1] == '\n' {
			content := bytes.TrimRight(line, "\r\n")
			if len(content) == 0 {
				if len(s.raw) == 0 {
					continue // blank lines between blocks carry nothing
				}
				s.raw = append(s.raw, line...)
				return s.raw, event, s.data, nil
			}
			s.raw = append(s.raw, line...)
			field, value, found := bytes.Cut(content, []byte(":"))
			if found {
				value = bytes.TrimPrefix(value, []byte(" "))
			}
			switch {
			case len(field) == 0: // a comment
			case string(field) == "event":
				event = string(value)
			case string(field) == "data":
				if hasData {
					s.data = append(s.data, '\n')
				}
				s.data, hasData = append(s.data, value...), true
			}
		} else if n > 0 {
			return nil, "", nil, io.ErrUnexpectedEOF // cut mid-line
		}
		if err != nil {
			if errors.Is(err, io.EOF) && len(s.raw) > 0 {
				s.raw = append(s.raw, '\n') // the provider never ended the block; end it for the caller
				return s.raw, event, s.data, nil
			}
			return nil, "", nil, err
		}
	}
}

// ready reports whether a whole next block is already buffered, so
// reading it cannot wait on the provider.
func (s *rawSSEReader) ready() bool {
	b, _ := s.r.Peek(s.r.Buffered())
	b = bytes.TrimLeft(b, "\r\n") // blank lines before a block are skipped, not an end
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\n\r\n"))
}

// line reads one physical line with its terminator; the first drops a
// byte-order mark. The slice is valid until the next read.
func (s *rawSSEReader) line() ([]byte, error) {
	line, err := s.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		line = bytes.Clone(line)
		for errors.Is(err, bufio.ErrBufferFull) {
			var chunk []byte
			chunk, err = s.r.ReadSlice('\n')
			line = append(line, chunk...)
		}
	}
	if !s.started && len(line) > 0 {
		line = bytes.TrimPrefix(line, []byte("\ufeff"))
		s.started = true
	}
	return line, err
}

// passthroughWatch reads a relayed stream's events as far as SPEC §7.5 and
// §13 need. It knows the three formats' terminal signals and in-band
// errors, and collects a responses stream's output items for a buffered
// caller of codex.
type passthroughWatch struct {
	protocol   string
	dropUsage  bool // chat: Brama asked for usage itself, so the usage chunk is not relayed
	usage      usage
	finished   bool              // the provider sent its terminal signal (chat: a finish_reason)
	sawDone    bool              // chat: data: [DONE] arrived
	items      map[int][]byte    // responses: output_item.done items by output_index
	completed  json.RawMessage   // responses: the final response object
	collecting bool              // keep items and the final response (a buffered codex caller)
	scratch    [2][16]jsonMember // member storage for an event and one of its members
	elems      [4][]byte         // element storage for an event's choices
}

// watch reads one event. relay says whether the caller gets it; end says
// the stream is complete and nothing more is read. A refusal is the
// stream's failure: an in-band error is provider_incomplete, a malformed
// event provider_failure. Only the members named here are decoded; the
// rest of an event is checked to be JSON and skipped.
func (pw *passthroughWatch) watch(event string, data []byte) (relay, end bool, err error) {
	if len(data) == 0 && event == "" {
		return true, false, nil // comments only: the provider's keep-alive
	}
	if pw.protocol == protoOpenAIChat && string(data) == "[DONE]" {
		if !pw.finished {
			return false, false, refuse("provider_incomplete", "the provider stream ended before its terminal signal")
		}
		pw.sawDone = true
		return true, true, nil
	}
	e, err := parseRawObjectInto(data, pw.scratch[0][:])
	if err != nil {
		return false, false, malformedEvent(pw.protocol, errEventNotObject)
	}
	typ := string(rawText(e.value("type"))) // a switch on it below allocates nothing
	if typ == "" {
		typ = event
	}
	switch pw.protocol {
	case protoOpenAIChat:
		return pw.chatEvent(event, e)
	case protoAnthropic:
		return pw.messagesEvent(typ, e)
	}
	return pw.responsesEvent(typ, e)
}

// chatEvent: a chunk with finish_reason is the terminal signal; usage
// comes in its own chunk (choices: []) after it.
func (pw *passthroughWatch) chatEvent(event string, e rawObject) (relay, end bool, err error) {
	if event == "error" || !rawIsNull(e.value("error")) {
		f, _ := errorObject(e.value("error"))
		return false, false, inBandError(cmp.Or(f.code, f.typ))
	}
	u, err := usageOf(pw.protocol, e.value("usage"))
	if err != nil {
		return false, false, err
	}
	if u.Reported {
		pw.usage = u
	}
	choices := rawArray(e.value("choices"), pw.elems[:])
	for _, c := range choices {
		if co, err := splitRawObject(c, pw.scratch[1][:]); err == nil {
			if len(rawText(co.value("finish_reason"))) > 0 {
				pw.finished = true
			}
		}
	}
	return !(pw.dropUsage && u.Reported && len(choices) == 0), false, nil
}

// messagesEvent: message_stop is the terminal signal; usage comes in
// message_start and message_delta.
func (pw *passthroughWatch) messagesEvent(typ string, e rawObject) (relay, end bool, err error) {
	switch typ {
	case "error":
		f, _ := errorObject(e.value("error"))
		return false, false, inBandError(cmp.Or(f.typ, f.code))
	case "message_start":
		if m, err := splitRawObject(e.value("message"), pw.scratch[1][:]); err == nil {
			if pw.usage, err = usageOf(pw.protocol, m.value("usage")); err != nil {
				return false, false, err
			}
		}
	case "message_delta":
		u, err := usageOf(pw.protocol, e.value("usage"))
		if err != nil {
			return false, false, err
		}
		if u.Reported {
			if u.InputTokens > 0 { // newer streams repeat the input count
				pw.usage.InputTokens = u.InputTokens
			}
			pw.usage.OutputTokens, pw.usage.Reported = u.OutputTokens, true
		}
	case "message_stop":
		pw.finished = true
		return true, true, nil
	}
	return true, false, nil
}

// responsesEvent: response.completed (or .incomplete) is the terminal
// signal and carries usage; a buffered codex caller's output items are
// kept as they come.
func (pw *passthroughWatch) responsesEvent(typ string, e rawObject) (relay, end bool, err error) {
	switch typ {
	case "":
		return false, false, malformedEvent(pw.protocol, errors.New("event without a type"))
	case "error":
		code, _ := jsonScalar(e.value("code"))
		if f, ok := errorObject(e.value("error")); ok && code == "" {
			code = cmp.Or(f.code, f.typ)
		}
		return false, false, inBandError(code)
	case "response.failed":
		var f errorFields
		if r, err := splitRawObject(e.value("response"), pw.scratch[1][:]); err == nil {
			f, _ = errorObject(r.value("error"))
		}
		return false, false, inBandError(f.code)
	case "response.output_item.done":
		if pw.collecting {
			var i int
			if json.Unmarshal(e.value("output_index"), &i) != nil || rawShape(e.value("item")) != '{' {
				return false, false, malformedEvent(pw.protocol, errors.New("output item without index or item"))
			}
			if pw.items == nil {
				pw.items = map[int][]byte{}
			}
			pw.items[i] = bytes.Clone(e.value("item")) // the reader reuses its buffer
		}
	case "response.completed", "response.incomplete":
		r, err := splitRawObject(e.value("response"), pw.scratch[1][:])
		if err != nil {
			return false, false, malformedEvent(pw.protocol, errors.New(typ+" without response"))
		}
		if pw.usage, err = usageOf(pw.protocol, r.value("usage")); err != nil {
			return false, false, err
		}
		pw.finished = true
		if pw.collecting {
			pw.completed = bytes.Clone(e.value("response"))
		}
		return true, true, nil
	}
	return true, false, nil
}

// errEventNotObject is the cause of a malformed event whose data is not
// one JSON object.
var errEventNotObject = errors.New("the event data is not one JSON object")

// usageOf reads a usage member; absent or null is unreported.
func usageOf(protocol string, raw json.RawMessage) (usage, error) {
	if rawIsNull(raw) {
		return usage{}, nil
	}
	var u passthroughUsage
	if err := json.Unmarshal(raw, &u); err != nil {
		return usage{}, malformedEvent(protocol, err)
	}
	return u.count(protocol), nil
}

// streamCut is the failure of a stream whose body ended or broke before
// its terminal signal: after commit the provider may have generated and
// billed, so it is provider_incomplete (SPEC §7.5, §8.2).
func streamCut(err error) *apiError {
	if errors.Is(err, io.EOF) {
		return refuse("provider_incomplete", "the provider stream ended before its terminal signal")
	}
	if ae := classifyTransport(err); ae.Code == "client_cancelled" {
		return ae
	}
	// The request was sent long ago: whatever broke, the provider may have
	// generated and billed (SPEC §8.2).
	return refuse("provider_incomplete", "the provider stream failed before its terminal signal: %s",
		cleanQuoted(err.Error(), "", 300)).because(err)
}

// readWatched reads a whole stream through the watch without relaying it:
// a buffered caller of a provider that only streams (codex).
func readWatched(pw *passthroughWatch, body io.Reader) error {
	rd := newRawSSEReader(body)
	for {
		_, event, data, err := rd.next()
		if err != nil {
			if pw.finished {
				return nil
			}
			return streamCut(err)
		}
		if _, end, err := pw.watch(event, data); err != nil || end {
			return err
		}
	}
}

// assembledResponse is a buffered responses answer built from a codex
// stream (SPEC §6.2): the final response object, as the provider sent it,
// with its output replaced by the output_item.done items in output_index
// order when the stream showed any.
func assembledResponse(pw *passthroughWatch) ([]byte, error) {
	o, err := parseRawObject(pw.completed)
	if err != nil {
		return nil, malformedAnswer(protoOpenAIResponses, err)
	}
	if len(pw.items) == 0 {
		return pw.completed, nil
	}
	idx := make([]int, 0, len(pw.items))
	for i := range pw.items {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	out := []byte("[")
	for n, i := range idx {
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, pw.items[i]...)
	}
	return o.edit(memberEdit{"output", append(out, ']')}), nil
}

// relayBuffered answers a buffered passthrough call: the provider's body
// as received (a codex stream assembled), its usage read.
func relayBuffered(w http.ResponseWriter, cr *callerRequest, c call, resp *http.Response, attempts int) (usage, *apiError) {
	p := c.res.Provider
	var (
		body []byte
		u    usage
		err  error
	)
	if upstreamStreams(p, cr.head) {
		pw := &passthroughWatch{protocol: p.protocol, collecting: true}
		if err = readWatched(pw, resp.Body); err == nil {
			body, err = assembledResponse(pw)
		}
		u = pw.usage
	} else if body, err = io.ReadAll(resp.Body); err != nil {
		err = refuse("provider_incomplete", "provider %q answer was cut after %d bytes", p.id, len(body)).because(err)
	} else {
		u, err = bufferedUsage(p.protocol, body)
	}
	if err != nil {
		return u, asAPIError(err).redactedFor(c.presented()).withAttempts(attempts)
	}
	ct := "application/json" // an assembled answer is Brama's JSON
	if !upstreamStreams(p, cr.head) {
		ct = cmp.Or(resp.Header.Get("Content-Type"), ct)
	}
	writeAnswer(w, ct, attempts, body)
	return u, nil
}

// relayPassthroughStream relays a committed provider stream event by event
// as received (SPEC §7.6). A chat stream that completed without
// data: [DONE] gets it.
func relayPassthroughStream(sa *streamAnswer, cr *callerRequest, _ chatRequest, c call, resp *http.Response) (usage, error) {
	p := c.res.Provider
	pw := &passthroughWatch{protocol: p.protocol, dropUsage: cr.addsUsage(p)}
	rd := newRawSSEReader(resp.Body)
	var err error
	for {
		raw, event, data, rerr := rd.next()
		if rerr != nil {
			if !pw.finished {
				err = streamCut(rerr)
			} else if p.protocol == protoOpenAIChat && !pw.sawDone {
				err = sa.write([]byte("data: [DONE]\n\n"))
			}
			break
		}
		relay, end, werr := pw.watch(event, data)
		if werr == nil && relay {
			werr = sa.write(raw)
		}
		if err = werr; err != nil || end {
			break
		}
		if !rd.ready() { // the next read may wait on the provider: the caller has all it has
			sa.flushWritten()
		}
	}
	return pw.usage, err
}

// keepAliveEvery is how long a stream may be silent before Brama writes an
// SSE comment (SPEC §7.5). It writes; it never cuts.
const keepAliveEvery = 15 * time.Second

// streamAnswer is the caller side of a committed stream, translated or
// passed through: the SSE headers, one lock shared by the relay and the
// keep-alive timer, and the dialect's stream writer for keep-alives and
// the in-band error (SPEC §7.5).
type streamAnswer struct {
	mu        sync.Mutex // guards cs, w, unflushed and ended
	w         io.Writer
	flush     func()
	cs        *callerStream
	unflushed bool // write wrote bytes not yet flushed
	ended     bool
	every     time.Duration
	timer     *time.Timer
}

// openStreamAnswer sends the caller its 200 and starts the keep-alive
// timer: an SSE comment after every 15 s without an event. model is the
// name the dialect's own events report; req's tools name translated calls.
func (e *engine) openStreamAnswer(w http.ResponseWriter, dialect string, req chatRequest, model string, attempts int) *streamAnswer {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Set("Brama-Attempts", strconv.Itoa(attempts))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	flush := func() { rc.Flush() }
	sa := &streamAnswer{w: w, flush: flush, cs: newCallerStream(dialect, req, w, flush, model), every: cmp.Or(e.keepAlive, keepAliveEvery)}
	sa.timer = time.AfterFunc(sa.every, func() {
		sa.mu.Lock()
		defer sa.mu.Unlock()
		if !sa.ended {
			sa.timer.Reset(sa.every)
			sa.cs.keepAlive()
		}
	})
	return sa
}

// do runs f under the lock and restarts the silence timer; nothing runs
// once the stream is closed.
func (sa *streamAnswer) do(f func() error) error {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.ended {
		return nil
	}
	sa.timer.Reset(sa.every)
	return f()
}

// write relays one event's bytes as received. They are flushed by
// flushWritten, which the relay calls before it may wait on the provider,
// so no event waits in Brama for a later one (SPEC §7.5).
func (sa *streamAnswer) write(b []byte) error {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.ended {
		return nil
	}
	sa.unflushed = true
	_, err := sa.w.Write(b)
	return err
}

// flushWritten flushes what write left unflushed and restarts the silence
// timer: the caller has just received an event.
func (sa *streamAnswer) flushWritten() {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.unflushed && !sa.ended {
		sa.flush()
		sa.unflushed = false
		sa.timer.Reset(sa.every)
	}
}

// close stops the timer: nothing more is written.
func (sa *streamAnswer) close() {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	sa.ended = true
	sa.timer.Stop()
}

// failStream writes the dialect's in-band error for a stream that failed
// after commit and returns it; the caller aborts the response.
func (e *engine) failStream(ctx context.Context, sa *streamAnswer, c call, err error, attempts int) *apiError {
	ae := asAPIError(err).redactedFor(c.presented()).withAttempts(attempts)
	if ctx.Err() != nil {
		ae = refuse("client_cancelled", "the caller hung up during the stream").because(err).withAttempts(attempts)
	}
	// The replay guard meets the failure before the caller reads it in-band:
	// a caller that falls back at once, or hangs up after it, is remembered.
	e.refused(ae, false, true)
	sa.do(func() error { return sa.cs.fail(ae) })
	e.log.Warn("stream_failed_after_commit", "request_id", e.t.requestID, "code", ae.Code, "cause", redact(fmt.Sprint(ae.Err), c.presented()))
	return ae
}

// relayStream translates a committed provider stream to the caller's
// dialect, flushing every event.
func relayStream(sa *streamAnswer, _ *callerRequest, req chatRequest, c call, resp *http.Response) (usage, error) {
	var u usage
	err := sa.do(sa.cs.start)
	if err == nil {
		err = readUpstreamStream(c.res.Provider.protocol, resp.Body, func(ev streamEvent) error {
			if ev.Kind == eventUsage {
				u = ev.Usage
			}
			return sa.do(func() error { return sa.cs.event(ev) })
		})
	}
	if err == nil {
		err = sa.do(sa.cs.finish)
	}
	return u, err
}
