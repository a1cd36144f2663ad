package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// The completion probe (SPEC §11.3): an operator asks one subscription for
// one minimal answer, through the dispatcher's own pieces (resolveModel,
// subscriptionCredential, callProvider), so it meets what a request would:
// one call on exactly that subscription, no retry, no rotation, no refresh
// after a 401. Nothing runs it but an operator: no pass, no timer.

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

// handleSubscriptionProbe serves POST …/{subscription_id}/probe, body
// optional {"model"}. A provider's refusal is a 200 too: probe.ok false.
func (s *server) handleSubscriptionProbe(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model string `json:"model"`
	}
	out, err := probeOutcome{}, decodeOptionalBody(r, &body)
	if err == nil {
		out, err = s.probe(r, r.PathValue("agent_id"), r.PathValue("subscription_id"), body.Model)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// probe runs one completion probe on agent's subscription id with model (""
// for the built-in one), refusing before any call 404 for an id agent does
// not own and 409 for a retired or blocked one or one without a probe model.
// r's context cancels the call and carries a refresh before it, as on the
// request path.
func (s *server) probe(r *http.Request, agent, id, model string) (probeOutcome, error) {
	it, err := s.liveSubscription(agent, id, "a retired subscription is never probed")
	if err != nil {
		return probeOutcome{}, err
	}
	if until := s.ledger.blockedUntil(id); !until.IsZero() {
		return probeOutcome{}, refuse("state_conflict", "subscription %s is blocked until %s; a probe is not sent inside a recorded block", id, until.UTC().Format(time.RFC3339))
	}
	model = cmp.Or(strings.TrimPrefix(strings.TrimSpace(model), it.Provider+"/"), probeModels[it.Provider])
	if model == "" {
		return probeOutcome{}, refuse("state_conflict", "name a model for this probe: provider %q has no built-in probe model", it.Provider)
	}
	res, err := resolveModel(it.Provider+"/"+model, nil, nil, nil, true)
	if err != nil {
		return probeOutcome{}, err
	}
	p := res.Provider
	baseURL, err := providerBaseURL(p, s.getenv)
	if err != nil {
		return probeOutcome{}, refuse("dependency_unavailable", "provider %q has an unusable base URL: %v", p.id, err)
	}
	wk := &walk{agent: agent}
	cred, err := s.subscriptionCredential(r, it, wk, "")
	ok, detail := false, "no call was made: "+strings.Join(wk.reasons, "; ")
	switch {
	case errors.Is(err, errSkipSubscription):
	case err != nil:
		return probeOutcome{}, err
	default:
		ok, detail = s.probeCall(r.Context(), pingRequest(res.Route, p), call{res: res, baseURL: baseURL, cred: cred}, it)
	}
	s.ledger.recordProbe(id, p.id, ok, detail)
	if ok && s.ledger.credentialState(id) != credActive {
		s.ledger.setCredential(id, p.id, credActive, "") // SPEC §10.3: a successful probe reactivates
	}
	s.inv.invalidate(false) // the listing shows the probe at once (SPEC §10.2)
	msg, level := "usage_probe_ok", slog.LevelInfo
	if !ok {
		msg, level = "usage_probe_failed", slog.LevelWarn
	}
	s.log.LogAttrs(r.Context(), level, msg, slog.String("request_id", infoFrom(r.Context()).id),
		slog.String("subscription_id", id), slog.String("agent_id", agent), slog.String("provider", p.id),
		slog.String("route", res.Route), slog.String("detail", ledgerSentence(detail)))
	row := s.inv.row(it, false, s.now())
	out := probeOutcome{OK: true, Subscription: row}
	if row.Probe != nil {
		out.Probe = *row.Probe
	}
	return out, nil
}

// pingRequest is the probe's (and onboarding's) minimal completion: "ping",
// 16 output tokens, none for codex (SPEC §6.2, §11.3).
func pingRequest(route string, p providerInfo) chatRequest {
	req := chatRequest{
		Model:     route,
		Messages:  []message{{Role: "user", Parts: []part{{Type: partText, Text: "ping"}}}},
		MaxTokens: probeMaxTokens,
	}
	if p.id == "codex" {
		req.MaxTokens = 0
	}
	return req
}

// probeCall makes the one call and says how it went in a sentence fit for
// the ledger (never the completion or a credential); a 401 or 403 marks the
// credential needs_reauthorization, unretried.
func (s *server) probeCall(ctx context.Context, req chatRequest, c call, it overlayItem) (bool, string) {
	p := c.res.Provider
	a := s.callProvider(ctx, req, c)
	switch {
	case a.resp != nil:
		s.ledger.recordWindows(it.ID, p.id, parsePlanWindows(p.id, a.resp.Header, s.now()))
		ans, err := readProviderAnswer(p, req, a.resp)
		if err != nil {
			return false, "the answer could not be read: " + asAPIError(err).Message
		}
		return true, fmt.Sprintf("%s answered (%d output tokens)", c.res.Route, ans.Usage.OutputTokens)
	case a.refusal != nil:
		if a.refusal.class == refusalAuth {
			s.ledger.setCredential(it.ID, p.id, credNeedsReauth, cmp.Or(a.refusal.sentence, a.refusal.err.Message))
		}
		return false, a.refusal.err.Message
	default:
		return false, a.err.Message
	}
}

// readProviderAnswer reads and closes a committed answer, as deliver does for
// a buffered caller, rendering nothing (for the probe and onboarding).
func readProviderAnswer(p providerInfo, req chatRequest, resp *http.Response) (chatAnswer, error) {
	defer resp.Body.Close()
	if upstreamStreams(p, req) {
		return assembleStream(p.protocol, resp.Body)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return chatAnswer{}, refuse("provider_incomplete", "provider %q answer was cut after %d bytes", p.id, len(body)).because(err)
	}
	return decodeUpstreamAnswer(p.protocol, body)
}
