package main

import (
	"bytes"
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
// /v1/responses for one caller dialect: parse, resolve, pay, one call.
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
		if err == nil {
			err = s.applyMaxTokens(&req, c)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		s.dispatch(w, r, dialect, req, c)
	}
}

// call is one planned provider call: where, with what, as which model.
type call struct {
	res     resolution
	baseURL string
	cred    upstreamCredential
}

// plan turns a parsed request into its one provider call, or the refusal
// made before dispatch (no attempts) or at dispatch with none made
// (attempts 0). It knows nothing about HTTP.
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
	switch res.Mode {
	case modeDirect, modeAlias:
	default:
		return call{}, s.subscriptionRefusal(ri, res)
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
func (s *server) applyMaxTokens(req *chatRequest, c call) error {
	p := c.res.Provider
	if req.MaxTokens != 0 || p.id == "codex" {
		return nil
	}
	limit, cause := s.catalog.outputLimit(p.id, c.res.Model)
	switch {
	case limit > 0:
		req.MaxTokens = limit
	case p.protocol == protoAnthropic:
		return refuse("invalid_request", "max_tokens is required: the model's own limit is unknown (%s)", cause)
	}
	return nil
}

// subscriptionRefusal answers routes paid by an agent's subscriptions
// (SPEC §5.3, §7.2, §7.3) while the inventory is empty: the agent must be
// known, and then it has no subscription that could pay.
func (s *server) subscriptionRefusal(ri *requestInfo, res resolution) error {
	if ri.agentID == "" {
		return refuse("unauthenticated", "this route is paid by an agent's subscription; sign the request or use a bearer bound to an agent")
	}
	if res.Mode == modeSubscription {
		return refuse("credential_unauthorized", "no %q subscription for agent %q", res.Provider.id, ri.agentID).withAttempts(0)
	}
	if res.Mode == modeTask {
		return refuse("invalid_request", "no passing quality checks recorded for task %q", res.Task)
	}
	return refuse("credential_unauthorized", "no subscription model can serve agent %q", ri.agentID).withAttempts(0)
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
func (c call) presented() string { return c.cred.APIKey + c.cred.AccessToken }

// dispatch makes the one provider call and answers the caller: a buffered
// body, a translated stream, or exactly one classified refusal.
func (s *server) dispatch(w http.ResponseWriter, r *http.Request, dialect string, req chatRequest, c call) {
	ri := infoFrom(r.Context())
	start := s.now()
	p := c.res.Provider
	model := req.Model // SPEC §7.6: an alias or a direct route answers as requested
	httpReq, err := buildUpstreamRequest(r.Context(), p, c.baseURL, c.cred, req, c.res.Model)
	if err != nil {
		s.fail(w, r, refuse("internal_error", "the provider request could not be built").because(err))
		return
	}
	one := 1
	ri.attempts = &one
	s.attempts.Add(1)
	resp, err := s.client.Do(httpReq)
	if err != nil {
		s.finishFailure(w, r, c, start, classifyTransport(err).withAttempts(1))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, rerr := io.ReadAll(resp.Body)
		if rerr != nil {
			s.finishFailure(w, r, c, start, refuse("provider_incomplete", "provider %q answered %d and its body was cut after %d bytes", p.id, resp.StatusCode, len(body)).because(rerr).withAttempts(1))
			return
		}
		ref := classifyRefusal(p.id, resp.StatusCode, resp.Header, body, c.presented(), s.now())
		s.finishFailure(w, r, c, start, ref.err.withAttempts(1))
		return
	}
	if upstreamStreams(p, req) && req.Stream {
		s.relayStream(w, r, dialect, model, c, resp, start)
		return
	}
	var a chatAnswer
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
		s.finishFailure(w, r, c, start, asAPIError(err).withAttempts(1))
		return
	}
	a.Model = model
	out, err := renderAnswer(dialect, a)
	if err != nil {
		s.finishFailure(w, r, c, start, refuse("internal_error", "the answer could not be encoded").because(err).withAttempts(1))
		return
	}
	s.recordSuccess(ri, c, start, a.Usage)
	w.Header().Set("Brama-Attempts", "1")
	writeRaw(w, http.StatusOK, out)
}

// finishFailure records a failed call and answers with its refusal.
func (s *server) finishFailure(w http.ResponseWriter, r *http.Request, c call, start time.Time, ae *apiError) {
	s.perf.record(c.res.Route, false, s.now().Sub(start), 0)
	s.fail(w, r, ae)
	if r.Context().Err() != nil {
		infoFrom(r.Context()).outcome = "client_cancelled"
	}
}

// recordSuccess records spend once for a call that produced an answer.
func (s *server) recordSuccess(ri *requestInfo, c call, start time.Time, u usage) {
	ri.inputTokens, ri.outputTokens = u.InputTokens, u.OutputTokens
	s.perf.record(c.res.Route, true, s.now().Sub(start), u.OutputTokens)
}

// relayStream translates a committed provider stream to the caller's
// dialect, flushing every event. After commit nothing is retried: a failure
// writes the dialect's in-band error and aborts the response so no SDK can
// mistake it for a clean end (SPEC §7.5).
func (s *server) relayStream(w http.ResponseWriter, r *http.Request, dialect, model string, c call, resp *http.Response, start time.Time) {
	ri := infoFrom(r.Context())
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Set("Brama-Attempts", "1")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	cs := newCallerStream(dialect, w, func() { rc.Flush() }, model)

	var mu sync.Mutex // guards cs writes and done: the relay and the keep-alive timer share the writer
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
	stop := func() {
		mu.Lock()
		done = true
		timer.Stop()
		mu.Unlock()
	}

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
		stop()
		s.recordSuccess(ri, c, start, u)
		return
	}
	ae := asAPIError(err).withAttempts(1)
	if r.Context().Err() != nil {
		ae = refuse("client_cancelled", "the caller hung up during the stream").because(err).withAttempts(1)
	}
	locked(func() error { return cs.fail(ae) })
	stop()
	ri.outcome, ri.retryable = ae.Code, false
	ri.inputTokens, ri.outputTokens = u.InputTokens, u.OutputTokens
	s.perf.record(c.res.Route, false, s.now().Sub(start), u.OutputTokens)
	s.log.Warn("stream_failed_after_commit", "request_id", ri.id, "code", ae.Code, "cause", redact(fmt.Sprint(ae.Err), c.presented()))
	panic(http.ErrAbortHandler)
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
	one := 1
	ri.attempts = &one
	s.attempts.Add(1)
	resp, err := s.client.Do(upReq)
	if err != nil {
		s.finishFailure(w, r, c, start, classifyTransport(err).withAttempts(1))
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		s.finishFailure(w, r, c, start, refuse("provider_incomplete", "provider %q answer was cut after %d bytes", c.res.Provider.id, len(b)).because(err).withAttempts(1))
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		s.finishFailure(w, r, c, start, classifyRefusal(c.res.Provider.id, resp.StatusCode, resp.Header, b, c.presented(), s.now()).err.withAttempts(1))
	default:
		s.perf.record(c.res.Route, true, s.now().Sub(start), 0)
		w.Header().Set("Brama-Attempts", strconv.Itoa(1))
		writeRaw(w, http.StatusOK, b)
	}
}
