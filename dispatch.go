package main

import (
	"bytes"
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
	"sync"
	"time"
)

// keepAliveEvery is how long a stream may be silent before Brama writes an
// SSE comment (SPEC §7.5). It writes; it never cuts.
const keepAliveEvery = 15 * time.Second

// handleChat serves POST /v1/chat/completions, /v1/messages and
// /v1/responses for one caller dialect: read the head, resolve, pay, call.
// The whole body is parsed only when a call crosses formats (SPEC §7.6);
// for a route whose protocol is known now, a refusal of that parse is a
// 400 before any call.
func (s *server) handleChat(dialect string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ri := infoFrom(r.Context())
		req, err := readCallerRequest(dialect, r, ri.body)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		ri.requestedModel, ri.streamed = req.head.Model, req.head.Stream
		c, cands, err := s.planChat(ri, req)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		route := func(w http.ResponseWriter, r *http.Request) {
			switch c.res.Mode {
			case modeDirect, modeAlias:
				s.dispatch(w, r, req, c)
			case modeSubscription:
				s.walkSubscriptionRoute(w, r, req, c.res, ri.agentID)
			default:
				s.walkSelector(w, r, req, cands, ri.agentID)
			}
		}
		// SPEC §12: a signed answer reserves its key only now, after every
		// check plan made. An empty header value is refused, not ignored.
		if _, asked := r.Header["Idempotency-Key"]; asked {
			s.answers.signedAnswer(w, r, req.head, r.Header.Get("Idempotency-Key"), route)
			return
		}
		s.replayGuarded(w, r, route) // SPEC §8.1's replay guard (replay.go)
	}
}

// planChat is plan for a chat request, plus what only a chat call needs
// before dispatch: the output limit of a known route (SPEC §6.4), the
// candidates of a selector, and the translation parse when any call will
// cross formats.
func (s *server) planChat(ri *requestInfo, req *callerRequest) (call, []resolution, error) {
	c, err := s.plan(ri, &req.head)
	if err != nil {
		return call{}, nil, err
	}
	targets := []resolution{c.res}
	var cands []resolution
	switch c.res.Mode {
	case modeDirect, modeAlias, modeSubscription:
		if err := s.applyMaxTokens(&req.head, c.res); err != nil {
			return call{}, nil, err
		}
	default:
		if cands, err = s.candidates(c.res, ri.agentID); err != nil {
			return call{}, nil, err
		}
		targets = cands
	}
	for _, t := range targets {
		if req.translates(t.Provider) {
			return c, cands, req.parseForTranslation()
		}
	}
	return c, cands, nil
}

// call is one planned provider call: where, with what, as which model.
type call struct {
	res     resolution
	baseURL string
	cred    upstreamCredential
}

// plan resolves a request's head and applies every check made before
// dispatch but §6.4's output limit (planChat's): allowlist, model name,
// who pays and billingTarget.
// A direct or alias route also gets its credential here (a missing one is
// a refusal at dispatch, attempts 0). It knows nothing about HTTP.
func (s *server) plan(ri *requestInfo, req *chatRequest) (call, error) {
	if err := checkAllowed(ri.client, req.Model); err != nil {
		return call{}, err
	}
	doc, docErr := s.reg.current()
	res, err := resolveModel(req.Model, doc, docErr, s.hasDirect, req.BillingTarget != nil)
	if err != nil {
		return call{}, err
	}
	ri.routingMode, ri.route = res.Mode, res.Route
	if res.Mode != modeDirect && res.Mode != modeAlias {
		if ri.agentID == "" {
			return call{}, refuse("unauthenticated", "this route is paid by an agent's subscription; sign the request or use a bearer bound to an agent")
		}
		if bt := req.BillingTarget; bt != nil {
			if res.Mode != modeSubscription {
				return call{}, refuse("invalid_request", "billingTarget names one subscription; use it with a provider/model route, not %q", req.Model)
			}
			if err := s.checkBillingTarget(bt, res.Provider.id, ri.agentID); err != nil {
				return call{}, err
			}
		}
		return call{res: res}, nil
	}
	c := call{res: res, baseURL: res.BaseURL}
	p := res.Provider
	if p.cred == credDirect {
		key, err := s.directCredential(p.id)
		if err != nil {
			return call{}, err
		}
		c.cred.APIKey = key
		if c.baseURL, err = providerBaseURL(p, s.getenv); err != nil {
			return call{}, refuse("dependency_unavailable", "provider %q has an unusable base URL: %v", p.id, err).withAttempts(0)
		}
	}
	return c, nil
}

