package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// Native first (SPEC §7.6): when the caller's dialect is the provider's
// protocol, the request goes out as the caller wrote it but for the few
// members Brama acts on, and the answer comes back as the provider wrote it
// (relay.go). Only a call across formats parses the whole body and
// translates (formats.go).

// callerRequest is one caller chat request as dispatch carries it: the raw
// body, the head Brama acts on, and the neutral request once a call across
// formats needs it.
type callerRequest struct {
	dialect string
	body    rawObject   // the caller's body, split into top-level members
	header  http.Header // the caller's request headers
	query   string      // the caller's raw query string
	// head holds only Model, Stream, BillingTarget and MaxTokens, the output
	// limit a call sends (SPEC §6.4).
	head        chatRequest
	callerLimit bool         // the caller named an output limit
	neutral     *chatRequest // the whole body parsed for translation; nil until a call needs it
}

// outputLimitNames are each dialect's names for the output limit.
var outputLimitNames = map[string][]string{
	dialectChat:      {"max_completion_tokens", "max_tokens"},
	dialectMessages:  {"max_tokens"},
	dialectResponses: {"max_output_tokens"},
}

// readCallerRequest reads the head of a caller's body leniently: only
// model, stream, the output limit and billingTarget are looked at, so a
// member Brama does not know is never a refusal on the passthrough path.
func readCallerRequest(dialect string, r *http.Request, body []byte) (*callerRequest, error) {
	o, err := parseRawObject(body)
	if err != nil {
		return nil, err
	}
	cr := &callerRequest{dialect: dialect, body: o, header: r.Header, query: r.URL.RawQuery}
	if err := json.Unmarshal(o.value("model"), &cr.head.Model); err != nil || cr.head.Model == "" {
		return nil, refuse("invalid_request", "model is required and must be a non-empty string")
	}
	if v := o.value("stream"); !rawIsNull(v) && json.Unmarshal(v, &cr.head.Stream) != nil {
		return nil, refuse("invalid_request", "stream must be a boolean")
	}
	for _, name := range outputLimitNames[dialect] {
		if v := o.value(name); !rawIsNull(v) {
			var n int
			if json.Unmarshal(v, &n) != nil || n < 1 {
				return nil, refuse("invalid_request", "%s must be an integer of at least 1", name)
			}
			if !cr.callerLimit {
				cr.head.MaxTokens, cr.callerLimit = n, true
			}
		}
	}
	if cr.head.BillingTarget, err = readBillingTarget(o.value("billingTarget")); err != nil {
		return nil, err
	}
	return cr, nil
}

// readBillingTarget reads the billingTarget member (SPEC §7.2): absent or
// null is none; it is never forwarded.
func readBillingTarget(raw json.RawMessage) (*billingTarget, error) {
	if rawIsNull(raw) {
		return nil, nil
	}
	var bt billingTarget
	if rawShape(raw) != '{' || json.Unmarshal(raw, &bt) != nil {
		return nil, refuse("invalid_request", "billingTarget must be an object with string members")
	}
	if bt.SubscriptionID == "" {
		return nil, refuse("invalid_request", "billingTarget.subscriptionId is required")
	}
	return &bt, nil
}

// translates reports whether a call to p crosses formats: the caller's
// dialect is not p's protocol.
func (cr *callerRequest) translates(p providerInfo) bool {
	return formatOf(cr.dialect).protocol != p.protocol
}

// parseForTranslation parses the whole body into the neutral request, once.
// A refusal here is a 400 before any call.
func (cr *callerRequest) parseForTranslation() error {
	if cr.neutral != nil {
		return nil
	}
	req, err := parseRequest(cr.dialect, cr.body.src)
	if err == nil {
		cr.neutral = &req
	}
	return err
}

// withLimit is cr for one call whose output limit is limit (SPEC §6.4).
func (cr *callerRequest) withLimit(limit int) *callerRequest {
	c := *cr
	c.head.MaxTokens = limit
	return &c
}

// translated is the neutral request one call across formats sends.
func (cr *callerRequest) translated() chatRequest {
	req := *cr.neutral
	req.Model, req.Stream, req.MaxTokens, req.BillingTarget = cr.head.Model, cr.head.Stream, cr.head.MaxTokens, nil
	return req
}

