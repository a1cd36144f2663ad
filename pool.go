package main

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The credential pool: who pays when an agent calls (SPEC §7.2, §7.3).
// The eligible subscriptions of an agent for a provider, their order, the
// pin, the grant refreshed before a call, the ledger kept of each call, and
// the one refusal of a walk that found no success. The attempt limits and
// the walk itself are dispatch.go's (budgets, attemptCandidate).

// Block lengths (SPEC §7.2.4).
const (
	defaultBlock = 15 * time.Minute
	maxBlock     = 7 * 24 * time.Hour
	maxPin       = 24 * time.Hour
)

// pins remembers, per agent and provider, the subscription that last served
// it, until its earliest window reset (at most 24 h). Memory only.
type pins struct {
	mu sync.Mutex // guards m
	m  map[string]pin
}

type pin struct {
	id    string
	until time.Time
}

func (p *pins) get(agent, provider string, now time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pn, ok := p.m[agent+"\x00"+provider]; ok && now.Before(pn.until) {
		return pn.id
	}
	return ""
}

func (p *pins) set(agent, provider, id string, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]pin{}
	}
	p.m[agent+"\x00"+provider] = pin{id: id, until: until}
}

// walk is one request's account of its subscription calls and skips, from
// which an exhausted walk's one refusal is chosen (SPEC §7.2.5).
type walk struct {
	attempts         int      // calls made by this request
	reasons          []string // "<subscription id or route>: <reason>"
	rate, quota      bool     // a call was refused 429 / for quota
	auth, model      bool     // a call was refused 401/403 / 400, 404, 413, 422 (selectors)
	rejectedStatus   int      // the HTTP status of the last model refusal (SPEC §7.2.5 e)
	blocked          bool     // a subscription was skipped as blocked
	refreshTransport *apiError
	earliestBlockEnd time.Time
	refreshed        map[string]bool // grants refreshed in this request
}

func (wk *walk) note(who, reason string) {
	wk.reasons = append(wk.reasons, who+": "+reason)
}

func (wk *walk) noteBlock(until time.Time) {
	if wk.earliestBlockEnd.IsZero() || until.Before(wk.earliestBlockEnd) {
		wk.earliestBlockEnd = until
	}
}

// exhausted is the one refusal of a walk that found no success (SPEC
// §7.2.5, first match).
func (wk *walk) exhausted(now time.Time) *apiError {
	list := strings.Join(wk.reasons, "; ")
	var ae *apiError
	switch {
	case wk.attempts == 0 && wk.refreshTransport != nil:
		ae = refuse("dependency_unavailable", "%s", wk.refreshTransport.Message).because(wk.refreshTransport.Err)
	case wk.attempts == 0 && wk.blocked:
		ae = refuse("subscription_unavailable", "every eligible subscription is blocked: %s", list)
	case wk.attempts == 0:
		ae = refuse("subscription_reauthorization_required", "no subscription could be refreshed; sign in again: %s", list)
	case wk.rate:
		ae = refuse("provider_rate_limited", "the provider refused for rate: %s", list)
	case wk.quota:
		ae = refuse("provider_quota_exhausted", "the provider says the quota is spent: %s", list)
	case wk.auth:
		ae = refuse("subscription_reauthorization_required", "the provider refused the credentials; sign in again: %s", list)
	case wk.model && wk.rejectedStatus != 0:
		// Only a selector walk gets here: every call was a refusal of the
		// request itself, so the caller gets the last one's status.
		ae = refuse("provider_rejected", "every candidate refused the request: %s", list).withStatus(wk.rejectedStatus)
	default:
		ae = refuse("provider_failure", "every candidate was refused: %s", list)
	}
	if ae.Status() == http.StatusTooManyRequests && !wk.earliestBlockEnd.IsZero() {
		// Both 429s: the wait until the earliest block ends (SPEC §7.2.5).
		ae.RetryAfter = max(wk.earliestBlockEnd.Sub(now), time.Second)
	}
	return ae.withAttempts(wk.attempts)
}

