package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// budget is what one candidate of a route kind may spend; a job carries its kind's.
type budget struct {
	calls   int  // the attempt limit on one candidate
	rotate  bool // a refusal proving nothing was generated moves the walk on (§7.2.4); else every refusal is answered at once
	spends  bool // the call's spend is recorded (perf registry, the log line's tokens, the ledger's use)
	selects bool // the walk is over a selector's candidates: a refused request moves it on, every note names one (§7.3)
}

// budgets is the one table of attempt limits (SPEC §7.1–§7.3, §11.3, §15), one row per route kind.
var budgets = struct{ direct, subscription, selector, oneCall budget }{
	direct:       budget{calls: 1, spends: true},                              // a direct or alias route (§7.1); embeddings
	subscription: budget{calls: 2, rotate: true, spends: true},                // an explicit subscription route (§7.2)
	selector:     budget{calls: 2, rotate: true, spends: true, selects: true}, // each candidate of any, any-vision-capable, best
	oneCall:      budget{calls: 1},                                            // the completion probe (§11.3), count_tokens (§15)
}

// engine is one request's attempt engine: the daemon's parts, the log line's tally, and the walk's account of its calls
// and skips, from which a walk without an answer chooses its one refusal (§7.2.5).
type engine struct {
	*core
	agent              string      // the paying agent of this request ("" for a direct route)
	t                  *tally      // the request's record (server.go's requestInfo) written in place
	reasons            []string    // "<subscription id or route>: <reason>"
	met                []string    // the refusal classes of the calls made
	rejectedStatus     int         // (selectors) the last 400, 404, 413 or 422 (SPEC §7.2.5 e)
	refreshTransport   *apiError   // the first refresh that met no answer (SPEC §7.2.3)
	blocks             []time.Time // the ends of the blocks met
	refreshed, skipped []string    // grants refreshed in this request; those whose refresh failed (SPEC §7.2.3)
	route              string      // (selectors) the candidate being walked, which every note names (SPEC §7.3)
}

// tally is one request's account: what the log line learns from the engine.
type tally struct {
	requestID     string
	attempts      int // provider calls made
	outcome       string
	retryable     bool
	counted       bool // the request reached dispatch: its attempts are logged even at 0 (a replayed answer's)
	input, output int
	route         string // the route that answered (a selector's: its candidate)
	dropped       []string
	remember      func(ae *apiError, attempts int, hungUp, streamed bool) // the replay guard's (SPEC §8.1), a no-op when off
}

// job is how a request's calls are built and a committed one answered; commit's streamed: a failure was written in-band.
type job struct {
	budget
	pool   []overlayItem // the probe's one subscription; nil: the agent's eligible pool
	build  func(ctx context.Context, c call, req *callerRequest) (*http.Request, error)
	commit func(ctx context.Context, c call, req *callerRequest, resp *http.Response) (u usage, failure *apiError, streamed bool)
}

// plan resolves a request's head and makes every check before dispatch but §6.4's: allowlist, model, who pays, direct key.
func (e *engine) plan(cl client, req *chatRequest) (call, error) {
	if !cl.mayUse(req.Model) { // SPEC §3.1
		return call{}, refuse("forbidden", "this client may not use model %q", req.Model)
	}
	doc, docErr := e.reg.current()
	key, vaultErr := "", error(nil) // read once, as resolution asks for the route's provider: an unreadable vault refuses (§2.2)
	res, err := resolveModel(req.Model, doc, docErr, func(p string) bool {
		key, vaultErr = e.directKey(p)
		return key != "" || vaultErr != nil
	})
	switch pool := res.Mode != modeDirect && res.Mode != modeAlias; {
	case err != nil: // resolveModel's refusal, its resolution zero
	case pool && e.agent == "":
		err = refuse("forbidden", "this route is paid by an agent's subscriptions; use a bearer bound to an agent: brama clients add ID -agent AGENT")
	case pool || res.Provider.cred != credDirect: // a pool, or a deployment without a key, pays
	case vaultErr != nil:
		err = refuse("credential_unauthorized", "the vault is unreadable").because(vaultErr).withAttempts(0)
	case key == "":
		err = refuse("credential_unauthorized", "no direct credential for provider %q", res.Provider.id).withAttempts(0)
	case controlAt(key) >= 0: // a vault edited by hand: net/http would refuse the header before sending, no call
		err = refuse("credential_unauthorized", "the direct key for %q holds a control character", res.Provider.id).withAttempts(0)
	default: // the only call that carries the direct key
		return call{res: res, cred: upstreamCredential{APIKey: key}}, nil
	}
	return call{res: res}, err
}

