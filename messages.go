package main

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// Anthropic Messages (caller POST /v1/messages, provider {base}/v1/messages); each wire shape serves both directions.
type (
	messagesRequestBody struct {
		callerHead
		MaxTokens     int             `json:"max_tokens,omitempty"`
		System        json.RawMessage `json:"system,omitempty"` // string, or text blocks
		Messages      json.RawMessage `json:"messages"`
		Tools         json.RawMessage `json:"tools,omitempty"`
		ToolChoice    *messagesOption `json:"tool_choice,omitempty"`
		StopSequences []string        `json:"stop_sequences,omitempty"`
		Thinking      *messagesOption `json:"thinking,omitempty"`
		OutputConfig  messagesOption  `json:"output_config,omitzero"`
		OutputFormat  *outputFormat   `json:"output_format,omitempty"` // the beta name, read from callers
	}
	messagesTurn struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	messagesBlock struct { // a content block, and a delta (content_block_delta's, message_delta's)
		Type         string          `json:"type"`
		Text         *string         `json:"text,omitempty"`
		Source       *messagesSource `json:"source,omitempty"`
		Title        string          `json:"title,omitempty"`
		ID           string          `json:"id,omitempty"`
		Name         string          `json:"name,omitempty"`
		Input        json.RawMessage `json:"input,omitempty"`
		ToolUseID    string          `json:"tool_use_id,omitempty"`
		Content      json.RawMessage `json:"content,omitempty"`
		IsError      bool            `json:"is_error,omitempty"`
		PartialJSON  *string         `json:"partial_json,omitempty"`
		StopReason   string          `json:"stop_reason,omitempty"`
		StopSequence json.RawMessage `json:"stop_sequence,omitempty"`
	}
	messagesSource struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type,omitempty"`
		Data      string `json:"data,omitempty"`
		URL       string `json:"url,omitempty"`
	}
	messagesTool struct { // the neutral tool's members, its schema named input_schema
		tool
		InputSchema json.RawMessage `json:"input_schema,omitempty"`
	}
	messagesOption struct { // tool_choice, thinking and output_config share one shape, each its own members
		Type                   string        `json:"type,omitempty"`
		Name                   string        `json:"name,omitempty"`
		DisableParallelToolUse *bool         `json:"disable_parallel_tool_use,omitempty"`
		BudgetTokens           int           `json:"budget_tokens,omitempty"`
		Format                 *outputFormat `json:"format,omitempty"`
		Effort                 string        `json:"effort,omitempty"`
	}
	messagesAnswer struct { // the answer, and message_start's message
		ID           string          `json:"id"`
		Type         string          `json:"type"`
		Role         string          `json:"role"`
		Model        string          `json:"model"`
		Content      []messagesBlock `json:"content"`
		StopReason   *string         `json:"stop_reason"`
		StopSequence *string         `json:"stop_sequence"`
		Usage        *messagesUsage  `json:"usage"`
	}
	messagesUsage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
	messagesEvent struct {
		Type         string          `json:"type"`
		Index        *int            `json:"index,omitempty"`
		Message      *messagesAnswer `json:"message,omitempty"`
		ContentBlock *messagesBlock  `json:"content_block,omitempty"`
		Delta        *messagesBlock  `json:"delta,omitempty"`
		Usage        *messagesUsage  `json:"usage,omitempty"`
		Error        json.RawMessage `json:"error,omitempty"`
	}
)

// The Anthropic-Beta values output_config.effort and a JSON Schema output need (SPEC §7.6).
const (
	effortBeta            = "effort-2025-11-24"
	structuredOutputsBeta = "structured-outputs-2025-11-13"
)

