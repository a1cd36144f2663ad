package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
)

// OpenAI Responses (caller POST /v1/responses, provider {base}/responses): both directions, buffered and streamed. The wire shapes serve both.
type (
	responsesRequestBody struct {
		callerHead
		Instructions      string          `json:"instructions,omitempty"`
		Input             json.RawMessage `json:"input"`
		Tools             json.RawMessage `json:"tools,omitempty"`
		ToolChoice        json.RawMessage `json:"tool_choice,omitempty"`
		ParallelToolCalls *bool           `json:"parallel_tool_calls,omitempty"`
		MaxOutputTokens   int             `json:"max_output_tokens,omitempty"`
		Reasoning         responsesOption `json:"reasoning,omitzero"`
		Text              responsesOption `json:"text,omitzero"`
		openAIShared
	}
	responsesOption struct { // reasoning and text share one shape, each its own members
		Effort    string        `json:"effort,omitempty"`
		Format    *outputFormat `json:"format,omitempty"`
		Verbosity string        `json:"verbosity,omitempty"`
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
		Tools     json.RawMessage `json:"tools,omitempty"`     // additional_tools (the Codex CLI's tools)
	}
	responsesPart struct {
		Type        string          `json:"type"`
		Text        *string         `json:"text,omitempty"`
		ImageURL    *string         `json:"image_url,omitempty"`
		Detail      string          `json:"detail,omitempty"`
		FileData    string          `json:"file_data,omitempty"`
		FileURL     string          `json:"file_url,omitempty"`
		Filename    string          `json:"filename,omitempty"`
		Annotations json.RawMessage `json:"annotations,omitempty"`
		Refusal     string          `json:"refusal,omitempty"` // answers only: the model refused
	}
	responsesObject struct { // the answer Brama writes; error, incomplete_details and usage are null until set
		ID                string           `json:"id"`
		Object            string           `json:"object"`
		CreatedAt         int64            `json:"created_at"`
		Status            string           `json:"status"`
		Error             any              `json:"error"`
		IncompleteDetails any              `json:"incomplete_details"`
		Model             string           `json:"model"`
		Output            []*responsesItem `json:"output"`
		Usage             any              `json:"usage"`
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
	}
)

// Tables: the members Brama carries of each part type; a call's item type, a custom tool's or a function's ("_output"
// makes its result's); incomplete_details.reason as finishes (responsesFrames the other way); each item type's events.
var (
	responsesPartMembers = map[string]string{"input_text": "type text", "output_text": "type text annotations",
		"input_image": "type image_url detail", "input_file": "type file_data file_url filename"}
	responsesCallTypes = map[bool]string{false: "function_call", true: "custom_tool_call"}
	responsesFinishes  = map[string]string{"max_output_tokens": finishLength, "content_filter": finishContentFilter}
	responsesEvents    = map[string][2]string{"message": {"response.output_text.delta", "response.output_text.done"},
		"function_call":    {"response.function_call_arguments.delta", "response.function_call_arguments.done"},
		"custom_tool_call": {"response.custom_tool_call_input.delta", "response.custom_tool_call_input.done"}}
	onePart = 0 // a message item's one content_index, shared by every event (never written)
)

