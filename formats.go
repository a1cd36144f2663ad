package main

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// What the three wire formats (chat.go, messages.go, responses.go) share (SPEC §7.5, §7.6): the
// neutral request and answer, their table, reading a caller's body, the SSE reader and writer.

// chatRequest is one chat request in no particular format.
type chatRequest struct {
	Model             string // as the caller named it: alias, route, selector or best
	System            string // the leading system and developer text, "" when none
	Messages          []message
	Tools             []tool
	ToolChoice        *toolChoice // nil: the provider's default
	ParallelToolCalls *bool
	MaxTokens         int    // 0: the caller gave none (SPEC §6.4 decides)
	LimitName         string // the caller's member for its own MaxTokens, "" when it gave none
	Temperature       *float64
	TopP              *float64
	Stop              []string
	Output            *outputFormat // structured output; nil: free text
	Effort            string        // reasoning effort (low, medium, high, …); "" the provider's default
	EffortName        string        // the caller's member for Effort
	Verbosity         string        // the OpenAI formats' verbosity; "" the provider's default
	StopName          string        // the caller's member for Stop: responses has none
	Shared            openAIShared
	Stream            bool
	StreamUsage       bool     // a chat caller sent stream_options.include_usage: true
	Dropped           []string // caller member names with no counterpart in any other format
}

// openAIShared holds the members Chat Completions and Responses share under
// one name and shape: carried between them as sent, dropped toward messages.
type openAIShared struct {
	Store            json.RawMessage `json:"store,omitempty"`
	Metadata         json.RawMessage `json:"metadata,omitempty"`
	ServiceTier      json.RawMessage `json:"service_tier,omitempty"`
	PromptCacheKey   json.RawMessage `json:"prompt_cache_key,omitempty"`
	SafetyIdentifier json.RawMessage `json:"safety_identifier,omitempty"`
	User             json.RawMessage `json:"user,omitempty"`
}

const openAISharedNames = "store metadata service_tier prompt_cache_key safety_identifier user"

func (o openAIShared) names() []string {
	var n []string
	for i, v := range []json.RawMessage{o.Store, o.Metadata, o.ServiceTier, o.PromptCacheKey, o.SafetyIdentifier, o.User} {
		if !rawIsNull(v) {
			n = append(n, strings.Fields(openAISharedNames)[i])
		}
	}
	return n
}

// message is one turn: user (tool results too), assistant, or system after the leading System.
type message struct {
	Role  string
	Parts []part
}

const (
	partText       = "text"
	partImage      = "image"
	partDocument   = "document"
	partToolCall   = "tool_call"
	partToolResult = "tool_result"
)

// part is one piece of a message.
type part struct {
	Type       string
	Text       string // text; tool_result: its text content
	ImageURL   string // image: an https URL or a data URL
	Detail     string // image: the OpenAI formats' detail (low, high, auto)
	FileURL    string // document: an https URL or a data URL
	Filename   string
	ToolCallID string // tool_call and tool_result
	ToolName   string // tool_call: the (flattened) tool name
	Arguments  string // tool_call: JSON-encoded arguments, or a custom tool's free-form input
	Custom     bool   // tool_call and tool_result: the call is to a custom tool
	IsError    bool   // tool_result
	Media      []part // tool_result: its image and document parts (chat has none: named dropped)
}

const (
	toolFunction = ""       // JSON arguments under a schema
	toolCustom   = "custom" // free-form input, no JSON schema
)

