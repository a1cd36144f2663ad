package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
)

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

// errBaseURL marks a base URL override Brama refuses to call (SPEC §6.1).
var errBaseURL = errors.New("unusable provider base URL")

// providerBaseURL is BRAMA_PROVIDER_<ID>_BASE_URL, else p's built-in base
// URL; checkBaseURL keeps a typo from sending a credential in clear text.
func providerBaseURL(p providerInfo, getenv func(string) string) (string, error) {
	if p.cred == credNone {
		return "", fmt.Errorf("provider %q: %w: its endpoint comes from the registry deployment", p.id, errBaseURL)
	}
	env := "BRAMA_PROVIDER_" + strings.ToUpper(strings.ReplaceAll(p.id, "-", "_")) + "_BASE_URL"
	raw := cmp.Or(strings.TrimSpace(getenv(env)), p.baseURL)
	if err := checkBaseURL(raw); err != nil {
		return "", fmt.Errorf("%s: %w: %v", env, errBaseURL, err)
	}
	return strings.TrimRight(raw, "/"), nil
}

// checkBaseURL accepts https:// anywhere and http:// only to loopback. It
// refuses user info (a password would be quoted in transport errors), a
// query and a fragment (paths are appended to the base).
func checkBaseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a URL")
	}
	switch {
	case u.Host == "" || u.Opaque != "":
		return errors.New("no host")
	case u.User != nil:
		return errors.New("user info is not allowed")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return errors.New("a query or fragment is not allowed")
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if isLoopbackHost(u.Hostname()) {
			return nil
		}
		return errors.New("http:// is allowed only to a loopback host")
	}
	return errors.New("scheme must be https or http to loopback")
}

// isLoopbackHost reports whether host is localhost or a loopback address
// (127.0.0.0/8, ::1). It resolves no names: "localhost" is the only name.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// newProviderClient is the one HTTP client for provider calls: no redirects
// (one could carry a credential elsewhere), no ambient proxy (SPEC §6.1), no
// elapsed-time cutoff, not even for dialing (SPEC §7.4), no compression
// offered: the bytes held are the bytes sent (SPEC §17).
func newProviderClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy, t.DisableCompression = nil, true
	t.DialContext = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = 0
	t.ExpectContinueTimeout = 0
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 64 // IdleConnTimeout stays the default 90 s
	return &http.Client{
		Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// upstreamCredential is what a call presents.
type upstreamCredential struct {
	APIKey      string // direct key or an agent's own key
	AccessToken string // OAuth bearer (claude-code, codex, kimi)
	AccountID   string // codex chatgpt-account-id
}

// bearer is the token an Authorization: Bearer header carries.
func (c upstreamCredential) bearer() string {
	if c.AccessToken != "" {
		return c.AccessToken
	}
	return c.APIKey
}

// claudeCodeIdentity must be the first system block of OAuth traffic to
// Anthropic; the provider refuses such traffic without it (SPEC §6.2).
const claudeCodeIdentity = "You are Claude Code, Anthropic's official CLI for Claude."

// codexDefaultInstructions stands in for an empty system text: the codex
// backend refuses a request without instructions (SPEC §6.2).
const codexDefaultInstructions = "You are a helpful assistant."

// upstreamStreams reports whether the call to p streams: when the caller
// asked for a stream, and always for codex, whose backend only streams.
func upstreamStreams(p providerInfo, req chatRequest) bool {
	return req.Stream || p.id == "codex"
}

// buildUpstreamRequest builds the request for req to p, in p's protocol
// with p's wire details (SPEC §6.2); model is the upstream model name.
func buildUpstreamRequest(ctx context.Context, p providerInfo, baseURL string, cred upstreamCredential, req chatRequest, model string) (*http.Request, error) {
	stream := upstreamStreams(p, req)
	oauth := cred.AccessToken != ""
	f := formatOf(p.protocol) // never nil: TestEveryProviderHasAWireFormat
	body, err := f.encode(req, model, upstreamOptions{stream: stream, oauth: p.id == "claude-code" && oauth, codex: p.id == "codex", openai: p.id == "openai"})
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, refuse("invalid_request", "the request cannot be encoded for provider %q", p.id).because(err)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+f.path, bytes.NewReader(b))
	if err != nil {
		return nil, refuse("internal_error", "internal error").because(err)
	}
	options := http.Header{} // the format's own options a translation needs
	// SPEC §7.6: the structured-outputs beta, for a JSON Schema output format or a tool's strict, true or false.
	strict := slices.ContainsFunc(req.Tools, func(t tool) bool { return t.Strict != nil })
	if (req.Output != nil || strict) && p.protocol == protoAnthropic {
		options.Add("Anthropic-Beta", structuredOutputsBeta)
	}
	if p.protocol == protoAnthropic && req.adaptiveEffort(model) {
		options.Add("Anthropic-Beta", effortBeta)
	}
	setProviderHeaders(hr.Header, p, cred, options, stream)
	return hr, nil
}

// setProviderHeaders sets what a call to p carries (SPEC §6.2, §7.6): the
// credential and the format's version and beta headers, the caller's merged
// with p's; no other caller header is ever copied.
func setProviderHeaders(h http.Header, p providerInfo, cred upstreamCredential, caller http.Header, stream bool) {
	if named := caller.Values("Connection"); len(named) > 0 { // hop-by-hop fields (RFC 9110 §7.6.1)
		caller = caller.Clone()
		for _, f := range strings.Split(strings.Join(named, ","), ",") {
			caller.Del(strings.TrimSpace(f))
		}
	}
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json")
	if stream {
		h.Set("Accept", "text/event-stream")
	}
	oauth := cred.AccessToken != ""
	beta, need, bearer := "openai-beta", []string(nil), cred.bearer()
	switch {
	case p.protocol == protoAnthropic:
		h.Set("anthropic-version", cmp.Or(caller.Get("anthropic-version"), "2023-06-01"))
		beta, bearer = "anthropic-beta", cred.AccessToken
		if oauth && p.id == "claude-code" {
			need = []string{"oauth-2025-04-20"}
		}
		if !oauth && cred.APIKey != "" {
			h.Set("x-api-key", cred.APIKey)
		}
	case p.id == "codex":
		need = []string{"responses=experimental"}
		if cred.AccountID != "" {
			h.Set("chatgpt-account-id", cred.AccountID)
		}
		h.Set("originator", "codex_cli_rs")
	}
	if v := mergeTokens(caller.Values(beta), need...); v != "" {
		h.Set(beta, v)
	}
	if bearer != "" {
		h.Set("Authorization", "Bearer "+bearer)
	}
}

// controlAt is the index of s's first control character but a tab, which
// no header value may hold (RFC 9110 §5.5), or -1.
func controlAt(s string) int {
	for i := range len(s) {
		if s[i] < ' ' && s[i] != '\t' || s[i] == 0x7f {
			return i
		}
	}
	return -1
}

// headerText is s with each control character escaped as JSON writes it:
// a caller's member name may hold any.
func headerText(s string) string {
	if i := controlAt(s); i >= 0 {
		return s[:i] + fmt.Sprintf(`\u%04x`, s[i]) + headerText(s[i+1:])
	}
	return s
}

// mergeTokens joins comma-separated header values and the required tokens,
// in order, each once.
func mergeTokens(values []string, required ...string) string {
	var out []string
	for _, v := range append(values, required...) {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" && !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	return strings.Join(out, ",")
}
