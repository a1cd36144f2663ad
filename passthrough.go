package main

import (
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
	"strings"
	"sync"
	"time"
)

// Native first (SPEC §7.6): a same-format call sends the caller's body as
// received but for the few top-level members §6.2 and §6.4 name, edited by
// their byte spans, never re-encoded; its answer is relayed as received
// (relay.go), read by the stream reader only for usage (§13), the terminal
// signal and the in-band error (§7.5).

// jsonMember is one member of a rawObject: key (rawText), sep where its segment starts (just past the previous
// value or the '{': it holds the comma), val:end its value.
type jsonMember struct {
	key           []byte
	sep, val, end int
}

// rawObject is one valid JSON object (an array: members without keys).
type rawObject struct {
	src     []byte
	members []jsonMember
}

// parseRawObject splits a caller's body (too deep a body was refused before
// any handler: state.go's depth scan).
func parseRawObject(src []byte) (rawObject, error) {
	if !json.Valid(src) {
		return rawObject{}, decodeCallerJSON(src, new(any), "")
	}
	o, ok := splitRaw(src, '{', make([]jsonMember, 0, 8))
	if !ok {
		return o, refuse("invalid_request", "the request body must be a JSON object")
	}
	return o, nil
}

// splitRaw splits the valid JSON object or array (open '{' or '[') at the start of src into members kept in
// scratch's storage: a stream's watch splits one event after another without allocating.
func splitRaw(src []byte, open byte, scratch []jsonMember) (rawObject, bool) {
	i := skipJSONSpace(src, 0)
	if i >= len(src) || src[i] != open {
		return rawObject{}, false
	}
	o := rawObject{src: src, members: scratch[:0]}
	for i++; ; {
		m := jsonMember{sep: i}
		if i = skipJSONSpace(src, i); src[i] == '}' || src[i] == ']' {
			return o, true
		}
		if src[i] == ',' {
			i = skipJSONSpace(src, i+1)
		}
		m.val = i
		if open == '{' {
			k := skipJSONString(src, i)
			m.key, m.val = rawText(src[i:k]), skipJSONSpace(src, skipJSONSpace(src, k)+1) // past ':'
		}
		m.end = skipJSONValue(src, m.val)
		o.members = append(o.members, m)
		i = m.end
	}
}

// value is the raw value of the last member named key (encoding/json's rule
// for a repeated key), nil when absent.
func (o rawObject) value(key string) json.RawMessage {
	var v json.RawMessage
	for _, m := range o.members {
		if string(m.key) == key {
			v = o.src[m.val:m.end]
		}
	}
	return v
}

// memberEdit replaces every member named key with value, or adds it at the
// end when absent; a nil value removes the member.
type memberEdit struct {
	key   string
	value []byte
}

// edit is the object with edits applied and every other byte kept.
func (o rawObject) edit(edits ...memberEdit) []byte {
	if len(edits) == 0 {
		return o.src
	}
	out := bytes.NewBuffer(make([]byte, 0, len(o.src)+64))
	o.writeEdited(out, edits...)
	return out.Bytes()
}

// writeEdited writes edit's bytes piece by piece: a digest of them holds no
// copy of the body (the replay guard's, SPEC §17).
func (o rawObject) writeEdited(w io.Writer, edits ...memberEdit) {
	open := skipJSONSpace(o.src, 0) + 1
	w.Write(o.src[:open])
	tail, first := open, true
	for _, m := range o.members {
		seg := o.src[m.sep:m.end]
		tail = m.end
		k := slices.IndexFunc(edits, func(e memberEdit) bool { return string(m.key) == e.key })
		if k >= 0 && edits[k].value == nil {
			continue
		}
		if j := skipJSONSpace(seg, 0); first && j < len(seg) && seg[j] == ',' {
			seg = seg[j+1:] // the first member written carries no separator
		}
		if first = false; k >= 0 {
			w.Write(seg[:len(seg)-(m.end-m.val)])
			seg = edits[k].value
		}
		w.Write(seg)
	}
	for k, e := range edits {
		if e.value == nil || o.value(e.key) != nil || slices.ContainsFunc(edits[:k], func(p memberEdit) bool { return p.key == e.key }) {
			continue
		}
		if !first {
			w.Write([]byte{','})
		}
		first = false
		w.Write(append(append(strconv.AppendQuote(nil, e.key), ':'), e.value...)) // Brama's own keys are plain ASCII
	}
	w.Write(o.src[tail:])
}

