package main

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
)

// This file translates the three provider protocols' streams into neutral
// events (SPEC §7.5); sse.go splits the bytes into events.

// streamTranslator turns one protocol's events into neutral events. handle
// returns true once the provider's own terminal signal arrived (and the
// final finish and usage were emitted). ended is called when the body ends
// or fails first: a translator that already saw its terminal signal emits
// its tail and returns nil, every other returns false.
type streamTranslator interface {
	handle(ev sseEvent, emit func(streamEvent) error) (bool, error)
	ended(emit func(streamEvent) error) (bool, error)
}

// readUpstreamStream reads the provider's SSE body and calls emit for each
// neutral event in order (SPEC §7.5). It returns nil only when the
// provider sent its own terminal signal. An end or connection failure
// before that, or an in-band error event, is provider_incomplete; a
// malformed event is provider_failure; emit's own error is returned as is.
func readUpstreamStream(protocol string, body io.Reader, emit func(streamEvent) error) error {
	var t streamTranslator
	switch protocol {
	case protoOpenAIChat:
		t = &chatStream{tools: map[int]int{}}
	case protoAnthropic:
		t = &anthropicStream{blocks: map[int]int{}, argsSeen: map[int]bool{}}
	case protoOpenAIResponses:
		t = &responsesStream{items: map[int]*rsStreamItem{}}
	default:
		return refuse("provider_failure", "unknown provider protocol %q", protocol)
	}
	r := newSSEReader(body)
	for {
		ev, err := r.next()
		if err != nil {
			if done, terr := t.ended(emit); done || terr != nil {
				return terr
			}
			if errors.Is(err, io.EOF) {
				return refuse("provider_incomplete", "the provider stream ended before its terminal signal")
			}
			if ae := classifyTransport(err); ae.Code == "client_cancelled" {
				return ae
			}
			// The request was sent long ago: whatever broke, the provider may
			// have generated and billed (SPEC §8.2).
			return refuse("provider_incomplete", "the provider stream failed before its terminal signal: %s",
				cleanQuoted(err.Error(), "", 300)).because(err)
		}
		done, err := t.handle(ev, emit)
		if err != nil || done {
			return err
		}
	}
}

