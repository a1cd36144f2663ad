package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// Reading a caller's body (SPEC §7.6): a member with no counterpart elsewhere is dropped
// and named (chatRequest.Dropped), one unreadable refused as invalid_request, never quoted.

func refuseInvalid(format string, args ...any) *apiError {
	return refuse("invalid_request", format, args...)
}

// decodeCallerJSON unmarshals data into v; an error is an invalid_request naming the
// member at fault under what ("" for the body), quoting nothing (SPEC §7.6).
func decodeCallerJSON(data []byte, v any, what string) error {
	err := json.Unmarshal(data, v)
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se):
		return refuseInvalid("malformed JSON at byte %d", se.Offset).because(err)
	case !errors.As(err, &te):
		return refuseInvalid("malformed JSON").because(err)
	}
	field := strings.Trim(what+"."+te.Field, ".")
	if field == "" {
		return refuseInvalid("the request body must be a JSON object").because(err)
	}
	return refuseInvalid("%s: expected %s, got %s", field, callerJSONKind(te.Type), truncateUTF8(te.Value, 32)).because(err)
}

// callerJSONKinds names the JSON shape of each Go kind the caller shapes use.
var callerJSONKinds = map[reflect.Kind]string{reflect.String: "a string", reflect.Bool: "a boolean",
	reflect.Int: "an integer", reflect.Float64: "a number", reflect.Slice: "an array"}

// callerJSONKind names the JSON shape a Go type decodes from; a struct is an object.
func callerJSONKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return cmp.Or(callerJSONKinds[t.Kind()], "an object")
}

// rawIsNull reports an absent or null value (raw is valid JSON: only null starts with n).
func rawIsNull(raw json.RawMessage) bool { s := rawShape(raw); return s == 0 || s == 'n' }

