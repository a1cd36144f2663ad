package main

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The subscription walk: who pays when an agent calls (SPEC §7.2, §7.3).
// An explicit subscription route makes at most two calls on its one route;
// a selector walks its candidate routes in order, each on at most two
// credentials. Only refusals that prove nothing was generated move the walk
// on; anything else is answered at once, because a second call could double
// cost or tool effects.

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
	agent            string
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
		ae = refuse("provider_rejected", "every candidate refused the request: %s", list)
		ae.ProviderStatus = wk.rejectedStatus
	default:
		ae = refuse("provider_failure", "every candidate was refused: %s", list)
	}
	if ae.Status() == http.StatusTooManyRequests && !wk.earliestBlockEnd.IsZero() {
		// Both 429s: the wait until the earliest block ends (SPEC §7.2.5).
		ae.RetryAfter = max(wk.earliestBlockEnd.Sub(now), time.Second)
	}
	return ae.withAttempts(wk.attempts)
}

// answerExhausted writes a walk's exhausted refusal.
func (s *server) answerExhausted(w http.ResponseWriter, r *http.Request, wk *walk) {
	ae := wk.exhausted(s.now())
	if ae.Code == "subscription_reauthorization_required" {
		s.requestMaintenance("subscription_reauthorization_required")
	}
	s.fail(w, r, ae)
}

// eligible returns the agent's non-retired subscriptions of provider whose
// credential is active, and whether it has any non-retired one at all.
// Retirement comes from the journal, never the listing cache (SPEC §2.3).
func (s *server) eligible(agent, provider string) (active []overlayItem, any bool, err error) {
	pool, err := s.inv.pool(agent, provider)
	if err != nil {
		return nil, false, err
	}
	for _, it := range pool {
		if s.ledger.credentialState(it.ID) == credActive {
			active = append(active, it)
		}
	}
	return active, len(pool) > 0, nil
}

