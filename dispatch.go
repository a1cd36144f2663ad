package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The attempt engine (SPEC §7): plan checks before dispatch; attemptRoute is
// the one walk over a route's candidates and their credentials within the
// budget table; send makes and counts the one call; commit is the one abort
// after commit; settle records spend once. Every kind of call goes through it.

// routeKind is what the budget table is keyed by.
type routeKind int

const (
	kindDirect       routeKind = iota // a direct or alias route (SPEC §7.1)
	kindSubscription                  // an explicit subscription route (§7.2)
	kindSelector                      // one candidate of any, any-vision-capable or best (§7.3)
	kindProbe                         // the completion probe (§11.3)
	kindEmbeddings                    // POST /v1/embeddings (§15)
	kindCountTokens                   // POST /v1/messages/count_tokens (§15)
)

// budget is what one candidate of a route kind may spend.
type budget struct {
	calls  int  // the attempt limit on one candidate
	rotate bool // a refusal proving nothing was generated moves the walk on (§7.2.4); else every refusal is answered at once
	spends bool // the call's spend is recorded (perf registry, the log line's tokens, the ledger's use)
}

// budgets is the one table of attempt limits (SPEC §7.1–§7.3, §11.3, §15).
var budgets = map[routeKind]budget{
	kindDirect:       {calls: 1, spends: true},
	kindSubscription: {calls: 2, rotate: true, spends: true},
	kindSelector:     {calls: 2, rotate: true, spends: true},
	kindProbe:        {calls: 1},
	kindEmbeddings:   {calls: 1, spends: true},
	kindCountTokens:  {calls: 1},
}

// Block lengths (SPEC §7.2.4) and the probe's output limit (§11.3).
const (
	defaultBlock   = 15 * time.Minute
	maxBlock       = 7 * 24 * time.Hour
	maxPin         = 24 * time.Hour
	probeMaxTokens = 16
)

// engine is one request's attempt engine: the daemon's parts and the
// request's account (tally) for the log line. It knows no server.
type engine struct {
	*core
	agent string // the paying agent of this request ("" for a direct route)
	t     *tally // the request's record (server.go's requestInfo) written in place
	wk    walk   // the request's one walk over candidates and credentials
}

// tally is one request's account: what the log line learns from the engine.
type tally struct {
	requestID     string
	attempts      int // provider calls made
	outcome       string
	retryable     bool
	input, output int
	route         string // the route that answered (a selector's: its candidate)
	dropped       []string
	remember      func(ae *apiError, attempts int, hungUp, streamed bool) // the replay guard's (SPEC §8.1); nil: none
}

// candidate is one route with who pays it: its pool, else the call's direct key.
type candidate struct {
	call
	pool  []overlayItem
	req   *callerRequest // a chat call's request (a selector's with its limit)
	model string         // the name a chat answer reports
}

// job is how a request's calls are built and a committed one is answered;
// commit's streamed says a failure was written in-band.
type job struct {
	kind   routeKind
	pool   []overlayItem // the probe's one subscription; nil: the agent's eligible pool
	build  func(ctx context.Context, cand *candidate, c call) (*http.Request, error)
	commit func(ctx context.Context, cand *candidate, c call, resp *http.Response) (u usage, failure *apiError, streamed bool)
}

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

// plan resolves a request's head and makes every check before dispatch but
// §6.4's output limit: allowlist, model, who pays, direct key.
func (e *engine) plan(cl client, agent string, req *chatRequest) (call, error) {
	if !cl.mayUse(req.Model) { // SPEC §3.1
		return call{}, refuse("forbidden", "this client may not use model %q", req.Model)
	}
	doc, docErr := e.reg.current()
	res, err := resolveModel(req.Model, doc, docErr, e.mayHaveDirect)
	if err != nil {
		return call{}, err
	}
	c := call{res: res, baseURL: res.BaseURL}
	switch {
	case res.Mode != modeDirect && res.Mode != modeAlias:
		if agent == "" {
			err = refuse("forbidden", "this route is paid by an agent's subscriptions; use a bearer bound to an agent: brama clients add ID -agent AGENT")
		}
	case res.Provider.cred == credDirect:
		key, vaultErr := e.directKey(res.Provider.id)
		switch {
		case vaultErr != nil:
			err = vaultUnreadable(vaultErr).withAttempts(0)
		case key == "":
			err = refuse("credential_unauthorized", "no direct credential for provider %q", res.Provider.id).withAttempts(0)
		default:
			c.cred.APIKey = key
			c.baseURL, err = e.baseURL(res.Provider)
		}
	}
	return c, err
}

