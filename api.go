package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
)

// The handlers in front of the attempt engine (SPEC §7, §15), of the
// subscription routes (SPEC §10.1, §11) and of signed answers (SPEC §12).

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

// okBody is the answer of a subscription write that returns nothing else.
var okBody = map[string]bool{"ok": true}

// reply makes f a handler: its value is written with status, its error in
// the envelope.
func (s *server) reply(status int, f func(*http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := f(r)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, status, v)
	}
}

// listSubscriptions serves GET …/subscriptions/{agent_id}.
func (s *server) listSubscriptions(r *http.Request) (any, error) {
	rows, err := s.inv.list(r.PathValue("agent_id"))
	return map[string]any{"subscriptions": rows}, err
}

// donateSubscription serves POST …/subscriptions/{agent_id}; on the admin
// route ?via=sign-in is journaled as a sign-in (SPEC §11.1).
func (s *server) donateSubscription(r *http.Request) (any, error) {
	agent := r.PathValue("agent_id")
	signIn := strings.HasPrefix(r.URL.Path, "/v1/admin/") && r.URL.Query().Get("via") == signInVia
	if signIn {
		if err := s.journal.ready(); err != nil {
			return nil, refuse("dependency_unavailable", "subscription not donated: the journal cannot record a sign-in: %v", err).because(err)
		}
	}
	var body donation
	if err := decodeBody(r, &body, false); err != nil {
		return nil, err
	}
	it, err := s.inv.donate(agent, body.Provider, body.Label, vaultCredential{APIKey: body.APIKey, OAuth: body.OAuth})
	if err != nil {
		return nil, err
	}
	s.maint.changed()
	s.replay.forget("", it.Provider) // SPEC §17: a new credential of the provider
	if signIn {
		by := infoFrom(r.Context()).client.ID
		if jerr := s.journalSignIn(it, "signed_in", "new subscription donated by sign-in from client "+by); jerr != nil {
			return nil, refuse("dependency_unavailable", "subscription %s was donated, but the journal refused the sign-in record: %v", it.ID, jerr).because(jerr)
		}
	}
	return map[string]donatedSubscription{
		"subscription": {ID: it.ID, Provider: it.Provider, AgentID: it.AgentID, Label: it.Label, Status: "active"},
	}, nil
}

// retireSubscription serves DELETE …/{subscription_id}[?reason=TEXT].
func (s *server) retireSubscription(r *http.Request) (any, error) {
	reason := cmp.Or(r.URL.Query().Get("reason"), "retired by "+infoFrom(r.Context()).client.ID)
	return okBody, s.inv.retire(r.PathValue("agent_id"), r.PathValue("subscription_id"), reason)
}

// reinstateSubscription serves POST …/{subscription_id}/reinstate {"reason"}.
func (s *server) reinstateSubscription(r *http.Request) (any, error) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeBody(r, &body, false); err != nil {
		return nil, err
	}
	if err := s.inv.reinstate(r.PathValue("agent_id"), r.PathValue("subscription_id"), body.Reason); err != nil {
		return nil, err
	}
	s.maint.changed()
	return okBody, nil
}

// replaceCredential serves PUT …/{subscription_id}/credential. The answer
// carries the row, never the secret.
func (s *server) replaceCredential(r *http.Request) (any, error) {
	var body credentialBody
	if err := decodeBody(r, &body, false); err != nil {
		return nil, err
	}
	it, err := s.replaceSubscriptionCredential(r.PathValue("agent_id"), r.PathValue("subscription_id"),
		vaultCredential{OAuth: body.OAuth, APIKey: body.APIKey}, infoFrom(r.Context()).client.ID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"ok": true, "subscription": s.inv.row(it, false, s.now())}, nil
}

// maintainNow serves POST /v1/admin/maintain (body empty or {}): one pass
// now; one that could not list the subscriptions is refused 503 with why.
func (s *server) maintainNow(r *http.Request) (any, error) {
	var none struct{}
	if err := decodeBody(r, &none, true); err != nil {
		return nil, err
	}
	rep, err := s.maint.passNow(r.Context())
	if errors.Is(err, errMaintenanceStopped) {
		return nil, refuse("dependency_unavailable", "no pass can run: %v", err).because(err)
	}
	return rep, err
}

// pruneOrphans serves POST /v1/admin/vault/prune-orphans (body empty or {}):
// the vault's credentials no subscription names are removed (SPEC §17).
func (s *server) pruneOrphans(r *http.Request) (any, error) {
	var none struct{}
	if err := decodeBody(r, &none, true); err != nil {
		return nil, err
	}
	ids, err := s.inv.pruneOrphans()
	return map[string]any{"ok": true, "removed": ids}, err
}

