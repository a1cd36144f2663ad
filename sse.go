package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strings"
)

// The provider side of a stream (SPEC §7.5): the SSE reader, and the one reader per protocol that
// translation and passthrough share; the failures they name, and usage.

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

// newSSEReader reads blocks from r, lines ending at a byte of ends: translation's "\r\n" (WHATWG),
// passthrough's "\n" (README: a bare "\r" is no line end, the caller reads what was sent).
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

// streamReader is the one reader of a provider stream per protocol (SPEC §7.5): the terminal signal,
// the in-band error, usage and malformed events for every path, and, when translating, the text and
// tool calls as neutral events. Passthrough relays the bytes and runs it for that bookkeeping only.
type streamReader struct {
	protocol  string
	out       *callerStream // translation's writer (text and tool calls); nil: passthrough skips decoding them
	dropUsage bool          // chat passthrough: Brama asked for usage itself, so the usage chunk is not relayed
	finished  bool          // the terminal signal came (chat: every choice's finish_reason)
	finish    string
	usage     usage
	refusal   bool // a refusal came: the finish is content_filter
	// translation: the provider's calls (responses: its items) by the provider's index for them (chat's tool
	// index, messages' content block index, responses' output_index), and the tool calls started
	calls  map[int]*upstreamCall
	ncalls int
	// chat: the choice indexes seen and finished (n ≤ 128), data: [DONE], the calls after the first, held to the end
	choices [2][2]uint64
	sawDone bool
	held    []toolCall
	// a buffered codex caller (non-nil raw): output_item.done items by output_index, the final response
	raw     map[int][]byte
	final   json.RawMessage
	scratch [2][16]jsonMember // member storage for an event and one of its members
	elems   [2]jsonMember     // element storage for an event's choices
}

// upstreamCall is one of the provider's calls (or a responses message item) as translation follows it.
type upstreamCall struct {
	tool     int    // the neutral tool index; -1: a responses message item
	id       string // chat: the call's id, telling a new call at a reused index
	streamed bool   // text or arguments emitted: the end emits none
}

func newStreamReader(protocol string, out *callerStream) *streamReader {
	return &streamReader{protocol: protocol, out: out, calls: map[int]*upstreamCall{}}
}

// run reads body's events to the terminal signal (SPEC §7.5), lines ending as newSSEReader says, and relays
// them as received to relay when set; nil only after the terminal signal: a cut or in-band error is
// provider_incomplete, a malformed event provider_failure. A chat stream ended without [DONE] gets it.
func (r *streamReader) run(body io.Reader, relay func(block []byte, flush bool) error) error {
	ends := "\n"
	if r.out != nil {
		ends = "\r\n"
	}
	rd := newSSEReader(body, ends)
	for {
		raw, event, data, err := rd.next()
		switch {
		case err != nil && !r.finished:
			return streamCut(err)
		case err != nil && r.protocol == protoOpenAIChat && !r.sawDone:
			if err := r.ended(); err != nil || relay == nil {
				return err
			}
			return relay([]byte("data: [DONE]\n\n"), false)
		case err != nil:
			return nil
		}
		keep, end, err := r.read(event, data)
		if !keep {
			raw = nil
		}
		if err == nil && relay != nil { // flush if the next read may wait on the provider
			err = relay(raw, !end && !rd.ready())
		}
		if err != nil || end {
			return err
		}
	}
}

// read takes one event: whether to relay it, whether it ends the stream, or the failure; only
// the members named here are decoded, the rest only checked valid.
func (r *streamReader) read(event string, data []byte) (keep, end bool, err error) {
	if data == nil {
		return true, false, nil // no data line dispatches nothing (WHATWG)
	}
	if r.protocol == protoOpenAIChat && string(data) == "[DONE]" {
		if !r.finished {
			return false, false, streamCut(io.EOF)
		}
		r.sawDone = true
		return true, true, r.ended()
	}
	e, ok := rawObject{}, json.Valid(data)
	if ok {
		e, ok = splitRaw(data, '{', r.scratch[0][:])
	}
	typ := cmp.Or(string(rawText(e.value("type"))), event) // a switch on it allocates nothing
	if event == "error" && r.protocol == protoAnthropic {
		typ = event
	}
	switch {
	case !ok:
		err = eventWithout(r.protocol, "data", "one JSON object")
	case r.protocol == protoOpenAIChat:
		keep, err = r.readChat(event, e)
	case typ == "":
		err = eventWithout(r.protocol, "event", "a type")
	case r.protocol == protoAnthropic:
		keep, end, err = r.readMessages(typ, e)
	default:
		keep, end, err = r.readResponses(typ, e)
	}
	return keep, end, err
}

