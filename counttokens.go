package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
)

// POST /v1/messages/count_tokens (SPEC §15): a route whose provider speaks
// anthropic-messages forwards the body to the provider's own count (it
// spends no quota; one attempt, no rotation); any other route gets a local
// estimate and no call. The answer is never kept as a signed answer.

// handleCountTokens resolves model as /v1/messages does and counts.
func (s *server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	req, err := readCallerRequest(dialectMessages, r, ri.body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ri.requestedModel = req.head.Model
	c, err := s.plan(ri, &req.head) // §6.4's max_tokens rule does not apply here
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if c.res.Provider.protocol != protoAnthropic { // also selectors and best: no one route to ask
		if c.res.Route != "" {
			w.Header().Set("Brama-Route", c.res.Route)
		}
		w.Header().Set("Brama-Estimate", "true")
		writeJSON(w, http.StatusOK, countTokensAnswer{estimateInputTokens(req.body)})
		return
	}
	if c.res.Mode == modeSubscription {
		if c, err = s.countTokensCall(r, req, c.res, ri.agentID); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	s.forwardCountTokens(w, r, req, c)
}

// countTokensAnswer is the body of every count_tokens answer.
type countTokensAnswer struct {
	InputTokens int `json:"input_tokens"`
}

// countTokensCall picks the one subscription a count on a subscription
// route uses: the first of the ordered eligible pool (billingTarget's when
// named), its grant refreshed when expired (a token call is no attempt).
func (s *server) countTokensCall(r *http.Request, req *callerRequest, res resolution, agent string) (call, error) {
	p := res.Provider
	subs, anyPool, err := s.eligible(agent, p.id)
	if err != nil {
		return call{}, err
	}
	if bt := req.head.BillingTarget; bt != nil {
		subs = slices.DeleteFunc(subs, func(it overlayItem) bool { return it.ID != bt.SubscriptionID })
	}
	switch {
	case !anyPool:
		return call{}, refuse("credential_unauthorized", "no %q subscription for agent %q", p.id, agent).withAttempts(0)
	case len(subs) == 0:
		return call{}, refuse("subscription_reauthorization_required", "no %q subscription of agent %q has an active credential; sign in again", p.id, agent).withAttempts(0)
	}
	baseURL, err := providerBaseURL(p, s.getenv)
	if err != nil {
		return call{}, refuse("dependency_unavailable", "provider %q has an unusable base URL: %v", p.id, err).withAttempts(0)
	}
	wk := &walk{agent: agent}
	sub := s.order(agent, p.id, subs)[0]
	cred, err := s.subscriptionCredential(r, sub, wk, "")
	switch {
	case errors.Is(err, errSkipSubscription): // the grant could not be refreshed
		return call{}, wk.exhausted(s.now())
	case err != nil:
		return call{}, asAPIError(err).withAttempts(0)
	}
	return call{res: res, baseURL: baseURL, cred: cred}, nil
}

// forwardCountTokens makes the one call to the provider's count_tokens
// and relays its count.
func (s *server) forwardCountTokens(w http.ResponseWriter, r *http.Request, req *callerRequest, c call) {
	edits, err := req.baseEdits(c.res.Provider, c.cred, c.res.Model)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	path := "/v1/messages/count_tokens"
	if req.query != "" {
		path += "?" + req.query
	}
	httpReq, err := newPassthroughRequest(r.Context(), c, req, path, req.body.edit(edits...), false)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	a := s.send(httpReq, c)
	if ae := a.failure(); ae != nil {
		s.fail(w, r, ae.withAttempts(1))
		return
	}
	defer a.resp.Body.Close()
	var ans struct {
		InputTokens *int `json:"input_tokens"`
	}
	if err := json.NewDecoder(a.resp.Body).Decode(&ans); err != nil || ans.InputTokens == nil {
		s.fail(w, r, malformedAnswer(protoAnthropic, err).withAttempts(1))
		return
	}
	w.Header().Set("Brama-Route", c.res.Route)
	w.Header().Set("Brama-Attempts", strconv.Itoa(1))
	writeJSON(w, http.StatusOK, countTokensAnswer{*ans.InputTokens})
}

// estimateInputTokens is SPEC §15's local estimate: the UTF-8 bytes of
// system, every text part, every tool_use input and tool_result content,
// and the tools definitions as sent, divided by 4, rounded up.
func estimateInputTokens(o rawObject) int {
	type block struct {
		Type    string          `json:"type"`
		Text    string          `json:"text"`
		Input   json.RawMessage `json:"input"`
		Content json.RawMessage `json:"content"`
	}
	var textOf func(raw json.RawMessage) int // a string, or blocks
	textOf = func(raw json.RawMessage) int {
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
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	json.Unmarshal(o.value("messages"), &msgs)
	for _, m := range msgs {
		n += textOf(m.Content)
	}
	if t := o.value("tools"); !rawIsNull(t) {
		n += len(t)
	}
	return (n + 3) / 4
}
