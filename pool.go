package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Who pays (SPEC §7.2, §7.3, §11.3): a subscription pool's order, refresh,
// blocks and the walk's one refusal; the selectors' candidates and walk;
// the probe of one subscription. The loop is dispatch.go's attemptCandidate.

// Block lengths (SPEC §7.2.4) and the probe's output limit (§11.3).
const (
	defaultBlock   = 15 * time.Minute
	maxBlock       = 7 * 24 * time.Hour
	maxPin         = 24 * time.Hour
	probeMaxTokens = 16
)

// walk is a request's account of its calls and skips, from which an
// exhausted walk's one refusal is chosen (SPEC §7.2.5).
type walk struct {
	reasons            []string // "<subscription id or route>: <reason>"
	rate, quota, auth  bool     // a call was refused 429, for quota, 401/403
	blocked            bool     // a subscription was skipped as blocked
	rejectedStatus     int      // (selectors) the last 400, 404, 413 or 422 (SPEC §7.2.5 e)
	refreshTransport   *apiError
	earliestBlockEnd   time.Time
	refreshed, skipped []string         // grants refreshed in this request; those whose refresh failed (SPEC §7.2.3)
	last               *providerRefusal // the last call's refusal (the probe records a 401 or 403)
	route              string           // (selectors) the candidate being walked, which every note names (SPEC §7.3)
}

func (wk *walk) note(who, reason string) {
	if wk.route != "" && who != wk.route {
		who, reason = wk.route, who+" "+reason
	}
	wk.reasons = append(wk.reasons, who+": "+reason)
}

func (wk *walk) noteBlock(until time.Time) {
	if wk.earliestBlockEnd.IsZero() || until.Before(wk.earliestBlockEnd) {
		wk.earliestBlockEnd = until
	}
}

// pin is the subscription that last served an agent's provider, until its
// earliest window reset (at most 24 h); the engine's pins, memory only.
type pin struct {
	id    string
	until time.Time
}

// exhausted is the one refusal of a walk without success (SPEC §7.2.5).
func (e *engine) exhausted() *apiError {
	wk, n := &e.wk, e.t.attempts
	list := strings.Join(wk.reasons, "; ")
	var ae *apiError
	switch {
	case n == 0 && wk.refreshTransport != nil:
		ae = refuse("dependency_unavailable", "%s", wk.refreshTransport.Message).because(wk.refreshTransport.Err)
	case n == 0 && wk.blocked:
		ae = refuse("subscription_unavailable", "every eligible subscription is blocked: %s", list)
	case n == 0:
		ae = refuse("subscription_reauthorization_required", "no subscription could be refreshed; sign in again: %s", list)
	case wk.rate:
		ae = refuse("provider_rate_limited", "the provider refused for rate: %s", list)
	case wk.quota:
		ae = refuse("provider_quota_exhausted", "the provider says the quota is spent: %s", list)
	case wk.auth:
		ae = refuse("subscription_reauthorization_required", "the provider refused the credentials; sign in again: %s", list)
	case wk.rejectedStatus != 0: // a selector's calls all refused the request: the last status
		ae = refuse("provider_rejected", "every candidate refused the request: %s", list).withStatus(wk.rejectedStatus)
	default:
		ae = refuse("provider_failure", "every candidate was refused: %s", list)
	}
	if ae.Status() == http.StatusTooManyRequests && !wk.earliestBlockEnd.IsZero() { // SPEC §7.2.5
		ae.RetryAfter = max(wk.earliestBlockEnd.Sub(e.now()), time.Second)
	}
	return ae.withAttempts(n)
}

// eligible is the agent's non-retired subscriptions of provider with an
// active credential, in order: blocked last, then freest first, the pinned
// one first among equals, ties in overlay order (SPEC §2.3, §7.2.2); and
// whether the agent has any non-retired one.
func (e *engine) eligible(agent, provider string) (active []overlayItem, any bool, err error) {
	pool, err := e.inv.pool(agent, provider)
	now, pinned, free := e.now(), "", map[string][]float64{}
	if pn, ok := e.pins.Load(agent + "\x00" + provider); ok && now.Before(pn.(pin).until) {
		pinned = pn.(pin).id
	}
	for _, it := range pool {
		if e.ledger.credentialState(it.ID) == credActive {
			active = append(active, it)
			free[it.ID] = append(e.freedomOf(it.ID, now), b2f(it.ID != pinned))
		}
	}
	slices.SortStableFunc(active, func(a, b overlayItem) int { return slices.Compare(free[a.ID], free[b.ID]) })
	return active, len(pool) > 0, err
}

