package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"
)

// The caller side of translation (SPEC §7.5, §7.6): the three public chat
// dialects a caller may speak, parsed into the neutral chatRequest and
// rendered back from the neutral chatAnswer, buffered or streamed.
//
// This file holds what the dialects share: the dispatch functions
// (parseRequest, renderAnswer, newCallerStream), the parse helpers and the
// SSE writer. Each dialect's request shapes, parser, answer and stream sit
// in its own file: dialectchat.go, dialectmessages.go, dialectresponses.go.
//
// Parsing is lenient about what it cannot use and strict about what it can:
// unknown members are dropped (SPEC §7.6: dropped, never approximated), while
// a member Brama reads but cannot make sense of (a non-string model, an
// unknown role, a content part whose kind the neutral request cannot hold) is
// refused as invalid_request. Silently dropping a whole content part or tool
// would answer a different question than the caller asked, so those refuse.
// Refusal messages name the member (messages[2].content[0]) but never quote
// the caller's text.

// Caller dialects, one per public chat endpoint.
const (
	dialectChat      = "chat"      // OpenAI Chat Completions, POST /v1/chat/completions
	dialectMessages  = "messages"  // Anthropic Messages, POST /v1/messages
	dialectResponses = "responses" // OpenAI Responses, POST /v1/responses
)

// parseRequest parses body as the given dialect into the neutral request.
// Every error is an *apiError with code invalid_request.
func parseRequest(dialect string, body []byte) (chatRequest, error) {
	switch dialect {
	case dialectChat:
		return parseChatCompletions(body)
	case dialectMessages:
		return parseMessages(body)
	case dialectResponses:
		return parseResponses(body)
	}
	return chatRequest{}, refuse("internal_error", "internal error").because(fmt.Errorf("unknown dialect %q", dialect))
}

// refuseInvalid is refuse("invalid_request", …), the one code a parse error has.
func refuseInvalid(format string, args ...any) *apiError {
	return refuse("invalid_request", format, args...)
}

// decodeCallerJSON unmarshals data into v and turns encoding/json's errors into
// invalid_request refusals that name the member at fault and quote nothing
// of the body. what prefixes the member path ("" for the request body).
func decodeCallerJSON(data []byte, v any, what string) error {
	err := json.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return refuseInvalid("malformed JSON at byte %d", se.Offset).because(err)
	case errors.As(err, &te):
		field := te.Field
		if what != "" && field != "" {
			field = what + "." + field
		} else if field == "" {
			field = what
		}
		if field == "" {
			return refuseInvalid("the request body must be a JSON object").because(err)
		}
		return refuseInvalid("%s: expected %s, got %s", field, callerJSONKind(te.Type), truncateUTF8(te.Value, 32)).because(err)
	}
	return refuseInvalid("malformed JSON").because(err)
}

// callerJSONKind names the JSON shape a Go type decodes from, for refusals.
func callerJSONKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Pointer:
		return callerJSONKind(t.Elem())
	}
	return "an object"
}

