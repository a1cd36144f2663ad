package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
)

// countTokens answers POST /v1/messages/count_tokens (SPEC §15): the
// anthropic-messages provider's own count (one call), else a local estimate.
func (e *engine) countTokens(ctx context.Context, w http.ResponseWriter, req *callerRequest, c call) error {
	if c.res.Provider.protocol != protoAnthropic { // also selectors and best: no one route to ask
		if c.res.Route != "" {
			w.Header().Set("Brama-Route", c.res.Route)
		}
		w.Header().Set("Brama-Estimate", "true")
		writeJSON(w, http.StatusOK, countTokensAnswer{ptrTo(estimateInputTokens(req.body))})
		return nil
	}
	j := &job{kind: kindCountTokens,
		build: func(ctx context.Context, _ *candidate, c call) (*http.Request, error) {
			return req.passthrough(ctx, c, "/v1/messages/count_tokens", false)
		},
		commit: func(_ context.Context, _ *candidate, c call, _ *overlayItem, resp *http.Response, attempts int) (usage, *apiError, bool) {
			var ans countTokensAnswer
			b, err := io.ReadAll(resp.Body)
			if err != nil { // SPEC §8.2: a buffered answer cut mid-body
				return usage{}, refuse("provider_incomplete", "provider %q answer was cut after %d bytes", c.res.Provider.id, len(b)).because(err).withAttempts(attempts), false
			}
			if err := json.Unmarshal(b, &ans); err != nil || ans.InputTokens == nil {
				return usage{}, malformedAnswer(protoAnthropic, err).withAttempts(attempts), false
			}
			w.Header().Set("Brama-Route", c.res.Route)
			w.Header().Set("Brama-Attempts", strconv.Itoa(attempts))
			providerFacts(w.Header(), resp.Header, true)
			writeJSON(w, http.StatusOK, ans)
			return usage{}, nil, false
		}}
	if ae := e.attemptRoute(ctx, j, c, req); ae != nil {
		return ae
	}
	return nil
}

// countTokensAnswer is the body of every count_tokens answer.
type countTokensAnswer struct {
	InputTokens *int `json:"input_tokens"`
}

// estimateInputTokens is SPEC §15's local estimate.
func estimateInputTokens(o rawObject) int {
	type block struct {
		Type    string          `json:"type"`
		Text    string          `json:"text"`
		Input   json.RawMessage `json:"input"`
		Content json.RawMessage `json:"content"`
	}
	var textOf func(raw json.RawMessage) int
	textOf = func(raw json.RawMessage) int { // a string, or blocks
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return len(s)
		}
		var blocks []block
		json.Unmarshal(raw, &blocks)
		n := 0
		for _, b := range blocks {
			switch b.Type {
			case "text":
				n += len(b.Text)
			case "tool_use":
				n += len(b.Input)
			case "tool_result":
				n += textOf(b.Content)
			}
		}
		return n
	}
	n := textOf(o.value("system"))
	var msgs []block // only their content counts
	json.Unmarshal(o.value("messages"), &msgs)
	for _, m := range msgs {
		n += textOf(m.Content)
	}
	if t := o.value("tools"); !rawIsNull(t) {
		n += len(t)
	}
	return (n + 3) / 4
}