// baseURL is p's, or the refusal of an unusable one (attempts as made).
func (e *engine) baseURL(p providerInfo) (string, error) {
	u, err := providerBaseURL(p, e.getenv)
	if err != nil {
		return "", refuse("dependency_unavailable", "provider %q has an unusable base URL: %v", p.id, err).withAttempts(e.t.attempts)
	}
	return u, nil
}

// planChat is plan plus a chat call's output limit (SPEC §6.4), a
// selector's candidates, and the translation parse if a call crosses formats.
func (e *engine) planChat(cl client, req *callerRequest) (c call, cands []resolution, err error) {
	if c, err = e.plan(cl, e.agent, &req.head); err != nil {
		return c, nil, err
	}
	if models := req.body.value("models"); cl.AllowedModels != nil && c.res.Provider.id == "openrouter" && models != nil {
		var names []string // OpenRouter's fallbacks: the allowlist holds for each (SPEC §3.1)
		if json.Unmarshal(models, &names) != nil {
			return c, nil, refuse("forbidden", "this client may not use models: it must be a list of model names")
		}
		for _, m := range names {
			if !cl.mayUse("openrouter/" + m) {
				return c, nil, refuse("forbidden", "this client may not use model %q (named in models)", "openrouter/"+m)
			}
		}
	}
	targets := []resolution{c.res}
	if c.res.Mode == modeDirect || c.res.Mode == modeAlias || c.res.Mode == modeSubscription {
		err = e.applyMaxTokens(&req.head, c.res)
	} else {
		cands, err = e.candidates(c.res)
		targets = cands
	}
	if err == nil && slices.ContainsFunc(targets, func(t resolution) bool { return req.translates(t.Provider) }) {
		err = req.parseForTranslation()
	}
	return c, cands, err
}

