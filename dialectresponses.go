package main

import (
	"encoding/json"
	"fmt"
	"strings"
)

// OpenAI Responses (POST /v1/responses): the request parser, the buffered
// response answer and the event stream.

// OpenAI Responses request shapes. Members Brama does not read (store,
// previous_response_id, reasoning, text, include, …) are not declared, so
// they are dropped.
type (
	callerResponsesBody struct {
		Model           string                `json:"model"`
		Instructions    *string               `json:"instructions"`
		Input           json.RawMessage       `json:"input"`
		Tools           []callerResponsesTool `json:"tools"`
		ToolChoice      json.RawMessage       `json:"tool_choice"`
		MaxOutputTokens *int                  `json:"max_output_tokens"`
		Temperature     *float64              `json:"temperature"`
		Stream          bool                  `json:"stream"`
		BillingTarget   json.RawMessage       `json:"billingTarget"`
	}
	callerResponsesItem struct {
		Type      string          `json:"type"`
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		CallID    string          `json:"call_id"`
		Name      string          `json:"name"`
		Arguments string          `json:"arguments"`
		Output    json.RawMessage `json:"output"`
	}
	callerResponsesPart struct {
		Type     string  `json:"type"`
		Text     *string `json:"text"`
		ImageURL *string `json:"image_url"`
	}
	callerResponsesTool struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	}
)

// parseResponses parses an OpenAI Responses request body. Input items
// become neutral turns: message items are turns of their own, a
// function_call joins the assistant turn before it, and consecutive
// function_call_output items are one user turn of tool results.
func parseResponses(body []byte) (chatRequest, error) {
	var b callerResponsesBody
	if err := decodeCallerJSON(body, &b, ""); err != nil {
		return chatRequest{}, err
	}
	req, err := newCallerRequest(b.Model, b.Temperature, b.Stream, "max_output_tokens", b.MaxOutputTokens, b.BillingTarget)
	if err != nil {
		return chatRequest{}, err
	}
	if b.Instructions != nil {
		req.System = *b.Instructions
	}
	switch rawShape(b.Input) {
	case '"':
		var s string
		if err := decodeCallerJSON(b.Input, &s, "input"); err != nil {
			return chatRequest{}, err
		}
		if s == "" {
			return chatRequest{}, refuseInvalid("input must not be empty")
		}
		req.Messages = []message{{Role: "user", Parts: []part{{Type: partText, Text: s}}}}
	case '[':
		var items []callerResponsesItem
		if err := decodeCallerJSON(b.Input, &items, "input"); err != nil {
			return chatRequest{}, err
		}
		for i, it := range items {
			if err := addCallerResponsesItem(&req, it, fmt.Sprintf("input[%d]", i)); err != nil {
				return chatRequest{}, err
			}
		}
		if len(req.Messages) == 0 {
			return chatRequest{}, refuseInvalid("input must hold at least one user, assistant or tool item")
		}
	default:
		return chatRequest{}, refuseInvalid("input is required: a string or an array of items")
	}
	for i, t := range b.Tools {
		what := fmt.Sprintf("tools[%d]", i)
		if t.Type != "function" {
			return chatRequest{}, refuseInvalid("%s.type must be \"function\" (built-in tools are not supported)", what)
		}
		if t.Name == "" {
			return chatRequest{}, refuseInvalid("%s.name is required", what)
		}
		params, err := parseCallerSchema(t.Parameters, what+".parameters")
		if err != nil {
			return chatRequest{}, err
		}
		req.Tools = append(req.Tools, tool{Name: t.Name, Description: t.Description, Parameters: params})
	}
	if req.ToolChoice, err = callerOpenAIToolChoice(b.ToolChoice, false); err != nil {
		return chatRequest{}, err
	}
	return req, nil
}