// decode decodes o's member key into v (absent or null leaves v as it is); a failure is a malformed event.
func (r *streamReader) decode(o rawObject, key string, v any) error {
	if raw := o.value(key); !rawIsNull(raw) && json.Unmarshal(raw, v) != nil {
		return eventWithout(r.protocol, "event", "a valid "+key)
	}
	return nil
}

// ended closes a translated answer at its terminal signal: chat's held calls, then the tail.
func (r *streamReader) ended() error {
	if r.out == nil {
		return nil
	}
	if r.refusal {
		r.finish = finishContentFilter
	}
	if err := r.out.calls(1, r.held); err != nil {
		return err
	}
	return r.out.tail(r.finish, r.usage)
}

// readMessages: message_stop ends; usage comes in message_start (emitted at once: a stream cut
// later still records it) and message_delta, whose output count is the whole. r.finish is the stop_reason.
func (r *streamReader) readMessages(typ string, e rawObject) (keep, end bool, err error) {
	switch typ {
	case "error":
		f, _ := errorObject(e.value("error"))
		return false, false, inBandError(cmp.Or(f.typ, f.code))
	case "message_start":
		m, ok := splitRaw(e.value("message"), '{', r.scratch[1][:])
		if !ok {
			return false, false, eventWithout(protoAnthropic, typ, "message")
		}
		if r.usage, err = usageOf(r.protocol, m.value("usage")); err == nil && r.out != nil && r.usage.Reported {
			r.out.usage = r.usage // a stream cut later still records it
		}
	case "message_delta":
		var d struct {
			StopReason string `json:"stop_reason"`
		}
		err = r.decode(e, "delta", &d)
		u, uerr := usageOf(r.protocol, e.value("usage"))
		if d.StopReason != "" {
			r.finish = messagesFinish(d.StopReason)
		}
		if u.InputTokens > 0 { // newer streams repeat the cumulative input count
			r.usage.InputTokens = u.InputTokens
		}
		if u.Reported {
			r.usage.OutputTokens, r.usage.Reported = u.OutputTokens, true
		}
		err = cmp.Or(err, uerr)
	case "message_stop":
		r.finished, r.finish = true, cmp.Or(r.finish, finishStop)
		return true, true, r.ended()
	case "content_block_start", "content_block_delta", "content_block_stop":
		if r.out != nil {
			err = r.readBlock(typ, e)
		}
	} // ping and event types added later carry nothing Brama reads
	return err == nil, false, err
}

// readBlock translates a content block's start, delta and stop.
func (r *streamReader) readBlock(typ string, e rawObject) error {
	var ev messagesEvent
	if json.Unmarshal(e.src, &ev) != nil {
		return eventWithout(protoAnthropic, typ, "a valid index, content_block and delta")
	}
	index, b, d := valueOr(ev.Index, 0), ev.ContentBlock, ev.Delta
	c, isTool := r.calls[index]
	switch {
	case typ == "content_block_start" && b == nil:
		return eventWithout(protoAnthropic, typ, "content_block")
	case typ == "content_block_start" && b.Type == "text" && valueOr(b.Text, "") != "":
		return r.out.text(*b.Text)
	case typ == "content_block_start" && b.Type == "tool_use" && (b.Name == "" || isTool):
		return eventWithout(protoAnthropic, typ, "a fresh index and a name")
	case typ == "content_block_start" && b.Type == "tool_use":
		r.calls[index] = &upstreamCall{tool: r.ncalls}
		r.ncalls++
		return r.out.call(r.calls[index].tool, toolCall{ID: b.ID, Name: b.Name})
	case typ == "content_block_delta" && d == nil:
		return eventWithout(protoAnthropic, typ, "delta")
	case typ == "content_block_delta" && d.Type == "text_delta" && valueOr(d.Text, "") != "":
		return r.out.text(*d.Text)
	case typ == "content_block_delta" && d.Type == "input_json_delta" && !isTool:
		return eventWithout(protoAnthropic, typ, "a tool_use block")
	case typ == "content_block_delta" && d.Type == "input_json_delta" && valueOr(d.PartialJSON, "") != "":
		c.streamed = true
		return r.out.args(c.tool, *d.PartialJSON)
	case typ == "content_block_stop" && isTool && !c.streamed: // a tool without parameters streamed none; callers expect "{}"
		c.streamed = true
		return r.out.args(c.tool, "{}")
	}
	return nil
}