// planChat is plan (all of it for a oneCall route, SPEC §15) plus a chat call's output limit (§6.4), a selector's
// candidates, and the translation parse if a call crosses formats.
func (e *engine) planChat(cl client, req *callerRequest, oneCall bool) (c call, cands []resolution, err error) {
	if c, err = e.plan(cl, &req.head); err != nil || oneCall {
		return c, nil, err
	}
	if models := req.body.value("models"); cl.AllowedModels != nil && c.res.Provider.id == "openrouter" && models != nil {
		var names []string // OpenRouter's fallbacks: the allowlist holds for each (SPEC §3.1)
		if json.Unmarshal(models, &names) != nil {
			return c, nil, refuse("forbidden", "this client may not use models: it must be a list of model names")
		} else if i := slices.IndexFunc(names, func(m string) bool { return !cl.mayUse("openrouter/" + m) }); i >= 0 {
			return c, nil, refuse("forbidden", "this client may not use model %q (named in models)", "openrouter/"+names[i])
		}
	}
	targets := []resolution{c.res}
	if c.res.Mode == modeDirect || c.res.Mode == modeAlias || c.res.Mode == modeSubscription {
		err = e.applyMaxTokens(&req.head, c.res)
	} else if cands, err = e.candidates(c.res); err == nil {
		targets = cands
	}
	if err == nil && slices.ContainsFunc(targets, func(t resolution) bool { return req.translates(t.Provider) }) {
		req.neutral = new(chatRequest) // the whole body parsed once, at plan time
		*req.neutral, err = formatOf(req.dialect).parse(req)
	}
	return c, cands, err
}

// applyMaxTokens is SPEC §6.4: the caller's limit, else the model's, else none but on anthropic-messages; never codex's.
func (e *engine) applyMaxTokens(req *chatRequest, res resolution) error {
	if req.MaxTokens != 0 || res.Provider.codex {
		return nil
	}
	info, _, cause := e.catalog.lookup(res.Provider, res.Model)
	if info.Limit.Output <= 0 && res.Provider.protocol == protoAnthropic {
		return refuse("invalid_request", "max_tokens is required: the model's own limit is unknown (%s)", cause)
	}
	req.MaxTokens = int(info.Limit.Output) // parseCatalog leaves it a whole count ≥ 0
	return nil
}