// Tables: tool_choice types as neutral modes; stop reasons as finishes (any other, as end_turn, stop_sequence, pause_turn: a stop) and
// back (else end_turn); effort names as thinking budgets (a budget maps back to the nearest effort at or above it, SPEC §7.6);
// the members carried of each block type (a true is_error is named dropped: OpenAI lacks it); each stream step's event.
var (
	messagesChoices  = map[string]string{"auto": toolChoiceAuto, "none": toolChoiceNone, "any": toolChoiceRequired, "tool": toolChoiceTool}
	messagesFinishes = map[string]string{"max_tokens": finishLength, "tool_use": finishToolCalls,
		"refusal": finishContentFilter, "model_context_window_exceeded": finishLength}
	messagesStopReasons  = map[string]string{finishLength: "max_tokens", finishToolCalls: "tool_use", finishContentFilter: "refusal"}
	effortNames          = []string{"none", "minimal", "low", "medium", "high", "xhigh"}
	effortBudgets        = []int{0, 1024, 2048, 8192, 24576, 32768}
	messagesBlockMembers = map[string]string{"text": "type text", "image": "type source", "document": "type source title",
		"tool_use": "type id name input", "tool_result": "type tool_use_id content is_error"}
	messagesSteps = [...]string{stepBegin: "message_start", stepOpen: "content_block_start", stepDelta: "content_block_delta",
		stepClose: "content_block_stop", stepEnd: "message_delta", stepFail: "error"}
	notToolID = regexp.MustCompile(`[^a-zA-Z0-9_-]`) // what messagesToolID replaces
	// adaptiveModels: a Claude 4.6 or later model (claude-opus-4-7, claude-opus-5, claude-haiku-5-1) takes thinking as adaptive with
	// output_config.effort and refuses a budget (Claude Code 2.1.332 decides so too); an earlier, dated (claude-opus-4-20250514) or unknown model takes a budget.
	adaptiveModels = regexp.MustCompile(`^claude-(?:opus|sonnet|haiku)-(?:0?[5-9]|[1-9]\d|0?4-(?:0?[6-9]|[1-9]\d))(?:-|$)`)
)

// parseMessages reads a caller's Messages body; every step runs and the first refusal wins.
func parseMessages(cr *callerRequest) (chatRequest, error) {
	var b messagesRequestBody
	req, err := newCallerRequest(cr, &b, &b.callerHead, "model max_tokens system messages tools tool_choice temperature top_p stop_sequences thinking output_config output_format stream")
	if !rawIsNull(b.System) {
		err = cmp.Or(err, req.addSystemOf(b.System, "system", "text"))
	}
	err = cmp.Or(err, readList(b.Messages, "messages", func(m messagesTurn, raw json.RawMessage, what string) error {
		switch req.dropUnknown(raw, "role content"); m.Role {
		case "system":
			return req.addSystemOf(m.Content, what+".content", "text")
		case "user", "assistant":
			parts, err := req.messagesParts(m.Role, m.Content, what+".content")
			req.Messages = append(req.Messages, message{Role: m.Role, Parts: parts})
			return err
		}
		return refuse("invalid_request", "%s.role %s is not user, assistant or system", what, quoteCallerToken(m.Role))
	}), readList(b.Tools, "tools", func(t messagesTool, raw json.RawMessage, what string) error {
		if t.Type != "" && t.Type != toolCustom { // a server tool (web_search_…, bash_…, …): dropped and named
			req.drop(true, t.Type)
			return nil
		}
		req.dropUnknown(raw, "type name description input_schema strict")
		schema, err := jsonObject(t.InputSchema, what+".input_schema")
		t.Type, t.Parameters = toolFunction, schema
		return cmp.Or(err, req.addOpenAITool(t.tool, nil, what))
	}))
	if tc := b.ToolChoice; tc != nil {
		req.ToolChoice = &toolChoice{Mode: messagesChoices[tc.Type], Name: tc.Name}
		req.dropUnknown(rawMember(cr.body.src, "tool_choice"), "type name disable_parallel_tool_use")
		if req.ToolChoice.Mode == "" || req.ToolChoice.Mode == toolChoiceTool && tc.Name == "" {
			err = cmp.Or(err, error(refuse("invalid_request", `tool_choice.type must be auto, any or none, or tool with a name`)))
		}
		if p := tc.DisableParallelToolUse; p != nil {
			req.ParallelToolCalls = new(!*p)
		}
	}
	if len(b.StopSequences) > 0 { // [] asks for nothing
		req.Stop, req.StopName = b.StopSequences, "stop_sequences"
	}
	if t := valueOr(b.Thinking, messagesOption{Type: "disabled"}); t.Type == "enabled" {
		i, _ := slices.BinarySearch(effortBudgets, t.BudgetTokens) // the nearest effort at or above the budget
		req.Effort, req.EffortName = effortNames[min(max(i, 1), len(effortNames)-1)], "thinking"
		req.dropUnknown(rawMember(cr.body.src, "thinking"), "type budget_tokens")
	} else {
		req.drop(t.Type != "disabled", "thinking") // adaptive: no effort of its own to carry
	}
	if o := b.OutputConfig; o.Effort != "" {
		req.Effort, req.EffortName = o.Effort, "effort"
	}
	oc := rawMember(cr.body.src, "output_config")
	req.dropUnknown(oc, "format effort")
	req.dropUnknown(rawMember(oc, "format"), "type schema") // a name and strict are OpenAI's
	req.dropUnknown(rawMember(cr.body.src, "output_format"), "type schema")
	req.drop(b.OutputConfig.Format != nil && b.OutputFormat != nil, "output_format") // output_config.format is carried
	f := valueOr(cmp.Or(b.OutputConfig.Format, b.OutputFormat), outputFormat{})      // its type and schema
	err = cmp.Or(err, req.setOutput(outputFormat{Type: f.Type, Schema: f.Schema}, "output_config.format"))
	return req.finishParse(err, "messages must hold at least one user or assistant turn")
}