// rawShape is the first byte of a JSON value ('"', '[', '{', …); 0 when absent.
func rawShape(raw json.RawMessage) byte {
	if raw = bytes.TrimSpace(raw); len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// dropUnknown names in d, in the body's order, every member of the JSON
// object raw not in known (space-separated); a non-object names nothing.
func dropUnknown(d *[]string, raw json.RawMessage, known string) {
	o, _ := splitRaw(raw, '{', nil)
	for _, m := range o.members {
		// encoding/json matches member names without regard to case.
		if k := string(m.key); !slices.ContainsFunc(strings.Fields(known), func(n string) bool { return strings.EqualFold(n, k) }) {
			*d = append(*d, k)
		}
	}
}

// itemName names a dropped array item (a hosted tool, a reasoning item, a
// thinking block) by its type, else by the array's member in what.
func itemName(raw json.RawMessage, what string) string {
	var it struct{ Type string }
	json.Unmarshal(raw, &it)
	what, _, _ = strings.Cut(what[strings.LastIndex(what, ".")+1:], "[")
	return cmp.Or(it.Type, what)
}

func rawItems(raw json.RawMessage) []json.RawMessage {
	var items []json.RawMessage
	json.Unmarshal(raw, &items)
	return items
}

// callerHead holds the members every format's request body shares.
type callerHead struct {
	Model       string   `json:"model"`
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	Stream      bool     `json:"stream,omitempty"`
}

// head is the shared members of a provider body for model.
func (req chatRequest) head(model string, o upstreamOptions) callerHead {
	return callerHead{Model: model, Temperature: req.Temperature, TopP: req.TopP, Stream: o.stream}
}

// newCallerRequest decodes body into b (embedding h), checks the shared members, names the unknown ones.
func newCallerRequest(body []byte, b any, h *callerHead, known, limitName string, limit **int) (chatRequest, error) {
	if err := decodeCallerJSON(body, b, ""); err != nil {
		return chatRequest{}, err
	}
	if h.Model == "" {
		return chatRequest{}, refuseInvalid("model is required and must be a non-empty string")
	}
	req := chatRequest{Model: h.Model, Temperature: h.Temperature, TopP: h.TopP, Stream: h.Stream}
	var err error
	if req.MaxTokens, err = checkCallerMaxTokens(limitName, *limit); err != nil {
		return chatRequest{}, err
	}
	if req.MaxTokens > 0 {
		req.LimitName = limitName
	}
	dropUnknown(&req.Dropped, body, known)
	return req, nil
}

// callerContent reads a string (one text part) or an array of T (kind, in the refusal).
func callerContent[T any](raw json.RawMessage, what, kind string) (text []part, items []T, err error) {
	switch rawShape(raw) {
	case '"':
		var s string
		err := decodeCallerJSON(raw, &s, what)
		return []part{{Type: partText, Text: s}}, nil, err
	case '[':
		err := decodeCallerJSON(raw, &items, what)
		return nil, items, err
	}
	return nil, nil, refuseInvalid("%s must be a string or an array of %s", what, kind)
}

// callerParts reads content in every format: a string, or parts (kind) that read
// turns into neutral ones, given each one's raw JSON and path, with the path of
// the URL to check; a part it leaves untyped is dropped and named.
func callerParts[T any](req *chatRequest, raw json.RawMessage, what, kind string,
	read func(T, json.RawMessage, string) (part, string, error)) ([]part, error) {
	text, items, err := callerContent[T](raw, what, kind)
	if err != nil || text != nil {
		return text, err
	}
	var parts []part
	raws := rawItems(raw)
	for i, it := range items {
		pw := fmt.Sprintf("%s[%d]", what, i)
		p, urlPath, err := read(it, raws[i], pw)
		if err == nil && (p.Type == partImage || p.Type == partDocument) {
			err = checkCallerURL(p.ImageURL+p.FileURL, urlPath)
		}
		switch {
		case err != nil:
			return nil, err
		case p.Type == "":
			req.Dropped = append(req.Dropped, itemName(raws[i], pw))
		default:
			parts = append(parts, p)
		}
	}
	return parts, nil
}

// checkCallerMaxTokens refuses a caller's limit below 1 (SPEC §8.2 "bad limits").
func checkCallerMaxTokens(name string, v *int) (int, error) {
	if v == nil {
		return 0, nil
	}
	if *v < 1 {
		return 0, refuseInvalid("%s must be at least 1", name)
	}
	return *v, nil
}

// parseCallerSchema reads a JSON Schema member: null is nil, an object kept compacted, the rest refused.
func parseCallerSchema(raw json.RawMessage, what string) (json.RawMessage, error) {
	if rawIsNull(raw) {
		return nil, nil
	}
	if rawShape(raw) != '{' {
		return nil, refuseInvalid("%s must be a JSON Schema object", what)
	}
	var b bytes.Buffer
	json.Compact(&b, raw)
	return b.Bytes(), nil
}

// checkCallerURL accepts what every protocol carries for an image or a document: https or data URLs.
func checkCallerURL(url, what string) error {
	if strings.HasPrefix(url, "https://") || strings.HasPrefix(url, "data:") {
		return nil
	}
	return refuseInvalid("%s must be an https URL or a data URL", what)
}

// quoteCallerToken quotes a caller-chosen token (a role, a part type), bounded.
func quoteCallerToken(s string) string { return fmt.Sprintf("%q", truncateUTF8(s, 64)) }

// appendPart adds p to the last message when it has role, else a new turn: tool
// results in a row are one user turn (SPEC §7.6), a call joins its assistant turn.
func appendPart(msgs []message, role string, p part) []message {
	n := len(msgs)
	if n > 0 && msgs[n-1].Role == role && (role != "user" || len(msgs[n-1].Parts) > 0 &&
		!slices.ContainsFunc(msgs[n-1].Parts, func(q part) bool { return q.Type != partToolResult })) {
		msgs[n-1].Parts = append(msgs[n-1].Parts, p)
		return msgs
	}
	return append(msgs, message{Role: role, Parts: []part{p}})
}

// addSystem adds instruction text to the leading System before any turn, else as a system turn.
func (req *chatRequest) addSystem(text string) {
	if len(req.Messages) == 0 {
		req.System = joinText(req.System, text)
		return
	}
	req.Messages = append(req.Messages, message{Role: "system", Parts: []part{{Type: partText, Text: text}}})
}

// joinText appends one more piece of text, "\n\n" between pieces.
func joinText(sys, more string) string {
	if sys == "" || more == "" {
		return sys + more
	}
	return sys + "\n\n" + more
}

// linkCalls marks calls to custom tools and their results, whichever format they came from.
func (req *chatRequest) linkCalls() {
	custom := map[string]bool{}
	for i := range req.Messages {
		for j := range req.Messages[i].Parts {
			p := &req.Messages[i].Parts[j]
			switch p.Type {
			case partToolCall:
				p.Custom = p.Custom || req.toolKind(p.ToolName) == toolCustom
				custom[p.ToolCallID] = p.Custom
			case partToolResult:
				p.Custom = p.Custom || custom[p.ToolCallID]
			}
		}
	}
}

// openAITool is one tool in Responses' flat shape, into which chat's nested one is flattened.
type openAITool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
	Format      json.RawMessage `json:"format,omitempty"`
	Tools       []openAITool    `json:"tools,omitempty"` // a namespace's members
}