// parseResponses reads a caller's Responses body; every step runs and the first refusal wins.
func parseResponses(cr *callerRequest) (chatRequest, error) {
	var b responsesRequestBody
	req, err := newCallerRequest(cr, &b, &b.callerHead, "model instructions input tools tool_choice parallel_tool_calls max_output_tokens temperature top_p reasoning text stream "+openAISharedNames)
	for _, ref := range []string{"previous_response_id", "conversation", "prompt"} { // refused as item_reference is
		if err == nil && !rawIsNull(rawMember(cr.body.src, ref)) {
			err = refuse("invalid_request", "%s is not supported across formats: it names what only the "+
				"provider that stored it holds; send the instructions and items themselves", ref)
		}
	}
	req.dropUnknown(rawMember(cr.body.src, "reasoning"), "effort")
	req.dropUnknown(rawMember(cr.body.src, "text"), "format verbosity")
	req.dropUnknown(rawMember(rawMember(cr.body.src, "text"), "format"), "type name description schema strict")
	req.Shared, req.ParallelToolCalls, req.System, req.Verbosity = b.openAIShared, b.ParallelToolCalls, b.Instructions, b.Text.Verbosity
	req.Effort, req.EffortName = b.Reasoning.Effort, pick(b.Reasoning.Effort != "", "effort", "")
	switch {
	case string(b.Input) == `""`, rawShape(b.Input) != '"' && rawShape(b.Input) != '[':
		err = cmp.Or(err, error(refuse("invalid_request", "input is required: a non-empty string or an array of items")))
	case rawShape(b.Input) == '"': // one user message
		b.Input = slices.Concat([]byte(`[{"role":"user","content":`), b.Input, []byte("}]"))
	}
	err = cmp.Or(err, readList(b.Input, "input", req.addResponsesItem), readList(b.Tools, "tools", req.addOpenAITool),
		req.setOpenAIToolChoice(b.ToolChoice, false), req.setOutput(valueOr(b.Text.Format, outputFormat{}), "text.format"))
	return req.finishParse(err, "input must hold at least one user, assistant or tool item")
}

// addResponsesItem adds one input item, naming a carried item's unknown members. Reasoning and hosted tool calls are dropped
// and named, and so is a reference to an earlier answer's text or reasoning (the Vercel AI SDK's store: true sends one);
// any other reference is refused: Brama keeps no responses.
func (req *chatRequest) addResponsesItem(it responsesItem, raw json.RawMessage, what string) error {
	msg, call := it.Type == "" || it.Type == "message", it.Type == "function_call" || it.Type == "custom_tool_call"
	output := it.Type == "function_call_output" || it.Type == "custom_tool_call_output"
	if msg || call || output || it.Type == "additional_tools" { // a carried item
		req.dropUnknown(raw, "type id status role content call_id namespace name arguments input output tools")
	}
	switch {
	case msg && (it.Role == "system" || it.Role == "developer"):
		return req.addSystemOf(it.Content, what+".content", "input_text")
	case msg && it.Role != "user" && it.Role != "assistant":
		return refuse("invalid_request", "%s.role %s is not one of user, assistant, system, developer", what, quoteCallerToken(it.Role))
	case msg:
		parts, err := req.responsesParts(it.Content, what+".content")
		if err == nil && len(parts) == 0 && it.Role == "user" {
			err = refuse("invalid_request", "%s.content must hold at least one text, image or file part", what)
		} else if len(parts) > 0 { // an earlier answer of only a refusal adds no turn: its parts are named
			req.Messages = append(req.Messages, message{Role: it.Role, Parts: parts})
		}
		return err
	case (call || output) && it.CallID == "", call && it.Name == "":
		return refuse("invalid_request", "%s needs a call_id, and a call a name", what)
	case call:
		tc, _ := it.call()
		if !tc.Custom && valueOr(it.Arguments, "") == "" {
			tc.Arguments = "" // absent arguments stay absent
		}
		req.Messages = appendPart(req.Messages, "assistant", tc)
		return nil
	case output:
		parts, err := req.responsesParts(it.Output, what+".output")
		req.Messages = appendPart(req.Messages, "user", toolResult(it.CallID, parts, it.Type == "custom_tool_call_output", false))
		return err
	case it.Type == "additional_tools": // tools declared in the input, as the Codex CLI sends them
		return readList(it.Tools, what+".tools", req.addOpenAITool)
	case it.Type == "item_reference" && !strings.HasPrefix(it.ID, "msg_") && !strings.HasPrefix(it.ID, "rs_"): // not text or reasoning
		return refuse("invalid_request", "%s: item references are not supported but to an earlier answer's text or reasoning; send the items themselves", what)
	}
	req.drop(true, it.Type)
	return nil
}

