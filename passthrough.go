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

// Native first (SPEC §7.6): a same-format call sends the caller's body but
// for the few members Brama acts on; only a call across formats parses it.

// callerRequest is a caller's chat request: the raw body, the head Brama
// acts on, the neutral request once a call across formats needs it.
type callerRequest struct {
	dialect string
	body    rawObject   // the caller's body, split into top-level members
	header  http.Header // the caller's request headers
	query   string      // the caller's raw query string
	// head holds only Model, Stream and MaxTokens, the output
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

// readCallerRequest reads the head of a caller's body: a member Brama does
// not know is never a refusal on the passthrough path.
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
	return cr, nil
}

// translates reports whether a call to p crosses formats.
func (cr *callerRequest) translates(p providerInfo) bool {
	return formatOf(cr.dialect).protocol != p.protocol
}

// parseForTranslation parses the whole body into the neutral request, once.
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
	req.Model, req.Stream, req.MaxTokens = cr.head.Model, cr.head.Stream, cr.head.MaxTokens
	req.StreamUsage = cr.dialect == dialectChat && cr.asksUsage()
	return req
}

// buildPassthroughRequest is a same-format call's request (SPEC §7.6): the
// output limit (§6.4) and the provider's rules (§6.2) edited, all else kept.
func buildPassthroughRequest(ctx context.Context, c call, cr *callerRequest) (*http.Request, error) {
	p := c.res.Provider
	var edits []memberEdit
	if cr.head.MaxTokens > 0 && !cr.callerLimit && p.id != "codex" {
		names := outputLimitNames[formatOf(p.protocol).dialect]
		name := names[len(names)-1]
		if p.id == "openai" { // its reasoning models refuse max_tokens
			name = names[0]
		}
		edits = append(edits, memberEdit{name, strconv.AppendInt(nil, int64(cr.head.MaxTokens), 10)})
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
	return cr.passthrough(ctx, c, formatOf(p.protocol).path, upstreamStreams(p, cr.head), edits...)
}

// passthrough is a same-format request to path, count_tokens too: the
// route's model, claude-code's system (SPEC §6.2), edits.
func (cr *callerRequest) passthrough(ctx context.Context, c call, path string, stream bool, edits ...memberEdit) (*http.Request, error) {
	m, _ := json.Marshal(c.res.Model)
	base := []memberEdit{{"model", m}}
	p := c.res.Provider
	if p.id == "claude-code" && c.cred.AccessToken != "" {
		sys, err := claudeCodeSystem(cr.body.value("system"))
		if err != nil {
			return nil, err
		}
		if sys != nil {
			base = append(base, memberEdit{"system", sys})
		}
	}
	if p.protocol == protoAnthropic && cr.query != "" {
		path += "?" + cr.query // Anthropic's clients send ?beta=true; the API takes it (README)
	}
	return newPassthroughRequest(ctx, c, cr.header, path, cr.body.edit(append(base, edits...)...), stream)
}

// addsUsage reports whether Brama asks a chat stream for usage itself, the
// caller not (SPEC §6.2); that usage chunk is not relayed (§7.6).
func (cr *callerRequest) addsUsage(p providerInfo) bool {
	return p.protocol == protoOpenAIChat && upstreamStreams(p, cr.head) && !cr.asksUsage()
}

// asksUsage reports whether the caller sent stream_options.include_usage: true.
func (cr *callerRequest) asksUsage() bool {
	o, _ := splitRaw(cr.body.value("stream_options"), '{', nil) // part of a valid body
	return string(o.value("include_usage")) == "true"
}

// claudeCodeSystem is OAuth traffic's system: the Claude Code identity, then
// the caller's blocks byte for byte (cache_control); nil if already so.
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

// codexInstructions is a codex body's instructions (SPEC §6.2): nil to keep
// the caller's, else its system and developer items' text, else the default.
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

// newPassthroughRequest is a call sending body as is, with p's headers.
func newPassthroughRequest(ctx context.Context, c call, caller http.Header, path string, body []byte, stream bool) (*http.Request, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, refuse("internal_error", "internal error").because(err)
	}
	setProviderHeaders(hr.Header, c.res.Provider, c.cred, caller, stream)
	return hr, nil
}
