package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Anthropic Messages (caller POST /v1/messages, provider {base}/v1/messages):
// both directions, buffered and streamed.

// Messages wire shapes, for the caller's body and the provider's.
type (
	messagesRequestBody struct {
		Model         string              `json:"model"`
		MaxTokens     *int                `json:"max_tokens,omitempty"`
		System        json.RawMessage     `json:"system,omitempty"` // string, or text blocks
		Messages      []messagesTurn      `json:"messages"`
		Tools         []messagesTool      `json:"tools,omitempty"`
		ToolChoice    *messagesToolChoice `json:"tool_choice,omitempty"`
		Temperature   *float64            `json:"temperature,omitempty"`
		TopP          *float64            `json:"top_p,omitempty"`
		StopSequences []string            `json:"stop_sequences,omitempty"`
		Thinking      *messagesThinking   `json:"thinking,omitempty"`
		OutputConfig  *messagesOutput     `json:"output_config,omitempty"`
		OutputFormat  *outputFormat       `json:"output_format,omitempty"` // the beta name, read from callers
		Stream        bool                `json:"stream,omitempty"`
		BillingTarget json.RawMessage     `json:"billingTarget,omitempty"`
	}
	messagesTurn struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	messagesBlock struct {
		Type      string          `json:"type"`
		Text      *string         `json:"text,omitempty"`
		Source    *messagesSource `json:"source,omitempty"`
		Title     string          `json:"title,omitempty"`
		ID        string          `json:"id,omitempty"`
		Name      string          `json:"name,omitempty"`
		Input     json.RawMessage `json:"input,omitempty"`
		ToolUseID string          `json:"tool_use_id,omitempty"`
		Content   json.RawMessage `json:"content,omitempty"`
		IsError   bool            `json:"is_error,omitempty"`
	}
	messagesSource struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type,omitempty"`
		Data      string `json:"data,omitempty"`
		URL       string `json:"url,omitempty"`
	}
	messagesTool struct {
		Type        string          `json:"type,omitempty"`
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		InputSchema json.RawMessage `json:"input_schema,omitempty"`
	}
	messagesToolChoice struct {
		Type                   string `json:"type"`
		Name                   string `json:"name,omitempty"`
		DisableParallelToolUse *bool  `json:"disable_parallel_tool_use,omitempty"`
	}
	messagesThinking struct {
		Type         string `json:"type"`
		BudgetTokens int    `json:"budget_tokens,omitempty"`
	}
	messagesOutput struct {
		Format *outputFormat `json:"format,omitempty"`
		Effort string        `json:"effort,omitempty"`
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
		InputTokens              int `json:"input_tokens"`
		OutputTokens             int `json:"output_tokens"`
		CacheCreationInputTokens int `json:"cache_creation_input_tokens,omitempty"`
		CacheReadInputTokens     int `json:"cache_read_input_tokens,omitempty"`
	}
	messagesEvent struct {
		Type         string          `json:"type"`
		Index        *int            `json:"index,omitempty"`
		Message      *messagesAnswer `json:"message,omitempty"`
		ContentBlock *messagesBlock  `json:"content_block,omitempty"`
		Delta        *messagesDelta  `json:"delta,omitempty"`
		Usage        *messagesUsage  `json:"usage,omitempty"`
		Error        json.RawMessage `json:"error,omitempty"`
	}
	messagesDelta struct {
		Type         string          `json:"type,omitempty"`
		Text         *string         `json:"text,omitempty"`
		PartialJSON  *string         `json:"partial_json,omitempty"`
		StopReason   string          `json:"stop_reason,omitempty"`
		StopSequence json.RawMessage `json:"stop_sequence,omitempty"`
	}
)

const messagesKnown = "model max_tokens system messages tools tool_choice temperature top_p stop_sequences thinking output_config output_format stream billingTarget"