// rawText is a JSON string's text, the source's bytes when it has no escapes
// (string(t) == "…" allocates nothing); nil for anything but a string.
func rawText(raw []byte) []byte {
	if len(raw) < 2 || raw[0] != '"' {
		return nil
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	var s string
	json.Unmarshal(raw, &s)
	return []byte(s)
}

func skipJSONSpace(b []byte, i int) int { return len(b) - len(bytes.TrimLeft(b[i:], " \t\n\r")) }

// skipJSONString returns the index just past the string that opens at i.
func skipJSONString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		if b[i] == '\\' {
			i++
		} else if b[i] == '"' {
			return i + 1
		}
	}
	return len(b)
}

// skipJSONValue returns the index just past the valid value at i. It counts
// brackets without recursion, so no depth can exhaust a stack.
func skipJSONValue(b []byte, i int) int {
	for depth := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			i = skipJSONString(b, i) - 1 // at the closing quote
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
		if depth < 0 {
			return i // a scalar's end
		} else if depth == 0 && (b[i] == '"' || b[i] == '}' || b[i] == ']') {
			return i + 1
		}
	}
	return len(b)
}

// callerRequest is a caller's chat request: the raw body, the head Brama
// acts on, the neutral request once a call across formats needs it.
type callerRequest struct {
	dialect     string
	body        rawObject
	caller      *http.Request // its headers and query
	head        chatRequest   // Model, Stream, StreamUsage, and MaxTokens, the output limit a call sends (SPEC §6.4)
	callerLimit bool          // the caller named an output limit
	neutral     *chatRequest  // the whole body parsed for translation; nil until a call needs it
}

// outputLimitNames are each dialect's names for the output limit.
var outputLimitNames = map[string][]string{
	dialectChat:      {"max_completion_tokens", "max_tokens"},
	dialectMessages:  {"max_tokens"},
	dialectResponses: {"max_output_tokens"},
}

// readCallerRequest reads the head of a caller's body: a member Brama does
// not know is never a refusal on the passthrough path.
func readCallerRequest(dialect string, r *http.Request, body []byte) (*callerRequest, error) {
	o, err := parseRawObject(body)
	if err != nil {
		return nil, err
	}
	cr := &callerRequest{dialect: dialect, body: o, caller: r}
	if json.Unmarshal(o.value("model"), &cr.head.Model) != nil || cr.head.Model == "" {
		return nil, refuse("invalid_request", "model is required and must be a non-empty string")
	}
	if v := o.value("stream"); !rawIsNull(v) && json.Unmarshal(v, &cr.head.Stream) != nil {
		return nil, refuse("invalid_request", "stream must be a boolean")
	}
	for _, name := range outputLimitNames[dialect] {
		if v := o.value(name); !rawIsNull(v) {
			var n int
			if json.Unmarshal(v, &n) != nil || n < 1 {
				return nil, refuse("invalid_request", "%s must be an integer of at least 1", name)
			}
			cr.head.MaxTokens = cmp.Or(cr.head.MaxTokens, n) // the first name present wins
		}
	}
	cr.callerLimit = cr.head.MaxTokens > 0
	so, _ := splitRaw(o.value("stream_options"), '{', nil)
	cr.head.StreamUsage = dialect == dialectChat && string(so.value("include_usage")) == "true"
	return cr, nil
}

func (cr *callerRequest) translates(p providerInfo) bool {
	return formatOf(cr.dialect).protocol != p.protocol
}

// translated is the neutral request one call across formats sends.
func (cr *callerRequest) translated() chatRequest {
	req := *cr.neutral
	req.Model, req.Stream, req.MaxTokens, req.StreamUsage = cr.head.Model, cr.head.Stream, cr.head.MaxTokens, cr.head.StreamUsage
	return req
}