// attemptRoute serves c with j (SPEC §7.1–§7.3): c's route, or a selector's candidates each with its own output limit,
// paid by a direct key, the probed subscription or the agent's pool (read when reached; one that refused all is skipped
// after). A rotating kind moves on only after a refusal proving nothing was generated: else cost or tool effects double.
func (e *engine) attemptRoute(ctx context.Context, j *job, c call, req *callerRequest, sels []resolution) *apiError {
	records := j.rotate || j.pool != nil // refusals mark the subscription (the probe's too), else are answered at once
	if !j.selects {
		sels = []resolution{c.res}
	}
	poolRefused := map[string]bool{} // each walked candidate's provider: did every subscription refuse?
	var unfit *apiError              // a candidate skipped: no max_tokens known, or a request its format cannot express
	for _, res := range sels {
		p, cand, creq := res.Provider, call{res: res, baseURL: res.BaseURL, cred: c.cred}, req
		if j.selects {
			e.route = res.Route
		}
		queue, pays := []overlayItem{{}}, res.Mode != modeDirect && res.Mode != modeAlias // a direct key: one call, sub nil
		var err error
		if pays {
			if queue = j.pool; queue == nil && !poolRefused[p.id] { // one that refused all is not walked again
				if queue, err = e.eligible(p.id); err != nil {
					return asAPIError(err).withAttempts(e.t.attempts)
				}
			}
			if len(queue) == 0 {
				e.note(res.Route, `skipped: no "`+p.id+`" subscription left (none usable, or every one refused already)`)
				continue
			}
			if j.selects {
				creq = new(*req) // its own output limit
				if err = e.applyMaxTokens(&creq.head, res); err != nil {
					unfit = asAPIError(err)
					e.note(res.Route, "skipped: "+unfit.Message)
					continue
				}
			}
		}
		if cand.baseURL == "" { // a deployment's is its own, else the provider's
			if cand.baseURL, err = providerBaseURL(p, e.getenv); err != nil {
				return refuse("dependency_unavailable", "provider %q has an unusable base URL: %v", p.id, err).withAttempts(e.t.attempts)
			}
		}
		begin, before, rejected, skipped := e.now(), e.t.attempts, false, false
		for ; len(queue) > 0 && e.t.attempts-before < j.calls && !rejected; queue = queue[1:] { // a skip spends no call
			c, sub := cand, &queue[0]
			if !pays {
				sub = nil
			} else if c.cred, err = e.subscriptionCredential(ctx, j, *sub, ""); errors.Is(err, errSkipSubscription) {
				continue
			} else if err != nil {
				return asAPIError(err).withAttempts(e.t.attempts)
			}
			start := e.now()
			hr, err := j.build(ctx, c, creq)
			if ae := asAPIError(err); ae != nil && j.selects && ae.Code == "invalid_request" {
				unfit, skipped = ae, true // its format cannot express the request (SPEC §7.6)
				e.note(res.Route, "skipped: "+ae.Message)
				break
			} else if err != nil && e.t.attempts > 0 { // the request could not be built: nothing was called
				return ae.withAttempts(e.t.attempts)
			} else if err != nil {
				return ae
			}
			resp, ref, made := e.send(hr, c, sub)
			if resp != nil {
				return e.commit(ctx, j, c, creq, sub, resp, start)
			}
			if sub != nil && j.rotate && made { // none once the caller hung up: no use of sub
				e.ledger.recordUse(sub.ID, p.id, false, 0, 0)
			}
			switch e.met = append(e.met, ref.class); {
			case ref.class == refusalAuth && records: // the probe's is recorded, not retried
				vc, err := e.inv.credential(sub.ID) // what a sign-in or refresh put in the vault meanwhile gets the next call, marked nothing (SPEC §10.3, §11.1)
				kept := err != nil || cmp.Or(cmp.Or(vc.OAuth, &oauthGrant{}).AccessToken, vc.APIKey) == c.cred.bearer()
				if (!j.rotate || c.cred.AccessToken == "" || slices.Contains(e.refreshed, sub.ID)) && kept {
					e.ledger.disown(sub.ID, p.id, cmp.Or(ref.sentence, ref.err.Message))
					e.note(sub.ID, "authentication refused: "+ref.sentence)
				} else if _, err := e.subscriptionCredential(ctx, j, *sub, c.cred.AccessToken); err == nil &&
					e.t.attempts-before < j.calls {
					queue = append([]overlayItem{*sub}, queue...) // refreshed: sub stays next while a call remains
				} else if err != nil && !errors.Is(err, errSkipSubscription) {
					return asAPIError(err).withAttempts(e.t.attempts)
				}
			case blockedAs[ref.class] != "" && records:
				e.blocks = append(e.blocks, e.ledger.block(sub.ID, p.id, ref.retryAfter, ref.sentence))
				e.note(sub.ID, blockedAs[ref.class]+ref.sentence)
			case ref.class == refusalModel && j.selects: // the next candidate may take the request
				e.rejectedStatus, rejected = ref.err.Status(), true
				e.note(res.Route, "refused the request: "+ref.sentence)
			default: // any other refusal; a transport failure or cut body, potentially billable
				return e.settle(ctx, j, c, start, usage{}, ref.err.withAttempts(e.t.attempts))
			}
		}
		if skipped && e.t.attempts == before { // unfit before any call on it: not walked; calls made count, below
			continue
		}
		if e.t.attempts > before && j.spends { // calls all refused count as one failure of the route (SPEC §13)
			e.perf.record(res.Route, false, e.now().Sub(begin), 0)
		}
		poolRefused[p.id] = len(queue) == 0 && !rejected
	}
	return e.exhausted(c.res, len(poolRefused) > 0, unfit)
}