// applyMaxTokens is SPEC §6.4's rule: the caller's max_tokens, else the
// model's own output limit, else omitted, except that anthropic-messages
// requires one and is refused before any call. Codex never gets one (§6.2).
// Brama adds no ceiling of its own.
func (s *server) applyMaxTokens(req *chatRequest, res resolution) error {
	p := res.Provider
	if req.MaxTokens != 0 || p.id == "codex" {
		return nil
	}
	limit, cause := s.catalog.outputLimit(p.id, res.Model)
	switch {
	case limit > 0:
		req.MaxTokens = limit
	case p.protocol == protoAnthropic:
		return refuse("invalid_request", "max_tokens is required: the model's own limit is unknown (%s)", cause)
	}
	return nil
}

// checkAllowed applies a client's allowed_models (SPEC §3.1).
func checkAllowed(c client, model string) error {
	if c.AllowedModels != nil && !slices.Contains(c.AllowedModels, model) {
		return refuse("forbidden", "this client may not use model %q", model)
	}
	return nil
}

// directCredential is the deployment's API key for provider (SPEC §7.1).
func (s *server) directCredential(provider string) (string, error) {
	if s.localCreds != nil {
		if k := s.localCreds[provider]; k != "" {
			return k, nil
		}
		return "", refuse("credential_unauthorized", "no direct credential for provider %q", provider).withAttempts(0)
	}
	doc, err := s.vault.load()
	if err != nil && !errors.As(err, new(*noStateError)) {
		return "", refuse("credential_unauthorized", "the vault is unreadable; no credential can be produced").because(err).withAttempts(0)
	}
	if doc == nil || doc.Direct[provider].APIKey == "" {
		return "", refuse("credential_unauthorized", "no direct credential for provider %q", provider).withAttempts(0)
	}
	return doc.Direct[provider].APIKey, nil
}

// presented is the secret a call shows the provider, for redaction.
func (c call) presented() string {
	if c.cred.APIKey != "" {
		return c.cred.APIKey
	}
	return c.cred.AccessToken
}

// dispatch makes the one provider call of a direct or alias route (SPEC
// §7.1) and answers the caller: the provider's answer (passthrough), a
// translated one, or exactly one classified refusal.
func (s *server) dispatch(w http.ResponseWriter, r *http.Request, req *callerRequest, c call) {
	start := s.now()
	a := s.callRoute(r.Context(), req, c)
	if !a.sent { // the request could not be encoded: refused before any call
		s.fail(w, r, a.err)
		return
	}
	if ae := a.failure(); ae != nil {
		s.settle(r, c, start, usage{}, ae.withAttempts(1))
		s.fail(w, r, ae)
		return
	}
	// SPEC §7.6: an alias or a direct route answers as requested.
	u, ae, streamed := s.deliver(w, r, req.head.Model, req, c, a.resp, 1)
	s.conclude(w, r, c, start, u, ae, streamed)
}

// conclude records a committed call's spend once (settle) and ends the
// response: nothing more after a success, the refusal after a buffered
// failure, and after a stream failure, whose in-band error is already
// written, the abort: after commit the body is never cleanly terminated
// (SPEC §7.5). This is the one place a response is aborted.
func (s *server) conclude(w http.ResponseWriter, r *http.Request, c call, start time.Time, u usage, ae *apiError, streamed bool) {
	if streamed {
		// failStream decided whether the caller had hung up before it saw
		// the in-band error; hanging up after it is what a caller does.
		s.record(r, c, start, u, ae)
	} else {
		s.settle(r, c, start, u, ae)
	}
	switch {
	case ae == nil:
	case streamed:
		panic(http.ErrAbortHandler)
	default:
		s.fail(w, r, ae)
	}
}

// attempt is one provider call's outcome before anything reaches the caller.
type attempt struct {
	sent    bool             // the request left Brama (one attempt); false when it could not be encoded
	resp    *http.Response   // 2xx: the call committed; the body is unread
	refusal *providerRefusal // a complete non-2xx answer, classified
	err     *apiError        // no answer: a transport failure or a cut refusal body
}

