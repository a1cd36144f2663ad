package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Native first (SPEC §7.6): a same-format call sends the caller's body as received but for the few top-level
// members §6.2 and §6.4 name, edited by their byte spans, never re-encoded; its answer is relayed as received, read
// by the stream reader only for usage (§13), the terminal signal and the in-band error (§7.5).

// jsonMember is one member of a rawObject: key (rawText), val:end its value; its segment starts at the previous one's end.
type jsonMember struct {
	key      []byte
	val, end int
}

// rawObject is one valid JSON object (an array: members without keys).
type rawObject struct {
	src     []byte
	members []jsonMember
}

// parseRawObject splits a caller's body (too deep a body was refused before any handler: state.go's depth scan).
func parseRawObject(src []byte) (rawObject, error) {
	if !json.Valid(src) {
		return rawObject{}, decodeCallerJSON(src, new(any), "")
	} else if o, ok := splitRaw(src, '{', make([]jsonMember, 0, 8)); ok {
		return o, nil
	}
	return rawObject{}, refuse("invalid_request", "the request body must be a JSON object")
}

// splitRaw splits the valid JSON object or array (open '{' or '[') at src's start into members in scratch's storage:
// a stream's watch allocates nothing.
func splitRaw(src []byte, open byte, scratch []jsonMember) (rawObject, bool) {
	i := skipJSONSpace(src, 0)
	if i >= len(src) || src[i] != open {
		return rawObject{}, false
	}
	o := rawObject{src: src, members: scratch[:0]}
	for i++; ; {
		i = len(src) - len(bytes.TrimLeft(src[i:], ", \t\n\r")) // past space and the separating comma, if any
		if src[i] == '}' || src[i] == ']' {
			return o, true
		}
		m := jsonMember{val: i}
		if open == '{' {
			k := skipJSONValue(src, i)
			m.key, m.val = rawText(src[i:k]), skipJSONSpace(src, skipJSONSpace(src, k)+1) // past ':'
		}
		m.end = skipJSONValue(src, m.val)
		o.members = append(o.members, m)
		i = m.end
	}
}

// value is the raw value of the last member named key (encoding/json's rule for a repeated key), nil when absent.
func (o rawObject) value(key string) (v json.RawMessage) {
	for _, m := range o.members {
		if string(m.key) == key {
			v = o.src[m.val:m.end]
		}
	}
	return v
}

// memberEdit replaces every member named key with value, or adds it at the end when absent; a nil value removes it.
type memberEdit struct {
	key   string
	value []byte
}

func (o rawObject) edit(edits ...memberEdit) []byte {
	out := bytes.NewBuffer(make([]byte, 0, len(o.src)+64))
	o.writeEdited(out, edits...)
	return out.Bytes()
}

// writeEdited writes edit's bytes piece by piece: a digest of them holds no copy of the body (the replay guard's, SPEC §17).
func (o rawObject) writeEdited(w io.Writer, edits ...memberEdit) {
	tail, first := skipJSONSpace(o.src, 0)+1, true // past the '{'
	w.Write(o.src[:tail])
	for _, m := range o.members {
		seg := o.src[tail:m.end]
		tail = m.end
		k := slices.IndexFunc(edits, func(e memberEdit) bool { return string(m.key) == e.key })
		if k >= 0 && edits[k].value == nil {
			continue
		}
		if j := skipJSONSpace(seg, 0); first && j < len(seg) && seg[j] == ',' {
			seg = seg[j+1:] // the first member written carries no separator
		}
		if first = false; k >= 0 {
			w.Write(seg[:len(seg)-(m.end-m.val)])
			seg = edits[k].value
		}
		w.Write(seg)
	}
	for _, e := range edits { // an absent member after the rest; Brama's own keys are plain ASCII
		if e.value != nil && o.value(e.key) == nil {
			w.Write(append(append(strconv.AppendQuote([]byte(",")[:boolCount(!first)], e.key), ':'), e.value...))
			first = false
		}
	}
	w.Write(o.src[tail:])
}

// rawText is a JSON string's text, the source's bytes when it has no escapes (string(t) == "…" allocates nothing).
func rawText(raw []byte) []byte {
	if len(raw) < 2 || raw[0] != '"' {
		return nil
	} else if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1]
	}
	s, _ := jsonString(raw)
	return []byte(s)
}

func skipJSONSpace(b []byte, i int) int { return len(b) - len(bytes.TrimLeft(b[i:], " \t\n\r")) }

