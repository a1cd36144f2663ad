package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Provider protocols and the credential kinds a provider takes (SPEC §6.1).
const (
	protoOpenAIChat, protoAnthropic, protoOpenAIResponses = "openai-chat", "anthropic-messages", "openai-responses"

	credDirect       = "direct"       // the deployment's API key
	credNone         = "none"         // local-openai: the deployment endpoint needs none
	credSubscription = "subscription" // an agent's OAuth grant or API key
)

// providerInfo is one row of SPEC §6.1's table (and §11.1's token and sign-in tables): every fact that differs by provider.
type providerInfo struct {
	id, protocol, cred string
	baseURL            string    // built in; BRAMA_PROVIDER_<ID>_BASE_URL overrides
	vendor             string    // the catalogue's key (SPEC §7.3, models.dev's); local-openai runs anything: none
	probe              string    // SPEC §11.3's built-in probe model
	beta               string    // the beta token its calls need (SPEC §6.2); on anthropic-messages only with OAuth
	header             [2]string // a fixed header name and value its calls carry
	codex              bool      // SPEC §6.2's codex rules: streamed, unstored, no output limit, refusals by status, account id
	limitName          string    // the output limit its chat calls set, if not max_tokens (OpenAI's reasoning models refuse it)

	tokenURL, clientID string // "" without OAuth grants; tokenURL: BRAMA_OAUTH_<ID>_TOKEN_URL overrides
	form, echoState    bool   // the token endpoint takes a form body, not JSON; the sign-in's exchange echoes the state

	authorizeURL, redirectURI, scope string     // authorizeURL "": no sign-in
	extra                            url.Values // further authorize parameters

	usage       string // the usage report (SPEC §11.2): a path below the base URL, or a URL of its own; "": none
	usageAPIKey bool   // an API key reads the report too, not only a grant
}

// providerTable lists every provider Brama knows, and nothing else does.
var providerTable = []providerInfo{
	{id: "openai", protocol: protoOpenAIChat, cred: credDirect, baseURL: "https://api.openai.com/v1", vendor: "openai", limitName: "max_completion_tokens"},
	{id: "openai-responses", protocol: protoOpenAIResponses, cred: credDirect, baseURL: "https://api.openai.com/v1", vendor: "openai"},
	{id: "anthropic", protocol: protoAnthropic, cred: credDirect, baseURL: "https://api.anthropic.com", vendor: "anthropic", probe: "claude-haiku-4-5"},
	{id: "openrouter", protocol: protoOpenAIChat, cred: credDirect, baseURL: "https://openrouter.ai/api/v1", vendor: "openrouter"},
	{id: "groq", protocol: protoOpenAIChat, cred: credDirect, baseURL: "https://api.groq.com/openai/v1", vendor: "groq"},
	{id: "mistral", protocol: protoOpenAIChat, cred: credDirect, baseURL: "https://api.mistral.ai/v1", vendor: "mistral"},
	{id: "deepseek", protocol: protoOpenAIChat, cred: credDirect, baseURL: "https://api.deepseek.com/v1", vendor: "deepseek", probe: "deepseek-chat"},
	{id: "xai", protocol: protoOpenAIChat, cred: credDirect, baseURL: "https://api.x.ai/v1", vendor: "xai"},
	{id: "together", protocol: protoOpenAIChat, cred: credDirect, baseURL: "https://api.together.xyz/v1", vendor: "togetherai"},
	{id: "fireworks", protocol: protoOpenAIChat, cred: credDirect, baseURL: "https://api.fireworks.ai/inference/v1", vendor: "fireworks-ai"},
	{id: "cerebras", protocol: protoOpenAIChat, cred: credDirect, baseURL: "https://api.cerebras.ai/v1", vendor: "cerebras"},
	{id: "local-openai", protocol: protoOpenAIChat, cred: credNone},
	{id: "claude-code", protocol: protoAnthropic, cred: credSubscription, baseURL: "https://api.anthropic.com", vendor: "anthropic",
		probe: "claude-haiku-4-5", beta: "oauth-2025-04-20",
		tokenURL: "https://platform.claude.com/v1/oauth/token", // console.anthropic.com's now answers 404
		clientID: "9d1c250a-e61b-44d9-88ed-5944d1962f5e", echoState: true,
		authorizeURL: "https://claude.com/cai/oauth/authorize",          // claude.ai's refuses every grant now
		redirectURI:  "https://platform.claude.com/oauth/code/callback", // the only one still registered
		scope:        "org:create_api_key user:profile user:inference", extra: url.Values{"code": {"true"}}, usage: "/api/oauth/usage"},
	{id: "codex", protocol: protoOpenAIResponses, cred: credSubscription, baseURL: "https://chatgpt.com/backend-api/codex", vendor: "openai",
		probe: "gpt-5.3-codex-spark", beta: "responses=experimental", header: [2]string{"originator", "codex_cli_rs"}, codex: true,
		tokenURL: "https://auth.openai.com/oauth/token", clientID: "app_EMoamEEZ73f0CkXaXp7hrann", form: true,
		authorizeURL: "https://auth.openai.com/oauth/authorize", redirectURI: "http://localhost:1455/auth/callback",
		scope: "openid profile email offline_access", usage: "https://chatgpt.com/backend-api/wham/usage",
		extra: url.Values{"id_token_add_organizations": {"true"}, "codex_cli_simplified_flow": {"true"}}},
	{id: "kimi", protocol: protoOpenAIChat, cred: credSubscription, baseURL: "https://api.kimi.com/coding/v1", vendor: "moonshotai",
		probe: "kimi-for-coding", tokenURL: "https://auth.kimi.com/api/oauth/token", clientID: "17e5f671-d194-4dfb-9706-5516cb48c098", form: true,
		usage: "/usages", usageAPIKey: true},
}