// failure is the refusal a caller gets for a call that did not commit.
func (a attempt) failure() *apiError {
	switch {
	case a.err != nil:
		return a.err
	case a.refusal != nil:
		return a.refusal.err
	}
	return nil
}

// callRoute makes one call of a caller's request: passthrough when the
// caller's format is the provider's protocol, else translation (SPEC §7.6).
func (s *server) callRoute(ctx context.Context, req *callerRequest, c call) attempt {
	if req.translates(c.res.Provider) {
		return s.callProvider(ctx, req.translated(), c)
	}
	httpReq, err := buildPassthroughRequest(ctx, c, req)
	if err != nil {
		return attempt{err: asAPIError(err)}
	}
	return s.send(httpReq, c)
}

// callProvider makes exactly one translated provider call (one attempt)
// of a neutral request.
func (s *server) callProvider(ctx context.Context, req chatRequest, c call) attempt {
	httpReq, err := buildUpstreamRequest(ctx, c.res.Provider, c.baseURL, c.cred, req, c.res.Model)
	if err != nil {
		return attempt{err: asAPIError(err)}
	}
	return s.send(httpReq, c)
}

// send makes one provider call (one attempt). It reads a refusal whole; a
// 2xx body is left for deliver.
func (s *server) send(httpReq *http.Request, c call) attempt {
	p := c.res.Provider
	infoFrom(httpReq.Context()).countAttempt()
	s.attempts.Add(1)
	resp, err := s.client.Do(httpReq)
	if err != nil {
		return attempt{sent: true, err: classifyTransport(err)}
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return attempt{sent: true, resp: resp}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return attempt{sent: true, err: refuse("provider_incomplete", "provider %q answered %d and its body was cut after %d bytes", p.id, resp.StatusCode, len(body)).because(err)}
	}
	ref := classifyRefusal(p.id, resp.StatusCode, resp.Header, body, c.presented(), s.now())
	return attempt{sent: true, refusal: &ref}
}

// deliver answers the caller from a committed call, buffered or streamed:
// the provider's own answer on passthrough, else translated naming model.
// attempts is the calls made so far. A buffered failure is returned
// unwritten; a stream failure has already been written in-band (streamed
// is true) and the caller must abort the response.
func (s *server) deliver(w http.ResponseWriter, r *http.Request, model string, req *callerRequest, c call, resp *http.Response, attempts int) (u usage, failure *apiError, streamed bool) {
	defer resp.Body.Close()
	w.Header().Set("Brama-Route", c.res.Route)
	p := c.res.Provider
	switch {
	case !req.translates(p) && req.head.Stream:
		u, failure = s.relayPassthroughStream(w, r, req, c, resp, attempts)
		return u, failure, true
	case !req.translates(p):
		u, failure = s.relayBuffered(w, req, c, resp, attempts)
		return u, failure, false
	}
	tr := req.translated()
	if dropped := tr.droppedFor(p); len(dropped) > 0 { // SPEC §7.6: nothing is dropped silently
		w.Header().Set("Brama-Dropped", strings.Join(dropped, ", "))
		infoFrom(r.Context()).dropped = dropped
	}
	if req.head.Stream {
		u, failure = s.relayStream(w, r, req.dialect, model, tr, c, resp, attempts)
		return u, failure, true
	}
	var a chatAnswer
	var err error
	if upstreamStreams(p, req.head) {
		a, err = assembleStream(p.protocol, resp.Body)
	} else {
		var body []byte
		body, err = io.ReadAll(resp.Body)
		if err != nil {
			err = refuse("provider_incomplete", "provider %q answer was cut after %d bytes", p.id, len(body)).because(err)
		} else {
			a, err = decodeUpstreamAnswer(p.protocol, body)
		}
	}
	if err != nil {
		return u, asAPIError(err).redactedFor(c.presented()).withAttempts(attempts), false
	}
	a.Model = model
	out, err := renderAnswer(req.dialect, tr, a)
	if err != nil {
		return a.Usage, refuse("internal_error", "the answer could not be encoded").because(err).withAttempts(attempts), false
	}
	w.Header().Set("Brama-Attempts", strconv.Itoa(attempts))
	writeRaw(w, http.StatusOK, out)
	return a.Usage, nil, false
}