// responsesParts reads content: a string or text, image and file parts; others (a refusal, a file id) are dropped and named.
func (req *chatRequest) responsesParts(raw json.RawMessage, what string) ([]part, error) {
	return callerParts(req, raw, what, "content parts", func(rp responsesPart, raw json.RawMessage, at string) (p part, _ string, err error) {
		switch {
		case rp.Type == "input_text" || rp.Type == "output_text":
			p, err = textPart(rp.Text, at)
		case rp.Type == "input_image" && rp.ImageURL != nil:
			p, err = part{Type: partImage, URL: *rp.ImageURL, Detail: rp.Detail}, checkCallerURL(*rp.ImageURL, at+".image_url")
		case rp.Type == "input_file" && rp.FileData != "" && rp.FileURL != "": // one file per part
			err = refuse("invalid_request", "%s holds both file_data and file_url; send one", at)
		case rp.Type == "input_file" && rp.FileData+rp.FileURL != "":
			p, err = part{Type: partDocument, URL: rp.FileData + rp.FileURL, Filename: rp.Filename}, checkCallerURL(rp.FileData+rp.FileURL, at)
		default:
			return p, rp.Type, nil
		}
		return p, responsesPartMembers[rp.Type], err
	})
}

// encodeResponses builds a Responses body: text, images and files in message items, tool calls and results items of their own; codex gets SPEC §6.2's body.
func encodeResponses(req *chatRequest, c call, _ http.Header) ([]byte, error) {
	out := responsesRequestBody{callerHead: callerHead{c.res.Model, req.Temperature, req.TopP, req.Stream}, Instructions: req.System,
		ParallelToolCalls: req.ParallelToolCalls, MaxOutputTokens: req.MaxTokens, Reasoning: responsesOption{Effort: req.Effort},
		Text: responsesOption{Format: openAIOutput(req.Output), Verbosity: req.Verbosity}, openAIShared: req.Shared}
	req.drop(len(req.Stop) > 0, req.StopName)
	if c.res.Provider.codex { // it never gets an output limit, and its backend refuses these (SPEC §6.2)
		req.drop(req.LimitName != "", req.LimitName)
		req.drop(req.Temperature != nil, "temperature")
		req.drop(req.TopP != nil, "top_p")
		req.dropShared(openAIShared{Metadata: out.Metadata, SafetyIdentifier: out.SafetyIdentifier, User: out.User})
		out.callerHead, out.MaxOutputTokens = callerHead{Model: c.res.Model, Stream: req.Stream}, 0
		out.Instructions, out.openAIShared = cmp.Or(req.System, codexDefaultInstructions),
			openAIShared{Store: json.RawMessage("false"), ServiceTier: out.ServiceTier, PromptCacheKey: out.PromptCacheKey}
	}
	items := []responsesItem{}
	for _, m := range req.Messages {
		role := pick(m.Role == "system" && c.res.Provider.codex, "developer", m.Role) // codex refuses system items
		var content []responsesPart
		for i, p := range m.Parts { // a call or a result has no content; the content before it (or at the end) is one message item
			content = append(content, responsesContent([]part{p}, m.Role == "assistant")...)
			if len(content) > 0 && (p.Type == partToolCall || p.Type == partToolResult || i == len(m.Parts)-1) {
				items, content = append(items, responsesItem{Type: "message", Role: role, Content: must(json.Marshal(content))}), nil
			}
			if p.Type == partToolCall { // named in its namespace as the caller declared it
				t := valueOr(req.findTool(p.ToolName), tool{Name: p.ToolName})
				it := responsesItem{Type: responsesCallTypes[p.Custom], CallID: p.ToolCallID, Namespace: t.Namespace, Name: t.memberName()}
				it.fill(pick(p.Custom, p.Arguments, argumentsText(p.Arguments))) // a custom tool's input as is
				items = append(items, it)
			} else if p.Type == partToolResult { // its text, or parts with its images and documents
				output := jsonText(p.Text)
				if len(p.Media) > 0 {
					output = must(json.Marshal(responsesContent(append([]part{{Type: partText, Text: p.Text}}, p.Media...), false)))
				}
				items = append(items, responsesItem{Type: responsesCallTypes[p.Custom] + "_output", CallID: p.ToolCallID, Output: output})
			}
		}
	}
	out.Input = must(json.Marshal(items))
	tools := slices.Clone(req.Tools) // a namespaced tool goes flattened: no provider sees a group
	for i, t := range tools {
		if t.Type == toolFunction {
			tools[i].Strict, tools[i].Parameters = cmp.Or(t.Strict, new(false)), orEmptySchema(t.Parameters)
		}
	}
	out.Tools, out.ToolChoice = jsonArray(tools), req.openAIToolChoice(false)
	return json.Marshal(out)
}