// rawIsNull reports whether a member was absent or JSON null.
func rawIsNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// rawShape is the first byte of a JSON value: '"', '[', '{', or another
// byte for numbers, booleans and null.
func rawShape(raw json.RawMessage) byte {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// newCallerRequest checks the members every dialect shares and starts the
// neutral request from them; limitName is the dialect's name for the output
// limit.
func newCallerRequest(model string, temperature *float64, stream bool, limitName string, limit *int, bt json.RawMessage) (chatRequest, error) {
	if err := checkCallerModel(model); err != nil {
		return chatRequest{}, err
	}
	req := chatRequest{Model: model, Temperature: temperature, Stream: stream}
	var err error
	if req.MaxTokens, err = checkCallerMaxTokens(limitName, limit); err != nil {
		return chatRequest{}, err
	}
	if req.BillingTarget, err = parseCallerBillingTarget(bt); err != nil {
		return chatRequest{}, err
	}
	return req, nil
}

// callerContent reads message content that is either a string (one text
// part) or an array of parts of type T; kind names the array's elements in
// the refusal.
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

// checkCallerModel refuses a missing or empty model; a non-string one was already
// refused by decodeCallerJSON.
func checkCallerModel(model string) error {
	if model == "" {
		return refuseInvalid("model is required and must be a non-empty string")
	}
	return nil
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

// parseCallerBillingTarget reads the top-level billingTarget member shared by all
// three dialects (SPEC §7.2). It is never forwarded; the neutral request
// carries it beside the conversation.
func parseCallerBillingTarget(raw json.RawMessage) (*billingTarget, error) {
	if rawIsNull(raw) {
		return nil, nil
	}
	if rawShape(raw) != '{' {
		return nil, refuseInvalid("billingTarget must be an object")
	}
	var bt billingTarget
	if err := decodeCallerJSON(raw, &bt, "billingTarget"); err != nil {
		return nil, err
	}
	if bt.SubscriptionID == "" {
		return nil, refuseInvalid("billingTarget.subscriptionId is required")
	}
	return &bt, nil
}

// parseCallerSchema reads a tool's parameter schema: absent or null is nil, an
// object is kept (compacted), anything else is refused.
func parseCallerSchema(raw json.RawMessage, what string) (json.RawMessage, error) {
	if rawIsNull(raw) {
		return nil, nil
	}
	if rawShape(raw) != '{' {
		return nil, refuseInvalid("%s must be a JSON Schema object", what)
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, refuseInvalid("%s is malformed", what).because(err)
	}
	return json.RawMessage(b.Bytes()), nil
}

// checkCallerImageURL accepts the two image references every provider protocol
// can carry: an https URL or a data URL.
func checkCallerImageURL(url, what string) error {
	if strings.HasPrefix(url, "https://") || strings.HasPrefix(url, "data:") {
		return nil
	}
	return refuseInvalid("%s must be an https URL or a data URL", what)
}

// quoteCallerToken quotes a caller-chosen token (a role, a part type) for a refusal,
// bounded so a refusal never echoes a long string back.
func quoteCallerToken(s string) string {
	return fmt.Sprintf("%q", truncateUTF8(s, 64))
}

// newAnswerID returns prefix followed by 26 random characters, for the answer and
// item ids each dialect's SDKs expect.
func newAnswerID(prefix string) string {
	return prefix + rand.Text()
}

// appendCallerToolResult adds a tool_result part to msgs, joining the last user
// message when it holds only tool results: consecutive tool results are one
// user turn in the neutral request (SPEC §7.6).
func appendCallerToolResult(msgs []message, p part) []message {
	if n := len(msgs); n > 0 && msgs[n-1].Role == "user" && allToolResults(msgs[n-1].Parts) {
		msgs[n-1].Parts = append(msgs[n-1].Parts, p)
		return msgs
	}
	return append(msgs, message{Role: "user", Parts: []part{p}})
}

func allToolResults(ps []part) bool {
	for _, p := range ps {
		if p.Type != partToolResult {
			return false
		}
	}
	return len(ps) > 0
}

// joinSystemText appends one more piece of system text, "\n\n" between pieces.
func joinSystemText(sys, more string) string {
	switch {
	case more == "":
		return sys
	case sys == "":
		return more
	}
	return sys + "\n\n" + more
}

// callerTextOf reads content that may only be text: a string, or an array of
// {"type":"text","text":…} parts (the type name given by textType), joined
// with sep. Used for system prompts and tool results.
func callerTextOf(raw json.RawMessage, what, textType, sep string) (string, error) {
	switch rawShape(raw) {
	case '"':
		var s string
		err := decodeCallerJSON(raw, &s, what)
		return s, err
	case '[':
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := decodeCallerJSON(raw, &parts, what); err != nil {
			return "", err
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
	return "", refuseInvalid("%s must be a string or an array of %s parts", what, textType)
}

// renderAnswer encodes a buffered answer as the caller's dialect's success
// body.
func renderAnswer(dialect string, a chatAnswer) ([]byte, error) {
	switch dialect {
	case dialectChat:
		return json.Marshal(callerChatCompletion(a))
	case dialectMessages:
		return json.Marshal(callerMessagesAnswer(a))
	case dialectResponses:
		return json.Marshal(callerResponsesAnswer(a, newAnswerID("resp_"), time.Now().Unix()))
	}
	return nil, refuse("internal_error", "internal error").because(fmt.Errorf("unknown dialect %q", dialect))
}

// answerFinish is the answer's finish reason, "stop" when the provider gave
// none (a complete answer always stopped for some reason).
func answerFinish(f string) string {
	if f == "" {
		return finishStop
	}
	return f
}

// answerIDOr is id, or a fresh one with prefix when the provider sent none.
func answerIDOr(id, prefix string) string {
	if id == "" {
		return newAnswerID(prefix)
	}
	return id
}

// callerStream writes a streamed answer in the caller's dialect (SPEC §7.5).
// dispatch calls start once the provider committed, event for every neutral
// event, then exactly one of finish (the provider sent its terminal signal)
// or fail (anything else after commit). Every SSE event is flushed as soon as
// it is written. The first write error sticks: later calls return it.
type callerStream interface {
	start() error               // chat: role delta chunk; messages: message_start; responses: response.created
	event(ev streamEvent) error // translate one neutral event and write it
	finish() error              // the dialect's terminal sequence
	fail(e *apiError) error     // the dialect's in-band error; never a terminal success event
	keepAlive() error           // the SSE comment ": keep-alive", after 15 s without an event
}

// errCallerStreamDone is returned by a callerStream used after finish or fail.
var errCallerStreamDone = errors.New("caller stream already ended")

// newCallerStream returns the stream writer for dialect over w; flush is
// called after every SSE event (nil: nothing to flush). model is the name
// reported to the caller (SPEC §7.6). An unknown dialect is a programming
// error and panics, like refuse with an unknown code.
func newCallerStream(dialect string, w io.Writer, flush func(), model string) callerStream {
	if flush == nil {
		flush = func() {}
	}
	sw := callerSSE{w: w, flush: flush}
	switch dialect {
	case dialectChat:
		return &callerChatStream{sse: sw, id: newAnswerID("chatcmpl-"), created: time.Now().Unix(), model: model}
	case dialectMessages:
		return &callerMessagesStream{sse: sw, id: newAnswerID("msg_"), model: model, open: -1, toolBlock: map[int]int{}}
	case dialectResponses:
		return &callerResponsesStream{sse: sw, model: model, open: -1, toolItem: map[int]int{},
			resp: callerResponsesObject{ID: newAnswerID("resp_"), Object: "response", CreatedAt: time.Now().Unix(), Model: model, Output: []any{}}}
	}
	panic("brama: unknown dialect " + dialect)
}

// callerSSE writes whole SSE frames, one Write and one flush each, and
// remembers the first write error so a broken connection is reported once
// and nothing more is attempted.
type callerSSE struct {
	w     io.Writer
	flush func()
	err   error
	done  bool // finish or fail ran
}

// frame writes one event: "event: <name>\n" when name is set, then
// "data: <json>\n\n".
func (s *callerSSE) frame(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var f strings.Builder
	if name != "" {
		f.WriteString("event: " + name + "\n")
	}
	f.WriteString("data: ")
	f.Write(b)
	f.WriteString("\n\n")
	return s.write(f.String())
}

func (s *callerSSE) write(frame string) error {
	if s.err != nil {
		return s.err
	}
	if _, err := io.WriteString(s.w, frame); err != nil {
		s.err = err
		return err
	}
	s.flush()
	return nil
}

func (s *callerSSE) keepAlive() error { return s.write(": keep-alive\n\n") }

// end marks the stream ended; it refuses a second ending.
func (s *callerSSE) end() error {
	if s.done {
		return errCallerStreamDone
	}
	s.done = true
	return s.err
}

// callerStreamTail is what every dialect keeps for its terminal events: the
// finish reason and usage arrive as events, in either order, usage maybe
// never.
type callerStreamTail struct {
	finish string
	usage  usage
}

// record keeps finish and usage events; it reports whether ev was one.
func (t *callerStreamTail) record(ev streamEvent) bool {
	switch ev.Kind {
	case eventFinish:
		t.finish = ev.Finish
	case eventUsage:
		t.usage = ev.Usage
		t.usage.Reported = true
	default:
		return false
	}
	return true
}

func unknownStreamEvent(ev streamEvent) error {
	return fmt.Errorf("unknown stream event kind %q", ev.Kind)
}