func lookupProvider(id string) (providerInfo, bool) {
	i := slices.IndexFunc(providerTable, func(p providerInfo) bool { return p.id == id })
	if i < 0 {
		return providerInfo{}, false
	}
	return providerTable[i], true
}

func (p providerInfo) usageReadable(cred vaultCredential) bool {
	return p.usage != "" && (cred.OAuth != nil || p.usageAPIKey && cred.APIKey != "")
}

// usageEndpoint is p's usage report URL: below its base URL, or its own, which only BRAMA_PROVIDER_<ID>_USAGE_URL moves.
func (p providerInfo) usageEndpoint(getenv func(string) string) (string, error) {
	if !strings.HasPrefix(p.usage, "/") { // "": no report, which no URL check passes
		return envURL(getenv, "PROVIDER", p.id, "USAGE_URL", p.usage)
	}
	base, err := providerBaseURL(p, getenv)
	if err != nil {
		return "", err
	}
	return base + p.usage, nil
}

// providerBaseURL is BRAMA_PROVIDER_<ID>_BASE_URL, else p's own (local-openai has none: the deployment names it).
func providerBaseURL(p providerInfo, getenv func(string) string) (string, error) {
	raw, err := envURL(getenv, "PROVIDER", p.id, "BASE_URL", p.baseURL)
	return strings.TrimRight(raw, "/"), err
}

// envURL is BRAMA_<kind>_<ID>_<what>, else builtin, under checkBaseURL's rule (SPEC §6.1); a failure names the variable.
func envURL(getenv func(string) string, kind, id, what, builtin string) (string, error) {
	env := "BRAMA_" + kind + "_" + strings.ToUpper(strings.ReplaceAll(id, "-", "_")) + "_" + what
	raw := cmp.Or(strings.TrimSpace(getenv(env)), builtin)
	if err := checkBaseURL(raw); err != nil {
		return "", fmt.Errorf("%s: unusable URL: %w", env, err)
	}
	return raw, nil
}

// checkBaseURL allows https, http only to loopback (no key in clear text), no user info (errors quote it), query or fragment.
func checkBaseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" { // an opaque URL has none
		return errors.New("not a URL with a host")
	} else if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return errors.New("user info, a query or a fragment is not allowed")
	}
	ip, _ := netip.ParseAddr(u.Hostname()) // no name is resolved: only localhost counts
	if u.Scheme == "https" || u.Scheme == "http" && (ip.Unmap().IsLoopback() || strings.EqualFold(u.Hostname(), "localhost")) {
		return nil
	}
	return errors.New("scheme must be https, or http to a loopback host")
}

