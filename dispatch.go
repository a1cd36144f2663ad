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
	"strconv"
	"strings"
	"time"
)

// The attempt engine (SPEC §7): plan checks a request before dispatch; the
// budget table bounds each candidate; attemptCandidate is the one loop over
// a direct key or a subscription pool, walkSelector the one walk over a
// selector's candidates; send makes and counts the one call; commit is the
// one abort after commit; settle records spend once. count_tokens,
// embeddings and the probe go through the same loop.

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
	spends bool // the call's spend is recorded (perf registry, the log line's tokens)
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

// candidate is one route with its credentials: a direct key or a pool.
type candidate struct {
	res     resolution
	baseURL string              // a direct route's; a pool's is the provider's
	key     *upstreamCredential // a direct route's one credential
	pool    []overlayItem
	req     *callerRequest // a chat call's request (a selector's with its limit)
	model   string         // the name a chat answer reports
}

// job is how a request's calls are built and a committed one is answered.
type job struct {
	kind  routeKind
	build func(ctx context.Context, cand *candidate, c call) (*http.Request, error)
	// commit answers from a committed call paid by sub (nil: a direct key);
	// streamed says a failure was written in-band.
	commit func(ctx context.Context, cand *candidate, c call, sub *overlayItem, resp *http.Response, attempts int) (u usage, failure *apiError, streamed bool)
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
		if c.cred.APIKey, err = e.directCredential(res.Provider.id); err == nil {
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

// directCredential is the deployment's API key for provider (SPEC §7.1).
func (e *engine) directCredential(provider string) (string, error) {
	key := e.localCreds[provider]
	if e.localCreds == nil {
		doc, err := e.vault.load()
		if err != nil && !errors.As(err, new(*noStateError)) {
			return "", vaultUnreadable(err).withAttempts(0)
		}
		if doc != nil {
			key = doc.Direct[provider].APIKey
		}
	}
	if key == "" {
		return "", refuse("credential_unauthorized", "no direct credential for provider %q", provider).withAttempts(0)
	}
	return key, nil
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

// routeOutcome says how one candidate's calls ended.
type routeOutcome int

const (
	routeAnswered routeOutcome = iota // the caller has its answer (success or the returned refusal)
	routeRefused                      // every credential of the pool refused or was skipped
	routeNext                         // the budget spent, a credential untried; or (selectors) the request refused
	routeUnfit                        // (selectors) no call: the candidate's format cannot express the request
)

// attemptCandidate makes one candidate's calls within its budget (SPEC
// §7.1–§7.3). A rotating kind moves on only after a refusal proving nothing
// was generated: a second call could double cost or tool effects.
func (e *engine) attemptCandidate(ctx context.Context, j *job, cand *candidate) (out routeOutcome, _ *apiError) {
	b, p, wk := budgets[j.kind], cand.res.Provider, &e.wk
	begin, before := e.now(), e.t.attempts
	defer func() { // calls all refused count as one failure of the route, as an answered refusal (SPEC §13)
		if out != routeAnswered && e.t.attempts > before && b.spends {
			e.perf.record(cand.res.Route, false, e.now().Sub(begin), 0)
		}
	}()
	c, queue := call{res: cand.res, baseURL: cand.baseURL}, []overlayItem{{}} // a direct route: one call on its key
	if cand.key == nil {
		var err error
		if c.baseURL, err = e.baseURL(p); err != nil {
			return routeAnswered, asAPIError(err)
		}
		queue = slices.Clone(cand.pool) // without rotation, the first usable credential makes the one call
	}
	for calls := 0; len(queue) > 0 && calls < b.calls; {
		sub := &queue[0]
		queue = queue[1:]
		if cand.key != nil {
			c.cred, sub = *cand.key, nil
		} else if until := e.ledger.blockedUntil(sub.ID); b.rotate && !until.IsZero() {
			wk.blocked = true
			wk.noteBlock(until)
			wk.note(sub.ID, "blocked until "+until.UTC().Format(time.RFC3339))
			continue
		} else if j.kind != kindProbe && e.ledger.credentialState(sub.ID) != credActive { // marked since the pool was read; the probe may revive it
			wk.note(sub.ID, "credential refused meanwhile; sign in again")
			continue
		} else if cred, err := e.subscriptionCredential(ctx, *sub, ""); errors.Is(err, errSkipSubscription) {
			continue
		} else if err != nil {
			return routeAnswered, asAPIError(err).withAttempts(e.t.attempts)
		} else {
			c.cred = cred
		}
		start := e.now()
		hr, err := j.build(ctx, cand, c)
		if err != nil { // the request could not be built: nothing was called
			ae := asAPIError(err)
			if j.kind == kindSelector && ae.Code == "invalid_request" { // its format cannot express the request (SPEC §7.6)
				return routeUnfit, ae
			}
			if e.t.attempts > 0 {
				ae = ae.withAttempts(e.t.attempts)
			}
			return routeAnswered, ae
		}
		made := e.t.attempts
		resp, ref, failure := e.send(hr, c, sub)
		calls++
		if resp != nil {
			return routeAnswered, e.commit(ctx, j, cand, c, sub, resp, start)
		}
		if sub != nil && b.rotate && e.t.attempts > made { // none once the caller hung up: no use of sub
			e.ledger.recordUse(sub.ID, p.id, false, 0, 0)
		}
		wk.last = ref
		switch {
		case !b.rotate || ref == nil: // a transport failure or cut body is potentially billable
		case ref.class == refusalAuth:
			wk.auth = true
			if (c.cred.AccessToken == "" || slices.Contains(wk.refreshed, sub.ID)) && !e.credentialReplaced(*sub, c.cred) {
				e.ledger.setCredential(sub.ID, p.id, credNeedsReauth, ref.sentence)
				wk.note(sub.ID, "authentication refused: "+ref.sentence)
				continue
			}
			// Refresh a grant not yet refreshed here, retry if a call remains.
			_, err := e.subscriptionCredential(ctx, *sub, c.cred.AccessToken)
			if err != nil && !errors.Is(err, errSkipSubscription) {
				return routeAnswered, asAPIError(err).withAttempts(e.t.attempts)
			}
			if err == nil {
				wk.note(sub.ID, "refused the access token; refreshed")
				if calls < b.calls {
					queue = append([]overlayItem{*sub}, queue...)
				}
			}
			continue
		case ref.class == refusalRate || ref.class == refusalQuota:
			e.blockFor(*sub, p.id, ref)
			continue
		case ref.class == refusalModel && j.kind == kindSelector:
			wk.rejectedStatus = ref.err.Status()
			wk.note(cand.res.Route, "refused the request: "+ref.sentence)
			return routeNext, nil
		}
		return routeAnswered, e.settle(ctx, j, cand, start, usage{}, failure.withAttempts(e.t.attempts))
	}
	if len(queue) > 0 {
		return routeNext, nil
	}
	return routeRefused, nil
}

// commit answers from a committed call, never retried (SPEC §7.5); a failed
// stream, its in-band error written, aborts the response: the one abort.
func (e *engine) commit(ctx context.Context, j *job, cand *candidate, c call, sub *overlayItem, resp *http.Response, start time.Time) *apiError {
	defer resp.Body.Close()
	u, ae, streamed := j.commit(ctx, cand, c, sub, resp, e.t.attempts)
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

// attemptRoute serves a direct or subscription route (req nil: a direct
// one's): its answer, or the walk's one refusal (SPEC §7.2.5).
func (e *engine) attemptRoute(ctx context.Context, j *job, c call, req *callerRequest) *apiError {
	cand := &candidate{res: c.res, baseURL: c.baseURL, key: &c.cred, req: req}
	if req != nil {
		cand.model = req.head.Model
	}
	if p := c.res.Provider.id; c.res.Mode == modeSubscription {
		subs, anyPool, err := e.eligible(e.agent, p)
		switch {
		case err != nil:
			return asAPIError(err)
		case !anyPool:
			return refuse("credential_unauthorized", "no %q subscription for agent %q", p, e.agent).withAttempts(0)
		case len(subs) == 0:
			return refuse("subscription_reauthorization_required", "no %q subscription of agent %q has an active credential; sign in again", p, e.agent).withAttempts(0)
		}
		cand.key, cand.pool = nil, subs
	}
	if out, ae := e.attemptCandidate(ctx, j, cand); out == routeAnswered {
		return ae
	}
	return e.exhausted()
}

// serveChat answers a planned chat request on w, or returns the refusal,
// told first to the replay guard (SPEC §8.1).
func (e *engine) serveChat(ctx context.Context, w http.ResponseWriter, req *callerRequest, c call, cands []resolution) *apiError {
	j := &job{ // passthrough or translated (SPEC §7.6), a paying subscription's ledger kept
		kind: kindSelector,
		build: func(ctx context.Context, cand *candidate, c call) (*http.Request, error) {
			if cand.req.translates(c.res.Provider) {
				return buildUpstreamRequest(ctx, c.res.Provider, c.baseURL, c.cred, cand.req.translated(), c.res.Model)
			}
			return buildPassthroughRequest(ctx, c, cand.req)
		},
		commit: func(ctx context.Context, cand *candidate, c call, sub *overlayItem, resp *http.Response, attempts int) (usage, *apiError, bool) {
			if sub == nil {
				return e.deliver(ctx, w, cand.model, cand.req, c, resp, attempts)
			}
			return e.answerSubscription(ctx, w, cand, c, *sub, resp, attempts)
		},
	}
	var ae *apiError
	switch c.res.Mode {
	case modeDirect, modeAlias:
		j.kind = kindDirect
		ae = e.attemptRoute(ctx, j, c, req)
	case modeSubscription:
		j.kind = kindSubscription
		ae = e.attemptRoute(ctx, j, c, req)
	default:
		ae = e.walkSelector(ctx, j, req, cands)
	}
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
func (e *engine) deliver(ctx context.Context, w http.ResponseWriter, model string, req *callerRequest, c call, resp *http.Response, attempts int) (u usage, failure *apiError, streamed bool) {
	w.Header().Set("Brama-Route", c.res.Route)
	e.t.route = c.res.Route
	p := c.res.Provider
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

// attemptOne serves a route outside chat: one call of kind, answered
// buffered by commit; a nil refusal is a nil error.
func (e *engine) attemptOne(ctx context.Context, kind routeKind, c call, build func(context.Context, call) (*http.Request, error), commit func(call, *http.Response, int) (usage, *apiError)) error {
	j := &job{kind: kind,
		build: func(ctx context.Context, _ *candidate, c call) (*http.Request, error) { return build(ctx, c) },
		commit: func(_ context.Context, _ *candidate, c call, _ *overlayItem, resp *http.Response, attempts int) (usage, *apiError, bool) {
			u, ae := commit(c, resp, attempts)
			return u, ae, false
		}}
	if ae := e.attemptRoute(ctx, j, c, nil); ae != nil {
		return ae
	}
	return nil
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
	return e.attemptOne(ctx, kindCountTokens, c, func(ctx context.Context, c call) (*http.Request, error) {
		return req.passthrough(ctx, c, "/v1/messages/count_tokens", false)
	}, func(c call, resp *http.Response, attempts int) (usage, *apiError) {
		var ans countTokensAnswer
		b, err := readWhole(c.res.Provider, resp)
		if err != nil {
			return usage{}, asAPIError(err).withAttempts(attempts)
		}
		if err := json.Unmarshal(b, &ans); err != nil || ans.InputTokens == nil {
			return usage{}, malformedAnswer(protoAnthropic, err).withAttempts(attempts)
		}
		w.Header().Set("Brama-Route", c.res.Route)
		w.Header().Set("Brama-Attempts", strconv.Itoa(attempts))
		providerFacts(w.Header(), resp.Header, true)
		writeJSON(w, http.StatusOK, ans)
		return usage{}, nil
	})
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
	return e.attemptOne(ctx, kindEmbeddings, c, func(ctx context.Context, c call) (*http.Request, error) {
		return newPassthroughRequest(ctx, c, nil, "/embeddings", out, false)
	}, func(c call, resp *http.Response, attempts int) (usage, *apiError) {
		w.Header().Set("Brama-Route", c.res.Route)
		return relayBuffered(w, &callerRequest{}, c, resp, attempts) // a JSON object as received, else provider_failure
	})
}