// freedomOf is how free a subscription is, compared in order (SPEC §7.2.2).
func (e *engine) freedomOf(id string, now time.Time) []float64 {
	return []float64{b2f(!e.ledger.blockedUntil(id).IsZero()), e.ledger.fullness(id, now)}
}

// b2f is 1 for true, so that false sorts first.
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// errSkipSubscription: no call on this subscription; the walk noted why.
var errSkipSubscription = errors.New("subscription skipped")

// subscriptionCredential is what a call on sub presents, an expired grant
// or a just refusedToken refreshed first (SPEC §7.2.3, §11.1). One no header
// could carry (a vault edited by hand) is skipped like a blocked one and
// marked for a sign-in (SPEC §17).
func (e *engine) subscriptionCredential(ctx context.Context, sub overlayItem, refusedToken string) (upstreamCredential, error) {
	wk := &e.wk
	vc, err := e.inv.credential(sub.ID) // its refusal is SPEC §2.2's
	if err != nil {
		return upstreamCredential{}, err
	}
	cred := upstreamCredential{APIKey: vc.APIKey}
	if g := vc.OAuth; g != nil {
		if slices.Contains(wk.skipped, sub.ID) { // a later candidate of the same provider walks this pool again
			return upstreamCredential{}, errSkipSubscription
		}
		if refusedToken != "" || (expiredForRequest(*g, e.now()) && !slices.Contains(wk.refreshed, sub.ID)) {
			wk.refreshed = append(wk.refreshed, sub.ID)
			ng, err := e.oauth.refresh(ctx, sub.ID, sub.Provider, refusedToken)
			var re *endpointError
			switch {
			case errors.Is(err, errRefreshSuperseded): // a sign-in replaced the grant meanwhile: the call uses its (SPEC §11.1)
				return e.subscriptionCredential(ctx, sub, "")
			case err != nil && ctx.Err() != nil: // the caller hung up while it waited: no skip, no call (SPEC §7.4)
				return upstreamCredential{}, refuse("client_cancelled", "the caller went away during a grant refresh").because(err)
			case errors.As(err, &re) && !re.Definitive:
				if wk.refreshTransport == nil {
					wk.refreshTransport = refuse("dependency_unavailable", "%s", redact(re.Error())).because(err)
				}
				e.maint.request("credential_refresh_transport_failure", e.agent)
			}
			if err != nil {
				wk.note(sub.ID, "grant refresh failed: "+redact(err.Error()))
				wk.skipped = append(wk.skipped, sub.ID)
				return upstreamCredential{}, errSkipSubscription
			}
			g = &ng
		}
		cred = upstreamCredential{AccessToken: g.AccessToken, AccountID: g.AccountID}
	}
	if controlAt(cred.APIKey+cred.AccessToken+cred.AccountID) >= 0 {
		const why = "the vault's credential holds a control character and cannot be sent; sign in again"
		e.ledger.setCredential(sub.ID, sub.Provider, credNeedsReauth, why)
		wk.note(sub.ID, why)
		return upstreamCredential{}, errSkipSubscription
	}
	return cred, nil
}

// credentialReplaced: the vault no longer holds what a call on sub presented
// (a sign-in or refresh landed meanwhile), so its 401 or 403 marks nothing
// and the current credential gets the next call (SPEC §10.3, §11.1).
func (e *engine) credentialReplaced(sub overlayItem, used upstreamCredential) bool {
	vc, err := e.inv.credential(sub.ID)
	if err != nil || vc.OAuth == nil {
		return err == nil && vc.APIKey != used.APIKey
	}
	return vc.OAuth.AccessToken != used.AccessToken
}

