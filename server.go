package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// server is the HTTP face of Brama. Handlers decode, call one plain method,
// and encode; everything they share hangs off this struct.
type server struct {
	log     *slog.Logger
	getenv  func(string) string
	st      state
	now     func() time.Time
	clients *clientStore
	vault   *vault
	journal *journal
	reg     *registry
	agents  *agentVerifier
	guard   transportGuard
	// localCreds holds -local-credentials-stdin keys; when non-nil it is the
	// only source of direct credentials (SPEC §16).
	localCreds map[string]string
	client     *http.Client // provider calls: no timeout, no redirects, no proxy
	catalog    *catalog
	perf       *perfRegistry
	keepAlive  time.Duration // 0: keepAliveEvery; tests shorten it
	attempts   atomic.Int64  // provider calls made since start, for /stats
	mux        *http.ServeMux
	ledger     *ledger
	inv        *inventory
	oauth      *oauthClient
	pins       pins // the subscription that last served each agent and provider
	maint      *maintainer
	answers    *answerStore // signed answers (SPEC §12)
}

// routes is the only place URL patterns appear.
func (s *server) routes() {
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /health", s.handleHealth)
	s.mux.HandleFunc("GET /readyz", s.handleReady)
	s.mux.Handle("POST /v1/chat/completions", s.caller(s.handleChat(dialectChat)))
	s.mux.Handle("POST /v1/messages", s.caller(s.handleChat(dialectMessages)))
	s.mux.Handle("POST /v1/responses", s.caller(s.handleChat(dialectResponses)))
	s.mux.Handle("POST /v1/embeddings", s.caller(s.handleEmbeddings))
	s.mux.Handle("GET /v1/models", s.caller(s.handleModels))
	s.mux.Handle("GET /v1/aliases", s.caller(s.handleAliases))
	s.mux.Handle("GET /v1/answers/{key}", s.caller(s.answers.handleGet))
	s.mux.Handle("GET /stats", s.caller(s.handleStats))
	s.mux.Handle("GET /metrics", s.caller(s.handleMetrics))
	s.mux.Handle("GET /v1/admin/routes", s.admin(s.handleRoutesGet))
	s.mux.Handle("PUT /v1/admin/routes", s.admin(s.handleRoutesPut))
	s.mux.Handle("DELETE /v1/admin/routes", s.admin(s.handleRoutesDelete))
	s.mux.Handle("GET /v1/subscriptions/{agent_id}", s.caller(s.subscriptionOwner(s.handleSubscriptionList)))
	s.mux.Handle("POST /v1/subscriptions/{agent_id}", s.caller(s.subscriptionOwner(s.handleSubscriptionDonate)))
	s.mux.Handle("DELETE /v1/subscriptions/{agent_id}/{subscription_id}", s.caller(s.subscriptionOwner(s.handleSubscriptionRetire)))
	s.mux.Handle("GET /v1/admin/subscriptions/{agent_id}", s.admin(s.subscriptionAgentAgrees(s.handleSubscriptionList)))
	s.mux.Handle("POST /v1/admin/subscriptions/{agent_id}", s.admin(s.subscriptionAgentAgrees(s.handleAdminDonation)))
	s.mux.Handle("DELETE /v1/admin/subscriptions/{agent_id}/{subscription_id}", s.admin(s.subscriptionAgentAgrees(s.handleSubscriptionRetire)))
	s.mux.Handle("POST /v1/admin/subscriptions/{agent_id}/{subscription_id}/reinstate", s.admin(s.subscriptionAgentAgrees(s.handleSubscriptionReinstate)))
	s.mux.Handle("POST /v1/admin/maintain", s.admin(s.handleMaintain(s.maint)))
	s.mux.Handle("PUT /v1/admin/subscriptions/{agent_id}/{subscription_id}/credential", s.admin(s.subscriptionAgentAgrees(s.handleSubscriptionCredential)))
	s.mux.Handle("POST /v1/admin/subscriptions/{agent_id}/{subscription_id}/probe", s.admin(s.subscriptionAgentAgrees(s.handleSubscriptionProbe)))
}

// requestInfo is what the per-request log line reports (SPEC §13); handlers
// fill it in as they learn things.
type requestInfo struct {
	id             string
	client         client
	agentID        string
	routingMode    string
	requestedModel string
	route          string
	attempts       *int
	outcome        string
	retryable      bool
	inputTokens    int
	outputTokens   int
	streamed       bool
	body           []byte // the raw request body, read once by the auth wrapper
}

