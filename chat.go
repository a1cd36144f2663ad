package main

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// OpenAI Chat Completions (caller POST /v1/chat/completions, provider {base}/chat/completions), both directions, buffered
// and streamed; the wire shapes serve both. A tool is declared in a call's shape: its type, nesting a Responses tool's members.
type (
	chatRequestBody struct {
		callerHead
		Messages            json.RawMessage `json:"messages"`
		Tools               json.RawMessage `json:"tools,omitempty"`
		ToolChoice          json.RawMessage `json:"tool_choice,omitempty"`
		ParallelToolCalls   *bool           `json:"parallel_tool_calls,omitempty"`
		MaxTokens           *int            `json:"max_tokens,omitempty"`
		MaxCompletionTokens *int            `json:"max_completion_tokens,omitempty"`
		Stop                json.RawMessage `json:"stop,omitempty"`
		ResponseFormat      struct {
			Type       string       `json:"type"`
			JSONSchema outputFormat `json:"json_schema,omitzero"`
		} `json:"response_format,omitzero"`
		ReasoningEffort string          `json:"reasoning_effort,omitempty"`
		Verbosity       string          `json:"verbosity,omitempty"`
		StreamOptions   json.RawMessage `json:"stream_options,omitempty"`
		openAIShared
	}
	chatMessage struct {
		Role       string          `json:"role,omitempty"`
		Content    json.RawMessage `json:"content,omitempty"` // string, parts, or null beside tool calls
		ToolCalls  []chatToolCall  `json:"tool_calls,omitempty"`
		ToolCallID string          `json:"tool_call_id,omitempty"`
		Refusal    string          `json:"refusal,omitempty"` // answers only: the model refused
	}
	chatPart struct {
		Type     string  `json:"type"`
		Text     *string `json:"text,omitempty"`
		ImageURL chatURL `json:"image_url,omitzero"`
		File     chatURL `json:"file,omitzero"`
	}
	chatURL struct { // an image_url's members, or a file's
		URL      string `json:"url,omitempty"`
		Detail   string `json:"detail,omitempty"`
		FileData string `json:"file_data,omitempty"`
		Filename string `json:"filename,omitempty"`
	}
	chatToolCall struct { // a call, or a tool's declaration
		Index    *int          `json:"index,omitempty"` // stream deltas only
		ID       string        `json:"id,omitempty"`
		Type     string        `json:"type,omitempty"`
		Function *chatFunction `json:"function,omitempty"`
		Custom   *chatFunction `json:"custom,omitempty"`
	}
	chatFunction struct { // what a declaration or a call nests under its type
		tool
		Arguments *string `json:"arguments,omitempty"` // a function call's
		Input     *string `json:"input,omitempty"`     // a custom call's
	}
	chatCompletion struct { // the answer, and each chunk of a stream
		ID      string       `json:"id,omitempty"`
		Object  string       `json:"object,omitempty"`
		Created int64        `json:"created,omitempty"`
		Model   string       `json:"model,omitempty"`
		Choices []chatChoice `json:"choices"`
		Usage   *chatUsage   `json:"usage,omitempty"`
	}
	chatChoice struct {
		Index        int          `json:"index"`
		Message      *chatMessage `json:"message,omitempty"`
		Delta        *chatMessage `json:"delta,omitempty"`
		Logprobs     *string      `json:"logprobs"`
		FinishReason *string      `json:"finish_reason"`
	}
	chatUsage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
)

// chatNested names the members Brama carries of what a part or tool nests under its type (and a Responses tool's).
var chatNested = map[string]string{"image_url": "url detail", "file": "file_data filename",
	toolFunction: "type name description parameters strict", toolCustom: "type name description format"}