// note records why the walk skipped or left who (a selector's: under its route).
func (e *engine) note(who, reason string) {
	if e.route != "" && who != e.route {
		who, reason = e.route, who+" "+reason
	}
	e.reasons = append(e.reasons, who+": "+reason)
}

// exhausted is a walk's one refusal without an answer (SPEC §7.2.5): after calls, from what they met; else from why not.
func (e *engine) exhausted(res resolution, tried bool, unfit *apiError) *apiError {
	n, list, route := e.t.attempts, strings.Join(e.reasons, "; "), cmp.Or(res.Route, res.Mode)
	ae := refuse("provider_rejected", "every candidate refused the request: %s", list).withStatus(e.rejectedStatus)
	switch {
	case !tried && unfit != nil: // every usable candidate needs a max_tokens nobody knows (SPEC §6.4) or another format
		return unfit
	case !tried: // a sign-in when no subscription of the route's provider (of a selector's: any, pool("")) is active
		items, err := e.inv.pool(e.agent, res.Provider.id)
		ae = refuse("credential_unauthorized", "no %q subscription for agent %q", res.Provider.id, e.agent)
		if res.Provider.id == "" { // a selector or best; the two sentences are SPEC §7.2's and §7.3's
			ae = refuse("credential_unauthorized", "no subscription model can serve agent %q", e.agent)
		}
		if err == nil && len(items) > 0 && !slices.ContainsFunc(items, func(it overlayItem) bool { return e.ledger.entry(it.ID).Credential.State == credActive }) {
			ae = refuse("subscription_reauthorization_required", "no subscription of agent %q for %s is active; sign in again",
				e.agent, route)
		}
	case n == 0 && e.refreshTransport != nil:
		ae = e.refreshTransport
	case n == 0 && len(e.blocks) > 0: // no call, so every block met was a skip
		ae = refuse("subscription_unavailable", "every eligible subscription is blocked: %s", list)
	case slices.Contains(e.met, refusalRate):
		ae = refuse("provider_rate_limited", "the provider refused for rate: %s", list)
	case slices.Contains(e.met, refusalQuota):
		ae = refuse("provider_quota_exhausted", "the provider says the quota is spent: %s", list)
	case n == 0 || slices.Contains(e.met, refusalAuth): // refused by the provider, meanwhile, or at a refresh; unsendable
		ae = refuse("subscription_reauthorization_required", "no credential was accepted; sign in again: %s", list)
	}
	if ae.Status() == http.StatusTooManyRequests && len(e.blocks) > 0 { // SPEC §7.2.5
		ae.RetryAfter = max(slices.MinFunc(e.blocks, time.Time.Compare).Sub(e.now()), time.Second)
	}
	return ae.withAttempts(n)
}

// testingOnlyBeforeCall runs as send starts a call (nil in production, STYLE B2).
var testingOnlyBeforeCall func(context.Context)