// parseMessages parses an Anthropic Messages request body.
func parseMessages(body []byte) (chatRequest, error) {
	var b messagesRequestBody
	if err := decodeCallerJSON(body, &b, ""); err != nil {
		return chatRequest{}, err
	}
	req, err := newCallerRequest(b.Model, b.Temperature, b.TopP, b.Stream, "max_tokens", b.MaxTokens, b.BillingTarget)
	if err != nil {
		return chatRequest{}, err
	}
	dropUnknown(&req.Dropped, body, "", messagesKnown)
	if !rawIsNull(b.System) {
		if req.System, err = req.messagesText(b.System, "system"); err != nil {
			return chatRequest{}, err
		}
	}
	for i, m := range b.Messages {
		what := fmt.Sprintf("messages[%d]", i)
		switch m.Role {
		case "system":
			text, err := req.messagesText(m.Content, what+".content")
			if err != nil {
				return chatRequest{}, err
			}
			req.addSystem(text)
			continue
		case "user", "assistant":
		default:
			return chatRequest{}, refuseInvalid("%s.role %s is not user, assistant or system", what, quoteCallerToken(m.Role))
		}
		parts, err := req.messagesParts(m.Role, m.Content, what+".content")
		if err != nil {
			return chatRequest{}, err
		}
		req.Messages = append(req.Messages, message{Role: m.Role, Parts: parts})
	}
	if len(req.Messages) == 0 {
		return chatRequest{}, refuseInvalid("messages must hold at least one user or assistant turn")
	}
	var raw struct{ Tools []json.RawMessage }
	json.Unmarshal(body, &raw)
	for i, t := range b.Tools {
		what := fmt.Sprintf("tools[%d]", i)
		if t.Type != "" && t.Type != "custom" { // a server tool: web_search_…, bash_…, …
			req.Dropped = append(req.Dropped, what)
			continue
		}
		if t.Name == "" {
			return chatRequest{}, refuseInvalid("%s.name is required", what)
		}
		dropUnknown(&req.Dropped, raw.Tools[i], what, "type name description input_schema")
		schema, err := parseCallerSchema(t.InputSchema, what+".input_schema")
		if err != nil {
			return chatRequest{}, err
		}
		req.Tools = append(req.Tools, tool{Name: t.Name, Description: t.Description, Parameters: schema})
	}
	if tc := b.ToolChoice; tc != nil {
		if req.ToolChoice, err = parseMessagesToolChoice(tc); err != nil {
			return chatRequest{}, err
		}
		if p := tc.DisableParallelToolUse; p != nil {
			parallel := !*p
			req.ParallelToolCalls = &parallel
		}
	}
	req.Stop = b.StopSequences
	if len(req.Stop) > 0 {
		req.StopPath = "stop_sequences"
	}
	if t := b.Thinking; t != nil && t.Type == "enabled" {
		req.Effort = effortOfBudget(t.BudgetTokens)
	}
	if o := b.OutputConfig; o != nil && o.Effort != "" {
		req.Effort = o.Effort
	}
	f := b.OutputFormat
	if o := b.OutputConfig; o != nil && o.Format != nil {
		f = o.Format
	}
	if f != nil {
		if req.Output, err = checkOutput(&outputFormat{Type: f.Type, Schema: f.Schema}, "output_config.format"); err != nil {
			return chatRequest{}, err
		}
	}
	req.linkCalls()
	return req, nil
}

// messagesText reads content that may only be text (a system prompt): a
// string or text blocks, whose cache_control is dropped and named.
func (req *chatRequest) messagesText(raw json.RawMessage, what string) (string, error) {
	if rawShape(raw) == '[' {
		var blocks []json.RawMessage
		json.Unmarshal(raw, &blocks)
		for i, bl := range blocks {
			dropUnknown(&req.Dropped, bl, fmt.Sprintf("%s[%d]", what, i), "type text")
		}
	}
	return callerTextOf(raw, what, "text", "\n\n")
}