// addCallerResponsesItem adds one input item to req. Reasoning items from an
// earlier answer are dropped (the neutral request cannot hold them); item
// references are refused because Brama keeps no responses to resolve them.
func addCallerResponsesItem(req *chatRequest, it callerResponsesItem, what string) error {
	switch it.Type {
	case "", "message":
		switch it.Role {
		case "system", "developer":
			text, err := callerTextOf(it.Content, what+".content", "input_text", "\n\n")
			if err != nil {
				return err
			}
			req.System = joinSystemText(req.System, text)
			return nil
		case "user", "assistant":
			parts, err := callerResponsesParts(it.Content, what+".content")
			if err != nil {
				return err
			}
			req.Messages = append(req.Messages, message{Role: it.Role, Parts: parts})
			return nil
		}
		return refuseInvalid("%s.role %s is not one of user, assistant, system, developer", what, quoteCallerToken(it.Role))
	case "function_call":
		if it.CallID == "" || it.Name == "" {
			return refuseInvalid("%s needs a call_id and a name", what)
		}
		p := part{Type: partToolCall, ToolCallID: it.CallID, ToolName: it.Name, Arguments: it.Arguments}
		if n := len(req.Messages); n > 0 && req.Messages[n-1].Role == "assistant" {
			req.Messages[n-1].Parts = append(req.Messages[n-1].Parts, p)
		} else {
			req.Messages = append(req.Messages, message{Role: "assistant", Parts: []part{p}})
		}
		return nil
	case "function_call_output":
		if it.CallID == "" {
			return refuseInvalid("%s.call_id is required", what)
		}
		text, err := callerTextOf(it.Output, what+".output", "input_text", "\n")
		if err != nil {
			return err
		}
		req.Messages = appendCallerToolResult(req.Messages, part{Type: partToolResult, ToolCallID: it.CallID, Text: text})
		return nil
	case "reasoning":
		return nil
	}
	return refuseInvalid("%s.type %s is not supported (message, function_call, function_call_output)", what, quoteCallerToken(it.Type))
}

// callerResponsesParts reads a message item's content: a string or an array of
// input_text / output_text / input_image parts. Refusal parts of an earlier
// answer are dropped.
func callerResponsesParts(raw json.RawMessage, what string) ([]part, error) {
	text, rps, err := callerContent[callerResponsesPart](raw, what, "content parts")
	if err != nil || text != nil {
		return text, err
	}
	var parts []part
	for i, rp := range rps {
		pw := fmt.Sprintf("%s[%d]", what, i)
		switch rp.Type {
		case "input_text", "output_text":
			if rp.Text == nil {
				return nil, refuseInvalid("%s.text is required", pw)
			}
			parts = append(parts, part{Type: partText, Text: *rp.Text})
		case "input_image":
			if rp.ImageURL == nil {
				return nil, refuseInvalid("%s.image_url is required (file ids are not supported)", pw)
			}
			if err := checkCallerImageURL(*rp.ImageURL, pw+".image_url"); err != nil {
				return nil, err
			}
			parts = append(parts, part{Type: partImage, ImageURL: *rp.ImageURL})
		case "refusal":
		default:
			return nil, refuseInvalid("%s.type %s is not supported (input_text, output_text, input_image)", pw, quoteCallerToken(rp.Type))
		}
	}
	if len(parts) == 0 {
		return nil, refuseInvalid("%s must hold at least one text or image part", what)
	}
	return parts, nil
}

