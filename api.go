package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
)

// api.go holds the HTTP handlers server.go has no room for (it stays under
// 650 lines): the chat, embeddings and count_tokens handlers in front of the
// attempt engine (SPEC §7, §15), the subscription inventory's with its
// credential replacement, sign-in donation and probe (SPEC §10.1, §11.1,
// §11.3) maintenance's (SPEC §11.2) and the signed-answer wrapper, replay and
// GET /v1/answers/{key} (SPEC §12). routes() in server.go lists them; each
// decodes, calls one plain method and encodes. The
// agent routes serve the agent the request acts for (a valid signature or
// a bearer bound to it); the admin twins serve any agent.

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

// subscriptionOwner guards the agent routes: the request must act for the
// path's agent, as a signed agent or a bearer bound to it (SPEC §3.1, §3.2).
func (s *server) subscriptionOwner(h http.HandlerFunc) http.HandlerFunc {
	return s.subscriptionAgent(false, h)
}

// subscriptionAgentAgrees guards the admin twins: an admin may act for any
// agent, but a bearer-bound or signed agent must still be the path's (SPEC
// §3.2: bearer, signed and path agent agree where present).
func (s *server) subscriptionAgentAgrees(h http.HandlerFunc) http.HandlerFunc {
	return s.subscriptionAgent(true, h)
}

// subscriptionAgent runs h once the path's agent id obeys the id rule (so
// `/v1/admin/subscriptions/%2e%2e` is a 400, not an empty listing) and the
// request may act for it; admin says whether no agent at all will do.
func (s *server) subscriptionAgent(admin bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		agent, path := infoFrom(r.Context()).agentID, r.PathValue("agent_id")
		switch {
		case !idPattern.MatchString(path):
			s.fail(w, r, refuse("invalid_request", "agent id %q in the path must match [a-z0-9-]{1,64}", path))
		case agent == "" && !admin:
			s.fail(w, r, refuse("unauthenticated", "this route acts for an agent: sign the request as agent %q (X-Agent-Id, X-Agent-Timestamp, X-Agent-Signature) or use a bearer bound to it", path))
		case agent != "" && agent != path:
			s.fail(w, r, refuse("forbidden", "this request acts for agent %q, not %q", agent, path))
		default:
			h(w, r)
		}
	}
}

// handleSubscriptionList serves GET …/subscriptions/{agent_id}.
func (s *server) handleSubscriptionList(w http.ResponseWriter, r *http.Request) {
	rows, err := s.inv.list(r.PathValue("agent_id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"subscriptions": rows})
}

// handleSubscriptionDonate serves POST /v1/subscriptions/{agent_id}.
func (s *server) handleSubscriptionDonate(w http.ResponseWriter, r *http.Request) {
	var body donation
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	it, err := s.inv.donate(r.PathValue("agent_id"), body.Provider, body.Label, vaultCredential{APIKey: body.APIKey, OAuth: body.OAuth})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.maint.changed()
	writeJSON(w, http.StatusCreated, map[string]donatedSubscription{
		"subscription": {ID: it.ID, Provider: it.Provider, AgentID: it.AgentID, Label: it.Label, Status: "active"},
	})
}

// handleAdminSubscriptionDonate serves POST /v1/admin/subscriptions/{agent_id}:
// an admin may donate only to an agent the vault knows.
func (s *server) handleAdminSubscriptionDonate(w http.ResponseWriter, r *http.Request) {
	agent := r.PathValue("agent_id")
	doc, err := s.vault.load()
	if err != nil {
		s.fail(w, r, vaultRefusal(err))
		return
	}
	if _, ok := doc.Agents[agent]; !ok {
		s.fail(w, r, refuse("not_found", "no agent %q in the vault (brama agents add %s)", agent, agent))
		return
	}
	s.handleSubscriptionDonate(w, r)
}

// handleSubscriptionRetire serves DELETE …/subscriptions/{agent_id}/{subscription_id}[?reason=TEXT].
func (s *server) handleSubscriptionRetire(w http.ResponseWriter, r *http.Request) {
	reason := r.URL.Query().Get("reason")
	if reason == "" {
		reason = "retired by " + infoFrom(r.Context()).client.ID
	}
	if err := s.inv.retire(r.PathValue("agent_id"), r.PathValue("subscription_id"), reason); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// handleSubscriptionReinstate serves POST
// /v1/admin/subscriptions/{agent_id}/{subscription_id}/reinstate {"reason"}.
func (s *server) handleSubscriptionReinstate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.inv.reinstate(r.PathValue("agent_id"), r.PathValue("subscription_id"), body.Reason); err != nil {
		s.fail(w, r, err)
		return
	}
	s.maint.changed()
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// handleMaintain serves POST /v1/admin/maintain (body empty or {}): one pass
// now; one that could not list the subscriptions is refused 503 with why.
func (s *server) handleMaintain(m *maintainer) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var none struct{}
		if err := decodeOptionalBody(r, &none); err != nil {
			s.fail(w, r, err)
			return
		}
		rep, err := m.passNow(r.Context())
		switch {
		case errors.Is(err, errMaintenanceStopped):
			s.fail(w, r, refuse("dependency_unavailable", "no pass can run: %v", err).because(err))
		case err != nil:
			s.fail(w, r, asAPIError(err))
		default:
			writeJSON(w, http.StatusOK, rep)
		}
	}
}

// decodeOptionalBody is decodeBody for a route whose body may be empty.
func decodeOptionalBody(r *http.Request, v any) error {
	if len(strings.TrimSpace(string(infoFrom(r.Context()).body))) == 0 {
		return nil
	}
	return decodeBody(r, v)
}

// The HTTP face of the attempt engine (dispatch.go): the chat, embeddings
// and count_tokens handlers, and the engine each request gets. They decode,
// call the engine, and write its refusal.

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
			s.signedAnswer(w, r, req.head, r.Header.Get("Idempotency-Key"), route)
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

// credentialBody is the strict body of PUT …/credential: exactly one of
// an OAuth grant or an API key (checkCredential enforces "exactly").
type credentialBody struct {
	OAuth  *oauthGrant `json:"oauth"`
	APIKey string      `json:"api_key"`
}

// handleSubscriptionCredential serves PUT
// /v1/admin/subscriptions/{agent_id}/{subscription_id}/credential. The
// answer carries the row, never the secret.
func (s *server) handleSubscriptionCredential(w http.ResponseWriter, r *http.Request) {
	var body credentialBody
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	it, err := s.replaceSubscriptionCredential(r.PathValue("agent_id"), r.PathValue("subscription_id"),
		vaultCredential{OAuth: body.OAuth, APIKey: body.APIKey}, infoFrom(r.Context()).client.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "subscription": s.inv.row(it, false, s.now())})
}

