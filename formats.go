package main

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// What the three wire formats (chat.go, messages.go, responses.go) share (SPEC §7.5, §7.6): the
// neutral request and answer and their table; parse.go reads a caller's body, sse.go the streams.

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
