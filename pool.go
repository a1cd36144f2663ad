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
// blocks and the walk's one refusal; the selectors' candidates; the probe
// of one subscription; the daemon's parts the engine works with.

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
	rejectedStatus     int      // (selectors) the last 400, 404, 413 or 422 (SPEC §7.2.5 e)
	refreshTransport   *apiError
	blockEnd           time.Time // the earliest end of a block met
	refreshed, skipped []string  // grants refreshed in this request; those whose refresh failed (SPEC §7.2.3)
	route              string    // (selectors) the candidate being walked, which every note names (SPEC §7.3)
}

func (wk *walk) note(who, reason string) {
	if wk.route != "" && who != wk.route {
		who, reason = wk.route, who+" "+reason
	}
	wk.reasons = append(wk.reasons, who+": "+reason)
}

func (wk *walk) metBlock(until time.Time) {
	if wk.blockEnd.IsZero() || until.Before(wk.blockEnd) {
		wk.blockEnd = until
	}
}

// pin is the subscription that last served an agent's provider, until its
// earliest window reset (at most 24 h); the engine's pins, memory only.
type pin struct {
	id    string
	until time.Time
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
	items, err := e.inv.agentItems(e.agent)
	var provs []string
	free := map[string][]float64{} // each provider with an eligible subscription: its freest one's
	for _, it := range items {
		if _, seen := free[it.Provider]; seen || err != nil {
			continue
		}
		var subs []overlayItem
		if subs, err = e.eligible(e.agent, it.Provider); len(subs) > 0 {
			free[it.Provider], provs = e.freedomOf(subs[0].ID, e.now()), append(provs, it.Provider)
		}
	}
	slices.SortFunc(provs, func(a, b string) int { return cmp.Or(slices.Compare(free[a], free[b]), strings.Compare(a, b)) })
	var out []resolution
	add := func(route string) {
		pid, model, _ := strings.Cut(route, "/")
		p, known := lookupProvider(pid)
		vision := func() bool {
			info, ok, _ := e.catalog.lookup(pid, model)
			return ok && slices.Contains(info.Modalities.Input, "image")
		}
		seen := slices.ContainsFunc(out, func(r resolution) bool { return r.Route == route })
		if known && model != "" && p.cred != credNone && !seen && (res.Mode != modeAnyVision || vision()) {
			out = append(out, resolution{Mode: modeSubscription, Route: route, Provider: p, Model: model})
		}
	}
	if res.Mode == modeBest {
		add(aliases["best"])
	}
	for _, p := range provs {
		for _, alias := range slices.Sorted(maps.Keys(aliases)) {
			if strings.HasPrefix(aliases[alias], p+"/") {
				add(aliases[alias])
			}
		}
		n := 0
		for _, m := range e.catalog.models(p) {
			if n < 3 && slices.Contains(m.Modalities.Output, "text") {
				add(p + "/" + m.ID)
				n++
			}
		}
	}
	return out, err
}

// eligible is the agent's non-retired subscriptions of provider with an
// active credential, in order: blocked last, then freest first, the pinned
// one first among equals, ties in overlay order (SPEC §2.3, §7.2.2).
func (e *engine) eligible(agent, provider string) ([]overlayItem, error) {
	pool, err := e.inv.pool(agent, provider)
	now, free := e.now(), map[string][]float64{}
	pool = slices.DeleteFunc(pool, func(it overlayItem) bool { return e.ledger.credentialState(it.ID) != credActive })
	for _, it := range pool {
		free[it.ID] = e.freedomOf(it.ID, now)
	}
	if pn, ok := e.pins.Load(agent + "\x00" + provider); ok && now.Before(pn.(pin).until) { // first among equals
		if i := slices.IndexFunc(pool, func(it overlayItem) bool { return it.ID == pn.(pin).id }); i > 0 {
			pinned := pool[i]
			pool = slices.Insert(slices.Delete(pool, i, i+1), 0, pinned)
		}
	}
	slices.SortStableFunc(pool, func(a, b overlayItem) int { return slices.Compare(free[a.ID], free[b.ID]) })
	return pool, err
}

// freedomOf is how free a subscription is, compared in order (SPEC §7.2.2).
func (e *engine) freedomOf(id string, now time.Time) []float64 {
	blocked := 0.0
	if !e.ledger.blockedUntil(id).IsZero() {
		blocked = 1
	}
	return []float64{blocked, e.ledger.fullness(id, now)}
}

// errSkipSubscription: no call on this subscription; the walk noted why.
var errSkipSubscription = errors.New("subscription skipped")