// countAttempt records one more provider call for this request.
func (ri *requestInfo) countAttempt() {
	if ri.attempts == nil {
		ri.attempts = new(int)
	}
	*ri.attempts++
}

type infoKey struct{}

func infoFrom(ctx context.Context) *requestInfo {
	if ri, ok := ctx.Value(infoKey{}).(*requestInfo); ok {
		return ri
	}
	return &requestInfo{}
}

// statusWriter remembers the status for the log line and keeps Flush
// reachable through Unwrap (http.ResponseController).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeHTTP gives every response an X-Request-Id, applies the transport
// guard, turns the mux's own 404/405 into envelopes and logs one line.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ri := &requestInfo{id: newRequestID()}
	w.Header().Set("X-Request-Id", ri.id)
	sw := &statusWriter{ResponseWriter: w}
	r = r.WithContext(context.WithValue(r.Context(), infoKey{}, ri))
	defer func() {
		if ri.outcome == "" {
			ri.outcome = "ok"
		}
		if r.Context().Err() != nil && ri.attempts != nil && ri.outcome == "ok" {
			ri.outcome = "client_cancelled"
		}
		s.logRequest(r, ri, sw.status, time.Since(start))
	}()
	switch h, pattern := s.mux.Handler(r); {
	case !s.guard.allows(r):
		s.fail(sw, r, refuse("secure_transport_required", "this listener accepts plain HTTP only from loopback or a trusted proxy that received https"))
	case r.URL.EscapedPath() != path.Clean(r.URL.EscapedPath()):
		// An unclean path (//, ., ..) would get the mux's own 307 with an
		// HTML body; every non-success answer is an envelope (SPEC §8.1).
		s.fail(sw, r, refuse("not_found", "no route for %s", r.URL.Path))
	case pattern == "":
		s.notRouted(sw, r, h)
	default:
		s.mux.ServeHTTP(sw, r) // not h.ServeHTTP: only the mux sets r.PathValue
	}
}

// notRouted asks the mux's own fallback handler what it would answer (404,
// or 405 with Allow) and says it in the envelope instead.
func (s *server) notRouted(w http.ResponseWriter, r *http.Request, h http.Handler) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code == http.StatusMethodNotAllowed {
		if allow := rec.Header().Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		s.fail(w, r, refuse("method_not_allowed", "%s is not allowed on %s", r.Method, r.URL.Path))
		return
	}
	s.fail(w, r, refuse("not_found", "no route for %s", r.URL.Path))
}

func newRequestID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// fail writes err in the envelope and records its outcome for the log line.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	ae := writeAPIError(w, err)
	ri := infoFrom(r.Context())
	ri.outcome, ri.retryable = ae.Code, ae.body().Error.Retryable
	if ae.Attempts != nil {
		ri.attempts = ae.Attempts
	}
	if ae.Err != nil {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "request_refused", slog.String("request_id", ri.id), slog.String("code", ae.Code), slog.String("cause", redact(ae.Err.Error())))
	}
}

// logRequest writes the one line per request of SPEC §13. It never holds a
// prompt, a completion or a credential.
func (s *server) logRequest(r *http.Request, ri *requestInfo, status int, d time.Duration) {
	attrs := []slog.Attr{
		slog.String("request_id", ri.id),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", status),
		slog.String("client_id", ri.client.ID),
		slog.String("agent_id", ri.agentID),
		slog.String("routing_mode", ri.routingMode),
		slog.String("requested_model", ri.requestedModel),
		slog.String("route", ri.route),
		slog.String("outcome", ri.outcome),
		slog.Bool("retryable", ri.retryable),
		slog.Int64("latency_ms", d.Milliseconds()),
		slog.Int("input_tokens", ri.inputTokens),
		slog.Int("output_tokens", ri.outputTokens),
		slog.Bool("streamed", ri.streamed),
	}
	if ri.attempts != nil {
		attrs = append(attrs, slog.Int("attempts", *ri.attempts))
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// caller wraps h so it runs only for a request with exactly one known
// bearer token and, when agent headers are present, a valid agent
// signature that agrees with the bearer's agent.
func (s *server) caller(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.authenticate(r); err != nil {
			s.fail(w, r, err)
			return
		}
		h(w, r)
	})
}