// assembleStream builds one answer from a whole stream: a buffered caller
// of a provider that only streams (codex, SPEC §6.2).
func assembleStream(protocol string, body io.Reader) (chatAnswer, error) {
	var (
		a    chatAnswer
		text strings.Builder
		args []strings.Builder
	)
	err := readUpstreamStream(protocol, body, func(ev streamEvent) error {
		switch ev.Kind {
		case eventText:
			text.WriteString(ev.Text)
		case eventToolCallStart:
			for len(a.ToolCalls) <= ev.Index {
				a.ToolCalls = append(a.ToolCalls, toolCall{})
				args = append(args, strings.Builder{})
			}
			a.ToolCalls[ev.Index].ID = ev.ToolCall.ID
			a.ToolCalls[ev.Index].Name = ev.ToolCall.Name
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

// upstreamStreamError is the cause of a provider_incomplete raised by an
// in-band error event. Code is the event's error code or type (redacted);
// Class is refusalRate or refusalQuota when that code says so, so the
// dispatcher can still record a block on the subscription (SPEC §6.2).
type upstreamStreamError struct {
	Code  string
	Class string
}

func (e *upstreamStreamError) Error() string { return "provider stream error " + e.Code }

// streamErrorCodes classifies in-band error codes that say "rate" or "quota".
var streamErrorCodes = map[string]string{
	"rate_limit_exceeded": refusalRate,
	"rate_limit_error":    refusalRate,
	"usage_limit_reached": refusalRate,
	"insufficient_quota":  refusalQuota,
	"billing_error":       refusalQuota,
}

// inBandMessage is the message of an in-band error, quoting its code.
const inBandMessage = "the provider stream failed with error %q"

// inBandError is the refusal for a provider's in-band error event: after
// commit the caller cannot know what was billed, so it is
// provider_incomplete whatever the event says (SPEC §6.2, §7.5). The class
// is read from the provider's own code before anything is redacted; the
// dispatcher redacts the presented credential (apiError.redactedFor).
func inBandError(code string) *apiError {
	class := streamErrorCodes[code]
	if quotaCodes[code] {
		class = refusalQuota
	}
	code = cleanQuoted(code, "", 64)
	if code == "" {
		code = "unspecified"
	}
	return refuse("provider_incomplete", inBandMessage, code).
		because(&upstreamStreamError{Code: code, Class: class})
}

// malformedEvent is the refusal for an event that is not the protocol's.
func malformedEvent(protocol string, cause error) *apiError {
	e := refuse("provider_failure", "the provider sent a malformed %s stream event", protocol)
	if cause != nil {
		e = e.because(cause)
	}
	return e
}

// emitTail emits the finish and, when reported, the usage.
func emitTail(emit func(streamEvent) error, finish string, u usage) error {
	if err := emit(streamEvent{Kind: eventFinish, Finish: finish}); err != nil {
		return err
	}
	if u.Reported {
		return emit(streamEvent{Kind: eventUsage, Usage: u})
	}
	return nil
}

// ---- openai-chat ----

// chatStream translates Chat Completions chunks. A chunk with a
// finish_reason is the terminal signal, but the usage chunk follows it, so
// the tail is emitted at [DONE] or at the end of the body.
type chatStream struct {
	finish string      // set once a chunk carried finish_reason
	usage  usage       // the latest usage reported
	tools  map[int]int // provider tool-call index → neutral index
}

func (c *chatStream) handle(ev sseEvent, emit func(streamEvent) error) (bool, error) {
	if ev.Data == "[DONE]" {
		return c.ended(emit)
	}
	var ch struct {
		Choices []struct {
			Index int `json:"index"`
			Delta struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					Index    *int   `json:"index"`
					ID       string `json:"id"`
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *oaUsage        `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal([]byte(ev.Data), &ch); err != nil {
		return false, malformedEvent(protoOpenAIChat, err)
	}
	if ev.Event == "error" || (len(ch.Error) > 0 && string(ch.Error) != "null") {
		e, _ := errorObject(ch.Error)
		if e.code == "" {
			e.code = e.typ
		}
		return false, inBandError(e.code)
	}
	if ch.Usage != nil {
		c.usage = ch.Usage.neutral()
	}
	for _, choice := range ch.Choices {
		if choice.Index != 0 {
			continue // Brama never asks for n > 1
		}
		if t := choice.Delta.Content; t != nil && *t != "" {
			if err := emit(streamEvent{Kind: eventText, Text: *t}); err != nil {
				return false, err
			}
		}
		for i, tc := range choice.Delta.ToolCalls {
			pi := i
			if tc.Index != nil {
				pi = *tc.Index
			}
			ni, ok := c.tools[pi]
			if !ok {
				if tc.Function.Name == "" {
					return false, malformedEvent(protoOpenAIChat, errors.New("tool call without a name"))
				}
				ni = len(c.tools)
				c.tools[pi] = ni
				if err := emit(streamEvent{Kind: eventToolCallStart, Index: ni, ToolCall: toolCall{ID: tc.ID, Name: tc.Function.Name}}); err != nil {
					return false, err
				}
			}
			if tc.Function.Arguments != "" {
				if err := emit(streamEvent{Kind: eventToolCallArgs, Index: ni, Text: tc.Function.Arguments}); err != nil {
					return false, err
				}
			}
		}
		if f := choice.FinishReason; f != nil && *f != "" {
			c.finish = chatFinish(*f)
		}
	}
	return false, nil
}

func (c *chatStream) ended(emit func(streamEvent) error) (bool, error) {
	if c.finish == "" {
		return false, nil
	}
	return true, emitTail(emit, c.finish, c.usage)
}

// ---- anthropic-messages ----

// anthropicStream translates Messages events; message_stop is terminal.
type anthropicStream struct {
	finish   string
	usage    usage
	blocks   map[int]int  // content block index → neutral tool index, tool_use blocks only
	tools    int          // tool calls started
	argsSeen map[int]bool // neutral tool index → some non-empty arguments were emitted
}

func (a *anthropicStream) handle(ev sseEvent, emit func(streamEvent) error) (bool, error) {
	var e struct {
		Type    string `json:"type"`
		Message *struct {
			Usage *anUsage `json:"usage"`
		} `json:"message"`
		Index        int `json:"index"`
		ContentBlock *struct {
			Type string `json:"type"`
			Text string `json:"text"`
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"content_block"`
		Delta *struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			PartialJSON string `json:"partial_json"`
			StopReason  string `json:"stop_reason"`
		} `json:"delta"`
		Usage *struct {
			InputTokens              *int `json:"input_tokens"`
			OutputTokens             *int `json:"output_tokens"`
			CacheCreationInputTokens int  `json:"cache_creation_input_tokens"`
			CacheReadInputTokens     int  `json:"cache_read_input_tokens"`
		} `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
		return false, malformedEvent(protoAnthropic, err)
	}
	if ev.Event == "error" || e.Type == "error" {
		f, _ := errorObject(e.Error)
		return false, inBandError(f.typ)
	}
	switch e.Type {
	case "message_start":
		if e.Message == nil {
			return false, malformedEvent(protoAnthropic, errors.New("message_start without message"))
		}
		if u := e.Message.Usage; u != nil {
			a.usage = usage{InputTokens: u.input(), OutputTokens: u.OutputTokens, Reported: true}
		}
	case "content_block_start":
		b := e.ContentBlock
		if b == nil {
			return false, malformedEvent(protoAnthropic, errors.New("content_block_start without content_block"))
		}
		switch b.Type {
		case "text":
			if b.Text != "" {
				return false, emit(streamEvent{Kind: eventText, Text: b.Text})
			}
		case "tool_use":
			if b.Name == "" {
				return false, malformedEvent(protoAnthropic, errors.New("tool_use without a name"))
			}
			if _, dup := a.blocks[e.Index]; dup {
				return false, malformedEvent(protoAnthropic, errors.New("content block index started twice"))
			}
			ni := a.tools
			a.tools++
			a.blocks[e.Index] = ni
			return false, emit(streamEvent{Kind: eventToolCallStart, Index: ni, ToolCall: toolCall{ID: b.ID, Name: b.Name}})
		}
	case "content_block_delta":
		d := e.Delta
		if d == nil {
			return false, malformedEvent(protoAnthropic, errors.New("content_block_delta without delta"))
		}
		switch d.Type {
		case "text_delta":
			if d.Text != "" {
				return false, emit(streamEvent{Kind: eventText, Text: d.Text})
			}
		case "input_json_delta":
			ni, ok := a.blocks[e.Index]
			if !ok {
				return false, malformedEvent(protoAnthropic, errors.New("input_json_delta outside a tool_use block"))
			}
			if d.PartialJSON != "" {
				a.argsSeen[ni] = true
				return false, emit(streamEvent{Kind: eventToolCallArgs, Index: ni, Text: d.PartialJSON})
			}
		}
	case "content_block_stop":
		// A tool without parameters streams no arguments; callers expect "{}".
		if ni, ok := a.blocks[e.Index]; ok && !a.argsSeen[ni] {
			a.argsSeen[ni] = true
			return false, emit(streamEvent{Kind: eventToolCallArgs, Index: ni, Text: "{}"})
		}
	case "message_delta":
		if e.Delta != nil && e.Delta.StopReason != "" {
			a.finish = anthropicFinish(e.Delta.StopReason)
		}
		if u := e.Usage; u != nil {
			a.usage.Reported = true
			// Newer message_delta events repeat the cumulative input counts.
			if u.InputTokens != nil && *u.InputTokens > 0 {
				a.usage.InputTokens = *u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
			}
			if u.OutputTokens != nil {
				a.usage.OutputTokens = *u.OutputTokens
			}
		}
	case "message_stop":
		if a.finish == "" {
			a.finish = finishStop
		}
		return true, emitTail(emit, a.finish, a.usage)
	case "":
		return false, malformedEvent(protoAnthropic, errors.New("event without a type"))
	}
	// ping and event types added later carry nothing Brama translates.
	return false, nil
}

func (a *anthropicStream) ended(func(streamEvent) error) (bool, error) { return false, nil }

// ---- openai-responses ----

// rsStreamItem is what the stream showed of one output item so far.
type rsStreamItem struct {
	tool     int  // neutral tool index, -1 for a message
	started  bool // tool_call_start emitted
	streamed bool // text or argument deltas emitted
}

// responsesStream translates Responses events; response.completed is
// terminal (and response.incomplete, the same answer cut by a limit).
// Items are keyed by output_index so a buffered caller gets them in that
// order; an item whose deltas never came is emitted whole at its done.
type responsesStream struct {
	items map[int]*rsStreamItem
	tools int
}

func (r *responsesStream) handle(ev sseEvent, emit func(streamEvent) error) (bool, error) {
	var e struct {
		Type        string          `json:"type"`
		OutputIndex int             `json:"output_index"`
		Delta       string          `json:"delta"`
		Item        *rsOutputItem   `json:"item"`
		Response    *rsResponse     `json:"response"`
		Code        json.RawMessage `json:"code"`
		Error       json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
		return false, malformedEvent(protoOpenAIResponses, err)
	}
	switch e.Type {
	case "":
		return false, malformedEvent(protoOpenAIResponses, errors.New("event without a type"))
	case "error":
		code, _ := jsonScalar(e.Code)
		if f, ok := errorObject(e.Error); ok && code == "" {
			code = f.code
			if code == "" {
				code = f.typ
			}
		}
		return false, inBandError(code)
	case "response.failed":
		var f struct {
			Response struct {
				Error json.RawMessage `json:"error"`
			} `json:"response"`
		}
		json.Unmarshal([]byte(ev.Data), &f) // already parsed once as JSON
		o, _ := errorObject(f.Response.Error)
		return false, inBandError(o.code)
	case "response.output_item.added":
		if e.Item == nil {
			return false, malformedEvent(protoOpenAIResponses, errors.New("output item event without item"))
		}
		return false, r.start(e.OutputIndex, *e.Item, emit)
	case "response.output_text.delta":
		it := r.item(e.OutputIndex)
		if e.Delta != "" {
			it.streamed = true
			return false, emit(streamEvent{Kind: eventText, Text: e.Delta})
		}
	case "response.function_call_arguments.delta":
		it, ok := r.items[e.OutputIndex]
		if !ok || it.tool < 0 {
			return false, malformedEvent(protoOpenAIResponses, errors.New("arguments outside a function_call item"))
		}
		if e.Delta != "" {
			it.streamed = true
			return false, emit(streamEvent{Kind: eventToolCallArgs, Index: it.tool, Text: e.Delta})
		}
	case "response.output_item.done":
		if e.Item == nil {
			return false, malformedEvent(protoOpenAIResponses, errors.New("output item event without item"))
		}
		return false, r.done(e.OutputIndex, *e.Item, emit)
	case "response.completed", "response.incomplete":
		if e.Response == nil {
			return false, malformedEvent(protoOpenAIResponses, errors.New(e.Type+" without response"))
		}
		// Items the stream never showed (a minimal stream) come from the
		// final response, in output order.
		for i, it := range e.Response.Output {
			if _, seen := r.items[i]; !seen {
				if err := r.done(i, it, emit); err != nil {
					return false, err
				}
			}
		}
		return true, emitTail(emit, e.Response.finish(r.tools > 0), e.Response.usage())
	}
	return false, nil
}

// item is the stream state of output index i, a message until shown otherwise.
func (r *responsesStream) item(i int) *rsStreamItem {
	it, ok := r.items[i]
	if !ok {
		it = &rsStreamItem{tool: -1}
		r.items[i] = it
	}
	return it
}

// start records an output item; a function_call starts a neutral tool call.
func (r *responsesStream) start(i int, item rsOutputItem, emit func(streamEvent) error) error {
	it := r.item(i)
	if item.Type != "function_call" || it.started {
		return nil
	}
	if item.Name == "" {
		return malformedEvent(protoOpenAIResponses, errors.New("function_call without a name"))
	}
	it.tool, it.started = r.tools, true
	r.tools++
	return emit(streamEvent{Kind: eventToolCallStart, Index: it.tool, ToolCall: toolCall{ID: item.CallID, Name: item.Name}})
}

// done completes an output item, emitting whatever its deltas did not.
func (r *responsesStream) done(i int, item rsOutputItem, emit func(streamEvent) error) error {
	if err := r.start(i, item, emit); err != nil {
		return err
	}
	it := r.items[i]
	if it.streamed {
		return nil
	}
	it.streamed = true
	switch item.Type {
	case "function_call":
		return emit(streamEvent{Kind: eventToolCallArgs, Index: it.tool, Text: argumentsText(item.Arguments)})
	case "message":
		if t := item.text(); t != "" {
			return emit(streamEvent{Kind: eventText, Text: t})
		}
	}
	return nil
}

func (r *responsesStream) ended(func(streamEvent) error) (bool, error) { return false, nil }
