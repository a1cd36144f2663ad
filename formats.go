package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
)

// The request side of the wire formats (chat.go, messages.go, responses.go; SPEC §7.6): the neutral
// request, the table of formats, reading a caller's body; the SSE reader (relay.go holds the answer side).

// Neutral names: part types, tool kinds, tool_choice modes, and caller dialects (one per public chat endpoint).
const (
	partText       = "text"
	partImage      = "image"
	partDocument   = "document"
	partToolCall   = "tool_call"
	partToolResult = "tool_result"

	toolFunction = "function" // JSON arguments under a schema
	toolCustom   = "custom"   // free-form input, no JSON schema

	toolChoiceAuto     = "auto"
	toolChoiceNone     = "none"
	toolChoiceRequired = "required" // any tool
	toolChoiceTool     = "tool"     // the named tool

	dialectChat      = "chat"      // POST /v1/chat/completions
	dialectMessages  = "messages"  // POST /v1/messages
	dialectResponses = "responses" // POST /v1/responses
)

type (
	// chatRequest is one chat request in no particular format; a *Name field is the caller's member for the one before it.
	chatRequest struct {
		Model             string // as the caller named it: alias, route, selector or best
		System            string // the leading system and developer text
		Messages          []message
		Tools             []tool
		ToolChoice        *toolChoice // nil: the provider's default
		ParallelToolCalls *bool
		MaxTokens         int // 0: the caller gave none (SPEC §6.4 decides)
		LimitName         string
		Temperature       *float64
		TopP              *float64
		Stop              []string
		StopName          string        // responses has none
		Output            *outputFormat // structured output; nil: free text
		Effort            string        // reasoning effort; "" the provider's default
		EffortName        string
		Verbosity         string
		Shared            openAIShared
		Stream            bool
		StreamUsage       bool     // a chat caller sent stream_options.include_usage: true
		Dropped           []string // caller member names the request loses (drop)
	}
	// openAIShared holds the members Chat Completions and Responses share under one name and shape: carried between them as sent, dropped toward messages.
	openAIShared struct {
		Store            json.RawMessage `json:"store,omitempty"`
		Metadata         json.RawMessage `json:"metadata,omitempty"`
		ServiceTier      json.RawMessage `json:"service_tier,omitempty"`
		PromptCacheKey   json.RawMessage `json:"prompt_cache_key,omitempty"`
		SafetyIdentifier json.RawMessage `json:"safety_identifier,omitempty"`
		User             json.RawMessage `json:"user,omitempty"`
	}
	// message is one turn: user (tool results too), assistant, or system after the leading System.
	message struct {
		Role  string
		Parts []part
	}
	part struct {
		Type       string
		Text       string // text; tool_result: its text content
		URL        string // image and document: an https URL or a data URL
		Detail     string // image: the OpenAI formats' detail
		Filename   string // document
		ToolCallID string // tool_call and tool_result
		ToolName   string // tool_call: the (flattened) tool name
		Arguments  string // tool_call: JSON-encoded arguments, or a custom tool's free-form input
		Custom     bool   // tool_call and tool_result: the call is to a custom tool
		IsError    bool   // tool_result
		Media      []part // tool_result: its image and document parts (chat has none: named dropped)
	}
	// tool is one tool the model may call, in the shape Responses declares it (chat nests the same members under
	// its type). Name is what providers see: a namespace member is flattened to <namespace>__<name> (SPEC §7.6).
	tool struct {
		Type        string          `json:"type,omitempty"` // function or custom
		Name        string          `json:"name,omitempty"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"` // function: JSON Schema object; nil when none given
		Strict      *bool           `json:"strict,omitempty"`
		Format      json.RawMessage `json:"format,omitempty"` // custom: the grammar or text format
		Tools       json.RawMessage `json:"tools,omitempty"`  // a caller's namespace: its members, read into tools of their own
		Namespace   string          `json:"-"`                // "" outside a group
	}
	// toolChoice says whether and which tool the model must call.
	toolChoice struct{ Mode, Name string }
	// outputFormat is structured output as the formats write it: json_schema with a Schema, or json_object for any JSON, which messages cannot express.
	outputFormat struct {
		Type        string          `json:"type,omitempty"`
		Name        string          `json:"name,omitempty"`
		Description string          `json:"description,omitempty"`
		Schema      json.RawMessage `json:"schema,omitempty"`
		Strict      *bool           `json:"strict,omitempty"`
	}
)