// newProviderClient is the one client for provider calls: no redirects (one could carry a credential away), no ambient proxy
// (SPEC §6.1), no elapsed-time cutoff, not even dialing (SPEC §7.4), no compression: the bytes held are those sent (§17).
func newProviderClient() *http.Client {
	t := &http.Transport{DialContext: (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext, ForceAttemptHTTP2: true,
		DisableCompression: true, MaxIdleConns: 256, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}
	return &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// callEndpoint sends one request and reads the answer whole (OAuth, usage reports, the catalogue); status is 0 when none came.
func callEndpoint(ctx context.Context, client *http.Client, method, endpoint string, body []byte,
	headers http.Header) (status int, b []byte, err error) {
	req, err := http.NewRequestWithContext(ctx, method, endpoint, bytes.NewReader(body))
	var resp *http.Response
	if err == nil {
		req.Header.Set("Accept", "application/json")
		maps.Copy(req.Header, headers)
		resp, err = client.Do(req)
	}
	if err != nil { // a *url.Error's cause: its "Get <url>:" would quote the endpoint, which callers name without its query
		return 0, nil, cmp.Or(errors.Unwrap(err), err)
	}
	defer resp.Body.Close()
	b, err = io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// upstreamCredential is what a call presents: an API key, else an OAuth grant's bearer (and codex's chatgpt-account-id).
type upstreamCredential struct{ APIKey, AccessToken, AccountID string }

func (c upstreamCredential) bearer() string { return cmp.Or(c.AccessToken, c.APIKey) }

// SPEC §6.2's system texts: Anthropic refuses OAuth traffic not led by claudeCodeIdentity, codex traffic without instructions.
const (
	claudeCodeIdentity       = "You are Claude Code, Anthropic's official CLI for Claude."
	codexDefaultInstructions = "You are a helpful assistant."
)

// claudeCodeSystem is OAuth traffic's system: the Claude Code identity, then the caller's blocks byte for byte; nil if so.
func claudeCodeSystem(raw json.RawMessage) ([]byte, error) {
	block := func(s string) string { return `{"text":` + string(jsonText(s)) + `,"type":"text"}` }
	if s, isString := jsonString(raw); s != "" { // a string is one text block
		raw = json.RawMessage("[" + block(s) + "]")
	} else if isString || raw == nil { // "" or absent: no block
		raw = json.RawMessage("[]")
	}
	var own []struct{ Type, Text string }
	if json.Unmarshal(raw, &own) != nil {
		return nil, refuse("invalid_request", "system must be a string or an array of content blocks")
	} else if len(own) == 0 { // [] or null
		return []byte("[" + block(claudeCodeIdentity) + "]"), nil
	} else if own[0].Type == "text" && own[0].Text == claudeCodeIdentity {
		return nil, nil
	}
	return append([]byte("["+block(claudeCodeIdentity)+","), bytes.TrimSpace(raw)[1:]...), nil
}

// codexInstructions is a codex body's instructions (SPEC §6.2): the caller's, else its system and developer text, or a default.
func codexInstructions(instructions, input json.RawMessage) []byte {
	var items []struct{ Role, Content json.RawMessage }
	if own, _ := jsonString(instructions); strings.TrimSpace(own) != "" {
		return instructions
	} else if json.Unmarshal(input, &items) != nil { // anything but an array of objects has no system text
		return jsonText(codexDefaultInstructions)
	}
	var texts []string
	for _, it := range items {
		if role, _ := jsonString(it.Role); role == "system" || role == "developer" {
			if s, ok := jsonString(it.Content); ok {
				texts = append(texts, s)
			}
			var parts []struct{ Text string }
			json.Unmarshal(it.Content, &parts) // a string leaves parts empty
			for _, p := range parts {
				texts = append(texts, p.Text)
			}
		}
	}
	return jsonText(cmp.Or(strings.TrimSpace(strings.Join(texts, "\n\n")), codexDefaultInstructions))
}

// setProviderHeaders sets a call's headers (SPEC §6.2, §7.6): credential, p's header, version, beta (caller's too), no other.
func setProviderHeaders(h http.Header, p providerInfo, cred upstreamCredential, caller http.Header, stream bool) {
	if named := caller.Values("Connection"); len(named) > 0 { // hop-by-hop fields (RFC 9110 §7.6.1)
		caller = caller.Clone()
		for f := range strings.SplitSeq(strings.Join(named, ","), ",") {
			caller.Del(strings.TrimSpace(f))
		}
	}
	betaName, need, bearer, apiKey := "openai-beta", p.beta, cred.bearer(), ""
	if p.protocol == protoAnthropic {
		h.Set("anthropic-version", cmp.Or(caller.Get("anthropic-version"), "2023-06-01"))
		if betaName, bearer = "anthropic-beta", cred.AccessToken; bearer == "" { // an API key: x-api-key, no OAuth beta
			need, apiKey = "", cred.APIKey
		}
	}
	var beta []string // the caller's tokens and p's, in order, each once
	for t := range strings.SplitSeq(strings.Join(caller.Values(betaName), ",")+","+need, ",") {
		if t = strings.TrimSpace(t); t != "" && !slices.Contains(beta, t) {
			beta = append(beta, t)
		}
	}
	accept := pick(stream, "text/event-stream", "application/json")
	for _, kv := range [...][2]string{{"Content-Type", "application/json"}, {"Accept", accept}, {"x-api-key", apiKey},
		{"chatgpt-account-id", pick(p.codex, cred.AccountID, "")}, p.header,
		{betaName, strings.Join(beta, ",")}, {"Authorization", pick(bearer != "", "Bearer "+bearer, "")}} {
		if kv[1] != "" { // unset: the call carries no such header
			h.Set(kv[0], kv[1])
		}
	}
}

// controlAt is the index of s's first control character but a tab (RFC 9110 §5.5: no header holds one), or -1.
func controlAt(s string) int {
	return strings.IndexFunc(s, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f })
}

// headerText is s with each control character escaped as JSON writes it.
func headerText(s string) string {
	if i := controlAt(s); i >= 0 {
		return s[:i] + fmt.Sprintf(`\u%04x`, s[i]) + headerText(s[i+1:])
	}
	return s
}

// Refusal classes of a non-2xx provider answer (SPEC §7.2 step 4).
const (
	refusalAuth  = "auth"  // 401/403: the credential was refused
	refusalRate  = "rate"  // 429: try later
	refusalQuota = "quota" // credit or quota spent, by the provider's type/code
	refusalModel = "model" // 400/404/413/422: a request the provider would not run
	refusalOther = "other" // everything else: answered at once, no rotation
)

// providerRefusal is a non-2xx provider answer classified by its status and type/code, never its text.
type providerRefusal struct {
	err        *apiError     // the code the caller gets on a direct/alias route (no attempts set here)
	class      string        // one of the refusal classes
	retryAfter time.Duration // from retry-after or reset headers; 0 when none stated (a block's, for rate and quota)
	sentence   string        // the provider's own error message, redacted, ≤ maxSentenceChars
}

// quotaCodes say the account's credit is spent: OpenAI's (insufficient_quota comes with 429), Anthropic's.
var quotaCodes = map[string]bool{"insufficient_quota": true, "billing_hard_limit_reached": true, "billing_not_active": true, "billing_error": true}

// classifyRefusal sorts a provider's non-2xx answer; presented is redacted from quotes after the class: no key changes a code.
func classifyRefusal(p providerInfo, status int, header http.Header, body []byte, presented string, now time.Time) providerRefusal {
	var b struct{ Error, Detail json.RawMessage } // no other shape is quoted: a raw body never is
	json.Unmarshal(body, &b)                      // a body of another shape leaves both empty
	f, ok := errorObject(b.Error)
	if d, _ := errorObject(b.Detail); !ok { // {"error":"text"}, or codex's {"detail":"text"} or {"detail":{"message":…}}
		f.msg = cmp.Or(f.msg, d.msg) // the status decides codex's class
	}
	r := providerRefusal{class: refusalOther, retryAfter: retryAfter(header, now),
		sentence: cleanQuoted(f.msg, presented, maxSentenceChars)}
	ec, rejected := "provider_failure", 0 // a malformed answer, 408, 409, a direct route's 401/403
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		r.class = refusalAuth
	case status/100 == 4 && (status == http.StatusPaymentRequired || !p.codex && (quotaCodes[f.typ] || quotaCodes[f.code])):
		r.class, ec = refusalQuota, "provider_quota_exhausted" // a quota refusal keeps its 502
	case status == http.StatusTooManyRequests:
		r.class, ec = refusalRate, "provider_rate_limited"
	case status == 400 || status == 404 || status == 413 || status == 422: // the request itself (SPEC §8.2)
		r.class, ec, rejected = refusalModel, "provider_rejected", status
	case status/100 == 4 && status != http.StatusRequestTimeout && status != http.StatusConflict:
		ec, rejected = "provider_rejected", http.StatusBadRequest
	case status == http.StatusGatewayTimeout:
		ec = "dependency_timeout"
	case status >= 500:
		ec = "dependency_unavailable"
	}
	m := fmt.Sprintf("provider %q answered %d", p.id, status)
	if label := cmp.Or(cleanQuoted(f.code, presented, 64), cleanQuoted(f.typ, presented, 64)); label != "" {
		m += " (" + label + ")"
	}
	if quoted := cleanQuoted(f.msg, presented, 1000); quoted != "" { // enough for a context-length refusal's numbers
		m += ": " + quoted
	}
	r.err = refuse(ec, "%s", m).withStatus(rejected)
	if r.err.Retryable {
		r.err.RetryAfter = r.retryAfter // the provider's own wait, on any route (SPEC §8.1)
	}
	return r
}

// errorObject reads {"type","code","message"}, code maybe a number (OpenRouter's status); a string is only a message.
func errorObject(raw json.RawMessage) (f struct{ typ, code, msg string }, isObject bool) {
	var e struct{ Type, Code, Message json.RawMessage }
	if f.msg, _ = jsonString(raw); len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &e) != nil {
		return f, false
	}
	f.typ, _ = jsonString(e.Type)
	f.code, _ = jsonScalar(e.Code)
	f.msg, _ = jsonString(e.Message)
	return f, true
}

