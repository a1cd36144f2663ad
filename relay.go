package main

import (
	"bytes"
	"cmp"
	"context"
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

// The passthrough answer (SPEC §7.6): the provider's own bytes as received,
// read only for usage (§13), terminal signal and in-band error (§7.5).

// passthroughUsage holds the usage members of all three formats (flat: the
// wire types embedded cost an allocation per event).
type passthroughUsage struct {
	PromptTokens             int `json:"prompt_tokens"`
	CompletionTokens         int `json:"completion_tokens"`
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// count is the usage in Brama's terms; Anthropic's cached input counts, as
// OpenAI's does.
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
	var b struct {
		Usage *passthroughUsage `json:"usage"`
	}
	if err := json.Unmarshal(body, &b); err != nil || rawShape(body) != '{' {
		return usage{}, malformedAnswer(protocol, err)
	}
	return b.Usage.count(protocol), nil
}

// usageOf reads a stream event's usage member; absent or null is unreported.
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

// passthroughWatch reads a relayed stream's events as far as SPEC §7.5 and
// §13 need, and a codex stream's output items for a buffered caller.
type passthroughWatch struct {
	protocol  string
	dropUsage bool // chat: Brama asked for usage itself, so the usage chunk is not relayed
	usage     usage
	finished  bool              // the provider sent its terminal signal (chat: every choice's finish_reason)
	choices   [2][2]uint64      // chat: the choice indexes seen, and those finished (n ≤ 128)
	sawDone   bool              // chat: data: [DONE] arrived
	items     map[int][]byte    // non-nil for a buffered codex caller: output_item.done items by output_index
	completed json.RawMessage   // with items: the final response object
	scratch   [2][16]jsonMember // member storage for an event and one of its members
	elems     [2]jsonMember     // element storage for an event's choices
}

var errEventNotObject = errors.New("the event data is not one JSON object")

// watch reads one event: relay it or not, end of stream, or the failure;
// only the members named here are decoded, the rest only checked valid.
func (pw *passthroughWatch) watch(event string, data []byte) (relay, end bool, err error) {
	if data == nil {
		return true, false, nil // no data line dispatches nothing (WHATWG): a comment, the provider's keep-alive
	}
	if pw.protocol == protoOpenAIChat && string(data) == "[DONE]" {
		if !pw.finished {
			return false, false, streamCut(io.EOF)
		}
		pw.sawDone = true
		return true, true, nil
	}
	if !json.Valid(data) {
		return false, false, malformedEvent(pw.protocol, errEventNotObject)
	}
	e, err := splitRawObject(data, pw.scratch[0][:])
	if err != nil {
		return false, false, malformedEvent(pw.protocol, errEventNotObject)
	}
	typ := string(rawText(e.value("type"))) // a switch on it below allocates nothing
	switch pw.protocol {
	case protoOpenAIChat:
		return pw.chatEvent(event, e)
	case protoAnthropic:
		return pw.messagesEvent(cmp.Or(typ, event), e)
	}
	return pw.responsesEvent(cmp.Or(typ, event), e)
}

// chatEvent: finish_reason is the terminal signal; usage follows alone.
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
	choices, _ := splitRaw(e.value("choices"), '[', pw.elems[:])
	for _, c := range choices.members {
		co, err := splitRawObject(choices.src[c.val:c.end], pw.scratch[1][:])
		if err != nil {
			continue
		}
		i, _ := strconv.Atoi(string(co.value("index"))) // absent: choice 0
		i &= 127
		pw.choices[0][i/64] |= 1 << (i % 64)
		if len(rawText(co.value("finish_reason"))) > 0 {
			pw.choices[1][i/64] |= 1 << (i % 64)
		}
		pw.finished = pw.choices[0] == pw.choices[1] // n > 1: a stream ends with its last choice
	}
	return !(pw.dropUsage && u.Reported && len(choices.members) == 0), false, nil
}