// handleSubscriptionProbe serves POST …/{subscription_id}/probe, body
// optional {"model"}. A provider's refusal is a 200 too: probe.ok false.
func (s *server) handleSubscriptionProbe(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model string `json:"model"`
	}
	agent, out, err := r.PathValue("agent_id"), probeOutcome{}, decodeBody(r, &body, true)
	if err == nil {
		var it overlayItem
		it, err = s.inv.owned(agent, r.PathValue("subscription_id"), "a retired subscription is never probed")
		if err == nil {
			ri := infoFrom(r.Context())
			e := s.engine(ri)
			defer ri.account(&e.t)
			e.agent = agent
			if out, err = e.probe(r.Context(), it, body.Model); err == nil { // SPEC §7.4: after dispatch
				w.Header().Set("Brama-Attempts", strconv.Itoa(e.t.attempts))
			}
		}
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// engine is the attempt engine (dispatch.go) for one request.
func (s *server) engine(ri *requestInfo) *engine {
	return &engine{core: &s.core, agent: ri.agentID, t: tally{requestID: ri.id}}
}

// account copies what the engine learned into the log line; deferred, so
// a stream aborted after commit is accounted too.
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
	ri.route = cmp.Or(t.route, ri.route)
}

// handleChat serves the three chat routes for one caller dialect: read the
// head, resolve, pay, call; the whole body is parsed only to translate (SPEC §7.6).
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
			s.signedAnswer(w, r, req.head, r.Header.Get("Idempotency-Key"), route)
			return
		}
		if s.replayRefused(w, r, req.body, c) { // SPEC §8.1's replay guard (replay.go)
			return
		}
		e.t.remember = s.replayRememberer(r, req.body, c, cands)
		route(w, r)
	}
}

// handleEmbeddings serves POST /v1/embeddings: a direct or alias route to an
// openai-chat provider, one call, the provider's JSON returned as is.
func (s *server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var body map[string]json.RawMessage
	var req chatRequest
	switch {
	case json.Unmarshal(infoFrom(r.Context()).body, &body) != nil || body == nil:
		s.fail(w, r, refuse("invalid_request", "the body must be a JSON object"))
	case json.Unmarshal(body["model"], &req.Model) != nil || req.Model == "":
		s.fail(w, r, refuse("invalid_request", "model must be a non-empty string"))
	default:
		s.serveModel(w, r, &req, func(e *engine, c call) error {
			return e.serveEmbeddings(r.Context(), w, req.Model, body, c)
		})
	}
}