// jsonString decodes raw when it is a JSON string; jsonScalar also a number, as text.
func jsonString(raw json.RawMessage) (s string, ok bool) {
	ok = len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil
	return s, ok
}

func jsonScalar(raw json.RawMessage) (string, bool) {
	var n json.Number
	if s, ok := jsonString(raw); ok || len(raw) == 0 || json.Unmarshal(raw, &n) != nil {
		return s, ok
	}
	return n.String(), true
}

// retryAfter is the wait stated by retry-after-ms, retry-after, else the latest reset among limits the headers show as spent
// (claude-code's rejected plan windows too; a used-up window the ledger recorded blocks without it); 0 if none is.
func retryAfter(h http.Header, now time.Time) (d time.Duration) {
	if ms := numberOf(h.Get("Retry-After-Ms")).v; ms > 0 {
		return time.Duration(min(ms, maxRetryAfter.Seconds()*1000) * float64(time.Millisecond))
	} else if d = statedWait(h, "Retry-After", now); d > 0 {
		return d // a wait already over states none (0): the reset headers below may
	}
	// OpenAI's limits, Anthropic's, and claude-code's unified windows, which state a status, not what remains (SPEC §6.3).
	for _, k := range []string{"X-Ratelimit-%s-requests", "X-Ratelimit-%s-tokens", "Anthropic-Ratelimit-requests-%s",
		"Anthropic-Ratelimit-tokens-%s", "Anthropic-Ratelimit-input-tokens-%s", "Anthropic-Ratelimit-output-tokens-%s",
		"Anthropic-Ratelimit-Unified-%s", "Anthropic-Ratelimit-Unified-5h-%s", "Anthropic-Ratelimit-Unified-7d-%s"} {
		if strings.TrimSpace(h.Get(fmt.Sprintf(k, "Remaining"))) == "0" || h.Get(fmt.Sprintf(k, "Status")) == "rejected" {
			d = max(d, statedWait(h, fmt.Sprintf(k, "Reset"), now))
		}
	}
	return d
}