// tool is one tool the model may call. Name is what providers see: a tool
// of a namespaced group is flattened to <namespace>__<name> (SPEC §7.6).
type tool struct {
	Kind        string
	Name        string
	Namespace   string // "" outside a group
	Description string
	Parameters  json.RawMessage // function: JSON Schema object; nil when none given
	Strict      *bool
	Format      json.RawMessage // custom: the grammar or text format
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

// toolKind is the OpenAI type of the tool named name: function or custom.
func (req *chatRequest) toolKind(name string) string {
	if t := req.findTool(name); t != nil && t.Kind == toolCustom {
		return toolCustom
	}
	return "function"
}

const (
	toolChoiceAuto     = "auto"
	toolChoiceNone     = "none"
	toolChoiceRequired = "required" // any tool
	toolChoiceTool     = "tool"     // the named tool
)

// toolChoice says whether and which tool the model must call.
type toolChoice struct {
	Mode string
	Name string // with toolChoiceTool
}

// outputFormat is structured output as the formats write it: json_schema with
// a Schema, or json_object for any JSON, which messages cannot express.
type outputFormat struct {
	Type        string          `json:"type,omitempty"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// Finish reasons, in the neutral (OpenAI chat) vocabulary.
const (
	finishStop          = "stop"
	finishLength        = "length"
	finishToolCalls     = "tool_calls"
	finishContentFilter = "content_filter"
)

// chatAnswer is one complete answer in no particular format.
type chatAnswer struct {
	Model     string // the name reported to the caller (SPEC §7.6)
	Text      string
	ToolCalls []toolCall
	Finish    string
	Usage     usage
}

// toolCall is one tool call the model made.
type toolCall struct {
	ID        string
	Name      string // as the provider saw it (flattened)
	Arguments string // JSON text, or a custom tool's free-form input
	Custom    bool   // the provider called it as a custom tool
}

// usage counts tokens as the provider reported them.
type usage struct {
	InputTokens  int
	OutputTokens int
	Reported     bool // the provider sent usage at all
}

// Stream event kinds, from a provider protocol to a caller dialect.
const (
	eventText          = "text"            // Text: the next piece of output text
	eventToolCallStart = "tool_call_start" // Index, ToolCall.ID, ToolCall.Name, ToolCall.Custom
	eventToolCallArgs  = "tool_call_args"  // Index, Text: the next piece of arguments (or custom input)
	eventFinish        = "finish"
	eventUsage         = "usage"
)

// streamEvent is one translated piece of a stream; finish and usage only after its terminal signal (SPEC §7.5).
type streamEvent struct {
	Kind     string
	Text     string
	Index    int // tool call index, 0-based, in call order
	ToolCall toolCall
	Finish   string
	Usage    usage
}

// Caller dialects, one per public chat endpoint.
const (
	dialectChat      = "chat"      // POST /v1/chat/completions
	dialectMessages  = "messages"  // POST /v1/messages
	dialectResponses = "responses" // POST /v1/responses
)

// upstreamOptions are the per-provider rules an encoder applies (SPEC §6.2).
type upstreamOptions struct {
	stream bool
	oauth  bool // claude-code: the identity system block first
	codex  bool // codex: SPEC §6.2's body rules
	openai bool // openai: the output limit as max_completion_tokens, as its reasoning models take it
}

// wireFormat is one row of the format table: a format's dialect, protocol and translations.
type wireFormat struct {
	dialect, protocol string
	path              string // the provider endpoint below the base URL
	parse             func(body []byte) (chatRequest, error)
	encode            func(req chatRequest, model string, o upstreamOptions) (any, error)
	decode            func(body []byte) (chatAnswer, error)
	render            func(req chatRequest, a chatAnswer) (any, error)
	callerStream      func(sse *callerStream, req chatRequest, model string) blockWriter
	upstreamStream    func() streamTranslator
}

// wireFormats is the one table of the three formats; it never changes.
var wireFormats = []wireFormat{
	{dialectChat, protoOpenAIChat, "/chat/completions", parseChatCompletions, encodeChat, decodeChat, renderChat, newChatCallerStream, newChatUpstreamStream},
	{dialectMessages, protoAnthropic, "/v1/messages", parseMessages, encodeMessages, decodeMessages, renderMessages, newMessagesCallerStream, newMessagesUpstreamStream},
	{dialectResponses, protoOpenAIResponses, "/responses", parseResponses, encodeResponses, decodeResponses, renderResponses, newResponsesCallerStream, newResponsesUpstreamStream},
}

func formatOf(name string) *wireFormat {
	for i, f := range wireFormats {
		if f.dialect == name || f.protocol == name {
			return &wireFormats[i]
		}
	}
	return nil
}

func errUnknownFormat(name string) *apiError {
	return refuse("internal_error", "internal error").because(fmt.Errorf("unknown wire format %q", name))
}

// parseRequest parses body as dialect; every error is an invalid_request *apiError.
func parseRequest(dialect string, body []byte) (chatRequest, error) {
	if f := formatOf(dialect); f != nil {
		return f.parse(body)
	}
	return chatRequest{}, errUnknownFormat(dialect)
}

// renderAnswer is a buffered answer as dialect's body; req's tools name the calls.
func renderAnswer(dialect string, req chatRequest, a chatAnswer) ([]byte, error) {
	f := formatOf(dialect)
	if f == nil {
		return nil, errUnknownFormat(dialect)
	}
	v, err := f.render(req, a)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// decodeUpstreamAnswer decodes a 2xx non-stream body; Model is the dispatcher's (SPEC §7.6).
func decodeUpstreamAnswer(protocol string, body []byte) (chatAnswer, error) {
	if f := formatOf(protocol); f != nil {
		return f.decode(body)
	}
	return chatAnswer{}, refuse("provider_failure", "unknown provider protocol %q", protocol)
}

// droppedFor names every caller member the request to p loses, each once:
// those with no counterpart in any other format, and those p's format or p
// itself lacks (SPEC §7.6).
func (req chatRequest) droppedFor(p providerInfo) []string {
	var sampling []string // the sampling members sent
	if req.Temperature != nil {
		sampling = append(sampling, "temperature")
	}
	if req.TopP != nil {
		sampling = append(sampling, "top_p")
	}
	d := slices.Clone(req.Dropped)
	switch {
	case p.protocol == protoAnthropic:
		d = append(d, req.Shared.names()...)
		if req.Effort != "" && req.thinkingBudget() == 0 {
			d = append(d, req.EffortName)
		}
		if req.thinkingBudget() > 0 {
			d = append(d, sampling...)
		}
		if req.Verbosity != "" {
			d = append(d, "verbosity")
		}
		for _, t := range req.Tools {
			if t.Kind == toolCustom && t.Format != nil {
				d = append(d, "format")
			}
		}
	case p.protocol == protoOpenAIResponses && len(req.Stop) > 0:
		d = append(d, req.StopName)
	}
	for _, m := range req.Messages {
		for _, pt := range m.Parts {
			for _, q := range append([]part{pt}, pt.Media...) {
				switch {
				case p.protocol == protoAnthropic && q.Detail != "":
					d = append(d, "detail")
				case p.protocol == protoOpenAIChat && q.Type != pt.Type: // a tool message holds only text
					d = append(d, q.Type)
				}
			}
		}
	}
	if p.id == "codex" { // it never gets an output limit, and its backend refuses these (SPEC §6.2)
		if req.LimitName != "" {
			d = append(d, req.LimitName)
		}
		d = append(d, sampling...)
		d = append(d, openAIShared{Metadata: req.Shared.Metadata, SafetyIdentifier: req.Shared.SafetyIdentifier, User: req.Shared.User}.names()...)
	}
	seen := map[string]bool{} // each once, in linear time: a caller names its own members
	return slices.DeleteFunc(d, func(n string) bool { dup := seen[n]; seen[n] = true; return dup })
}

func newAnswerID(prefix string) string { return prefix + rand.Text() }

func answerIDOr(id, prefix string) string { return cmp.Or(id, newAnswerID(prefix)) }

func answerFinish(f string) string { return cmp.Or(f, finishStop) }

func textOf(ps []part) string {
	var b strings.Builder
	for _, p := range ps {
		if p.Type == partText {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// responsesContent is parts as Responses input (an assistant's text: output) parts, no empty text.
func responsesContent(ps []part, assistant bool) []responsesPart {
	var out []responsesPart
	for _, p := range ps {
		switch {
		case p.Type == partText && p.Text != "":
			out = append(out, responsesPart{Type: map[bool]string{false: "input_text", true: "output_text"}[assistant], Text: ptrTo(p.Text)})
		case p.Type == partImage:
			out = append(out, responsesPart{Type: "input_image", ImageURL: ptrTo(p.ImageURL), Detail: p.Detail})
		case p.Type == partDocument && strings.HasPrefix(p.FileURL, "data:"):
			out = append(out, responsesPart{Type: "input_file", FileData: p.FileURL, Filename: p.Filename})
		case p.Type == partDocument:
			out = append(out, responsesPart{Type: "input_file", FileURL: p.FileURL, Filename: p.Filename})
		}
	}
	return out
}

// emptySchema stands in for a tool without parameters where the protocol requires a schema.
var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// customInputSchema is the one-string-member function a custom tool becomes toward messages (SPEC §7.6).
var customInputSchema = json.RawMessage(`{"type":"object","properties":{"input":{"type":"string"}},"required":["input"]}`)

// toolArguments is a call's arguments as the JSON object anthropic embeds:
// empty is {}, anything but an object is refused, never approximated.
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

// argumentsText is a tool call's arguments as JSON text; empty becomes "{}".
func argumentsText(args string) string {
	if strings.TrimSpace(args) == "" {
		return "{}"
	}
	return args
}

// effortBudgets maps reasoning effort names to a thinking budget toward
// messages; a budget maps back to the nearest effort at or above it (SPEC §7.6).
var effortBudgets = []effortBudget{{"minimal", 1024}, {"low", 2048}, {"medium", 8192}, {"high", 24576}, {"xhigh", 32768}}

type effortBudget struct {
	effort string
	budget int
}

func effortOfBudget(b int) string {
	for _, e := range effortBudgets {
		if b <= e.budget {
			return e.effort
		}
	}
	return "xhigh"
}

// adaptiveThinking: a Claude 4.6 or later model takes thinking as adaptive
// with output_config.effort and refuses a budget (Claude Code 2.1.332 decides
// so too); an earlier, dated or unknown model takes a budget.
func adaptiveThinking(model string) bool {
	m := claudeVersion.FindStringSubmatch(model)
	if m == nil {
		return false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2]) // "" when absent: 0
	return major > 4 || major == 4 && minor >= 6
}

// adaptiveEffort: toward model, req's effort goes as output_config.effort and its beta, not a budget.
func (req chatRequest) adaptiveEffort(model string) bool {
	return req.thinkingBudget() > 0 && adaptiveThinking(model)
}

// claudeVersion reads a Claude model's version: claude-opus-4-7, claude-sonnet-4-5-20250929, claude-opus-5.
var claudeVersion = regexp.MustCompile(`^claude-(?:opus|sonnet|haiku)-(\d{1,2})(?:-(\d{1,2}))?(?:-|$)`)

// Anthropic-beta values: output_config.effort's, and a JSON Schema output format's (SPEC §7.6).
const (
	effortBeta            = "effort-2025-11-24"
	structuredOutputsBeta = "structured-outputs-2025-11-13"
)

// thinkingBudget is the budget toward messages: below max_tokens, at least 1024, and
// 0 in a tool loop, where Anthropic wants back thinking blocks no format carries.
func (req chatRequest) thinkingBudget() int {
	budget := 0 // "none" and unknown names: no thinking
	if i := slices.IndexFunc(effortBudgets, func(e effortBudget) bool { return e.effort == req.Effort }); i >= 0 {
		budget = effortBudgets[i].budget
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

// callerTool is a provider's call as the caller declared it: its name in its
// group, whether custom; a custom call made as a function gets its input back.
func (req chatRequest) callerTool(tc toolCall) (name, args string, custom bool) {
	t := req.findTool(tc.Name)
	if t == nil {
		return tc.Name, tc.Arguments, tc.Custom
	}
	if args = tc.Arguments; t.Kind == toolCustom && !tc.Custom {
		args = customInput(args)
	}
	return t.memberName(), args, t.Kind == toolCustom
}

// customInput is the "input" member of a custom call made as a function (toward messages).
func customInput(args string) string {
	var in struct{ Input string }
	json.Unmarshal([]byte(args), &in)
	return in.Input
}

func jsonText(s string) json.RawMessage { return must(json.Marshal(s)) }

// schemaOutput is a json_schema output named as the OpenAI formats require; nil for JSON mode.
func schemaOutput(f *outputFormat) *outputFormat {
	if f.Type != "json_schema" {
		return nil
	}
	s := *f
	s.Name = cmp.Or(s.Name, "output")
	return &s
}

func ptrTo[T any](v T) *T { return &v }

func valueOr[T any](p *T, or T) T {
	if p == nil {
		return or
	}
	return *p
}

// must is v for marshalling that cannot fail (plain values).
func must(v []byte, err error) json.RawMessage {
	if err != nil {
		panic(err)
	}
	return v
}

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

// memberType is what member key (an array item's: "") of a value decoded as t
// decodes as, nil when unchecked; a struct field named key but for case is
// refused, as encoding/json would take it (SPEC §2.2: members are exact).
func memberType(t reflect.Type, key string) (reflect.Type, error) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == nil:
	case t.Kind() == reflect.Map || t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		return t.Elem(), nil
	case t.Kind() == reflect.Struct:
		for i := range t.NumField() {
			switch name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); {
			case name == key:
				return t.Field(i).Type, nil
			case strings.EqualFold(name, key):
				return nil, fmt.Errorf("unknown member %q (member names are exact: %q)", key, name)
			}
		}
	}
	return nil, nil // an unknown member: DisallowUnknownFields names it
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

// sseEvent is one dispatched server-sent event: its event name and its data lines joined with "\n".
type sseEvent struct{ Event, Data string }

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

// newSSEReader reads blocks from r, lines ending at a byte of ends: translation's
// "\r\n" (WHATWG), passthrough's "\n" (README: a bare "\r" is no line end).
func newSSEReader(r io.Reader, ends string) *sseReader {
	s := &sseReader{sc: *bufio.NewScanner(r), ends: ends, data: []byte{}} // data: non-nil, see next
	s.sc.Buffer(s.buf[:], math.MaxInt)
	s.sc.Split(s.split)
	return s
}

// split cuts one line with its terminator ("\r\n", or one byte of ends); a
// final line without one is io.ErrUnexpectedEOF (the body was cut). A long
// line comes a read at a time: the search resumes where the last one ended.
func (s *sseReader) split(data []byte, atEOF bool) (int, []byte, error) {
	i := bytes.IndexAny(data[s.searched:], s.ends)
	if i >= 0 {
		i += s.searched
	}
	switch {
	case i < 0 && atEOF && len(data) > 0 && (s.started || string(data) != "\ufeff"): // a lone BOM: an empty body
		return 0, nil, io.ErrUnexpectedEOF
	case i < 0:
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
		switch string(field) {
		case "event":
			event = string(value)
		case "data":
			if data != nil {
				s.data = append(s.data, '\n')
			}
			s.data = append(s.data, value...)
			data = s.data // non-nil even for an empty line: s.data starts non-nil
		} // "id", "retry" and unknown fields carry nothing Brama uses
	}
	if err := s.sc.Err(); err != nil || len(s.raw) == 0 {
		return nil, "", nil, cmp.Or(err, io.EOF)
	}
	s.raw = append(s.raw, '\n') // the provider never ended the block; end it for the caller
	return s.raw, event, data, nil
}

// ready reports whether a whole next block is buffered (no wait to read it).
func (s *sseReader) ready() bool {
	b := bytes.TrimLeft(s.rest, "\r\n") // blank lines before a block are skipped, not an end
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\n\r\n"))
}

// event returns the next event for translation: a block without data dispatches nothing.
func (s *sseReader) event() (sseEvent, error) {
	for {
		_, event, data, err := s.next()
		if err != nil || data != nil {
			return sseEvent{event, string(data)}, err
		}
	}
}

// streamTranslator turns one protocol's events into neutral ones; handle and ended
// (at the body's end) report true once the terminal signal came and the tail went out.
type streamTranslator interface {
	handle(ev sseEvent, emit func(streamEvent) error) (bool, error)
	ended(emit func(streamEvent) error) (bool, error)
}

// readUpstreamStream emits a provider stream's neutral events, nil only after its terminal
// signal (SPEC §7.5): a cut or in-band error is provider_incomplete, a malformed event provider_failure.
func readUpstreamStream(protocol string, body io.Reader, emit func(streamEvent) error) error {
	f := formatOf(protocol)
	if f == nil {
		return refuse("provider_failure", "unknown provider protocol %q", protocol)
	}
	t, r := f.upstreamStream(), newSSEReader(body, "\r\n")
	for {
		ev, err := r.event()
		if err != nil {
			if done, terr := t.ended(emit); done || terr != nil {
				return terr
			}
			return streamCut(err)
		}
		if done, err := t.handle(ev, emit); err != nil || done {
			return err
		}
	}
}

// assembleStream is a whole stream as one answer: a buffered caller of codex, which only streams (SPEC §6.2).
func assembleStream(protocol string, body io.Reader) (chatAnswer, error) {
	return answerOf(func(emit func(streamEvent) error) error { return readUpstreamStream(protocol, body, emit) })
}

// answerOf builds one answer from the neutral events run emits.
func answerOf(run func(emit func(streamEvent) error) error) (chatAnswer, error) {
	var (
		a    chatAnswer
		text strings.Builder
		args []strings.Builder
	)
	err := run(func(ev streamEvent) error {
		switch ev.Kind {
		case eventText:
			text.WriteString(ev.Text)
		case eventToolCallStart:
			for len(a.ToolCalls) <= ev.Index {
				a.ToolCalls, args = append(a.ToolCalls, toolCall{}), append(args, strings.Builder{})
			}
			a.ToolCalls[ev.Index] = ev.ToolCall
		case eventToolCallArgs:
			if ev.Index >= len(args) {
				return refuse("provider_failure", "the provider stream sent arguments for a tool call it never started")
			}
			args[ev.Index].WriteString(ev.Text)
		case eventFinish:
			a.Finish = ev.Finish
		case eventUsage:
			a.Usage = ev.Usage
		}
		return nil
	})
	if err != nil {
		return chatAnswer{}, err
	}
	a.Text = text.String()
	for i := range a.ToolCalls {
		a.ToolCalls[i].Arguments = args[i].String()
	}
	return a, nil
}

// upstreamStreamError is an in-band error's cause: its redacted code, and the
// refusalRate or refusalQuota class the dispatcher records a block for (SPEC §6.2).
type upstreamStreamError struct{ Code, Class string }

func (e *upstreamStreamError) Error() string { return "provider stream error " + e.Code }

// streamErrorCodes classifies in-band error codes that say "rate" or "quota".
var streamErrorCodes = map[string]string{"rate_limit_exceeded": refusalRate, "rate_limit_error": refusalRate,
	"usage_limit_reached": refusalRate, "insufficient_quota": refusalQuota, "billing_error": refusalQuota}

const inBandMessage = "the provider stream failed with error %q"

// inBandError is provider_incomplete: the caller cannot know what was billed
// (SPEC §6.2, §7.5); the dispatcher redacts the credential (apiError.redactedFor).
func inBandError(code string) *apiError {
	class := streamErrorCodes[code]
	if quotaCodes[code] {
		class = refusalQuota
	}
	code = cmp.Or(cleanQuoted(code, "", 64), "unspecified")
	return refuse("provider_incomplete", inBandMessage, code).because(&upstreamStreamError{Code: code, Class: class})
}

func malformedEvent(protocol string, cause error) *apiError {
	return refuse("provider_failure", "the provider sent a malformed %s stream event", protocol).because(cause)
}

// malformedAnswer refuses a 2xx body that is not the protocol's answer, never quoted.
func malformedAnswer(protocol string, cause error) *apiError {
	return refuse("provider_failure", "the provider answered with a malformed %s body", protocol).because(cause)
}

// emitCalls emits whole calls, their neutral indexes from first on.
func emitCalls(emit func(streamEvent) error, first int, calls []toolCall) error {
	for i, tc := range calls {
		start := toolCall{ID: tc.ID, Name: tc.Name, Custom: tc.Custom}
		if err := emit(streamEvent{Kind: eventToolCallStart, Index: first + i, ToolCall: start}); err != nil {
			return err
		}
		if err := emit(streamEvent{Kind: eventToolCallArgs, Index: first + i, Text: tc.Arguments}); err != nil {
			return err
		}
	}
	return nil
}

func emitTail(emit func(streamEvent) error, finish string, u usage) error {
	if err := emit(streamEvent{Kind: eventFinish, Finish: finish}); err != nil || !u.Reported {
		return err
	}
	return emit(streamEvent{Kind: eventUsage, Usage: u})
}

// errCallerStreamDone is returned by a callerStream used after finish or fail.
var errCallerStreamDone = errors.New("caller stream already ended")

// callerStream writes a streamed answer in the caller's dialect (SPEC §7.5), one
// block at a time, framed by the dialect's blockWriter; the first write error sticks.
type callerStream struct {
	w            io.Writer
	flush        func()
	err          error
	bw           blockWriter
	req          chatRequest
	started      bool
	done         bool   // finish or fail ran
	finishReason string // the tail: finish and usage arrive in either order, usage maybe never
	usage        usage
	open         int // index of the open block, -1 when none
	blocks       []*streamBlock
	toolBlock    map[int]int // neutral tool call index → block index
}

// blockWriter is one dialect's framing of a streamed answer's blocks, in order.
type blockWriter interface {
	begin() error
	open(i int, b *streamBlock) error
	delta(i int, b *streamBlock, s string) error
	close(i int, b *streamBlock, full string) error
	finishNow(finish string) error    // the finish event arrived (chat writes its finish chunk)
	end(finish string, u usage) error // the terminal sequence
	fail(e *apiError) error
}

// streamBlock is one block: text, or a tool call named as the caller declared
// it; a custom call made as a function is wrapped, its input held to the close.
type streamBlock struct {
	text            bool
	index           int // the call's index among calls
	id, name        string
	flat            string // the name providers saw
	custom, wrapped bool
	buf             strings.Builder
}

// newCallerStream writes dialect to w, flushing every frame (flush may be nil), reporting model (SPEC §7.6).
func newCallerStream(dialect string, req chatRequest, w io.Writer, flush func(), model string) *callerStream {
	f := formatOf(dialect)
	if f == nil {
		panic("brama: unknown dialect " + dialect)
	}
	if flush == nil {
		flush = func() {}
	}
	return newBlockStream(w, flush, req, model, f.callerStream)
}

func newBlockStream(w io.Writer, flush func(), req chatRequest, model string,
	newWriter func(*callerStream, chatRequest, string) blockWriter) *callerStream {
	s := &callerStream{w: w, flush: flush, req: req, open: -1, toolBlock: map[int]int{}}
	s.bw = newWriter(s, req, model)
	return s
}

// wholeAnswerThrough writes a through newWriter's block writer, frames discarded, and returns
// it, holding the whole answer, with the first refusal a block met (messages: arguments not an object).
func wholeAnswerThrough(req chatRequest, a chatAnswer,
	newWriter func(*callerStream, chatRequest, string) blockWriter) (blockWriter, error) {
	s := newBlockStream(io.Discard, func() {}, req, a.Model, newWriter)
	err := s.event(streamEvent{Kind: eventText, Text: a.Text})
	if err == nil {
		err = emitCalls(s.event, 0, a.ToolCalls)
	}
	if err == nil {
		err = emitTail(s.event, a.Finish, a.Usage)
	}
	if err != nil {
		return s.bw, err
	}
	return s.bw, s.finish()
}

func (s *callerStream) start() error {
	if s.started {
		return nil
	}
	s.started = true
	return s.bw.begin()
}

// event writes one neutral event. Arguments for a call whose block closed (a
// provider interleaving calls) still go to its index, where SDKs gather them.
func (s *callerStream) event(ev streamEvent) error {
	if s.done {
		return errCallerStreamDone
	}
	if err := s.start(); err != nil {
		return err
	}
	switch ev.Kind {
	case eventFinish:
		s.finishReason = ev.Finish
		if err := s.closeOpen(); err != nil {
			return err
		}
		return s.bw.finishNow(s.finishReason)
	case eventUsage:
		s.usage = ev.Usage
		s.usage.Reported = true
		return nil
	case eventText:
		if ev.Text == "" {
			return nil
		}
		if s.open < 0 || !s.blocks[s.open].text {
			if _, err := s.openBlock(&streamBlock{text: true}); err != nil {
				return err
			}
		}
		b := s.blocks[s.open]
		b.buf.WriteString(ev.Text)
		return s.bw.delta(s.open, b, ev.Text)
	case eventToolCallStart:
		name, _, custom := s.req.callerTool(ev.ToolCall)
		i, err := s.openBlock(&streamBlock{index: ev.Index, id: ev.ToolCall.ID, name: name,
			flat: ev.ToolCall.Name, custom: custom, wrapped: custom && !ev.ToolCall.Custom})
		s.toolBlock[ev.Index] = i
		return err
	case eventToolCallArgs:
		i, ok := s.toolBlock[ev.Index]
		if !ok {
			return fmt.Errorf("arguments for tool call %d before its start", ev.Index)
		}
		b := s.blocks[i]
		b.buf.WriteString(ev.Text)
		if ev.Text == "" || b.wrapped {
			return nil
		}
		return s.bw.delta(i, b, ev.Text)
	}
	return fmt.Errorf("unknown stream event kind %q", ev.Kind)
}

func (s *callerStream) openBlock(b *streamBlock) (int, error) {
	if err := s.closeOpen(); err != nil {
		return 0, err
	}
	s.open, s.blocks = len(s.blocks), append(s.blocks, b)
	return s.open, s.bw.open(s.open, b)
}

// closeOpen closes the open block; a wrapped call's input goes out first.
func (s *callerStream) closeOpen() error {
	i := s.open
	if i < 0 {
		return nil
	}
	s.open = -1
	b := s.blocks[i]
	full := b.buf.String()
	if b.wrapped {
		full = customInput(full)
		b.buf.Reset()
		b.buf.WriteString(full)
		if err := s.bw.delta(i, b, full); err != nil {
			return err
		}
	}
	return s.bw.close(i, b, full)
}

// finish writes the dialect's terminal sequence.
func (s *callerStream) finish() error {
	if err := s.end(); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	if err := s.closeOpen(); err != nil {
		return err
	}
	return s.bw.end(s.finishReason, s.usage)
}

// fail writes the dialect's in-band error, never a terminal success event.
func (s *callerStream) fail(e *apiError) error {
	if err := s.end(); err != nil {
		return err
	}
	return s.bw.fail(e)
}

func (s *callerStream) end() error {
	if s.done {
		return errCallerStreamDone
	}
	s.done = true
	return s.err
}

// keepAlive writes the SSE comment sent after 15 s without an event.
func (s *callerStream) keepAlive() error { return s.write(": keep-alive\n\n") }

// frame writes one event: "event: <name>\n" when name is set, then the data.
func (s *callerStream) frame(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if name != "" {
		name = "event: " + name + "\n"
	}
	return s.write(name + "data: " + string(b) + "\n\n")
}

func (s *callerStream) write(frame string) error {
	if s.err != nil {
		return s.err
	}
	if _, s.err = io.WriteString(s.w, frame); s.err == nil {
		s.flush()
	}
	return s.err
}