// send makes one provider call, the one place an attempt is counted: a 2xx with its body unread, else the failure (a whole
// non-2xx's classified, else of no class); plan windows reach sub's ledger from every answer (SPEC §6.3).
func (e *engine) send(hr *http.Request, c call, sub *overlayItem) (_ *http.Response, _ providerRefusal, made bool) {
	p := c.res.Provider
	if testingOnlyBeforeCall != nil {
		testingOnlyBeforeCall(hr.Context())
	}
	if err := hr.Context().Err(); err != nil { // the caller hung up since the last call: none is sent
		return nil, providerRefusal{err: classifyTransport(err)}, false
	}
	e.t.attempts++
	e.attempts.Add(1)
	resp, err := e.client.Do(hr)
	if err != nil {
		return nil, providerRefusal{err: classifyTransport(err)}, true
	} else if sub != nil {
		e.ledger.recordWindows(sub.ID, p.id, parsePlanWindows(p.id, resp.Header, e.now()))
	}
	if resp.StatusCode/100 == 2 {
		return resp, providerRefusal{}, true
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, providerRefusal{err: refuse("provider_incomplete", "provider %q answered %d and its body was cut after %d bytes", p.id, resp.StatusCode, len(body)).because(err)}, true
	}
	return nil, classifyRefusal(p, resp.StatusCode, resp.Header, body, c.cred.bearer(), e.now()), true
}

// commit answers from a committed call, never retried (SPEC §7.5), and keeps sub's ledger: spend, a success's pin until
// the earliest window reset, a block after an in-band rate or quota error. A failed stream aborts: the one abort.
func (e *engine) commit(ctx context.Context, j *job, c call, req *callerRequest, sub *overlayItem, resp *http.Response,
	start time.Time) *apiError {
	defer resp.Body.Close()
	p, now := c.res.Provider.id, e.now()
	u, ae, streamed := j.commit(ctx, c, req, resp)
	if sub != nil && j.spends {
		e.ledger.recordUse(sub.ID, p, ae == nil, u.InputTokens, u.OutputTokens)
	}
	if until := now.Add(24 * time.Hour); sub != nil && ae == nil && j.spends { // only a success pins (SPEC §7.2.4), ≤ 24 h
		for _, w := range e.ledger.entry(sub.ID).Windows { // until a window resets: this answer's, a usage report's
			if at := time.UnixMilli(w.ResetsAtMs); at.After(now) && at.Before(until) {
				until = at
			}
		}
		e.pins.Store(e.agent+"\x00"+p, pin{sub.ID, until})
	} else if sub != nil && ae != nil { // AsType: errors.As's target would cost every commit an allocation
		if se, ok := errors.AsType[*upstreamStreamError](ae); ok && blockedAs[se.Class] != "" {
			e.ledger.block(sub.ID, p, retryAfter(resp.Header, now), "the provider ended a committed answer with "+se.Code)
		}
	}
	if ae = e.settle(ctx, j, c, start, u, ae); ae != nil && streamed {
		panic(http.ErrAbortHandler)
	}
	return ae
}

// settle records a request's spend and outcome once, however it ended; a hang-up's refusal is client_cancelled (§7.4).
func (e *engine) settle(ctx context.Context, j *job, c call, start time.Time, u usage, failure *apiError) *apiError {
	if failure != nil && ctx.Err() != nil && failure.Code != "client_cancelled" {
		failure = refuse("client_cancelled", "the caller went away while the provider answered").because(failure).withAttempts(e.t.attempts)
	}
	if j.spends {
		e.t.input, e.t.output = u.InputTokens, u.OutputTokens
		e.perf.record(c.res.Route, failure == nil, e.now().Sub(start), u.OutputTokens)
		if failure != nil {
			e.t.outcome, e.t.retryable = failure.Code, failure.Retryable
		}
	}
	return failure
}

// pin is the subscription that last served an agent's provider, until its earliest window reset (at most 24 h); memory only.
type pin struct {
	id    string
	until time.Time
}