// answerSubscription delivers a committed subscription call and keeps the
// ledger: plan windows, spend, a success's pin, a block after an in-band 429.
func (e *engine) answerSubscription(ctx context.Context, w http.ResponseWriter, cand *candidate, c call, sub overlayItem, resp *http.Response, attempts int) (usage, *apiError, bool) {
	p, now := c.res.Provider.id, e.now()
	e.ledger.recordWindows(sub.ID, p, parsePlanWindows(p, resp.Header, now))
	led, _ := e.ledger.entry(sub.ID) // its windows: this answer's and a usage report's (SPEC §7.2.2)
	until := now.Add(maxPin)
	for _, win := range led.Windows {
		if at := time.UnixMilli(win.ResetsAtMs); win.ResetsAtMs > 0 && at.After(now) && at.Before(until) {
			until = at
		}
	}
	u, ae, streamed := e.deliver(ctx, w, cand.model, cand.req, c, resp, attempts)
	e.ledger.recordUse(sub.ID, p, ae == nil, u.InputTokens, u.OutputTokens)
	if ae == nil { // only a success pins (SPEC §7.2.4)
		e.pins.Store(e.agent+"\x00"+p, pin{sub.ID, until})
	} else {
		e.blockInBand(sub, p, resp, ae, now)
	}
	return u, ae, streamed
}

// blockInBand blocks sub after a rate or quota error ending its committed
// answer, until the reset the answer's headers state (SPEC §7.2.4).
func (e *engine) blockInBand(sub overlayItem, provider string, resp *http.Response, err error, now time.Time) {
	var se *upstreamStreamError
	if errors.As(err, &se) && (se.Class == refusalRate || se.Class == refusalQuota) {
		wait := cmp.Or(retryAfter(resp.Header, now), e.windowWait(sub.ID, now), defaultBlock)
		e.ledger.block(sub.ID, provider, now.Add(wait), "the provider ended a committed answer with "+se.Code)
	}
}

// windowWait is how long until the last reset of sub's windows the ledger
// holds as used up: SPEC §7.2.4's "or the window reset"; 0 when none is.
func (e *engine) windowWait(id string, now time.Time) (wait time.Duration) {
	led, _ := e.ledger.entry(id)
	for _, w := range led.Windows {
		if at := time.UnixMilli(w.ResetsAtMs); w.UsedFraction >= 1 && w.ResetsAtMs > 0 && at.After(now) {
			wait = max(wait, at.Sub(now))
		}
	}
	return wait
}

// blockFor blocks sub after a rate or quota refusal until the stated reset
// (none: a used-up window's, else 15 min; at most 7 days).
func (e *engine) blockFor(sub overlayItem, provider string, ref *providerRefusal) {
	now, wk, rate := e.now(), &e.wk, ref.class == refusalRate
	until := now.Add(min(cmp.Or(max(ref.retryAfter, 0), e.windowWait(sub.ID, now), defaultBlock), maxBlock))
	e.ledger.block(sub.ID, provider, until, ref.sentence)
	wk.noteBlock(until)
	wk.rate, wk.quota = wk.rate || rate, wk.quota || !rate
	wk.note(sub.ID, map[bool]string{true: "rate limited: ", false: "quota exhausted: "}[rate]+ref.sentence)
}

// candidates lists the routes a selector or best walks, in order (SPEC
// §7.3): best's, then each model of each provider where the agent has an
// eligible subscription, freest first (ties by id): every alias's P/…
// destination (alias-name order), then the catalogue's three newest text
// models of P's vendor; any-vision-capable keeps those taking images.
func (e *engine) candidates(res resolution) ([]resolution, error) {
	var aliases map[string]string // an invalid registry offers none
	if doc, err := e.reg.current(); err == nil && doc != nil {
		aliases = doc.Routes
	}
	items, err := e.inv.pool(e.agent, "")
	if err != nil {
		return nil, err
	}
	var provs []string
	free, now := map[string][]float64{}, e.now() // a provider's freest eligible subscription's
	for _, it := range items {
		if _, seen := free[it.Provider]; seen {
			continue
		}
		subs, _, err := e.eligible(e.agent, it.Provider)
		if err != nil {
			return nil, err
		}
		if len(subs) > 0 {
			free[it.Provider] = e.freedomOf(subs[0].ID, now)
			provs = append(provs, it.Provider)
		}
	}
	slices.SortFunc(provs, func(a, b string) int { return cmp.Or(slices.Compare(free[a], free[b]), strings.Compare(a, b)) })
	var routes []string
	if res.Mode == modeBest {
		routes = append(routes, aliases["best"])
	}
	for _, p := range provs {
		for _, alias := range slices.Sorted(maps.Keys(aliases)) {
			if strings.HasPrefix(aliases[alias], p+"/") {
				routes = append(routes, aliases[alias])
			}
		}
		n := 0
		for _, m := range e.catalog.models(p) {
			if n < 3 && slices.Contains(m.Modalities.Output, "text") {
				routes, n = append(routes, p+"/"+m.ID), n+1
			}
		}
	}
	var out []resolution
	for _, route := range routes {
		pid, model, _ := strings.Cut(route, "/")
		p, known := lookupProvider(pid)
		if !known || model == "" || p.cred == credNone || slices.ContainsFunc(out, func(r resolution) bool { return r.Route == route }) {
			continue
		}
		if res.Mode == modeAnyVision {
			if info, ok, _ := e.catalog.lookup(pid, model); !ok || !slices.Contains(info.Modalities.Input, "image") {
				continue
			}
		}
		out = append(out, resolution{Mode: modeSubscription, Route: route, Provider: p, Model: model})
	}
	return out, nil
}