// Responses wire shapes shared by the buffered answer and the stream. The
// output list holds *callerResponsesMessage and *callerResponsesFunctionCall.
type (
	callerResponsesMessage struct {
		Type    string                `json:"type"`
		ID      string                `json:"id"`
		Status  string                `json:"status"`
		Role    string                `json:"role"`
		Content []callerResponsesText `json:"content"` // [] while streaming starts: SDKs append to it
	}
	callerResponsesFunctionCall struct {
		Type      string `json:"type"`
		ID        string `json:"id"`
		Status    string `json:"status"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	callerResponsesText struct {
		Type        string   `json:"type"`
		Text        string   `json:"text"`
		Annotations []string `json:"annotations"`
	}
	callerResponsesUsage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
	callerResponsesError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	callerResponsesIncomplete struct {
		Reason string `json:"reason"`
	}
	callerResponsesObject struct {
		ID                string                     `json:"id"`
		Object            string                     `json:"object"`
		CreatedAt         int64                      `json:"created_at"`
		Status            string                     `json:"status"`
		Error             *callerResponsesError      `json:"error"`
		IncompleteDetails *callerResponsesIncomplete `json:"incomplete_details"`
		Model             string                     `json:"model"`
		Output            []any                      `json:"output"`
		Usage             *callerResponsesUsage      `json:"usage"`
	}
)

func callerOutputText(text string) callerResponsesText {
	return callerResponsesText{Type: "output_text", Text: text, Annotations: []string{}}
}

// callerResponsesFinal fills in the terminal status of a response object: an
// answer cut by the token limit (or a content filter) is "incomplete" with
// the reason, as OpenAI reports it; usage is null when unreported.
func callerResponsesFinal(r *callerResponsesObject, finish string, u usage) {
	r.Status = "completed"
	switch finish {
	case finishLength:
		r.Status, r.IncompleteDetails = "incomplete", &callerResponsesIncomplete{"max_output_tokens"}
	case finishContentFilter:
		r.Status, r.IncompleteDetails = "incomplete", &callerResponsesIncomplete{"content_filter"}
	}
	if u.Reported {
		r.Usage = &callerResponsesUsage{u.InputTokens, u.OutputTokens, u.InputTokens + u.OutputTokens}
	}
}

// callerResponsesAnswer is the Responses "response" object for a: one message
// item with the text (when there is text), then one function_call item per
// tool call.
func callerResponsesAnswer(a chatAnswer, id string, created int64) callerResponsesObject {
	r := callerResponsesObject{ID: id, Object: "response", CreatedAt: created, Model: a.Model, Output: []any{}}
	if a.Text != "" {
		r.Output = append(r.Output, &callerResponsesMessage{Type: "message", ID: newAnswerID("msg_"), Status: "completed",
			Role: "assistant", Content: []callerResponsesText{callerOutputText(a.Text)}})
	}
	for _, tc := range a.ToolCalls {
		r.Output = append(r.Output, &callerResponsesFunctionCall{Type: "function_call", ID: newAnswerID("fc_"),
			Status: "completed", CallID: answerIDOr(tc.ID, "call_"), Name: tc.Name, Arguments: tc.Arguments})
	}
	callerResponsesFinal(&r, a.Finish, a.Usage)
	return r
}

// callerResponsesStream writes OpenAI Responses events. Output items are written
// one at a time, as OpenAI does: text goes to a message item, each tool call
// to a function_call item, and an item is done when the next one starts.
// Arguments arriving for a call whose item is already done (a provider
// interleaving calls) still go out as deltas for its output_index and join
// the final response, which is the one SDKs keep.
type callerResponsesStream struct {
	sse      callerSSE
	model    string
	seq      int // sequence_number of the next event
	started  bool
	resp     callerResponsesObject // output grows as items start; status at the end
	bufs     []*strings.Builder    // per output item: its text or arguments so far
	open     int                   // output index of the open item, -1 when none
	toolItem map[int]int           // neutral tool call index → output index
	tail     callerStreamTail
}

// callerResponsesEvent is every Responses stream event; each kind sets the
// members it has.
type callerResponsesEvent struct {
	Type           string                 `json:"type"`
	SequenceNumber int                    `json:"sequence_number"`
	Response       *callerResponsesObject `json:"response,omitempty"`
	OutputIndex    *int                   `json:"output_index,omitempty"`
	ItemID         string                 `json:"item_id,omitempty"`
	ContentIndex   *int                   `json:"content_index,omitempty"`
	Item           any                    `json:"item,omitempty"`
	Part           *callerResponsesText   `json:"part,omitempty"`
	Delta          *string                `json:"delta,omitempty"`
	Text           *string                `json:"text,omitempty"`
	Arguments      *string                `json:"arguments,omitempty"`
}

func (s *callerResponsesStream) emit(ev callerResponsesEvent) error {
	ev.SequenceNumber = s.seq
	s.seq++
	return s.sse.frame(ev.Type, ev)
}

// start writes response.created with status in_progress.
func (s *callerResponsesStream) start() error {
	if s.started {
		return nil
	}
	s.started = true
	r := s.resp
	r.Status = "in_progress"
	return s.emit(callerResponsesEvent{Type: "response.created", Response: &r})
}

// openItem finishes the open item and adds item as the next output.
func (s *callerResponsesStream) openItem(item any) (int, error) {
	if err := s.closeItem(); err != nil {
		return 0, err
	}
	i := len(s.resp.Output)
	s.resp.Output = append(s.resp.Output, item)
	s.bufs = append(s.bufs, &strings.Builder{})
	s.open = i
	return i, s.emit(callerResponsesEvent{Type: "response.output_item.added", OutputIndex: &i, Item: item})
}

// closeItem writes the done events of the open item and fills it in for
// the final response.
func (s *callerResponsesStream) closeItem() error {
	i := s.open
	if i < 0 {
		return nil
	}
	s.open = -1
	zero := 0
	full := s.bufs[i].String()
	switch it := s.resp.Output[i].(type) {
	case *callerResponsesMessage:
		it.Status, it.Content = "completed", []callerResponsesText{callerOutputText(full)}
		p := callerOutputText(full)
		if err := s.emit(callerResponsesEvent{Type: "response.output_text.done", ItemID: it.ID, OutputIndex: &i, ContentIndex: &zero, Text: &full}); err != nil {
			return err
		}
		if err := s.emit(callerResponsesEvent{Type: "response.content_part.done", ItemID: it.ID, OutputIndex: &i, ContentIndex: &zero, Part: &p}); err != nil {
			return err
		}
	case *callerResponsesFunctionCall:
		it.Status, it.Arguments = "completed", full
		if err := s.emit(callerResponsesEvent{Type: "response.function_call_arguments.done", ItemID: it.ID, OutputIndex: &i, Arguments: &full}); err != nil {
			return err
		}
	}
	return s.emit(callerResponsesEvent{Type: "response.output_item.done", OutputIndex: &i, Item: s.resp.Output[i]})
}

// event writes output_text and function_call_arguments deltas, adding an
// output item when the kind of content changes; finish and usage wait for
// finish().
func (s *callerResponsesStream) event(ev streamEvent) error {
	if s.sse.done {
		return errCallerStreamDone
	}
	if err := s.start(); err != nil {
		return err
	}
	if s.tail.record(ev) {
		return nil
	}
	zero := 0
	switch ev.Kind {
	case eventText:
		if ev.Text == "" {
			return nil
		}
		i := s.open
		msg, ok := s.openMessage()
		if !ok {
			msg = &callerResponsesMessage{Type: "message", ID: newAnswerID("msg_"), Status: "in_progress", Role: "assistant",
				Content: []callerResponsesText{}}
			var err error
			if i, err = s.openItem(msg); err != nil {
				return err
			}
			p := callerOutputText("")
			if err := s.emit(callerResponsesEvent{Type: "response.content_part.added", ItemID: msg.ID, OutputIndex: &i, ContentIndex: &zero, Part: &p}); err != nil {
				return err
			}
		}
		s.bufs[i].WriteString(ev.Text)
		return s.emit(callerResponsesEvent{Type: "response.output_text.delta", ItemID: msg.ID, OutputIndex: &i, ContentIndex: &zero, Delta: &ev.Text})
	case eventToolCallStart:
		i, err := s.openItem(&callerResponsesFunctionCall{Type: "function_call", ID: newAnswerID("fc_"), Status: "in_progress",
			CallID: answerIDOr(ev.ToolCall.ID, "call_"), Name: ev.ToolCall.Name})
		s.toolItem[ev.Index] = i
		return err
	case eventToolCallArgs:
		i, ok := s.toolItem[ev.Index]
		if !ok {
			return fmt.Errorf("arguments for tool call %d before its start", ev.Index)
		}
		if ev.Text == "" {
			return nil
		}
		s.bufs[i].WriteString(ev.Text)
		fc := s.resp.Output[i].(*callerResponsesFunctionCall)
		if i != s.open { // done already: keep the final response whole
			fc.Arguments = s.bufs[i].String()
		}
		return s.emit(callerResponsesEvent{Type: "response.function_call_arguments.delta", ItemID: fc.ID, OutputIndex: &i, Delta: &ev.Text})
	}
	return unknownStreamEvent(ev)
}

// openMessage is the open item when it is a message item.
func (s *callerResponsesStream) openMessage() (*callerResponsesMessage, bool) {
	if s.open < 0 {
		return nil, false
	}
	m, ok := s.resp.Output[s.open].(*callerResponsesMessage)
	return m, ok
}

// finish finishes the open item, then writes response.completed carrying
// the whole response, its status (incomplete for a length stop) and usage.
// The terminal event is response.completed even for an incomplete answer,
// as SPEC §7.5 lists it: SDK stream helpers wait for that event.
func (s *callerResponsesStream) finish() error {
	if err := s.sse.end(); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	if err := s.closeItem(); err != nil {
		return err
	}
	callerResponsesFinal(&s.resp, s.tail.finish, s.tail.usage)
	return s.emit(callerResponsesEvent{Type: "response.completed", Response: &s.resp})
}

// fail writes response.failed with response.error {code, message}.
func (s *callerResponsesStream) fail(e *apiError) error {
	if err := s.sse.end(); err != nil {
		return err
	}
	b := e.body().Error
	r := s.resp
	r.Status, r.Error = "failed", &callerResponsesError{Code: b.Code, Message: b.Message}
	return s.emit(callerResponsesEvent{Type: "response.failed", Response: &r})
}

func (s *callerResponsesStream) keepAlive() error { return s.sse.keepAlive() }