// settle records one request's spend and outcome once, however it ended:
// the perf registry and the log line's tokens and outcome. A failure
// while the caller has hung up is client_cancelled.
func (s *server) settle(r *http.Request, c call, start time.Time, u usage, failure *apiError) {
	s.record(r, c, start, u, failure)
	if failure != nil && r.Context().Err() != nil {
		infoFrom(r.Context()).outcome = "client_cancelled"
	}
}

// record is settle with the failure's own code as the outcome.
func (s *server) record(r *http.Request, c call, start time.Time, u usage, failure *apiError) {
	ri := infoFrom(r.Context())
	ri.inputTokens, ri.outputTokens = u.InputTokens, u.OutputTokens
	s.perf.record(c.res.Route, failure == nil, s.now().Sub(start), u.OutputTokens)
	if failure != nil {
		ri.outcome, ri.retryable = failure.Code, failure.body().Error.Retryable
	}
}

// streamAnswer is the caller side of a committed stream, translated or
// passed through: the SSE headers, one lock shared by the relay and the
// keep-alive timer, and the dialect's stream writer for keep-alives and
// the in-band error (SPEC §7.5).
type streamAnswer struct {
	mu        sync.Mutex // guards cs, w, unflushed and ended
	w         io.Writer
	flush     func()
	cs        callerStream
	unflushed bool // write wrote bytes not yet flushed
	ended     bool
	every     time.Duration
	timer     *time.Timer
}

// openStreamAnswer sends the caller its 200 and starts the keep-alive
// timer: an SSE comment after every 15 s without an event. model is the
// name the dialect's own events report; req's tools name translated calls.
func (s *server) openStreamAnswer(w http.ResponseWriter, dialect string, req chatRequest, model string, attempts int) *streamAnswer {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Set("Brama-Attempts", strconv.Itoa(attempts))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	flush := func() { rc.Flush() }
	sa := &streamAnswer{w: w, flush: flush, cs: newCallerStream(dialect, req, w, flush, model), every: cmp.Or(s.keepAlive, keepAliveEvery)}
	sa.timer = time.AfterFunc(sa.every, func() {
		sa.mu.Lock()
		defer sa.mu.Unlock()
		if !sa.ended {
			sa.timer.Reset(sa.every)
			sa.cs.keepAlive()
		}
	})
	return sa
}

// do runs f under the lock and restarts the silence timer; nothing runs
// once the stream is closed.
func (sa *streamAnswer) do(f func() error) error {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.ended {
		return nil
	}
	sa.timer.Reset(sa.every)
	return f()
}

// write relays one event's bytes as received. They are flushed by
// flushWritten, which the relay calls before it may wait on the provider,
// so no event waits in Brama for a later one (SPEC §7.5).
func (sa *streamAnswer) write(b []byte) error {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.ended {
		return nil
	}
	sa.unflushed = true
	_, err := sa.w.Write(b)
	return err
}

// flushWritten flushes what write left unflushed and restarts the silence
// timer: the caller has just received an event.
func (sa *streamAnswer) flushWritten() {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.unflushed && !sa.ended {
		sa.flush()
		sa.unflushed = false
		sa.timer.Reset(sa.every)
	}
}

// close stops the timer: nothing more is written.
func (sa *streamAnswer) close() {
	sa.mu.Lock()
	defer sa.mu.Unlock()
	sa.ended = true
	sa.timer.Stop()
}

// failStream writes the dialect's in-band error for a stream that failed
// after commit and returns it; the caller aborts the response.
func (s *server) failStream(r *http.Request, sa *streamAnswer, c call, err error, attempts int) *apiError {
	ae := asAPIError(err).redactedFor(c.presented()).withAttempts(attempts)
	if r.Context().Err() != nil {
		ae = refuse("client_cancelled", "the caller hung up during the stream").because(err).withAttempts(attempts)
	}
	s.rememberRefusal(r, ae)
	sa.do(func() error { return sa.cs.fail(ae) })
	s.log.Warn("stream_failed_after_commit", "request_id", infoFrom(r.Context()).id, "code", ae.Code, "cause", redact(fmt.Sprint(ae.Err), c.presented()))
	return ae
}