// walkSelector serves any, any-vision-capable and best (SPEC §7.3), each
// candidate with its own output limit, skipping a provider whose pool refused.
func (e *engine) walkSelector(ctx context.Context, j *job, req *callerRequest, cands []resolution) *apiError {
	wk, poolRefused, hadEligible := &e.wk, map[string]bool{}, false
	var unfit error // set when a candidate was skipped: no max_tokens known, or a request its format cannot express
	for _, cand := range cands {
		p := cand.Provider.id
		wk.route = cand.Route
		if poolRefused[p] {
			wk.note(cand.Route, "skipped: every "+p+" subscription already refused")
			continue
		}
		subs, _, err := e.eligible(e.agent, p)
		if err != nil {
			return asAPIError(err).withAttempts(e.t.attempts)
		}
		head := req.head
		if len(subs) == 0 {
			wk.note(cand.Route, fmt.Sprintf("no usable %q subscription", p))
			continue
		} else if err := e.applyMaxTokens(&head, cand); err != nil {
			unfit = err
			wk.note(cand.Route, "skipped: "+asAPIError(err).Message)
			continue
		}
		c := &candidate{res: cand, pool: subs, req: req.withLimit(head.MaxTokens), model: cand.Route}
		switch out, ae := e.attemptCandidate(ctx, j, c); out {
		case routeAnswered:
			return ae
		case routeRefused:
			poolRefused[p] = true
		case routeUnfit:
			unfit = ae
			wk.note(cand.Route, "skipped: "+ae.Message)
			continue
		}
		hadEligible = true
	}
	if hadEligible {
		return e.exhausted()
	} else if unfit != nil { // every usable candidate needs a max_tokens nobody knows (SPEC §6.4) or another format
		return asAPIError(unfit)
	}
	// No candidate at all: sign in again when every subscription of the agent needs it.
	items, err := e.inv.pool(e.agent, "")
	if err == nil && len(items) > 0 && !slices.ContainsFunc(items, func(it overlayItem) bool { return e.ledger.credentialState(it.ID) == credActive }) {
		return refuse("subscription_reauthorization_required", "agent %q has subscriptions but none has an active credential; sign in again", e.agent).withAttempts(0)
	}
	return refuse("credential_unauthorized", "no subscription model can serve agent %q", e.agent).withAttempts(0)
}

// probeOutcome answers POST …/probe: the probe recorded and the row after it.
type probeOutcome struct {
	OK           bool            `json:"ok"`
	Probe        ledgerCheck     `json:"probe"`
	Subscription subscriptionRow `json:"subscription"`
}