// admin is caller plus role admin (SPEC §3.1).
func (s *server) admin(h http.HandlerFunc) http.Handler {
	return s.caller(func(w http.ResponseWriter, r *http.Request) {
		if infoFrom(r.Context()).client.Role != roleAdmin {
			s.fail(w, r, refuse("forbidden", "this route needs an admin client"))
			return
		}
		h(w, r)
	})
}

// authenticate applies SPEC §3.1 and §3.2 to r and records who called.
func (s *server) authenticate(r *http.Request) error {
	ri := infoFrom(r.Context())
	cl, ok := s.clients.authenticate(bearerToken(r))
	if !ok {
		return refuse("unauthenticated", "unauthorized")
	}
	ri.client, ri.agentID = cl, cl.AgentID
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return refuse("invalid_request", "the request body could not be read").because(err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	ri.body = body
	agent, err := s.agents.verify(r, body)
	if err != nil {
		return refuse("unauthenticated", "unauthorized").because(err)
	}
	if agent != "" {
		if cl.AgentID != "" && cl.AgentID != agent {
			return refuse("forbidden", "the signed agent and the bearer's agent differ")
		}
		ri.agentID = agent
	}
	return nil
}

// hasDirect reports whether a direct credential exists for provider.
func (s *server) hasDirect(provider string) bool {
	if s.localCreds != nil {
		return s.localCreds[provider] != ""
	}
	return s.vault.directKey(provider) != ""
}

func (s *server) handleHealth(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": version})
}

// readiness is the body of GET /readyz.
type readiness struct {
	Ready    bool     `json:"ready"`
	Reasons  []string `json:"reasons"`
	Warnings []string `json:"warnings"`
}

func (s *server) handleReady(w http.ResponseWriter, r *http.Request) {
	rd := s.readiness()
	status := http.StatusOK
	if !rd.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, rd)
}

// readiness applies SPEC §13: ready when a payer exists and every state file
// that exists opens, passes the guards and parses. Sentences name files by
// role, never by a path outside the state directory.
func (s *server) readiness() readiness {
	rd := readiness{Reasons: []string{}, Warnings: []string{}}
	if s.st.dir == "" {
		rd.Warnings = append(rd.Warnings, "no state directory: "+s.st.cause.Error())
	}
	doc, err := s.reg.current()
	if err != nil && !errors.As(err, new(*noStateError)) {
		rd.Reasons = append(rd.Reasons, "route registry unusable: "+s.hidePath(err.Error(), s.reg.path))
	}
	vd, verr := s.vault.load()
	if verr != nil && !errors.As(verr, new(*noStateError)) {
		rd.Reasons = append(rd.Reasons, "vault unusable: "+s.hidePath(verr.Error(), s.vault.path))
	}
	if _, cerr := s.clients.load(); cerr != nil && !errors.Is(cerr, errFileAbsent) {
		rd.Reasons = append(rd.Reasons, "clients file unusable: "+s.hidePath(cerr.Error(), s.clients.path))
	}
	if err := s.ledger.loadErr(); err != nil {
		rd.Reasons = append(rd.Reasons, "ledger unusable (served empty, never overwritten): "+err.Error())
	}
	if jpath, err := s.st.path("journal", "journal.jsonl"); err == nil {
		if _, err := guardFile("journal", jpath); err != nil && !errors.Is(err, errFileAbsent) {
			rd.Reasons = append(rd.Reasons, "journal unusable: "+err.Error())
		}
	}
	if ok, cause := s.catalog.available(); !ok {
		rd.Warnings = append(rd.Warnings, cause)
	}
	for _, b := range s.journalBadLines() {
		rd.Warnings = append(rd.Warnings, "journal line "+strconv.Itoa(b.Line)+" is unreadable: "+b.Reason)
	}
	payer := len(s.localCreds) > 0 || (doc != nil && len(doc.Deployments) > 0)
	if s.localCreds == nil && vd != nil {
		for _, k := range vd.Direct {
			payer = payer || k.APIKey != ""
		}
	}
	invReasons, invWarnings, subPayer := s.inv.readiness()
	rd.Reasons = append(rd.Reasons, invReasons...)
	rd.Warnings = append(rd.Warnings, invWarnings...)
	payer = payer || subPayer
	if !payer {
		rd.Reasons = append(rd.Reasons, "no payer: no direct credential, declared deployment or active subscription")
	}
	rd.Ready = len(rd.Reasons) == 0
	return rd
}

