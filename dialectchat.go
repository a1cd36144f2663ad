package main

import (
	"encoding/json"
	"fmt"
	"time"
)

// OpenAI Chat Completions (POST /v1/chat/completions): the request parser,
// the buffered chat.completion answer and the chunk stream.

// Chat Completions request shapes. Members Brama does not read are not
// declared, so they are dropped.
type (
	callerChatBody struct {
		Model               string              `json:"model"`
		Messages            []callerChatMessage `json:"messages"`
		Tools               []callerChatTool    `json:"tools"`
		ToolChoice          json.RawMessage     `json:"tool_choice"`
		MaxTokens           *int                `json:"max_tokens"`
		MaxCompletionTokens *int                `json:"max_completion_tokens"`
		Temperature         *float64            `json:"temperature"`
		Stream              bool                `json:"stream"`
		BillingTarget       json.RawMessage     `json:"billingTarget"`
	}
	callerChatMessage struct {
		Role       string               `json:"role"`
		Content    json.RawMessage      `json:"content"`
		ToolCalls  []callerChatToolCall `json:"tool_calls"`
		ToolCallID string               `json:"tool_call_id"`
	}
	callerChatPart struct {
		Type     string          `json:"type"`
		Text     *string         `json:"text"`
		ImageURL json.RawMessage `json:"image_url"`
	}
	callerChatTool struct {
		Type     string `json:"type"`
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
)

// parseChatCompletions parses an OpenAI Chat Completions request body.
func parseChatCompletions(body []byte) (chatRequest, error) {
	var b callerChatBody
	if err := decodeCallerJSON(body, &b, ""); err != nil {
		return chatRequest{}, err
	}
	req, err := newCallerRequest(b.Model, b.Temperature, b.Stream, "max_tokens", b.MaxTokens, b.BillingTarget)
	if err != nil {
		return chatRequest{}, err
	}
	if b.MaxCompletionTokens != nil { // the newer name wins when both are sent
		if req.MaxTokens, err = checkCallerMaxTokens("max_completion_tokens", b.MaxCompletionTokens); err != nil {
			return chatRequest{}, err
		}
	}
	for i, m := range b.Messages {
		what := fmt.Sprintf("messages[%d]", i)
		switch m.Role {
		case "system", "developer":
			text, err := callerTextOf(m.Content, what+".content", "text", "\n\n")
			if err != nil {
				return chatRequest{}, err
			}
			req.System = joinSystemText(req.System, text)
		case "user":
			parts, err := callerChatUserParts(m.Content, what+".content")
			if err != nil {
				return chatRequest{}, err
			}
			req.Messages = append(req.Messages, message{Role: "user", Parts: parts})
		case "assistant":
			msg, err := callerChatAssistant(m, what)
			if err != nil {
				return chatRequest{}, err
			}
			req.Messages = append(req.Messages, msg)
		case "tool":
			if m.ToolCallID == "" {
				return chatRequest{}, refuseInvalid("%s.tool_call_id is required", what)
			}
			text, err := callerTextOf(m.Content, what+".content", "text", "\n")
			if err != nil {
				return chatRequest{}, err
			}
			req.Messages = appendCallerToolResult(req.Messages, part{Type: partToolResult, ToolCallID: m.ToolCallID, Text: text})
		default:
			return chatRequest{}, refuseInvalid("%s.role %s is not one of system, developer, user, assistant, tool", what, quoteCallerToken(m.Role))
		}
	}
	if len(req.Messages) == 0 {
		return chatRequest{}, refuseInvalid("messages must hold at least one user, assistant or tool message")
	}
	for i, t := range b.Tools {
		what := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return chatRequest{}, refuseInvalid("%s.type must be \"function\"", what)
		}
		if t.Function.Name == "" {
			return chatRequest{}, refuseInvalid("%s.function.name is required", what)
		}
		params, err := parseCallerSchema(t.Function.Parameters, what+".function.parameters")
		if err != nil {
			return chatRequest{}, err
		}
		req.Tools = append(req.Tools, tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: params})
	}
	if req.ToolChoice, err = callerOpenAIToolChoice(b.ToolChoice, true); err != nil {
		return chatRequest{}, err
	}
	return req, nil
}

// callerChatUserParts reads a user message's content: a string or an array of
// text and image_url parts.
func callerChatUserParts(raw json.RawMessage, what string) ([]part, error) {
	text, cps, err := callerContent[callerChatPart](raw, what, "content parts")
	if err != nil || text != nil {
		return text, err
	}
	if len(cps) == 0 {
		return nil, refuseInvalid("%s must not be empty", what)
	}
	parts := make([]part, 0, len(cps))
	for i, cp := range cps {
		pw := fmt.Sprintf("%s[%d]", what, i)
		switch cp.Type {
		case "text":
			if cp.Text == nil {
				return nil, refuseInvalid("%s.text is required", pw)
			}
			parts = append(parts, part{Type: partText, Text: *cp.Text})
		case "image_url":
			var img struct {
				URL string `json:"url"`
			}
			if rawShape(cp.ImageURL) != '{' {
				return nil, refuseInvalid("%s.image_url must be an object with a url", pw)
			}
			if err := decodeCallerJSON(cp.ImageURL, &img, pw+".image_url"); err != nil {
				return nil, err
			}
			if err := checkCallerImageURL(img.URL, pw+".image_url.url"); err != nil {
				return nil, err
			}
			parts = append(parts, part{Type: partImage, ImageURL: img.URL})
		default:
			return nil, refuseInvalid("%s.type %s is not supported (text or image_url)", pw, quoteCallerToken(cp.Type))
		}
	}
	return parts, nil
}