const openAISharedNames = "store metadata service_tier prompt_cache_key safety_identifier user"

var openAISharedList = strings.Fields(openAISharedNames) // in openAIShared's order, for dropShared

func (req *chatRequest) dropShared(o openAIShared) {
	for i, v := range []json.RawMessage{o.Store, o.Metadata, o.ServiceTier, o.PromptCacheKey, o.SafetyIdentifier, o.User} {
		req.drop(!rawIsNull(v), openAISharedList[i])
	}
}

func (t tool) memberName() string {
	if t.Namespace == "" {
		return t.Name
	}
	return strings.TrimPrefix(t.Name, t.Namespace+"__")
}

func (req *chatRequest) findTool(name string) *tool {
	if i := slices.IndexFunc(req.Tools, func(t tool) bool { return t.Name == name }); i >= 0 {
		return &req.Tools[i]
	}
	return nil
}

// wireFormat is one row of the format table: a format's dialect, protocol and translations.
type wireFormat struct {
	dialect, protocol, path string   // path: the provider endpoint below the base URL
	limits                  []string // the output limit's names: the first a caller sent wins; a call adds the last
	parse                   func(cr *callerRequest) (chatRequest, error)
	encode                  func(req *chatRequest, c call, h http.Header) ([]byte, error)             // req.Stream: whether c streams; h: its headers
	decode                  func(body []byte, r *streamReader) error                                  // a 2xx buffered body given r's caller stream
	frames                  func(s *callerStream, step streamStep, b *streamBlock, text string) error // the caller stream writer's
}

// wireFormats is the one table of the three formats; it never changes.
var wireFormats = []wireFormat{
	{dialectChat, protoOpenAIChat, "/chat/completions", []string{"max_completion_tokens", "max_tokens"},
		parseChatCompletions, encodeChat, decodeChat, (*callerStream).chatFrames},
	{dialectMessages, protoAnthropic, "/v1/messages", []string{"max_tokens"},
		parseMessages, encodeMessages, decodeMessages, (*callerStream).messagesFrames},
	{dialectResponses, protoOpenAIResponses, "/responses", []string{"max_output_tokens"},
		parseResponses, encodeResponses, decodeResponses, (*callerStream).responsesFrames},
}

// formatOf is the row of a dialect or protocol (every error its parse returns is an invalid_request *apiError).
func formatOf(name string) *wireFormat {
	for i, f := range wireFormats {
		if f.dialect == name || f.protocol == name {
			return &wireFormats[i]
		}
	}
	return nil
}

// orEmptySchema stands in an empty object schema for a tool without parameters where the protocol requires one.
func orEmptySchema(schema json.RawMessage) json.RawMessage {
	return json.RawMessage(cmp.Or(string(schema), `{"type":"object","properties":{}}`))
}

// argumentsText is a tool call's arguments as JSON text; empty becomes "{}".
func argumentsText(args string) string { return pick(strings.TrimSpace(args) == "", "{}", args) }

// jsonArray is nil (left out) for no items.
func jsonArray[T any](items []T) json.RawMessage {
	if len(items) == 0 {
		return nil
	}
	return must(json.Marshal(items))
}

// openAIOutput is structured output as the OpenAI formats write it: a json_schema gets the name they require.
func openAIOutput(f *outputFormat) *outputFormat {
	if f == nil || f.Type != "json_schema" {
		return f
	}
	s := *f
	s.Name = cmp.Or(s.Name, "output")
	return &s
}

