package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// OpenAI Responses (caller POST /v1/responses, provider {base}/responses):
// both directions, buffered and streamed.

// Responses wire shapes, for the caller's body and the provider's.
type (
	responsesRequestBody struct {
		Model             string              `json:"model"`
		Instructions      *string             `json:"instructions,omitempty"`
		Input             json.RawMessage     `json:"input"`
		Tools             []responsesTool     `json:"tools,omitempty"`
		ToolChoice        json.RawMessage     `json:"tool_choice,omitempty"`
		ParallelToolCalls *bool               `json:"parallel_tool_calls,omitempty"`
		MaxOutputTokens   *int                `json:"max_output_tokens,omitempty"`
		Temperature       *float64            `json:"temperature,omitempty"`
		TopP              *float64            `json:"top_p,omitempty"`
		Reasoning         *responsesReasoning `json:"reasoning,omitempty"`
		Text              *responsesTextOpts  `json:"text,omitempty"`
		Stream            bool                `json:"stream,omitempty"`
		BillingTarget     json.RawMessage     `json:"billingTarget,omitempty"`
		openAIShared
	}
	responsesReasoning struct {
		Effort string `json:"effort,omitempty"`
	}
	responsesTextOpts struct {
		Format *outputFormat `json:"format,omitempty"`
	}
	responsesTool struct {
		Type        string          `json:"type"`
		Name        string          `json:"name,omitempty"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
		Strict      *bool           `json:"strict,omitempty"`
		Format      json.RawMessage `json:"format,omitempty"`
		Tools       []responsesTool `json:"tools,omitempty"` // a namespace's members
	}
	responsesItem struct { // an input item, and an output item of the answer
		Type      string          `json:"type"`
		ID        string          `json:"id,omitempty"`
		Status    string          `json:"status,omitempty"`
		Role      string          `json:"role,omitempty"`
		Content   json.RawMessage `json:"content,omitempty"` // string or []responsesPart
		CallID    string          `json:"call_id,omitempty"`
		Namespace string          `json:"namespace,omitempty"`
		Name      string          `json:"name,omitempty"`
		Arguments *string         `json:"arguments,omitempty"` // function_call
		Input     *string         `json:"input,omitempty"`     // custom_tool_call
		Output    json.RawMessage `json:"output,omitempty"`    // string or parts
	}
	responsesPart struct {
		Type        string          `json:"type"`
		Text        *string         `json:"text,omitempty"`
		ImageURL    *string         `json:"image_url,omitempty"`
		FileData    string          `json:"file_data,omitempty"`
		FileURL     string          `json:"file_url,omitempty"`
		Filename    string          `json:"filename,omitempty"`
		Annotations json.RawMessage `json:"annotations,omitempty"`
	}
	responsesObject struct {
		ID                string               `json:"id"`
		Object            string               `json:"object"`
		CreatedAt         int64                `json:"created_at"`
		Status            string               `json:"status"`
		Error             *responsesError      `json:"error"`
		IncompleteDetails *responsesIncomplete `json:"incomplete_details"`
		Model             string               `json:"model"`
		Output            []*responsesItem     `json:"output"`
		Usage             *responsesUsage      `json:"usage"`
	}
	responsesError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	responsesIncomplete struct {
		Reason string `json:"reason"`
	}
	responsesUsage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}
	responsesEvent struct {
		Type           string           `json:"type"`
		SequenceNumber int              `json:"sequence_number"`
		Response       *responsesObject `json:"response,omitempty"`
		OutputIndex    *int             `json:"output_index,omitempty"`
		ItemID         string           `json:"item_id,omitempty"`
		ContentIndex   *int             `json:"content_index,omitempty"`
		Item           *responsesItem   `json:"item,omitempty"`
		Part           *responsesPart   `json:"part,omitempty"`
		Delta          *string          `json:"delta,omitempty"`
		Text           *string          `json:"text,omitempty"`
		Arguments      *string          `json:"arguments,omitempty"`
		Input          *string          `json:"input,omitempty"`
		Code           json.RawMessage  `json:"code,omitempty"`
		Error          json.RawMessage  `json:"error,omitempty"`
	}
)

const responsesKnown = "model instructions input tools tool_choice parallel_tool_calls max_output_tokens temperature top_p reasoning text stream billingTarget " + openAISharedNames

// parseResponses parses an OpenAI Responses request body. Message items
// are turns of their own, a tool call joins the assistant turn before it,
// and consecutive tool outputs are one user turn of tool results.
func parseResponses(body []byte) (chatRequest, error) {
	var b responsesRequestBody
	if err := decodeCallerJSON(body, &b, ""); err != nil {
		return chatRequest{}, err
	}
	req, err := newCallerRequest(b.Model, b.Temperature, b.TopP, b.Stream, "max_output_tokens", b.MaxOutputTokens, b.BillingTarget)
	if err != nil {
		return chatRequest{}, err
	}
	var raw struct {
		Reasoning, Text json.RawMessage
		Tools           []json.RawMessage
	}
	json.Unmarshal(body, &raw)
	dropUnknown(&req.Dropped, body, "", responsesKnown)
	dropUnknown(&req.Dropped, raw.Reasoning, "reasoning", "effort")
	dropUnknown(&req.Dropped, raw.Text, "text", "format")
	req.Shared = b.openAIShared
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
		var items []responsesItem
		if err := decodeCallerJSON(b.Input, &items, "input"); err != nil {
			return chatRequest{}, err
		}
		for i, it := range items {
			if err := req.addResponsesItem(it, fmt.Sprintf("input[%d]", i)); err != nil {
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
		if t.Type == "function" || t.Type == "custom" {
			dropUnknown(&req.Dropped, raw.Tools[i], what, "type name description parameters strict format")
		}
		if err := req.addOpenAITool(responsesToolDef(t), what); err != nil {
			return chatRequest{}, err
		}
	}
	if req.ToolChoice, err = parseOpenAIToolChoice(&req, b.ToolChoice, false); err != nil {
		return chatRequest{}, err
	}
	req.ParallelToolCalls = b.ParallelToolCalls
	if b.Reasoning != nil {
		req.Effort = b.Reasoning.Effort
	}
	if b.Text != nil && b.Text.Format != nil {
		if req.Output, err = checkOutput(b.Text.Format, "text.format"); err != nil {
			return chatRequest{}, err
		}
	}
	req.linkCalls()
	return req, nil
}

func responsesToolDef(t responsesTool) openAITool {
	o := openAITool{Type: t.Type, Name: t.Name, Description: t.Description, Parameters: t.Parameters, Format: t.Format}
	for _, m := range t.Tools {
		o.Tools = append(o.Tools, responsesToolDef(m))
	}
	return o
}

// addResponsesItem adds one input item to req. Items with no counterpart
// elsewhere (reasoning, hosted tool calls and their outputs) are dropped
// and named; an item_reference is refused because Brama keeps no
// responses to resolve it.
func (req *chatRequest) addResponsesItem(it responsesItem, what string) error {
	switch it.Type {
	case "", "message":
		switch it.Role {
		case "system", "developer":
			text, err := callerTextOf(it.Content, what+".content", "input_text", "\n\n")
			if err != nil {
				return err
			}
			req.addSystem(text)
			return nil
		case "user", "assistant":
			parts, err := req.responsesParts(it.Content, what+".content")
			if err != nil {
				return err
			}
			if len(parts) == 0 {
				return refuseInvalid("%s.content must hold at least one text, image or file part", what)
			}
			req.Messages = append(req.Messages, message{Role: it.Role, Parts: parts})
			return nil
		}
		return refuseInvalid("%s.role %s is not one of user, assistant, system, developer", what, quoteCallerToken(it.Role))
	case "function_call", "custom_tool_call":
		if it.CallID == "" || it.Name == "" {
			return refuseInvalid("%s needs a call_id and a name", what)
		}
		p := part{Type: partToolCall, ToolCallID: it.CallID, ToolName: it.Name, Custom: it.Type == "custom_tool_call"}
		if it.Namespace != "" {
			p.ToolName = it.Namespace + "__" + it.Name
		}
		if it.Arguments != nil {
			p.Arguments = *it.Arguments
		}
		if it.Input != nil {
			p.Arguments = *it.Input
		}
		req.Messages = appendPart(req.Messages, "assistant", p)
		return nil
	case "function_call_output", "custom_tool_call_output":
		if it.CallID == "" {
			return refuseInvalid("%s.call_id is required", what)
		}
		var text string
		if rawShape(it.Output) != '"' && rawShape(it.Output) != '[' {
			return refuseInvalid("%s.output must be a string or an array of parts", what)
		}
		parts, err := req.responsesParts(it.Output, what+".output")
		if err != nil {
			return err
		}
		var texts []string
		for i, p := range parts {
			if p.Type != partText {
				req.Dropped = append(req.Dropped, fmt.Sprintf("%s.output[%d]", what, i))
				continue
			}
			texts = append(texts, p.Text)
		}
		text = strings.Join(texts, "\n")
		req.Messages = appendPart(req.Messages, "user", part{Type: partToolResult, ToolCallID: it.CallID, Text: text, Custom: it.Type == "custom_tool_call_output"})
		return nil
	case "item_reference":
		return refuseInvalid("%s: item references are not supported; send the items themselves", what)
	}
	req.Dropped = append(req.Dropped, what)
	return nil
}

// responsesParts reads a message item's content: a string or an array of
// input_text / output_text / input_image / input_file parts. Parts with
// no counterpart (a refusal, a file id) are dropped and named.
func (req *chatRequest) responsesParts(raw json.RawMessage, what string) ([]part, error) {
	text, rps, err := callerContent[responsesPart](raw, what, "content parts")
	if err != nil || text != nil {
		return text, err
	}
	var parts []part
	for i, rp := range rps {
		pw := fmt.Sprintf("%s[%d]", what, i)
		switch {
		case rp.Type == "input_text" || rp.Type == "output_text":
			if rp.Text == nil {
				return nil, refuseInvalid("%s.text is required", pw)
			}
			parts = append(parts, part{Type: partText, Text: *rp.Text})
		case rp.Type == "input_image" && rp.ImageURL != nil:
			if err := checkCallerURL(*rp.ImageURL, pw+".image_url"); err != nil {
				return nil, err
			}
			parts = append(parts, part{Type: partImage, ImageURL: *rp.ImageURL})
		case rp.Type == "input_file" && rp.FileData+rp.FileURL != "":
			url := rp.FileData + rp.FileURL
			if err := checkCallerURL(url, pw); err != nil {
				return nil, err
			}
			parts = append(parts, part{Type: partDocument, FileURL: url, Filename: rp.Filename})
		default:
			req.Dropped = append(req.Dropped, pw)
		}
	}
	return parts, nil
}

// encodeResponses builds a Responses body. A message's parts keep their
// order: text, images and files gather into message items, tool calls and
// tool results become items of their own; namespaced tools regroup. codex
// gets SPEC §6.2's body: default instructions, store false, and never
// max_output_tokens, temperature or top_p, which its backend refuses.
func encodeResponses(req chatRequest, model string, o upstreamOptions) (any, error) {
	out := responsesRequestBody{Model: model, Stream: o.stream, ParallelToolCalls: req.ParallelToolCalls}
	if req.System != "" || o.codex {
		out.Instructions = ptrTo(req.System)
	}
	out.openAIShared = req.Shared
	if o.codex {
		out.Store = json.RawMessage("false")
		if req.System == "" {
			out.Instructions = ptrTo(codexDefaultInstructions)
		}
	} else {
		if req.MaxTokens > 0 {
			out.MaxOutputTokens = &req.MaxTokens
		}
		out.Temperature, out.TopP = req.Temperature, req.TopP
	}
	if req.Effort != "" {
		out.Reasoning = &responsesReasoning{Effort: req.Effort}
	}
	var items []responsesItem
	for _, m := range req.Messages {
		var content []responsesPart
		flush := func() {
			if len(content) > 0 {
				items = append(items, responsesItem{Type: "message", Role: m.Role, Content: must(json.Marshal(content))})
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
					content = append(content, responsesPart{Type: textType, Text: ptrTo(p.Text)})
				}
			case partImage:
				content = append(content, responsesPart{Type: "input_image", ImageURL: ptrTo(p.ImageURL)})
			case partDocument:
				fp := responsesPart{Type: "input_file", FileURL: p.FileURL, Filename: p.Filename}
				if strings.HasPrefix(p.FileURL, "data:") {
					fp.FileURL, fp.FileData = "", p.FileURL
				}
				content = append(content, fp)
			case partToolCall:
				flush()
				items = append(items, responsesCall(req, "", p.ToolCallID, p.ToolName, p.Arguments, p.Custom))
			case partToolResult:
				flush()
				kind := "function_call_output"
				if p.Custom {
					kind = "custom_tool_call_output"
				}
				items = append(items, responsesItem{Type: kind, CallID: p.ToolCallID, Output: jsonText(p.Text)})
			}
		}
		flush()
	}
	out.Input = must(json.Marshal(items))
	if len(items) == 0 {
		out.Input = json.RawMessage("[]")
	}
	for _, t := range req.Tools {
		rt := responsesTool{Type: "function", Name: t.Name, Description: t.Description, Parameters: t.Parameters, Strict: ptrTo(false)}
		if t.Kind == toolCustom {
			rt = responsesTool{Type: "custom", Name: t.Name, Description: t.Description, Format: t.Format}
		} else if len(rt.Parameters) == 0 {
			rt.Parameters = emptySchema
		}
		if t.Namespace == "" {
			out.Tools = append(out.Tools, rt)
			continue
		}
		rt.Name = t.memberName()
		if n := len(out.Tools); n > 0 && out.Tools[n-1].Type == "namespace" && out.Tools[n-1].Name == t.Namespace {
			out.Tools[n-1].Tools = append(out.Tools[n-1].Tools, rt)
		} else {
			out.Tools = append(out.Tools, responsesTool{Type: "namespace", Name: t.Namespace, Tools: []responsesTool{rt}})
		}
	}
	if c := req.ToolChoice; c != nil {
		out.ToolChoice = jsonText(c.Mode)
		if c.Mode == toolChoiceTool {
			choice := map[string]string{"type": "function", "name": c.Name}
			if t := req.findTool(c.Name); t != nil {
				choice["name"] = t.memberName()
				if t.Namespace != "" {
					choice["namespace"] = t.Namespace
				}
				if t.Kind == toolCustom {
					choice["type"] = "custom"
				}
			}
			out.ToolChoice = must(json.Marshal(choice))
		}
	}
	if f := req.Output; f != nil {
		out.Text = &responsesTextOpts{Format: schemaOutput(f)}
		if out.Text.Format == nil {
			out.Text.Format = &outputFormat{Type: f.Type}
		}
	}
	return out, nil
}

// responsesCall is one tool call item: a function_call, named in its group
// when it has one, or a custom_tool_call.
func responsesCall(req chatRequest, id, callID, name, args string, custom bool) responsesItem {
	ns, member := "", name
	if t := req.findTool(name); t != nil {
		ns, member = t.Namespace, t.memberName()
	}
	if custom {
		return responsesItem{Type: "custom_tool_call", ID: id, CallID: callID, Name: member, Input: &args}
	}
	args = argumentsText(args)
	return responsesItem{Type: "function_call", ID: id, CallID: callID, Namespace: ns, Name: member, Arguments: &args}
}

// text is a message item's output text.
func (it *responsesItem) text() string {
	var parts []responsesPart
	json.Unmarshal(it.Content, &parts)
	var b strings.Builder
	for _, c := range parts {
		if c.Type == "output_text" && c.Text != nil {
			b.WriteString(*c.Text)
		}
	}
	return b.String()
}

// call is a tool call item as a neutral call; ok is false for other items.
func (it *responsesItem) call() (toolCall, bool) {
	name := it.Name
	if it.Namespace != "" {
		name = it.Namespace + "__" + it.Name
	}
	switch it.Type {
	case "function_call":
		args := ""
		if it.Arguments != nil {
			args = *it.Arguments
		}
		return toolCall{ID: it.CallID, Name: name, Arguments: argumentsText(args)}, true
	case "custom_tool_call":
		in := ""
		if it.Input != nil {
			in = *it.Input
		}
		return toolCall{ID: it.CallID, Name: name, Arguments: in, Custom: true}, true
	}
	return toolCall{}, false
}

// finish is the neutral finish of a response that made tool calls or not.
func (r *responsesObject) finish(toolCalls bool) string {
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

func (r *responsesObject) usage() usage {
	if r.Usage == nil {
		return usage{}
	}
	return usage{InputTokens: r.Usage.InputTokens, OutputTokens: r.Usage.OutputTokens, Reported: true}
}

// decodeResponses reads a complete Responses answer: text from message
// items and tool calls from call items, in output order.
func decodeResponses(body []byte) (chatAnswer, error) {
	var r responsesObject
	if err := json.Unmarshal(body, &r); err != nil {
		return chatAnswer{}, malformedAnswer(protoOpenAIResponses, err)
	}
	if r.Status != "completed" && r.Status != "incomplete" {
		return chatAnswer{}, malformedAnswer(protoOpenAIResponses, nil)
	}
	var a chatAnswer
	var text strings.Builder
	for _, it := range r.Output {
		if it == nil {
			continue
		}
		if it.Type == "message" {
			text.WriteString(it.text())
		}
		if tc, ok := it.call(); ok {
			if it.Name == "" {
				return chatAnswer{}, malformedAnswer(protoOpenAIResponses, nil)
			}
			a.ToolCalls = append(a.ToolCalls, tc)
		}
	}
	a.Text = text.String()
	a.Finish = r.finish(len(a.ToolCalls) > 0)
	a.Usage = r.usage()
	return a, nil
}

func outputText(text string) responsesPart {
	return responsesPart{Type: "output_text", Text: &text, Annotations: json.RawMessage("[]")}
}

// responsesFinal fills in the terminal status of a response object: an
// answer cut by the token limit (or a content filter) is "incomplete" with
// the reason, as OpenAI reports it; usage is null when unreported.
func responsesFinal(r *responsesObject, finish string, u usage) {
	r.Status = "completed"
	switch finish {
	case finishLength:
		r.Status, r.IncompleteDetails = "incomplete", &responsesIncomplete{"max_output_tokens"}
	case finishContentFilter:
		r.Status, r.IncompleteDetails = "incomplete", &responsesIncomplete{"content_filter"}
	}
	if u.Reported {
		r.Usage = &responsesUsage{u.InputTokens, u.OutputTokens, u.InputTokens + u.OutputTokens}
	}
}

func newResponsesObject(model string) responsesObject {
	return responsesObject{ID: newAnswerID("resp_"), Object: "response", CreatedAt: time.Now().Unix(), Model: model, Output: []*responsesItem{}}
}

// renderResponses is the Responses "response" object for a: one message
// item with the text (when there is text), then one item per tool call,
// named as the caller declared the tool.
func renderResponses(req chatRequest, a chatAnswer) any {
	r := newResponsesObject(a.Model)
	if a.Text != "" {
		r.Output = append(r.Output, &responsesItem{Type: "message", ID: newAnswerID("msg_"), Status: "completed",
			Role: "assistant", Content: must(json.Marshal([]responsesPart{outputText(a.Text)}))})
	}
	for _, tc := range a.ToolCalls {
		_, _, args, custom := req.callerTool(tc)
		it := responsesCall(req, newAnswerID("fc_"), answerIDOr(tc.ID, "call_"), tc.Name, args, custom)
		it.Status = "completed"
		r.Output = append(r.Output, &it)
	}
	responsesFinal(&r, a.Finish, a.Usage)
	return r
}

// responsesCallerStream writes OpenAI Responses events, one output item
// at a time: text goes to a message item, each tool call to a call item.
// The output list is kept whole for response.completed, which is the one
// SDKs keep.
type responsesCallerStream struct {
	sse  *callerSSE
	req  chatRequest
	seq  int // sequence_number of the next event
	resp responsesObject
}

func newResponsesCallerStream(sse *callerSSE, req chatRequest, model string) blockWriter {
	return &responsesCallerStream{sse: sse, req: req, resp: newResponsesObject(model)}
}

func (s *responsesCallerStream) emit(ev responsesEvent) error {
	ev.SequenceNumber = s.seq
	s.seq++
	return s.sse.frame(ev.Type, ev)
}

// begin writes response.created with status in_progress.
func (s *responsesCallerStream) begin() error {
	r := s.resp
	r.Status = "in_progress"
	return s.emit(responsesEvent{Type: "response.created", Response: &r})
}

func (s *responsesCallerStream) open(i int, b *streamBlock) error {
	it := &responsesItem{Type: "message", ID: newAnswerID("msg_"), Status: "in_progress", Role: "assistant", Content: json.RawMessage("[]")}
	if !b.text {
		c := responsesCall(s.req, newAnswerID("fc_"), answerIDOr(b.id, "call_"), "", "", b.custom)
		c.Namespace, c.Name, c.Status = b.namespace, b.name, "in_progress"
		if !b.custom {
			c.Arguments = ptrTo("")
		}
		it = &c
	}
	s.resp.Output = append(s.resp.Output, it)
	added := *it
	if err := s.emit(responsesEvent{Type: "response.output_item.added", OutputIndex: &i, Item: &added}); err != nil || !b.text {
		return err
	}
	zero, p := 0, outputText("")
	return s.emit(responsesEvent{Type: "response.content_part.added", ItemID: it.ID, OutputIndex: &i, ContentIndex: &zero, Part: &p})
}

// delta writes the next piece of text or input; a call item already done
// (a provider interleaving calls) gets its final input updated.
func (s *responsesCallerStream) delta(i int, b *streamBlock, d string) error {
	it, zero := s.resp.Output[i], 0
	kind := map[string]string{"message": "response.output_text.delta", "function_call": "response.function_call_arguments.delta",
		"custom_tool_call": "response.custom_tool_call_input.delta"}[it.Type]
	if it.Status == "completed" {
		s.fill(it, b.buf.String())
	}
	ev := responsesEvent{Type: kind, ItemID: it.ID, OutputIndex: &i, Delta: &d}
	if b.text {
		ev.ContentIndex = &zero
	}
	return s.emit(ev)
}

// fill sets an item's whole text or input.
func (s *responsesCallerStream) fill(it *responsesItem, full string) {
	switch it.Type {
	case "message":
		it.Content = must(json.Marshal([]responsesPart{outputText(full)}))
	case "custom_tool_call":
		it.Input = &full
	default:
		it.Arguments = &full
	}
}

// close writes the done events of an item and fills it in.
func (s *responsesCallerStream) close(i int, _ *streamBlock, full string) error {
	it, zero := s.resp.Output[i], 0
	it.Status = "completed"
	s.fill(it, full)
	var err error
	switch it.Type {
	case "message":
		p := outputText(full)
		err = s.emit(responsesEvent{Type: "response.output_text.done", ItemID: it.ID, OutputIndex: &i, ContentIndex: &zero, Text: &full})
		if err == nil {
			err = s.emit(responsesEvent{Type: "response.content_part.done", ItemID: it.ID, OutputIndex: &i, ContentIndex: &zero, Part: &p})
		}
	case "custom_tool_call":
		err = s.emit(responsesEvent{Type: "response.custom_tool_call_input.done", ItemID: it.ID, OutputIndex: &i, Input: &full})
	default:
		err = s.emit(responsesEvent{Type: "response.function_call_arguments.done", ItemID: it.ID, OutputIndex: &i, Arguments: &full})
	}
	if err != nil {
		return err
	}
	return s.emit(responsesEvent{Type: "response.output_item.done", OutputIndex: &i, Item: it})
}

func (s *responsesCallerStream) finishNow(callerStreamTail) error { return nil }

// end writes response.completed carrying the whole response, its status
// (incomplete for a length stop) and usage. The terminal event is
// response.completed even for an incomplete answer, as SPEC §7.5 lists it:
// SDK stream helpers wait for that event.
func (s *responsesCallerStream) end(t callerStreamTail) error {
	responsesFinal(&s.resp, t.finish, t.usage)
	return s.emit(responsesEvent{Type: "response.completed", Response: &s.resp})
}

// fail writes response.failed with response.error {code, message}.
func (s *responsesCallerStream) fail(e *apiError) error {
	b := e.body().Error
	r := s.resp
	r.Status, r.Error = "failed", &responsesError{Code: b.Code, Message: b.Message}
	return s.emit(responsesEvent{Type: "response.failed", Response: &r})
}

// responsesStreamItem is what the stream showed of one output item so far.
type responsesStreamItem struct {
	tool     int  // neutral tool index, -1 for a message
	started  bool // tool_call_start emitted
	streamed bool // text or argument deltas emitted
}

// responsesUpstreamStream translates Responses events; response.completed
// is terminal (and response.incomplete, the same answer cut by a limit).
// Items are keyed by output_index so a buffered caller gets them in that
// order; an item whose deltas never came is emitted whole at its done.
type responsesUpstreamStream struct {
	items map[int]*responsesStreamItem
	tools int
}

func newResponsesUpstreamStream() streamTranslator {
	return &responsesUpstreamStream{items: map[int]*responsesStreamItem{}}
}

func (r *responsesUpstreamStream) handle(ev sseEvent, emit func(streamEvent) error) (bool, error) {
	var e responsesEvent
	if err := json.Unmarshal([]byte(ev.Data), &e); err != nil {
		return false, malformedEvent(protoOpenAIResponses, err)
	}
	idx := 0
	if e.OutputIndex != nil {
		idx = *e.OutputIndex
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
		return false, r.start(idx, e.Item, emit)
	case "response.output_text.delta":
		it := r.item(idx)
		if e.Delta != nil && *e.Delta != "" {
			it.streamed = true
			return false, emit(streamEvent{Kind: eventText, Text: *e.Delta})
		}
	case "response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
		it, ok := r.items[idx]
		if !ok || it.tool < 0 {
			return false, malformedEvent(protoOpenAIResponses, errors.New("arguments outside a call item"))
		}
		if e.Delta != nil && *e.Delta != "" {
			it.streamed = true
			return false, emit(streamEvent{Kind: eventToolCallArgs, Index: it.tool, Text: *e.Delta})
		}
	case "response.output_item.done":
		if e.Item == nil {
			return false, malformedEvent(protoOpenAIResponses, errors.New("output item event without item"))
		}
		return false, r.done(idx, e.Item, emit)
	case "response.completed", "response.incomplete":
		if e.Response == nil {
			return false, malformedEvent(protoOpenAIResponses, errors.New(e.Type+" without response"))
		}
		// Items the stream never showed (a minimal stream) come from the
		// final response, in output order.
		for i, it := range e.Response.Output {
			if _, seen := r.items[i]; !seen && it != nil {
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
func (r *responsesUpstreamStream) item(i int) *responsesStreamItem {
	it, ok := r.items[i]
	if !ok {
		it = &responsesStreamItem{tool: -1}
		r.items[i] = it
	}
	return it
}

// start records an output item; a call item starts a neutral tool call.
func (r *responsesUpstreamStream) start(i int, item *responsesItem, emit func(streamEvent) error) error {
	it := r.item(i)
	tc, isCall := item.call()
	if !isCall || it.started {
		return nil
	}
	if item.Name == "" {
		return malformedEvent(protoOpenAIResponses, errors.New("call item without a name"))
	}
	it.tool, it.started = r.tools, true
	r.tools++
	tc.Arguments = ""
	return emit(streamEvent{Kind: eventToolCallStart, Index: it.tool, ToolCall: tc})
}

// done completes an output item, emitting whatever its deltas did not.
func (r *responsesUpstreamStream) done(i int, item *responsesItem, emit func(streamEvent) error) error {
	if err := r.start(i, item, emit); err != nil {
		return err
	}
	it := r.items[i]
	if it.streamed {
		return nil
	}
	it.streamed = true
	if tc, ok := item.call(); ok {
		if tc.Arguments == "" {
			return nil
		}
		return emit(streamEvent{Kind: eventToolCallArgs, Index: it.tool, Text: tc.Arguments})
	}
	if t := item.text(); item.Type == "message" && t != "" {
		return emit(streamEvent{Kind: eventText, Text: t})
	}
	return nil
}

func (r *responsesUpstreamStream) ended(func(streamEvent) error) (bool, error) { return false, nil }
