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
// protocol and streamCut go to formats.go (one reader per protocol for
// translation and passthrough alike), the count_tokens estimate to messages.go.

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
