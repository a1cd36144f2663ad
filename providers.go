package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
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

func lookupProvider(id string) (providerInfo, bool) {
	i := slices.IndexFunc(providerTable, func(p providerInfo) bool { return p.id == id })
	if i < 0 {
		return providerInfo{}, false
	}
	return providerTable[i], true
}

// errBaseURL marks a base URL override Brama refuses to call (SPEC §6.1).
var errBaseURL = errors.New("unusable provider base URL")

// providerBaseURL is BRAMA_PROVIDER_<ID>_BASE_URL, else p's built-in base URL.
func providerBaseURL(p providerInfo, getenv func(string) string) (string, error) {
	if p.cred == credNone {
		return "", fmt.Errorf("provider %q: %w: its endpoint comes from the registry deployment", p.id, errBaseURL)
	}
	raw, err := envURL(getenv, "PROVIDER", p.id, "BASE_URL", p.baseURL, errBaseURL)
	return strings.TrimRight(raw, "/"), err
}

// envURL is BRAMA_<kind>_<ID>_<what>, else builtin, under checkBaseURL's
// rule, so a typo cannot send a credential in clear text; failures wrap sentinel.
func envURL(getenv func(string) string, kind, id, what, builtin string, sentinel error) (string, error) {
	env := "BRAMA_" + kind + "_" + strings.ToUpper(strings.ReplaceAll(id, "-", "_")) + "_" + what
	raw := cmp.Or(strings.TrimSpace(getenv(env)), builtin)
	if err := checkBaseURL(raw); err != nil {
		return "", fmt.Errorf("%s: %w: %v", env, sentinel, err)
	}
	return raw, nil
}

// checkBaseURL accepts https:// anywhere and http:// only to loopback. It
// refuses user info (a password would be quoted in transport errors), a
// query and a fragment (paths are appended to the base).
func checkBaseURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return errors.New("not a URL")
	case u.Host == "" || u.Opaque != "":
		return errors.New("no host")
	case u.User != nil:
		return errors.New("user info is not allowed")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return errors.New("a query or fragment is not allowed")
	case u.Scheme == "https" || u.Scheme == "http" && isLoopbackHost(u.Hostname()):
		return nil
	case u.Scheme == "http":
		return errors.New("http:// is allowed only to a loopback host")
	}
	return errors.New("scheme must be https or http to loopback")
}

// isLoopbackHost reports whether host is localhost or a loopback address
// (127.0.0.0/8, ::1). It resolves no names: "localhost" is the only name.
func isLoopbackHost(host string) bool {
	ip, err := netip.ParseAddr(host)
	return strings.EqualFold(host, "localhost") || err == nil && ip.Unmap().IsLoopback()
}

// newProviderClient is the one HTTP client for provider calls: no redirects
// (one could carry a credential elsewhere), no ambient proxy (SPEC §6.1), no
// elapsed-time cutoff, not even for dialing (SPEC §7.4), no compression
// offered: the bytes held are the bytes sent (SPEC §17).
func newProviderClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy, t.DisableCompression = nil, true
	t.DialContext = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout, t.ExpectContinueTimeout = 0, 0
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 256, 64 // IdleConnTimeout stays the default 90 s
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &http.Client{Transport: t, CheckRedirect: noRedirect}
}