// messagesParts reads one turn's content: a string or an array of blocks.
// tool_use belongs to assistant turns and tool_result to user turns;
// blocks with no counterpart elsewhere (thinking, server tool results, a
// file reference) and block members (cache_control, citations) are
// dropped and named.
func (req *chatRequest) messagesParts(role string, raw json.RawMessage, what string) ([]part, error) {
	text, blocks, err := callerContent[messagesBlock](raw, what, "content blocks")
	if err != nil || text != nil {
		return text, err
	}
	var rawBlocks []json.RawMessage
	json.Unmarshal(raw, &rawBlocks)
	var parts []part
	for i, bl := range blocks {
		bw := fmt.Sprintf("%s[%d]", what, i)
		p := part{Type: bl.Type}
		known := "type"
		switch {
		case bl.Type == "text":
			if bl.Text == nil {
				return nil, refuseInvalid("%s.text is required", bw)
			}
			p.Text, known = *bl.Text, "type text"
		case bl.Type == "image" || bl.Type == "document":
			url, err := messagesSourceURL(bl.Source, bw+".source")
			if err != nil {
				return nil, err
			}
			if url == "" {
				req.Dropped = append(req.Dropped, bw)
				continue
			}
			p.ImageURL, known = url, "type source"
			if bl.Type == "document" {
				p = part{Type: partDocument, FileURL: url, Filename: bl.Title}
				known = "type source title"
			}
		case bl.Type == "tool_use" && role == "assistant":
			if bl.ID == "" || bl.Name == "" {
				return nil, refuseInvalid("%s needs an id and a name", bw)
			}
			args, err := messagesToolInput(bl.Input, bw+".input")
			if err != nil {
				return nil, err
			}
			p = part{Type: partToolCall, ToolCallID: bl.ID, ToolName: bl.Name, Arguments: args}
			known = "type id name input"
		case bl.Type == "tool_result" && role == "user":
			if bl.ToolUseID == "" {
				return nil, refuseInvalid("%s.tool_use_id is required", bw)
			}
			if !rawIsNull(bl.Content) {
				inner, err := req.messagesParts("result", bl.Content, bw+".content")
				if err != nil {
					return nil, err
				}
				var texts []string
				for k, ip := range inner {
					if ip.Type != partText {
						req.Dropped = append(req.Dropped, fmt.Sprintf("%s.content[%d]", bw, k))
						continue
					}
					texts = append(texts, ip.Text)
				}
				p.Text = strings.Join(texts, "\n")
			}
			p.ToolCallID, p.IsError, known = bl.ToolUseID, bl.IsError, "type tool_use_id content is_error"
		case bl.Type == "tool_use" || bl.Type == "tool_result":
			return nil, refuseInvalid("%s.type %s is not allowed in a %s turn", bw, quoteCallerToken(bl.Type), role)
		default:
			req.Dropped = append(req.Dropped, bw)
			continue
		}
		dropUnknown(&req.Dropped, rawBlocks[i], bw, known)
		parts = append(parts, p)
	}
	if len(parts) == 0 && role != "result" {
		return nil, refuseInvalid("%s must hold at least one content block Brama can carry", what)
	}
	return parts, nil
}

// messagesSourceURL turns an image or document source into the neutral
// URL: base64 data and plain text become a data URL, a url source stays as
// it is. A file reference has no counterpart elsewhere: "" and no error.
func messagesSourceURL(src *messagesSource, what string) (string, error) {
	if src == nil {
		return "", refuseInvalid("%s must be an object", what)
	}
	switch src.Type {
	case "base64":
		if src.MediaType == "" || src.Data == "" {
			return "", refuseInvalid("%s needs media_type and data", what)
		}
		return "data:" + src.MediaType + ";base64," + src.Data, nil
	case "text":
		return "data:text/plain;base64," + base64.StdEncoding.EncodeToString([]byte(src.Data)), nil
	case "url":
		return src.URL, checkCallerURL(src.URL, what+".url")
	case "file":
		return "", nil
	}
	return "", refuseInvalid("%s.type must be base64, text, url or file", what)
}