// decodeCallerJSON unmarshals data into v; an error is an invalid_request naming the member at fault under what
// ("" for the body), quoting nothing (SPEC §7.6). A member with no counterpart elsewhere is dropped and named instead.
func decodeCallerJSON(data []byte, v any, what string) error {
	err := json.Unmarshal(data, v)
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return refuse("invalid_request", "malformed JSON at byte %d", se.Offset).because(err)
	} else if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		field := strings.Trim(what+"."+te.Field, ".") // a body not an object was refused before: a type error has a path
		return refuse("invalid_request", "%s: got %s, not the type it takes", field, truncateUTF8(te.Value, 32)).because(err)
	} else if err != nil {
		return refuse("invalid_request", "malformed JSON").because(err)
	}
	return nil
}

// dropUnknown names, in the body's order, every member of the JSON object raw not in known (space-separated, any
// case: encoding/json matches member names so); a non-object names nothing.
func (req *chatRequest) dropUnknown(raw json.RawMessage, known string) {
	o, _ := splitRaw(raw, '{', make([]jsonMember, 0, 16))
	names := strings.Fields(known)
	for _, m := range o.members {
		if !slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, string(m.key)) }) {
			req.drop(true, string(m.key))
		}
	}
}

// drop names, when cond holds, caller members the request loses, each once: the parser those with no counterpart
// in any other format, the encoder those its format or provider lacks (SPEC §7.6: nothing is dropped silently).
func (req *chatRequest) drop(cond bool, names ...string) {
	for _, n := range names {
		if cond && !slices.Contains(req.Dropped, n) {
			req.Dropped = append(req.Dropped, n)
		}
	}
}

// callerHead holds the members every format's request body shares (passthrough.go reads its own).
type callerHead struct {
	Model       string   `json:"model"`
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	Stream      bool     `json:"stream,omitempty"`
}

// newCallerRequest starts the neutral request from cr's head (readCallerRequest: model, stream, the output limit),
// decodes its body into b (embedding h), and names the unknown members; on a refusal, b holds what did decode.
func newCallerRequest(cr *callerRequest, b any, h *callerHead, known string) (chatRequest, error) {
	err := decodeCallerJSON(cr.body.src, b, "")
	req := cr.head
	req.Temperature, req.TopP = h.Temperature, h.TopP
	req.dropUnknown(cr.body.src, known)
	return req, err
}

// readList reads the caller's array raw at path what: each element decoded into a T, then given with its
// raw JSON and path to add. Absent or null is no element; the first refusal stops it.
func readList[T any](raw json.RawMessage, what string, add func(T, json.RawMessage, string) error) (err error) {
	list, ok := splitRaw(raw, '[', nil) // raw is valid: a member of a decoded body
	if !ok && !rawIsNull(raw) {
		return decodeCallerJSON(raw, new([]json.RawMessage), what) // not an array: its refusal
	}
	for i := 0; err == nil && i < len(list.members); i++ {
		var it T
		m, path := raw[list.members[i].val:list.members[i].end], fmt.Sprintf("%s[%d]", what, i)
		if err = decodeCallerJSON(m, &it, path); err == nil {
			err = add(it, m, path)
		}
	}
	return err
}

// callerParts reads content in every format: a string (one text part), or an array of parts (kind) that read turns into
// neutral ones and the members each carries (the rest named), or into none and the type to name (else its member).
func callerParts[T any](req *chatRequest, raw json.RawMessage, what, kind string,
	read func(T, json.RawMessage, string) (p part, members string, err error)) (parts []part, err error) {
	if s, ok := jsonString(raw); ok { // raw is valid: a member of a decoded body
		return []part{{Type: partText, Text: s}}, nil
	} else if rawShape(raw) == '[' {
		err = readList(raw, what, func(it T, raw json.RawMessage, path string) error {
			p, members, err := read(it, raw, path)
			if err == nil && p.Type == "" {
				req.drop(true, cmp.Or(members, what[strings.LastIndex(what, ".")+1:]))
				return nil
			}
			req.dropUnknown(raw, members)
			parts = append(parts, p)
			return err
		})
		return parts, err // parts read after the call: the spec leaves a variable's order against a call's unset
	}
	return nil, refuse("invalid_request", "%s must be a string or an array of %s", what, kind)
}