// subscriptionCredential is what a call of kind on sub presents, an expired
// grant or a just refusedToken refreshed first (SPEC §7.2.3, §11.1). A
// blocked sub is skipped when the kind rotates, one marked since the pool
// was read unless probed; one no header could carry (a vault edited by
// hand) is skipped and marked for a sign-in (SPEC §17).
func (e *engine) subscriptionCredential(ctx context.Context, kind routeKind, sub overlayItem, refusedToken string) (upstreamCredential, error) {
	wk := &e.wk
	if until := e.ledger.blockedUntil(sub.ID); budgets[kind].rotate && !until.IsZero() {
		wk.metBlock(until)
		wk.note(sub.ID, "blocked until "+until.UTC().Format(time.RFC3339))
		return upstreamCredential{}, errSkipSubscription
	} else if kind != kindProbe && e.ledger.credentialState(sub.ID) != credActive { // the probe may revive it
		wk.note(sub.ID, "credential refused meanwhile; sign in again")
		return upstreamCredential{}, errSkipSubscription
	}
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
				return e.subscriptionCredential(ctx, kind, sub, "")
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

// block blocks sub until the stated wait, else the last reset of a window
// the ledger holds as used up, else 15 min; at most 7 days (SPEC §7.2.4).
func (e *engine) block(sub overlayItem, stated time.Duration, why string) time.Time {
	now, wait := e.now(), time.Duration(0)
	led, _ := e.ledger.entry(sub.ID)
	for _, w := range led.Windows {
		if at := time.UnixMilli(w.ResetsAtMs); w.UsedFraction >= 1 && w.ResetsAtMs > 0 && at.After(now) {
			wait = max(wait, at.Sub(now))
		}
	}
	until := now.Add(min(cmp.Or(max(stated, 0), wait, defaultBlock), maxBlock))
	e.ledger.block(sub.ID, sub.Provider, until, why)
	return until
}

// blockFor blocks sub after a rate or quota refusal, as the walk records.
func (e *engine) blockFor(sub overlayItem, ref *providerRefusal) {
	wk, rate := &e.wk, ref.class == refusalRate
	until := e.block(sub, ref.retryAfter, ref.sentence)
	wk.metBlock(until)
	wk.rate, wk.quota = wk.rate || rate, wk.quota || !rate
	wk.note(sub.ID, map[bool]string{true: "rate limited: ", false: "quota exhausted: "}[rate]+ref.sentence)
}

// exhausted is the one refusal of a walk without success (SPEC §7.2.5).
func (e *engine) exhausted() *apiError {
	wk, n := &e.wk, e.t.attempts
	list := strings.Join(wk.reasons, "; ")
	var ae *apiError
	switch {
	case n == 0 && wk.refreshTransport != nil:
		ae = refuse("dependency_unavailable", "%s", wk.refreshTransport.Message).because(wk.refreshTransport.Err)
	case n == 0 && !wk.blockEnd.IsZero(): // no call, so every block met was a skip
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
	if ae.Status() == http.StatusTooManyRequests && !wk.blockEnd.IsZero() { // SPEC §7.2.5
		ae.RetryAfter = max(wk.blockEnd.Sub(e.now()), time.Second)
	}
	return ae.withAttempts(n)
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
	builtin, _ := lookupProvider(it.Provider)
	model = cmp.Or(strings.TrimPrefix(strings.TrimSpace(model), it.Provider+"/"), builtin.probe)
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
	j := &job{kind: kindProbe, pool: []overlayItem{it},
		build: func(ctx context.Context, _ *candidate, c call) (*http.Request, error) {
			hr, err := buildUpstreamRequest(ctx, p, c.baseURL, c.cred, req, c.res.Model)
			if err != nil { // the ping could not be encoded: a failed probe, as before any call
				detail = asAPIError(err).Message
			}
			return hr, err
		},
		commit: func(_ context.Context, _ *candidate, c call, resp *http.Response) (usage, *apiError, bool) {
			ans, err := readProviderAnswer(p, req, resp)
			if err != nil { // an in-band limit blocks, as a request's
				detail = "the answer could not be read: " + asAPIError(err).Message
				return usage{}, asAPIError(err), false
			}
			ok, detail = true, fmt.Sprintf("%s answered (%d output tokens)", c.res.Route, ans.Usage.OutputTokens)
			return ans.Usage, nil, false
		},
	}
	ae := e.attemptRoute(ctx, j, call{res: res}, nil, nil)
	switch {
	case detail != "":
	case e.t.attempts > 0: // the provider refused, or no answer came
		detail = ae.Message
	case len(e.wk.reasons) > 0: // the grant could not be refreshed
		detail = "no call was made: " + strings.Join(e.wk.reasons, "; ")
	default: // refused before any call, as a probe's own refusal
		ae.Attempts = nil
		return probeOutcome{}, ae
	}
	e.ledger.recordProbe(it.ID, p.id, ok, detail)
	if ok && e.ledger.credentialState(it.ID) != credActive {
		e.ledger.setCredential(it.ID, p.id, credActive, "") // SPEC §10.3: a successful probe reactivates
	}
	e.inv.invalidate(false) // the listing shows the probe at once (SPEC §10.2)
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
	if !p.codex {
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

// directKey is provider's direct API key (SPEC §7.1): -local-credentials-stdin's
// when given (the only source then, §16), else the vault's, whose read may fail.
func (c *core) directKey(provider string) (string, error) {
	if c.localCreds != nil {
		return c.localCreds[provider], nil
	}
	doc, err := c.vault.load()
	if errors.As(err, new(*noStateError)) { // no state directory: no key
		return "", nil
	} else if err != nil {
		return "", err
	}
	return doc.Direct[provider].APIKey, nil
}

// hasDirect reports whether a direct credential exists for provider.
func (c *core) hasDirect(provider string) bool {
	key, _ := c.directKey(provider)
	return key != ""
}

// mayHaveDirect is hasDirect, and true when the vault is unreadable: a request
// then meets the vault's refusal, not "no direct credential" (SPEC §2.2).
func (c *core) mayHaveDirect(provider string) bool {
	key, err := c.directKey(provider)
	return key != "" || err != nil
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
