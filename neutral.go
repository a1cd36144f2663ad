package main

import "encoding/json"

// The neutral request and answer sit between the three caller dialects
// (dialects.go) and the three provider protocols (providers.go), SPEC §7.6.
// Fields the neutral request cannot hold are dropped, never approximated.

// chatRequest is one chat request in no particular dialect.
type chatRequest struct {
	Model         string // as the caller named it: alias, route, selector or best
	System        string // the caller's system text, "" when none
	Messages      []message
	Tools         []tool
	ToolChoice    *toolChoice // nil: the provider's default
	MaxTokens     int         // 0: the caller gave none (SPEC §6.4 decides)
	Temperature   *float64
	Stream        bool
	BillingTarget *billingTarget // removed before forwarding (SPEC §7.2)
}

// message is one turn. Role is "user" or "assistant"; tool results travel
// as tool_result parts of a user message (protocols that want a separate
// "tool" role split them out when encoding).
type message struct {
	Role  string
	Parts []part
}

// part kinds.
const (
	partText       = "text"
	partImage      = "image"
	partToolCall   = "tool_call"
	partToolResult = "tool_result"
)

// part is one piece of a message.
type part struct {
	Type string
	// text: the text; tool_result: the result's text content.
	Text string
	// image: an https URL or a data URL ("data:image/png;base64,…").
	ImageURL string
	// tool_call and tool_result: the call's id.
	ToolCallID string
	// tool_call: the function name and its JSON-encoded arguments.
	ToolName  string
	Arguments string
	// tool_result: the tool reported an error.
	IsError bool
}

// tool is one function the model may call.
type tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage // JSON Schema object; nil when none given
}

// toolChoice modes.
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

// billingTarget names the one subscription that must pay (SPEC §7.2).
type billingTarget struct {
	ProviderID     string `json:"providerId,omitempty"`
	AccountID      string `json:"accountId,omitempty"`
	SubscriptionID string `json:"subscriptionId"`
}

// Finish reasons, in the neutral (OpenAI chat) vocabulary.
const (
	finishStop          = "stop"
	finishLength        = "length"
	finishToolCalls     = "tool_calls"
	finishContentFilter = "content_filter"
)

// chatAnswer is one complete answer in no particular dialect.
type chatAnswer struct {
	Model     string // the name reported to the caller (SPEC §7.6)
	Text      string
	ToolCalls []toolCall
	Finish    string
	Usage     usage
}

// toolCall is one function call the model made.
type toolCall struct {
	ID        string
	Name      string
	Arguments string // JSON text
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
	eventToolCallStart = "tool_call_start" // Index, ToolCall.ID, ToolCall.Name
	eventToolCallArgs  = "tool_call_args"  // Index, Text: the next piece of arguments JSON
	eventFinish        = "finish"          // Finish: why generation stopped
	eventUsage         = "usage"           // Usage
)

// streamEvent is one translated piece of a streamed answer. A provider stream
// yields finish (and usage) only when it sent its own terminal signal
// (SPEC §7.5); the caller's terminal event is written after that alone.
type streamEvent struct {
	Kind     string
	Text     string
	Index    int // tool call index, 0-based, in call order
	ToolCall toolCall
	Finish   string
	Usage    usage
}
