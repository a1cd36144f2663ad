package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// server is the HTTP face of Brama: what the handlers share.
type server struct {
	core
	guard   transportGuard
	mux     *http.ServeMux
	answers *answerStore // signed answers (SPEC §12)
	replay  *replayGuard // SPEC §8.1; nil: off
	maxBody int64        // BRAMA_MAX_REQUEST_BYTES; 0: the default
	// inflight is read-held by every request being served, so serve can wait
	// for their log lines at shutdown (a WaitGroup may not grow while waited on).
	inflight sync.RWMutex
}

// core is the daemon's parts that the server and every request's engine
// share, built once by serve.
type core struct {
	deps   // st, clients, vault, journal, reg
	sys    // log, now
	getenv func(string) string
	// localCreds holds -local-credentials-stdin keys; when non-nil it is the
	// only source of direct credentials (SPEC §16).
	localCreds map[string]string
	client     *http.Client // provider calls: no timeout, no redirects, no proxy
	catalog    *catalog
	perf       *perfRegistry
	keepAlive  time.Duration // 0: keepAliveEvery; tests shorten it
	attempts   atomic.Int64  // provider calls made since start, for /metrics
	ledger     *ledger
	inv        *inventory
	oauth      *oauthClient
	pins       sync.Map // agent "\x00" provider → the subscription that last served it (pin)
	maint      *maintainer
}

// routes is the only place URL patterns appear.
func (s *server) routes() {
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /health", s.handleHealth)
	s.mux.HandleFunc("GET /readyz", s.handleReady)
	s.mux.Handle("POST /v1/chat/completions", s.caller("", s.handleChat(dialectChat)))
	s.mux.Handle("POST /v1/messages", s.caller("", s.handleChat(dialectMessages)))
	s.mux.Handle("POST /v1/messages/count_tokens", s.caller("", s.handleCountTokens))
	s.mux.Handle("POST /v1/responses", s.caller("", s.handleChat(dialectResponses)))
	s.mux.Handle("POST /v1/embeddings", s.caller("", s.handleEmbeddings))
	s.mux.Handle("GET /v1/models", s.caller("", s.handleModels))
	s.mux.Handle("GET /v1/aliases", s.caller("", s.handleAliases))
	s.mux.Handle("GET /metrics", s.caller("", s.handleMetrics))
	s.mux.Handle("GET /v1/admin/routes", s.caller(roleAdmin, s.handleRoutesGet))
	s.mux.Handle("PUT /v1/admin/routes", s.caller(roleAdmin, s.handleRoutesWrite))
	s.mux.Handle("DELETE /v1/admin/routes", s.caller(roleAdmin, s.handleRoutesWrite))
	s.mux.Handle("GET /v1/subscriptions/{agent_id}", s.caller("", s.reply(200, s.listSubscriptions)))
	s.mux.Handle("POST /v1/subscriptions/{agent_id}", s.caller("", s.reply(201, s.donateSubscription)))
	s.mux.Handle("DELETE /v1/subscriptions/{agent_id}/{subscription_id}", s.caller("", s.reply(200, s.retireSubscription)))
	s.mux.Handle("GET /v1/admin/subscriptions/{agent_id}", s.caller(roleAdmin, s.reply(200, s.listSubscriptions)))
	s.mux.Handle("POST /v1/admin/subscriptions/{agent_id}", s.caller(roleAdmin, s.reply(201, s.donateSubscription)))
	s.mux.Handle("DELETE /v1/admin/subscriptions/{agent_id}/{subscription_id}", s.caller(roleAdmin, s.reply(200, s.retireSubscription)))
	s.mux.Handle("POST /v1/admin/subscriptions/{agent_id}/{subscription_id}/reinstate", s.caller(roleAdmin, s.reply(200, s.reinstateSubscription)))
	s.mux.Handle("POST /v1/admin/maintain", s.caller(roleAdmin, s.reply(200, s.maintainNow)))
	s.mux.Handle("POST /v1/admin/vault/prune-orphans", s.caller(roleAdmin, s.reply(200, s.pruneOrphans)))
	s.mux.Handle("PUT /v1/admin/subscriptions/{agent_id}/{subscription_id}/credential", s.caller(roleAdmin, s.reply(200, s.replaceCredential)))
	s.mux.Handle("POST /v1/admin/subscriptions/{agent_id}/{subscription_id}/probe", s.caller(roleAdmin, s.handleSubscriptionProbe))
}

