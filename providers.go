package main

// Provider protocols (SPEC §6.1).
const (
	protoOpenAIChat      = "openai-chat"
	protoAnthropic       = "anthropic-messages"
	protoOpenAIResponses = "openai-responses"
)

// Credential kinds a provider takes (SPEC §6.1).
const (
	credDirect       = "direct"       // the deployment's API key
	credNone         = "none"         // local-openai: the deployment endpoint needs none
	credSubscription = "subscription" // an agent's OAuth grant or API key
)

// providerInfo is one row of SPEC §6.1's table.
type providerInfo struct {
	id       string
	protocol string
	cred     string
	baseURL  string // built in; BRAMA_PROVIDER_<ID>_BASE_URL overrides
}

// providerTable lists every provider Brama knows, and nothing else does.
var providerTable = []providerInfo{
	{"openai", protoOpenAIChat, credDirect, "https://api.openai.com/v1"},
	{"openai-responses", protoOpenAIResponses, credDirect, "https://api.openai.com/v1"},
	{"anthropic", protoAnthropic, credDirect, "https://api.anthropic.com"},
	{"openrouter", protoOpenAIChat, credDirect, "https://openrouter.ai/api/v1"},
	{"groq", protoOpenAIChat, credDirect, "https://api.groq.com/openai/v1"},
	{"mistral", protoOpenAIChat, credDirect, "https://api.mistral.ai/v1"},
	{"deepseek", protoOpenAIChat, credDirect, "https://api.deepseek.com/v1"},
	{"xai", protoOpenAIChat, credDirect, "https://api.x.ai/v1"},
	{"together", protoOpenAIChat, credDirect, "https://api.together.xyz/v1"},
	{"fireworks", protoOpenAIChat, credDirect, "https://api.fireworks.ai/inference/v1"},
	{"cerebras", protoOpenAIChat, credDirect, "https://api.cerebras.ai/v1"},
	{"local-openai", protoOpenAIChat, credNone, ""},
	{"claude-code", protoAnthropic, credSubscription, "https://api.anthropic.com"},
	{"codex", protoOpenAIResponses, credSubscription, "https://chatgpt.com/backend-api/codex"},
	{"kimi", protoOpenAIChat, credSubscription, "https://api.kimi.com/coding/v1"},
}

// lookupProvider finds a provider by id.
func lookupProvider(id string) (providerInfo, bool) {
	for _, p := range providerTable {
		if p.id == id {
			return p, true
		}
	}
	return providerInfo{}, false
}