// parseChatCompletions parses a caller's body; every step runs and the first refusal wins.
func parseChatCompletions(cr *callerRequest) (chatRequest, error) {
	var b chatRequestBody
	req, err := newCallerRequest(cr, &b, &b.callerHead, "model messages tools tool_choice parallel_tool_calls max_tokens max_completion_tokens temperature top_p stop response_format reasoning_effort verbosity stream stream_options "+openAISharedNames)
	req.Shared, req.ParallelToolCalls, req.Verbosity = b.openAIShared, b.ParallelToolCalls, b.Verbosity
	req.Effort, req.EffortName = b.ReasoningEffort, pick(b.ReasoningEffort != "", "reasoning_effort", "")
	if rawShape(b.Stop) == '"' { // one sequence, or an array of them
		b.Stop = slices.Concat([]byte("["), b.Stop, []byte("]"))
	}
	b.ResponseFormat.JSONSchema.Type = b.ResponseFormat.Type // "" when none
	rf := rawMember(cr.body.src, "response_format")
	req.dropUnknown(rf, "type json_schema") // structured output's other members are named
	req.dropUnknown(rawMember(rf, "json_schema"), "name description schema strict")
	err = cmp.Or(err, readList(b.Messages, "messages", req.addChatMessage),
		readList(b.Tools, "tools", func(t chatToolCall, raw json.RawMessage, what string) error { // as Responses' flat tool
			flat := valueOr(map[string]*chatFunction{toolFunction: t.Function, toolCustom: t.Custom}[t.Type], chatFunction{}).tool
			if flat.Type = t.Type; t.Type == toolFunction || t.Type == toolCustom {
				req.dropUnknown(raw, "type "+t.Type)
				req.dropUnknown(rawMember(raw, t.Type), strings.TrimPrefix(chatNested[t.Type], "type "))
				return req.addOpenAITool(flat, nil, what)
			}
			req.drop(true, cmp.Or(t.Type, "tools")) // another type is dropped and named
			return nil
		}),
		req.setOpenAIToolChoice(b.ToolChoice, true),
		readList(b.Stop, "stop", func(stop string, _ json.RawMessage, _ string) error { // [] asks for nothing
			req.Stop, req.StopName = append(req.Stop, stop), "stop"
			return nil
		}),
		req.setOutput(b.ResponseFormat.JSONSchema, "response_format"))
	return req.finishParse(err, "messages must hold at least one user, assistant or tool message")
}

// addChatMessage adds one Chat Completions message, naming raw's unknown members; "" beside tool calls is no text.
// Content is a string or text, image_url and file parts; others (audio, an earlier refusal) are dropped and named.
func (req *chatRequest) addChatMessage(m chatMessage, raw json.RawMessage, what string) error {
	req.dropUnknown(raw, "role content tool_calls tool_call_id")
	switch {
	case m.Role == "system" || m.Role == "developer":
		return req.addSystemOf(m.Content, what+".content", "text")
	case m.Role == "tool" && m.ToolCallID == "":
		return refuse("invalid_request", "%s.tool_call_id is required", what)
	case m.Role == "tool":
		text, err := req.callerTextOf(m.Content, what+".content", "text", "\n")
		req.Messages = appendPart(req.Messages, "user", part{Type: partToolResult, ToolCallID: m.ToolCallID, Text: text})
		return err
	case m.Role == "assistant" && rawIsNull(m.Content): // beside tool calls
		m.Content = json.RawMessage("[]")
	case m.Role != "user" && m.Role != "assistant":
		return refuse("invalid_request", "%s.role %s is not system, developer, user, assistant or tool", what, quoteCallerToken(m.Role))
	}
	parts, err := callerParts(req, m.Content, what+".content", "content parts",
		func(cp chatPart, raw json.RawMessage, path string) (p part, _ string, err error) {
			switch img, doc := cp.ImageURL, cp.File; {
			case cp.Type == "text":
				p, err = textPart(cp.Text, path)
			case cp.Type == "image_url":
				p, err = part{Type: partImage, URL: img.URL, Detail: img.Detail}, checkCallerURL(img.URL, path+".image_url.url")
			case cp.Type == "file" && doc.FileData != "":
				p, err = part{Type: partDocument, URL: doc.FileData, Filename: doc.Filename}, checkCallerURL(doc.FileData, path+".file.file_data")
			default: // a part Brama does not carry
				return p, cp.Type, nil
			}
			req.dropUnknown(rawMember(raw, cp.Type), chatNested[cp.Type]) // the members of its object not carried
			return p, "type " + cp.Type, err
		})
	parts = slices.DeleteFunc(parts, func(p part) bool { return p.Type == partText && p.Text == "" && len(m.ToolCalls) > 0 })
	for i, tc := range m.ToolCalls { // an assistant's only, as tool_use is in messages
		c, ok := tc.call(tc.Type == toolCustom) // a custom call reads no function, nor a function call custom
		if !ok || m.Role != "assistant" {
			return refuse("invalid_request", "%s.tool_calls[%d] must be an assistant's function or custom call with an id and a name", what, i)
		}
		parts = append(parts, c)
	}
	if err == nil && len(parts) == 0 {
		err = refuse("invalid_request", "%s needs content (text, image or file parts) or tool_calls", what)
	}
	req.Messages = append(req.Messages, message{Role: m.Role, Parts: parts})
	return err
}