// eligible returns the agent's non-retired subscriptions of provider whose
// credential is active, and whether it has any non-retired one at all.
// Retirement comes from the journal, never the listing cache (SPEC §2.3).
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
	now := e.now()
	pinned := e.pins.get(agent, provider, now)
	type ranked struct {
		it     overlayItem
		free   freedom
		pinned bool
	}
	rs := make([]ranked, len(subs))
	for i, it := range subs {
		rs[i] = ranked{it, e.freedomOf(it.ID, now), it.ID == pinned}
	}
	slices.SortStableFunc(rs, func(a, b ranked) int {
		return cmp.Or(a.free.compare(b.free), boolOrder(b.pinned, a.pinned))
	})
	out := make([]overlayItem, len(rs))
	for i, r := range rs {
		out[i] = r.it
	}
	return out
}

// freedom is how free a subscription is for ordering (SPEC §7.2.2): one
// inside a recorded block goes last; then lower fullness first.
type freedom struct {
	blocked bool
	full    float64
}

func (e *engine) freedomOf(id string, now time.Time) freedom {
	return freedom{!e.ledger.blockedUntil(id).IsZero(), e.ledger.fullness(id, now)}
}

// compare sorts the freer first.
func (a freedom) compare(b freedom) int {
	return cmp.Or(boolOrder(a.blocked, b.blocked), cmp.Compare(a.full, b.full))
}

// boolOrder sorts false before true.
func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// errSkipSubscription marks a subscription skipped without a call because
// its grant could not be refreshed (the walk has noted why).
var errSkipSubscription = errors.New("subscription skipped")

// subscriptionCredential is what a call on sub presents. An OAuth grant that
// is expired, or whose access token refusedToken was just refused, is
// refreshed first (SPEC §7.2.3, §11.1); a failed refresh skips sub.
func (e *engine) subscriptionCredential(ctx context.Context, sub overlayItem, wk *walk, refusedToken string) (upstreamCredential, error) {
	vc, err := e.inv.credential(sub.ID)
	if err != nil {
		return upstreamCredential{}, refuse("credential_unauthorized", "the vault is unreadable; no credential can be produced").because(err)
	}
	if vc.OAuth == nil {
		return upstreamCredential{APIKey: vc.APIKey}, nil
	}
	g := *vc.OAuth
	if refusedToken != "" || (expiredForRequest(g, e.now()) && !wk.refreshed[sub.ID]) {
		if wk.refreshed == nil {
			wk.refreshed = map[string]bool{}
		}
		wk.refreshed[sub.ID] = true
		ng, err := e.oauth.refresh(ctx, sub.ID, sub.Provider, refusedToken)
		if err != nil {
			var re *endpointError
			if errors.As(err, &re) && !re.Definitive {
				if wk.refreshTransport == nil {
					wk.refreshTransport = refuse("dependency_unavailable", "%s", redact(re.Error())).because(err)
				}
				e.maint.request("credential_refresh_transport_failure")
			}
			wk.note(sub.ID, "grant refresh failed: "+redact(err.Error()))
			return upstreamCredential{}, errSkipSubscription
		}
		g = ng
	}
	return upstreamCredential{AccessToken: g.AccessToken, AccountID: g.AccountID}, nil
}