// messagesEvent: message_stop ends; usage comes in message_start and _delta.
func (pw *passthroughWatch) messagesEvent(typ string, e rawObject) (relay, end bool, err error) {
	switch typ {
	case "":
		return false, false, malformedEvent(pw.protocol, errors.New("event without a type"))
	case "error":
		f, _ := errorObject(e.value("error"))
		return false, false, inBandError(cmp.Or(f.typ, f.code))
	case "message_start":
		if m, err := splitRawObject(e.value("message"), pw.scratch[1][:]); err == nil {
			pw.usage, err = usageOf(pw.protocol, m.value("usage"))
			return err == nil, false, err
		}
	case "message_delta":
		u, err := usageOf(pw.protocol, e.value("usage"))
		if u.InputTokens > 0 { // newer streams repeat the input count
			pw.usage.InputTokens = u.InputTokens
		}
		if u.Reported {
			pw.usage.OutputTokens, pw.usage.Reported = u.OutputTokens, true
		}
		return err == nil, false, err
	case "message_stop":
		pw.finished = true
		return true, true, nil
	}
	return true, false, nil
}

// responsesEvent: response.completed (or .incomplete) ends, with usage.
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
		if pw.items == nil {
			break
		}
		var i int
		if json.Unmarshal(e.value("output_index"), &i) != nil || rawShape(e.value("item")) != '{' {
			return false, false, malformedEvent(pw.protocol, errors.New("output item without index or item"))
		}
		pw.items[i] = bytes.Clone(e.value("item")) // the reader reuses its buffer
	case "response.completed", "response.incomplete":
		r, err := splitRawObject(e.value("response"), pw.scratch[1][:])
		if err != nil {
			return false, false, malformedEvent(pw.protocol, errors.New(typ+" without response"))
		}
		if pw.usage, err = usageOf(pw.protocol, r.value("usage")); err != nil {
			return false, false, err
		}
		pw.finished = true
		if pw.items != nil {
			pw.completed = bytes.Clone(e.value("response"))
		}
		return true, true, nil
	}
	return true, false, nil
}

// streamCut is the failure of a stream cut before its terminal signal: the
// provider may have generated and billed (SPEC §7.5, §8.2).
func streamCut(err error) *apiError {
	if errors.Is(err, io.EOF) {
		return refuse("provider_incomplete", "the provider stream ended before its terminal signal")
	}
	if ae := classifyTransport(err); ae.Code == "client_cancelled" {
		return ae
	}
	return refuse("provider_incomplete", "the provider stream failed before its terminal signal: %s",
		cleanQuoted(err.Error(), "", 300)).because(err)
}

// relayBuffered answers a buffered passthrough call with the provider's
// body; a codex stream (SPEC §6.2) is read whole and assembled.
func relayBuffered(w http.ResponseWriter, cr *callerRequest, c call, resp *http.Response, attempts int) (usage, *apiError) {
	p := c.res.Provider
	var (
		body []byte
		u    usage
		err  error
	)
	ct := cmp.Or(resp.Header.Get("Content-Type"), "application/json")
	if upstreamStreams(p, cr.head) {
		pw := &passthroughWatch{protocol: p.protocol, items: map[int][]byte{}}
		if err = relayWatched(pw, resp.Body, nil); err == nil {
			body = assembledResponse(pw)
		}
		u, ct = pw.usage, "application/json" // an assembled answer is Brama's JSON
	} else if body, err = io.ReadAll(resp.Body); err != nil {
		err = refuse("provider_incomplete", "provider %q answer was cut after %d bytes", p.id, len(body)).because(err)
	} else {
		u, err = bufferedUsage(p.protocol, body)
	}
	if err != nil {
		return u, asAPIError(err).redactedFor(c.cred.bearer()).withAttempts(attempts)
	}
	providerFacts(w.Header(), resp.Header, true)
	writeAnswer(w, ct, attempts, body)
	return u, nil
}

// providerFacts gives the caller what SPEC §17 lets a provider's answer
// tell: its request id as request-id (X-Request-Id is Brama's own) and, for
// a same-format answer, its rate-limit headers as received; nothing else
// (no cookie, nothing naming the provider account).
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

// assembledResponse is a watched codex stream's final response, its output
// the output_item.done items in output_index order when any.
func assembledResponse(pw *passthroughWatch) []byte {
	if len(pw.items) == 0 {
		return pw.completed
	}
	var items [][]byte
	for _, i := range slices.Sorted(maps.Keys(pw.items)) {
		items = append(items, pw.items[i])
	}
	o, _ := splitRawObject(pw.completed, nil)
	return o.edit(memberEdit{"output", append(append([]byte("["), bytes.Join(items, []byte(","))...), ']')})
}

