package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// keepAliveEvery is how long a stream may be silent before Brama writes an
// SSE comment (SPEC §7.5). It writes; it never cuts.
const keepAliveEvery = 15 * time.Second

// handleChat serves POST /v1/chat/completions, /v1/messages and
// /v1/responses for one caller dialect: parse, resolve, pay, call.
func (s *server) handleChat(dialect string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ri := infoFrom(r.Context())
		req, err := parseRequest(dialect, ri.body)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		ri.requestedModel, ri.streamed = req.Model, req.Stream
		c, err := s.plan(ri, &req)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		route := func(w http.ResponseWriter, r *http.Request) {
			switch c.res.Mode {
			case modeDirect, modeAlias:
				s.dispatch(w, r, dialect, req, c)
			case modeSubscription:
				s.walkSubscriptionRoute(w, r, dialect, req, c.res, ri.agentID)
			default:
				s.walkSelector(w, r, dialect, req, c.res, ri.agentID)
			}
		}
		// SPEC §12: a signed answer reserves its key only now, after every
		// check plan made. An empty header value is refused, not ignored.
		if _, asked := r.Header["Idempotency-Key"]; asked {
			s.answers.signedAnswer(w, r, req, r.Header.Get("Idempotency-Key"), route)
			return
		}
		route(w, r)
	}
}

// call is one planned provider call: where, with what, as which model.
type call struct {
	res     resolution
	baseURL string
	cred    upstreamCredential
}

// plan resolves a parsed request and applies every check made before
// dispatch: allowlist, model name, who pays, billingTarget and max_tokens.
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
		switch res.Mode {
		case modeSubscription:
			if err := s.applyMaxTokens(req, res); err != nil {
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
	return c, s.applyMaxTokens(req, res)
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
// §7.1) and answers the caller: a buffered body, a translated stream, or
// exactly one classified refusal.
func (s *server) dispatch(w http.ResponseWriter, r *http.Request, dialect string, req chatRequest, c call) {
	start := s.now()
	a := s.callProvider(r.Context(), req, c)
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
	u, ae, streamed := s.deliver(w, r, dialect, req.Model, req, c, a.resp, 1)
	s.settle(r, c, start, u, ae)
	switch {
	case ae == nil:
	case streamed:
		panic(http.ErrAbortHandler) // after commit the body is never cleanly terminated (SPEC §7.5)
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

// callProvider makes exactly one provider call (one attempt). It reads a
// refusal whole; a 2xx body is left for deliver.
func (s *server) callProvider(ctx context.Context, req chatRequest, c call) attempt {
	p := c.res.Provider
	httpReq, err := buildUpstreamRequest(ctx, p, c.baseURL, c.cred, req, c.res.Model)
	if err != nil {
		return attempt{err: asAPIError(err)}
	}
	infoFrom(ctx).countAttempt()
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

// deliver answers the caller from a committed call, buffered or streamed,
// naming model. attempts is the calls made so far. A buffered failure is
// returned unwritten; a stream failure has already been written in-band
// (streamed is true) and the caller must abort the response.
func (s *server) deliver(w http.ResponseWriter, r *http.Request, dialect, model string, req chatRequest, c call, resp *http.Response, attempts int) (u usage, failure *apiError, streamed bool) {
	defer resp.Body.Close()
	p := c.res.Provider
	if upstreamStreams(p, req) && req.Stream {
		u, failure = s.relayStream(w, r, dialect, model, c, resp, attempts)
		return u, failure, true
	}
	var a chatAnswer
	var err error
	if upstreamStreams(p, req) {
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
		return u, asAPIError(err).withAttempts(attempts), false
	}
	a.Model = model
	out, err := renderAnswer(dialect, a)
	if err != nil {
		return a.Usage, refuse("internal_error", "the answer could not be encoded").because(err).withAttempts(attempts), false
	}
	w.Header().Set("Brama-Attempts", strconv.Itoa(attempts))
	writeRaw(w, http.StatusOK, out)
	return a.Usage, nil, false
}

// settle records one request's spend and outcome once, however it ended:
// the perf registry and the log line's tokens and outcome.
func (s *server) settle(r *http.Request, c call, start time.Time, u usage, failure *apiError) {
	ri := infoFrom(r.Context())
	ri.inputTokens, ri.outputTokens = u.InputTokens, u.OutputTokens
	s.perf.record(c.res.Route, failure == nil, s.now().Sub(start), u.OutputTokens)
	if failure != nil {
		ri.outcome, ri.retryable = failure.Code, failure.body().Error.Retryable
		if r.Context().Err() != nil {
			ri.outcome = "client_cancelled"
		}
	}
}

// relayStream translates a committed provider stream to the caller's
// dialect, flushing every event. After commit nothing is retried: a failure
// writes the dialect's in-band error and is returned so the caller aborts
// the response (SPEC §7.5).
func (s *server) relayStream(w http.ResponseWriter, r *http.Request, dialect, model string, c call, resp *http.Response, attempts int) (usage, *apiError) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Set("Brama-Attempts", strconv.Itoa(attempts))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	cs := newCallerStream(dialect, w, func() { rc.Flush() }, model)

	var mu sync.Mutex // guards cs and done: the relay and the keep-alive timer share the writer
	done := false
	locked := func(f func() error) error {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return nil
		}
		return f()
	}
	every := s.keepAlive
	if every == 0 {
		every = keepAliveEvery
	}
	var timer *time.Timer
	timer = time.AfterFunc(every, func() {
		locked(func() error {
			timer.Reset(every)
			return cs.keepAlive()
		})
	})
	defer func() {
		mu.Lock()
		done = true
		timer.Stop()
		mu.Unlock()
	}()

	var u usage
	err := locked(cs.start)
	if err == nil {
		err = readUpstreamStream(c.res.Provider.protocol, resp.Body, func(ev streamEvent) error {
			if ev.Kind == eventUsage {
				u = ev.Usage
			}
			return locked(func() error {
				timer.Reset(every)
				return cs.event(ev)
			})
		})
	}
	if err == nil {
		err = locked(cs.finish)
	}
	if err == nil {
		return u, nil
	}
	ae := asAPIError(err).withAttempts(attempts)
	if r.Context().Err() != nil {
		ae = refuse("client_cancelled", "the caller hung up during the stream").because(err).withAttempts(attempts)
	}
	locked(func() error { return cs.fail(ae) })
	s.log.Warn("stream_failed_after_commit", "request_id", infoFrom(r.Context()).id, "code", ae.Code, "cause", redact(fmt.Sprint(ae.Err), c.presented()))
	return u, ae
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