// call is a call item as a neutral tool_call part, its name flattened.
func (it *responsesItem) call() (part, bool) {
	tc := part{Type: partToolCall, ToolCallID: it.CallID, ToolName: strings.TrimPrefix(it.Namespace+"__"+it.Name, "__"),
		Custom: it.Type == "custom_tool_call"}
	tc.Arguments = pick(tc.Custom, valueOr(it.Input, ""), argumentsText(valueOr(it.Arguments, "")))
	return tc, tc.Custom || it.Type == "function_call"
}

// fill sets an item's whole text, arguments or input.
func (it *responsesItem) fill(full string) {
	switch it.Type {
	case "message":
		it.Content = must(json.Marshal([]responsesPart{outputText(full)}))
	case "custom_tool_call":
		it.Input = &full
	default:
		it.Arguments = &full
	}
}

// responsesContent is parts as Responses input (an assistant's text: output) parts, no empty text.
func responsesContent(ps []part, assistant bool) []responsesPart {
	var out []responsesPart
	for _, p := range ps {
		switch {
		case p.Type == partText && p.Text != "":
			out = append(out, responsesPart{Type: pick(assistant, "output_text", "input_text"), Text: new(p.Text)})
		case p.Type == partImage:
			out = append(out, responsesPart{Type: "input_image", ImageURL: new(p.URL), Detail: p.Detail})
		case p.Type == partDocument && strings.HasPrefix(p.URL, "data:"):
			out = append(out, responsesPart{Type: "input_file", FileData: p.URL, Filename: p.Filename})
		case p.Type == partDocument:
			out = append(out, responsesPart{Type: "input_file", FileURL: p.URL, Filename: p.Filename})
		}
	}
	return out
}