// addSystemOf adds content that may only be text as instructions: a string, or an array of {"type":textType,"text":…}
// parts, joined with "\n\n", their other members (cache_control) dropped and named. Before any turn it joins the
// leading System, after one it is a system turn.
func (req *chatRequest) addSystemOf(raw json.RawMessage, what, textType string) error {
	text, err := req.callerTextOf(raw, what, textType, "\n\n")
	if len(req.Messages) == 0 { // on an error the whole request is refused
		req.System = strings.Join(slices.DeleteFunc([]string{req.System, text}, func(s string) bool { return s == "" }), "\n\n")
	} else {
		req.Messages = append(req.Messages, message{Role: "system", Parts: []part{{Type: partText, Text: text}}})
	}
	return err
}

// callerTextOf reads content that may only be text, joined with sep.
func (req *chatRequest) callerTextOf(raw json.RawMessage, what, textType, sep string) (string, error) {
	parts, err := callerParts(req, raw, what, textType+" parts", func(p chatPart, raw json.RawMessage, path string) (part, string, error) {
		if p.Type != textType || p.Text == nil {
			return part{}, "", refuse("invalid_request", "%s must be a %s part with text", path, textType)
		}
		return part{Type: partText, Text: *p.Text}, "type text", nil
	})
	return textOf(parts, sep), err
}

// jsonObject reads a JSON Schema, a tool_use input or a call's arguments: null is nil, an object compacted, the rest refused.
func jsonObject(raw json.RawMessage, what string) (json.RawMessage, error) {
	var b bytes.Buffer
	if rawIsNull(raw) {
		return nil, nil
	} else if rawShape(raw) != '{' || json.Compact(&b, raw) != nil {
		return nil, refuse("invalid_request", "%s must be a JSON object", what)
	}
	return b.Bytes(), nil
}

// textPart is a caller's text part, whose text is required.
func textPart(text *string, path string) (part, error) {
	if text == nil {
		return part{}, refuse("invalid_request", "%s.text is required", path)
	}
	return part{Type: partText, Text: *text}, nil
}

// checkCallerURL accepts what every protocol carries for an image or a document: https or data URLs.
func checkCallerURL(url, what string) error {
	if strings.HasPrefix(url, "https://") || strings.HasPrefix(url, "data:") {
		return nil
	}
	return refuse("invalid_request", "%s must be an https URL or a data URL", what)
}

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

// finishParse refuses a request without a turn (refusal: the text saying so), else links calls to custom tools
// and their results, whichever format they came from.
func (req *chatRequest) finishParse(err error, refusal string) (chatRequest, error) {
	if err != nil {
		return chatRequest{}, err
	} else if len(req.Messages) == 0 {
		return chatRequest{}, refuse("invalid_request", "%s", refusal)
	}
	custom := map[string]bool{}
	for _, m := range req.Messages {
		for j := range m.Parts {
			switch p := &m.Parts[j]; p.Type {
			case partToolCall:
				p.Custom = p.Custom || valueOr(req.findTool(p.ToolName), tool{}).Type == toolCustom
				custom[p.ToolCallID] = p.Custom
			case partToolResult:
				p.Custom = p.Custom || custom[p.ToolCallID]
			}
		}
	}
	return *req, nil
}

// setOutput reads structured output: text is none, json_object any JSON, json_schema needs its schema.
func (req *chatRequest) setOutput(o outputFormat, what string) error {
	switch {
	case o.Type == "" || o.Type == "text":
	case o.Type == "json_object":
		req.Output = &outputFormat{Type: o.Type}
	case o.Type != "json_schema":
		return refuse("invalid_request", "%s.type %s is not text, json_object or json_schema", what, quoteCallerToken(o.Type))
	case rawShape(o.Schema) != '{':
		return refuse("invalid_request", "%s needs a JSON Schema object", what)
	default:
		req.Output = new(o)
	}
	return nil
}

// toolResult is a tool result of parts: its text, and its media, which chat drops.
func toolResult(id string, parts []part, custom, isError bool) part {
	r := part{Type: partToolResult, ToolCallID: id, Text: textOf(parts, "\n"), Custom: custom, IsError: isError}
	for _, p := range parts {
		if p.Type != partText {
			r.Media = append(r.Media, p)
		}
	}
	return r
}