// statedWait is header k's wait, ≤ maxRetryAfter: seconds, epoch seconds (> 1e9), a Go duration ("6m0s"), RFC 3339, HTTP date.
func statedWait(h http.Header, k string, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get(k))
	s := numberOf(v).v
	if s > 1e9 {
		s -= float64(now.UnixMilli()) / 1000 // from the instant, not its second: the block ends at the reset
	} else if d, err := time.ParseDuration(v); err == nil {
		s = d.Seconds()
	} else if t, err := time.Parse(time.RFC3339, v); err == nil {
		s = t.Sub(now).Seconds()
	} else if t, err := http.ParseTime(v); err == nil {
		s = t.Sub(now).Seconds()
	}
	return time.Duration(max(0, min(s, maxRetryAfter.Seconds())) * float64(time.Second)) // one already over states none
}

// classifyTransport maps a failed provider call to its code (SPEC §8.2): provider_incomplete once the request may be billed.
func classifyTransport(err error) *apiError {
	cause := cmp.Or(errors.Unwrap(err), err) // client.Do's *url.Error without "Post <url>:"; the URL says nothing new
	op, dns := (*net.OpError)(nil), (*net.DNSError)(nil)
	dial := errors.As(err, &op) && op.Op == "dial"
	code, m := "provider_incomplete", "the provider connection failed after the request was sent: %s"
	switch {
	case errors.Is(err, context.Canceled):
		code, m = "client_cancelled", "the caller went away during the provider call%.0s" // %.0s: no text
	case dial && op.Timeout(), errors.As(err, &dns) && dns.IsTimeout:
		code, m = "dependency_timeout", "connecting to the provider timed out: %s"
	case dial, errors.As(err, &dns):
		code, m = "dependency_unavailable", "could not connect to the provider, nothing was sent: %s"
	case errors.As(err, new(*tls.CertificateVerificationError)), errors.As(err, new(tls.RecordHeaderError)),
		errors.As(err, new(tls.AlertError)): // x509's errors come wrapped in the first
		code, m = "dependency_unavailable", "TLS handshake with the provider failed, nothing was sent: %s"
	}
	return refuse(code, m, cleanQuoted(cause.Error(), "", 300)).because(err)
}

