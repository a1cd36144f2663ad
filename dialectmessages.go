package main

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Anthropic Messages (POST /v1/messages): the request parser, the buffered
// message answer and the event stream.

// Anthropic Messages request shapes. Members Brama does not read
// (metadata, stop_sequences, top_k, thinking, cache_control, …) are not
// declared, so they are dropped.
type (
	callerMessagesBody struct {
		Model         string               `json:"model"`
		System        json.RawMessage      `json:"system"`
		Messages      []callerMessagesTurn `json:"messages"`
		Tools         []callerMessagesTool `json:"tools"`
		ToolChoice    json.RawMessage      `json:"tool_choice"`
		MaxTokens     *int                 `json:"max_tokens"`
		Temperature   *float64             `json:"temperature"`
		Stream        bool                 `json:"stream"`
		BillingTarget json.RawMessage      `json:"billingTarget"`
	}
	callerMessagesTurn struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	callerMessagesBlock struct {
		Type      string          `json:"type"`
		Text      *string         `json:"text"`
		Source    json.RawMessage `json:"source"`
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
		ToolUseID string          `json:"tool_use_id"`
		Content   json.RawMessage `json:"content"`
		IsError   bool            `json:"is_error"`
	}
	callerMessagesTool struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
)

// parseMessages parses an Anthropic Messages request body.
func parseMessages(body []byte) (chatRequest, error) {
	var b callerMessagesBody
	if err := decodeCallerJSON(body, &b, ""); err != nil {
		return chatRequest{}, err
	}
	req, err := newCallerRequest(b.Model, b.Temperature, b.Stream, "max_tokens", b.MaxTokens, b.BillingTarget)
	if err != nil {
		return chatRequest{}, err
	}
	if !rawIsNull(b.System) {
		if req.System, err = callerTextOf(b.System, "system", "text", "\n\n"); err != nil {
			return chatRequest{}, err
		}
	}
	if len(b.Messages) == 0 {
		return chatRequest{}, refuseInvalid("messages must not be empty")
	}
	for i, m := range b.Messages {
		what := fmt.Sprintf("messages[%d]", i)
		if m.Role != "user" && m.Role != "assistant" {
			return chatRequest{}, refuseInvalid("%s.role %s is not user or assistant", what, quoteCallerToken(m.Role))
		}
		parts, err := callerMessagesParts(m.Role, m.Content, what+".content")
		if err != nil {
			return chatRequest{}, err
		}
		req.Messages = append(req.Messages, message{Role: m.Role, Parts: parts})
	}
	for i, t := range b.Tools {
		what := fmt.Sprintf("tools[%d]", i)
		if t.Type != "" && t.Type != "custom" {
			return chatRequest{}, refuseInvalid("%s: server tools (type %s) are not supported", what, quoteCallerToken(t.Type))
		}
		if t.Name == "" {
			return chatRequest{}, refuseInvalid("%s.name is required", what)
		}
		schema, err := parseCallerSchema(t.InputSchema, what+".input_schema")
		if err != nil {
			return chatRequest{}, err
		}
		req.Tools = append(req.Tools, tool{Name: t.Name, Description: t.Description, Parameters: schema})
	}
	if req.ToolChoice, err = callerMessagesToolChoice(b.ToolChoice); err != nil {
		return chatRequest{}, err
	}
	return req, nil
}

