package main

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
)

// Anthropic Messages (caller POST /v1/messages, provider {base}/v1/messages): both directions, buffered and streamed. The wire shapes serve both.
type (
	messagesRequestBody struct {
		callerHead
		MaxTokens     *int                `json:"max_tokens,omitempty"`
		System        json.RawMessage     `json:"system,omitempty"` // string, or text blocks
		Messages      []messagesTurn      `json:"messages"`
		Tools         []messagesTool      `json:"tools,omitempty"`
		ToolChoice    *messagesToolChoice `json:"tool_choice,omitempty"`
		StopSequences []string            `json:"stop_sequences,omitempty"`
		Thinking      *messagesThinking   `json:"thinking,omitempty"`
		OutputConfig  *messagesOutput     `json:"output_config,omitempty"`
		OutputFormat  *outputFormat       `json:"output_format,omitempty"` // the beta name, read from callers
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
		Strict      *bool           `json:"strict,omitempty"`
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

const messagesKnown = "model max_tokens system messages tools tool_choice temperature top_p stop_sequences thinking output_config output_format stream"

// Tables: tool_choice types as neutral modes; stop reasons as finishes (any other, as end_turn, stop_sequence, pause_turn: a stop) and
// back (else end_turn); effort names as thinking budgets (a budget maps back to the nearest effort at or above it, SPEC §7.6).
var (
	messagesChoices  = map[string]string{"auto": toolChoiceAuto, "none": toolChoiceNone, "any": toolChoiceRequired, "tool": toolChoiceTool}
	messagesFinishes = map[string]string{"max_tokens": finishLength, "tool_use": finishToolCalls,
		"refusal": finishContentFilter, "model_context_window_exceeded": finishLength}
	messagesStopReasons = map[string]string{finishLength: "max_tokens", finishToolCalls: "tool_use", finishContentFilter: "refusal"}
	effortBudgets       = []struct {
		effort string
		budget int
	}{{"minimal", 1024}, {"low", 2048}, {"medium", 8192}, {"high", 24576}, {"xhigh", 32768}}
)

// Anthropic-beta values: output_config.effort's, and a JSON Schema output format's (SPEC §7.6).
const (
	effortBeta            = "effort-2025-11-24"
	structuredOutputsBeta = "structured-outputs-2025-11-13"
)

func parseMessages(body []byte) (chatRequest, error) {
	var b messagesRequestBody
	req, err := newCallerRequest(body, &b, &b.callerHead, messagesKnown, "max_tokens", &b.MaxTokens)
	if err != nil {
		return chatRequest{}, err
	}
	if !rawIsNull(b.System) {
		if req.System, err = req.callerTextOf(b.System, "system", "text", "\n\n"); err != nil {
			return chatRequest{}, err
		}
	}
	if err := eachItem(b.Messages, nil, "messages", req.addMessagesTurn); err != nil {
		return chatRequest{}, err
	}
	if len(req.Messages) == 0 {
		return chatRequest{}, refuseInvalid("messages must hold at least one user or assistant turn")
	}
	var raw struct{ Tools json.RawMessage }
	json.Unmarshal(body, &raw)
	if err := eachItem(b.Tools, raw.Tools, "tools", req.addMessagesTool); err != nil {
		return chatRequest{}, err
	}
	if tc := b.ToolChoice; tc != nil {
		switch mode := messagesChoices[tc.Type]; {
		case mode == "":
			return chatRequest{}, refuseInvalid("tool_choice.type must be auto, any, tool or none")
		case mode == toolChoiceTool && tc.Name == "":
			return chatRequest{}, refuseInvalid("tool_choice.name is required with type \"tool\"")
		default:
			req.ToolChoice = &toolChoice{Mode: mode, Name: tc.Name}
		}
		if p := tc.DisableParallelToolUse; p != nil {
			req.ParallelToolCalls = ptrTo(!*p)
		}
	}
	if len(b.StopSequences) > 0 { // [] asks for nothing
		req.Stop, req.StopName = b.StopSequences, "stop_sequences"
	}
	switch t := b.Thinking; {
	case t != nil && t.Type == "enabled":
		req.Effort, req.EffortName = "xhigh", "thinking"
		for _, e := range slices.Backward(effortBudgets) {
			if t.BudgetTokens <= e.budget {
				req.Effort = e.effort
			}
		}
	case t != nil && t.Type != "disabled": // adaptive: no effort of its own to carry
		req.Dropped = append(req.Dropped, "thinking")
	}
	f := b.OutputFormat
	if o := b.OutputConfig; o != nil {
		if o.Effort != "" {
			req.Effort, req.EffortName = o.Effort, "effort"
		}
		f = cmp.Or(o.Format, f)
	}
	if f != nil {
		f = &outputFormat{Type: f.Type, Schema: f.Schema}
	}
	if err := req.setOutput(f, "output_config.format"); err != nil {
		return chatRequest{}, err
	}
	req.linkCalls()
	return req, nil
}

func (req *chatRequest) addMessagesTurn(m messagesTurn, _ json.RawMessage, what string) error {
	switch m.Role {
	case "system":
		text, err := req.callerTextOf(m.Content, what+".content", "text", "\n\n")
		req.addSystem(text) // on an error the whole request is refused
		return err
	case "user", "assistant":
		parts, err := req.messagesParts(m.Role, m.Content, what+".content")
		req.Messages = append(req.Messages, message{Role: m.Role, Parts: parts})
		return err
	}
	return refuseInvalid("%s.role %s is not user, assistant or system", what, quoteCallerToken(m.Role))
}

// addMessagesTool adds a client tool, naming raw's unknown members; a server tool (web_search_…, bash_…, …) is dropped and named.
func (req *chatRequest) addMessagesTool(t messagesTool, raw json.RawMessage, what string) error {
	if t.Type != "" && t.Type != "custom" {
		req.Dropped = append(req.Dropped, t.Type)
		return nil
	}
	dropUnknown(&req.Dropped, raw, "type name description input_schema strict")
	schema, err := parseCallerSchema(t.InputSchema, what+".input_schema")
	if err == nil && t.Name == "" {
		err = refuseInvalid("%s.name is required", what)
	}
	req.Tools = append(req.Tools, tool{Name: t.Name, Description: t.Description, Parameters: schema, Strict: t.Strict})
	return err // on an error the whole request is refused
}

// messagesParts reads a turn's content: a string or blocks; other blocks (thinking, a file) and members (cache_control, citations) are dropped and named.
func (req *chatRequest) messagesParts(role string, raw json.RawMessage, what string) ([]part, error) {
	read := func(bl messagesBlock, rb json.RawMessage, bw string) (p part, _ string, err error) {
		known := "type"
		switch {
		case bl.Type == "text" && bl.Text != nil:
			p, known = part{Type: partText, Text: *bl.Text}, "type text"
		case bl.Type == "text":
			return p, "", refuseInvalid("%s.text is required", bw)
		case bl.Type == "image" || bl.Type == "document":
			url, err := messagesSourceURL(bl.Source, bw+".source")
			if err != nil || url == "" { // a file reference: dropped
				return p, "", err
			}
			p, known = part{Type: partImage, ImageURL: url}, "type source"
			if bl.Type == "document" {
				p, known = part{Type: partDocument, FileURL: url, Filename: bl.Title}, "type source title"
			}
		case bl.Type == "tool_use" && role == "assistant":
			var in json.RawMessage
			in, err = parseCallerSchema(bl.Input, bw+".input") // the same rule: a JSON object, compacted
			if err == nil && (bl.ID == "" || bl.Name == "") {
				err = refuseInvalid("%s needs an id and a name", bw)
			}
			p, known = part{Type: partToolCall, ToolCallID: bl.ID, ToolName: bl.Name, Arguments: cmp.Or(string(in), "{}")}, "type id name input"
		case bl.Type == "tool_result" && role == "user":
			if bl.ToolUseID == "" {
				return p, "", refuseInvalid("%s.tool_use_id is required", bw)
			}
			p = part{Type: partToolResult, ToolCallID: bl.ToolUseID, IsError: bl.IsError}
			if !rawIsNull(bl.Content) {
				inner, err := req.messagesParts("result", bl.Content, bw+".content")
				if err != nil {
					return p, "", err
				}
				p.Text, p.Media = resultText(inner)
			}
			known = "type tool_use_id content" + map[bool]string{false: " is_error"}[bl.IsError] // no OpenAI format has the flag
		case bl.Type == "tool_use" || bl.Type == "tool_result":
			return p, "", refuseInvalid("%s.type %s is not allowed in a %s turn", bw, quoteCallerToken(bl.Type), role)
		default: // thinking, …: dropped
			return p, "", nil
		}
		if err != nil {
			return part{}, "", err
		}
		dropUnknown(&req.Dropped, rb, known)
		return p, bw + ".source", nil // its URL was checked already
	}
	parts, err := callerParts(req, raw, what, "content blocks", read)
	if err == nil && len(parts) == 0 && role != "result" {
		return nil, refuseInvalid("%s must hold at least one content block Brama can carry", what)
	}
	return parts, err
}

// messagesSourceURL is a source as the neutral URL: base64 data and text a data URL, a url source itself; a file reference (no counterpart) is "".
func messagesSourceURL(src *messagesSource, what string) (string, error) {
	switch {
	case src == nil:
		return "", refuseInvalid("%s must be an object", what)
	case src.Type == "base64" && src.MediaType != "" && src.Data != "":
		return "data:" + src.MediaType + ";base64," + src.Data, nil
	case src.Type == "text":
		return "data:text/plain;base64," + base64.StdEncoding.EncodeToString([]byte(src.Data)), nil
	case src.Type == "url":
		return src.URL, checkCallerURL(src.URL, what+".url")
	case src.Type == "file":
		return "", nil
	}
	return "", refuseInvalid("%s must be base64 data with a media_type, text, a url or a file", what)
}

// messagesContent is parts as blocks, tool results first and no empty text (the API requires both); a data URL is base64 data
// (text for text/plain), any other URL a url source; a custom tool's call is the one-string-member object (SPEC §7.6).
func messagesContent(ps []part) ([]messagesBlock, error) {
	var results, rest []messagesBlock
	for _, p := range ps {
		b, err := messagesBlock{Type: p.Type, Title: p.Filename}, error(nil)
		switch p.Type {
		case partText:
			if p.Text == "" {
				continue
			}
			b = messagesBlock{Type: "text", Text: &p.Text}
		case partToolCall:
			if p.Custom {
				p.Arguments = string(must(json.Marshal(map[string]string{"input": p.Arguments})))
			}
			b = messagesBlock{Type: "tool_use", ID: messagesToolID(p.ToolCallID), Name: p.ToolName}
			b.Input, err = toolArguments(p.Arguments)
		case partToolResult:
			b = messagesBlock{Type: "tool_result", ToolUseID: messagesToolID(p.ToolCallID), Content: jsonText(p.Text), IsError: p.IsError}
			if len(p.Media) > 0 { // images and documents: blocks
				var inner []messagesBlock
				inner, err = messagesContent(append([]part{{Type: partText, Text: p.Text}}, p.Media...))
				b.Content = must(json.Marshal(inner))
			}
		default:
			b.Source = &messagesSource{Type: "url", URL: p.ImageURL + p.FileURL}
			if rest, isData := strings.CutPrefix(b.Source.URL, "data:"); isData {
				meta, data, ok := strings.Cut(rest, ",")
				media, isBase64 := strings.CutSuffix(meta, ";base64")
				if !ok || !isBase64 || media == "" || data == "" {
					return nil, refuseInvalid("an image or file data URL must be base64 with a media type")
				}
				b.Source = &messagesSource{Type: "base64", MediaType: media, Data: data}
				if text, err := base64.StdEncoding.DecodeString(data); media == "text/plain" && err == nil {
					b.Source = &messagesSource{Type: "text", MediaType: media, Data: string(text)}
				}
			}
		}
		if err != nil {
			return nil, err
		}
		if b.Type == "tool_result" {
			results = append(results, b)
		} else {
			rest = append(rest, b)
		}
	}
	return append(results, rest...), nil
}

// encodeMessages builds a Messages body: claude-code's identity first, custom tools as functions (SPEC §7.6).
func encodeMessages(req chatRequest, model string, o upstreamOptions) (any, error) {
	out := messagesRequestBody{callerHead: req.head(model, o), StopSequences: req.Stop, Messages: []messagesTurn{}}
	if req.MaxTokens > 0 {
		out.MaxTokens = &req.MaxTokens
	}
	switch {
	case o.oauth:
		sys, _ := messagesContent([]part{{Type: partText, Text: claudeCodeIdentity}, {Type: partText, Text: req.System}})
		out.System = must(json.Marshal(sys))
	case req.System != "":
		out.System = jsonText(req.System)
	}
	for _, m := range req.Messages {
		if m.Role == "system" {
			out.Messages = append(out.Messages, messagesTurn{Role: "system", Content: jsonText(textOf(m.Parts))})
			continue
		}
		blocks, err := messagesContent(m.Parts)
		if err != nil {
			return nil, err
		}
		if len(blocks) > 0 { // only empty text: the API refuses an empty turn
			out.Messages = append(out.Messages, messagesTurn{Role: m.Role, Content: must(json.Marshal(blocks))})
		}
	}
	for _, t := range req.Tools {
		schema := t.Parameters
		if len(schema) == 0 {
			schema = emptySchema
		}
		if t.Kind == toolCustom { // the one-string-member function a custom tool becomes (SPEC §7.6)
			schema = json.RawMessage(`{"type":"object","properties":{"input":{"type":"string"}},"required":["input"]}`)
		}
		out.Tools = append(out.Tools, messagesTool{Name: t.Name, Description: t.Description, InputSchema: schema, Strict: t.Strict})
	}
	serial := req.ParallelToolCalls != nil && !*req.ParallelToolCalls && len(req.Tools) > 0
	if c := req.ToolChoice; c != nil || serial {
		out.ToolChoice = &messagesToolChoice{Type: "auto"}
		for typ, mode := range messagesChoices {
			if c != nil && c.Mode == mode {
				out.ToolChoice = &messagesToolChoice{Type: typ, Name: c.Name}
			}
		}
		if serial && out.ToolChoice.Type != "none" {
			out.ToolChoice.DisableParallelToolUse = ptrTo(true)
		}
	}
	var cfg messagesOutput
	if budget := req.thinkingBudget(); budget > 0 { // the API refuses temperature and top_p beside thinking
		out.Thinking, out.Temperature, out.TopP = &messagesThinking{Type: "enabled", BudgetTokens: budget}, nil, nil
		if req.adaptiveEffort(model) { // an effort, not a budget; Anthropic has no "minimal"
			out.Thinking, cfg.Effort = &messagesThinking{Type: "adaptive"}, strings.Replace(req.Effort, "minimal", "low", 1)
		}
	}
	if f := req.Output; f != nil {
		if f.Type != "json_schema" {
			return nil, refuseInvalid("structured output without a JSON Schema (JSON mode) cannot be expressed to an anthropic-messages provider; send a JSON Schema")
		}
		cfg.Format = &outputFormat{Type: f.Type, Schema: f.Schema}
	}
	if cfg != (messagesOutput{}) {
		out.OutputConfig = &cfg
	}
	return out, nil
}

// messagesToolID is a call id as Anthropic takes it (^[a-zA-Z0-9_-]+$): another
// provider's (kimi's "functions.f:0") with every other character "_", in a call and its result alike.
func messagesToolID(id string) string { return notToolID.ReplaceAllString(id, "_") }

var notToolID = regexp.MustCompile(`[^a-zA-Z0-9_-]`)

// toolArguments is a call's arguments as the JSON object anthropic embeds: empty is {}, anything but an object is refused, never approximated.
func toolArguments(args string) (json.RawMessage, error) {
	if strings.TrimSpace(args) == "" {
		return json.RawMessage(`{}`), nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(args)); err != nil || buf.Bytes()[0] != '{' {
		return nil, refuseInvalid("a tool call's arguments are not a JSON object")
	}
	return buf.Bytes(), nil
}

// thinkingBudget is the budget toward messages: below max_tokens, at least 1024, and
// 0 in a tool loop, where Anthropic wants back thinking blocks no format carries.
func (req chatRequest) thinkingBudget() int {
	budget := 0 // "none" and unknown names: no thinking
	for _, e := range effortBudgets {
		if e.effort == req.Effort {
			budget = e.budget
		}
	}
	if req.MaxTokens > 0 && budget >= req.MaxTokens {
		budget = req.MaxTokens - 1
	}
	for _, m := range slices.Backward(req.Messages) {
		if m.Role == "assistant" {
			if slices.ContainsFunc(m.Parts, func(p part) bool { return p.Type == partToolCall }) {
				return 0
			}
			break
		}
	}
	if budget < 1024 {
		return 0
	}
	return budget
}

// adaptiveModels: a Claude 4.6 or later model (claude-opus-4-7, claude-opus-5, claude-haiku-5-1) takes thinking as adaptive with
// output_config.effort and refuses a budget (Claude Code 2.1.332 decides so too); an earlier, dated (claude-opus-4-20250514) or unknown model takes a budget.
var adaptiveModels = regexp.MustCompile(`^claude-(?:opus|sonnet|haiku)-(?:0?[5-9]|[1-9]\d|0?4-(?:0?[6-9]|[1-9]\d))(?:-|$)`)

// adaptiveEffort: toward model, req's effort goes as output_config.effort and its beta, not a budget.
func (req chatRequest) adaptiveEffort(model string) bool {
	return req.thinkingBudget() > 0 && adaptiveModels.MatchString(model)
}

// usage is u in Brama's terms: Anthropic reports cached input apart, the neutral count (like OpenAI's prompt_tokens) includes it.
func (u *messagesUsage) usage() usage {
	return usage{InputTokens: u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens, OutputTokens: u.OutputTokens, Reported: true}
}

func messagesFinish(reason string) string { return cmp.Or(messagesFinishes[reason], finishStop) }

func messagesStopReason(f string) *string { return ptrTo(cmp.Or(messagesStopReasons[f], "end_turn")) }

func decodeMessages(body []byte) (chatAnswer, error) {
	var r messagesAnswer
	if err := json.Unmarshal(body, &r); err != nil || r.Type != "message" {
		return chatAnswer{}, malformedAnswer(protoAnthropic, err)
	}
	a := chatAnswer{Finish: messagesFinish(valueOr(r.StopReason, ""))}
	for _, b := range r.Content {
		switch {
		case b.Type == "text" && b.Text != nil:
			a.Text += *b.Text
		case b.Type == "tool_use" && b.Name == "":
			return chatAnswer{}, malformedAnswer(protoAnthropic, nil)
		case b.Type == "tool_use":
			args := bytes.NewBufferString("{}")
			if !rawIsNull(b.Input) {
				args.Reset()
				json.Compact(args, b.Input) // cannot fail: Input came out of the decoded body
			}
			a.ToolCalls = append(a.ToolCalls, toolCall{ID: b.ID, Name: b.Name, Arguments: args.String()})
		}
	}
	if r.Usage != nil {
		a.Usage = r.Usage.usage()
	}
	return a, nil
}

// renderMessages is the message the stream that would carry a builds; usage is always present (zeros when unreported): Anthropic's SDKs require it.
func renderMessages(req chatRequest, a chatAnswer) (any, error) {
	bw, err := wholeAnswerThrough(req, a, newMessagesCallerStream)
	return bw.(*messagesCallerStream).msg, err
}

// messagesCallerStream writes Anthropic's events a block at a time, keeping the message.
type messagesCallerStream struct {
	sse *callerStream
	msg messagesAnswer
}

func newMessagesCallerStream(sse *callerStream, _ chatRequest, model string) blockWriter {
	return &messagesCallerStream{sse: sse, msg: messagesAnswer{ID: newAnswerID("msg_"), Type: "message", Role: "assistant",
		Model: model, Content: []messagesBlock{}, Usage: &messagesUsage{}}}
}

func (s *messagesCallerStream) emit(ev messagesEvent) error { return s.sse.frame(ev.Type, ev) }

// begin writes message_start. Input tokens go out as 0 (providers report usage at the end) and for real in message_delta, which the SDKs take over.
func (s *messagesCallerStream) begin() error {
	m := s.msg
	return s.emit(messagesEvent{Type: "message_start", Message: &m})
}

func (s *messagesCallerStream) open(i int, b *streamBlock) error {
	cb := messagesBlock{Type: "text", Text: ptrTo("")}
	if !b.text {
		cb = messagesBlock{Type: "tool_use", ID: answerIDOr(b.id, "toolu_"), Name: b.name, Input: json.RawMessage(`{}`)}
	}
	s.msg.Content = append(s.msg.Content, cb)
	return s.emit(messagesEvent{Type: "content_block_start", Index: &i, ContentBlock: &cb})
}

// delta writes a text or input_json delta. The kept block is filled at its close, not per delta, and anew for a block closed (interleaved calls).
func (s *messagesCallerStream) delta(i int, b *streamBlock, d string) error {
	delta := &messagesDelta{Type: "text_delta", Text: &d}
	if !b.text {
		delta = &messagesDelta{Type: "input_json_delta", PartialJSON: &d}
	}
	if s.sse.open != i {
		s.keep(i, b)
	}
	return s.emit(messagesEvent{Type: "content_block_delta", Index: &i, Delta: delta})
}

func (s *messagesCallerStream) close(i int, b *streamBlock, _ string) error {
	if s.keep(i, b); !b.text && s.msg.Content[i].Input == nil { // {} would run the tool on nothing (SPEC §17)
		return refuse("provider_incomplete", "the provider's answer holds a tool call whose arguments are not a JSON object, which a tool_use input must be")
	}
	return s.emit(messagesEvent{Type: "content_block_stop", Index: &i})
}

// keep fills kept block i with b's whole text or arguments (nil until a JSON object).
func (s *messagesCallerStream) keep(i int, b *streamBlock) {
	if cb := &s.msg.Content[i]; b.text {
		cb.Text = ptrTo(b.buf.String())
	} else {
		cb.Input, _ = toolArguments(b.buf.String())
	}
}

func (s *messagesCallerStream) finishNow(string) error { return nil }

func (s *messagesCallerStream) end(finish string, u usage) error {
	s.msg.StopReason = messagesStopReason(answerFinish(finish))
	s.msg.Usage = &messagesUsage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens}
	err := s.emit(messagesEvent{Type: "message_delta", Delta: &messagesDelta{StopReason: *s.msg.StopReason, StopSequence: json.RawMessage("null")}, Usage: s.msg.Usage})
	if err != nil {
		return err
	}
	return s.emit(messagesEvent{Type: "message_stop"})
}

func (s *messagesCallerStream) fail(e *apiError) error {
	return s.emit(messagesEvent{Type: "error", Error: must(json.Marshal(e.body().Error))})
}