// requestInfo is what the per-request log line reports (SPEC §13).
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
	dropped        []string // caller members a translation dropped (SPEC §7.6)
	body           []byte   // the raw request body, read once by the auth wrapper (nil: not yet)
}

type infoKey struct{}

func infoFrom(ctx context.Context) *requestInfo {
	if ri, ok := ctx.Value(infoKey{}).(*requestInfo); ok {
		return ri
	}
	return &requestInfo{}
}

// statusWriter remembers the status for the log line (Unwrap keeps Flush
// reachable). An answer written before the body was read closes the
// connection (SPEC §7.4), so a slow body cannot hold it.
type statusWriter struct {
	http.ResponseWriter
	status int
	unread func() bool // the request has a body not read (nil: none)
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		if w.unread != nil && w.unread() {
			w.Header().Set("Connection", "close")
			// Without a read deadline net/http would still read up to 256 KiB
			// of the body after the answer, at the sender's pace.
			http.NewResponseController(w.ResponseWriter).SetReadDeadline(time.Now())
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// errServerShutdown cancels the requests running at serve's second signal,
// so their log lines say server_shutdown, not client_cancelled.
var errServerShutdown = errors.New("the server is shutting down")

// ServeHTTP gives every response an X-Request-Id, applies the transport
// guard, turns the mux's own 404/405 into envelopes and logs one line.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.RLock()
	defer s.inflight.RUnlock()
	start := time.Now()
	ri := &requestInfo{id: newRequestID()}
	w.Header().Set("X-Request-Id", ri.id)
	w.Header().Set("Cache-Control", "no-store") // every answer is one caller's
	sw := &statusWriter{ResponseWriter: w}
	if r.Body != nil && r.Body != http.NoBody {
		sw.unread = func() bool { return ri.body == nil }
	}
	r = r.WithContext(context.WithValue(r.Context(), infoKey{}, ri))
	defer func() {
		ri.outcome = cmp.Or(ri.outcome, "ok")
		if ri.outcome == "ok" && ri.attempts != nil && r.Context().Err() != nil {
			ri.outcome = "client_cancelled"
		}
		if ri.outcome == "client_cancelled" && context.Cause(r.Context()) == errServerShutdown {
			ri.outcome = "server_shutdown"
		}
		s.logRequest(r, ri, sw.status, time.Since(start))
	}()
	switch h, pattern := s.mux.Handler(r); {
	case !s.guard.allows(r):
		s.fail(sw, r, refuse("secure_transport_required", "this listener accepts plain HTTP only from loopback or a trusted proxy that received https"))
	case r.RequestURI == "*":
		// OPTIONS * (RFC 9110 §9.3.7) names the server, not a route; Brama
		// serves no such request, and says so in the envelope.
		s.fail(sw, r, refuse("not_found", "no route for %s *", r.Method))
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

// notRouted says in the envelope what the mux would answer (404, or 405
// with Allow).
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
	hint := ""
	if strings.HasPrefix(r.URL.Path, "/v1/v1/") {
		hint = "; the client's base URL likely ends in /v1 and should not (e.g. ANTHROPIC_BASE_URL=http://127.0.0.1:8080, without /v1)"
	}
	s.fail(w, r, refuse("not_found", "no route for %s%s", r.URL.Path, hint))
}

func newRequestID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// fail writes err in the envelope and records its outcome for the log line;
// a refusal for want of a signed-in subscription asks for a pass (SPEC §11.2).
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	ri := infoFrom(r.Context())
	ae := writeAPIError(w, r, err)
	if ae.Code == "subscription_reauthorization_required" {
		s.maint.request(ae.Code, cmp.Or(ri.agentID, r.PathValue("agent_id")))
	}
	ri.outcome, ri.retryable = ae.Code, ae.body().Error.Retryable
	if ae.Attempts != nil {
		ri.attempts = ae.Attempts
	}
	if ae.Err != nil {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "request_refused", slog.String("request_id", ri.id), slog.String("code", ae.Code), slog.String("cause", redact(ae.Err.Error())))
	}
}