// messagesToolInput is a tool_use block's input object as JSON text; an
// absent input is the empty object.
func messagesToolInput(raw json.RawMessage, what string) (string, error) {
	if rawIsNull(raw) {
		return "{}", nil
	}
	schema, err := parseCallerSchema(raw, what) // the same rule: a JSON object, compacted
	if err != nil {
		return "", refuseInvalid("%s must be a JSON object", what)
	}
	return string(schema), nil
}

// parseMessagesToolChoice reads Anthropic's tool_choice {type, name}.
func parseMessagesToolChoice(tc *messagesToolChoice) (*toolChoice, error) {
	switch tc.Type {
	case "auto", "none":
		return &toolChoice{Mode: tc.Type}, nil
	case "any":
		return &toolChoice{Mode: toolChoiceRequired}, nil
	case "tool":
		if tc.Name == "" {
			return nil, refuseInvalid("tool_choice.name is required with type \"tool\"")
		}
		return &toolChoice{Mode: toolChoiceTool, Name: tc.Name}, nil
	}
	return nil, refuseInvalid("tool_choice.type must be auto, any, tool or none")
}

// messagesSourceOf turns a neutral image or document URL into a source: a
// data URL becomes base64 data (plain text a text source), anything else a
// url source.
func messagesSourceOf(u string) (*messagesSource, error) {
	if !strings.HasPrefix(u, "data:") {
		return &messagesSource{Type: "url", URL: u}, nil
	}
	media, data, ok := dataURL(u)
	if !ok {
		return nil, refuse("invalid_request", "an image or file data URL must be base64 with a media type")
	}
	if media == "text/plain" {
		if text, err := base64.StdEncoding.DecodeString(data); err == nil {
			return &messagesSource{Type: "text", MediaType: media, Data: string(text)}, nil
		}
	}
	return &messagesSource{Type: "base64", MediaType: media, Data: data}, nil
}