// callerMessagesParts reads one turn's content: a string or an array of blocks.
// tool_use belongs to assistant turns and tool_result to user turns; thinking
// blocks an SDK echoes back from an earlier answer are dropped (the neutral
// request cannot hold them); any other block kind is refused.
func callerMessagesParts(role string, raw json.RawMessage, what string) ([]part, error) {
	text, blocks, err := callerContent[callerMessagesBlock](raw, what, "content blocks")
	if err != nil || text != nil {
		return text, err
	}
	var parts []part
	for i, bl := range blocks {
		bw := fmt.Sprintf("%s[%d]", what, i)
		switch {
		case bl.Type == "text":
			if bl.Text == nil {
				return nil, refuseInvalid("%s.text is required", bw)
			}
			parts = append(parts, part{Type: partText, Text: *bl.Text})
		case bl.Type == "image":
			url, err := callerMessagesImage(bl.Source, bw+".source")
			if err != nil {
				return nil, err
			}
			parts = append(parts, part{Type: partImage, ImageURL: url})
		case bl.Type == "tool_use" && role == "assistant":
			if bl.ID == "" || bl.Name == "" {
				return nil, refuseInvalid("%s needs an id and a name", bw)
			}
			args, err := callerMessagesToolInput(bl.Input, bw+".input")
			if err != nil {
				return nil, err
			}
			parts = append(parts, part{Type: partToolCall, ToolCallID: bl.ID, ToolName: bl.Name, Arguments: args})
		case bl.Type == "tool_result" && role == "user":
			if bl.ToolUseID == "" {
				return nil, refuseInvalid("%s.tool_use_id is required", bw)
			}
			var text string
			if !rawIsNull(bl.Content) {
				var err error
				if text, err = callerTextOf(bl.Content, bw+".content", "text", "\n"); err != nil {
					return nil, err
				}
			}
			parts = append(parts, part{Type: partToolResult, ToolCallID: bl.ToolUseID, Text: text, IsError: bl.IsError})
		case bl.Type == "thinking" || bl.Type == "redacted_thinking":
		default:
			return nil, refuseInvalid("%s.type %s is not supported in a %s turn", bw, quoteCallerToken(bl.Type), role)
		}
	}
	if len(parts) == 0 {
		return nil, refuseInvalid("%s must hold at least one content block", what)
	}
	return parts, nil
}

// callerMessagesImage turns an image block's source into the neutral image URL:
// base64 data becomes a data URL, a url source stays as it is.
func callerMessagesImage(raw json.RawMessage, what string) (string, error) {
	if rawShape(raw) != '{' {
		return "", refuseInvalid("%s must be an object", what)
	}
	var src struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	}
	if err := decodeCallerJSON(raw, &src, what); err != nil {
		return "", err
	}
	switch src.Type {
	case "base64":
		if src.MediaType == "" || src.Data == "" {
			return "", refuseInvalid("%s needs media_type and data", what)
		}
		return "data:" + src.MediaType + ";base64," + src.Data, nil
	case "url":
		return src.URL, checkCallerImageURL(src.URL, what+".url")
	}
	return "", refuseInvalid("%s.type must be \"base64\" or \"url\"", what)
}

// callerMessagesToolInput is a tool_use block's input object as JSON text; an
// absent input is the empty object.
func callerMessagesToolInput(raw json.RawMessage, what string) (string, error) {
	if rawIsNull(raw) {
		return "{}", nil
	}
	schema, err := parseCallerSchema(raw, what) // the same rule: a JSON object, compacted
	if err != nil {
		return "", refuseInvalid("%s must be a JSON object", what)
	}
	return string(schema), nil
}