// addOpenAITool adds a function, custom or namespace tool, naming the unknown members
// of raw (nil: none); any other (a hosted tool: web_search, …) is dropped and named.
func (req *chatRequest) addOpenAITool(t openAITool, raw json.RawMessage, what string) error {
	if t.Name == "" && slices.Contains([]string{"function", "custom", "namespace"}, t.Type) {
		return refuseInvalid("%s needs a name", what)
	}
	switch t.Type {
	case "function", "custom":
		dropUnknown(&req.Dropped, raw, "type name description parameters strict format")
		params, err := parseCallerSchema(t.Parameters, what+".parameters")
		if err != nil {
			return err
		}
		nt := tool{Name: t.Name, Description: t.Description, Parameters: params, Strict: t.Strict}
		if t.Type == "custom" {
			nt = tool{Kind: toolCustom, Name: t.Name, Description: t.Description, Format: t.Format}
		}
		req.Tools = append(req.Tools, nt)
	case "namespace":
		if t.Description != "" {
			req.Dropped = append(req.Dropped, "description")
		}
		n := len(req.Tools)
		err := eachItem(t.Tools, toolsOf(raw), what+".tools", req.addOpenAITool)
		for j := n; j < len(req.Tools); j++ {
			req.Tools[j].Namespace, req.Tools[j].Name = t.Name, t.Name+"__"+req.Tools[j].Name
		}
		return err
	default:
		req.Dropped = append(req.Dropped, cmp.Or(t.Type, "tools"))
	}
	return nil
}

// toolsOf is the raw tools member of a namespace tool or an additional_tools item.
func toolsOf(raw json.RawMessage) json.RawMessage {
	var m struct{ Tools json.RawMessage }
	json.Unmarshal(raw, &m)
	return m.Tools
}

