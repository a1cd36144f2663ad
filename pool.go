package main

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The credential pool (SPEC §7.2, §7.3): order, pin, refresh, blocks, the
// ledger of each call, and a walk's one refusal; the loop is dispatch.go's.

// Block lengths (SPEC §7.2.4).
const (
	defaultBlock = 15 * time.Minute
	maxBlock     = 7 * 24 * time.Hour
	maxPin       = 24 * time.Hour
)

// pin is the subscription that last served an agent's provider, until its
// earliest window reset (at most 24 h); the engine's pins, memory only.
type pin struct {
	id    string
	until time.Time
}

// walk is a request's account of its calls and skips, from which an
// exhausted walk's one refusal is chosen (SPEC §7.2.5).
type walk struct {
	reasons          []string // "<subscription id or route>: <reason>"
	rate, quota      bool     // a call was refused 429 / for quota
	auth             bool     // a call was refused 401/403
	rejectedStatus   int      // (selectors) the last 400, 404, 413 or 422 (SPEC §7.2.5 e)
	blocked          bool     // a subscription was skipped as blocked
	refreshTransport *apiError
	earliestBlockEnd time.Time
	refreshed        map[string]bool  // grants refreshed in this request
	skipped          map[string]bool  // grants whose refresh failed: skipped for the rest of the request (SPEC §7.2.3)
	last             *providerRefusal // the last call's refusal (the probe records a 401 or 403)
	route            string           // (selectors) the candidate being walked, which every note names (SPEC §7.3)
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
// active credential, and whether it has any non-retired one (SPEC §2.3).
func (e *engine) eligible(agent, provider string) (active []overlayItem, any bool, err error) {
	pool, err := e.inv.pool(agent, provider)
	if err != nil {
		return nil, false, err
	}
	for _, it := range pool {
		if e.ledger.credentialState(it.ID) == credActive {
			active = append(active, it)
		}
	}
	return active, len(pool) > 0, nil
}

// order sorts eligible subscriptions: blocked last, then freest first, the
// pinned one first among equals; ties keep overlay order (SPEC §7.2.2).
func (e *engine) order(agent, provider string, subs []overlayItem) []overlayItem {
	now, pinned, free := e.now(), "", map[string][]float64{}
	if pn, ok := e.pins.Load(agent + "\x00" + provider); ok && now.Before(pn.(pin).until) {
		pinned = pn.(pin).id
	}
	for _, it := range subs {
		free[it.ID] = append(e.freedomOf(it.ID, now), b2f(it.ID != pinned))
	}
	out := slices.Clone(subs)
	slices.SortStableFunc(out, func(a, b overlayItem) int { return slices.Compare(free[a.ID], free[b.ID]) })
	return out
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

// errSkipSubscription: a grant could not be refreshed; the walk noted why.
var errSkipSubscription = errors.New("subscription skipped")

// subscriptionCredential is what a call on sub presents, an expired grant
// or a just refusedToken refreshed first (SPEC §7.2.3, §11.1).
func (e *engine) subscriptionCredential(ctx context.Context, sub overlayItem, refusedToken string) (upstreamCredential, error) {
	wk := &e.wk
	vc, err := e.inv.credential(sub.ID) // its refusal is SPEC §2.2's
	if err != nil {
		return upstreamCredential{}, err
	}
	if vc.OAuth == nil {
		return e.sendable(sub, upstreamCredential{APIKey: vc.APIKey})
	}
	g := *vc.OAuth
	if wk.skipped[sub.ID] { // a later candidate of the same provider walks this pool again
		return upstreamCredential{}, errSkipSubscription
	}
	if refusedToken != "" || (expiredForRequest(g, e.now()) && !wk.refreshed[sub.ID]) {
		if wk.refreshed == nil {
			wk.refreshed = map[string]bool{}
		}
		wk.refreshed[sub.ID] = true
		ng, err := e.oauth.refresh(ctx, sub.ID, sub.Provider, refusedToken)
		if errors.Is(err, errRefreshSuperseded) { // a sign-in replaced the grant meanwhile: the call uses its (SPEC §11.1)
			return e.subscriptionCredential(ctx, sub, "")
		}
		if err != nil && ctx.Err() != nil { // the caller hung up while it waited: no skip, no call (SPEC §7.4)
			return upstreamCredential{}, refuse("client_cancelled", "the caller went away during a grant refresh").because(err)
		}
		if err != nil {
			var re *endpointError
			if errors.As(err, &re) && !re.Definitive {
				if wk.refreshTransport == nil {
					wk.refreshTransport = refuse("dependency_unavailable", "%s", redact(re.Error())).because(err)
				}
				e.maint.request("credential_refresh_transport_failure", e.agent)
			}
			wk.note(sub.ID, "grant refresh failed: "+redact(err.Error()))
			if wk.skipped == nil {
				wk.skipped = map[string]bool{}
			}
			wk.skipped[sub.ID] = true
			return upstreamCredential{}, errSkipSubscription
		}
		g = ng
	}
	return e.sendable(sub, upstreamCredential{AccessToken: g.AccessToken, AccountID: g.AccountID})
}

// sendable passes cred, or skips sub like a blocked one (no call, no attempt)
// when no header could carry it (a vault edited by hand), marking it for a
// sign-in (SPEC §17).
func (e *engine) sendable(sub overlayItem, cred upstreamCredential) (upstreamCredential, error) {
	if controlAt(cred.APIKey+cred.AccessToken+cred.AccountID) < 0 {
		return cred, nil
	}
	const why = "the vault's credential holds a control character and cannot be sent; sign in again"
	e.ledger.setCredential(sub.ID, sub.Provider, credNeedsReauth, why)
	e.wk.note(sub.ID, why)
	return upstreamCredential{}, errSkipSubscription
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
	p := c.res.Provider.id
	now := e.now()
	ws := parsePlanWindows(p, resp.Header, now)
	e.ledger.recordWindows(sub.ID, p, ws)
	led, _ := e.ledger.entry(sub.ID) // its windows: this answer's and a usage report's (SPEC §7.2.2)
	until := now.Add(maxPin)
	for _, win := range led.Windows {
		if at := time.UnixMilli(win.ResetsAtMs); win.ResetsAtMs > 0 && at.After(now) && at.Before(until) {
			until = at
		}
	}
	u, ae, streamed := e.deliver(ctx, w, cand.model, cand.req, c, resp, attempts)
	if ae == nil { // only a success pins (SPEC §7.2.4)
		e.pins.Store(e.agent+"\x00"+p, pin{sub.ID, until})
	}
	e.ledger.recordUse(sub.ID, p, ae == nil, u.InputTokens, u.OutputTokens)
	if ae != nil { // a nil *apiError is no nil error
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
func (e *engine) windowWait(id string, now time.Time) time.Duration {
	led, _ := e.ledger.entry(id)
	var wait time.Duration
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
	wk := &e.wk
	now := e.now()
	d := ref.retryAfter
	if d <= 0 {
		d = cmp.Or(e.windowWait(sub.ID, now), defaultBlock)
	}
	until := now.Add(min(d, maxBlock))
	e.ledger.block(sub.ID, provider, until, ref.sentence)
	wk.noteBlock(until)
	if ref.class == refusalRate {
		wk.rate = true
		wk.note(sub.ID, "rate limited: "+ref.sentence)
	} else {
		wk.quota = true
		wk.note(sub.ID, "quota exhausted: "+ref.sentence)
	}
}

// subscriptionPool is a subscription route's ordered eligible pool, or the
// refusal at attempts 0 (SPEC §7.2.1).
func (e *engine) subscriptionPool(agent string, res resolution) ([]overlayItem, error) {
	subs, anyPool, err := e.eligible(agent, res.Provider.id)
	if err != nil {
		return nil, err
	}
	switch {
	case !anyPool:
		return nil, refuse("credential_unauthorized", "no %q subscription for agent %q", res.Provider.id, agent).withAttempts(0)
	case len(subs) == 0:
		return nil, refuse("subscription_reauthorization_required", "no %q subscription of agent %q has an active credential; sign in again", res.Provider.id, agent).withAttempts(0)
	}
	return e.order(agent, res.Provider.id, subs), nil
}

// allNeedSignIn: the agent has subscriptions, none active (SPEC §7.3).
func (e *engine) allNeedSignIn(agent string) bool {
	items, err := e.inv.agentItems(agent)
	if err != nil || len(items) == 0 {
		return false
	}
	return !slices.ContainsFunc(items, func(it overlayItem) bool { return e.ledger.credentialState(it.ID) == credActive })
}