// callerChatAssistant reads an assistant turn: content (string, text parts, or
// null when tool_calls are present) followed by its tool calls. Refusal
// parts of an earlier answer are dropped: the neutral request has no place
// for them.
func callerChatAssistant(m callerChatMessage, what string) (message, error) {
	msg := message{Role: "assistant"}
	switch rawShape(m.Content) {
	case 0, 'n':
		if !rawIsNull(m.Content) {
			return message{}, refuseInvalid("%s.content is malformed", what)
		}
	case '"':
		var s string
		if err := decodeCallerJSON(m.Content, &s, what+".content"); err != nil {
			return message{}, err
		}
		if s != "" || len(m.ToolCalls) == 0 {
			msg.Parts = append(msg.Parts, part{Type: partText, Text: s})
		}
	case '[':
		var cps []callerChatPart
		if err := decodeCallerJSON(m.Content, &cps, what+".content"); err != nil {
			return message{}, err
		}
		for i, cp := range cps {
			switch {
			case cp.Type == "text" && cp.Text != nil:
				msg.Parts = append(msg.Parts, part{Type: partText, Text: *cp.Text})
			case cp.Type == "refusal":
			default:
				return message{}, refuseInvalid("%s.content[%d] must be a text or refusal part", what, i)
			}
		}
	default:
		return message{}, refuseInvalid("%s.content must be a string, an array of parts or null", what)
	}
	for i, tc := range m.ToolCalls {
		tw := fmt.Sprintf("%s.tool_calls[%d]", what, i)
		if tc.Type != "" && tc.Type != "function" {
			return message{}, refuseInvalid("%s.type must be \"function\"", tw)
		}
		if tc.ID == "" || tc.Function.Name == "" {
			return message{}, refuseInvalid("%s needs an id and a function.name", tw)
		}
		msg.Parts = append(msg.Parts, part{Type: partToolCall, ToolCallID: tc.ID, ToolName: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	if len(msg.Parts) == 0 {
		return message{}, refuseInvalid("%s needs content or tool_calls", what)
	}
	return msg, nil
}

// callerOpenAIToolChoice reads tool_choice as both OpenAI dialects send it: a
// mode string, or an object naming one function, nested under "function"
// in Chat Completions (nested) and flat in Responses.
func callerOpenAIToolChoice(raw json.RawMessage, nested bool) (*toolChoice, error) {
	switch rawShape(raw) {
	case 0, 'n':
		if !rawIsNull(raw) {
			return nil, refuseInvalid("tool_choice is malformed")
		}
		return nil, nil
	case '"':
		var s string
		if err := decodeCallerJSON(raw, &s, "tool_choice"); err != nil {
			return nil, err
		}
		switch s {
		case "auto":
			return &toolChoice{Mode: toolChoiceAuto}, nil
		case "none":
			return &toolChoice{Mode: toolChoiceNone}, nil
		case "required":
			return &toolChoice{Mode: toolChoiceRequired}, nil
		}
		return nil, refuseInvalid("tool_choice must be \"auto\", \"none\", \"required\" or a function")
	case '{':
		var tc struct {
			Type     string `json:"type"`
			Name     string `json:"name"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := decodeCallerJSON(raw, &tc, "tool_choice"); err != nil {
			return nil, err
		}
		name := tc.Name
		if nested {
			name = tc.Function.Name
		}
		if tc.Type != "function" || name == "" {
			return nil, refuseInvalid("tool_choice must name a function: {\"type\":\"function\",…}")
		}
		return &toolChoice{Mode: toolChoiceTool, Name: name}, nil
	}
	return nil, refuseInvalid("tool_choice must be a string or an object")
}

// Chat Completions wire shapes shared by the buffered answer and the stream.
type (
	callerChatUsage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
	callerChatToolCall struct {
		Index    *int               `json:"index,omitempty"` // stream deltas only
		ID       string             `json:"id,omitempty"`
		Type     string             `json:"type,omitempty"`
		Function callerChatFunction `json:"function"`
	}
	callerChatFunction struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
)

func callerChatUsageOf(u usage) *callerChatUsage {
	return &callerChatUsage{u.InputTokens, u.OutputTokens, u.InputTokens + u.OutputTokens}
}

// callerChatCompletion is the chat.completion object for a. content is null when
// the answer is only tool calls, as OpenAI sends it; usage is left out when
// the provider reported none rather than invented as zeros.
func callerChatCompletion(a chatAnswer) any {
	type msg struct {
		Role      string               `json:"role"`
		Content   *string              `json:"content"`
		ToolCalls []callerChatToolCall `json:"tool_calls,omitempty"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Message      msg     `json:"message"`
		Logprobs     *string `json:"logprobs"`
		FinishReason string  `json:"finish_reason"`
	}
	m := msg{Role: "assistant"}
	if a.Text != "" || len(a.ToolCalls) == 0 {
		m.Content = &a.Text
	}
	for _, tc := range a.ToolCalls {
		m.ToolCalls = append(m.ToolCalls, callerChatToolCall{
			ID: answerIDOr(tc.ID, "call_"), Type: "function",
			Function: callerChatFunction{Name: tc.Name, Arguments: tc.Arguments},
		})
	}
	out := struct {
		ID      string           `json:"id"`
		Object  string           `json:"object"`
		Created int64            `json:"created"`
		Model   string           `json:"model"`
		Choices []choice         `json:"choices"`
		Usage   *callerChatUsage `json:"usage,omitempty"`
	}{
		ID: newAnswerID("chatcmpl-"), Object: "chat.completion", Created: time.Now().Unix(), Model: a.Model,
		Choices: []choice{{Message: m, FinishReason: answerFinish(a.Finish)}},
	}
	if a.Usage.Reported {
		out.Usage = callerChatUsageOf(a.Usage)
	}
	return out
}

// callerChatStream writes chat.completion.chunk frames.
type callerChatStream struct {
	sse        callerSSE
	id         string
	created    int64
	model      string
	started    bool
	finishSent bool
	tail       callerStreamTail
}

type (
	callerChatChunk struct {
		ID      string                  `json:"id"`
		Object  string                  `json:"object"`
		Created int64                   `json:"created"`
		Model   string                  `json:"model"`
		Choices []callerChatChoiceDelta `json:"choices"`
		Usage   *callerChatUsage        `json:"usage,omitempty"`
	}
	callerChatChoiceDelta struct {
		Index        int             `json:"index"`
		Delta        callerChatDelta `json:"delta"`
		Logprobs     *string         `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	}
	callerChatDelta struct {
		Role      string               `json:"role,omitempty"`
		Content   *string              `json:"content,omitempty"`
		ToolCalls []callerChatToolCall `json:"tool_calls,omitempty"`
	}
)

// chunk writes one chunk with a single choice.
func (s *callerChatStream) chunk(d callerChatDelta, finish *string) error {
	return s.sse.frame("", callerChatChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model,
		Choices: []callerChatChoiceDelta{{Delta: d, FinishReason: finish}}})
}

// start writes the role delta chunk. Every method starts the stream when
// it has not started, so a stream is well-formed however dispatch drives it.
func (s *callerChatStream) start() error {
	if s.started {
		return nil
	}
	s.started = true
	empty := ""
	return s.chunk(callerChatDelta{Role: "assistant", Content: &empty}, nil)
}

// event writes a content or tool-call delta chunk. The finish chunk goes
// out as soon as the finish event arrives; usage waits for finish().
func (s *callerChatStream) event(ev streamEvent) error {
	if s.sse.done {
		return errCallerStreamDone
	}
	if err := s.start(); err != nil {
		return err
	}
	if s.tail.record(ev) {
		if ev.Kind == eventFinish {
			return s.sendFinish()
		}
		return nil
	}
	idx := ev.Index
	switch ev.Kind {
	case eventText:
		if ev.Text == "" {
			return nil
		}
		return s.chunk(callerChatDelta{Content: &ev.Text}, nil)
	case eventToolCallStart:
		return s.chunk(callerChatDelta{ToolCalls: []callerChatToolCall{{Index: &idx, ID: answerIDOr(ev.ToolCall.ID, "call_"),
			Type: "function", Function: callerChatFunction{Name: ev.ToolCall.Name}}}}, nil)
	case eventToolCallArgs:
		if ev.Text == "" {
			return nil
		}
		return s.chunk(callerChatDelta{ToolCalls: []callerChatToolCall{{Index: &idx, Function: callerChatFunction{Arguments: ev.Text}}}}, nil)
	}
	return unknownStreamEvent(ev)
}

// sendFinish writes the chunk carrying finish_reason, once.
func (s *callerChatStream) sendFinish() error {
	if s.finishSent {
		return nil
	}
	s.finishSent = true
	f := answerFinish(s.tail.finish)
	return s.chunk(callerChatDelta{}, &f)
}

// finish writes the finish chunk if the finish event did not, the usage
// chunk (choices: []) when usage was reported, then [DONE].
func (s *callerChatStream) finish() error {
	if err := s.sse.end(); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	if err := s.sendFinish(); err != nil {
		return err
	}
	if s.tail.usage.Reported {
		err := s.sse.frame("", callerChatChunk{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model,
			Choices: []callerChatChoiceDelta{}, Usage: callerChatUsageOf(s.tail.usage)})
		if err != nil {
			return err
		}
	}
	return s.sse.write("data: [DONE]\n\n")
}

// fail writes the envelope of SPEC §8.1 as a final data frame.
func (s *callerChatStream) fail(e *apiError) error {
	if err := s.sse.end(); err != nil {
		return err
	}
	return s.sse.frame("", e.body())
}

func (s *callerChatStream) keepAlive() error { return s.sse.keepAlive() }