// messagesParts reads a turn's content (role "result": a tool result's); other blocks and members are dropped and named.
func (req *chatRequest) messagesParts(role string, raw json.RawMessage, what string) ([]part, error) {
	parts, err := callerParts(req, raw, what, "content blocks", func(bl messagesBlock, raw json.RawMessage, path string) (p part, _ string, err error) {
		p = part{Type: bl.Type, Filename: bl.Title} // an image or document (partImage, partDocument); others build theirs
		switch src := valueOr(bl.Source, messagesSource{}); {
		case bl.Type == "tool_use" && role != "assistant" || bl.Type == "tool_result" && role != "user":
			return part{}, "", refuse("invalid_request", "%s.type %s is not allowed in a %s turn", path, quoteCallerToken(bl.Type), role)
		case bl.Type == "text":
			p, err = textPart(bl.Text, path)
		case bl.Type == "tool_use":
			if bl.Input, err = jsonObject(bl.Input, path+".input"); err == nil && (bl.ID == "" || bl.Name == "") {
				err = refuse("invalid_request", "%s needs an id and a name", path)
			}
			p = part{Type: partToolCall, ToolCallID: bl.ID, ToolName: bl.Name, Arguments: cmp.Or(string(bl.Input), "{}")}
		case bl.Type == "tool_result" && bl.ToolUseID == "":
			return part{}, "", refuse("invalid_request", "%s.tool_use_id is required", path)
		case bl.Type == "tool_result":
			var inner []part
			if !rawIsNull(bl.Content) {
				inner, err = req.messagesParts("result", bl.Content, path+".content")
			}
			p = toolResult(bl.ToolUseID, inner, false, bl.IsError)
		case bl.Type != "image" && bl.Type != "document" || src.Type == "file": // thinking, …, a file reference: dropped
			return part{}, bl.Type, nil
		case src.Type == "base64" && src.MediaType != "" && src.Data != "": // the neutral URL: base64 and text a data URL
			p.URL = "data:" + src.MediaType + ";base64," + src.Data
		case src.Type == "text":
			p.URL = "data:text/plain;base64," + base64.StdEncoding.EncodeToString([]byte(src.Data))
		case src.Type == "url":
			p.URL, err = src.URL, checkCallerURL(src.URL, path+".source.url")
		default:
			return part{}, "", refuse("invalid_request", "%s.source must be base64 with a media_type, text, url or file", path)
		}
		req.drop(bl.IsError, "is_error")
		req.dropUnknown(rawMember(raw, "source"), "type media_type data url")
		return p, messagesBlockMembers[bl.Type], err
	})
	if err == nil && len(parts) == 0 && role != "result" {
		return nil, refuse("invalid_request", "%s must hold at least one content block Brama can carry", what)
	}
	return parts, err
}