// responsesFrames writes Responses events, one output item at a time, keeping the response whole for response.completed.
func (s *callerStream) responsesFrames(step streamStep, b *streamBlock, d string) error {
	switch step {
	case stepBegin:
		s.resp = responsesObject{ID: newAnswerID("resp_", ""), Object: "response", CreatedAt: time.Now().Unix(),
			Model: s.model, Status: "in_progress", Output: []*responsesItem{}}
		s.whole = &s.resp
		return s.emit(nil, responsesEvent{Type: "response.created", Response: &s.resp})
	case stepOpen:
		it := &responsesItem{Type: "message", ID: "msg_", Role: "assistant", Content: json.RawMessage("[]")} // ID: its prefix
		if !b.text {
			it = &responsesItem{Type: responsesCallTypes[b.custom], ID: "fc_", CallID: newAnswerID("call_", b.id), Namespace: b.namespace, Name: b.name}
			it.fill("")
		}
		it.ID, it.Status, s.resp.Output = newAnswerID(it.ID, ""), "in_progress", append(s.resp.Output, it)
		return s.emit(b, responsesEvent{Type: "response.output_item.added", Item: it},
			responsesEvent{Type: "response.content_part.added", Part: new(outputText(""))})
	case stepDelta: // an item already done (a provider interleaving calls) gets its final input updated
		it := s.resp.Output[b.pos]
		if it.Status == "completed" {
			it.fill(b.buf.String())
		}
		return s.emit(b, responsesEvent{Type: responsesEvents[it.Type][0], Delta: &d})
	case stepClose: // its text's (and its part's) or its call's done events, then the item's
		it := s.resp.Output[b.pos]
		it.Status = "completed"
		it.fill(d)
		done := responsesEvent{Type: responsesEvents[it.Type][1], Text: pick(b.text, &d, nil), Arguments: it.Arguments, Input: it.Input}
		return s.emit(b, done, responsesEvent{Type: "response.content_part.done", Part: new(outputText(d))},
			responsesEvent{Type: "response.output_item.done", Item: it})
	case stepEnd: // "incomplete" with a reason as OpenAI reports it (SPEC §7.5): SDK stream helpers wait for this event
		s.resp.Status = "completed"
		if reason := map[string]string{finishLength: "max_output_tokens", finishContentFilter: "content_filter"}[s.rd.finish]; reason != "" {
			s.resp.Status, s.resp.IncompleteDetails = "incomplete", map[string]string{"reason": reason}
		}
		if u := s.rd.usage; u.Reported { // else null; the details always go: strict clients require them, Brama counts neither
			s.resp.Usage = map[string]any{"input_tokens": u.InputTokens, "input_tokens_details": map[string]int{"cached_tokens": 0},
				"output_tokens": u.OutputTokens, "output_tokens_details": map[string]int{"reasoning_tokens": 0},
				"total_tokens": u.InputTokens + u.OutputTokens}
		}
		return s.emit(nil, responsesEvent{Type: "response.completed", Response: &s.resp})
	}
	s.resp.Status, s.resp.Error = "failed", map[string]string{"code": s.failure.Code, "message": s.failure.Message} // stepFail
	return s.emit(nil, responsesEvent{Type: "response.failed", Response: &s.resp})
}

// emit writes Responses events numbered in order, those of block b's output item at its index: within the item (but
// the item's own events) naming it, a message's at its one content part; a call has no part, so no part events.
func (s *callerStream) emit(b *streamBlock, evs ...responsesEvent) (err error) {
	for _, ev := range evs {
		if b != nil {
			ev.OutputIndex = &b.pos
			if ev.Item == nil {
				ev.ItemID, ev.ContentIndex = s.resp.Output[b.pos].ID, pick(b.text, &onePart, nil)
			}
		}
		if err == nil && (ev.Part == nil || b.text) { // a part event comes only with a block
			ev.SequenceNumber, s.seq = s.seq, s.seq+1
			err = s.frame(ev.Type, ev)
		}
	}
	return err
}

func outputText(text string) responsesPart {
	return responsesPart{Type: "output_text", Text: &text, Annotations: json.RawMessage("[]")}
}