// readResponses: response.completed (or .incomplete) ends, with usage; items are keyed by output_index.
func (r *streamReader) readResponses(typ string, e rawObject) (keep, end bool, err error) {
	switch typ {
	case "error":
		code, _ := jsonScalar(e.value("code"))
		f, _ := errorObject(e.value("error"))
		return false, false, inBandError(cmp.Or(code, f.code, f.typ))
	case "response.failed":
		resp, _ := splitRaw(e.value("response"), '{', r.scratch[1][:])
		f, _ := errorObject(resp.value("error"))
		return false, false, inBandError(f.code)
	case "response.output_item.added", "response.output_item.done", "response.output_text.delta", "response.refusal.delta",
		"response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
		if r.out != nil || r.raw != nil && typ == "response.output_item.done" {
			err = r.readItem(typ, e)
		}
	case "response.completed", "response.incomplete":
		resp, ok := splitRaw(e.value("response"), '{', r.scratch[1][:])
		if !ok {
			return false, false, eventWithout(protoOpenAIResponses, typ, "response")
		}
		r.usage, err = usageOf(r.protocol, resp.value("usage"))
		if r.finished = true; r.raw != nil {
			r.final = bytes.Clone(e.value("response"))
		}
		if err == nil && r.out != nil {
			var ro responsesObject
			if err = r.decode(e, "response", &ro); err == nil {
				err = r.completed(&ro)
			}
		}
		return err == nil, true, err
	}
	return err == nil, false, err
}

// readItem reads an output item's start, deltas and end; a buffered codex caller keeps each ended item as sent.
func (r *streamReader) readItem(typ string, e rawObject) error {
	var ev struct {
		OutputIndex int             `json:"output_index"`
		Item        json.RawMessage `json:"item"`
		Delta       string          `json:"delta"`
	}
	var item responsesItem
	isItem := strings.HasPrefix(typ, "response.output_item.")
	err := json.Unmarshal(e.src, &ev)
	if err == nil && isItem && r.out != nil {
		err = json.Unmarshal(ev.Item, &item)
	}
	if err != nil || isItem && rawShape(ev.Item) != '{' {
		return eventWithout(protoOpenAIResponses, typ, "an index and an item")
	}
	if r.raw != nil && typ == "response.output_item.done" {
		r.raw[ev.OutputIndex] = ev.Item // decoding copied it out of the reader's buffer
	}
	if r.out == nil {
		return nil
	}
	it, err := r.item(ev.OutputIndex, &item, typ == "response.output_item.done")
	text := typ == "response.output_text.delta" || typ == "response.refusal.delta"
	r.refusal = r.refusal || typ == "response.refusal.delta"
	switch {
	case err != nil || isItem:
		return err
	case !text && it.tool < 0:
		return eventWithout(protoOpenAIResponses, typ, "a call item")
	case ev.Delta == "":
		return nil
	}
	if it.streamed = true; text {
		return r.out.text(ev.Delta)
	}
	return r.out.args(it.tool, ev.Delta)
}

// completed emits the final response's items the stream never showed (a minimal stream, a buffered answer), then the tail.
func (r *streamReader) completed(resp *responsesObject) error {
	for i, it := range resp.Output {
		if _, seen := r.calls[i]; !seen && it != nil {
			if _, err := r.item(i, it, true); err != nil {
				return err
			}
		}
	}
	finish := map[bool]string{false: finishStop, true: finishToolCalls}[r.ncalls > 0]
	if r.refusal {
		finish = finishContentFilter
	}
	for f, reason := range responsesIncompletes {
		if valueOr(resp.IncompleteDetails, responsesIncomplete{}).Reason == reason {
			finish = f
		}
	}
	return r.out.tail(finish, r.usage)
}