// handleAdminDonation serves POST /v1/admin/subscriptions/{agent_id}: an
// ordinary donation, or with ?via=sign-in a donation made by `brama
// subscription sign-in`, which is journaled as a sign-in too (SPEC §11.1).
func (s *server) handleAdminDonation(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("via") != signInVia {
		s.handleAdminSubscriptionDonate(w, r)
		return
	}
	it, err := s.signInDonation(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]donatedSubscription{
		"subscription": {ID: it.ID, Provider: it.Provider, AgentID: it.AgentID, Label: it.Label, Status: "active"},
	})
}

// signInDonation donates the grant a sign-in obtained as a new
// subscription and journals subscription_sign_in. Like every operation
// that must journal, it refuses before changing anything when the journal
// could not record it.
func (s *server) signInDonation(r *http.Request) (overlayItem, error) {
	agent := r.PathValue("agent_id")
	if err := s.journal.ready(); err != nil {
		return overlayItem{}, refuse("dependency_unavailable", "subscription not donated: the journal cannot record a sign-in: %v", err).because(err)
	}
	var body donation
	if err := decodeBody(r, &body); err != nil {
		return overlayItem{}, err
	}
	doc, err := s.vault.load()
	if err != nil {
		return overlayItem{}, vaultRefusal(err)
	}
	if _, ok := doc.Agents[agent]; !ok {
		return overlayItem{}, refuse("not_found", "no agent %q in the vault (brama agents add %s)", agent, agent)
	}
	it, err := s.inv.donate(agent, body.Provider, body.Label, vaultCredential{APIKey: body.APIKey, OAuth: body.OAuth})
	if err != nil {
		return overlayItem{}, err
	}
	s.maint.changed()
	by := infoFrom(r.Context()).client.ID
	if err := s.journalSignIn(it, "signed_in", "new subscription donated by sign-in from client "+by); err != nil {
		return overlayItem{}, refuse("dependency_unavailable", "subscription %s was donated, but the journal refused the sign-in record: %v", it.ID, err).because(err)
	}
	return it, nil
}

// handleSubscriptionProbe serves POST …/{subscription_id}/probe, body
// optional {"model"}. A provider's refusal is a 200 too: probe.ok false.
func (s *server) handleSubscriptionProbe(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model string `json:"model"`
	}
	out, err := probeOutcome{}, decodeOptionalBody(r, &body)
	if err == nil {
		var it overlayItem
		it, err = s.inv.owned(r.PathValue("agent_id"), r.PathValue("subscription_id"), "a retired subscription is never probed")
		if err == nil {
			ri := infoFrom(r.Context())
			e := s.engine(ri)
			defer ri.account(&e.t)
			e.agent = r.PathValue("agent_id")
			out, err = e.probe(r.Context(), it, body.Model)
		}
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// The HTTP face of signed answers (SPEC §12): the wrapper handleChat's
// dispatch runs inside, the replay, and GET /v1/answers/{key}. answers.go
// holds the records themselves and knows nothing of HTTP.

// answerCapture holds a buffered dispatch's response until it is kept. Only
// buffered requests reach it, so nothing needs flushing.
type answerCapture struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *answerCapture) Header() http.Header { return c.header }

func (c *answerCapture) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
}

func (c *answerCapture) Write(b []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return c.body.Write(b)
}