// kimiCounters are what kimi's usage report states of its plan usage or of one limit (SPEC §11.2).
type kimiCounters struct {
	Limit, Used, Remaining number
	ResetTime              number        `json:"resetTime"`  // Kimi's name
	ResetTimeSpec          number        `json:"reset_time"` // SPEC's
	Detail                 *kimiCounters // a limit's: wins over its own counters
	Window                 struct {
		Duration number
		TimeUnit string
	}
}

// readUsage reads what it knows of p's undocumented usage report (SPEC §11.2), never a guessed number: claude-code's
// members with a utilization and a resets_at (anthropicWindows first, by traffic id), codex's rate_limit windows,
// kimi's used/limit (limit > 0, else 1 − remaining/limit). Its error never quotes the body.
func (p providerInfo) readUsage(body []byte, now time.Time) (ws []planWindow, err error) {
	var claude map[string]struct { // claude-code's members
		Utilization number // a percent
		ResetsAt    number `json:"resets_at"`
	}
	var doc struct {
		RateLimit map[string]codexReading `json:"rate_limit"` // codex's
		Usage     kimiCounters            // kimi's
		Limits    []kimiCounters
	}
	json.Unmarshal(body, &doc)                               // a member of another type is absent
	if err := json.Unmarshal(body, &claude); claude == nil { // not an object, or not JSON
		return nil, errors.New("the usage report is not usable: the body is not a JSON object (" + jsonErrorKind(err) + ")")
	}
	switch p.id {
	case "claude-code":
		windowKey := regexp.MustCompile(`^[a-z0-9_]{1,64}$`) // the shape of a member kept as a window id
		add := func(k, id, label string) {
			if m := claude[k]; m.Utilization.ok && m.ResetsAt.set && windowKey.MatchString(k) {
				ws = append(ws, newWindow(id, label, m.Utilization.v/100, m.ResetsAt.ms, now, windowSourceReport))
			}
			delete(claude, k)
		}
		for _, w := range anthropicWindows {
			add(w.member, w.id, w.label)
		}
		for _, k := range slices.Sorted(maps.Keys(claude)) {
			add(k, "anthropic:"+k, strings.ReplaceAll(k, "_", " "))
		}
	case "codex":
		for _, which := range []string{"primary", "secondary"} {
			if w, ok := doc.RateLimit[which+"_window"].codexWindow(which, now, windowSourceReport); ok {
				ws = append(ws, w)
			}
		}
	case "kimi":
		add := func(c kimiCounters, id, label string, reset int64) {
			if !c.Used.ok { // from what remains
				c.Used = number{v: c.Limit.v - c.Remaining.v, ok: c.Remaining.ok}
			}
			if reset = cmp.Or(c.ResetTime.ms, c.ResetTimeSpec.ms, reset); c.Limit.v > 0 && c.Used.ok {
				ws = append(ws, newWindow(id, label, c.Used.v/c.Limit.v, reset, now, windowSourceReport))
			}
		}
		minutes := map[string]float64{"TIME_UNIT_SECOND": 1.0 / 60, "TIME_UNIT_MINUTE": 1, "TIME_UNIT_HOUR": 60, "TIME_UNIT_DAY": 24 * 60}
		add(doc.Usage, "kimi:usage", "plan usage", 0)
		for i, l := range doc.Limits {
			n := strconv.Itoa(i)
			label := windowLabel(l.Window.Duration.v*minutes[l.Window.TimeUnit], "limit "+n)
			add(valueOr(l.Detail, l), "kimi:limit-"+n, label, cmp.Or(l.ResetTime.ms, l.ResetTimeSpec.ms))
		}
	}
	if len(ws) == 0 {
		return nil, errors.New("the usage report is not usable: it names no plan window")
	}
	return ws, nil
}

// jsonErrorKind says what was wrong with a JSON document without quoting a fragment of it.
func jsonErrorKind(err error) string {
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return "syntax error at byte " + strconv.FormatInt(se.Offset, 10)
	}
	return "unexpected shape"
}
