package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"strconv"
)

// By LAYOUT.md this file's parts belong to files another helper is
// rewriting; they wait here: the usage reader, the stream watcher per
// protocol, the upstream Messages and Responses translators and streamCut go
// to formats.go (one reader per protocol for translation and passthrough
// alike), the count_tokens estimate to messages.go.

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

// usageOf reads a stream event's usage member; absent or null is unreported.
func usageOf(protocol string, raw json.RawMessage) (usage, error) {
	if rawIsNull(raw) {
		return usage{}, nil
	}
	u := new(passthroughUsage) // after the null test: it escapes, an allocation per event
	if err := json.Unmarshal(raw, u); err != nil {
		return usage{}, err
	}
	return u.count(protocol), nil
}

// count is the usage in Brama's terms (nil: unreported); Anthropic's cached
// input counts, as OpenAI's does.
func (u *passthroughUsage) count(protocol string) usage {
	switch {
	case u == nil:
		return usage{}
	case protocol == protoOpenAIChat:
		return usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, Reported: true}
	}
	return usage{InputTokens: u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens, OutputTokens: u.OutputTokens, Reported: true}
}

// addDelta folds a message_delta's usage d into u: its output count is the
// whole, and newer streams repeat the cumulative input count.
func (u *usage) addDelta(d usage) {
	if d.InputTokens > 0 {
		u.InputTokens = d.InputTokens
	}
	if d.Reported {
		u.OutputTokens, u.Reported = d.OutputTokens, true
	}
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
	e, ok := splitRaw(data, '{', pw.scratch[0][:])
	if !ok {
		return false, false, malformedEvent(pw.protocol, errEventNotObject)
	}
	typ := cmp.Or(string(rawText(e.value("type"))), event) // a switch on it allocates nothing
	switch pw.protocol {
	case protoOpenAIChat:
		relay, end, err = pw.chatEvent(event, e)
	case protoAnthropic:
		relay, end, err = pw.messagesEvent(typ, e)
	default:
		relay, end, err = pw.responsesEvent(typ, e)
	}
	if _, ok := err.(*apiError); err != nil && !ok {
		err = malformedEvent(pw.protocol, err)
	}
	return relay, end, err
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
		co, ok := splitRaw(choices.src[c.val:c.end], '{', pw.scratch[1][:])
		if !ok {
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
		return false, false, errors.New("event without a type")
	case "error":
		f, _ := errorObject(e.value("error"))
		return false, false, inBandError(cmp.Or(f.typ, f.code))
	case "message_start":
		if m, ok := splitRaw(e.value("message"), '{', pw.scratch[1][:]); ok {
			pw.usage, err = usageOf(pw.protocol, m.value("usage"))
			return err == nil, false, err
		}
	case "message_delta":
		u, err := usageOf(pw.protocol, e.value("usage"))
		pw.usage.addDelta(u)
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
		return false, false, errors.New("event without a type")
	case "error":
		code, _ := jsonScalar(e.value("code"))
		if f, ok := errorObject(e.value("error")); ok && code == "" {
			code = cmp.Or(f.code, f.typ)
		}
		return false, false, inBandError(code)
	case "response.failed":
		var f errorFields
		if r, ok := splitRaw(e.value("response"), '{', pw.scratch[1][:]); ok {
			f, _ = errorObject(r.value("error"))
		}
		return false, false, inBandError(f.code)
	case "response.output_item.done":
		if pw.items == nil {
			break
		}
		var i int
		if json.Unmarshal(e.value("output_index"), &i) != nil || rawShape(e.value("item")) != '{' {
			return false, false, errors.New("output item without index or item")
		}
		pw.items[i] = bytes.Clone(e.value("item")) // the reader reuses its buffer
	case "response.completed", "response.incomplete":
		r, ok := splitRaw(e.value("response"), '{', pw.scratch[1][:])
		if !ok {
			return false, false, errors.New(typ + " without response")
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

// countTokensAnswer is the body of every count_tokens answer.
type countTokensAnswer struct {
	InputTokens *int `json:"input_tokens"`
}

// estimateInputTokens is SPEC §15's local estimate: the bytes of the system
// text, every text part, tool_use input and tool_result content, and the
// tools as sent, ÷ 4 rounded up.
func estimateInputTokens(o rawObject) int {
	type block struct {
		Type, Text     string
		Input, Content json.RawMessage
	}
	var textOf func(raw json.RawMessage) int
	textOf = func(raw json.RawMessage) int { // a string, or blocks
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return len(s)
		}
		var blocks []block
		json.Unmarshal(raw, &blocks)
		n := 0
		for _, b := range blocks {
			switch b.Type {
			case "text":
				n += len(b.Text)
			case "tool_use":
				n += len(b.Input)
			case "tool_result":
				n += textOf(b.Content)
			}
		}
		return n
	}
	n := textOf(o.value("system"))
	var msgs []block // only their content counts
	json.Unmarshal(o.value("messages"), &msgs)
	for _, m := range msgs {
		n += textOf(m.Content)
	}
	if t := o.value("tools"); !rawIsNull(t) {
		n += len(t)
	}
	return (n + 3) / 4
}

// decodeEvent decodes a translated stream's event into e; data without a type
// takes the event line's (as passthrough reads it), and no type at all is malformed.
func decodeEvent(protocol string, ev sseEvent, e any, typ *string) error {
	if err := json.Unmarshal([]byte(ev.Data), e); err != nil {
		return malformedEvent(protocol, err)
	}
	if *typ = cmp.Or(*typ, ev.Event); *typ == "" {
		return eventWithout(protocol, "event", "a type")
	}
	return nil
}

// eventWithout is the failure of a typ event lacking what it must carry.
func eventWithout(protocol, typ, what string) *apiError {
	return malformedEvent(protocol, errors.New(typ+" without "+what))
}

// messagesUpstreamStream translates Messages events; message_stop is terminal.
type messagesUpstreamStream struct {
	finish   string
	usage    usage
	blocks   map[int]int  // content block index → neutral tool index, tool_use blocks only
	argsSeen map[int]bool // neutral tool index → some non-empty arguments were emitted
}

func newMessagesUpstreamStream() streamTranslator {
	return &messagesUpstreamStream{blocks: map[int]int{}, argsSeen: map[int]bool{}}
}

func (a *messagesUpstreamStream) handle(ev sseEvent, emit func(streamEvent) error) (bool, error) {
	var e messagesEvent
	if err := decodeEvent(protoAnthropic, ev, &e, &e.Type); err != nil {
		return false, err
	}
	if ev.Event == "error" || e.Type == "error" {
		f, _ := errorObject(e.Error)
		return false, inBandError(f.typ)
	}
	index := valueOr(e.Index, 0)
	ni, isTool := a.blocks[index]
	switch e.Type {
	case "message_start":
		if e.Message == nil {
			return false, eventWithout(protoAnthropic, e.Type, "message")
		}
		if u := e.Message.Usage; u != nil { // emitted now too: a stream cut later still records it (SPEC §7.5)
			a.usage = u.usage()
			return false, emit(streamEvent{Kind: eventUsage, Usage: a.usage})
		}
	case "content_block_start":
		switch b := e.ContentBlock; {
		case b == nil:
			return false, eventWithout(protoAnthropic, e.Type, "content_block")
		case b.Type == "text" && b.Text != nil && *b.Text != "":
			return false, emit(streamEvent{Kind: eventText, Text: *b.Text})
		case b.Type == "tool_use" && (b.Name == "" || isTool):
			return false, eventWithout(protoAnthropic, e.Type, "a fresh index and a name")
		case b.Type == "tool_use":
			a.blocks[index] = len(a.blocks)
			return false, emit(streamEvent{Kind: eventToolCallStart, Index: a.blocks[index], ToolCall: toolCall{ID: b.ID, Name: b.Name}})
		}
	case "content_block_delta":
		switch d := e.Delta; {
		case d == nil:
			return false, eventWithout(protoAnthropic, e.Type, "delta")
		case d.Type == "text_delta" && d.Text != nil && *d.Text != "":
			return false, emit(streamEvent{Kind: eventText, Text: *d.Text})
		case d.Type == "input_json_delta" && !isTool:
			return false, eventWithout(protoAnthropic, e.Type, "a tool_use block")
		case d.Type == "input_json_delta" && d.PartialJSON != nil && *d.PartialJSON != "":
			a.argsSeen[ni] = true
			return false, emit(streamEvent{Kind: eventToolCallArgs, Index: ni, Text: *d.PartialJSON})
		}
	case "content_block_stop":
		if isTool && !a.argsSeen[ni] { // a tool without parameters streams no arguments; callers expect "{}"
			a.argsSeen[ni] = true
			return false, emit(streamEvent{Kind: eventToolCallArgs, Index: ni, Text: "{}"})
		}
	case "message_delta":
		if e.Delta != nil && e.Delta.StopReason != "" {
			a.finish = messagesFinish(e.Delta.StopReason)
		}
		if u := e.Usage; u != nil {
			a.usage.addDelta(u.usage())
		}
	case "message_stop":
		return true, emitTail(emit, answerFinish(a.finish), a.usage)
	} // ping and event types added later carry nothing Brama translates
	return false, nil
}

func (a *messagesUpstreamStream) ended(func(streamEvent) error) (bool, error) { return false, nil }

type responsesStreamItem struct {
	tool     int  // neutral tool index, -1 for a message
	streamed bool // text or argument deltas emitted: done emits the rest
}

// responsesUpstreamStream translates Responses events, items keyed by output_index; response.completed (or .incomplete) is terminal.
type responsesUpstreamStream struct {
	items   map[int]*responsesStreamItem
	tools   int
	refusal bool // a refusal came: the finish is content_filter
}

func newResponsesUpstreamStream() streamTranslator {
	return &responsesUpstreamStream{items: map[int]*responsesStreamItem{}}
}

func (r *responsesUpstreamStream) handle(ev sseEvent, emit func(streamEvent) error) (bool, error) {
	var e responsesEvent
	if err := decodeEvent(protoOpenAIResponses, ev, &e, &e.Type); err != nil {
		return false, err
	}
	idx := valueOr(e.OutputIndex, 0)
	switch e.Type {
	case "error":
		code, _ := jsonScalar(e.Code)
		f, _ := errorObject(e.Error)
		return false, inBandError(cmp.Or(code, f.code, f.typ))
	case "response.failed":
		return false, inBandError(valueOr(valueOr(e.Response, responsesObject{}).Error, responsesError{}).Code)
	case "response.output_item.added", "response.output_item.done":
		if e.Item == nil {
			return false, eventWithout(protoOpenAIResponses, e.Type, "item")
		}
		if e.Type == "response.output_item.added" {
			_, err := r.item(idx, e.Item, emit)
			return false, err
		}
		return false, r.done(idx, e.Item, emit)
	case "response.output_text.delta", "response.refusal.delta", "response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
		it, _ := r.item(idx, &responsesItem{}, emit)
		ev := streamEvent{Kind: eventText}
		r.refusal = r.refusal || e.Type == "response.refusal.delta"
		if e.Type != "response.output_text.delta" && e.Type != "response.refusal.delta" {
			if it.tool < 0 {
				return false, eventWithout(protoOpenAIResponses, e.Type, "a call item")
			}
			ev.Kind, ev.Index = eventToolCallArgs, it.tool
		}
		if e.Delta == nil || *e.Delta == "" {
			return false, nil
		}
		it.streamed, ev.Text = true, *e.Delta
		return false, emit(ev)
	case "response.completed", "response.incomplete":
		if e.Response == nil {
			return false, eventWithout(protoOpenAIResponses, e.Type, "response")
		}
		return true, r.completed(e.Response, emit)
	}
	return false, nil
}

// completed emits the final response's items the stream never showed (a minimal stream, a buffered answer), then the tail.
func (r *responsesUpstreamStream) completed(resp *responsesObject, emit func(streamEvent) error) error {
	for i, it := range resp.Output {
		if _, seen := r.items[i]; !seen && it != nil {
			if err := r.done(i, it, emit); err != nil {
				return err
			}
		}
	}
	finish, u := map[bool]string{false: finishStop, true: finishToolCalls}[r.tools > 0], usage{}
	if r.refusal {
		finish = finishContentFilter
	}
	for f, reason := range responsesIncompletes {
		if valueOr(resp.IncompleteDetails, responsesIncomplete{}).Reason == reason {
			finish = f
		}
	}
	if ru := resp.Usage; ru != nil {
		u = usage{InputTokens: ru.InputTokens, OutputTokens: ru.OutputTokens, Reported: true}
	}
	return emitTail(emit, finish, u)
}

// item is the state of output index i: a tool call once seen as one.
func (r *responsesUpstreamStream) item(i int, item *responsesItem, emit func(streamEvent) error) (*responsesStreamItem, error) {
	it, ok := r.items[i]
	if !ok {
		it = &responsesStreamItem{tool: -1}
		r.items[i] = it
	}
	if tc, isCall := item.call(); isCall && it.tool < 0 {
		if item.Name == "" {
			return nil, eventWithout(protoOpenAIResponses, "a call item", "a name")
		}
		it.tool, r.tools, tc.Arguments = r.tools, r.tools+1, ""
		return it, emit(streamEvent{Kind: eventToolCallStart, Index: it.tool, ToolCall: tc})
	}
	return it, nil
}

// done completes an output item, emitting whatever its deltas did not.
func (r *responsesUpstreamStream) done(i int, item *responsesItem, emit func(streamEvent) error) error {
	it, err := r.item(i, item, emit)
	if err != nil || it.streamed {
		return err
	}
	it.streamed = true
	if tc, ok := item.call(); ok && tc.Arguments != "" {
		return emit(streamEvent{Kind: eventToolCallArgs, Index: it.tool, Text: tc.Arguments})
	}
	var scratch chatRequest // a message item's text, a refusal's too
	parts, _ := scratch.responsesParts(item.Content, "")
	text := textOf(parts)
	for _, p := range rawItems(item.Content) {
		var rp responsesPart
		if json.Unmarshal(p, &rp); rp.Type == "refusal" {
			text, r.refusal = text+rp.Refusal, true
		}
	}
	if item.Type == "message" && text != "" {
		return emit(streamEvent{Kind: eventText, Text: text})
	}
	return nil
}

func (r *responsesUpstreamStream) ended(func(streamEvent) error) (bool, error) { return false, nil }