// readResponses: response.completed (or .incomplete) ends, with usage; an output item's start, deltas and end are
// keyed by output_index, and a buffered codex caller keeps each ended item as sent.
func (r *streamReader) readResponses(typ string, e rawObject) (keep, end bool, err error) {
	switch typ {
	case "response.completed", "response.incomplete":
		resp, ok := splitRaw(e.value("response"), '{', r.scratch[1][:])
		if !ok {
			return false, false, eventWithout(protoOpenAIResponses, typ, "response")
		}
		r.usage, err = usageOf(r.protocol, resp.value("usage"))
		if r.finished = true; len(r.raw) > 0 { // a buffered codex caller: its output the items ended, by output_index
			var items [][]byte
			for _, i := range slices.Sorted(maps.Keys(r.raw)) {
				items = append(items, r.raw[i])
			}
			r.final = resp.edit(memberEdit{"output", append(append([]byte("["), bytes.Join(items, []byte(","))...), ']')})
		} else if r.raw != nil { // none ended: as sent
			r.final = bytes.Clone(resp.src)
		}
		if err == nil && r.out != nil {
			err = decodeResponses(e.value("response"), r)
		}
		return err == nil, true, err
	case "response.output_item.added", "response.output_item.done", "response.output_text.delta", "response.refusal.delta",
		"response.function_call_arguments.delta", "response.custom_tool_call_input.delta":
		if r.out == nil && (r.raw == nil || typ != "response.output_item.done") {
			break // a passthrough relay decodes none of them, a buffered codex caller only the ended items
		}
		var ev struct {
			OutputIndex int             `json:"output_index"`
			Item        json.RawMessage `json:"item"`
			Delta       string          `json:"delta"`
		}
		var item responsesItem
		isItem, done := strings.HasPrefix(typ, "response.output_item."), typ == "response.output_item.done"
		if json.Unmarshal(e.src, &ev) != nil ||
			isItem && (rawShape(ev.Item) != '{' || r.out != nil && json.Unmarshal(ev.Item, &item) != nil) {
			return false, false, eventWithout(protoOpenAIResponses, typ, "an index and an item")
		}
		it := r.calls[ev.OutputIndex]
		if it == nil && r.out != nil {
			it = &upstreamCall{tool: -1}
			r.calls[ev.OutputIndex] = it
		}
		r.refusal = r.refusal || typ == "response.refusal.delta"
		switch {
		case r.out == nil:
			r.raw[ev.OutputIndex] = ev.Item // decoding copied it out of the reader's buffer
			return true, false, nil
		case isItem:
			err = r.item(it, &item, done)
		case typ == "response.output_text.delta" || typ == "response.refusal.delta":
			err = r.out.text(ev.Delta)
		case it.tool < 0:
			err = eventWithout(protoOpenAIResponses, typ, "a call item")
		default:
			err = r.out.call(it.tool, part{Arguments: ev.Delta})
		}
		it.streamed = it.streamed || ev.Delta != "" || done // a done item gives nothing again
	}
	return err == nil, false, err
}

// decodeResponses reads the final response, a buffered answer (completed or incomplete) or a finished stream's last:
// the items the stream never showed (a minimal stream, a buffered answer), then the tail.
func decodeResponses(body []byte, r *streamReader) error {
	var resp struct {
		Status            string
		IncompleteDetails struct{ Reason string } `json:"incomplete_details"`
		Output            []*responsesItem
	}
	err := json.Unmarshal(body, &resp)
	if err == nil && !r.finished { // a stream read its usage with its terminal signal
		r.usage, err = usageOf(protoOpenAIResponses, rawMember(body, "usage"))
	}
	if err != nil || !r.finished && resp.Status != "completed" && resp.Status != "incomplete" {
		return malformedAnswer(protoOpenAIResponses, err)
	}
	for i, item := range resp.Output { // the first refusal stops it
		if _, seen := r.calls[i]; !seen && item != nil && err == nil {
			err = r.item(&upstreamCall{tool: -1}, item, true)
		}
	}
	r.finish = cmp.Or(responsesFinishes[resp.IncompleteDetails.Reason], pick(r.ncalls > 0, finishToolCalls, finishStop))
	return err
}

// item takes an output item as added or done: a call starts its tool call; a done item whose deltas never came
// gives its text or arguments whole.
func (r *streamReader) item(it *upstreamCall, item *responsesItem, done bool) error {
	tc, isCall := item.call()
	if !done || it.streamed { // it gives no text or arguments
		tc.Arguments, item.Content = "", nil
	}
	switch {
	case isCall && it.tool < 0 && item.Name == "":
		return eventWithout(protoOpenAIResponses, "a call item", "a name")
	case isCall && it.tool < 0:
		it.tool, r.ncalls = r.ncalls, r.ncalls+1
		fallthrough
	case isCall: // its start, or its arguments whole
		return r.out.call(it.tool, tc)
	case item.Type == "message": // reasoning gives nothing
		return r.delta(&chatMessage{Content: item.Content})
	}
	return nil
}