// applyMaxTokens is SPEC §6.4's rule: the caller's limit, else the model's,
// else none but on anthropic-messages (refused); codex never gets one.
func (e *engine) applyMaxTokens(req *chatRequest, res resolution) error {
	if req.MaxTokens != 0 || res.Provider.id == "codex" {
		return nil
	}
	limit, cause := e.catalog.outputLimit(res.Provider.id, res.Model)
	if limit <= 0 && res.Provider.protocol == protoAnthropic {
		return refuse("invalid_request", "max_tokens is required: the model's own limit is unknown (%s)", cause)
	}
	req.MaxTokens = max(limit, 0)
	return nil
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
		if known && model != "" && p.cred != credNone && !slices.ContainsFunc(out, func(r resolution) bool { return r.Route == route }) &&
			(res.Mode != modeAnyVision || vision()) {
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
	if pn, ok := e.pins.Load(agent + "\x00" + provider); ok && now.Before(pn.(pin).until) {
		slices.SortStableFunc(pool, func(a, b overlayItem) int { return b2i(b.ID == pn.(pin).id) - b2i(a.ID == pn.(pin).id) })
	}
	slices.SortStableFunc(pool, func(a, b overlayItem) int { return slices.Compare(free[a.ID], free[b.ID]) })
	return pool, err
}

// freedomOf is how free a subscription is, compared in order (SPEC §7.2.2).
func (e *engine) freedomOf(id string, now time.Time) []float64 {
	return []float64{float64(b2i(!e.ledger.blockedUntil(id).IsZero())), e.ledger.fullness(id, now)}
}

// b2i is 1 for true, so that false sorts first.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// attemptRoute serves c with j (SPEC §7.1–§7.3): each candidate (c's route,
// or a selector's routes in order, each with its own output limit) with who
// pays it: a direct key, the probed subscription, or the agent's pool of its
// provider, read as it is reached, skipping a provider whose pool refused. A
// rotating kind moves on only after a refusal proving nothing was generated:
// a second call could double cost or tool effects. Its answer, or the walk's
// one refusal (§7.2.5).
func (e *engine) attemptRoute(ctx context.Context, j *job, c call, req *callerRequest, sels []resolution) *apiError {
	b, wk, selecting := budgets[j.kind], &e.wk, j.kind == kindSelector
	if !selecting {
		sels = []resolution{c.res}
	}
	poolRefused, tried := map[string]bool{}, false
	var unfit *apiError // a candidate skipped: no max_tokens known, or a request its format cannot express
candidates:
	for _, res := range sels {
		p, cand, queue := res.Provider, &candidate{call: c, pool: j.pool, req: req}, []overlayItem{{}}
		if selecting {
			wk.route, cand.res, cand.model = res.Route, res, res.Route
		}
		skip := func(ae *apiError) {
			unfit = ae
			wk.note(res.Route, "skipped: "+ae.Message)
		}
		if res.Mode != modeDirect && res.Mode != modeAlias { // a pool pays
			var err error
			if cand.pool == nil && poolRefused[p.id] {
				wk.note(res.Route, "skipped: every "+p.id+" subscription already refused")
				continue
			} else if cand.pool == nil {
				if cand.pool, err = e.eligible(e.agent, p.id); err != nil {
					return asAPIError(err).withAttempts(e.t.attempts)
				}
			}
			if len(cand.pool) == 0 {
				wk.note(res.Route, fmt.Sprintf("no usable %q subscription", p.id))
				continue
			}
			if selecting {
				head := req.head
				if err = e.applyMaxTokens(&head, res); err != nil {
					skip(asAPIError(err))
					continue
				}
				cand.req = req.withLimit(head.MaxTokens)
			}
			if cand.baseURL, err = e.baseURL(p); err != nil {
				return asAPIError(err)
			}
			queue = slices.Clone(cand.pool) // without rotation, the first usable credential makes the one call
		}
		begin, before, rejected := e.now(), e.t.attempts, false
		for calls := 0; len(queue) > 0 && calls < b.calls && !rejected; {
			c, sub := cand.call, &queue[0]
			queue = queue[1:]
			var err error
			if cand.pool == nil {
				sub = nil
			} else if c.cred, err = e.subscriptionCredential(ctx, j.kind, *sub, ""); errors.Is(err, errSkipSubscription) {
				continue
			} else if err != nil {
				return asAPIError(err).withAttempts(e.t.attempts)
			}
			start := e.now()
			hr, err := j.build(ctx, cand, c)
			if ae := asAPIError(err); err != nil && selecting && ae.Code == "invalid_request" { // its format cannot express the request (SPEC §7.6)
				skip(ae)
				continue candidates
			} else if err != nil { // the request could not be built: nothing was called
				if e.t.attempts > 0 {
					ae = ae.withAttempts(e.t.attempts)
				}
				return ae
			}
			made := e.t.attempts
			resp, ref, failure := e.send(hr, c, sub)
			calls++
			if resp != nil {
				return e.commit(ctx, j, cand, c, sub, resp, start)
			}
			if sub != nil && b.rotate && e.t.attempts > made { // none once the caller hung up: no use of sub
				e.ledger.recordUse(sub.ID, p.id, false, 0, 0)
			}
			switch {
			case ref == nil || !b.rotate && j.pool == nil: // a transport failure or cut body is potentially billable
			case ref.class == refusalAuth: // the probe's is recorded, not retried
				wk.auth = true
				if (!b.rotate || c.cred.AccessToken == "" || slices.Contains(wk.refreshed, sub.ID)) && !e.credentialReplaced(*sub, c.cred) {
					e.ledger.setCredential(sub.ID, p.id, credNeedsReauth, cmp.Or(ref.sentence, ref.err.Message))
					wk.note(sub.ID, "authentication refused: "+ref.sentence)
					continue
				}
				// Refresh a grant not yet refreshed here, retry if a call remains.
				_, err := e.subscriptionCredential(ctx, j.kind, *sub, c.cred.AccessToken)
				if err != nil && !errors.Is(err, errSkipSubscription) {
					return asAPIError(err).withAttempts(e.t.attempts)
				}
				if err == nil {
					wk.note(sub.ID, "refused the access token; refreshed")
					if calls < b.calls {
						queue = append([]overlayItem{*sub}, queue...)
					}
				}
				continue
			case ref.class == refusalRate || ref.class == refusalQuota:
				e.blockFor(*sub, ref)
				continue
			case ref.class == refusalModel && selecting: // the next candidate may take the request
				wk.rejectedStatus, rejected = ref.err.Status(), true
				wk.note(res.Route, "refused the request: "+ref.sentence)
				continue
			}
			return e.settle(ctx, j, cand, start, usage{}, failure.withAttempts(e.t.attempts))
		}
		if e.t.attempts > before && b.spends { // calls all refused count as one failure of the route (SPEC §13)
			e.perf.record(res.Route, false, e.now().Sub(begin), 0)
		}
		poolRefused[p.id], tried = len(queue) == 0 && !rejected, true
	}
	switch {
	case tried:
		return e.exhausted()
	case unfit != nil: // every usable candidate needs a max_tokens nobody knows (SPEC §6.4) or another format
		return unfit
	}
	provider := c.res.Provider.id // no call at all: sign in again when every subscription (of a selector: any) needs it
	if selecting {
		provider = ""
	}
	items, err := e.inv.pool(e.agent, provider)
	if err == nil && len(items) > 0 && !slices.ContainsFunc(items, func(it overlayItem) bool { return e.ledger.credentialState(it.ID) == credActive }) {
		return refuse("subscription_reauthorization_required", "no subscription of agent %q for %s has an active credential; sign in again", e.agent, cmp.Or(c.res.Route, c.res.Mode)).withAttempts(0)
	}
	return refuse("credential_unauthorized", "no subscription of agent %q can serve %s", e.agent, cmp.Or(c.res.Route, c.res.Mode)).withAttempts(0)
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

// testingOnlyBeforeCall runs as send starts a call (nil in production).
var testingOnlyBeforeCall func(context.Context)

// send makes one provider call, the one place an attempt is counted: a 2xx
// with its body unread, else the failure (and a whole non-2xx's refusal);
// a refusal's plan windows reach sub's ledger as an answer's do (SPEC §6.3).
func (e *engine) send(hr *http.Request, c call, sub *overlayItem) (*http.Response, *providerRefusal, *apiError) {
	p := c.res.Provider
	if testingOnlyBeforeCall != nil {
		testingOnlyBeforeCall(hr.Context())
	}
	if err := hr.Context().Err(); err != nil { // the caller hung up since the last call: none is sent
		return nil, nil, classifyTransport(err)
	}
	for name, vs := range hr.Header { // net/http refuses such a value before sending: no call
		if slices.ContainsFunc(vs, func(v string) bool { return controlAt(v) >= 0 }) {
			return nil, nil, refuse("credential_unauthorized", "the %s header for provider %q would hold a control character (a newline in its credential?); no call was made", name, p.id)
		}
	}
	e.t.attempts++
	e.attempts.Add(1)
	resp, err := e.client.Do(hr)
	if err != nil {
		return nil, nil, classifyTransport(err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil, nil
	}
	if sub != nil {
		e.ledger.recordWindows(sub.ID, p.id, parsePlanWindows(p.id, resp.Header, e.now()))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, refuse("provider_incomplete", "provider %q answered %d and its body was cut after %d bytes", p.id, resp.StatusCode, len(body)).because(err)
	}
	ref := classifyRefusal(p.id, resp.StatusCode, resp.Header, body, c.cred.bearer(), e.now())
	return nil, &ref, ref.err
}

// commit answers from a committed call, never retried (SPEC §7.5), and
// keeps sub's ledger: plan windows, spend, a success's pin until the
// earliest window reset, a block after an in-band rate or quota error. A
// failed stream, its in-band error written, aborts the response: the one abort.
func (e *engine) commit(ctx context.Context, j *job, cand *candidate, c call, sub *overlayItem, resp *http.Response, start time.Time) *apiError {
	defer resp.Body.Close()
	p, now, until := c.res.Provider.id, e.now(), time.Time{}
	if sub != nil {
		e.ledger.recordWindows(sub.ID, p, parsePlanWindows(p, resp.Header, now))
		led, _ := e.ledger.entry(sub.ID) // its windows: this answer's and a usage report's (SPEC §7.2.2)
		until = now.Add(maxPin)
		for _, win := range led.Windows {
			if at := time.UnixMilli(win.ResetsAtMs); win.ResetsAtMs > 0 && at.After(now) && at.Before(until) {
				until = at
			}
		}
	}
	u, ae, streamed := j.commit(ctx, cand, c, resp)
	if sub != nil && budgets[j.kind].spends {
		e.ledger.recordUse(sub.ID, p, ae == nil, u.InputTokens, u.OutputTokens)
		if ae == nil { // only a success pins (SPEC §7.2.4)
			e.pins.Store(e.agent+"\x00"+p, pin{sub.ID, until})
		}
	}
	var se *upstreamStreamError
	if sub != nil && ae != nil && errors.As(ae, &se) && (se.Class == refusalRate || se.Class == refusalQuota) {
		e.block(*sub, retryAfter(resp.Header, now), "the provider ended a committed answer with "+se.Code)
	}
	if ae = e.settle(ctx, j, cand, start, u, ae); ae != nil && streamed {
		panic(http.ErrAbortHandler)
	}
	return ae
}

// settle records a request's spend and outcome once, however it ended, and
// returns its refusal: client_cancelled when the caller hung up (SPEC §7.4).
func (e *engine) settle(ctx context.Context, j *job, cand *candidate, start time.Time, u usage, failure *apiError) *apiError {
	if failure != nil && ctx.Err() != nil && failure.Code != "client_cancelled" {
		failure = refuse("client_cancelled", "the caller went away while the provider answered").because(failure).withAttempts(e.t.attempts)
	}
	if !budgets[j.kind].spends {
		return failure
	}
	e.t.input, e.t.output = u.InputTokens, u.OutputTokens
	e.perf.record(cand.res.Route, failure == nil, e.now().Sub(start), u.OutputTokens)
	if failure != nil {
		e.t.outcome, e.t.retryable = failure.Code, failure.retryable()
	}
	return failure
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

// serveChat answers a planned chat request on w, passthrough or translated
// (SPEC §7.6), or returns the refusal, told first to the replay guard (§8.1).
func (e *engine) serveChat(ctx context.Context, w http.ResponseWriter, req *callerRequest, c call, cands []resolution) *apiError {
	j := &job{kind: kindSelector,
		build: func(ctx context.Context, cand *candidate, c call) (*http.Request, error) {
			if cand.req.translates(c.res.Provider) {
				return buildUpstreamRequest(ctx, c.res.Provider, c.baseURL, c.cred, cand.req.translated(), c.res.Model)
			}
			return buildPassthroughRequest(ctx, c, cand.req)
		},
		commit: func(ctx context.Context, cand *candidate, c call, resp *http.Response) (usage, *apiError, bool) {
			return e.deliver(ctx, w, cand, c, resp)
		},
	}
	switch c.res.Mode {
	case modeDirect, modeAlias:
		j.kind = kindDirect
	case modeSubscription:
		j.kind = kindSubscription
	}
	ae := e.attemptRoute(ctx, j, c, req, cands)
	e.refused(ae, ctx.Err() != nil, false)
	return ae
}

// refused tells the replay guard of a refusal before the caller reads it.
func (e *engine) refused(ae *apiError, hungUp, streamed bool) {
	if e.t.remember != nil && ae != nil {
		e.t.remember(ae, e.t.attempts, hungUp, streamed)
	}
}

// deliver answers from a committed call, passthrough or translated naming
// model; a stream's failure is written in-band (streamed), a buffered one not.
func (e *engine) deliver(ctx context.Context, w http.ResponseWriter, cand *candidate, c call, resp *http.Response) (u usage, failure *apiError, streamed bool) {
	w.Header().Set("Brama-Route", c.res.Route)
	e.t.route = c.res.Route
	p, req, attempts := c.res.Provider, cand.req, e.t.attempts
	model := cmp.Or(cand.model, req.head.Model)
	pass, tr := !req.translates(p), chatRequest{}
	if !pass {
		tr = req.translated()
		if dropped := tr.droppedFor(p); len(dropped) > 0 { // SPEC §7.6: nothing is dropped silently
			w.Header().Set("Brama-Dropped", headerText(strings.Join(dropped, ", ")))
			e.t.dropped = dropped
		}
	}
	switch {
	case req.head.Stream: // after commit nothing is retried: a failure is written in-band (SPEC §7.5)
		if pass {
			model = c.res.Model
		}
		providerFacts(w.Header(), resp.Header, pass)
		sa := openStreamAnswer(w, req.dialect, tr, model, attempts, cmp.Or(e.keepAlive, keepAliveEvery))
		defer sa.close()
		var err error
		if pass {
			pw := &passthroughWatch{protocol: p.protocol, dropUsage: req.addsUsage(p)}
			err = relayWatched(pw, resp.Body, sa.relay)
			u = pw.usage
		} else {
			u, err = sa.translate(p.protocol, resp.Body)
		}
		if err != nil {
			failure = asAPIError(err).redactedFor(c.cred.bearer()).withAttempts(attempts)
			if ctx.Err() != nil {
				failure = refuse("client_cancelled", "the caller hung up during the stream").because(err).withAttempts(attempts)
			}
			e.refused(failure, false, true) // before the caller can read it and fall back
			sa.do(func() error { return sa.cs.fail(failure) })
			e.log.Warn("stream_failed_after_commit", "request_id", e.t.requestID, "code", failure.Code, "cause", redact(fmt.Sprint(failure.Err), c.cred.bearer()))
		}
		return u, failure, true
	case pass:
		u, failure = relayBuffered(w, req, c, resp, attempts)
		return u, failure, false
	}
	a, err := readProviderAnswer(p, tr, resp)
	if err != nil {
		return u, asAPIError(err).redactedFor(c.cred.bearer()).withAttempts(attempts), false
	}
	a.Model = model
	out, err := renderAnswer(req.dialect, tr, a)
	if err != nil {
		return a.Usage, asAPIError(err).withAttempts(attempts), false
	}
	providerFacts(w.Header(), resp.Header, false)
	writeAnswer(w, "application/json", attempts, out)
	return a.Usage, nil, false
}

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
		commit: func(_ context.Context, _ *candidate, c call, resp *http.Response) (usage, *apiError, bool) {
			var ans countTokensAnswer
			b, err := readWhole(c.res.Provider, resp)
			if err != nil {
				return usage{}, asAPIError(err).withAttempts(e.t.attempts), false
			}
			if err := json.Unmarshal(b, &ans); err != nil || ans.InputTokens == nil {
				return usage{}, malformedAnswer(protoAnthropic, err).withAttempts(e.t.attempts), false
			}
			w.Header().Set("Brama-Route", c.res.Route)
			w.Header().Set("Brama-Attempts", strconv.Itoa(e.t.attempts))
			providerFacts(w.Header(), resp.Header, true)
			writeJSON(w, http.StatusOK, ans)
			return usage{}, nil, false
		}}
	if ae := e.attemptRoute(ctx, j, c, nil, nil); ae != nil {
		return ae
	}
	return nil
}

// serveEmbeddings makes the one call of POST /v1/embeddings (SPEC §15) on a
// direct route to an openai-chat provider; its JSON is written as is.
func (e *engine) serveEmbeddings(ctx context.Context, w http.ResponseWriter, model string, body map[string]json.RawMessage, c call) error {
	switch {
	case c.res.Mode != modeDirect && c.res.Mode != modeAlias:
		return refuse("invalid_request", "embeddings take a direct or alias route; %q is paid by a subscription", model)
	case c.res.Provider.protocol != protoOpenAIChat:
		return refuse("invalid_request", "embeddings need an openai-chat provider; %q speaks %s", c.res.Provider.id, c.res.Provider.protocol)
	}
	body["model"], _ = json.Marshal(c.res.Model)
	out, _ := json.Marshal(body)
	j := &job{kind: kindEmbeddings,
		build: func(ctx context.Context, _ *candidate, c call) (*http.Request, error) {
			return newPassthroughRequest(ctx, c, nil, "/embeddings", out, false)
		},
		commit: func(_ context.Context, _ *candidate, c call, resp *http.Response) (usage, *apiError, bool) {
			w.Header().Set("Brama-Route", c.res.Route)
			u, ae := relayBuffered(w, &callerRequest{}, c, resp, e.t.attempts) // a JSON object as received, else provider_failure
			return u, ae, false
		}}
	if ae := e.attemptRoute(ctx, j, c, nil, nil); ae != nil {
		return ae
	}
	return nil
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