// answerSubscription delivers a committed subscription call and records it
// in the ledger: plan windows from the answer's headers, spend, the pin,
// and a block when a committed stream failed for rate or quota.
func (e *engine) answerSubscription(ctx context.Context, w http.ResponseWriter, cand *candidate, c call, sub overlayItem, resp *http.Response, attempts int) (usage, *apiError, bool) {
	p := c.res.Provider.id
	now := e.now()
	ws := parsePlanWindows(p, resp.Header, now)
	e.ledger.recordWindows(sub.ID, p, ws)
	until := now.Add(maxPin)
	for _, win := range ws {
		if at := time.UnixMilli(win.ResetsAtMs); win.ResetsAtMs > 0 && at.After(now) && at.Before(until) {
			until = at
		}
	}
	e.pins.set(e.agent, p, sub.ID, until)
	u, ae, streamed := e.deliver(ctx, w, cand.model, cand.req, c, resp, attempts)
	e.ledger.recordUse(sub.ID, p, ae == nil, u.InputTokens, u.OutputTokens)
	var se *upstreamStreamError
	if ae != nil && errors.As(ae, &se) && (se.Class == refusalRate || se.Class == refusalQuota) {
		e.ledger.block(sub.ID, p, now.Add(defaultBlock), "the provider ended a committed answer with "+se.Code)
	}
	return u, ae, streamed
}

// blockFor records a block on sub after a rate or quota refusal, until the
// provider-stated reset (15 min when none is stated, at most 7 days).
func (e *engine) blockFor(sub overlayItem, provider string, ref *providerRefusal, wk *walk) {
	d := ref.retryAfter
	if d <= 0 {
		d = defaultBlock
	}
	until := e.now().Add(min(d, maxBlock))
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

// subscriptionPool is an explicit subscription route's ordered eligible
// pool (billingTarget's one subscription when named), or the refusal when
// none is eligible (SPEC §7.2.1), attempts 0.
func (e *engine) subscriptionPool(agent string, res resolution, bt *billingTarget) ([]overlayItem, error) {
	subs, anyPool, err := e.eligible(agent, res.Provider.id)
	if err != nil {
		return nil, err
	}
	if bt != nil {
		subs = slices.DeleteFunc(subs, func(it overlayItem) bool { return it.ID != bt.SubscriptionID })
	}
	switch {
	case !anyPool:
		return nil, refuse("credential_unauthorized", "no %q subscription for agent %q", res.Provider.id, agent).withAttempts(0)
	case len(subs) == 0:
		return nil, refuse("subscription_reauthorization_required", "no %q subscription of agent %q has an active credential; sign in again", res.Provider.id, agent).withAttempts(0)
	}
	return e.order(agent, res.Provider.id, subs), nil
}

// walkSubscription serves an explicit subscription route (SPEC §7.2).
func (e *engine) walkSubscription(ctx context.Context, j *job, req *callerRequest, res resolution) *apiError {
	agent := e.agent
	subs, err := e.subscriptionPool(agent, res, req.head.BillingTarget)
	if err != nil {
		return asAPIError(err)
	}
	wk := &walk{}
	out, ae := e.attemptCandidate(ctx, j, &candidate{res: res, pool: subs, req: req, model: req.head.Model}, wk)
	if out != routeAnswered {
		return wk.exhausted(e.now())
	}
	return ae
}

// allNeedSignIn reports whether the agent has non-retired subscriptions and
// none of them has an active credential (SPEC §7.3's no-candidate case).
func (e *engine) allNeedSignIn(agent string) bool {
	items, err := e.inv.agentItems(agent)
	if err != nil || len(items) == 0 {
		return false
	}
	return !slices.ContainsFunc(items, func(it overlayItem) bool { return e.ledger.credentialState(it.ID) == credActive })
}

// checkBillingTarget refuses a billingTarget that names no usable
// subscription of this agent for the route's provider (SPEC §7.2.1), before
// any dispatch and without saying whether the id exists.
func (e *engine) checkBillingTarget(bt *billingTarget, provider, agent string) error {
	bad := refuse("invalid_request", "billingTarget names no usable %q subscription of agent %q", provider, agent)
	if bt.ProviderID != "" && bt.ProviderID != provider {
		return bad
	}
	pool, err := e.inv.pool(agent, provider)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(pool, func(it overlayItem) bool { return it.ID == bt.SubscriptionID }) {
		return bad
	}
	return nil
}