// addOpenAITool adds a function, custom or namespace tool (raw: its members); another (a hosted tool) is dropped and named.
func (req *chatRequest) addOpenAITool(t tool, raw json.RawMessage, what string) error {
	switch {
	case t.Name == "" && slices.Contains([]string{toolFunction, toolCustom, "namespace"}, t.Type):
		return refuse("invalid_request", "%s needs a name", what)
	case t.Type == toolFunction || t.Type == toolCustom:
		req.dropUnknown(raw, chatNested[t.Type]) // a custom tool carries no parameters (not read), a function no format
		fn := t.Type == toolFunction
		params, err := jsonObject(pick(fn, t.Parameters, nil), what+".parameters")
		t.Tools, t.Parameters, t.Strict, t.Format = nil, params, pick(fn, t.Strict, nil), pick(fn, nil, t.Format)
		req.Tools = append(req.Tools, t)
		return err // on an error the whole request is refused
	case t.Type == "namespace":
		req.dropUnknown(raw, "type name tools") // a group carries no description
		n := len(req.Tools)
		err := readList(t.Tools, what+".tools", req.addOpenAITool)
		for j := n; j < len(req.Tools); j++ {
			req.Tools[j].Namespace, req.Tools[j].Name = t.Name, t.Name+"__"+req.Tools[j].Name
		}
		return err
	}
	req.drop(true, cmp.Or(t.Type, "tools"))
	return nil
}

// setOpenAIToolChoice reads tool_choice: a mode or one tool (nested in chat, flat in responses); other objects (allowed_tools, a hosted tool) are dropped.
func (req *chatRequest) setOpenAIToolChoice(raw json.RawMessage, nested bool) (err error) {
	var tc struct {
		Type, Name, Namespace string
		Function, Custom      struct{ Name string }
	}
	mode, isMode := jsonString(raw)
	if !isMode && !rawIsNull(raw) { // an object, or a type error naming tool_choice
		err = decodeCallerJSON(raw, &tc, "tool_choice")
	}
	tc.Name = pick(nested, tc.Function.Name+tc.Custom.Name, tc.Name)
	switch {
	case rawIsNull(raw) || err != nil:
	case isMode && slices.Contains([]string{toolChoiceAuto, toolChoiceNone, toolChoiceRequired}, mode):
		req.ToolChoice = &toolChoice{Mode: mode}
	case !isMode && tc.Type != toolFunction && tc.Type != toolCustom:
		req.drop(true, "tool_choice")
	case isMode || tc.Name == "":
		return refuse("invalid_request", `tool_choice must be "auto", "none", "required" or a named tool`)
	default: // a namespace member by its flat name
		req.ToolChoice = &toolChoice{Mode: toolChoiceTool, Name: strings.TrimPrefix(tc.Namespace+"__"+tc.Name, "__")}
	}
	return err
}

// openAIToolChoice is req's tool_choice as the OpenAI formats write it; a named tool's name nested under its type in chat.
func (req chatRequest) openAIToolChoice(nested bool) json.RawMessage {
	c := req.ToolChoice
	if c == nil {
		return nil
	} else if c.Mode != toolChoiceTool {
		return jsonText(c.Mode)
	}
	kind := valueOr(req.findTool(c.Name), tool{Type: toolFunction}).Type // function or custom
	if nested {
		return must(json.Marshal(map[string]any{"type": kind, kind: map[string]string{"name": c.Name}}))
	}
	return must(json.Marshal(map[string]string{"type": kind, "name": c.Name}))
}