// callerMessagesToolChoice reads Anthropic's tool_choice {type, name}.
func callerMessagesToolChoice(raw json.RawMessage) (*toolChoice, error) {
	if rawIsNull(raw) {
		return nil, nil
	}
	if rawShape(raw) != '{' {
		return nil, refuseInvalid("tool_choice must be an object")
	}
	var tc struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := decodeCallerJSON(raw, &tc, "tool_choice"); err != nil {
		return nil, err
	}
	switch tc.Type {
	case "auto":
		return &toolChoice{Mode: toolChoiceAuto}, nil
	case "none":
		return &toolChoice{Mode: toolChoiceNone}, nil
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

// Messages wire shapes shared by the buffered answer and the stream.
type (
	callerMessagesUsage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
	callerMessagesOutBlock struct {
		Type  string          `json:"type"`
		Text  *string         `json:"text,omitempty"`
		ID    string          `json:"id,omitempty"`
		Name  string          `json:"name,omitempty"`
		Input json.RawMessage `json:"input,omitempty"`
	}
)

// callerStopReason maps the neutral finish reason to Anthropic's
// stop_reason.
func callerStopReason(finish string) string {
	switch finish {
	case finishLength:
		return "max_tokens"
	case finishToolCalls:
		return "tool_use"
	case finishContentFilter:
		return "refusal"
	}
	return "end_turn"
}

// callerToolUseInput is a tool call's arguments as the JSON object Anthropic's
// tool_use.input must be. Arguments that are not a JSON object (a provider
// that streamed broken JSON, or none at all) become {}: the block must still
// be well-formed for SDKs, and the caller sees the same call name and id.
func callerToolUseInput(args string) json.RawMessage {
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(args), &obj) != nil || obj == nil {
		return json.RawMessage(`{}`)
	}
	var b bytes.Buffer
	json.Compact(&b, []byte(args)) // valid JSON: Compact cannot fail
	return json.RawMessage(b.Bytes())
}

// callerMessagesAnswer is the Anthropic message object for a. Usage is always
// present (zeros when unreported) because Anthropic's SDKs type it as
// required.
func callerMessagesAnswer(a chatAnswer) any {
	content := []callerMessagesOutBlock{}
	if a.Text != "" {
		content = append(content, callerMessagesOutBlock{Type: "text", Text: &a.Text})
	}
	for _, tc := range a.ToolCalls {
		content = append(content, callerMessagesOutBlock{
			Type: "tool_use", ID: answerIDOr(tc.ID, "toolu_"), Name: tc.Name, Input: callerToolUseInput(tc.Arguments),
		})
	}
	return struct {
		ID           string                   `json:"id"`
		Type         string                   `json:"type"`
		Role         string                   `json:"role"`
		Model        string                   `json:"model"`
		Content      []callerMessagesOutBlock `json:"content"`
		StopReason   string                   `json:"stop_reason"`
		StopSequence *string                  `json:"stop_sequence"`
		Usage        callerMessagesUsage      `json:"usage"`
	}{
		ID: newAnswerID("msg_"), Type: "message", Role: "assistant", Model: a.Model, Content: content,
		StopReason: callerStopReason(answerFinish(a.Finish)),
		Usage:      callerMessagesUsage{a.Usage.InputTokens, a.Usage.OutputTokens},
	}
}

// callerMessagesStream writes Anthropic's message events. Content blocks are
// written one at a time, as Anthropic does: a block is stopped when the
// next one starts. Arguments arriving for a tool call whose block already
// stopped (a provider interleaving calls) are still written to that block's
// index, where SDKs accumulate them.
type callerMessagesStream struct {
	sse       callerSSE
	id        string
	model     string
	started   bool
	blocks    int         // content blocks started so far
	open      int         // index of the open block, -1 when none
	openText  bool        // the open block is a text block
	toolBlock map[int]int // neutral tool call index → block index
	tail      callerStreamTail
}

type (
	callerMessagesDelta struct {
		Type        string  `json:"type"`
		Text        *string `json:"text,omitempty"`
		PartialJSON *string `json:"partial_json,omitempty"`
	}
	callerMessagesEvent struct {
		Type         string                  `json:"type"`
		Index        *int                    `json:"index,omitempty"`
		Message      any                     `json:"message,omitempty"`
		ContentBlock *callerMessagesOutBlock `json:"content_block,omitempty"`
		Delta        any                     `json:"delta,omitempty"`
		Usage        *callerMessagesUsage    `json:"usage,omitempty"`
		Error        any                     `json:"error,omitempty"`
	}
)

func (s *callerMessagesStream) emit(ev callerMessagesEvent) error { return s.sse.frame(ev.Type, ev) }

// start writes message_start. Input tokens are not known yet (providers
// report usage at the end), so they go out as 0 here and for real in
// message_delta, whose usage Anthropic's SDKs take over.
func (s *callerMessagesStream) start() error {
	if s.started {
		return nil
	}
	s.started = true
	return s.emit(callerMessagesEvent{Type: "message_start", Message: struct {
		ID           string                   `json:"id"`
		Type         string                   `json:"type"`
		Role         string                   `json:"role"`
		Model        string                   `json:"model"`
		Content      []callerMessagesOutBlock `json:"content"`
		StopReason   *string                  `json:"stop_reason"`
		StopSequence *string                  `json:"stop_sequence"`
		Usage        callerMessagesUsage      `json:"usage"`
	}{ID: s.id, Type: "message", Role: "assistant", Model: s.model, Content: []callerMessagesOutBlock{}}})
}

// openBlock stops the open block and starts block cb.
func (s *callerMessagesStream) openBlock(cb callerMessagesOutBlock) (int, error) {
	if err := s.closeBlock(); err != nil {
		return 0, err
	}
	i := s.blocks
	s.blocks++
	s.open, s.openText = i, cb.Type == "text"
	return i, s.emit(callerMessagesEvent{Type: "content_block_start", Index: &i, ContentBlock: &cb})
}

func (s *callerMessagesStream) closeBlock() error {
	if s.open < 0 {
		return nil
	}
	i := s.open
	s.open = -1
	return s.emit(callerMessagesEvent{Type: "content_block_stop", Index: &i})
}

// event writes text and input_json deltas, opening a content block when
// the kind of content changes; finish and usage wait for finish().
func (s *callerMessagesStream) event(ev streamEvent) error {
	if s.sse.done {
		return errCallerStreamDone
	}
	if err := s.start(); err != nil {
		return err
	}
	if s.tail.record(ev) {
		return nil
	}
	switch ev.Kind {
	case eventText:
		if ev.Text == "" {
			return nil
		}
		i := s.open
		if i < 0 || !s.openText {
			empty := ""
			var err error
			if i, err = s.openBlock(callerMessagesOutBlock{Type: "text", Text: &empty}); err != nil {
				return err
			}
		}
		return s.emit(callerMessagesEvent{Type: "content_block_delta", Index: &i,
			Delta: callerMessagesDelta{Type: "text_delta", Text: &ev.Text}})
	case eventToolCallStart:
		i, err := s.openBlock(callerMessagesOutBlock{Type: "tool_use", ID: answerIDOr(ev.ToolCall.ID, "toolu_"),
			Name: ev.ToolCall.Name, Input: json.RawMessage(`{}`)})
		s.toolBlock[ev.Index] = i
		return err
	case eventToolCallArgs:
		i, ok := s.toolBlock[ev.Index]
		if !ok {
			return fmt.Errorf("arguments for tool call %d before its start", ev.Index)
		}
		if ev.Text == "" {
			return nil
		}
		return s.emit(callerMessagesEvent{Type: "content_block_delta", Index: &i,
			Delta: callerMessagesDelta{Type: "input_json_delta", PartialJSON: &ev.Text}})
	}
	return unknownStreamEvent(ev)
}

// finish stops the open block, then writes message_delta with the stop
// reason and usage, then message_stop.
func (s *callerMessagesStream) finish() error {
	if err := s.sse.end(); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	if err := s.closeBlock(); err != nil {
		return err
	}
	err := s.emit(callerMessagesEvent{Type: "message_delta",
		Delta: struct {
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		}{StopReason: callerStopReason(answerFinish(s.tail.finish))},
		Usage: &callerMessagesUsage{s.tail.usage.InputTokens, s.tail.usage.OutputTokens}})
	if err != nil {
		return err
	}
	return s.emit(callerMessagesEvent{Type: "message_stop"})
}

// fail writes Anthropic's error event carrying the envelope's members.
func (s *callerMessagesStream) fail(e *apiError) error {
	if err := s.sse.end(); err != nil {
		return err
	}
	b := e.body().Error
	return s.emit(callerMessagesEvent{Type: "error", Error: struct {
		Type      string `json:"type"`
		Message   string `json:"message"`
		Code      string `json:"code"`
		Retryable bool   `json:"retryable"`
		Attempts  *int   `json:"attempts,omitempty"`
	}{b.Type, b.Message, b.Code, b.Retryable, b.Attempts}})
}

func (s *callerMessagesStream) keepAlive() error { return s.sse.keepAlive() }