// order sorts eligible subscriptions: blocked last, then freest first, the
// pinned one first among equals; ties keep overlay order (SPEC §7.2.2).
func (s *server) order(agent, provider string, subs []overlayItem) []overlayItem {
	now := s.now()
	pinned := s.pins.get(agent, provider, now)
	type ranked struct {
		it      overlayItem
		blocked bool
		full    float64
		pinned  bool
	}
	rs := make([]ranked, len(subs))
	for i, it := range subs {
		rs[i] = ranked{it, !s.ledger.blockedUntil(it.ID).IsZero(), s.ledger.fullness(it.ID, now), it.ID == pinned}
	}
	slices.SortStableFunc(rs, func(a, b ranked) int {
		if a.blocked != b.blocked {
			return boolOrder(a.blocked, b.blocked)
		}
		if c := cmp.Compare(a.full, b.full); c != 0 {
			return c
		}
		return boolOrder(b.pinned, a.pinned)
	})
	out := make([]overlayItem, len(rs))
	for i, r := range rs {
		out[i] = r.it
	}
	return out
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

// routeOutcome says how one route's walk ended when it did not answer.
type routeOutcome int

const (
	routeAnswered     routeOutcome = iota // the caller has its answer (success or a refusal)
	routeRefused                          // every eligible subscription refused or was skipped
	routeBudgetSpent                      // two calls made, some subscription untried
	routeModelRefused                     // (selectors) the provider would not run the request: 400, 404, 422
)

// walkRoute walks one subscription route with at most two calls (SPEC
// §7.2.3–4). subs is the ordered eligible pool; answerModel is the name the
// answer reports.
func (s *server) walkRoute(w http.ResponseWriter, r *http.Request, req *callerRequest, res resolution, subs []overlayItem, answerModel string, wk *walk, inSelector bool) routeOutcome {
	p := res.Provider
	baseURL, err := providerBaseURL(p, s.getenv)
	if err != nil {
		s.fail(w, r, refuse("dependency_unavailable", "provider %q has an unusable base URL: %v", p.id, err).withAttempts(wk.attempts))
		return routeAnswered
	}
	calls := 0
	queue := slices.Clone(subs)
	for len(queue) > 0 && calls < 2 {
		sub := queue[0]
		queue = queue[1:]
		if until := s.ledger.blockedUntil(sub.ID); !until.IsZero() {
			wk.blocked = true
			wk.noteBlock(until)
			wk.note(sub.ID, "blocked until "+until.UTC().Format(time.RFC3339))
			continue
		}
		cred, err := s.subscriptionCredential(r, sub, wk, "")
		if err != nil {
			if errors.Is(err, errSkipSubscription) {
				continue
			}
			s.fail(w, r, asAPIError(err).withAttempts(wk.attempts))
			return routeAnswered
		}
		c := call{res: res, baseURL: baseURL, cred: cred}
		start := s.now()
		a := s.callRoute(r.Context(), req, c)
		if !a.sent { // the request could not be encoded: nothing was called
			ae := a.err
			if wk.attempts > 0 {
				ae = ae.withAttempts(wk.attempts)
			}
			s.fail(w, r, ae)
			return routeAnswered
		}
		calls++
		wk.attempts++
		if a.resp != nil {
			s.answerSubscription(w, r, req, c, sub, a.resp, answerModel, wk, start)
			return routeAnswered
		}
		if a.err != nil { // transport failure or cut body: potentially billable
			s.ledger.recordUse(sub.ID, p.id, false, 0, 0)
			s.settle(r, c, start, usage{}, a.err.withAttempts(wk.attempts))
			s.fail(w, r, a.err)
			return routeAnswered
		}
		ref := a.refusal
		s.ledger.recordUse(sub.ID, p.id, false, 0, 0)
		switch ref.class {
		case refusalAuth:
			wk.auth = true
			if cred.AccessToken != "" && !wk.refreshed[sub.ID] {
				// An OAuth grant not yet refreshed in this request: refresh it,
				// and let the next attempt, if one remains, be this same
				// subscription. A failed refresh already recorded what it
				// proved (a definitive refusal marks the grant; a transport
				// failure changes nothing), so the state is not touched here.
				_, err := s.subscriptionCredential(r, sub, wk, cred.AccessToken)
				switch {
				case err == nil:
					wk.note(sub.ID, "refused the access token; refreshed")
					if calls < 2 {
						queue = append([]overlayItem{sub}, queue...)
					}
				case !errors.Is(err, errSkipSubscription):
					s.fail(w, r, asAPIError(err).withAttempts(wk.attempts))
					return routeAnswered
				}
				continue
			}
			s.ledger.setCredential(sub.ID, p.id, credNeedsReauth, ref.sentence)
			wk.note(sub.ID, "authentication refused: "+ref.sentence)
		case refusalRate, refusalQuota:
			d := ref.retryAfter
			if d <= 0 {
				d = defaultBlock
			}
			until := s.now().Add(min(d, maxBlock))
			s.ledger.block(sub.ID, p.id, until, ref.sentence)
			wk.noteBlock(until)
			if ref.class == refusalRate {
				wk.rate = true
				wk.note(sub.ID, "rate limited: "+ref.sentence)
			} else {
				wk.quota = true
				wk.note(sub.ID, "quota exhausted: "+ref.sentence)
			}
		case refusalModel:
			if inSelector {
				wk.model = true
				wk.rejectedStatus = ref.err.Status()
				wk.note(res.Route, "refused the request: "+ref.sentence)
				return routeModelRefused
			}
			fallthrough
		default:
			ae := ref.err.withAttempts(wk.attempts)
			s.settle(r, c, start, usage{}, ae)
			s.fail(w, r, ae)
			return routeAnswered
		}
	}
	if len(queue) > 0 {
		return routeBudgetSpent
	}
	return routeRefused
}

// errSkipSubscription marks a subscription skipped without a call because
// its grant could not be refreshed (the walk has noted why).
var errSkipSubscription = errors.New("subscription skipped")

// subscriptionCredential is what a call on sub presents. An OAuth grant that
// is expired, or whose access token refusedToken was just refused, is
// refreshed first (SPEC §7.2.3, §11.1); a failed refresh skips sub.
func (s *server) subscriptionCredential(r *http.Request, sub overlayItem, wk *walk, refusedToken string) (upstreamCredential, error) {
	vc, err := s.inv.credential(sub.ID)
	if err != nil {
		return upstreamCredential{}, refuse("credential_unauthorized", "the vault is unreadable; no credential can be produced").because(err)
	}
	if vc.OAuth == nil {
		return upstreamCredential{APIKey: vc.APIKey}, nil
	}
	g := *vc.OAuth
	if refusedToken != "" || (expiredForRequest(g, s.now()) && !wk.refreshed[sub.ID]) {
		if wk.refreshed == nil {
			wk.refreshed = map[string]bool{}
		}
		wk.refreshed[sub.ID] = true
		ng, err := s.oauth.refresh(r.Context(), sub.ID, sub.Provider, refusedToken)
		if err != nil {
			var re *refreshError
			if errors.As(err, &re) && !re.Definitive {
				if wk.refreshTransport == nil {
					wk.refreshTransport = refuse("dependency_unavailable", "%s", redact(re.Error())).because(err)
				}
				s.requestMaintenance("credential_refresh_transport_failure")
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
func (s *server) answerSubscription(w http.ResponseWriter, r *http.Request, req *callerRequest, c call, sub overlayItem, resp *http.Response, answerModel string, wk *walk, start time.Time) {
	p := c.res.Provider.id
	now := s.now()
	ws := parsePlanWindows(p, resp.Header, now)
	s.ledger.recordWindows(sub.ID, p, ws)
	until := now.Add(maxPin)
	for _, win := range ws {
		if at := time.UnixMilli(win.ResetsAtMs); win.ResetsAtMs > 0 && at.After(now) && at.Before(until) {
			until = at
		}
	}
	s.pins.set(wk.agent, p, sub.ID, until)
	u, ae, streamed := s.deliver(w, r, answerModel, req, c, resp, wk.attempts)
	s.ledger.recordUse(sub.ID, p, ae == nil, u.InputTokens, u.OutputTokens)
	var se *upstreamStreamError
	if ae != nil && errors.As(ae, &se) && (se.Class == refusalRate || se.Class == refusalQuota) {
		s.ledger.block(sub.ID, p, now.Add(defaultBlock), "the provider ended a committed answer with "+se.Code)
	}
	s.conclude(w, r, c, start, u, ae, streamed)
}

// requestMaintenance asks for one maintenance pass after a refusal for want
// of a signed-in subscription (SPEC §11.2).
func (s *server) requestMaintenance(reason string) {
	s.maint.request(reason)
}

// walkSubscriptionRoute serves an explicit subscription route (SPEC §7.2).
func (s *server) walkSubscriptionRoute(w http.ResponseWriter, r *http.Request, req *callerRequest, res resolution, agent string) {
	wk := &walk{agent: agent}
	subs, anyPool, err := s.eligible(agent, res.Provider.id)
	if err != nil {
		s.fail(w, r, asAPIError(err))
		return
	}
	if bt := req.head.BillingTarget; bt != nil {
		subs = slices.DeleteFunc(subs, func(it overlayItem) bool { return it.ID != bt.SubscriptionID })
	}
	switch {
	case !anyPool:
		s.fail(w, r, refuse("credential_unauthorized", "no %q subscription for agent %q", res.Provider.id, agent).withAttempts(0))
		return
	case len(subs) == 0:
		s.requestMaintenance("subscription_reauthorization_required")
		s.fail(w, r, refuse("subscription_reauthorization_required", "no %q subscription of agent %q has an active credential; sign in again", res.Provider.id, agent).withAttempts(0))
		return
	}
	answerModel := req.head.Model
	if s.walkRoute(w, r, req, res, s.order(agent, res.Provider.id, subs), answerModel, wk, false) != routeAnswered {
		s.answerExhausted(w, r, wk)
	}
}

// allNeedSignIn reports whether the agent has non-retired subscriptions and
// none of them has an active credential (SPEC §7.3's no-candidate case).
func (s *server) allNeedSignIn(agent string) bool {
	items, err := s.inv.agentItems(agent)
	if err != nil || len(items) == 0 {
		return false
	}
	return !slices.ContainsFunc(items, func(it overlayItem) bool { return s.ledger.credentialState(it.ID) == credActive })
}

// checkBillingTarget refuses a billingTarget that names no usable
// subscription of this agent for the route's provider (SPEC §7.2.1), before
// any dispatch and without saying whether the id exists.
func (s *server) checkBillingTarget(bt *billingTarget, provider, agent string) error {
	bad := refuse("invalid_request", "billingTarget names no usable %q subscription of agent %q", provider, agent)
	if bt.ProviderID != "" && bt.ProviderID != provider {
		return bad
	}
	pool, err := s.inv.pool(agent, provider)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(pool, func(it overlayItem) bool { return it.ID == bt.SubscriptionID }) {
		return bad
	}
	return nil
}

// walkSelector serves any, any-vision-capable and best (SPEC
// §7.3): every candidate in order, each an explicit subscription route.
func (s *server) walkSelector(w http.ResponseWriter, r *http.Request, req *callerRequest, cands []resolution, agent string) {
	wk := &walk{agent: agent}
	poolRefused := map[string]bool{}
	hadEligible := false
	var maxTokensSkip error // set when a candidate was skipped for want of max_tokens
	for _, cand := range cands {
		p := cand.Provider.id
		if poolRefused[p] {
			wk.note(cand.Route, "skipped: every "+p+" subscription already refused")
			continue
		}
		subs, _, err := s.eligible(agent, p)
		if err != nil {
			s.fail(w, r, asAPIError(err).withAttempts(wk.attempts))
			return
		}
		if len(subs) == 0 {
			wk.note(cand.Route, fmt.Sprintf("no usable %q subscription", p))
			continue
		}
		head := req.head
		if err := s.applyMaxTokens(&head, cand); err != nil {
			maxTokensSkip = err
			wk.note(cand.Route, "skipped: "+asAPIError(err).Message)
			continue
		}
		hadEligible = true
		switch s.walkRoute(w, r, req.withLimit(head.MaxTokens), cand, s.order(agent, p, subs), cand.Route, wk, true) {
		case routeAnswered:
			return
		case routeRefused:
			poolRefused[p] = true
		}
	}
	switch {
	case hadEligible:
		s.answerExhausted(w, r, wk)
	case maxTokensSkip != nil: // every usable candidate needs a max_tokens nobody knows (SPEC §6.4)
		s.fail(w, r, maxTokensSkip)
	case s.allNeedSignIn(agent):
		s.requestMaintenance("subscription_reauthorization_required")
		s.fail(w, r, refuse("subscription_reauthorization_required", "agent %q has subscriptions but none has an active credential; sign in again", agent).withAttempts(0))
	default:
		s.fail(w, r, refuse("credential_unauthorized", "no subscription model can serve agent %q", agent).withAttempts(0))
	}
}