// encodeChat builds a Chat Completions body; tool results become role "tool" messages placed first, right after the assistant turn that called them.
func encodeChat(req *chatRequest, c call, _ http.Header) ([]byte, error) {
	limit, completion := pick(req.MaxTokens > 0, &req.MaxTokens, nil), c.res.Provider.limitName != "" // reasoning models
	out := chatRequestBody{callerHead: callerHead{c.res.Model, req.Temperature, req.TopP, req.Stream}, ParallelToolCalls: req.ParallelToolCalls,
		ReasoningEffort: req.Effort, Verbosity: req.Verbosity, ToolChoice: req.openAIToolChoice(true), Stop: jsonArray(req.Stop),
		MaxTokens: pick(!completion, limit, nil), MaxCompletionTokens: pick(completion, limit, nil), openAIShared: req.Shared}
	out.StreamOptions = pick(req.Stream, json.RawMessage(`{"include_usage":true}`), nil)
	msgs := pick(req.System != "", []chatMessage{{Role: "system", Content: jsonText(req.System)}}, []chatMessage{})
	for _, m := range req.Messages {
		msg := chatMessage{Role: m.Role, Content: json.RawMessage("null")}
		var parts []chatPart
		for _, p := range m.Parts {
			switch p.Type {
			case partText:
				parts = append(parts, chatPart{Type: "text", Text: &p.Text})
			case partImage:
				parts = append(parts, chatPart{Type: "image_url", ImageURL: chatURL{URL: p.URL, Detail: p.Detail}})
			case partDocument:
				parts = append(parts, chatPart{Type: "file", File: chatURL{FileData: p.URL, Filename: p.Filename}})
			case partToolCall:
				msg.ToolCalls = append(msg.ToolCalls, chatCall(nil, p.ToolCallID, p.ToolName, p.Arguments, p.Custom))
			case partToolResult:
				msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: p.ToolCallID, Content: jsonText(p.Text)})
				for _, q := range p.Media { // a tool message holds only text
					req.drop(true, q.Type)
				}
			}
		}
		switch {
		case len(parts) == 0 && len(msg.ToolCalls) == 0:
			continue // only tool results: already sent as role "tool"
		case m.Role == "user" && slices.ContainsFunc(parts, func(cp chatPart) bool { return cp.Text == nil }):
			msg.Content = must(json.Marshal(parts)) // images or files: parts, else one string
		case len(parts) > 0: // an assistant's content is text only
			msg.Content = jsonText(textOf(m.Parts, ""))
			for _, p := range m.Parts {
				req.drop(p.Type == partImage || p.Type == partDocument, p.Type)
			}
		}
		msgs = append(msgs, msg)
	}
	out.Messages = must(json.Marshal(msgs))
	var tools []chatToolCall
	for _, t := range req.Tools {
		f := &chatFunction{tool: t}
		f.Type = ""
		tools = append(tools, pick(t.Type == toolCustom, chatToolCall{Type: t.Type, Custom: f}, chatToolCall{Type: t.Type, Function: f}))
	}
	out.Tools = jsonArray(tools)
	if f := req.Output; f != nil {
		out.ResponseFormat.Type, out.ResponseFormat.JSONSchema = f.Type, *openAIOutput(f)
		out.ResponseFormat.JSONSchema.Type = ""
	}
	return json.Marshal(out)
}

// chatCall is a call as Chat Completions writes it: a function's arguments are "{}" for none but in a stream's indexed call.
func chatCall(index *int, id, name, args string, custom bool) chatToolCall {
	fn := tool{Name: name}
	if custom {
		return chatToolCall{Index: index, ID: id, Type: toolCustom, Custom: &chatFunction{tool: fn, Input: &args}}
	} else if index == nil {
		args = argumentsText(args)
	}
	return chatToolCall{Index: index, ID: id, Type: toolFunction, Function: &chatFunction{tool: fn, Arguments: &args}}
}