// buildChatRequest is a chat call's request: translated, or the caller's body (SPEC §7.6) with the output
// limit (§6.4) and the provider's rules (§6.2) edited, all else kept.
func buildChatRequest(ctx context.Context, c call, cr *callerRequest) (*http.Request, error) {
	p := c.res.Provider
	if cr.translates(p) {
		return buildUpstreamRequest(ctx, c, cr.translated())
	}
	var edits []memberEdit
	if cr.head.MaxTokens > 0 && !cr.callerLimit && !p.codex {
		names := outputLimitNames[formatOf(p.protocol).dialect]
		name := names[len(names)-1]
		if p.id == "openai" { // its reasoning models refuse max_tokens
			name = names[0]
		}
		edits = append(edits, memberEdit{name, strconv.AppendInt(nil, int64(cr.head.MaxTokens), 10)})
	}
	if cr.addsUsage(p) {
		opts := []byte(`{"include_usage":true}`)
		if so, ok := splitRaw(cr.body.value("stream_options"), '{', nil); ok {
			opts = so.edit(memberEdit{"include_usage", []byte("true")})
		}
		edits = append(edits, memberEdit{"stream_options", opts})
	}
	if p.codex { // SPEC §6.2: always streamed, never stored, never an output limit
		ins := codexInstructions(cr.body.value("instructions"), cr.body.value("input"))
		edits = append(edits, memberEdit{"stream", []byte("true")}, memberEdit{"store", []byte("false")},
			memberEdit{"max_output_tokens", nil}, memberEdit{"instructions", ins})
	}
	return cr.passthrough(ctx, c, formatOf(p.protocol).path, cr.head.Stream || p.codex, edits...)
}

// passthrough is a same-format request to path, count_tokens too: the
// route's model, claude-code's system (SPEC §6.2), edits.
func (cr *callerRequest) passthrough(ctx context.Context, c call, path string, stream bool, edits ...memberEdit) (*http.Request, error) {
	base := []memberEdit{{"model", jsonText(c.res.Model)}}
	if c.res.Provider.id == "claude-code" && c.cred.AccessToken != "" {
		sys, err := claudeCodeSystem(cr.body.value("system"))
		if err != nil {
			return nil, err
		} else if sys != nil { // nil: the identity already leads
			base = append(base, memberEdit{"system", sys})
		}
	}
	if c.res.Provider.protocol == protoAnthropic && cr.caller.URL.RawQuery != "" {
		path += "?" + cr.caller.URL.RawQuery // Anthropic's clients send ?beta=true; the API takes it (README)
	}
	return newProviderRequest(ctx, c, cr.caller.Header, path, cr.body.edit(append(base, edits...)...), stream)
}

// newProviderRequest is a call of c sending body as is, with its provider's headers and the extra ones.
func newProviderRequest(ctx context.Context, c call, extra http.Header, path string, body []byte, stream bool) (*http.Request, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, refuse("internal_error", "internal error").because(err)
	}
	setProviderHeaders(hr.Header, c.res.Provider, c.cred, extra, stream)
	return hr, nil
}

// addsUsage reports whether Brama asks a chat stream for usage itself, the
// caller not (SPEC §6.2); that usage chunk is not relayed (§7.6).
func (cr *callerRequest) addsUsage(p providerInfo) bool {
	return p.protocol == protoOpenAIChat && (cr.head.Stream || p.codex) && !cr.head.StreamUsage
}

// call is one planned provider call: where, with what, as which model.
type call struct {
	res     resolution
	baseURL string
	cred    upstreamCredential
}