// rememberRefusal lets the replay guard remember a stream's failure
// before the caller reads it in-band (SPEC §8.1): a caller that falls back
// at once to a buffered call of the same conversation, or hangs up first,
// must still meet it. replayGuarded remembers it again when the handler
// ends, under the same rules.
func (s *server) rememberRefusal(r *http.Request, ae *apiError) {
	g, ri := s.replay, infoFrom(r.Context())
	if g == nil || g.window <= 0 {
		return
	}
	ri.outcome, ri.retryable = ae.Code, ae.body().Error.Retryable
	if e, ok := (&replayRecorder{}).refusal(ri, r); ok {
		g.rememberRequest(ri.client.ID, ri.agentID, ri.body, e)
	}
}

// relayStream translates a committed provider stream to the caller's
// dialect, flushing every event. After commit nothing is retried: a failure
// writes the dialect's in-band error and is returned so the caller aborts
// the response (SPEC §7.5).
func (s *server) relayStream(w http.ResponseWriter, r *http.Request, dialect, model string, req chatRequest, c call, resp *http.Response, attempts int) (usage, *apiError) {
	sa := s.openStreamAnswer(w, dialect, req, model, attempts)
	defer sa.close()
	var u usage
	err := sa.do(sa.cs.start)
	if err == nil {
		err = readUpstreamStream(c.res.Provider.protocol, resp.Body, func(ev streamEvent) error {
			if ev.Kind == eventUsage {
				u = ev.Usage
			}
			return sa.do(func() error { return sa.cs.event(ev) })
		})
	}
	if err == nil {
		err = sa.do(sa.cs.finish)
	}
	if err == nil {
		return u, nil
	}
	return u, s.failStream(r, sa, c, err, attempts)
}

// handleEmbeddings serves POST /v1/embeddings: a direct or alias route to an
// openai-chat provider, one call, the provider's JSON returned as is.
func (s *server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	var body map[string]json.RawMessage
	if err := json.Unmarshal(ri.body, &body); err != nil || body == nil {
		s.fail(w, r, refuse("invalid_request", "the body must be a JSON object"))
		return
	}
	var req chatRequest
	if err := json.Unmarshal(body["model"], &req.Model); err != nil || req.Model == "" {
		s.fail(w, r, refuse("invalid_request", "model must be a non-empty string"))
		return
	}
	ri.requestedModel = req.Model
	c, err := s.plan(ri, &req)
	if err == nil && c.res.Mode != modeDirect && c.res.Mode != modeAlias {
		err = refuse("invalid_request", "embeddings take a direct or alias route; %q is paid by a subscription", req.Model)
	}
	if err == nil && c.res.Provider.protocol != protoOpenAIChat {
		err = refuse("invalid_request", "embeddings need an openai-chat provider; %q speaks %s", c.res.Provider.id, c.res.Provider.protocol)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	body["model"], _ = json.Marshal(c.res.Model)
	out, _ := json.Marshal(body)
	upReq, err := http.NewRequestWithContext(r.Context(), "POST", c.baseURL+"/embeddings", bytes.NewReader(out))
	if err != nil {
		s.fail(w, r, refuse("internal_error", "the provider request could not be built").because(err))
		return
	}
	upReq.Header.Set("Content-Type", "application/json")
	if c.cred.APIKey != "" {
		upReq.Header.Set("Authorization", "Bearer "+c.cred.APIKey)
	}
	start := s.now()
	ri.countAttempt()
	s.attempts.Add(1)
	var failure *apiError
	resp, err := s.client.Do(upReq)
	var b []byte
	if err == nil {
		defer resp.Body.Close()
		b, err = io.ReadAll(resp.Body)
		switch {
		case err != nil:
			failure = refuse("provider_incomplete", "provider %q answer was cut after %d bytes", c.res.Provider.id, len(b)).because(err)
		case resp.StatusCode < 200 || resp.StatusCode > 299:
			failure = classifyRefusal(c.res.Provider.id, resp.StatusCode, resp.Header, b, c.presented(), s.now()).err
		}
	} else {
		failure = classifyTransport(err)
	}
	if failure != nil {
		failure.withAttempts(1)
	}
	s.settle(r, c, start, usage{}, failure)
	if failure != nil {
		s.fail(w, r, failure)
		return
	}
	w.Header().Set("Brama-Attempts", "1")
	writeRaw(w, http.StatusOK, b)
}