// call is tc as a neutral tool_call part: a custom call read from its custom member, else a function call from its
// function; ok is false when that member, its id or name, a custom call's input, or a known type is missing.
func (tc chatToolCall) call(custom bool) (part, bool) {
	f := valueOr(pick(custom, tc.Custom, tc.Function), chatFunction{})
	in := pick(custom, f.Input, f.Arguments)
	c := part{Type: partToolCall, ToolCallID: tc.ID, ToolName: f.Name, Arguments: valueOr(in, ""), Custom: custom}
	return c, c.ToolCallID != "" && c.ToolName != "" && (!custom || in != nil) &&
		slices.Contains([]string{"", toolFunction, toolCustom}, tc.Type)
}

// chatFinishes maps Chat Completions finish reasons to neutral ones; any other is a stop.
var chatFinishes = map[string]string{finishLength: finishLength, "model_length": finishLength,
	finishToolCalls: finishToolCalls, "function_call": finishToolCalls, finishContentFilter: finishContentFilter}

// decodeChat reads a complete answer as a stream's last chunk (a custom call without input as its stream's would be);
// no finish_reason is tool_calls beside calls, else stop.
func decodeChat(body []byte, rd *streamReader) error {
	var r chatCompletion
	err := json.Unmarshal(body, &r)
	if err != nil || len(r.Choices) == 0 || r.Choices[0].Message == nil || !rawIsNull(rawMember(body, "error")) {
		return malformedAnswer(protoOpenAIChat, err)
	}
	m := r.Choices[0].Message
	calls := pick(len(m.ToolCalls) > 0, finishToolCalls, finishStop)
	rd.finish = cmp.Or(chatFinishes[cmp.Or(valueOr(r.Choices[0].FinishReason, ""), calls)], finishStop)
	u := valueOr(r.Usage, chatUsage{})
	rd.usage = usage{u.PromptTokens, u.CompletionTokens, r.Usage != nil}
	return rd.delta(m)
}

// chatFrames writes chat.completion.chunk frames (no block framing: a call's deltas carry its index); at the end the
// finish, the usage chunk (choices: []) if asked and reported, [DONE]. Buffered: the chat.completion of the blocks.
func (s *callerStream) chatFrames(step streamStep, b *streamBlock, d string) error {
	var delta chatMessage
	switch {
	case step == stepBegin:
		s.id, s.created = newAnswerID("chatcmpl-", ""), time.Now().Unix()
		delta = chatMessage{Role: "assistant", Content: jsonText("")}
	case step == stepOpen && !b.text: // its id, type and name, a function's arguments empty
		delta.ToolCalls = []chatToolCall{chatCall(&b.index, newAnswerID("call_", b.id), b.name, "", b.custom)}
	case step == stepDelta && b.text:
		delta.Content = jsonText(d)
	case step == stepDelta: // the piece alone at its index
		delta.ToolCalls = []chatToolCall{chatCall(&b.index, "", "", d, b.custom)}
		delta.ToolCalls[0].Type = ""
	case step == stepFail: // the envelope of SPEC §8.1 as a final data frame
		return s.frame("", envelope{Error: *s.failure})
	case step == stepEnd:
		finish, n := new(cmp.Or(s.rd.finish, finishStop)), s.rd.usage // usage left out, not zeros, when unreported
		u := pick(n.Reported, &chatUsage{n.InputTokens, n.OutputTokens, n.InputTokens + n.OutputTokens}, nil)
		if s.flush == nil { // a buffered answer: content null beside only tool calls, as OpenAI sends it
			text, m := "", chatMessage{Role: "assistant"}
			for _, bl := range s.blocks {
				if bl.text {
					text += bl.buf.String()
				} else {
					m.ToolCalls = append(m.ToolCalls, chatCall(nil, newAnswerID("call_", bl.id), bl.name, bl.buf.String(), bl.custom))
				}
			}
			m.Content = pick(text != "" || len(m.ToolCalls) == 0, jsonText(text), json.RawMessage("null"))
			s.whole = chatCompletion{s.id, "chat.completion", s.created, s.model, []chatChoice{{Message: &m, FinishReason: finish}}, u}
		}
		s.chatChunk(nil, chatChoice{Delta: &chatMessage{}, FinishReason: finish})
		if s.req.StreamUsage && u != nil {
			s.chatChunk(u)
		}
		return s.write([]byte("data: [DONE]\n\n"), true) // the first write error sticks: this returns it
	default:
		return nil
	}
	return s.chatChunk(nil, chatChoice{Delta: &delta})
}