// estimateInputTokens is SPEC §15's local estimate: the bytes of the system text, every text part, tool_use
// input and tool_result content, and the tools as sent, ÷ 4 rounded up.
func estimateInputTokens(o rawObject) int {
	var textOf func(raw json.RawMessage) int
	textOf = func(raw json.RawMessage) int { // a string, or blocks; a message (no type) counts as its content
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return len(s)
		}
		var blocks []struct {
			Type, Text     string
			Input, Content json.RawMessage
		}
		json.Unmarshal(raw, &blocks)
		n := 0
		for _, b := range blocks {
			switch b.Type {
			case "text":
				n += len(b.Text)
			case "tool_use":
				n += len(b.Input)
			case "tool_result", "":
				n += textOf(b.Content)
			}
		}
		return n
	}
	n := textOf(o.value("system")) + textOf(o.value("messages"))
	if t := o.value("tools"); !rawIsNull(t) {
		n += len(t)
	}
	return (n + 3) / 4
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
	customFormat := slices.ContainsFunc(req.Tools, func(t tool) bool { return t.Type == toolCustom && t.Format != nil })
	add(anthropic && customFormat, "format")
	add(p.protocol == protoOpenAIResponses && len(req.Stop) > 0, req.StopName)
	for _, m := range req.Messages {
		for _, pt := range m.Parts {
			for _, q := range append([]part{pt}, pt.Media...) {
				add(anthropic && q.Detail != "", "detail")
				add(p.protocol == protoOpenAIChat && q.Type != pt.Type, q.Type) // a tool message holds only text
			}
		}
	}
	codex := p.codex // it never gets an output limit, and its backend refuses these (SPEC §6.2)
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

// rawIsNull reports an absent or null value (raw is valid JSON: only null starts with n).
func rawIsNull(raw json.RawMessage) bool { s := rawShape(raw); return s == 0 || s == 'n' }

// rawShape is the first byte of a JSON value ('"', '[', '{', …); 0 when absent.
func rawShape(raw json.RawMessage) byte {
	if raw = bytes.TrimSpace(raw); len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// rawMember is raw's member name (any case, as encoding/json matches), nil when none.
func rawMember(raw json.RawMessage, name string) json.RawMessage {
	o, _ := splitRaw(raw, '{', nil)
	i := slices.IndexFunc(o.members, func(m jsonMember) bool { return strings.EqualFold(string(m.key), name) })
	if i < 0 {
		return nil
	}
	return o.src[o.members[i].val:o.members[i].end]
}

// buildUpstreamRequest is req's call c in its provider's protocol and wire details (SPEC §6.2).
func buildUpstreamRequest(ctx context.Context, c call, req chatRequest) (*http.Request, error) {
	p, model := c.res.Provider, c.res.Model
	stream, f := req.Stream || p.codex, formatOf(p.protocol) // f is never nil: TestEveryProviderHasAWireFormat
	oauth := p.id == "claude-code" && c.cred.AccessToken != ""
	body, err := f.encode(req, model, upstreamOptions{stream: stream, oauth: oauth, codex: p.codex, openai: p.id == "openai"})
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, refuse("invalid_request", "the request cannot be encoded for provider %q", p.id).because(err)
	}
	options := http.Header{} // the format's own options a translation needs
	strict := slices.ContainsFunc(req.Tools, func(t tool) bool { return t.Strict != nil })
	// SPEC §7.6: the structured-outputs beta, for a JSON Schema output format or a tool's strict, true or false.
	if p.protocol == protoAnthropic && (req.Output != nil || strict) {
		options.Add("Anthropic-Beta", structuredOutputsBeta)
	}
	if p.protocol == protoAnthropic && req.adaptiveEffort(model) {
		options.Add("Anthropic-Beta", effortBeta)
	}
	return newProviderRequest(ctx, c, options, f.path, b, stream)
}

// keepAliveEvery is how long a stream may be silent before Brama writes an
// SSE comment (SPEC §7.5). It writes; it never cuts.
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
	s := newCallerStream(dialect, req, w, func() { rc.Flush() }, model)
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

// newCallerStream writes dialect to w, flushing every frame (flush may be nil), reporting model (SPEC §7.6).
func newCallerStream(dialect string, req chatRequest, w io.Writer, flush func(), model string) *callerStream {
	return &callerStream{w: w, flush: flush, frames: formatOf(dialect).frames, req: req, model: model}
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
