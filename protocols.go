package main

import (
	"bytes"
	"encoding/json"
	"strings"
)

// This file holds the three provider protocols' request bodies and buffered
// answers (SPEC §6.2, §7.6). Streams are in sse.go.

// emptySchema stands in for a tool without parameters where the protocol
// requires a schema (anthropic input_schema, responses parameters).
var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// toolArguments is a tool call's arguments as JSON for protocols that embed
// them as an object (anthropic tool_use input). Empty means no arguments;
// anything that is not a JSON object is refused, never approximated.
func toolArguments(args string) (json.RawMessage, error) {
	if strings.TrimSpace(args) == "" {
		return json.RawMessage(`{}`), nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(args)); err != nil || buf.Bytes()[0] != '{' {
		return nil, refuse("invalid_request", "a tool call's arguments are not a JSON object")
	}
	return buf.Bytes(), nil
}

// argumentsText is a tool call's arguments as JSON text for protocols that
// carry them as a string; empty arguments become "{}".
func argumentsText(args string) string {
	if strings.TrimSpace(args) == "" {
		return "{}"
	}
	return args
}

// ---- openai-chat ----

type oaChatRequest struct {
	Model         string           `json:"model"`
	Messages      []oaMessage      `json:"messages"`
	Tools         []oaTool         `json:"tools,omitempty"`
	ToolChoice    any              `json:"tool_choice,omitempty"`
	MaxTokens     int              `json:"max_tokens,omitempty"`
	Temperature   *float64         `json:"temperature,omitempty"`
	Stream        bool             `json:"stream,omitempty"`
	StreamOptions *oaStreamOptions `json:"stream_options,omitempty"`
}

type oaStreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type oaMessage struct {
	Role       string       `json:"role"`
	Content    any          `json:"content"` // string, []oaContentPart, or nil beside tool calls
	ToolCalls  []oaToolCall `json:"tool_calls,omitempty"`
	ToolCallID string       `json:"tool_call_id,omitempty"`
}

type oaContentPart struct {
	Type     string      `json:"type"`
	Text     string      `json:"text,omitempty"`
	ImageURL *oaImageURL `json:"image_url,omitempty"`
}

type oaImageURL struct {
	URL string `json:"url"`
}

type oaToolCall struct {
	ID       string         `json:"id"`
	Type     string         `json:"type"`
	Function oaFunctionCall `json:"function"`
}

type oaFunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type oaTool struct {
	Type     string        `json:"type"`
	Function oaFunctionDef `json:"function"`
}

type oaFunctionDef struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// encodeOpenAIChat builds a Chat Completions body. Tool results leave their
// user message as role "tool" messages placed first, since they must follow
// the assistant turn that called them.
func encodeOpenAIChat(req chatRequest, model string, stream bool) (oaChatRequest, error) {
	out := oaChatRequest{Model: model, MaxTokens: req.MaxTokens, Temperature: req.Temperature, Stream: stream}
	if stream {
		out.StreamOptions = &oaStreamOptions{IncludeUsage: true}
	}
	if req.System != "" {
		out.Messages = append(out.Messages, oaMessage{Role: "system", Content: req.System})
	}
	for _, m := range req.Messages {
		var (
			text  []string
			parts []oaContentPart
			calls []oaToolCall
			image bool
		)
		for _, p := range m.Parts {
			switch p.Type {
			case partText:
				text = append(text, p.Text)
				parts = append(parts, oaContentPart{Type: "text", Text: p.Text})
			case partImage:
				image = true
				parts = append(parts, oaContentPart{Type: "image_url", ImageURL: &oaImageURL{URL: p.ImageURL}})
			case partToolCall:
				calls = append(calls, oaToolCall{ID: p.ToolCallID, Type: "function",
					Function: oaFunctionCall{Name: p.ToolName, Arguments: argumentsText(p.Arguments)}})
			case partToolResult:
				out.Messages = append(out.Messages, oaMessage{Role: "tool", ToolCallID: p.ToolCallID, Content: p.Text})
			}
		}
		msg := oaMessage{Role: m.Role, ToolCalls: calls}
		switch {
		case m.Role == "assistant" && len(text) > 0:
			msg.Content = strings.Join(text, "")
		case image || len(text) > 1:
			msg.Content = parts
		case len(text) == 1:
			msg.Content = text[0]
		case len(calls) == 0:
			continue // only tool results: already sent as role "tool"
		}
		out.Messages = append(out.Messages, msg)
	}
	for _, t := range req.Tools {
		out.Tools = append(out.Tools, oaTool{Type: "function",
			Function: oaFunctionDef{Name: t.Name, Description: t.Description, Parameters: t.Parameters}})
	}
	if c := req.ToolChoice; c != nil {
		if c.Mode == toolChoiceTool {
			out.ToolChoice = map[string]any{"type": "function", "function": map[string]string{"name": c.Name}}
		} else {
			out.ToolChoice = c.Mode
		}
	}
	return out, nil
}

type oaUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

func (u *oaUsage) neutral() usage {
	if u == nil {
		return usage{}
	}
	return usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, Reported: true}
}

// chatFinish maps a Chat Completions finish_reason to the neutral one.
func chatFinish(r string) string {
	switch r {
	case finishLength, "model_length":
		return finishLength
	case finishToolCalls, "function_call":
		return finishToolCalls
	case finishContentFilter:
		return finishContentFilter
	}
	return finishStop
}

// chatContentText reads message content as a string, null, or an array of
// {"type":"text","text":…} parts (some compatible providers send that).
func chatContentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if s, ok := jsonString(raw); ok {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", err
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

// decodeOpenAIChat reads a complete Chat Completions answer.
func decodeOpenAIChat(body []byte) (chatAnswer, error) {
	var r struct {
		Choices []struct {
			Message struct {
				Content   json.RawMessage `json:"content"`
				ToolCalls []oaToolCall    `json:"tool_calls"`
			} `json:"message"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *oaUsage        `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return chatAnswer{}, malformedAnswer(protoOpenAIChat, err)
	}
	if len(r.Choices) == 0 || (len(r.Error) > 0 && string(r.Error) != "null") {
		return chatAnswer{}, malformedAnswer(protoOpenAIChat, nil)
	}
	c := r.Choices[0]
	text, err := chatContentText(c.Message.Content)
	if err != nil {
		return chatAnswer{}, malformedAnswer(protoOpenAIChat, err)
	}
	a := chatAnswer{Text: text, Usage: r.Usage.neutral(), Finish: finishStop}
	for _, tc := range c.Message.ToolCalls {
		if tc.Function.Name == "" {
			return chatAnswer{}, malformedAnswer(protoOpenAIChat, nil)
		}
		a.ToolCalls = append(a.ToolCalls, toolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	if c.FinishReason != nil && *c.FinishReason != "" {
		a.Finish = chatFinish(*c.FinishReason)
	} else if len(a.ToolCalls) > 0 {
		a.Finish = finishToolCalls
	}
	return a, nil
}

// ---- anthropic-messages ----

type anRequest struct {
	Model       string        `json:"model"`
	MaxTokens   int           `json:"max_tokens,omitempty"`
	System      any           `json:"system,omitempty"` // string, or blocks for claude-code
	Messages    []anMessage   `json:"messages"`
	Tools       []anTool      `json:"tools,omitempty"`
	ToolChoice  *anToolChoice `json:"tool_choice,omitempty"`
	Temperature *float64      `json:"temperature,omitempty"`
	Stream      bool          `json:"stream,omitempty"`
}

type anMessage struct {
	Role    string    `json:"role"`
	Content []anBlock `json:"content"`
}

type anBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	Source    *anSource       `json:"source,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   string          `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
}

type anSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

type anTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type anToolChoice struct {
	Type string `json:"type"`
	Name string `json:"name,omitempty"`
}

// anthropicImage turns a neutral image URL into an image source: a data
// URL becomes base64 data with its media type, anything else a url source.
func anthropicImage(u string) (*anSource, error) {
	rest, ok := strings.CutPrefix(u, "data:")
	if !ok {
		return &anSource{Type: "url", URL: u}, nil
	}
	meta, data, ok := strings.Cut(rest, ",")
	media, isBase64 := strings.CutSuffix(meta, ";base64")
	if !ok || !isBase64 || media == "" || data == "" {
		return nil, refuse("invalid_request", "an image data URL must be base64 with a media type")
	}
	return &anSource{Type: "base64", MediaType: media, Data: data}, nil
}

// encodeAnthropic builds a Messages body. Tool results go first in their
// user message, as the API requires; empty text parts are dropped because
// the API refuses empty text blocks. oauth selects claude-code's system
// prompt, whose first block must be claudeCodeIdentity.
func encodeAnthropic(req chatRequest, model string, stream, oauth bool) (anRequest, error) {
	out := anRequest{Model: model, MaxTokens: req.MaxTokens, Temperature: req.Temperature, Stream: stream}
	switch {
	case oauth:
		sys := []anBlock{{Type: "text", Text: claudeCodeIdentity}}
		if req.System != "" {
			sys = append(sys, anBlock{Type: "text", Text: req.System})
		}
		out.System = sys
	case req.System != "":
		out.System = req.System
	}
	out.Messages = []anMessage{}
	for _, m := range req.Messages {
		var results, rest []anBlock
		for _, p := range m.Parts {
			switch p.Type {
			case partText:
				if p.Text != "" {
					rest = append(rest, anBlock{Type: "text", Text: p.Text})
				}
			case partImage:
				src, err := anthropicImage(p.ImageURL)
				if err != nil {
					return anRequest{}, err
				}
				rest = append(rest, anBlock{Type: "image", Source: src})
			case partToolCall:
				in, err := toolArguments(p.Arguments)
				if err != nil {
					return anRequest{}, err
				}
				rest = append(rest, anBlock{Type: "tool_use", ID: p.ToolCallID, Name: p.ToolName, Input: in})
			case partToolResult:
				results = append(results, anBlock{Type: "tool_result", ToolUseID: p.ToolCallID, Content: p.Text, IsError: p.IsError})
			}
		}
		out.Messages = append(out.Messages, anMessage{Role: m.Role, Content: append(results, rest...)})
	}
	for _, t := range req.Tools {
		schema := t.Parameters
		if len(schema) == 0 {
			schema = emptySchema
		}
		out.Tools = append(out.Tools, anTool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	if c := req.ToolChoice; c != nil {
		switch c.Mode {
		case toolChoiceAuto:
			out.ToolChoice = &anToolChoice{Type: "auto"}
		case toolChoiceNone:
			out.ToolChoice = &anToolChoice{Type: "none"}
		case toolChoiceRequired:
			out.ToolChoice = &anToolChoice{Type: "any"}
		case toolChoiceTool:
			out.ToolChoice = &anToolChoice{Type: "tool", Name: c.Name}
		}
	}
	return out, nil
}

type anUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// input counts every input token: Anthropic reports cached ones apart, the
// neutral count (like OpenAI's prompt_tokens) includes them.
func (u anUsage) input() int {
	return u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
}

// anthropicFinish maps a stop_reason to the neutral finish.
func anthropicFinish(r string) string {
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

// decodeAnthropic reads a complete Messages answer.
func decodeAnthropic(body []byte) (chatAnswer, error) {
	var r struct {
		Type    string `json:"type"`
		Content []struct {
			Type  string          `json:"type"`
			Text  string          `json:"text"`
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		} `json:"content"`
		StopReason string   `json:"stop_reason"`
		Usage      *anUsage `json:"usage"`
	}
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
			text.WriteString(b.Text)
		case "tool_use":
			args := "{}"
			if len(b.Input) > 0 && string(b.Input) != "null" {
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
	a.Finish = anthropicFinish(r.StopReason)
	if u := r.Usage; u != nil {
		a.Usage = usage{InputTokens: u.input(), OutputTokens: u.OutputTokens, Reported: true}
	}
	return a, nil
}

// ---- openai-responses ----

type rsRequest struct {
	Model           string   `json:"model"`
	Instructions    string   `json:"instructions,omitempty"`
	Input           []rsItem `json:"input"`
	Tools           []rsTool `json:"tools,omitempty"`
	ToolChoice      any      `json:"tool_choice,omitempty"`
	MaxOutputTokens int      `json:"max_output_tokens,omitempty"`
	Temperature     *float64 `json:"temperature,omitempty"`
	Stream          bool     `json:"stream,omitempty"`
	Store           *bool    `json:"store,omitempty"`
}

type rsItem struct {
	Type      string      `json:"type"`
	Role      string      `json:"role,omitempty"`
	Content   []rsContent `json:"content,omitempty"`
	CallID    string      `json:"call_id,omitempty"`
	Name      string      `json:"name,omitempty"`
	Arguments string      `json:"arguments,omitempty"`
	Output    *string     `json:"output,omitempty"`
}

type rsContent struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	ImageURL string `json:"image_url,omitempty"`
}

type rsTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      bool            `json:"strict"` // the API defaults to strict schemas; callers' schemas are not
}

// encodeResponses builds a Responses body. A message's parts keep their
// order: text and images gather into message items, tool calls and tool
// results become items of their own. codex gets SPEC §6.2's body: default
// instructions, stream and store false, and never max_output_tokens or
// temperature, which its backend refuses.
func encodeResponses(req chatRequest, model string, stream, codex bool) (rsRequest, error) {
	out := rsRequest{Model: model, Instructions: req.System, Stream: stream, Input: []rsItem{}}
	if codex {
		f := false
		out.Store = &f
		if out.Instructions == "" {
			out.Instructions = codexDefaultInstructions
		}
	} else {
		out.MaxOutputTokens = req.MaxTokens
		out.Temperature = req.Temperature
	}
	for _, m := range req.Messages {
		var content []rsContent
		flush := func() {
			if len(content) > 0 {
				out.Input = append(out.Input, rsItem{Type: "message", Role: m.Role, Content: content})
				content = nil
			}
		}
		textType := "input_text"
		if m.Role == "assistant" {
			textType = "output_text"
		}
		for _, p := range m.Parts {
			switch p.Type {
			case partText:
				if p.Text != "" {
					content = append(content, rsContent{Type: textType, Text: p.Text})
				}
			case partImage:
				content = append(content, rsContent{Type: "input_image", ImageURL: p.ImageURL})
			case partToolCall:
				flush()
				out.Input = append(out.Input, rsItem{Type: "function_call", CallID: p.ToolCallID, Name: p.ToolName, Arguments: argumentsText(p.Arguments)})
			case partToolResult:
				flush()
				result := p.Text
				out.Input = append(out.Input, rsItem{Type: "function_call_output", CallID: p.ToolCallID, Output: &result})
			}
		}
		flush()
	}
	for _, t := range req.Tools {
		schema := t.Parameters
		if len(schema) == 0 {
			schema = emptySchema
		}
		out.Tools = append(out.Tools, rsTool{Type: "function", Name: t.Name, Description: t.Description, Parameters: schema})
	}
	if c := req.ToolChoice; c != nil {
		if c.Mode == toolChoiceTool {
			out.ToolChoice = map[string]string{"type": "function", "name": c.Name}
		} else {
			out.ToolChoice = c.Mode
		}
	}
	return out, nil
}

// rsOutputItem is one item of a response's output.
type rsOutputItem struct {
	Type    string `json:"type"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// text is a message item's output text.
func (it rsOutputItem) text() string {
	var b strings.Builder
	for _, c := range it.Content {
		if c.Type == "output_text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// rsResponse is a response object, buffered or inside response.completed.
type rsResponse struct {
	Status            string         `json:"status"`
	Output            []rsOutputItem `json:"output"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Usage *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// finish is the neutral finish of a response that made tool calls or not.
func (r rsResponse) finish(toolCalls bool) string {
	if d := r.IncompleteDetails; d != nil {
		switch d.Reason {
		case "max_output_tokens":
			return finishLength
		case "content_filter":
			return finishContentFilter
		}
	}
	if toolCalls {
		return finishToolCalls
	}
	return finishStop
}

func (r rsResponse) usage() usage {
	if r.Usage == nil {
		return usage{}
	}
	return usage{InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens, Reported: true}
}

// decodeResponses reads a complete Responses answer: text from message
// items and tool calls from function_call items, in output order.
func decodeResponses(body []byte) (chatAnswer, error) {
	var r rsResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return chatAnswer{}, malformedAnswer(protoOpenAIResponses, err)
	}
	if r.Status != "completed" && r.Status != "incomplete" {
		return chatAnswer{}, malformedAnswer(protoOpenAIResponses, nil)
	}
	var a chatAnswer
	var text strings.Builder
	for _, it := range r.Output {
		switch it.Type {
		case "message":
			text.WriteString(it.text())
		case "function_call":
			if it.Name == "" {
				return chatAnswer{}, malformedAnswer(protoOpenAIResponses, nil)
			}
			a.ToolCalls = append(a.ToolCalls, toolCall{ID: it.CallID, Name: it.Name, Arguments: argumentsText(it.Arguments)})
		}
	}
	a.Text = text.String()
	a.Finish = r.finish(len(a.ToolCalls) > 0)
	a.Usage = r.usage()
	return a, nil
}

// decodeUpstreamAnswer decodes a complete 2xx non-stream body. Model is
// left for the dispatcher, which reports what SPEC §7.6 says.
func decodeUpstreamAnswer(protocol string, body []byte) (chatAnswer, error) {
	switch protocol {
	case protoOpenAIChat:
		return decodeOpenAIChat(body)
	case protoAnthropic:
		return decodeAnthropic(body)
	case protoOpenAIResponses:
		return decodeResponses(body)
	}
	return chatAnswer{}, refuse("provider_failure", "unknown provider protocol %q", protocol)
}

// malformedAnswer is the refusal for a 2xx body that is not the protocol's
// answer. The body itself is never quoted.
func malformedAnswer(protocol string, cause error) *apiError {
	e := refuse("provider_failure", "the provider answered with a malformed %s body", protocol)
	if cause != nil {
		e = e.because(cause)
	}
	return e
}