// probe runs one completion probe on the live subscription it with model
// ("": the built-in one) through the engine, as a request would meet it,
// never timed, never retried (SPEC §11.3); 409 before any call when blocked
// or model-less.
func (e *engine) probe(ctx context.Context, it overlayItem, model string) (probeOutcome, error) {
	if until := e.ledger.blockedUntil(it.ID); !until.IsZero() {
		return probeOutcome{}, refuse("state_conflict", "subscription %s is blocked until %s; a probe is not sent inside a recorded block", it.ID, until.UTC().Format(time.RFC3339))
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
	p, req := res.Provider, pingRequest(res.Route, res.Provider)
	ok, detail := false, ""
	j := &job{kind: kindProbe,
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
				e.blockInBand(it, p.id, resp, err, e.now()) // an in-band limit, as a request's
				detail = "the answer could not be read: " + asAPIError(err).Message
			} else {
				ok, detail = true, fmt.Sprintf("%s answered (%d output tokens)", c.res.Route, ans.Usage.OutputTokens)
			}
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
	e.ledger.recordProbe(it.ID, p.id, ok, detail)
	if ok && e.ledger.credentialState(it.ID) != credActive {
		e.ledger.setCredential(it.ID, p.id, credActive, "") // SPEC §10.3: a successful probe reactivates
	}
	e.inv.invalidate() // the listing shows the probe at once (SPEC §10.2)
	msg, level := "usage_probe_ok", slog.LevelInfo
	if !ok {
		msg, level = "usage_probe_failed", slog.LevelWarn
	}
	e.log.Log(ctx, level, msg, "request_id", e.t.requestID, "subscription_id", it.ID, "agent_id", e.agent,
		"provider", p.id, "route", res.Route, "detail", ledgerSentence(detail))
	o := probeOutcome{OK: true, Subscription: e.inv.row(it, false, e.now())}
	if o.Subscription.Probe != nil {
		o.Probe = *o.Subscription.Probe
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

// donation is the strict body (and the CLI's request) of POST …/subscriptions/{agent_id}.
type donation struct {
	Provider string      `json:"provider"`
	Label    string      `json:"label"`
	APIKey   string      `json:"api_key"`
	OAuth    *oauthGrant `json:"oauth"`
}

// donatedSubscription is the 201 answer: metadata only, never the secret.
type donatedSubscription struct {
	ID       string `json:"id"`
	Provider string `json:"provider"`
	AgentID  string `json:"agent_id"`
	Label    string `json:"label"`
	Status   string `json:"status"`
}

// credentialBody is the strict body of PUT …/credential: exactly one of
// an OAuth grant or an API key (checkCredential enforces "exactly").
type credentialBody struct {
	OAuth  *oauthGrant `json:"oauth"`
	APIKey string      `json:"api_key"`
}

// stores are the state files an engine reads (main.go's deps adds the clients file).
type stores struct {
	st      state
	vault   *vault
	journal *journal
	reg     *registry
}

// core is the daemon's parts that the server and every request's engine
// share, built once by serve.
type core struct {
	stores // st, vault, journal, reg
	sys    // log, now
	getenv func(string) string
	// localCreds holds -local-credentials-stdin keys; when non-nil it is the
	// only source of direct credentials (SPEC §16).
	localCreds map[string]string
	client     *http.Client // provider calls: no timeout, no redirects, no proxy
	catalog    *catalog
	perf       *perfRegistry
	keepAlive  time.Duration // 0: keepAliveEvery; tests shorten it
	attempts   atomic.Int64  // provider calls made since start, for /metrics
	ledger     *ledger
	inv        *inventory
	oauth      *oauthClient
	pins       sync.Map // agent "\x00" provider → the subscription that last served it (pin)
	maint      *maintainer
}

// hasDirect reports whether a direct credential exists for provider.
func (c *core) hasDirect(provider string) bool {
	if c.localCreds != nil {
		return c.localCreds[provider] != ""
	}
	return c.vault.directKey(provider) != ""
}

// mayHaveDirect is hasDirect, and true when the vault is unreadable: a request
// then meets the vault's refusal, not "no direct credential" (SPEC §2.2).
func (c *core) mayHaveDirect(provider string) bool {
	_, err := c.vault.load()
	return c.hasDirect(provider) || c.localCreds == nil && err != nil && !errors.As(err, new(*noStateError))
}

// anyDirectPayer reports whether something could serve without an agent
// (SPEC §13, §14): a direct credential or a declared deployment.
func (c *core) anyDirectPayer() bool {
	if doc, err := c.reg.current(); len(c.localCreds) > 0 || (err == nil && len(doc.Deployments) > 0) {
		return true
	}
	if vd, err := c.vault.load(); c.localCreds == nil && err == nil {
		for _, k := range vd.Direct {
			if k.APIKey != "" {
				return true
			}
		}
	}
	return false
}