// sseReader splits a text/event-stream body into blocks (an event's lines and the blank line
// ending it) as received, WHATWG grammar, with no line limit or timeout (SPEC §7.4).
type sseReader struct {
	sc        bufio.Scanner
	ends      string             // the bytes that end a line (a "\r\n" pair is one end)
	started   bool               // the byte-order mark check is done
	rest      []byte             // what the scanner holds past the last line, for ready
	searched  int                // bytes of the coming line already searched for its end
	raw, data []byte             // the last block and its data, reused by next
	buf       [16<<10 - 256]byte // the scanner's first buffer: with the reader, one 16 KiB allocation
}

// newSSEReader reads blocks from r, lines ending at a byte of ends: translation's "\r\n" (WHATWG),
// passthrough's "\n" (README: a bare "\r" is no line end, the caller reads what was sent).
func newSSEReader(r io.Reader, ends string) *sseReader {
	s := &sseReader{sc: *bufio.NewScanner(r), ends: ends}
	s.sc.Buffer(s.buf[:], math.MaxInt)
	s.sc.Split(s.split)
	return s
}

// split cuts one line with its terminator ("\r\n", or one byte of ends); a final line without one is
// io.ErrUnexpectedEOF (the body was cut). A long line comes a read at a time: the search resumes where the last one ended.
func (s *sseReader) split(data []byte, atEOF bool) (int, []byte, error) {
	n := bytes.IndexAny(data[s.searched:], s.ends)
	i := s.searched + n
	switch {
	case n < 0 && atEOF && len(data) > 0 && (s.started || string(data) != "\ufeff"): // a lone BOM: an empty body
		return 0, nil, io.ErrUnexpectedEOF
	case n < 0:
		s.searched = len(data)
		return 0, nil, nil
	case data[i] == '\r' && i+1 == len(data) && !atEOF: // a "\n" may follow
		s.searched = i
		return 0, nil, nil
	case data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n':
		i++
	}
	s.rest, s.searched = data[i+1:], 0
	return i + 1, data[:i+1], nil
}

// next returns the next block, its event name and its data lines (nil: none), valid until
// the next call; io.EOF after the last, which needs no blank line after it.
func (s *sseReader) next() (raw []byte, event string, data []byte, err error) {
	s.raw, s.data = s.raw[:0], s.data[:0]
	for s.sc.Scan() {
		line := s.sc.Bytes()
		if !s.started {
			line, s.started = bytes.TrimPrefix(line, []byte("\ufeff")), true
		}
		content := bytes.TrimRight(line, "\r\n")
		if len(content) == 0 && len(s.raw) == 0 || bytes.HasPrefix(content, []byte(":")) {
			continue // blank lines between blocks and comments carry nothing: none is kept (SPEC §17)
		}
		s.raw = append(s.raw, line...)
		if len(content) == 0 {
			return s.raw, event, data, nil
		}
		field, value, _ := bytes.Cut(content, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		if string(field) == "event" {
			event = string(value)
		} else if string(field) == "data" { // each line ends in "\n", the last cut off; non-nil even for an empty line
			s.data = append(append(s.data, value...), '\n')
			data = s.data[:len(s.data)-1]
		} // "id", "retry" and unknown fields carry nothing Brama uses
	}
	if err := s.sc.Err(); err != nil || len(s.raw) == 0 {
		return nil, "", nil, cmp.Or(err, io.EOF)
	}
	s.raw = append(s.raw, '\n') // the provider never ended the block; end it for the caller
	return s.raw, event, data, nil
}

// ready reports whether a whole next block is buffered (no wait to read it). Blank lines and comments before a
// block are skipped as next skips them: a comment is no block (OpenRouter's ": OPENROUTER PROCESSING").
func (s *sseReader) ready() bool {
	b := bytes.TrimLeft(s.rest, "\r\n")
	for bytes.HasPrefix(b, []byte(":")) {
		_, b, _ = bytes.Cut(b, []byte("\n")) // a comment ended by a lone "\r" too: it only skips more
		b = bytes.TrimLeft(b, "\r\n")
	}
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\n\r\n"))
}