// handleCountTokens serves POST /v1/messages/count_tokens (SPEC §15),
// resolving model as /v1/messages does (§6.4's max_tokens rule aside).
func (s *server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	req, err := readCallerRequest(dialectMessages, r, infoFrom(r.Context()).body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.serveModel(w, r, &req.head, func(e *engine, c call) error {
		return e.countTokens(r.Context(), w, req, c)
	})
}

// serveModel plans req's model and runs serve: the engine call of a route
// outside chat (embeddings, count_tokens).
func (s *server) serveModel(w http.ResponseWriter, r *http.Request, req *chatRequest, serve func(*engine, call) error) {
	ri := infoFrom(r.Context())
	ri.requestedModel = req.Model
	e := s.engine(ri)
	defer ri.account(&e.t)
	c, err := e.plan(ri.client, ri.agentID, req)
	ri.routingMode, ri.route = c.res.Mode, c.res.Route
	if err == nil {
		err = serve(e, c)
	}
	if err != nil {
		s.fail(w, r, err)
	}
}

// signedAnswer answers a chat request carrying an Idempotency-Key (SPEC
// §12): reserving is the last step before dispatch runs the provider calls.
func (s *server) signedAnswer(w http.ResponseWriter, r *http.Request, req chatRequest, key string, dispatch func(w http.ResponseWriter, r *http.Request)) {
	ri := infoFrom(r.Context())
	err := checkIdempotencyKey(key)
	switch {
	case len(r.Header.Values("Idempotency-Key")) > 1:
		err = refuse("invalid_request", "send one Idempotency-Key header")
	case err == nil && req.Stream:
		err = refuse("invalid_request", "Idempotency-Key keeps one buffered answer; it cannot be used with stream: true")
	}
	var t *answerTicket
	var kept *answerRecord
	if err == nil {
		t, kept, err = s.answers.reserve(r, ri.client.ID, key, ri.body, ri.route)
	}
	switch {
	case err != nil:
		s.fail(w, r, err)
		return
	case kept != nil:
		s.replayAnswer(w, r, kept)
		return
	}
	c := newCapture()
	func() {
		defer func() {
			if p := recover(); p != nil {
				s.settleAnswer(r, t, c, true) // keep or release; the connection is lost anyway
				panic(p)
			}
		}()
		dispatch(c, r)
	}()
	c, sig := s.settleAnswer(r, t, c, false)
	maps.Copy(w.Header(), c.HeaderMap)
	if sig != "" {
		w.Header().Set("Brama-Answer-Signature", sig)
	}
	w.WriteHeader(cmp.Or(c.Code, http.StatusOK))
	w.Write(c.Body.Bytes())
}

// newCapture holds a buffered dispatch's response until it is kept; Code
// stays 0 until something is written.
func newCapture() *httptest.ResponseRecorder {
	return &httptest.ResponseRecorder{HeaderMap: http.Header{}, Body: new(bytes.Buffer)}
}

// settleAnswer keeps or releases the reservation after dispatch (SPEC §12
// item 3) and returns what the caller gets, signed when kept. After a
// provider call started, a hang-up or panic is kept (499, 500) so the key
// never spends twice; a retryable refusal is released.
func (s *server) settleAnswer(r *http.Request, t *answerTicket, c *httptest.ResponseRecorder, panicked bool) (*httptest.ResponseRecorder, string) {
	ri := infoFrom(r.Context())
	calls := 0
	if ri.attempts != nil {
		calls = *ri.attempts
	}
	attempts := ri.attempts
	if n, err := strconv.Atoi(c.HeaderMap.Get("Brama-Attempts")); err == nil {
		attempts = &n
	}
	_, retryable := envelopeCode(c.Body.Bytes())
	var cut *apiError
	switch {
	case c.Code >= 200 && c.Code <= 299 && !panicked:
	case panicked && calls > 0:
		cut = refuse("internal_error", "the answer failed inside Brama after a provider call started").withAttempts(calls)
	case context.Cause(r.Context()) == errServerShutdown && calls > 0: // a stopped process's answer (SPEC §12 item 2)
		cut = refuse("internal_error", abandonedMessage).withAttempts(calls)
	case r.Context().Err() != nil && calls > 0:
		cut = refuse("client_cancelled", "the caller hung up after a provider call started").withAttempts(calls)
	case panicked, r.Context().Err() != nil, retryable,
		// A refusal without an attempts count was made before any dispatch
		// (SPEC §8.1): it belongs before the reservation and is never kept.
		calls == 0 && c.HeaderMap.Get("Brama-Attempts") == "":
		if err := s.answers.release(t); err != nil {
			s.answers.log.Error("answer_release_failed", "request_id", ri.id, "err", err)
		}
		return c, ""
	}
	route := cmp.Or(c.HeaderMap.Get("Brama-Route"), ri.route) // a selector's: the candidate that answered
	if cut != nil {
		c = newCapture()
		writeAPIError(c, r, cut)
		attempts = &calls
		ri.outcome, ri.retryable = cut.Code, false
	}
	c.Body = bytes.NewBuffer(withoutPromptEcho(c.Body.Bytes())) // the first answer is the kept body (SPEC §12 item 7)
	rec, err := s.answers.complete(t, c.Code, c.Body.Bytes(), attempts, route)
	if err != nil {
		// The answer exists and was paid for: give it unsigned rather than
		// lose it. The record stays in progress, so the key never spends
		// twice; sent again it is refused, and after a restart it reads as abandoned.
		s.answers.markUnkept(t.path)
		s.answers.log.Error("answer_unkept", "request_id", ri.id, "err", err)
		return c, ""
	}
	return c, *rec.Signature
}

// envelopeCode is the code and retryable flag of body when it is an error
// envelope (SPEC §8.1); code is "" otherwise.
func envelopeCode(body []byte) (code string, retryable bool) {
	var env envelope
	if json.Unmarshal(body, &env) != nil {
		return "", false
	}
	return env.Error.Code, env.Error.Retryable
}

// replayAnswer answers from a complete record, with no provider call.
func (s *server) replayAnswer(w http.ResponseWriter, r *http.Request, rec *answerRecord) {
	ri := infoFrom(r.Context())
	zero := 0
	ri.attempts = &zero
	body := rec.body()
	h := w.Header()
	if code, retryable := envelopeCode(body); code != "" {
		ri.outcome, ri.retryable = code, retryable
		h.Set("X-Should-Retry", strconv.FormatBool(retryable)) // SPEC §8.1
	}
	h.Set("Brama-Answer-Signature", *rec.Signature)
	h.Set("Brama-Answer-Replayed", "true")
	h.Set("Brama-Attempts", "0")
	if rec.Route != "" { // README: every answer names its route
		h.Set("Brama-Route", rec.Route)
	}
	writeRaw(w, *rec.Status, body)
}