// skipJSONValue is the index just past the valid value (or key) at i; no recursion, so no depth exhausts a stack.
func skipJSONValue(b []byte, i int) int {
	if b[i] != '"' && b[i] != '{' && b[i] != '[' { // a scalar ends where its object or array goes on
		return i + bytes.IndexAny(b[i:], ",}] \t\n\r")
	}
	for depth := 0; i < len(b); i++ {
		switch b[i] {
		case '"': // to the closing quote
			for i++; i < len(b) && b[i] != '"'; i++ {
				i += boolCount(b[i] == '\\')
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		if depth == 0 {
			return i + 1
		}
	}
	return len(b)
}

// callerRequest is a caller's chat request: the raw body, the head Brama acts on, the neutral request once needed.
type callerRequest struct {
	dialect string
	body    rawObject
	caller  *http.Request // its headers and query
	head    chatRequest   // Model, Stream, StreamUsage, LimitName, and MaxTokens, the output limit a call sends (SPEC §6.4)
	neutral *chatRequest  // the whole body parsed for translation; nil until a call needs it
	sent    *chatRequest  // the last translated call's request, Dropped what it lost (chatRequest.drop)
}

// readCallerRequest reads a caller body's head, the one check of its model, stream and output limit (SPEC §7.6).
func readCallerRequest(dialect string, r *http.Request, body []byte) (*callerRequest, error) {
	o, err := parseRawObject(body)
	if err != nil {
		return nil, err
	}
	cr := &callerRequest{dialect: dialect, body: o, caller: r}
	if json.Unmarshal(o.value("model"), &cr.head.Model) != nil || cr.head.Model == "" {
		return nil, refuse("invalid_request", "model is required and must be a non-empty string")
	}
	if v := o.value("stream"); !rawIsNull(v) && json.Unmarshal(v, &cr.head.Stream) != nil {
		return nil, refuse("invalid_request", "stream must be a boolean")
	}
	for _, name := range valueOr(formatOf(dialect), wireFormat{}).limits { // embeddings: no format, no limit
		v := o.value(name)
		n, err := strconv.Atoi(string(v)) // a valid JSON value: only an integer parses, as json.Unmarshal reads one
		if !rawIsNull(v) && (err != nil || n < 1) {
			return nil, refuse("invalid_request", "%s must be an integer of at least 1", name)
		} else if n > 0 && cr.head.LimitName == "" { // the first name present wins
			cr.head.MaxTokens, cr.head.LimitName = n, name
		}
	}
	so, _ := splitRaw(o.value("stream_options"), '{', nil)
	cr.head.StreamUsage = dialect == dialectChat && string(so.value("include_usage")) == "true"
	return cr, nil
}

func (cr *callerRequest) translates(p providerInfo) bool {
	return formatOf(cr.dialect).protocol != p.protocol
}

// buildChatRequest is a chat call's request: translated, or the caller's body (SPEC §7.6) with §6.4's limit and §6.2's rules.
func buildChatRequest(ctx context.Context, c call, cr *callerRequest) (*http.Request, error) {
	p := c.res.Provider
	if cr.translates(p) {
		cr.sent = new(*cr.neutral)
		cr.sent.MaxTokens = cr.head.MaxTokens          // the model's own when the caller gave none (SPEC §6.4)
		cr.sent.Dropped = slices.Clip(cr.sent.Dropped) // an encoder's drops are its call's own
		return buildUpstreamRequest(ctx, c, cr.sent)
	}
	var edits []memberEdit
	if cr.head.MaxTokens > 0 && cr.head.LimitName == "" && !p.codex {
		names := formatOf(p.protocol).limits
		name := cmp.Or(p.limitName, names[len(names)-1])
		edits = append(edits, memberEdit{name, strconv.AppendInt(nil, int64(cr.head.MaxTokens), 10)})
	}
	if cr.addsUsage(p) {
		opts := []byte(`{"include_usage":true}`)
		if so, ok := splitRaw(cr.body.value("stream_options"), '{', nil); ok {
			opts = so.edit(memberEdit{"include_usage", []byte("true")})
		}
		edits = append(edits, memberEdit{"stream_options", opts})
	}
	if p.codex { // SPEC §6.2: always streamed, never stored, never an output limit
		ins := codexInstructions(cr.body.value("instructions"), cr.body.value("input"))
		edits = append(edits, memberEdit{"stream", []byte("true")}, memberEdit{"store", []byte("false")},
			memberEdit{"max_output_tokens", nil}, memberEdit{"instructions", ins})
	}
	return cr.passthrough(ctx, c, formatOf(p.protocol).path, cr.head.Stream || p.codex, edits...)
}

// passthrough is a same-format request to path, count_tokens too: the route's model, claude-code's system (SPEC §6.2), edits.
func (cr *callerRequest) passthrough(ctx context.Context, c call, path string, stream bool, edits ...memberEdit) (*http.Request, error) {
	base := []memberEdit{{"model", jsonText(c.res.Model)}}
	if c.claudeCode() {
		sys, err := claudeCodeSystem(cr.body.value("system"))
		if err != nil {
			return nil, err
		} else if sys != nil { // nil: the identity already leads
			base = append(base, memberEdit{"system", sys})
		}
	}
	if c.res.Provider.protocol == protoAnthropic && cr.caller.URL.RawQuery != "" {
		path += "?" + cr.caller.URL.RawQuery // Anthropic's clients send ?beta=true; the API takes it (README)
	}
	return newProviderRequest(ctx, c, cr.caller.Header, path, cr.body.edit(append(base, edits...)...), stream)
}

func newProviderRequest(ctx context.Context, c call, extra http.Header, path string, body []byte, stream bool) (*http.Request, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(body))
	if err == nil { // else the attempt engine's internal_error (asAPIError)
		setProviderHeaders(hr.Header, c.res.Provider, c.cred, extra, stream)
	}
	return hr, err
}

// addsUsage reports whether Brama asks a chat stream for usage, the caller not (SPEC §6.2); that chunk is not relayed (§7.6).
func (cr *callerRequest) addsUsage(p providerInfo) bool {
	return p.protocol == protoOpenAIChat && (cr.head.Stream || p.codex) && !cr.head.StreamUsage
}

// call is one planned provider call: the route's model, where, and the credential.
type call struct {
	res     resolution
	baseURL string
	cred    upstreamCredential
}

// claudeCode reports a call to Anthropic signed in with OAuth (claude-code's): its system starts with the identity (SPEC §6.2).
func (c call) claudeCode() bool {
	return c.res.Provider.protocol == protoAnthropic && c.cred.AccessToken != ""
}

// estimateInputTokens is SPEC §15's local estimate: the bytes of system, text, tool_use input, tool_result content and tools, ÷ 4.
func estimateInputTokens(o rawObject) int {
	var size func(raw json.RawMessage) int
	size = func(raw json.RawMessage) int { // a string, or blocks; a message (no type) counts as its content
		s, _ := jsonString(raw)
		n := len(s)
		var blocks []messagesBlock
		json.Unmarshal(raw, &blocks)
		for _, b := range blocks { // a text part has only text, a tool_use only input, a tool_result only content
			n += len(valueOr(b.Text, "")) + len(b.Input) + size(b.Content)
		}
		return n
	}
	n := size(o.value("system")) + size(o.value("messages"))
	if t := o.value("tools"); !rawIsNull(t) {
		n += len(t)
	}
	return (n + 3) / 4
}

// textOf is the text of ps' text parts, joined with sep.
func textOf(ps []part, sep string) string {
	var texts []string
	for _, p := range ps {
		if p.Type == partText {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, sep)
}

// rawIsNull reports an absent or null value (raw is valid JSON: only null starts with n).
func rawIsNull(raw json.RawMessage) bool { s := rawShape(raw); return s == 0 || s == 'n' }

func rawShape(raw json.RawMessage) byte {
	if raw = bytes.TrimSpace(raw); len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// rawMember is raw's member name in any case, as encoding/json matches it: the last one of that name.
func rawMember(raw json.RawMessage, name string) (v json.RawMessage) {
	o, _ := splitRaw(raw, '{', make([]jsonMember, 0, 16)) // on the stack: it does not escape
	for _, m := range o.members {
		if strings.EqualFold(string(m.key), name) {
			v = raw[m.val:m.end]
		}
	}
	return v
}

// buildUpstreamRequest is req's call c in its provider's protocol and wire details (SPEC §6.2).
func buildUpstreamRequest(ctx context.Context, c call, req *chatRequest) (*http.Request, error) {
	f, options := formatOf(c.res.Provider.protocol), http.Header{} // never nil; options: the format's own headers it needs
	req.Stream = req.Stream || c.res.Provider.codex
	body, err := f.encode(req, c, options)
	if err != nil {
		return nil, err
	}
	return newProviderRequest(ctx, c, options, f.path, body, req.Stream)
}

// relayBuffered reads a committed buffered answer of c whole (a codex stream, SPEC §6.2, to its end) and writes it to w
// (nil: the probe's) with attempts: through s into its dialect (the first refusal a block met fails it), or, s nil, as
// received: a JSON object whose usage is read, or a codex stream assembled (provider_failure when not).
func relayBuffered(w http.ResponseWriter, c call, resp *http.Response, attempts int, s *callerStream) (u usage, _ *apiError) {
	p, ct, body := c.res.Provider, "application/json", []byte(nil) // an assembled or translated answer is Brama's JSON
	var err error
	if !p.codex {
		body, err = readWhole(p, resp)
	}
	switch {
	case err != nil:
	case s != nil:
		if u, err = s.answer(c, resp.Body, body, true, false); err == nil {
			body, err = json.Marshal(s.whole)
		}
	case p.codex:
		r := &streamReader{protocol: p.protocol, secret: c.cred.bearer(), raw: map[int][]byte{}}
		err = r.run(resp.Body, "\n", nil)
		body, u = r.final, r.usage
	default:
		ct = cmp.Or(resp.Header.Get("Content-Type"), ct)
		o, notObject := parseRawObject(body) // not decoded: only its usage is read
		if u, err = usageOf(p.protocol, o.value("usage")); notObject != nil {
			err = malformedAnswer(p.protocol, notObject) // usageOf's own error is one already
		}
	}
	if err != nil {
		return u, asAPIError(err).withAttempts(attempts)
	} else if w != nil {
		writeAnswer(w, resp.Header, s == nil, ct, attempts, body)
	}
	return u, nil
}
