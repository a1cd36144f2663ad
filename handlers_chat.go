package main

import (
	"context"
	"encoding/json"
	"net/http"
)

// The HTTP face of the attempt engine (dispatch.go): the chat, embeddings
// and count_tokens handlers, and the engine each request gets. They decode,
// call the engine, and write its refusal; the lead folds this file into
// server.go.

// engine is the attempt engine for one request: the server's dependencies
// and the request's own account, whose id it logs.
func (s *server) engine(ri *requestInfo) *engine {
	return &engine{
		log: s.log, now: s.now, getenv: s.getenv, client: s.client, calls: &s.attempts,
		keepAlive: s.keepAlive, reg: s.reg, hasDirect: s.hasDirect, localCreds: s.localCreds,
		vault: s.vault, catalog: s.catalog, perf: s.perf, ledger: s.ledger, inv: s.inv,
		oauth: s.oauth, pins: &s.pins, maint: s.maint, agent: ri.agentID,
		t: tally{requestID: ri.id},
	}
}

// account copies what the engine learned into the request's log line. It
// runs deferred, so a stream aborted after commit is accounted too.
func (ri *requestInfo) account(t *tally) {
	if t.attempts > 0 {
		n := t.attempts
		ri.attempts = &n
	}
	if t.outcome != "" {
		ri.outcome, ri.retryable = t.outcome, t.retryable
	}
	if t.input != 0 || t.output != 0 {
		ri.inputTokens, ri.outputTokens = t.input, t.output
	}
	if t.dropped != nil {
		ri.dropped = t.dropped
	}
}

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
		e := s.engine(ri)
		c, cands, err := e.planChat(ri.client, req)
		ri.routingMode, ri.route = c.res.Mode, c.res.Route
		if err != nil {
			s.fail(w, r, err)
			return
		}
		route := func(w http.ResponseWriter, r *http.Request) {
			defer ri.account(&e.t)
			if ae := e.serveChat(r.Context(), w, req, c, cands); ae != nil {
				s.fail(w, r, ae)
			}
		}
		// SPEC §12: a signed answer reserves its key only now, after every
		// check plan made. An empty header value is refused, not ignored.
		if _, asked := r.Header["Idempotency-Key"]; asked {
			s.answers.signedAnswer(w, r, req.head, r.Header.Get("Idempotency-Key"), route)
			return
		}
		if s.replayRefused(w, r) { // SPEC §8.1's replay guard (replay.go)
			return
		}
		e.t.remember = s.replayRememberer(ri)
		route(w, r)
	}
}

// plan is the engine's plan for callers outside a chat request (onboarding).
func (s *server) plan(ri *requestInfo, req *chatRequest) (call, error) {
	c, err := s.engine(ri).plan(ri.client, ri.agentID, req)
	ri.routingMode, ri.route = c.res.Mode, c.res.Route
	return c, err
}

// callProvider makes one translated call outside a chat request (onboarding).
func (s *server) callProvider(ctx context.Context, req chatRequest, c call) attempt {
	return s.engine(&requestInfo{}).callProvider(ctx, req, c)
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
	e := s.engine(ri)
	defer ri.account(&e.t)
	c, err := e.plan(ri.client, ri.agentID, &req)
	ri.routingMode, ri.route = c.res.Mode, c.res.Route
	if err == nil {
		err = e.serveEmbeddings(r.Context(), w, req.Model, body, c)
	}
	if err != nil {
		s.fail(w, r, err)
	}
}

// handleCountTokens serves POST /v1/messages/count_tokens (SPEC §15),
// resolving model as /v1/messages does.
func (s *server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	ri := infoFrom(r.Context())
	req, err := readCallerRequest(dialectMessages, r, ri.body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ri.requestedModel = req.head.Model
	e := s.engine(ri)
	defer ri.account(&e.t)
	c, err := e.plan(ri.client, ri.agentID, &req.head) // §6.4's max_tokens rule does not apply here
	ri.routingMode, ri.route = c.res.Mode, c.res.Route
	if err == nil {
		err = e.countTokens(r.Context(), w, req, c)
	}
	if err != nil {
		s.fail(w, r, err)
	}
}