// messagesContent is parts as blocks (nil for none), tool results first and no empty text (the API requires both); a
// custom tool's call is the one-string-member object (SPEC §7.6); a base64 data URL is base64 data (text/plain: text).
func (req *chatRequest) messagesContent(ps []part) (_ json.RawMessage, err error) {
	var blocks []messagesBlock
	for _, p := range slices.SortedStableFunc(slices.Values(ps), func(a, b part) int {
		return boolCount(b.Type == partToolResult) - boolCount(a.Type == partToolResult)
	}) {
		var b messagesBlock
		switch p.Type {
		case partText:
			if p.Text == "" {
				continue
			}
			b = messagesBlock{Type: "text", Text: &p.Text}
		case partToolCall:
			b = messagesBlock{Type: "tool_use", ID: messagesToolID(p.ToolCallID), Name: p.ToolName}
			if b.Input, _ = jsonObject([]byte(argumentsText(p.Arguments)), ""); p.Custom {
				b.Input = must(json.Marshal(map[string]string{"input": p.Arguments}))
			} else if b.Input == nil { // null too, never approximated
				return nil, refuse("invalid_request", "a tool call's arguments are not a JSON object")
			}
		case partToolResult:
			b = messagesBlock{Type: "tool_result", ToolUseID: messagesToolID(p.ToolCallID), Content: jsonText(p.Text), IsError: p.IsError}
			if len(p.Media) > 0 { // images and documents: blocks
				b.Content, err = req.messagesContent(append([]part{{Type: partText, Text: p.Text}}, p.Media...))
			}
		default:
			req.drop(p.Detail != "", "detail")
			b = messagesBlock{Type: p.Type, Title: p.Filename, Source: &messagesSource{Type: "url", URL: p.URL}}
			if rest, isData := strings.CutPrefix(p.URL, "data:"); isData {
				media, data, ok := strings.Cut(rest, ";base64,")
				if !ok || media == "" || strings.Contains(media, ",") || data == "" {
					return nil, refuse("invalid_request", "an image or file data URL must be base64 with a media type")
				}
				b.Source = &messagesSource{Type: "base64", MediaType: media, Data: data}
				if media == "text/plain" { // only a text document's data is decoded: an image's may be megabytes
					if text, err := base64.StdEncoding.DecodeString(data); err == nil {
						b.Source = &messagesSource{Type: "text", MediaType: media, Data: string(text)}
					}
				}
			}
		}
		if err != nil {
			return nil, err
		}
		blocks = append(blocks, b)
	}
	return jsonArray(blocks), nil
}

// encodeMessages builds a Messages body, the betas it needs in h (SPEC §7.6). Thinking takes the effort's budget below
// max_tokens, at least 1024, and none in a tool loop, where Anthropic wants back thinking blocks no format carries.
func encodeMessages(req *chatRequest, c call, h http.Header) ([]byte, error) {
	out := messagesRequestBody{callerHead: callerHead{c.res.Model, req.Temperature, req.TopP, req.Stream},
		MaxTokens: req.MaxTokens, StopSequences: req.Stop}
	switch {
	case c.claudeCode():
		out.System, _ = req.messagesContent([]part{{Type: partText, Text: claudeCodeIdentity}, {Type: partText, Text: req.System}})
	case req.System != "":
		out.System = jsonText(req.System)
	}
	req.dropShared(req.Shared)
	turns, inLoop := []messagesTurn{}, false // in a tool loop: the last assistant turn calls a tool
	for _, m := range req.Messages {
		content, err := req.messagesContent(m.Parts) // a later system turn too: Claude takes its text as blocks
		if m.Role == "assistant" {
			inLoop = slices.ContainsFunc(m.Parts, func(p part) bool { return p.Type == partToolCall })
		}
		if err != nil {
			return nil, err
		} else if content != nil { // only empty text: the API refuses an empty turn
			turns = append(turns, messagesTurn{Role: m.Role, Content: content})
		}
	}
	out.Messages = must(json.Marshal(turns))
	if f := req.Output; f != nil && f.Type != "json_schema" {
		return nil, refuse("invalid_request", "structured output without a JSON Schema (JSON mode) cannot be expressed to an anthropic-messages provider; send a JSON Schema")
	} else if f != nil {
		out.OutputConfig.Format = &outputFormat{Type: f.Type, Schema: f.Schema}
		req.drop(f.Name != "", "name") // OpenAI's: messages' format has no name or description
		req.drop(f.Description != "", "description")
	}
	// SPEC §7.6: the structured-outputs beta, for a JSON Schema output format or a tool's strict, true or false.
	if req.Output != nil || slices.ContainsFunc(req.Tools, func(t tool) bool { return t.Strict != nil }) {
		h.Add("Anthropic-Beta", structuredOutputsBeta)
	}
	budget := min(effortBudgets[max(0, slices.Index(effortNames, req.Effort))], cmp.Or(req.MaxTokens, math.MaxInt)-1)
	if budget >= 1024 && !inLoop { // an unknown effort has none; the API refuses temperature and top_p beside thinking
		req.drop(req.Temperature != nil, "temperature")
		req.drop(req.TopP != nil, "top_p")
		out.Thinking, out.Temperature, out.TopP = &messagesOption{Type: "enabled", BudgetTokens: budget}, nil, nil
		if adaptiveModels.MatchString(c.res.Model) { // an effort, not a budget; Anthropic has no "minimal"
			out.Thinking, out.OutputConfig.Effort = &messagesOption{Type: "adaptive"}, strings.Replace(req.Effort, "minimal", "low", 1)
			h.Add("Anthropic-Beta", effortBeta)
		}
	} else {
		req.drop(req.Effort != "" && req.Effort != "none", req.EffortName) // none: no thinking is what was asked
	}
	req.drop(req.Verbosity != "", "verbosity")
	var tools []messagesTool
	for _, t := range req.Tools {
		schema := orEmptySchema(t.Parameters)
		if t.Type == toolCustom { // the one-string-member function a custom tool becomes (SPEC §7.6)
			schema = json.RawMessage(`{"type":"object","properties":{"input":{"type":"string"}},"required":["input"]}`)
			req.drop(t.Format != nil, "format")
		}
		tools = append(tools, messagesTool{tool{Name: t.Name, Description: t.Description, Strict: t.Strict}, schema})
	}
	out.Tools = jsonArray(tools)
	serial := req.ParallelToolCalls != nil && !*req.ParallelToolCalls && len(req.Tools) > 0
	if tc := valueOr(req.ToolChoice, toolChoice{Mode: toolChoiceAuto}); req.ToolChoice != nil || serial {
		out.ToolChoice = &messagesOption{Type: strings.Replace(tc.Mode, toolChoiceRequired, "any", 1), Name: tc.Name,
			DisableParallelToolUse: pick(serial && tc.Mode != toolChoiceNone, new(true), nil)}
	}
	return json.Marshal(out)
}

