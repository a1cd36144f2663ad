package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// The completion probe (SPEC §11.3): one minimal answer from one
// subscription through the engine, as a request would meet it; never timed.

// probeModels is SPEC §11.3's built-in probe model per provider.
var probeModels = map[string]string{
	"claude-code": "claude-haiku-4-5",
	"anthropic":   "claude-haiku-4-5",
	"codex":       "gpt-5.3-codex-spark",
	"kimi":        "kimi-for-coding",
	"deepseek":    "deepseek-chat",
}

// probeMaxTokens is the probe's output limit; codex takes none (SPEC §6.2).
const probeMaxTokens = 16

// probeOutcome answers POST …/probe: the probe recorded and the row after it.
type probeOutcome struct {
	OK           bool            `json:"ok"`
	Probe        ledgerCheck     `json:"probe"`
	Subscription subscriptionRow `json:"subscription"`
}

// probe runs one completion probe on the live subscription it with model
// ("": the built-in one); 409 before any call when blocked or model-less.
func (e *engine) probe(ctx context.Context, it overlayItem, model string) (probeOutcome, error) {
	id := it.ID
	if until := e.ledger.blockedUntil(id); !until.IsZero() {
		return probeOutcome{}, refuse("state_conflict", "subscription %s is blocked until %s; a probe is not sent inside a recorded block", id, until.UTC().Format(time.RFC3339))
	}
	model = cmp.Or(strings.TrimPrefix(strings.TrimSpace(model), it.Provider+"/"), probeModels[it.Provider])
	if model == "" {
		return probeOutcome{}, refuse("state_conflict", "name a model for this probe: provider %q has no built-in probe model", it.Provider)
	}
	res, err := resolveModel(it.Provider+"/"+model, nil, nil, nil)
	if err != nil {
		return probeOutcome{}, err
	}
	res.Mode = modeSubscription // paid by the probed subscription, whatever its provider
	p := res.Provider
	req := pingRequest(res.Route, p)
	ok, detail := false, ""
	j := &job{
		kind: kindProbe,
		build: func(ctx context.Context, _ *candidate, c call) (*http.Request, error) {
			hr, err := buildUpstreamRequest(ctx, p, c.baseURL, c.cred, req, c.res.Model)
			if err != nil { // the ping could not be encoded: a failed probe, as before any call
				detail = asAPIError(err).Message
			}
			return hr, err
		},
		commit: func(_ context.Context, _ *candidate, c call, _ *overlayItem, resp *http.Response, _ int) (usage, *apiError, bool) {
			e.ledger.recordWindows(it.ID, p.id, parsePlanWindows(p.id, resp.Header, e.now()))
			ans, err := readProviderAnswer(p, req, resp)
			if err != nil {
				e.blockInBand(it, p.id, resp, err, e.now()) // an in-band limit, as a request's (pool.go)
				detail = "the answer could not be read: " + asAPIError(err).Message
				return usage{}, nil, false
			}
			ok, detail = true, fmt.Sprintf("%s answered (%d output tokens)", c.res.Route, ans.Usage.OutputTokens)
			return ans.Usage, nil, false
		},
	}
	out, ae := e.attemptCandidate(ctx, j, &candidate{res: res, pool: []overlayItem{it}})
	switch r := e.wk.last; { // recorded, not retried
	case r == nil:
	case r.class == refusalAuth: // a 401 or 403
		e.ledger.setCredential(it.ID, p.id, credNeedsReauth, cmp.Or(r.sentence, r.err.Message))
	case r.class == refusalRate || r.class == refusalQuota: // a block, as a request's would be
		e.blockFor(it, p.id, r)
	}
	switch {
	case detail != "":
	case out == routeRefused: // the grant could not be refreshed
		detail = "no call was made: " + strings.Join(e.wk.reasons, "; ")
	case e.t.attempts > 0: // the provider refused, or no answer came
		detail = ae.Message
	default: // refused before any call, as a probe's own refusal
		ae.Attempts = nil
		return probeOutcome{}, ae
	}
	e.ledger.recordProbe(id, p.id, ok, detail)
	if ok && e.ledger.credentialState(id) != credActive {
		e.ledger.setCredential(id, p.id, credActive, "") // SPEC §10.3: a successful probe reactivates
	}
	e.inv.invalidate(false) // the listing shows the probe at once (SPEC §10.2)
	msg, level := "usage_probe_ok", slog.LevelInfo
	if !ok {
		msg, level = "usage_probe_failed", slog.LevelWarn
	}
	e.log.Log(ctx, level, msg, "request_id", e.t.requestID, "subscription_id", id, "agent_id", e.agent,
		"provider", p.id, "route", res.Route, "detail", ledgerSentence(detail))
	row := e.inv.row(it, false, e.now())
	o := probeOutcome{OK: true, Subscription: row}
	if row.Probe != nil {
		o.Probe = *row.Probe
	}
	return o, nil
}

// pingRequest is the probe's and onboarding's completion (SPEC §6.2, §11.3).
func pingRequest(route string, p providerInfo) chatRequest {
	req := chatRequest{Model: route, Messages: []message{{Role: "user", Parts: []part{{Type: partText, Text: "ping"}}}}}
	if p.id != "codex" {
		req.MaxTokens = probeMaxTokens
	}
	return req
}