// callEndpoint sends one request with headers through client and reads the
// answer whole (OAuth, usage reports, the catalogue); status is 0 when none came.
func callEndpoint(ctx context.Context, client *http.Client, method, endpoint string, body []byte,
	headers ...[2]string) (status int, b []byte, err error) {
	req, err := http.NewRequestWithContext(ctx, method, endpoint, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Accept", "application/json")
	for _, kv := range headers {
		req.Header.Set(kv[0], kv[1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err = io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// upstreamCredential is what a call presents.
type upstreamCredential struct {
	APIKey      string // direct key or an agent's own key
	AccessToken string // OAuth bearer (claude-code, codex, kimi)
	AccountID   string // codex chatgpt-account-id
}

func (c upstreamCredential) bearer() string { return cmp.Or(c.AccessToken, c.APIKey) }

// claudeCodeIdentity must be the first system block of OAuth traffic to
// Anthropic; the provider refuses such traffic without it (SPEC §6.2).
const claudeCodeIdentity = "You are Claude Code, Anthropic's official CLI for Claude."

// codexDefaultInstructions stands in for an empty system text: the codex
// backend refuses a request without instructions (SPEC §6.2).
const codexDefaultInstructions = "You are a helpful assistant."

// probeModels is SPEC §11.3's built-in probe model per provider.
var probeModels = map[string]string{"claude-code": "claude-haiku-4-5", "anthropic": "claude-haiku-4-5",
	"codex": "gpt-5.3-codex-spark", "kimi": "kimi-for-coding", "deepseek": "deepseek-chat"}

// claudeCodeSystem is OAuth traffic's system: the Claude Code identity, then
// the caller's blocks byte for byte (cache_control); nil if already so.
func claudeCodeSystem(raw json.RawMessage) ([]byte, error) {
	text := func(s string) string {
		b, _ := json.Marshal(s)
		return `{"text":` + string(b) + `,"type":"text"}`
	}
	identity := text(claudeCodeIdentity)
	var s string
	var own []struct{ Type, Text string }
	switch {
	case raw == nil || string(raw) == "null":
	case json.Unmarshal(raw, &s) == nil:
		if s == claudeCodeIdentity {
			return nil, nil
		} else if s != "" {
			return []byte(`[` + identity + `,` + text(s) + `]`), nil
		}
	case json.Unmarshal(raw, &own) == nil:
		if len(own) > 0 && own[0].Type == "text" && own[0].Text == claudeCodeIdentity {
			return nil, nil
		} else if len(own) > 0 {
			return append([]byte(`[`+identity+`,`), bytes.TrimSpace(raw)[1:]...), nil
		}
	default:
		return nil, refuse("invalid_request", "system must be a string or an array of content blocks")
	}
	return []byte(`[` + identity + `]`), nil
}

// codexInstructions is a codex body's instructions (SPEC §6.2): nil to keep
// the caller's, else its system and developer items' text, else the default.
func codexInstructions(instructions, input json.RawMessage) []byte {
	var own string
	if json.Unmarshal(instructions, &own) == nil && strings.TrimSpace(own) != "" {
		return nil
	}
	var items []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	var texts []string
	if json.Unmarshal(input, &items) != nil {
		items = nil // anything but an array of objects has none
	}
	for _, it := range items {
		var s string
		var parts []struct {
			Text string `json:"text"`
		}
		switch {
		case it.Role != "system" && it.Role != "developer":
		case json.Unmarshal(it.Content, &s) == nil:
			texts = append(texts, s)
		default:
			json.Unmarshal(it.Content, &parts)
			for _, p := range parts {
				texts = append(texts, p.Text)
			}
		}
	}
	b, _ := json.Marshal(cmp.Or(strings.TrimSpace(strings.Join(texts, "\n\n")), codexDefaultInstructions))
	return b
}

// upstreamStreams reports whether the call to p streams: when the caller
// asked for a stream, and always for codex, whose backend only streams.
func upstreamStreams(p providerInfo, req chatRequest) bool {
	return req.Stream || p.id == "codex"
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
	h.Set("Accept", map[bool]string{false: "application/json", true: "text/event-stream"}[stream])
	beta, need, bearer := "openai-beta", []string(nil), cred.bearer()
	switch {
	case p.protocol == protoAnthropic:
		h.Set("anthropic-version", cmp.Or(caller.Get("anthropic-version"), "2023-06-01"))
		beta, bearer = "anthropic-beta", cred.AccessToken
		if bearer != "" && p.id == "claude-code" {
			need = []string{"oauth-2025-04-20"}
		}
		if bearer == "" && cred.APIKey != "" {
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
	return strings.IndexFunc(s, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f })
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
	for _, t := range strings.Split(strings.Join(append(values, required...), ","), ",") {
		if t = strings.TrimSpace(t); t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return strings.Join(out, ",")
}

// Refusal classes of a non-2xx provider answer (SPEC §7.2 step 4).
const (
	refusalAuth  = "auth"  // 401/403: the credential was refused
	refusalRate  = "rate"  // 429: try later
	refusalQuota = "quota" // credit or quota spent, by the provider's type/code
	refusalModel = "model" // 400/404/413/422: a request the provider would not run
	refusalOther = "other" // everything else: answered at once, no rotation
)

// providerRefusal is a classified non-2xx provider answer (SPEC §8.2,
// §7.2.4): from the status and the error's type/code, never its text.
type providerRefusal struct {
	err        *apiError     // the code the caller gets on a direct/alias route (no attempts set here)
	class      string        // refusalAuth, refusalRate, refusalQuota, refusalModel or refusalOther
	status     int           // the provider's HTTP status
	retryAfter time.Duration // from retry-after or reset headers; 0 when none stated
	sentence   string        // the provider's own error message, redacted, ≤ maxSentenceBytes
}

// quotaCodes are the provider error types/codes that say the account's
// credit or quota is spent: OpenAI's insufficient_quota (sent with 429)
// and its older billing codes, Anthropic's billing_error (sent with 402).
var quotaCodes = map[string]bool{"insufficient_quota": true, "billing_hard_limit_reached": true, "billing_not_active": true, "billing_error": true}

// rejectedStatus is provider_rejected's status for a provider's 4xx
// refusal of the request itself (SPEC §8.2); 0 when status is not one.
func rejectedStatus(status int) int {
	switch {
	case status < 400 || status > 499 || slices.Contains([]int{401, 403, 408, 409, 429}, status):
		return 0
	case status == 400 || status == 404 || status == 413 || status == 422:
		return status
	}
	return 400
}

// classifyRefusal classifies a non-2xx answer of a provider (an id, else a
// protocol). presented is redacted from what is quoted, only after the
// class was decided: a short key must not change what a code says.
func classifyRefusal(protocol string, status int, header http.Header, body []byte, presented string, now time.Time) providerRefusal {
	who, byStatus := "provider", false
	if p, ok := lookupProvider(protocol); ok {
		who, byStatus = fmt.Sprintf("provider %q", p.id), p.id == "codex" // SPEC §6.2: codex errors are classified by status alone
	}
	typ, code, msg := providerErrorFields(body)
	r := providerRefusal{class: refusalOther, status: status, sentence: cleanQuoted(msg, presented, maxSentenceBytes)}
	rejected, ec := rejectedStatus(status), "provider_failure" // a malformed answer, 408, 409, a direct route's 401/403
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		r.class = refusalAuth
	case status/100 == 4 && (status == http.StatusPaymentRequired || !byStatus && (quotaCodes[typ] || quotaCodes[code])):
		r.class, ec, rejected = refusalQuota, "provider_quota_exhausted", 0 // a quota refusal keeps its 502
	case status == http.StatusTooManyRequests:
		r.class, ec = refusalRate, "provider_rate_limited"
	case rejected == status:
		r.class, ec = refusalModel, "provider_rejected"
	case rejected != 0:
		ec = "provider_rejected"
	case status == http.StatusGatewayTimeout:
		ec = "dependency_timeout"
	case status >= 500:
		ec = "dependency_unavailable"
	}
	wait := retryAfter(header, now)
	if r.class == refusalRate || r.class == refusalQuota {
		r.retryAfter = wait
	}
	m := fmt.Sprintf("%s answered %d", who, status)
	if label := cmp.Or(cleanQuoted(code, presented, 64), cleanQuoted(typ, presented, 64)); label != "" {
		m += " (" + label + ")"
	}
	if quoted := cleanQuoted(msg, presented, 1000); quoted != "" { // enough for a context-length refusal's numbers
		m += ": " + quoted
	}
	r.err = refuse(ec, "%s", m)
	if rejected != 0 {
		r.err.withStatus(rejected)
	}
	if r.err.retryable() {
		r.err.RetryAfter = wait // the provider's own wait, on any route (SPEC §8.1)
	}
	return r
}

// providerErrorFields pulls type, code and message out of the error bodies
// providers send ({"error":{…}}, {"error":"text"}, codex's {"detail":…});
// any other body yields nothing: a raw body is never quoted.
func providerErrorFields(body []byte) (typ, code, msg string) {
	var b struct{ Error, Detail json.RawMessage }
	if json.Unmarshal(body, &b) != nil {
		return "", "", ""
	}
	if e, ok := errorObject(b.Error); ok {
		return e.typ, e.code, e.msg
	}
	if s, ok := jsonString(b.Error); ok {
		return "", "", s
	}
	s, ok := jsonString(b.Detail) // codex: {"detail": "text"} or {"detail": {"message": …}}; status decides
	if e, _ := errorObject(b.Detail); !ok {
		s = e.msg
	}
	return "", "", s
}

type errorFields struct{ typ, code, msg string }

// errorObject reads {"type","code","message"}; code may be a string or a
// number (OpenRouter sends the HTTP status there).
func errorObject(raw json.RawMessage) (errorFields, bool) {
	var e struct{ Type, Code, Message json.RawMessage }
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &e) != nil {
		return errorFields{}, false
	}
	typ, _ := jsonString(e.Type)
	code, _ := jsonScalar(e.Code)
	msg, _ := jsonString(e.Message)
	return errorFields{typ, code, msg}, true
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

// maxRetryAfter bounds a stated reset; a block never outlasts it (SPEC §7.2).
const maxRetryAfter = 7 * 24 * time.Hour

// retryAfter is the wait the provider stated: retry-after-ms, retry-after
// (seconds or an HTTP date), else the latest reset among the limits its
// headers show as exhausted. 0 when nothing is stated.
func retryAfter(h http.Header, now time.Time) time.Duration {
	hv := func(k string) string { return strings.TrimSpace(h.Get(k)) }
	num := func(k string) (float64, error) { return strconv.ParseFloat(hv(k), 64) }
	if ms, err := num("Retry-After-Ms"); err == nil && ms > 0 && !math.IsInf(ms, 0) {
		return clampWait(ms / 1000)
	}
	if v := hv("Retry-After"); v != "" {
		s, err := strconv.ParseFloat(v, 64)
		if t, terr := http.ParseTime(v); err != nil && terr == nil {
			s, err = t.Sub(now).Seconds(), nil
		}
		if d := clampWait(s); err == nil && d > 0 {
			return d // a wait already over states none: the reset headers below may
		}
	}
	var d time.Duration
	// OpenAI: x-ratelimit-{remaining,reset}-{requests,tokens}, reset as "6m0s";
	// Anthropic: anthropic-ratelimit-<limit>-{remaining,reset}, reset RFC 3339.
	for _, k := range []string{"X-Ratelimit-%s-requests", "X-Ratelimit-%s-tokens", "Anthropic-Ratelimit-requests-%s",
		"Anthropic-Ratelimit-tokens-%s", "Anthropic-Ratelimit-input-tokens-%s", "Anthropic-Ratelimit-output-tokens-%s"} {
		x, err := time.ParseDuration(hv(fmt.Sprintf(k, "Reset")))
		if t, terr := time.Parse(time.RFC3339, hv(fmt.Sprintf(k, "Reset"))); terr == nil {
			x, err = t.Sub(now), nil
		}
		if err == nil && hv(fmt.Sprintf(k, "Remaining")) == "0" {
			d = max(d, clampWait(x.Seconds()))
		}
	}
	// claude-code plan windows (SPEC §6.3): reset in unix seconds.
	for _, k := range []string{"", "5h-", "7d-"} {
		p := "Anthropic-Ratelimit-Unified-" + k
		u, _ := num(p + "Utilization")
		if s, err := strconv.ParseInt(hv(p+"Reset"), 10, 64); err == nil && (hv(p+"Status") == "rejected" || u >= 1) {
			d = max(d, clampWait(float64(s-now.Unix())))
		}
	}
	// codex plan windows (SPEC §6.3): a countdown, else an epoch second.
	for _, k := range []string{"Primary", "Secondary"} {
		p := "X-Codex-" + k + "-"
		u, uerr := num(p + "Used-Percent")
		s, err := num(p + "Reset-After-Seconds")
		if at, aerr := num(p + "Reset-At"); err != nil && aerr == nil {
			s, err = at-float64(now.Unix()), nil
		}
		if err == nil && uerr == nil && u >= 100 {
			d = max(d, clampWait(s))
		}
	}
	return d
}

// clampWait turns seconds into a wait within (0, maxRetryAfter]; a wait
// already over (or not a number) is 0, "none stated".
func clampWait(s float64) time.Duration {
	if !(s > 0) {
		return 0
	}
	return time.Duration(min(s, maxRetryAfter.Seconds()) * float64(time.Second))
}

// classifyTransport maps a failed provider call to its code (SPEC §8.2):
// provider_incomplete once the request may have been sent (and billed).
func classifyTransport(err error) *apiError {
	cause := err
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		cause = ue.Err // drop "Post <url>:"; the URL says nothing new
	}
	var op *net.OpError
	var dns *net.DNSError
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
		errors.As(err, new(tls.AlertError)), errors.As(err, new(x509.UnknownAuthorityError)),
		errors.As(err, new(x509.HostnameError)), errors.As(err, new(x509.CertificateInvalidError)):
		code, m = "dependency_unavailable", "TLS handshake with the provider failed, nothing was sent: %s"
	}
	return refuse(code, m, cleanQuoted(cause.Error(), "", 300)).because(err)
}