// messagesToolID is a call id as Anthropic takes it (^[a-zA-Z0-9_-]+$): kimi's "functions.f:0" as "functions_f_0".
func messagesToolID(id string) string { return notToolID.ReplaceAllString(id, "_") }

// decodeMessages gives a whole message to rd's caller stream block by block, as its stream would.
func decodeMessages(body []byte, rd *streamReader) error {
	var r messagesAnswer
	if err := json.Unmarshal(body, &r); err != nil || r.Type != "message" {
		return malformedAnswer(protoAnthropic, err)
	}
	for i, b := range r.Content {
		err := rd.readBlock("content_block_start", i, &b, nil)
		if err == nil && b.Type == "tool_use" && !rawIsNull(b.Input) {
			var in bytes.Buffer
			json.Compact(&in, b.Input) // cannot fail: Input came out of the decoded body
			err = rd.readBlock("content_block_delta", i, nil, &messagesBlock{Type: "input_json_delta", PartialJSON: new(in.String())})
		}
		if err = cmp.Or(err, rd.readBlock("content_block_stop", i, nil, nil)); err != nil {
			return err
		}
	}
	rd.usage, _ = usageOf(protoAnthropic, rawMember(body, "usage"))
	rd.finish = cmp.Or(messagesFinishes[valueOr(r.StopReason, "")], finishStop)
	return nil
}

// messagesFrames writes Anthropic's events a block at a time; the message it keeps gets each block whole at its close.
func (s *callerStream) messagesFrames(step streamStep, b *streamBlock, d string) error {
	ev := messagesEvent{Type: messagesSteps[step]}
	if b != nil {
		ev.Index = &b.pos
	}
	m, _ := s.whole.(*messagesAnswer) // nil before stepBegin
	switch {
	case step == stepBegin: // input tokens go out as 0 (providers report usage at the end) and for real in message_delta, which the SDKs take over
		m = &messagesAnswer{ID: newAnswerID("msg_", ""), Type: "message", Role: "assistant", Model: s.model,
			Content: []messagesBlock{}, Usage: &messagesUsage{}} // usage even unreported: the SDKs require it
		ev.Message, s.whole = m, m
	case step == stepOpen:
		cb := messagesBlock{Type: "text", Text: new("")}
		if !b.text {
			cb = messagesBlock{Type: "tool_use", ID: newAnswerID("toolu_", b.id), Name: b.name, Input: json.RawMessage(`{}`)}
		}
		m.Content = append(m.Content, cb)
		ev.ContentBlock = &cb
	case step == stepDelta && b.text:
		ev.Delta = &messagesBlock{Type: "text_delta", Text: &d}
	case step == stepDelta:
		ev.Delta = &messagesBlock{Type: "input_json_delta", PartialJSON: &d}
	case step == stepClose && b.text: // the kept block gets its whole text, a call its whole input
		m.Content[b.pos].Text = &d
	case step == stepClose: // null too is refused: {} would run the tool on nothing (SPEC §17)
		if m.Content[b.pos].Input, _ = jsonObject([]byte(argumentsText(d)), ""); m.Content[b.pos].Input == nil {
			return refuse("provider_incomplete", "the provider's answer holds a tool call whose arguments are not a JSON object, which a tool_use input must be")
		}
	case step == stepEnd: // message_delta and message_stop (a write error sticks: the second writes nothing)
		m.StopReason = new(cmp.Or(messagesStopReasons[s.rd.finish], "end_turn"))
		m.Usage = &messagesUsage{InputTokens: s.rd.usage.InputTokens, OutputTokens: s.rd.usage.OutputTokens}
		ev.Delta, ev.Usage = &messagesBlock{StopReason: *m.StopReason, StopSequence: json.RawMessage("null")}, m.Usage
		return cmp.Or(s.frame(ev.Type, ev), s.frame("message_stop", messagesEvent{Type: "message_stop"}))
	case step == stepFail:
		ev.Error = must(json.Marshal(s.failure))
	}
	return s.frame(ev.Type, ev)
}

