package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The attempt engine (SPEC §7): plan checks before dispatch, attemptRoute walks candidates and payers within the budget
// table, send counts each call, commit holds the one abort, settle records spend once. Every call kind uses it.

// routeKind is what the budget table is keyed by.
type routeKind int

const (
	kindSelector     routeKind = iota // one candidate of any, any-vision-capable or best (§7.3)
	kindDirect                        // a direct or alias route (SPEC §7.1)
	kindSubscription                  // an explicit subscription route (§7.2)
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

// engine is one request's attempt engine: the daemon's parts, the log line's tally, and the walk's account of its calls
// and skips, from which a walk without an answer chooses its one refusal (§7.2.5).
type engine struct {
	*core
	agent              string      // the paying agent of this request ("" for a direct route)
	t                  *tally      // the request's record (server.go's requestInfo) written in place
	reasons            []string    // "<subscription id or route>: <reason>"
	rate, quota, auth  bool        // a call was refused 429, for quota, 401/403
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
	input, output int
	route         string // the route that answered (a selector's: its candidate)
	dropped       []string
	remember      func(ae *apiError, attempts int, hungUp, streamed bool) // the replay guard's (SPEC §8.1); nil: none
}

// job is how a request's calls are built and a committed one is answered;
// commit's streamed says a failure was written in-band.
type job struct {
	kind   routeKind
	pool   []overlayItem // the probe's one subscription; nil: the agent's eligible pool
	build  func(ctx context.Context, c call, req *callerRequest) (*http.Request, error)
	commit func(ctx context.Context, c call, req *callerRequest, resp *http.Response) (u usage, failure *apiError, streamed bool)
}

// plan resolves a request's head and makes every check before dispatch but
// §6.4's output limit: allowlist, model, who pays, direct key.
func (e *engine) plan(cl client, req *chatRequest) (call, error) {
	if !cl.mayUse(req.Model) { // SPEC §3.1
		return call{}, refuse("forbidden", "this client may not use model %q", req.Model)
	}
	doc, docErr := e.reg.current()
	res, err := resolveModel(req.Model, doc, docErr, func(p string) bool { // an unreadable vault: its refusal (SPEC §2.2)
		key, err := e.directKey(p)
		return key != "" || err != nil
	})
	if err != nil {
		return call{}, err
	}
	c := call{res: res, baseURL: res.BaseURL}
	switch {
	case res.Mode != modeDirect && res.Mode != modeAlias:
		if e.agent == "" {
			err = refuse("forbidden", "this route is paid by an agent's subscriptions; use a bearer bound to an agent: brama clients add ID -agent AGENT")
		}
	case res.Provider.cred == credDirect:
		key, vaultErr := e.directKey(res.Provider.id)
		switch {
		case vaultErr != nil:
			err = refuse("credential_unauthorized", "the vault is unreadable").because(vaultErr).withAttempts(0)
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
	if c, err = e.plan(cl, &req.head); err != nil {
		return c, nil, err
	}
	if models := req.body.value("models"); cl.AllowedModels != nil && c.res.Provider.id == "openrouter" && models != nil {
		var names []string // OpenRouter's fallbacks: the allowlist holds for each (SPEC §3.1)
		if json.Unmarshal(models, &names) != nil {
			return c, nil, refuse("forbidden", "this client may not use models: it must be a list of model names")
		}
		if i := slices.IndexFunc(names, func(m string) bool { return !cl.mayUse("openrouter/" + m) }); i >= 0 {
			return c, nil, refuse("forbidden", "this client may not use model %q (named in models)", "openrouter/"+names[i])
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
		req.neutral = new(chatRequest) // the whole body parsed once, at plan time
		*req.neutral, err = formatOf(req.dialect).parse(req.body.src)
	}
	return c, cands, err
}

// applyMaxTokens is SPEC §6.4's rule: the caller's limit, else the model's,
// else none but on anthropic-messages (refused); codex never gets one.
func (e *engine) applyMaxTokens(req *chatRequest, res resolution) error {
	if req.MaxTokens != 0 || res.Provider.codex {
		return nil
	}
	limit, cause := e.catalog.outputLimit(res.Provider.id, res.Model)
	if limit <= 0 && res.Provider.protocol == protoAnthropic {
		return refuse("invalid_request", "max_tokens is required: the model's own limit is unknown (%s)", cause)
	}
	req.MaxTokens = max(limit, 0)
	return nil
}

// attemptRoute serves c with j (SPEC §7.1–§7.3): c's route, or a selector's candidates each with its own output limit,
// paid by a direct key, the probed subscription or the agent's pool (read when reached; one that refused all is skipped
// after). A rotating kind moves on only after a refusal proving nothing was generated: else cost or tool effects double.
func (e *engine) attemptRoute(ctx context.Context, j *job, c call, req *callerRequest, sels []resolution) *apiError {
	b, selecting := budgets[j.kind], j.kind == kindSelector
	if !selecting {
		sels = []resolution{c.res}
	}
	poolRefused, tried := map[string]bool{}, false
	var unfit *apiError // a candidate skipped: no max_tokens known, or a request its format cannot express
candidates:
	for _, res := range sels {
		p, cand, creq := res.Provider, c, req
		if cand.res = res; selecting {
			e.route = res.Route
		}
		queue, pays := []overlayItem{{}}, res.Mode != modeDirect && res.Mode != modeAlias // a direct key makes the one call
		if pays {
			var err error
			switch queue = j.pool; {
			case poolRefused[p.id]:
				e.note(res.Route, "skipped: every "+p.id+" subscription already refused")
				continue
			case queue == nil:
				if queue, err = e.eligible(p.id); err != nil {
					return asAPIError(err).withAttempts(e.t.attempts)
				}
			}
			if len(queue) == 0 {
				e.note(res.Route, fmt.Sprintf("no usable %q subscription", p.id))
				continue
			}
			if selecting {
				head := req.head
				if err = e.applyMaxTokens(&head, res); err != nil {
					unfit = asAPIError(err)
					e.note(res.Route, "skipped: "+unfit.Message)
					continue
				}
				limited := *req
				limited.head.MaxTokens = head.MaxTokens
				creq = &limited
			}
			if cand.baseURL, err = e.baseURL(p); err != nil {
				return asAPIError(err)
			}
		}
		begin, before, rejected := e.now(), e.t.attempts, false
		for calls := 0; len(queue) > 0 && calls < b.calls && !rejected; {
			c, sub := cand, &queue[0]
			queue = queue[1:]
			var err error
			if !pays {
				sub = nil
			} else if c.cred, err = e.subscriptionCredential(ctx, j.kind, *sub, ""); errors.Is(err, errSkipSubscription) {
				continue
			} else if err != nil {
				return asAPIError(err).withAttempts(e.t.attempts)
			}
			start := e.now()
			hr, err := j.build(ctx, c, creq)
			if ae := asAPIError(err); err != nil && selecting && ae.Code == "invalid_request" {
				unfit = ae // its format cannot express the request (SPEC §7.6)
				e.note(res.Route, "skipped: "+ae.Message)
				continue candidates
			} else if err != nil && e.t.attempts > 0 { // the request could not be built: nothing was called
				return ae.withAttempts(e.t.attempts)
			} else if err != nil {
				return ae
			}
			made := e.t.attempts
			resp, ref, failure := e.send(hr, c, sub)
			calls++
			if resp != nil {
				return e.commit(ctx, j, c, creq, sub, resp, start)
			}
			if sub != nil && b.rotate && e.t.attempts > made { // none once the caller hung up: no use of sub
				e.ledger.recordUse(sub.ID, p.id, false, 0, 0)
			}
			switch {
			case ref == nil || !b.rotate && j.pool == nil: // a transport failure or cut body is potentially billable
			case ref.class == refusalAuth: // the probe's is recorded, not retried
				e.auth = true
				if (!b.rotate || c.cred.AccessToken == "" || slices.Contains(e.refreshed, sub.ID)) && !e.credentialReplaced(*sub, c.cred) {
					e.ledger.setCredential(sub.ID, p.id, credNeedsReauth, cmp.Or(ref.sentence, ref.err.Message))
					e.note(sub.ID, "authentication refused: "+ref.sentence)
				} else if _, err := e.subscriptionCredential(ctx, j.kind, *sub, c.cred.AccessToken); err == nil && calls < b.calls {
					queue = append([]overlayItem{*sub}, queue...) // refreshed: retried while a call remains
				} else if err != nil && !errors.Is(err, errSkipSubscription) {
					return asAPIError(err).withAttempts(e.t.attempts)
				}
				continue
			case ref.class == refusalRate || ref.class == refusalQuota:
				e.blocks = append(e.blocks, e.block(*sub, ref.retryAfter, ref.sentence))
				e.rate, e.quota = e.rate || ref.class == refusalRate, e.quota || ref.class == refusalQuota
				e.note(sub.ID, map[bool]string{true: "rate limited: ", false: "quota exhausted: "}[ref.class == refusalRate]+ref.sentence)
				continue
			case ref.class == refusalModel && selecting: // the next candidate may take the request
				e.rejectedStatus, rejected = ref.err.Status(), true
				e.note(res.Route, "refused the request: "+ref.sentence)
				continue
			}
			return e.settle(ctx, j, c, start, usage{}, failure.withAttempts(e.t.attempts))
		}
		if e.t.attempts > before && b.spends { // calls all refused count as one failure of the route (SPEC §13)
			e.perf.record(res.Route, false, e.now().Sub(begin), 0)
		}
		poolRefused[p.id], tried = len(queue) == 0 && !rejected, true
	}
	return e.exhausted(c.res, tried, unfit)
}

// note records why the walk skipped or left who (a selector's: under its route).
func (e *engine) note(who, reason string) {
	if e.route != "" && who != e.route {
		who, reason = e.route, who+" "+reason
	}
	e.reasons = append(e.reasons, who+": "+reason)
}

// exhausted is the one refusal of a walk without an answer (SPEC §7.2.5):
// after calls, chosen from what they met; with none, from why not.
func (e *engine) exhausted(res resolution, tried bool, unfit *apiError) *apiError {
	n, list, route := e.t.attempts, strings.Join(e.reasons, "; "), cmp.Or(res.Route, res.Mode)
	needsSignIn := func() bool { // no subscription of the route's provider (of a selector's: any) is active
		items, err := e.inv.pool(e.agent, res.Provider.id) // a selector's has none: every provider
		active := func(it overlayItem) bool { return e.ledger.entry(it.ID).Credential.State == credActive }
		return err == nil && len(items) > 0 && !slices.ContainsFunc(items, active)
	}
	var ae *apiError
	switch {
	case !tried && unfit != nil: // every usable candidate needs a max_tokens nobody knows (SPEC §6.4) or another format
		return unfit
	case !tried && needsSignIn():
		ae = refuse("subscription_reauthorization_required", "no subscription of agent %q for %s is active; sign in again",
			e.agent, route)
	case !tried:
		ae = refuse("credential_unauthorized", "no subscription of agent %q can serve %s", e.agent, route)
	case n == 0 && e.refreshTransport != nil:
		ae = e.refreshTransport
	case n == 0 && len(e.blocks) > 0: // no call, so every block met was a skip
		ae = refuse("subscription_unavailable", "every eligible subscription is blocked: %s", list)
	case n == 0:
		ae = refuse("subscription_reauthorization_required", "no subscription could be refreshed; sign in again: %s", list)
	case e.rate:
		ae = refuse("provider_rate_limited", "the provider refused for rate: %s", list)
	case e.quota:
		ae = refuse("provider_quota_exhausted", "the provider says the quota is spent: %s", list)
	case e.auth:
		ae = refuse("subscription_reauthorization_required", "the provider refused the credentials; sign in again: %s", list)
	case e.rejectedStatus != 0: // a selector's calls all refused the request: the last status
		ae = refuse("provider_rejected", "every candidate refused the request: %s", list).withStatus(e.rejectedStatus)
	default:
		ae = refuse("provider_failure", "every candidate was refused: %s", list)
	}
	if ae.Status() == http.StatusTooManyRequests && len(e.blocks) > 0 { // SPEC §7.2.5
		ae.RetryAfter = max(slices.MinFunc(e.blocks, time.Time.Compare).Sub(e.now()), time.Second)
	}
	return ae.withAttempts(n)
}

// testingOnlyBeforeCall runs as send starts a call (nil in production).
var testingOnlyBeforeCall func(context.Context)

// send makes one provider call, the one place an attempt is counted: a 2xx with its body unread, else the failure (and a
// whole non-2xx's refusal); plan windows reach sub's ledger from every answer (SPEC §6.3).
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
	} else if sub != nil {
		e.ledger.recordWindows(sub.ID, p.id, parsePlanWindows(p.id, resp.Header, e.now()))
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, refuse("provider_incomplete", "provider %q answered %d and its body was cut after %d bytes", p.id, resp.StatusCode, len(body)).because(err)
	}
	ref := classifyRefusal(p.id, resp.StatusCode, resp.Header, body, c.cred.bearer(), e.now())
	return nil, &ref, ref.err
}

// commit answers from a committed call, never retried (SPEC §7.5), and keeps sub's ledger: spend, a success's pin until
// the earliest window reset, a block after an in-band rate or quota error. A failed stream aborts: the one abort.
func (e *engine) commit(ctx context.Context, j *job, c call, req *callerRequest, sub *overlayItem, resp *http.Response,
	start time.Time) *apiError {
	defer resp.Body.Close()
	p, now := c.res.Provider.id, e.now()
	u, ae, streamed := j.commit(ctx, c, req, resp)
	if sub != nil && budgets[j.kind].spends {
		e.ledger.recordUse(sub.ID, p, ae == nil, u.InputTokens, u.OutputTokens)
		led := e.ledger.entry(sub.ID) // its windows: this answer's and a usage report's (SPEC §7.2.2)
		until := now.Add(maxPin)
		for _, win := range led.Windows {
			if at := time.UnixMilli(win.ResetsAtMs); win.ResetsAtMs > 0 && at.After(now) && at.Before(until) {
				until = at
			}
		}
		if ae == nil { // only a success pins (SPEC §7.2.4)
			e.pins.Store(e.agent+"\x00"+p, pin{sub.ID, until})
		}
	}
	var se *upstreamStreamError
	if sub != nil && ae != nil && errors.As(ae, &se) && (se.Class == refusalRate || se.Class == refusalQuota) {
		e.block(*sub, retryAfter(resp.Header, now), "the provider ended a committed answer with "+se.Code)
	}
	if ae = e.settle(ctx, j, c, start, u, ae); ae != nil && streamed {
		panic(http.ErrAbortHandler)
	}
	return ae
}

// settle records a request's spend and outcome once, however it ended, and
// returns its refusal: client_cancelled when the caller hung up (SPEC §7.4).
func (e *engine) settle(ctx context.Context, j *job, c call, start time.Time, u usage, failure *apiError) *apiError {
	if failure != nil && ctx.Err() != nil && failure.Code != "client_cancelled" {
		failure = refuse("client_cancelled", "the caller went away while the provider answered").because(failure).withAttempts(e.t.attempts)
	}
	if !budgets[j.kind].spends {
		return failure
	}
	e.t.input, e.t.output = u.InputTokens, u.OutputTokens
	e.perf.record(c.res.Route, failure == nil, e.now().Sub(start), u.OutputTokens)
	if failure != nil {
		e.t.outcome, e.t.retryable = failure.Code, failure.Retryable
	}
	return failure
}

// serveChat answers a planned chat request on w, passthrough or translated
// (SPEC §7.6), or returns the refusal, told first to the replay guard (§8.1).
func (e *engine) serveChat(ctx context.Context, w http.ResponseWriter, req *callerRequest, c call, cands []resolution) *apiError {
	chatKinds := map[string]routeKind{modeDirect: kindDirect, modeAlias: kindDirect, modeSubscription: kindSubscription}
	j := &job{kind: chatKinds[c.res.Mode], // else a selector's
		build: buildChatRequest,
		commit: func(ctx context.Context, c call, req *callerRequest, resp *http.Response) (usage, *apiError, bool) {
			return e.deliver(ctx, w, c, req, resp)
		},
	}
	ae := e.attemptRoute(ctx, j, c, req, cands)
	if ae != nil && e.t.remember != nil { // the replay guard learns a refusal before the caller reads it
		e.t.remember(ae, e.t.attempts, ctx.Err() != nil, false)
	}
	return ae
}

// deliver answers from a committed call, passthrough or translated, naming the model asked (a selector's: its
// candidate's route); a stream's failure is written in-band (streamed), a buffered one not.
func (e *engine) deliver(ctx context.Context, w http.ResponseWriter, c call, req *callerRequest, resp *http.Response) (
	u usage, failure *apiError, streamed bool) {
	w.Header().Set("Brama-Route", c.res.Route)
	p, attempts, model := c.res.Provider, e.t.attempts, cmp.Or(e.route, req.head.Model)
	e.t.route = c.res.Route
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
			pw := &streamReader{protocol: p.protocol, dropUsage: req.addsUsage(p)}
			err = relayWatched(pw, resp.Body, sa.relay)
			u = pw.usage
		} else {
			u, err = sa.translate(p.protocol, resp.Body)
		}
		if err != nil {
			failure = asAPIError(err).redactedFor(c.cred.bearer()).withAttempts(attempts) // a hang-up's is settle's
			if e.t.remember != nil {                                                      // before the caller can read it and fall back
				e.t.remember(failure, attempts, ctx.Err() != nil, true)
			}
			sa.do(func() error { return sa.fail(failure) })
			e.log.Warn("stream_failed_after_commit", "request_id", e.t.requestID, "code", failure.Code, "cause", redact(fmt.Sprint(failure.Err), c.cred.bearer()))
		}
		return u, failure, true
	case pass:
		u, failure = relayBuffered(w, c, resp, attempts)
		return u, failure, false
	}
	a, err := readProviderAnswer(p, resp)
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
		writeJSON(w, http.StatusOK, map[string]int{"input_tokens": estimateInputTokens(req.body)})
		return nil
	}
	return e.once(ctx, c, req, &job{kind: kindCountTokens,
		build: func(ctx context.Context, c call, req *callerRequest) (*http.Request, error) {
			return req.passthrough(ctx, c, "/v1/messages/count_tokens", false)
		},
		commit: func(_ context.Context, c call, _ *callerRequest, resp *http.Response) (usage, *apiError, bool) {
			var ans struct {
				InputTokens *int `json:"input_tokens"`
			}
			b, err := readWhole(c.res.Provider, resp)
			if err == nil {
				if err = json.Unmarshal(b, &ans); err != nil || ans.InputTokens == nil {
					err = malformedAnswer(protoAnthropic, err)
				}
			}
			if err != nil {
				return usage{}, asAPIError(err).withAttempts(e.t.attempts), false
			}
			w.Header().Set("Brama-Route", c.res.Route)
			providerFacts(w.Header(), resp.Header, true)
			writeAnswer(w, "application/json", e.t.attempts, fmt.Appendf(nil, "{\"input_tokens\":%d}\n", *ans.InputTokens))
			return usage{}, nil, false
		}})
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
	return e.once(ctx, c, &callerRequest{}, &job{kind: kindEmbeddings,
		build: func(ctx context.Context, c call, _ *callerRequest) (*http.Request, error) {
			return newProviderRequest(ctx, c, nil, "/embeddings", out, false)
		},
		commit: func(_ context.Context, c call, _ *callerRequest, resp *http.Response) (usage, *apiError, bool) {
			w.Header().Set("Brama-Route", c.res.Route)
			u, ae := relayBuffered(w, c, resp, e.t.attempts) // a JSON object as received, else provider_failure
			return u, ae, false
		}})
}

// once is attemptRoute for count_tokens and embeddings: nil when answered.
func (e *engine) once(ctx context.Context, c call, req *callerRequest, j *job) error {
	if ae := e.attemptRoute(ctx, j, c, req, nil); ae != nil {
		return ae
	}
	return nil
}
