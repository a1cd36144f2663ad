package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// OpenAI Responses (caller POST /v1/responses, provider {base}/responses):
// both directions, buffered and streamed.

// Responses wire shapes, for the caller's body and the provider's.
type (
	responsesRequestBody struct {
		Model             string          `json:"model"`
		Instructions      *string         `json:"instructions,omitempty"`
		Input             json.RawMessage `json:"input"`
		Tools             []responsesTool `json:"tools,omitempty"`
		ToolChoice        json.RawMessage `json:"tool_choice,omitempty"`
		ParallelToolCalls *bool           `json:"parallel_tool_calls,omitempty"`
		MaxOutputTokens   *int            `json:"max_output_tokens,omitempty"`
		Temperature       *float64        `json:"temperature,omitempty"`
		TopP              *float64        `json:"top_p,omitempty"`
		Reasoning         *struct {
			Effort string `json:"effort,omitempty"`
		} `json:"reasoning,omitempty"`
		Text *struct {
			Format *outputFormat `json:"format,omitempty"`
		} `json:"text,omitempty"`
		Stream        bool            `json:"stream,omitempty"`
		BillingTarget json.RawMessage `json:"billingTarget,omitempty"`
		openAIShared
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
	req.Shared, req.ParallelToolCalls = b.openAIShared, b.ParallelToolCalls
	if b.Instructions != nil {
		req.System = *b.Instructions
	}
	var items []responsesItem
	switch rawShape(b.Input) {
	case '"':
		var s string
		if err := decodeCallerJSON(b.Input, &s, "input"); err != nil || s == "" {
			return chatRequest{}, refuseInvalid("input must not be empty")
		}
		items = []responsesItem{{Role: "user", Content: b.Input}}
	case '[':
		if err := decodeCallerJSON(b.Input, &items, "input"); err != nil {
			return chatRequest{}, err
		}
	default:
		return chatRequest{}, refuseInvalid("input is required: a string or an array of items")
	}
	for i, it := range items {
		if err := req.addResponsesItem(it, fmt.Sprintf("input[%d]", i)); err != nil {
			return chatRequest{}, err
		}
	}
	if len(req.Messages) == 0 {
		return chatRequest{}, refuseInvalid("input must hold at least one user, assistant or tool item")
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
			req.addSystem(text)
			return err
		case "user", "assistant":
			parts, err := req.responsesParts(it.Content, what+".content")
			if err == nil && len(parts) == 0 {
				err = refuseInvalid("%s.content must hold at least one text, image or file part", what)
			}
			req.Messages = append(req.Messages, message{Role: it.Role, Parts: parts})
			return err
		}
		return refuseInvalid("%s.role %s is not one of user, assistant, system, developer", what, quoteCallerToken(it.Role))
	case "function_call", "custom_tool_call":
		tc, _ := it.call()
		if it.CallID == "" || it.Name == "" {
			return refuseInvalid("%s needs a call_id and a name", what)
		}
		if !tc.Custom && (it.Arguments == nil || *it.Arguments == "") {
			tc.Arguments = "" // absent arguments stay absent
		}
		req.Messages = appendPart(req.Messages, "assistant", part{Type: partToolCall, ToolCallID: tc.ID, ToolName: tc.Name, Arguments: tc.Arguments, Custom: tc.Custom})
		return nil
	case "function_call_output", "custom_tool_call_output":
		if it.CallID == "" {
			return refuseInvalid("%s.call_id is required", what)
		}
		if s := rawShape(it.Output); s != '"' && s != '[' {
			return refuseInvalid("%s.output must be a string or an array of parts", what)
		}
		parts, err := req.responsesParts(it.Output, what+".output")
		req.Messages = appendPart(req.Messages, "user", part{Type: partToolResult, ToolCallID: it.CallID,
			Text: req.resultText(parts, what+".output"), Custom: it.Type == "custom_tool_call_output"})
		return err
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
		p, url := part{}, ""
		switch {
		case rp.Type == "input_text" || rp.Type == "output_text":
			if rp.Text == nil {
				return nil, refuseInvalid("%s.text is required", pw)
			}
			p = part{Type: partText, Text: *rp.Text}
		case rp.Type == "input_image" && rp.ImageURL != nil:
			url, pw = *rp.ImageURL, pw+".image_url"
			p = part{Type: partImage, ImageURL: url}
		case rp.Type == "input_file" && rp.FileData+rp.FileURL != "":
			url = rp.FileData + rp.FileURL
			p = part{Type: partDocument, FileURL: url, Filename: rp.Filename}
		default:
			req.Dropped = append(req.Dropped, pw)
			continue
		}
		if err := checkCallerURL(url, pw); url != "" && err != nil {
			return nil, err
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// encodeResponses builds a Responses body. A message's parts keep their
// order: text, images and files gather into message items, tool calls and
// tool results become items of their own. codex gets SPEC §6.2's body:
// default instructions, store false, and never max_output_tokens,
// temperature or top_p, which its backend refuses.
func encodeResponses(req chatRequest, model string, o upstreamOptions) (any, error) {
	out := responsesRequestBody{Model: model, Stream: o.stream, ParallelToolCalls: req.ParallelToolCalls, openAIShared: req.Shared}
	if req.System != "" || o.codex {
		out.Instructions = ptrTo(req.System)
	}
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
		out.Reasoning = &struct {
			Effort string `json:"effort,omitempty"`
		}{req.Effort}
	}
	items := []responsesItem{}
	for _, m := range req.Messages {
		var content []responsesPart
		flush := func() {
			if len(content) > 0 {
				items = append(items, responsesItem{Type: "message", Role: m.Role, Content: must(json.Marshal(content))})
				content = nil
			}
		}
		for _, p := range m.Parts {
			switch p.Type {
			case partText:
				if p.Text != "" {
					content = append(content, responsesPart{Type: map[bool]string{false: "input_text", true: "output_text"}[m.Role == "assistant"], Text: ptrTo(p.Text)})
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
				kind := map[bool]string{false: "function_call_output", true: "custom_tool_call_output"}[p.Custom]
				items = append(items, responsesItem{Type: kind, CallID: p.ToolCallID, Output: jsonText(p.Text)})
			}
		}
		flush()
	}
	out.Input = must(json.Marshal(items))
	for _, t := range req.Tools { // a namespaced tool goes flattened: no provider sees a group
		rt := responsesTool{Type: "function", Name: t.Name, Description: t.Description, Parameters: t.Parameters, Strict: ptrTo(false)}
		if t.Kind == toolCustom {
			rt = responsesTool{Type: "custom", Name: t.Name, Description: t.Description, Format: t.Format}
		} else if len(rt.Parameters) == 0 {
			rt.Parameters = emptySchema
		}
		out.Tools = append(out.Tools, rt)
	}
	if c := req.ToolChoice; c != nil {
		out.ToolChoice = jsonText(c.Mode)
		if c.Mode == toolChoiceTool {
			out.ToolChoice = must(json.Marshal(map[string]string{"type": req.toolKind(c.Name), "name": c.Name}))
		}
	}
	if f := req.Output; f != nil {
		out.Text = &struct {
			Format *outputFormat `json:"format,omitempty"`
		}{schemaOutput(f)}
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

// call is a tool call item as a neutral call, its name flattened; ok is
// false for other items.
func (it *responsesItem) call() (toolCall, bool) {
	tc := toolCall{ID: it.CallID, Name: it.Name, Custom: it.Type == "custom_tool_call"}
	if it.Namespace != "" {
		tc.Name = it.Namespace + "__" + it.Name
	}
	in := it.Arguments
	if tc.Custom {
		in = it.Input
	}
	if in != nil {
		tc.Arguments = *in
	}
	if !tc.Custom {
		tc.Arguments = argumentsText(tc.Arguments)
	}
	return tc, tc.Custom || it.Type == "function_call"
}

// finish is the neutral finish of a response that made tool calls or not.
func (r *responsesObject) finish(toolCalls bool) string {
	if d := r.IncompleteDetails; d != nil && (d.Reason == "max_output_tokens" || d.Reason == "content_filter") {
		return map[string]string{"max_output_tokens": finishLength, "content_filter": finishContentFilter}[d.Reason]
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

// decodeResponses reads a complete Responses answer as the stream's final
// response: text from message items and tool calls from call items, in
// output order.
func decodeResponses(body []byte) (chatAnswer, error) {
	var r responsesObject
	if err := json.Unmarshal(body, &r); err != nil {
		return chatAnswer{}, malformedAnswer(protoOpenAIResponses, err)
	}
	if r.Status != "completed" && r.Status != "incomplete" {
		return chatAnswer{}, malformedAnswer(protoOpenAIResponses, nil)
	}
	return answerOf(func(emit func(streamEvent) error) error {
		return newResponsesUpstreamStream().(*responsesUpstreamStream).completed(&r, emit)
	})
}

func outputText(text string) responsesPart {
	return responsesPart{Type: "output_text", Text: &text, Annotations: json.RawMessage("[]")}
}

// responsesFinal fills in the terminal status of a response object: an
// answer cut by the token limit (or a content filter) is "incomplete" with
// the reason, as OpenAI reports it; usage is null when unreported.
func responsesFinal(r *responsesObject, finish string, u usage) {
	r.Status = "completed"
	if reason := map[string]string{finishLength: "max_output_tokens", finishContentFilter: "content_filter"}[finish]; reason != "" {
		r.Status, r.IncompleteDetails = "incomplete", &responsesIncomplete{reason}
	}
	if u.Reported {
		r.Usage = &responsesUsage{u.InputTokens, u.OutputTokens, u.InputTokens + u.OutputTokens}
	}
}

// renderResponses is the Responses "response" object for a: the final
// response of the stream that would have carried it.
func renderResponses(req chatRequest, a chatAnswer) any {
	w := newResponsesCallerStream(&callerSSE{w: io.Discard, flush: func() {}}, req, a.Model).(*responsesCallerStream)
	replayAnswer(w.sse, w, req, a)
	return w.resp
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
	resp := responsesObject{ID: newAnswerID("resp_"), Object: "response", CreatedAt: time.Now().Unix(), Model: model, Output: []*responsesItem{}}
	return &responsesCallerStream{sse: sse, req: req, resp: resp}
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

// responsesDeltas names each item type's delta event.
var responsesDeltas = map[string]string{"message": "response.output_text.delta", "function_call": "response.function_call_arguments.delta",
	"custom_tool_call": "response.custom_tool_call_input.delta"}

// delta writes the next piece of text or input; a call item already done
// (a provider interleaving calls) gets its final input updated.
func (s *responsesCallerStream) delta(i int, b *streamBlock, d string) error {
	it, zero := s.resp.Output[i], 0
	if it.Status == "completed" {
		s.fill(it, b.buf.String())
	}
	ev := responsesEvent{Type: responsesDeltas[it.Type], ItemID: it.ID, OutputIndex: &i, Delta: &d}
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
	done := responsesEvent{Type: "response.function_call_arguments.done", ItemID: it.ID, OutputIndex: &i, Arguments: &full}
	switch it.Type {
	case "message":
		p := outputText(full)
		if err := s.emit(responsesEvent{Type: "response.output_text.done", ItemID: it.ID, OutputIndex: &i, ContentIndex: &zero, Text: &full}); err != nil {
			return err
		}
		done = responsesEvent{Type: "response.content_part.done", ItemID: it.ID, OutputIndex: &i, ContentIndex: &zero, Part: &p}
	case "custom_tool_call":
		done = responsesEvent{Type: "response.custom_tool_call_input.done", ItemID: it.ID, OutputIndex: &i, Input: &full}
	}
	if err := s.emit(done); err != nil {
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
		code := ""
		if e.Response != nil && e.Response.Error != nil {
			code = e.Response.Error.Code
		}
		return false, inBandError(code)
	case "response.output_item.added", "response.output_item.done":
		if e.Item == nil {
			return false, malformedEvent(protoOpenAIResponses, errors.New("output item event without item"))
		}
		if e.Type == "response.output_item.added" {
			return false, r.start(idx, e.Item, emit)
		}
		return false, r.done(idx, e.Item, emit)
	case "response.output_text.delta", "response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
		it := r.item(idx)
		ev := streamEvent{Kind: eventText}
		if e.Type != "response.output_text.delta" {
			if it.tool < 0 {
				return false, malformedEvent(protoOpenAIResponses, errors.New("arguments outside a call item"))
			}
			ev.Kind, ev.Index = eventToolCallArgs, it.tool
		}
		if e.Delta == nil || *e.Delta == "" {
			return false, nil
		}
		it.streamed, ev.Text = true, *e.Delta
		return false, emit(ev)
	case "response.completed", "response.incomplete":
		if e.Response == nil {
			return false, malformedEvent(protoOpenAIResponses, errors.New(e.Type+" without response"))
		}
		return true, r.completed(e.Response, emit)
	}
	return false, nil
}

// completed emits the items of the final response the stream never showed
// (a minimal stream, or a buffered answer), in output order, then the tail.
func (r *responsesUpstreamStream) completed(resp *responsesObject, emit func(streamEvent) error) error {
	for i, it := range resp.Output {
		if _, seen := r.items[i]; !seen && it != nil {
			if err := r.done(i, it, emit); err != nil {
				return err
			}
		}
	}
	return emitTail(emit, resp.finish(r.tools > 0), resp.usage())
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
	if tc, ok := item.call(); ok && tc.Arguments != "" {
		return emit(streamEvent{Kind: eventToolCallArgs, Index: it.tool, Text: tc.Arguments})
	}
	if t := item.text(); item.Type == "message" && t != "" {
		return emit(streamEvent{Kind: eventText, Text: t})
	}
	return nil
}

func (r *responsesUpstreamStream) ended(func(streamEvent) error) (bool, error) { return false, nil }