// signedAnswer answers a chat request that carries an Idempotency-Key
// (SPEC §12). handleChat calls it once plan() has passed every check, so
// reserving is the last step before dispatch runs the provider calls;
// dispatch writes a buffered answer or one refusal to the writer it is given.
func (s *server) signedAnswer(w http.ResponseWriter, r *http.Request, req chatRequest, key string, dispatch func(w http.ResponseWriter, r *http.Request)) {
	ri := infoFrom(r.Context())
	err := checkIdempotencyKey(key)
	switch {
	case len(r.Header.Values("Idempotency-Key")) > 1:
		err = refuse("invalid_request", "send one Idempotency-Key header")
	case err == nil && req.Stream:
		err = refuse("invalid_request", "Idempotency-Key keeps one buffered answer; it cannot be used with stream: true")
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	t, kept, err := s.answers.reserve(ri.client.ID, key, ri.body, ri.route)
	switch {
	case err != nil:
		s.fail(w, r, err)
		return
	case kept != nil:
		s.replayAnswer(w, r, kept)
		return
	}
	c := &answerCapture{header: http.Header{}}
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
	copyCaptured(w, c, sig)
}

// settleAnswer keeps or releases the reservation after dispatch (SPEC §12
// item 3, §7.4) and returns what the caller gets, with its signature when
// kept. A success is kept. A caller that hung up (or a dispatch that
// panicked) after a provider call started is kept as 499 client_cancelled
// (500 internal_error), so the key never spends twice; before any call the
// key is released. A retryable refusal is released so a retry dispatches
// again; any other refusal is kept.
func (s *server) settleAnswer(r *http.Request, t *answerTicket, c *answerCapture, panicked bool) (*answerCapture, string) {
	ri := infoFrom(r.Context())
	calls := 0
	if ri.attempts != nil {
		calls = *ri.attempts
	}
	attempts := ri.attempts
	if n, err := strconv.Atoi(c.header.Get("Brama-Attempts")); err == nil {
		attempts = &n
	}
	var cut *apiError
	switch {
	case c.status >= 200 && c.status <= 299 && !panicked:
	case panicked && calls > 0:
		cut = refuse("internal_error", "the answer failed inside Brama after a provider call started").withAttempts(calls)
	case r.Context().Err() != nil && calls > 0:
		cut = refuse("client_cancelled", "the caller hung up after a provider call started").withAttempts(calls)
	case panicked, r.Context().Err() != nil, envelopeRetryable(c.body.Bytes()),
		// A refusal without an attempts count was made before any dispatch
		// (SPEC §8.1): it belongs before the reservation and is never kept.
		calls == 0 && c.header.Get("Brama-Attempts") == "":
		if err := s.answers.release(t); err != nil {
			s.answers.log.Error("answer_release_failed", "request_id", ri.id, "err", err)
		}
		return c, ""
	}
	if cut != nil {
		c = &answerCapture{header: http.Header{}}
		writeAPIError(c, r, cut)
		attempts = &calls
		ri.outcome, ri.retryable = cut.Code, false
	}
	rec, err := s.answers.complete(t, c.status, c.body.Bytes(), attempts, ri.route)
	if err != nil {
		// The answer exists and was paid for: give it unsigned rather than
		// lose it. The record stays in progress, so the key never spends
		// twice; after a restart it reads as abandoned.
		s.answers.log.Error("answer_unkept", "request_id", ri.id, "err", err)
		return c, ""
	}
	return c, *rec.Signature
}

// copyCaptured writes a captured response to w, signed when sig is set.
func copyCaptured(w http.ResponseWriter, c *answerCapture, sig string) {
	for k, v := range c.header {
		w.Header()[k] = v
	}
	if sig != "" {
		w.Header().Set("Brama-Answer-Signature", sig)
	}
	if c.status == 0 {
		c.status = http.StatusOK
	}
	w.WriteHeader(c.status)
	w.Write(c.body.Bytes())
}

// envelopeCode is the code and retryable flag of body when it is an error
// envelope (SPEC §8.1); code is "" otherwise.
func envelopeCode(body []byte) (code string, retryable bool) {
	var env struct {
		Error struct {
			Code      string `json:"code"`
			Retryable bool   `json:"retryable"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &env) != nil {
		return "", false
	}
	return env.Error.Code, env.Error.Retryable
}

func envelopeRetryable(body []byte) bool { _, retryable := envelopeCode(body); return retryable }

// replayAnswer answers from a complete record: the kept status and body
// bytes, the signature, Brama-Answer-Replayed and no provider call.
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
	h.Set("Content-Type", "application/json")
	h.Set("Brama-Answer-Signature", *rec.Signature)
	h.Set("Brama-Answer-Replayed", "true")
	h.Set("Brama-Attempts", "0")
	w.WriteHeader(*rec.Status)
	w.Write(body)
}

// handleGet serves GET /v1/answers/{key} for the calling client.
func (s *server) handleGetAnswer(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if err := checkIdempotencyKey(key); err != nil {
		s.fail(w, r, err)
		return
	}
	rec, err := s.answers.lookup(infoFrom(r.Context()).client.ID, key)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.replayAnswer(w, r, rec)
}