// logRequest writes SPEC §13's one line per request: never a prompt, a
// completion or a credential.
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
		slog.String("dropped", strings.Join(ri.dropped, ", ")),
		slog.Bool("streamed", ri.streamed),
	}
	if ri.attempts != nil {
		attrs = append(attrs, slog.Int("attempts", *ri.attempts))
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// caller wraps h so it runs only once authenticate accepts the request for
// role ("": any client; roleAdmin for /v1/admin/*, SPEC §3.1) and agent (actsFor).
func (s *server) caller(role string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.authenticate(w, r, role); err != nil {
			s.fail(w, r, err)
			return
		}
		h(w, r)
	})
}

// authenticate applies SPEC §3.1 and §3.2 to r and records who called,
// before any body is read.
func (s *server) authenticate(w http.ResponseWriter, r *http.Request, role string) error {
	ri := infoFrom(r.Context())
	tok, err := presentedToken(r.Header)
	if err != nil {
		return err
	}
	cl, err := s.clients.authenticate(tok)
	if err != nil {
		return err
	}
	ri.client, ri.agentID = cl, cl.AgentID
	if role != "" && cl.Role != role {
		return refuse("forbidden", "this route needs an admin client")
	}
	if err := actsFor(r, role, cl.AgentID); err != nil {
		return err
	}
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	if err := checkNesting(body); err != nil {
		return refuse("invalid_request", "the request body %v", err)
	}
	return nil
}

// actsFor applies SPEC §3.2: a route for the path's agent needs a valid id
// (`%2e%2e`: 400) and a bearer bound to that agent (an admin route: any).
func actsFor(r *http.Request, role, agent string) error {
	switch path := r.PathValue("agent_id"); {
	case path == "": // not a route acting for an agent
	case !idPattern.MatchString(path):
		return refuse("invalid_request", "agent id %q in the path must match [a-z0-9-]{1,64}", path)
	case agent == "" && role != roleAdmin:
		return refuse("forbidden", "this route acts for agent %q; use a bearer bound to it: brama clients add ID -agent %s", path, path)
	case agent != "" && agent != path:
		return refuse("forbidden", "this request acts for agent %q, not %q", agent, path)
	}
	return nil
}

// defaultMaxRequestBytes is BRAMA_MAX_REQUEST_BYTES unset (SPEC §7.4).
const defaultMaxRequestBytes = 64 << 20