// encodeMessages builds a Messages body. Tool results go first in their
// user message, as the API requires; empty text parts are dropped because
// the API refuses empty text blocks. o.oauth selects claude-code's system
// prompt, whose first block must be claudeCodeIdentity. A custom tool
// becomes a function of one string member, input (SPEC §7.6).
func encodeMessages(req chatRequest, model string, o upstreamOptions) (any, error) {
	out := messagesRequestBody{Model: model, Temperature: req.Temperature, TopP: req.TopP, Stream: o.stream, StopSequences: req.Stop, Messages: []messagesTurn{}}
	if req.MaxTokens > 0 {
		out.MaxTokens = &req.MaxTokens
	}
	switch {
	case o.oauth:
		sys := []messagesBlock{{Type: "text", Text: ptrTo(claudeCodeIdentity)}}
		if req.System != "" {
			sys = append(sys, messagesBlock{Type: "text", Text: &req.System})
		}
		out.System, _ = json.Marshal(sys)
	case req.System != "":
		out.System = jsonText(req.System)
	}
	for _, m := range req.Messages {
		if m.Role == "system" {
			out.Messages = append(out.Messages, messagesTurn{Role: "system", Content: jsonText(textOf(m.Parts))})
			continue
		}
		var results, rest []messagesBlock
		for _, p := range m.Parts {
			switch p.Type {
			case partText:
				if p.Text != "" {
					rest = append(rest, messagesBlock{Type: "text", Text: &p.Text})
				}
			case partImage, partDocument:
				src, err := messagesSourceOf(p.ImageURL + p.FileURL)
				if err != nil {
					return nil, err
				}
				rest = append(rest, messagesBlock{Type: p.Type, Source: src, Title: p.Filename})
			case partToolCall:
				args := p.Arguments
				if p.Custom {
					args = string(must(json.Marshal(map[string]string{"input": args})))
				}
				in, err := toolArguments(args)
				if err != nil {
					return nil, err
				}
				rest = append(rest, messagesBlock{Type: "tool_use", ID: p.ToolCallID, Name: p.ToolName, Input: in})
			case partToolResult:
				results = append(results, messagesBlock{Type: "tool_result", ToolUseID: p.ToolCallID, Content: jsonText(p.Text), IsError: p.IsError})
			}
		}
		out.Messages = append(out.Messages, messagesTurn{Role: m.Role, Content: must(json.Marshal(append(results, rest...)))})
	}
	for _, t := range req.Tools {
		schema := t.Parameters
		switch {
		case t.Kind == toolCustom:
			schema = customInputSchema
		case len(schema) == 0:
			schema = emptySchema
		}
		out.Tools = append(out.Tools, messagesTool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	if c := req.ToolChoice; c != nil || req.ParallelToolCalls != nil && !*req.ParallelToolCalls && len(req.Tools) > 0 {
		out.ToolChoice = &messagesToolChoice{Type: "auto"}
		if c != nil {
			out.ToolChoice.Type, out.ToolChoice.Name = map[string]string{toolChoiceRequired: "any", toolChoiceTool: "tool"}[c.Mode]+"", c.Name
			if out.ToolChoice.Type == "" {
				out.ToolChoice.Type = c.Mode
			}
		}
		if p := req.ParallelToolCalls; p != nil && !*p && out.ToolChoice.Type != "none" {
			out.ToolChoice.DisableParallelToolUse = ptrTo(true)
		}
	}
	if budget := budgetOfEffort(req.Effort); budget > 0 {
		if req.MaxTokens > 0 && budget >= req.MaxTokens {
			budget = req.MaxTokens - 1
		}
		if budget >= 1024 { // the API's least budget
			out.Thinking = &messagesThinking{Type: "enabled", BudgetTokens: budget}
		}
	}
	if f := req.Output; f != nil {
		if f.Type != "json_schema" {
			return nil, refuse("invalid_request", "structured output without a JSON Schema (JSON mode) cannot be expressed to an anthropic-messages provider; send a JSON Schema")
		}
		out.OutputConfig = &messagesOutput{Format: &outputFormat{Type: f.Type, Schema: f.Schema}}
	}
	return out, nil
}

// input counts every input token: Anthropic reports cached ones apart, the
// neutral count (like OpenAI's prompt_tokens) includes them.
func (u messagesUsage) input() int {
	return u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
}

// messagesFinish maps a stop_reason to the neutral finish.
func messagesFinish(r string) string {
	switch r {
	case "max_tokens", "model_context_window_exceeded":
		return finishLength
	case "tool_use":
		return finishToolCalls
	case "refusal":
		return finishContentFilter
	}
	return finishStop // end_turn, stop_sequence, pause_turn, or none
}

// messagesStopReason maps the neutral finish to a stop_reason.
func messagesStopReason(finish string) *string {
	r := map[string]string{finishLength: "max_tokens", finishToolCalls: "tool_use", finishContentFilter: "refusal"}[finish]
	if r == "" {
		r = "end_turn"
	}
	return &r
}

// decodeMessages reads a complete Messages answer.
func decodeMessages(body []byte) (chatAnswer, error) {
	var r messagesAnswer
	if err := json.Unmarshal(body, &r); err != nil {
		return chatAnswer{}, malformedAnswer(protoAnthropic, err)
	}
	if r.Type != "message" {
		return chatAnswer{}, malformedAnswer(protoAnthropic, nil)
	}
	var a chatAnswer
	var text strings.Builder
	for _, b := range r.Content {
		switch b.Type {
		case "text":
			if b.Text != nil {
				text.WriteString(*b.Text)
			}
		case "tool_use":
			args := "{}"
			if !rawIsNull(b.Input) {
				var buf bytes.Buffer
				if err := json.Compact(&buf, b.Input); err != nil {
					return chatAnswer{}, malformedAnswer(protoAnthropic, err)
				}
				args = buf.String()
			}
			if b.Name == "" {
				return chatAnswer{}, malformedAnswer(protoAnthropic, nil)
			}
			a.ToolCalls = append(a.ToolCalls, toolCall{ID: b.ID, Name: b.Name, Arguments: args})
		}
	}
	a.Text = text.String()
	if r.StopReason != nil {
		a.Finish = messagesFinish(*r.StopReason)
	} else {
		a.Finish = finishStop
	}
	if u := r.Usage; u != nil {
		a.Usage = usage{InputTokens: u.input(), OutputTokens: u.OutputTokens, Reported: true}
	}
	return a, nil
}

// messagesToolUseInput is a tool call's arguments as the JSON object
// Anthropic's tool_use.input must be. Arguments that are not a JSON object
// (a provider that streamed broken JSON, or none at all) become {}: the
// block must still be well-formed for SDKs.
func messagesToolUseInput(args string) json.RawMessage {
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(args), &obj) != nil || obj == nil {
		return json.RawMessage(`{}`)
	}
	var b bytes.Buffer
	json.Compact(&b, []byte(args)) // valid JSON: Compact cannot fail
	return json.RawMessage(b.Bytes())
}

// renderMessages is the Anthropic message object for a. Usage is always
// present (zeros when unreported) because Anthropic's SDKs type it as
// required.
func renderMessages(req chatRequest, a chatAnswer) any {
	content := []messagesBlock{}
	if a.Text != "" {
		content = append(content, messagesBlock{Type: "text", Text: &a.Text})
	}
	for _, tc := range a.ToolCalls {
		content = append(content, messagesBlock{Type: "tool_use", ID: answerIDOr(tc.ID, "toolu_"), Name: tc.Name, Input: messagesToolUseInput(tc.Arguments)})
	}
	return messagesAnswer{ID: newAnswerID("msg_"), Type: "message", Role: "assistant", Model: a.Model, Content: content,
		StopReason: messagesStopReason(answerFinish(a.Finish)), Usage: &messagesUsage{InputTokens: a.Usage.InputTokens, OutputTokens: a.Usage.OutputTokens}}
}

// messagesCallerStream writes Anthropic's message events, one content
// block at a time.
type messagesCallerStream struct {
	sse   *callerSSE
	id    string
	model string
}

func newMessagesCallerStream(sse *callerSSE, _ chatRequest, model string) blockWriter {
	return &messagesCallerStream{sse: sse, id: newAnswerID("msg_"), model: model}
}

func (s *messagesCallerStream) emit(ev messagesEvent) error { return s.sse.frame(ev.Type, ev) }

// begin writes message_start. Input tokens are not known yet (providers
// report usage at the end), so they go out as 0 here and for real in
// message_delta, whose usage Anthropic's SDKs take over.
func (s *messagesCallerStream) begin() error {
	return s.emit(messagesEvent{Type: "message_start", Message: &messagesAnswer{ID: s.id, Type: "message", Role: "assistant",
		Model: s.model, Content: []messagesBlock{}, Usage: &messagesUsage{}}})
}

func (s *messagesCallerStream) open(i int, b *streamBlock) error {
	cb := messagesBlock{Type: "text", Text: ptrTo("")}
	if !b.text {
		cb = messagesBlock{Type: "tool_use", ID: answerIDOr(b.id, "toolu_"), Name: b.name, Input: json.RawMessage(`{}`)}
	}
	return s.emit(messagesEvent{Type: "content_block_start", Index: &i, ContentBlock: &cb})
}

func (s *messagesCallerStream) delta(i int, b *streamBlock, d string) error {
	delta := &messagesDelta{Type: "text_delta", Text: &d}
	if !b.text {
		delta = &messagesDelta{Type: "input_json_delta", PartialJSON: &d}
	}
	return s.emit(messagesEvent{Type: "content_block_delta", Index: &i, Delta: delta})
}

func (s *messagesCallerStream) close(i int, _ *streamBlock, _ string) error {
	return s.emit(messagesEvent{Type: "content_block_stop", Index: &i})
}

func (s *messagesCallerStream) finishNow(callerStreamTail) error { return nil }

// end writes message_delta with the stop reason and usage, then message_stop.
func (s *messagesCallerStream) end(t callerStreamTail) error {
	err := s.emit(messagesEvent{Type: "message_delta",
		Delta: &messagesDelta{StopReason: *messagesStopReason(answerFinish(t.finish)), StopSequence: json.RawMessage("null")},
		Usage: &messagesUsage{InputTokens: t.usage.InputTokens, OutputTokens: t.usage.OutputTokens}})
	if err != nil {
		return err
	}
	return s.emit(messagesEvent{Type: "message_stop"})
}

// fail writes Anthropic's error event carrying the envelope's members.
func (s *messagesCallerStream) fail(e *apiError) error {
	b := e.body().Error
	return s.emit(messagesEvent{Type: "error", Error: must(json.Marshal(struct {
		Type      string `json:"type"`
		Message   string `json:"message"`
		Code      string `json:"code"`
		Retryable bool   `json:"retryable"`
		Attempts  *int   `json:"attempts,omitempty"`
	}{b.Type, b.Message, b.Code, b.Retryable, b.Attempts}))})
}

// messagesUpstreamStream translates Messages events; message_stop is terminal.
type messagesUpstreamStream struct {
	finish   string
	usage    usage
	blocks   map[int]int  // content block index → neutral tool index, tool_use blocks only
	tools    int          // tool calls started
	argsSeen map[int]bool // neutral tool index → some non-empty arguments were emitted
}

func newMessagesUpstreamStream() streamTranslator {
	return &messagesUpstreamStream{blocks: map[int]int{}, argsSeen: map[int]bool{}}
}

func (a *messagesUpstreamStream) handle(ev sseEvent, emit func(streamEvent) error) (bool, error) {
	var e messagesEvent
	if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
		return false, malformedEvent(protoAnthropic, err)
	}
	index := 0
	if e.Index != nil {
		index = *e.Index
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
			if b.Text != nil && *b.Text != "" {
				return false, emit(streamEvent{Kind: eventText, Text: *b.Text})
			}
		case "tool_use":
			if b.Name == "" {
				return false, malformedEvent(protoAnthropic, errors.New("tool_use without a name"))
			}
			if _, dup := a.blocks[index]; dup {
				return false, malformedEvent(protoAnthropic, errors.New("content block index started twice"))
			}
			ni := a.tools
			a.tools++
			a.blocks[index] = ni
			return false, emit(streamEvent{Kind: eventToolCallStart, Index: ni, ToolCall: toolCall{ID: b.ID, Name: b.Name}})
		}
	case "content_block_delta":
		d := e.Delta
		if d == nil {
			return false, malformedEvent(protoAnthropic, errors.New("content_block_delta without delta"))
		}
		switch d.Type {
		case "text_delta":
			if d.Text != nil && *d.Text != "" {
				return false, emit(streamEvent{Kind: eventText, Text: *d.Text})
			}
		case "input_json_delta":
			ni, ok := a.blocks[index]
			if !ok {
				return false, malformedEvent(protoAnthropic, errors.New("input_json_delta outside a tool_use block"))
			}
			if d.PartialJSON != nil && *d.PartialJSON != "" {
				a.argsSeen[ni] = true
				return false, emit(streamEvent{Kind: eventToolCallArgs, Index: ni, Text: *d.PartialJSON})
			}
		}
	case "content_block_stop":
		// A tool without parameters streams no arguments; callers expect "{}".
		if ni, ok := a.blocks[index]; ok && !a.argsSeen[ni] {
			a.argsSeen[ni] = true
			return false, emit(streamEvent{Kind: eventToolCallArgs, Index: ni, Text: "{}"})
		}
	case "message_delta":
		if e.Delta != nil && e.Delta.StopReason != "" {
			a.finish = messagesFinish(e.Delta.StopReason)
		}
		if u := e.Usage; u != nil {
			a.usage.Reported = true
			// Newer message_delta events repeat the cumulative input counts.
			if u.InputTokens > 0 {
				a.usage.InputTokens = u.input()
			}
			a.usage.OutputTokens = u.OutputTokens
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

func (a *messagesUpstreamStream) ended(func(streamEvent) error) (bool, error) { return false, nil }