// candidates lists the routes a selector or best walks, in order (SPEC §7.3): best's, then for each provider P where the
// agent has an eligible subscription, freest first (ties by id), every alias's P/… destination (alias-name order), then
// the catalogue's three newest text models of P; any-vision-capable keeps those taking images.
func (e *engine) candidates(res resolution) ([]resolution, error) {
	doc, _ := e.reg.current() // nil exactly when invalid: an invalid registry offers no alias
	aliases := valueOr(doc, routesDoc{}).Routes
	var provs []string
	free := map[string][]float64{} // each provider with an eligible subscription: its freest one's
	for _, p := range providerTable {
		if subs, err := e.eligible(p.id); err != nil {
			return nil, err
		} else if len(subs) > 0 {
			free[p.id], provs = e.ledger.freedom(subs[0].ID, e.now()), append(provs, p.id)
		}
	}
	slices.SortFunc(provs, func(a, b string) int { return cmp.Or(slices.Compare(free[a], free[b]), strings.Compare(a, b)) })
	var out []resolution
	add := func(route string) {
		pid, model, _ := strings.Cut(route, "/")
		p, known := lookupProvider(pid)
		info, _, _ := e.catalog.lookup(p, model)
		seen := slices.ContainsFunc(out, func(r resolution) bool { return r.Route == route })
		sees := res.Mode != modeAnyVision || slices.Contains(info.Modalities.Input, "image")
		if known && model != "" && p.cred != credNone && !seen && sees {
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
		texts := slices.DeleteFunc(e.catalog.models(p), func(m modelInfo) bool { return !slices.Contains(m.Modalities.Output, "text") })
		for _, m := range texts[:min(3, len(texts))] {
			add(p + "/" + m.ID)
		}
	}
	return out, nil
}

// eligible is the agent's non-retired subscriptions of provider with an active credential, in order: blocked last, then
// freest first, the pinned one first among equals, ties in overlay order (SPEC §2.3, §7.2.2).
func (e *engine) eligible(provider string) ([]overlayItem, error) {
	pool, err := e.inv.pool(e.agent, provider)
	now, free := e.now(), map[string][]float64{}
	pool = slices.DeleteFunc(pool, func(it overlayItem) bool { return e.ledger.entry(it.ID).Credential.State != credActive })
	for _, it := range pool { // compared in order: blocked, fullest window, then 1 (the live pin's 0: first among equals)
		free[it.ID] = append(e.ledger.freedom(it.ID, now), 1)
	}
	if pn, ok := e.pins.Load(e.agent + "\x00" + provider); ok && now.Before(pn.(pin).until) && free[pn.(pin).id] != nil {
		free[pn.(pin).id][2] = 0
	}
	slices.SortStableFunc(pool, func(a, b overlayItem) int { return slices.Compare(free[a.ID], free[b.ID]) })
	return pool, err
}

var errSkipSubscription = errors.New("subscription skipped") // no call on it; the walk noted why

// blockedAs notes a refusal class that blocks the subscription refused (SPEC §7.2.4); the others are "".
var blockedAs = map[string]string{refusalRate: "rate limited: ", refusalQuota: "quota exhausted: "}

// subscriptionCredential is what a call of j on sub presents, an expired grant or one whose access token was just refused
// refreshed first (SPEC §7.2.3, §11.1). Skipped: a blocked sub when j rotates, one marked since the pool was read unless
// probed (j.pool), one no header could carry (a vault edited by hand: marked for a sign-in, SPEC §17).
func (e *engine) subscriptionCredential(ctx context.Context, j *job, sub overlayItem, token string) (upstreamCredential, error) {
	if until := e.ledger.blockedUntil(sub.ID); j.rotate && !until.IsZero() {
		e.blocks = append(e.blocks, until)
		e.note(sub.ID, "blocked until "+until.UTC().Format(time.RFC3339))
		return upstreamCredential{}, errSkipSubscription
	} else if j.pool == nil && e.ledger.entry(sub.ID).Credential.State != credActive { // the probe may revive it
		e.note(sub.ID, "credential refused meanwhile; sign in again")
		return upstreamCredential{}, errSkipSubscription
	} else if slices.Contains(e.skipped, sub.ID) { // its refresh failed: a later candidate of its provider walks the pool again
		return upstreamCredential{}, errSkipSubscription
	}
	vc, err := e.inv.credential(sub.ID) // its refusal is SPEC §2.2's
	if err != nil {
		return upstreamCredential{}, err
	}
	cred := upstreamCredential{APIKey: vc.APIKey}
	if g := vc.OAuth; g != nil {
		if token != "" || (expiredForRequest(*g, e.now()) && !slices.Contains(e.refreshed, sub.ID)) {
			e.refreshed = append(e.refreshed, sub.ID)
			ng, err := e.oauth.refresh(ctx, sub.ID, sub.Provider, token)
			if errors.Is(err, errRefreshSuperseded) { // a sign-in replaced the grant meanwhile: the call uses its (SPEC §11.1)
				return e.subscriptionCredential(ctx, j, sub, "")
			} else if err != nil && ctx.Err() != nil { // the caller hung up while it waited: no skip, no call (SPEC §7.4)
				return upstreamCredential{}, refuse("client_cancelled", "the caller went away during a grant refresh").because(err)
			} else if re, ok := errors.AsType[*endpointError](err); ok && !re.Definitive {
				e.refreshTransport = cmp.Or(e.refreshTransport, refuse("dependency_unavailable", "%s", redact(re.Error())).because(err))
				e.maint.request("credential_refresh_transport_failure", e.agent)
			}
			if err != nil {
				e.note(sub.ID, "grant refresh failed: "+redact(err.Error()))
				e.skipped = append(e.skipped, sub.ID)
				return upstreamCredential{}, errSkipSubscription
			}
			if g = &ng; token != "" {
				e.note(sub.ID, "refused the access token; refreshed")
			}
		}
		cred = upstreamCredential{AccessToken: g.AccessToken, AccountID: g.AccountID}
	}
	if controlAt(cred.APIKey+cred.AccessToken+cred.AccountID) >= 0 {
		const why = "the vault's credential holds a control character and cannot be sent; sign in again"
		e.ledger.disown(sub.ID, sub.Provider, why)
		e.note(sub.ID, why)
		return upstreamCredential{}, errSkipSubscription
	}
	return cred, nil
}

// deps are the state files every command and the server share.
type deps struct {
	st      state
	vault   *vault
	journal *journal
	reg     *registry
	clients *clientStore
}

// core is the daemon's parts that the server and every request's engine share, built once by serve.
type core struct {
	deps       // the state files
	sys        // log, now
	getenv     func(string) string
	localCreds map[string]string // -local-credentials-stdin's keys; non-nil: the only direct ones (SPEC §16)
	client     *http.Client      // provider calls: no timeout, no redirects, no proxy
	catalog    *catalog
	perf       *perfRegistry
	attempts   atomic.Int64 // provider calls made since start, for /metrics
	ledger     *ledger
	inv        *inventory
	oauth      *oauthClient
	pins       sync.Map // agent "\x00" provider → the subscription that last served it (pin)
	maint      *maintainer
}

// directKey is provider's direct API key (SPEC §7.1): -local-credentials-stdin's when given (then the only source, §16),
// else the vault's, whose read may fail.
func (c *core) directKey(provider string) (string, error) {
	if c.localCreds != nil {
		return c.localCreds[provider], nil
	} else if doc, err := c.vault.load(); err == nil {
		return doc.Direct[provider].APIKey, nil
	} else if !errors.Is(err, errNoState) { // no state directory: no key
		return "", err
	}
	return "", nil
}

func (c *core) hasDirect(provider string) bool {
	key, _ := c.directKey(provider)
	return key != ""
}

// anyDirectPayer: a direct credential or a declared deployment could serve without an agent (SPEC §13, §14).
func (c *core) anyDirectPayer() bool {
	doc, err := c.reg.current()
	keyed := slices.ContainsFunc(providerTable, func(p providerInfo) bool { return c.hasDirect(p.id) })
	return keyed || err == nil && len(doc.Deployments) > 0
}