// readBody reads r's whole body, at most s.maxBody bytes (SPEC §7.4).
func (s *server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	limit := cmp.Or(s.maxBody, defaultMaxRequestBytes) // 0 outside serve
	tooLarge := refuse("invalid_request", "the request body is larger than BRAMA_MAX_REQUEST_BYTES (%d bytes)", limit).withStatus(http.StatusRequestEntityTooLarge)
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return nil, refuse("invalid_request", "a compressed request body (Content-Encoding) is not read; send it uncompressed")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if errors.As(err, new(*http.MaxBytesError)) {
		return nil, tooLarge
	}
	if err != nil {
		return nil, refuse("invalid_request", "the request body could not be read").because(err)
	}
	ri := infoFrom(r.Context())
	ri.body = body // not nil: io.ReadAll returns an empty slice for an empty body
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// anyDirectPayer reports whether something could serve without an agent
// (SPEC §13, §14): a direct credential or a declared deployment.
func (s *server) anyDirectPayer() bool {
	if doc, err := s.reg.current(); len(s.localCreds) > 0 || (err == nil && len(doc.Deployments) > 0) {
		return true
	}
	vd, err := s.vault.load()
	if s.localCreds != nil || err != nil {
		return false
	}
	for _, k := range vd.Direct {
		if k.APIKey != "" {
			return true
		}
	}
	return false
}

// hasDirect reports whether a direct credential exists for provider.
func (c *core) hasDirect(provider string) bool {
	if c.localCreds != nil {
		return c.localCreds[provider] != ""
	}
	return c.vault.directKey(provider) != ""
}

// mayHaveDirect is hasDirect, and true when the vault is unreadable: a request
// then meets the vault's refusal, not "no direct credential" (SPEC §2.2).
func (c *core) mayHaveDirect(provider string) bool {
	_, err := c.vault.load()
	return c.hasDirect(provider) || c.localCreds == nil && err != nil && !errors.As(err, new(*noStateError))
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

// handleReady applies SPEC §13. Sentences name files by role, never by a
// path outside the state directory.
func (s *server) handleReady(w http.ResponseWriter, r *http.Request) {
	rd := readiness{Reasons: []string{}, Warnings: []string{}}
	if s.st.dir == "" {
		rd.Warnings = append(rd.Warnings, "no state directory: "+s.st.cause.Error())
	} else if why := dirExposure(s.st.dir); why != "" {
		rd.Warnings = append(rd.Warnings, "the state directory "+why)
	}
	for _, f := range []struct {
		env string
		err error
	}{{"BRAMA_ROUTES_FILE", s.reg.pathErr}, {"BRAMA_VAULT_FILE", s.vault.pathErr}, {"BRAMA_CLIENTS_FILE", s.clients.pathErr}} {
		if f.err != nil && !errors.Is(f.err, s.st.cause) { // not the value: it may lie outside the state directory
			rd.Warnings = append(rd.Warnings, f.env+" is not an absolute path, so that file has no place (§2.1's no state directory)")
		}
	}
	if _, err := s.reg.current(); err != nil && !errors.As(err, new(*noStateError)) {
		rd.Reasons = append(rd.Reasons, "route registry unusable: "+s.hidePath(err.Error(), s.reg.path))
	}
	if _, verr := s.vault.load(); verr != nil && !errors.As(verr, new(*noStateError)) {
		rd.Reasons = append(rd.Reasons, "vault unusable: "+s.hidePath(verr.Error(), s.vault.path))
	}
	if _, cerr := s.clients.load(); cerr != nil && !errors.Is(cerr, errFileAbsent) {
		rd.Reasons = append(rd.Reasons, "clients file unusable: "+s.hidePath(cerr.Error(), s.clients.path))
	}
	if err := s.ledger.unreadable; err != nil {
		rd.Reasons = append(rd.Reasons, "ledger unusable (served empty, never overwritten): "+err.Error())
	}
	if _, err := s.journal.size(); err != nil && !errors.As(err, new(*noStateError)) {
		rd.Reasons = append(rd.Reasons, "journal unusable: "+err.Error())
	}
	if _, _, err := readAnswerKey(s.st); err != nil && !errors.Is(err, errFileAbsent) && !errors.As(err, new(*noStateError)) {
		rd.Reasons = append(rd.Reasons, "answer key unusable (every signed answer is refused): "+err.Error())
	}
	if ids := s.vault.unwrittenIDs(); len(ids) > 0 {
		rd.Warnings = append(rd.Warnings, "the vault refused to keep the rotated OAuth grant of "+strings.Join(ids, ", ")+
			": it is used from memory and written again at the next maintenance pass (a restart before that loses it)")
	}
	if data, cause := s.catalog.current(); data == nil {
		rd.Warnings = append(rd.Warnings, cause)
	}
	if bad, n, err := s.journal.badLines(); err == nil {
		for _, b := range bad {
			rd.Warnings = append(rd.Warnings, "journal line "+strconv.Itoa(b.Line)+" is unreadable: "+b.Reason)
		}
		if n > len(bad) {
			rd.Warnings = append(rd.Warnings, fmt.Sprintf("the journal holds %d more unreadable lines (brama journal check lists them)", n-len(bad)))
		}
	}
	payer := s.anyDirectPayer()
	invReasons, invWarnings, subPayer := s.inv.readiness()
	rd.Reasons = append(rd.Reasons, invReasons...)
	rd.Warnings = append(rd.Warnings, invWarnings...)
	if !payer && !subPayer {
		rd.Reasons = append(rd.Reasons, "no payer: no direct credential, declared deployment or active subscription")
	}
	status := http.StatusOK
	if rd.Ready = len(rd.Reasons) == 0; !rd.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, rd)
}

// dirExposure is why another user may remove or replace the files in dir,
// which their own guards cannot see; "" when none may (or dir is unreadable).
func dirExposure(dir string) string {
	fi, err := os.Stat(dir)
	if err != nil {
		return ""
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() {
		return fmt.Sprintf("is owned by uid %d, not this process's uid %d, who may remove or replace its files", uid, os.Geteuid())
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Sprintf("has mode %#o: group or other may remove or replace its files, the journal too (chmod 700)", perm)
	}
	return ""
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
	if cl := infoFrom(r.Context()).client; cl.AllowedModels != nil { // as /v1/models: only the names it may use (SPEC §3.1)
		t.Aliases = slices.DeleteFunc(t.Aliases, func(a aliasRow) bool { return !cl.mayUse(a.Alias) })
		t.Unserviceable = 0
		for _, a := range t.Aliases {
			if a.State != stateServing {
				t.Unserviceable++
			}
		}
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

// handleRoutesWrite serves PUT {"alias","route"} and DELETE {"alias"} on
// /v1/admin/routes, answering with the committed document.
func (s *server) handleRoutesWrite(w http.ResponseWriter, r *http.Request) {
	var set struct {
		Alias string `json:"alias"`
		Route string `json:"route"`
	}
	var rm struct {
		Alias string `json:"alias"`
	}
	var doc *routesDoc
	by := infoFrom(r.Context()).client.ID
	var err error
	if r.Method == http.MethodPut {
		if err = decodeBody(r, &set, false); err == nil {
			doc, err = s.reg.set(set.Alias, set.Route, by)
		}
	} else if err = decodeBody(r, &rm, false); err == nil {
		doc, err = s.reg.remove(rm.Alias, by)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.replay.forget(cmp.Or(set.Alias, rm.Alias), "") // SPEC §17: the alias written may serve now
	writeRaw(w, http.StatusOK, fmt.Appendf(nil, "{\"ok\":true,\"routes\":%s}\n", bytes.TrimSpace(encodeRegistry(doc))))
}

// decodeBody strictly decodes an admin body (optional: an empty one too):
// malformed JSON or an unknown member is 400 invalid_request naming it.
func decodeBody(r *http.Request, v any, optional bool) error {
	body := infoFrom(r.Context()).body
	if optional && len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
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

// handleModels serves GET /v1/models in OpenAI's list shape: the aliases,
// then the catalogue models of providers that can serve (a direct key, or
// the caller's agent's subscription), each only if the caller may use it (SPEC §3.1).
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
			if !strings.HasSuffix(a.Alias, "*") { // a prefix alias is a family of names, not a model id
				data = append(data, model{ID: a.Alias, Object: "model", OwnedBy: "brama", State: a.State})
			}
		}
	}
	ri := infoFrom(r.Context())
	for _, p := range providerTable {
		serves := p.cred == credDirect && s.hasDirect(p.id)
		if p.cred == credSubscription && ri.agentID != "" { // the caller's agent's own subscriptions
			subs, _, err := s.engine(ri).eligible(ri.agentID, p.id)
			serves = err == nil && len(subs) > 0
		}
		if !serves {
			continue
		}
		for _, m := range s.catalog.models(p.id) {
			data = append(data, model{ID: p.id + "/" + m.ID, Object: "model", OwnedBy: p.id})
		}
	}
	data = slices.DeleteFunc(data, func(m model) bool { return !ri.client.mayUse(m.ID) })
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// handleMetrics serves GET /metrics, the one exposition (SPEC §13).
func (s *server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	size, _ := s.journal.size()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	extra := s.maint.metrics()
	extra["brama_attempts_total"], extra["brama_journal_bytes"] = float64(s.attempts.Load()), float64(size)
	writeMetrics(w, s.perf.snapshot(), extra)
}