// journalBadLines lists the journal's unreadable lines for /readyz.
func (s *server) journalBadLines() []journalBadLine {
	path, err := s.st.path("journal", "journal.jsonl")
	if err != nil {
		return nil
	}
	data, _, err := readGuarded("journal", path)
	if err != nil {
		return nil
	}
	_, bad, _ := readJournalLines(data)
	return bad
}

// hidePath keeps a file's location out of a /readyz sentence unless it lies
// inside the state directory.
func (s *server) hidePath(msg, path string) string {
	if path == "" || (s.st.dir != "" && strings.HasPrefix(path, s.st.dir+"/")) {
		return msg
	}
	return strings.ReplaceAll(msg, path, "(named by environment)")
}

func (s *server) handleAliases(w http.ResponseWriter, r *http.Request) {
	t, err := s.reg.aliases(s.hasDirect)
	if err != nil {
		s.fail(w, r, refuse("dependency_unavailable", "the route registry is unusable: %s", s.hidePath(err.Error(), s.reg.path)).because(err))
		return
	}
	writeJSON(w, http.StatusOK, t)
}

func (s *server) handleRoutesGet(w http.ResponseWriter, r *http.Request) {
	doc, err := s.reg.current()
	if err != nil {
		s.fail(w, r, refuse("state_conflict", "the route registry on disk is invalid: %s", s.hidePath(err.Error(), s.reg.path)).because(err))
		return
	}
	writeRaw(w, http.StatusOK, encodeRegistry(doc))
}

func (s *server) handleRoutesPut(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Alias string `json:"alias"`
		Route string `json:"route"`
	}
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	doc, err := s.reg.set(body.Alias, body.Route, infoFrom(r.Context()).client.ID)
	s.answerRoutes(w, r, doc, err)
}

func (s *server) handleRoutesDelete(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Alias string `json:"alias"`
	}
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	doc, err := s.reg.remove(body.Alias, infoFrom(r.Context()).client.ID)
	s.answerRoutes(w, r, doc, err)
}

// answerRoutes answers a registry write with the committed document.
func (s *server) answerRoutes(w http.ResponseWriter, r *http.Request, doc *routesDoc, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var buf bytes.Buffer
	buf.WriteString(`{"ok":true,"routes":`)
	buf.Write(bytes.TrimSpace(encodeRegistry(doc)))
	buf.WriteString("}\n")
	writeRaw(w, http.StatusOK, buf.Bytes())
}

// decodeBody strictly decodes an admin body: malformed JSON or an unknown
// member is 400 invalid_request naming it.
func decodeBody(r *http.Request, v any) error {
	body := infoFrom(r.Context()).body
	if err := decodeStrict("request body", body, v); err != nil {
		return refuse("invalid_request", "%s", err.Error())
	}
	return nil
}

// writeRaw writes already-encoded JSON.
func writeRaw(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// handleModels serves GET /v1/models: declared aliases with their state,
// then catalogue models of providers that can serve, in OpenAI's list shape.
func (s *server) handleModels(w http.ResponseWriter, r *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		State   string `json:"brama_state,omitempty"`
	}
	data := []model{}
	if t, err := s.reg.aliases(s.hasDirect); err == nil {
		for _, a := range t.Aliases {
			data = append(data, model{ID: a.Alias, Object: "model", OwnedBy: "brama", State: a.State})
		}
	}
	for _, p := range providerTable {
		if p.cred != credDirect || !s.hasDirect(p.id) {
			continue
		}
		for _, m := range s.catalog.models(p.id) {
			data = append(data, model{ID: p.id + "/" + m.ID, Object: "model", OwnedBy: p.id})
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// stats is the body of GET /stats.
type stats struct {
	Routes        map[string]perfEntry `json:"routes"`
	AttemptsTotal int64                `json:"attempts_total"`
	JournalBytes  int64                `json:"journal_bytes"`
	Maintenance   map[string]any       `json:"maintenance"`
}

func (s *server) stats() stats {
	size, _ := s.journal.size()
	return stats{
		Routes:        s.perf.snapshot(),
		AttemptsTotal: s.attempts.Load(),
		JournalBytes:  size,
		Maintenance:   s.maint.state(),
	}
}

func (s *server) handleStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.stats())
}

func (s *server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	st := s.stats()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	writeMetrics(w, st.Routes, map[string]float64{
		"brama_attempts_total": float64(st.AttemptsTotal),
		"brama_journal_bytes":  float64(st.JournalBytes),
	})
}