// setOpenAIToolChoice reads tool_choice: a mode or one tool (nested in chat, flat
// in responses); other objects (allowed_tools, a hosted tool) are dropped.
func (req *chatRequest) setOpenAIToolChoice(raw json.RawMessage, nested bool) error {
	type named struct {
		Name string `json:"name"`
	}
	var tc struct {
		Type      string `json:"type"`
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		Function  named  `json:"function"`
		Custom    named  `json:"custom"`
	}
	switch rawShape(raw) {
	case 0, 'n': // absent, or null: raw came out of the decoded body, so it is valid JSON
		return nil
	case '"':
		json.Unmarshal(raw, &tc.Type) // a JSON string: it cannot fail
		if !slices.Contains([]string{toolChoiceAuto, toolChoiceNone, toolChoiceRequired}, tc.Type) {
			return refuseInvalid("tool_choice must be \"auto\", \"none\", \"required\" or a tool")
		}
		req.ToolChoice = &toolChoice{Mode: tc.Type}
		return nil
	case '{':
		if err := decodeCallerJSON(raw, &tc, "tool_choice"); err != nil {
			return err
		}
	default:
		return refuseInvalid("tool_choice must be a string or an object")
	}
	if tc.Type != "function" && tc.Type != "custom" {
		req.Dropped = append(req.Dropped, "tool_choice")
		return nil
	}
	if nested {
		tc.Name = tc.Function.Name + tc.Custom.Name
	}
	if tc.Name == "" {
		return refuseInvalid("tool_choice must name a tool: {\"type\":\"function\",…}")
	}
	if tc.Namespace != "" {
		tc.Name = tc.Namespace + "__" + tc.Name
	}
	req.ToolChoice = &toolChoice{Mode: toolChoiceTool, Name: tc.Name}
	return nil
}

// setOutput reads structured output: text is none, json_object any JSON, json_schema needs its schema.
func (req *chatRequest) setOutput(o *outputFormat, what string) error {
	switch {
	case o == nil || o.Type == "" || o.Type == "text":
	case o.Type == "json_object":
		req.Output = &outputFormat{Type: o.Type}
	case o.Type != "json_schema":
		return refuseInvalid("%s.type %s is not text, json_object or json_schema", what, quoteCallerToken(o.Type))
	case rawShape(o.Schema) != '{':
		return refuseInvalid("%s needs a JSON Schema object", what)
	default:
		req.Output = o
	}
	return nil
}

// eachItem runs add on every element of a caller's array, with its raw JSON from
// list (nil when the caller needs none) and its path; the first refusal stops it.
func eachItem[T any](items []T, list json.RawMessage, what string, add func(T, json.RawMessage, string) error) error {
	raws := append(rawItems(list), make([]json.RawMessage, len(items))...) // nil past the list
	for i, it := range items {
		if err := add(it, raws[i], fmt.Sprintf("%s[%d]", what, i)); err != nil {
			return err
		}
	}
	return nil
}

// callerTextOf reads content that may only be text: a string, or an array of
// {"type":textType,"text":…} parts, joined with sep, their other members
// (cache_control) dropped and named.
func (req *chatRequest) callerTextOf(raw json.RawMessage, what, textType, sep string) (string, error) {
	for _, p := range rawItems(raw) {
		dropUnknown(&req.Dropped, p, "type text")
	}
	text, parts, err := callerContent[chatPart](raw, what, textType+" parts")
	if err != nil || text != nil {
		return textOf(text), err
	}
	texts := make([]string, 0, len(parts))
	for i, p := range parts {
		if p.Type != textType || p.Text == nil {
			return "", refuseInvalid("%s[%d] must be a %s part with text", what, i, textType)
		}
		texts = append(texts, *p.Text)
	}
	return strings.Join(texts, sep), nil
}

// dropUnknownPart names raw's members not in members[typ], then its nested typ object's.
func (req *chatRequest) dropUnknownPart(raw json.RawMessage, typ string, members map[string][2]string) {
	dropUnknown(&req.Dropped, raw, members[typ][0])
	var m map[string]json.RawMessage
	json.Unmarshal(raw, &m)
	dropUnknown(&req.Dropped, m[typ], members[typ][1])
}

// resultText is a tool result's text, and its media, which chat drops (droppedFor).
func resultText(parts []part) (string, []part) {
	var texts []string
	var media []part
	for _, p := range parts {
		if p.Type == partText {
			texts = append(texts, p.Text)
		} else {
			media = append(media, p)
		}
	}
	return strings.Join(texts, "\n"), media
}