// buildPassthroughRequest is a same-format call's request (SPEC §7.6): the
// caller's body with model, billingTarget, the output limit (§6.4) and the
// provider's rules (§6.2) edited, every other member kept byte for byte.
func buildPassthroughRequest(ctx context.Context, c call, cr *callerRequest) (*http.Request, error) {
	p := c.res.Provider
	edits, err := cr.baseEdits(p, c.cred, c.res.Model)
	if err != nil {
		return nil, err
	}
	if cr.head.MaxTokens > 0 && !cr.callerLimit && p.id != "codex" {
		edits = append(edits, memberEdit{outputLimitMember(p), strconv.AppendInt(nil, int64(cr.head.MaxTokens), 10)})
	}
	switch {
	case cr.addsUsage(p):
		opts := []byte(`{"include_usage":true}`)
		if so := cr.body.value("stream_options"); rawShape(so) == '{' {
			o, _ := splitRawObject(so, nil) // part of a valid body
			opts = o.edit(memberEdit{"include_usage", []byte("true")})
		}
		edits = append(edits, memberEdit{"stream_options", opts})
	case p.id == "codex": // SPEC §6.2: always streamed, never stored, never an output limit
		edits = append(edits, memberEdit{"stream", []byte("true")}, memberEdit{"store", []byte("false")},
			memberEdit{"max_output_tokens", nil})
		if ins := codexInstructions(cr.body); ins != nil {
			edits = append(edits, memberEdit{"instructions", ins})
		}
	}
	path := formatOf(p.protocol).path
	if p.protocol == protoAnthropic && cr.query != "" {
		path += "?" + cr.query // Anthropic's clients send ?beta=true; the API takes it (README)
	}
	return newPassthroughRequest(ctx, c, cr.header, path, cr.body.edit(edits...), upstreamStreams(p, cr.head))
}

// baseEdits are the edits every passthrough body gets, count_tokens too:
// the route's model, no billingTarget, and claude-code's system prefix on
// OAuth traffic (SPEC §6.2).
func (cr *callerRequest) baseEdits(p providerInfo, cred upstreamCredential, model string) ([]memberEdit, error) {
	m, _ := json.Marshal(model)
	edits := []memberEdit{{"model", m}, {"billingTarget", nil}}
	if p.id == "claude-code" && cred.AccessToken != "" {
		sys, err := claudeCodeSystem(cr.body.value("system"))
		if err != nil {
			return nil, err
		}
		if sys != nil {
			edits = append(edits, memberEdit{"system", sys})
		}
	}
	return edits, nil
}

// outputLimitMember is the member Brama adds for the output limit: the
// format's plain name, but OpenAI's own API wants max_completion_tokens
// (its reasoning models refuse max_tokens).
func outputLimitMember(p providerInfo) string {
	names := outputLimitNames[formatOf(p.protocol).dialect]
	if p.id == "openai" {
		return names[0]
	}
	return names[len(names)-1]
}

// addsUsage reports whether Brama asks a chat stream for usage itself
// (SPEC §6.2): the caller sent no stream_options.include_usage, or false.
// The usage chunk is then Brama's and is not relayed (SPEC §7.6).
func (cr *callerRequest) addsUsage(p providerInfo) bool {
	if p.protocol != protoOpenAIChat || !upstreamStreams(p, cr.head) {
		return false
	}
	so := cr.body.value("stream_options")
	if rawShape(so) != '{' {
		return true
	}
	o, _ := splitRawObject(so, nil)
	return string(o.value("include_usage")) != "true"
}

// claudeCodeSystem is the system member OAuth traffic to Anthropic needs:
// the Claude Code identity first, then the caller's (blocks keep their
// bytes, such as cache_control); nil when it already starts so.
func claudeCodeSystem(raw json.RawMessage) ([]byte, error) {
	text := func(s string) []byte {
		b, _ := json.Marshal(map[string]string{"type": "text", "text": s})
		return b
	}
	blocks := [][]byte{text(claudeCodeIdentity)}
	var s string
	var own []struct{ Type, Text string }
	switch {
	case rawIsNull(raw):
	case json.Unmarshal(raw, &s) == nil:
		if s == claudeCodeIdentity {
			return nil, nil
		}
		if s != "" {
			blocks = append(blocks, text(s))
		}
	case json.Unmarshal(raw, &own) == nil:
		if len(own) > 0 && own[0].Type == "text" && own[0].Text == claudeCodeIdentity {
			return nil, nil
		}
		if len(own) > 0 {
			inner := bytes.TrimSpace(raw)
			blocks = append(blocks, inner[1:len(inner)-1])
		}
	default:
		return nil, refuse("invalid_request", "system must be a string or an array of content blocks")
	}
	return append(append([]byte("["), bytes.Join(blocks, []byte(","))...), ']'), nil
}

// codexInstructions is the instructions member a codex body gets (SPEC
// §6.2): nil when the caller's own is a non-empty string, else the text of
// its system and developer input items, else the default.
func codexInstructions(o rawObject) []byte {
	var own string
	if json.Unmarshal(o.value("instructions"), &own) == nil && strings.TrimSpace(own) != "" {
		return nil
	}
	var items []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	var texts []string
	if json.Unmarshal(o.value("input"), &items) == nil { // anything but an array of objects has none
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
	}
	b, _ := json.Marshal(cmp.Or(strings.TrimSpace(strings.Join(texts, "\n\n")), codexDefaultInstructions))
	return b
}

// newPassthroughRequest builds the HTTP request of a call that sends body
// as is, with p's credential and format headers (SPEC §6.2).
func newPassthroughRequest(ctx context.Context, c call, caller http.Header, path string, body []byte, stream bool) (*http.Request, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, refuse("internal_error", "internal error").because(err)
	}
	setProviderHeaders(hr.Header, c.res.Provider, c.cred, caller, stream)
	return hr, nil
}