// readMessages: message_stop ends; usage comes in message_start and message_delta, whose output count is the whole.
func (r *streamReader) readMessages(typ string, e rawObject) (keep, end bool, err error) {
	switch {
	case typ == "message_start":
		m, ok := splitRaw(e.value("message"), '{', r.scratch[1][:])
		if !ok {
			return false, false, eventWithout(protoAnthropic, typ, "message")
		}
		r.usage, err = usageOf(r.protocol, m.value("usage")) // a stream cut later still records it
	case typ == "message_delta":
		var d messagesBlock
		u, uerr := usageOf(r.protocol, e.value("usage"))
		if u.Reported { // newer streams repeat the cumulative input count
			r.usage = usage{cmp.Or(u.InputTokens, r.usage.InputTokens), u.OutputTokens, true}
		}
		err = cmp.Or(r.decode(e, "delta", &d), uerr)
		r.finish = cmp.Or(messagesFinishes[d.StopReason], r.finish) // any other reason: a stop, at message_stop
	case typ == "message_stop":
		r.finished, r.finish = true, cmp.Or(r.finish, finishStop)
		return true, true, nil
	case r.out == nil: // passthrough reads no block, so allocates no ev (it escapes) per event
	case typ == "content_block_start" || typ == "content_block_delta" || typ == "content_block_stop":
		var ev messagesEvent
		if json.Unmarshal(e.src, &ev) != nil || typ == "content_block_start" && ev.ContentBlock == nil ||
			typ == "content_block_delta" && ev.Delta == nil {
			err = eventWithout(protoAnthropic, typ, "a valid index, content_block and delta")
		} else {
			err = r.readBlock(typ, valueOr(ev.Index, 0), ev.ContentBlock, ev.Delta)
		}
	} // ping and event types added later carry nothing Brama reads
	return err == nil, false, err
}

// readBlock translates a content block's start (b), delta (d) and stop, streamed or of a whole message (decodeMessages).
func (r *streamReader) readBlock(typ string, index int, b, d *messagesBlock) error {
	c, isTool := r.calls[index]
	switch {
	case typ == "content_block_start" && b.Type == "text", typ == "content_block_delta" && d.Type == "text_delta":
		return r.out.text(valueOr(cmp.Or(b, d).Text, ""))
	case typ == "content_block_start" && b.Type == "tool_use" && (b.Name == "" || isTool):
		return eventWithout(protoAnthropic, typ, "a fresh index and a name")
	case typ == "content_block_start" && b.Type == "tool_use":
		r.calls[index], r.ncalls = &upstreamCall{tool: r.ncalls}, r.ncalls+1
		return r.out.call(r.ncalls-1, part{Type: partToolCall, ToolCallID: b.ID, ToolName: b.Name})
	case typ == "content_block_delta" && d.Type == "input_json_delta" && !isTool:
		return eventWithout(protoAnthropic, typ, "a tool_use block")
	case typ == "content_block_delta" && d.Type == "input_json_delta" && valueOr(d.PartialJSON, "") != "":
		c.streamed = true
		return r.out.call(c.tool, part{Arguments: *d.PartialJSON})
	case typ == "content_block_stop" && isTool && !c.streamed: // a tool without parameters streamed none; callers expect "{}"
		c.streamed = true
		return r.out.call(c.tool, part{Arguments: "{}"})
	}
	return nil
}