// item is the state of output index i, a tool call once seen as one; when done, it emits whatever the item's deltas did not.
func (r *streamReader) item(i int, item *responsesItem, done bool) (*upstreamCall, error) {
	it, ok := r.calls[i]
	if !ok {
		it = &upstreamCall{tool: -1}
		r.calls[i] = it
	}
	tc, isCall := item.call()
	if isCall && it.tool < 0 {
		if item.Name == "" {
			return nil, eventWithout(protoOpenAIResponses, "a call item", "a name")
		}
		it.tool, r.ncalls = r.ncalls, r.ncalls+1
		if err := r.out.call(it.tool, toolCall{ID: tc.ID, Name: tc.Name, Custom: tc.Custom}); err != nil {
			return nil, err
		}
	}
	if !done || it.streamed {
		return it, nil
	}
	it.streamed = true
	if isCall && tc.Arguments != "" {
		return it, r.out.args(it.tool, tc.Arguments)
	}
	var scratch chatRequest // a message item's text, a refusal's too
	parts, _ := scratch.responsesParts(item.Content, "")
	text := textOf(parts)
	var raw []json.RawMessage
	json.Unmarshal(item.Content, &raw)
	for _, p := range raw {
		var rp responsesPart
		if json.Unmarshal(p, &rp); rp.Type == "refusal" {
			text, r.refusal = text+rp.Refusal, true
		}
	}
	if item.Type == "message" && text != "" {
		return it, r.out.text(text)
	}
	return it, nil
}

// upstreamStreamError is an in-band error's cause: its redacted code, and the refusalRate or refusalQuota class the
// dispatcher records a block for (SPEC §6.2).
type upstreamStreamError struct{ Code, Class string }

func (e *upstreamStreamError) Error() string { return "provider stream error " + e.Code }

// streamErrorCodes classifies in-band error codes that say "rate" or "quota".
var streamErrorCodes = map[string]string{"rate_limit_exceeded": refusalRate, "rate_limit_error": refusalRate,
	"usage_limit_reached": refusalRate, "insufficient_quota": refusalQuota, "billing_error": refusalQuota}

// inBandError is provider_incomplete: the caller cannot know what was billed (SPEC §6.2, §7.5).
func inBandError(code string) *apiError {
	class := streamErrorCodes[code]
	if quotaCodes[code] {
		class = refusalQuota
	}
	se := &upstreamStreamError{Code: cmp.Or(cleanQuoted(code, "", 64), "unspecified"), Class: class}
	return (&apiError{Err: se}).redactedFor("") // writes the message
}

// redactedFor redacts the presented credential from an in-band stream error's code, which its reader
// does not know (SPEC §8.1), and (re)writes its message; other errors are returned as they are.
func (e *apiError) redactedFor(presented string) *apiError {
	var se *upstreamStreamError
	if errors.As(e.Err, &se) {
		se.Code = redact(se.Code, presented)
		*e = *refuse("provider_incomplete", "the provider stream failed with error %q", se.Code).because(e.Err)
	}
	return e
}

// malformedAnswer refuses a 2xx body or stream event that is not the protocol's answer, never quoted.
func malformedAnswer(protocol string, cause error) *apiError {
	return refuse("provider_failure", "the provider answered with a malformed %s body", protocol).because(cause)
}

// eventWithout is the malformed event of typ lacking what it must carry.
func eventWithout(protocol, typ, what string) *apiError {
	return malformedAnswer(protocol, errors.New(typ+" without "+what))
}

// streamCut is the failure of a stream cut before its terminal signal: the provider may have
// generated and billed (SPEC §7.5, §8.2).
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

// passthroughUsage holds the usage members of all three formats (flat: the wire types embedded cost an allocation per event).
type passthroughUsage struct {
	PromptTokens             int `json:"prompt_tokens"`
	CompletionTokens         int `json:"completion_tokens"`
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// usageOf reads a usage member in Brama's terms, absent or null unreported; Anthropic's cached input counts, as OpenAI's does.
func usageOf(protocol string, raw json.RawMessage) (usage, error) {
	if rawIsNull(raw) {
		return usage{}, nil
	}
	u := new(passthroughUsage) // after the null test: it escapes, an allocation per event
	if err := json.Unmarshal(raw, u); err != nil {
		return usage{}, malformedAnswer(protocol, err)
	}
	if protocol == protoOpenAIChat {
		return usage{u.PromptTokens, u.CompletionTokens, true}, nil
	}
	return usage{u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens, u.OutputTokens, true}, nil
}