// relayPassthroughStream relays a committed stream event by event as
// received (SPEC §7.6).
func relayPassthroughStream(sa *streamAnswer, cr *callerRequest, _ chatRequest, c call, resp *http.Response) (usage, error) {
	pw := &passthroughWatch{protocol: c.res.Provider.protocol, dropUsage: cr.addsUsage(c.res.Provider)}
	err := relayWatched(pw, resp.Body, sa)
	return pw.usage, err
}

// relayWatched reads a committed stream through pw, relaying each event to
// sa (nil: a buffered caller); a chat stream ended without [DONE] gets it.
func relayWatched(pw *passthroughWatch, body io.Reader, sa *streamAnswer) error {
	rd := newSSEReader(body, "\n")
	for {
		raw, event, data, err := rd.next()
		if err != nil {
			if !pw.finished {
				return streamCut(err)
			}
			if sa != nil && pw.protocol == protoOpenAIChat && !pw.sawDone {
				return sa.relay([]byte("data: [DONE]\n\n"), false)
			}
			return nil
		}
		relay, end, err := pw.watch(event, data)
		if !relay {
			raw = nil
		}
		if err == nil && sa != nil { // flush if the next read may wait on the provider
			err = sa.relay(raw, !end && !rd.ready())
		}
		if err != nil || end {
			return err
		}
	}
}

// keepAliveEvery is how long a stream may be silent before Brama writes an
// SSE comment (SPEC §7.5). It writes; it never cuts.
const keepAliveEvery = 15 * time.Second

// streamAnswer is the caller side of a committed stream: one lock for the
// relay and the keep-alive timer, and the dialect's writer (SPEC §7.5).
type streamAnswer struct {
	mu        sync.Mutex // guards cs, w, unflushed and ended
	w         io.Writer
	flush     func()
	cs        *callerStream
	unflushed bool // relay wrote bytes not yet flushed
	ended     bool
	every     time.Duration
	timer     *time.Timer
}

// openStreamAnswer sends the 200 and starts the keep-alive timer; model is
// what the dialect's events report, req's tools name translated calls.
func (e *engine) openStreamAnswer(w http.ResponseWriter, dialect string, req chatRequest, model string, attempts int) *streamAnswer {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	h.Set("Brama-Attempts", strconv.Itoa(attempts))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	flush := func() { rc.Flush() }
	flush() // committed: the caller has its 200 now, however long the provider stays silent
	sa := &streamAnswer{w: w, flush: flush, cs: newCallerStream(dialect, req, w, flush, model), every: cmp.Or(e.keepAlive, keepAliveEvery)}
	sa.mu.Lock() // the timer's first run reads sa.timer, under mu
	defer sa.mu.Unlock()
	sa.timer = time.AfterFunc(sa.every, func() { sa.do(sa.cs.keepAlive) })
	return sa
}

// do runs f under the lock, unless closed, and restarts the silence timer.
func (sa *streamAnswer) do(f func() error) error {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.ended {
		return nil
	}
	sa.timer.Reset(sa.every)
	return f()
}

// relay writes one event (nil: none) and, when the relay may wait next,
// flushes what was written (SPEC §7.5) and restarts the silence timer; not
// per event: a timer reset per event costs CPU.
func (sa *streamAnswer) relay(b []byte, flush bool) error {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.ended {
		return nil
	}
	_, err := sa.w.Write(b)
	sa.unflushed = sa.unflushed || len(b) > 0
	if flush && sa.unflushed {
		sa.flush()
		sa.unflushed = false
		sa.timer.Reset(sa.every)
	}
	return err
}

// close stops the timer: nothing more is written.
func (sa *streamAnswer) close() {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	sa.ended = true
	sa.timer.Stop()
}

// failStream writes and returns the in-band error of a committed stream.
func (e *engine) failStream(ctx context.Context, sa *streamAnswer, c call, err error, attempts int) *apiError {
	ae := asAPIError(err).redactedFor(c.cred.bearer()).withAttempts(attempts)
	if ctx.Err() != nil {
		ae = refuse("client_cancelled", "the caller hung up during the stream").because(err).withAttempts(attempts)
	}
	e.refused(ae, false, true) // before the caller can read it and fall back

	sa.do(func() error { return sa.cs.fail(ae) })
	e.log.Warn("stream_failed_after_commit", "request_id", e.t.requestID, "code", ae.Code, "cause", redact(fmt.Sprint(ae.Err), c.cred.bearer()))
	return ae
}

// relayStream translates a committed stream to the caller's dialect.
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