// chatChunk writes a chat.completion.chunk of this answer: its one choice, or none beside usage.
func (s *callerStream) chatChunk(u *chatUsage, choices ...chatChoice) error {
	return s.frame("", chatCompletion{s.id, "chat.completion.chunk", s.created, s.model, append([]chatChoice{}, choices...), u})
}

// readChat is the chat part of the one stream reader (relay.go's streamReader): each choice's finish_reason is the
// terminal signal (n > 1: the last choice's); usage may follow alone.
func (r *streamReader) readChat(e rawObject) (keep, end bool, err error) {
	u, err := usageOf(r.protocol, e.value("usage"))
	choices, ok := splitRaw(e.value("choices"), '[', r.elems[:])
	switch {
	case err != nil:
		return false, false, err
	case !ok && !rawIsNull(e.value("choices")):
		return false, false, eventWithout(r.protocol, "chunk", "a choices array")
	case u.Reported:
		r.usage = u
	}
	for _, c := range choices.members {
		co, ok := splitRaw(choices.src[c.val:c.end], '{', r.scratch[1][:])
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(string(co.value("index"))) // absent: choice 0
		if r.out != nil && n == 0 {                     // Brama never asks a translated call for n > 1
			var d chatMessage
			if err := r.decode(co, "delta", &d); err != nil {
				return false, false, err
			} else if err := r.delta(&d); err != nil {
				return false, false, err
			}
		}
		i := n & 127
		r.choices[0][i/64] |= 1 << (i % 64)
		if f := rawText(co.value("finish_reason")); len(f) > 0 {
			r.choices[1][i/64] |= 1 << (i % 64)
			if n == 0 {
				r.finish = cmp.Or(chatFinishes[string(f)], finishStop)
			}
		}
		r.finished = r.choices[0] == r.choices[1] && (r.finish != "" || r.out == nil) // translation reads choice 0
	}
	return !(r.dropUsage && u.Reported && len(choices.members) == 0), false, nil
}

// delta gives the caller stream the text of a chat delta, answer or Responses message item (a string, or parts as
// some chat providers send it), a refusal's too, and tool call pieces; calls after the first are held to the end.
func (r *streamReader) delta(d *chatMessage) error {
	var t string
	if !rawIsNull(d.Content) && json.Unmarshal(d.Content, &t) != nil {
		var parts []responsesPart // its text and refusal parts carry text
		if err := json.Unmarshal(d.Content, &parts); err != nil {
			return malformedAnswer(r.protocol, err)
		}
		for _, p := range parts { // a text part has no refusal, a refusal part no text
			t, r.refusal = t+valueOr(p.Text, "")+p.Refusal, r.refusal || p.Type == "refusal"
		}
	}
	t, r.refusal = t+d.Refusal, r.refusal || d.Refusal != "" // a refusal's text, and the finish content_filter
	if err := r.out.text(t); err != nil {
		return err
	}
	// a call starts new at its index, or carrying another id at it (Ollama's parallel calls all at 0, servers that send no index)
	for i, tc := range d.ToolCalls {
		i = valueOr(tc.Index, i)
		call, _ := tc.call(tc.Function == nil) // a custom call's deltas carry no function
		c := r.calls[i]
		if c == nil || call.ToolCallID != "" && c.id != "" && call.ToolCallID != c.id { // an id after an id-less start is that call's
			if call.ToolName == "" {
				return eventWithout(protoOpenAIChat, "tool call", "a name")
			}
			c = &upstreamCall{tool: r.ncalls, id: call.ToolCallID}
			r.calls[i], r.ncalls = c, r.ncalls+1
			if c.tool > 0 { // its start, its pieces gathered below
				r.held = append(r.held, part{Type: partToolCall, ToolCallID: call.ToolCallID, ToolName: call.ToolName, Custom: call.Custom})
			}
		}
		if c.tool > 0 {
			r.held[c.tool-1].Arguments += call.Arguments
		} else if err := r.out.call(0, call); err != nil {
			return err
		}
	}
	return nil
}
