package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"
)

// server is the HTTP face of Brama: what the handlers share.
type server struct {
	core
	guard    transportGuard
	mux      *http.ServeMux
	answers  *answerStore // signed answers (SPEC §12)
	replay   *replayGuard // SPEC §8.1
	maxBody  int64        // BRAMA_MAX_REQUEST_BYTES, the body limit
	inflight sync.RWMutex // read-held by every request: serve waits for their log lines (a WaitGroup cannot grow while waited on)
}

// handler is a route's function; routes writes its error in the envelope.
type handler func(http.ResponseWriter, *http.Request) error

const defaultMaxRequestBytes = 64 << 20 // unless BRAMA_MAX_REQUEST_BYTES names another

// routes is the only place URL patterns appear. Every route but /health and /readyz needs a client
// (SPEC §3.1), an admin one under /v1/admin/; a handler's error is written in the envelope.
func (s *server) routes() {
	s.mux = http.NewServeMux()
	handle := func(pattern string, h handler) {
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if err := s.caller(w, r, h); err != nil {
				s.fail(w, r, err)
			}
		})
	}
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, 200, map[string]string{"status": "ok", "version": version})
	})
	s.mux.HandleFunc("GET /readyz", s.handleReady)
	handle("POST /v1/chat/completions", s.handleModel(dialectChat, false))
	handle("POST /v1/messages", s.handleModel(dialectMessages, false))
	handle("POST /v1/messages/count_tokens", s.handleModel(dialectMessages, true))
	handle("POST /v1/responses", s.handleModel(dialectResponses, false))
	handle("POST /v1/embeddings", s.handleModel("embeddings", true))
	handle("GET /v1/models", reply(200, false, func(r *http.Request, _ *struct{}) (any, error) {
		ri, data := infoFrom(r.Context()), []listedModel{}
		t, _ := s.reg.aliases(s.hasDirect, ri.client.mayUse)
		for _, a := range t.Aliases {
			if !strings.HasSuffix(a.Alias, "*") { // a prefix alias is a family of names, not a model id
				data = append(data, listedModel{ID: a.Alias, Object: "model", OwnedBy: "brama", State: a.State})
			}
		}
		for _, p := range providerTable {
			serves := p.cred == credDirect && s.hasDirect(p.id)
			if p.cred == credSubscription && ri.client.AgentID != "" {
				subs, err := (&engine{core: &s.core, agent: ri.client.AgentID, t: &ri.tally}).eligible(p.id)
				serves = err == nil && len(subs) > 0
			}
			for _, m := range s.catalog.models(p.id) {
				if id := p.id + "/" + m.ID; serves && ri.client.mayUse(id) {
					data = append(data, listedModel{ID: id, Object: "model", OwnedBy: p.id})
				}
			}
		}
		return map[string]any{"object": "list", "data": data}, nil
	}))
	handle("GET /v1/aliases", reply(200, false, func(r *http.Request, _ *struct{}) (any, error) {
		t, err := s.reg.aliases(s.hasDirect, infoFrom(r.Context()).client.mayUse) // as /v1/models (SPEC §3.1)
		if err != nil {
			return nil, refuse("dependency_unavailable", "the route registry is unusable: %s", s.hidePath(err.Error(), s.reg.path)).because(err)
		}
		return t, nil
	}))
	handle("GET /metrics", func(w http.ResponseWriter, r *http.Request) error {
		size, _ := s.journal.size()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		extra := s.maint.metrics()
		extra["brama_attempts_total"], extra["brama_journal_bytes"] = float64(s.attempts.Load()), float64(size)
		writeMetrics(w, s.perf.snapshot(), extra)
		return nil
	})
	handle("GET /v1/admin/routes", func(w http.ResponseWriter, r *http.Request) error {
		doc, err := s.reg.current()
		if err != nil {
			return refuse("state_conflict", "the route registry on disk is invalid: %s", s.hidePath(err.Error(), s.reg.path)).because(err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(encodeRegistry(doc)) // the committed file's bytes
		return nil
	})
	// PUT sets an alias, DELETE removes it; the alias may serve now (SPEC §17). The answer is the committed document.
	setRoute := reply(200, true, func(r *http.Request, b *struct {
		Alias string  `json:"alias"`
		Route *string `json:"route"`
	}) (any, error) {
		if (r.Method == "PUT") != (b.Route != nil) {
			return nil, refuse("invalid_request", "PUT names an alias and its route; DELETE the alias alone")
		}
		doc, err := s.reg.set(b.Alias, b.Route, infoFrom(r.Context()).client.ID)
		if err != nil {
			return nil, err
		}
		s.replay.forget(b.Alias, "")
		return map[string]any{"ok": true, "routes": json.RawMessage(encodeRegistry(doc))}, nil
	})
	handle("PUT /v1/admin/routes", setRoute)
	handle("DELETE /v1/admin/routes", setRoute)
	// DELETE retires (the reason in the query, by default who retired it); POST …/reinstate puts back (the reason in the body).
	setRetired := reply(200, false, func(r *http.Request, b *struct {
		Reason string `json:"reason"`
	}) (any, error) {
		kind, reason := "reinstate", b.Reason
		if r.Method == "DELETE" {
			kind, reason = "retire", cmp.Or(r.URL.Query().Get("reason"), "retired by "+infoFrom(r.Context()).client.ID)
		}
		err := s.inv.setRetired(kind, r.PathValue("agent_id"), r.PathValue("subscription_id"), reason)
		s.maint.changed() // after the write: a pass between would cache the old state
		return map[string]bool{"ok": true}, err
	})
	for _, p := range []string{"/v1/subscriptions/{agent_id}", "/v1/admin/subscriptions/{agent_id}"} {
		handle("GET "+p, reply(200, false, func(r *http.Request, _ *struct{}) (any, error) {
			rows, err := s.inv.list(r.PathValue("agent_id"))
			return map[string]any{"subscriptions": rows}, err
		}))
		handle("POST "+p, reply(201, true, func(r *http.Request, b *donation) (any, error) {
			// On the admin route ?via=sign-in is a sign-in, journaled as one (SPEC §11.1).
			signIn := strings.HasPrefix(r.URL.Path, "/v1/admin/") && r.URL.Query().Get("via") == signInVia
			by := pick(signIn, infoFrom(r.Context()).client.ID, "")
			it, err := s.inv.store(overlayItem{AgentID: r.PathValue("agent_id"), Provider: b.Provider, Label: b.Label},
				vaultCredential{APIKey: b.APIKey, OAuth: b.OAuth}, by)
			s.credentialChanged(it)
			return map[string]donatedSubscription{"subscription": {overlayItem: it, Status: "active"}}, err // written only when err is nil
		}))
		handle("DELETE "+p+"/{subscription_id}", setRetired)
	}
	handle("POST /v1/admin/subscriptions/{agent_id}/{subscription_id}/reinstate", setRetired)
	handle("PUT /v1/admin/subscriptions/{agent_id}/{subscription_id}/credential",
		reply(200, true, func(r *http.Request, b *vaultCredential) (any, error) {
			it, err := s.inv.store(overlayItem{AgentID: r.PathValue("agent_id"), ID: r.PathValue("subscription_id")},
				*b, infoFrom(r.Context()).client.ID)
			if s.credentialChanged(it); err != nil {
				return nil, err
			}
			return map[string]any{"ok": true, "subscription": s.inv.row(it, false, s.now())}, nil // the row, never the secret
		}))
	// A provider's refusal of a probe is a 200 too: probe.ok false.
	handle("POST /v1/admin/subscriptions/{agent_id}/{subscription_id}/probe",
		reply(200, false, func(r *http.Request, b *struct {
			Model string `json:"model"`
		}) (any, error) {
			it, _, err := s.inv.owned(r.PathValue("agent_id"), r.PathValue("subscription_id"), "a retired subscription is never probed")
			if err != nil {
				return nil, err
			}
			e := &engine{core: &s.core, agent: r.PathValue("agent_id"), t: &infoFrom(r.Context()).tally}
			return e.probe(r.Context(), it, strings.TrimPrefix(strings.TrimSpace(b.Model), it.Provider+"/"))
		}))
	handle("POST /v1/admin/maintain", reply(200, false, func(r *http.Request, _ *struct{}) (any, error) {
		rep, err := s.maint.passNow(r.Context())
		if errors.Is(err, errMaintenanceStopped) { // no loop, or the server is stopping
			return nil, refuse("dependency_unavailable", "no pass can run: %v", err).because(err)
		}
		return rep, err
	}))
	handle("POST /v1/admin/vault/prune-orphans", reply(200, false, func(r *http.Request, _ *struct{}) (any, error) {
		ids, err := s.inv.pruneOrphans() // the vault's credentials no subscription names (SPEC §17)
		return map[string]any{"ok": true, "removed": ids}, err
	}))
}

// requestInfo is what a request's log line reports (SPEC §13), the engine's tally written in place, and the writer
// that remembers the status for it (Unwrap keeps Flush reachable).
type requestInfo struct {
	http.ResponseWriter
	tally
	client                      client
	routingMode, requestedModel string
	status                      int
	streamed, broken            bool
	body                        []byte // the raw request body, read once by caller (nil: not yet)
}

// dispatched: only a request that reached dispatch logs and sends its attempts, even 0 (SPEC §8.1).
func (ri *requestInfo) dispatched() bool { return ri.attempts > 0 || ri.counted }

type infoKey struct{} // infoFrom's key, set by ServeHTTP for every request

func infoFrom(ctx context.Context) *requestInfo { return ctx.Value(infoKey{}).(*requestInfo) }

// WriteHeader: an answer written before the body was read closes the connection (SPEC §7.4): without a read deadline
// net/http would still read 256 KiB of it, slowly.
func (ri *requestInfo) WriteHeader(code int) {
	if ri.status == 0 && ri.body == nil {
		ri.Header().Set("Connection", "close")
		http.NewResponseController(ri.ResponseWriter).SetReadDeadline(time.Now())
	}
	ri.status = cmp.Or(ri.status, code)
	ri.ResponseWriter.WriteHeader(code)
}

// Write notes a failed write (broken): the answer did not reach the caller whole.
func (ri *requestInfo) Write(b []byte) (int, error) {
	if ri.status == 0 {
		ri.WriteHeader(http.StatusOK)
	}
	n, err := ri.ResponseWriter.Write(b)
	ri.broken = ri.broken || err != nil
	return n, err
}

func (ri *requestInfo) Unwrap() http.ResponseWriter { return ri.ResponseWriter }

var testingOnlyBeforeLog func(*http.Request)

// ServeHTTP gives every response an X-Request-Id, applies the transport guard, turns the mux's own 404/405 into
// envelopes and logs SPEC §13's one line per request: never a prompt, a completion or a credential.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.RLock()
	defer s.inflight.RUnlock()
	start, ri := time.Now(), &requestInfo{ResponseWriter: w, tally: tally{requestID: rand.Text()}}
	w.Header().Set("X-Request-Id", ri.requestID)
	w.Header().Set("Cache-Control", "no-store") // every answer is one caller's
	if r.Body == http.NoBody {
		ri.body = []byte{} // nothing to read (a server's request Body is never nil)
	}
	r = r.WithContext(context.WithValue(r.Context(), infoKey{}, ri))
	defer func() {
		if testingOnlyBeforeLog != nil {
			testingOnlyBeforeLog(r)
		}
		// A hang-up after the whole answer was written (the Codex CLI's after response.completed) leaves it ok.
		if ri.outcome == "" && ri.dispatched() && ri.broken && r.Context().Err() != nil {
			ri.outcome = "client_cancelled"
		}
		if ri.outcome == "client_cancelled" && context.Cause(r.Context()) == errServerShutdown {
			ri.outcome = "server_shutdown"
		}
		str, num := slog.String, slog.Int // typed attributes: a value boxed into any costs an allocation
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", str("request_id", ri.requestID), str("method", r.Method),
			str("path", r.URL.Path), num("status", ri.status), str("client_id", ri.client.ID),
			str("agent_id", ri.client.AgentID), str("routing_mode", ri.routingMode), str("requested_model", ri.requestedModel),
			str("route", ri.route), str("outcome", cmp.Or(ri.outcome, "ok")), slog.Bool("retryable", ri.retryable),
			slog.Int64("latency_ms", time.Since(start).Milliseconds()), num("input_tokens", ri.input),
			num("output_tokens", ri.output), str("dropped", strings.Join(ri.dropped, ", ")), slog.Bool("streamed", ri.streamed),
			pick(ri.dispatched(), num("attempts", ri.attempts), slog.Attr{})) // a handler leaves an empty Attr out
	}()
	if h, pattern := s.mux.Handler(r); !s.guard.allows(r) {
		s.fail(ri, r, refuse("secure_transport_required", "this listener accepts plain HTTP only from loopback or a trusted proxy that received https"))
	} else if r.RequestURI == "*" || r.URL.EscapedPath() != path.Clean(r.URL.EscapedPath()) || pattern == "" {
		// OPTIONS * names the server (RFC 9110 §9.3.7); an unclean path (//, ., ..) would get the mux's own 307 in HTML.
		// Else say in the envelope what the mux would answer: 404, or 405 with Allow.
		rec, err := httptest.NewRecorder(), refuse("not_found", "no route for %s", r.URL.Path)
		if h.ServeHTTP(rec, r); rec.Code == http.StatusMethodNotAllowed {
			ri.Header()["Allow"] = rec.Header()["Allow"]
			err = refuse("method_not_allowed", "%s is not allowed on %s", r.Method, r.URL.Path)
		} else if strings.HasPrefix(r.URL.Path, "/v1/v1/") {
			err = refuse("not_found", "no route for %s; the client's base URL likely ends in /v1 and should not (e.g. ANTHROPIC_BASE_URL=http://127.0.0.1:8080, without /v1)", r.URL.Path)
		}
		s.fail(ri, r, err)
	} else {
		s.mux.ServeHTTP(ri, r) // not h.ServeHTTP: only the mux sets r.PathValue
	}
}

// fail writes err in the envelope and records its outcome for the log line; a refusal for want of a signed-in subscription asks for a pass (SPEC §11.2).
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	ri, ae := infoFrom(r.Context()), writeAPIError(w, r, err)
	if ae.Code == "subscription_reauthorization_required" {
		s.maint.request(ae.Code, cmp.Or(ri.client.AgentID, r.PathValue("agent_id")))
	}
	ri.outcome, ri.retryable = ae.Code, ae.Retryable
	if ae.Attempts != nil { // the engine's own count, when it made calls, wins
		ri.counted, ri.attempts = true, cmp.Or(ri.attempts, *ae.Attempts)
	}
	if ae.Err != nil {
		s.log.WarnContext(r.Context(), "request_refused", "request_id", ri.requestID, "code", ae.Code, "cause", redact(ae.Err.Error()))
	}
}

// caller admits r (an admin client under /v1/admin/, else any) by SPEC §3.1 and §3.2, recording
// who called before the body is read (SPEC §7.4), then reads the body whole within the limit and serves r with h.
func (s *server) caller(w http.ResponseWriter, r *http.Request, h handler) error {
	ri, admin := infoFrom(r.Context()), strings.Contains(r.Pattern, " /v1/admin/")
	if tok, err := presentedToken(r.Header); err != nil {
		return err
	} else if ri.client, err = s.clients.authenticate(tok); err != nil {
		return err
	}
	switch agent, p := ri.client.AgentID, r.PathValue("agent_id"); {
	case admin && ri.client.Role != roleAdmin:
		return refuse("forbidden", "this route needs an admin client")
	case p == "": // not a route acting for an agent (SPEC §3.2)
	case !idPattern.MatchString(p): // e.g. %2e%2e
		return refuse("invalid_request", "agent id %q in the path must match [a-z0-9-]{1,64}", p)
	case agent == "" && !admin:
		return refuse("forbidden", "this route acts for agent %q; use a bearer bound to it: brama clients add ID -agent %s", p, p)
	case agent != "" && agent != p:
		return refuse("forbidden", "this request acts for agent %q, not %q", agent, p)
	}
	limit, body, err := s.maxBody, []byte(nil), error(nil)
	ce := strings.Join(r.Header.Values("Content-Encoding"), ",") // each header: "identity" then "gzip" is compressed
	if r.ContentLength <= limit && ce != "" && !strings.EqualFold(ce, "identity") {
		return refuse("invalid_request", "a compressed request body (Content-Encoding) is not read; send it uncompressed")
	} else if r.ContentLength <= limit {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	}
	if _, tooBig := errors.AsType[*http.MaxBytesError](err); r.ContentLength > limit || tooBig {
		return refuse("invalid_request", "the request body is larger than BRAMA_MAX_REQUEST_BYTES (%d bytes)", limit).withStatus(413)
	} else if err != nil {
		return refuse("invalid_request", "the request body could not be read").because(err)
	}
	ri.body = body // not nil: io.ReadAll returns an empty slice for an empty body; handlers read it, never r.Body
	if err := checkNesting(body); err != nil {
		return refuse("invalid_request", "the request body %v", err)
	}
	return h(w, r)
}

// reply makes f a handler: the body, when required or a POST's not blank one (GET and DELETE bodies are not read),
// strictly decoded into B (malformed JSON or an unknown member is a 400 naming it), f's value written with status.
func reply[B any](status int, required bool, f func(*http.Request, *B) (any, error)) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		ri, b := infoFrom(r.Context()), new(B)
		if required || r.Method == "POST" && len(bytes.TrimSpace(ri.body)) > 0 {
			if err := decodeStrict("request body", ri.body, b); err != nil {
				return refuse("invalid_request", "%s", err.Error())
			}
		}
		v, err := f(r, b)
		if err != nil {
			return err
		} else if ri.dispatched() { // a probe's calls (SPEC §7.4)
			w.Header().Set("Brama-Attempts", fmt.Sprint(ri.attempts))
		}
		writeJSON(w, status, v)
		return nil
	}
}

// presentedToken is the one `Authorization: Bearer` or `x-api-key` token (SPEC §3.1; both carrying
// the same one count as one), or the 401 saying what was wrong without quoting it.
func presentedToken(h http.Header) (string, error) {
	auth, keys := h.Values("Authorization"), h.Values("X-Api-Key")
	bearer, key := "", strings.TrimSpace(strings.Join(keys, "")) // joined: more than one value is refused below
	if scheme, t, ok := strings.Cut(strings.Join(auth, ""), " "); ok && strings.EqualFold(scheme, "Bearer") {
		bearer = strings.TrimSpace(t) // another scheme than Bearer carries no token of Brama's
	}
	tok := cmp.Or(bearer, key)
	if len(auth) > 1 || len(keys) > 1 || tok != key && key != "" || strings.Contains(tok, ",") { // one token, not a list
		return "", refuse("unauthenticated", "two tokens: send one (ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN both set?)")
	} else if tok == "" {
		return "", refuse("unauthenticated", "no token: send Authorization: Bearer <token> or x-api-key")
	} else if strings.ContainsAny(tok, " \t") { // e.g. x-api-key: Bearer …
		return "", refuse("unauthenticated", notAClient)
	}
	return tok, nil
}

// transportGuard holds the trusted proxies by canonical IP: they, or loopback, may speak plain HTTP (SPEC §3.3).
type transportGuard map[string]bool

func newTransportGuard(list string) (transportGuard, error) {
	g := transportGuard{}
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' }) {
		if ip := net.ParseIP(f); ip != nil {
			g[ip.String()] = true
		} else {
			return g, fmt.Errorf("BRAMA_TRUSTED_PROXY_IPS: %q is not an IP address", f)
		}
	}
	return g, nil
}

// allows reports whether r came over an acceptable transport. A forwarded header counts by its last element, the
// proxy's own (RFC 7239 §4); every one naming a proto must say https: a proxy passes on, as written, one it does not set.
func (g transportGuard) allows(r *http.Request) bool {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() && !g[ip.String()] {
		return false
	}
	last := func(name string) string {
		v := strings.Join(r.Header.Values(name), ",")
		return strings.TrimSpace(v[strings.LastIndex(v, ",")+1:])
	}
	xfp, fwd := last("X-Forwarded-Proto"), ""
	for el := range strings.SplitSeq(last("Forwarded"), ";") {
		if k, v, ok := strings.Cut(strings.TrimSpace(el), "="); ok && strings.EqualFold(k, "proto") {
			fwd = strings.Trim(v, `"`)
		}
	}
	https := func(proto string) bool { return proto == "" || strings.EqualFold(proto, "https") }
	return ip.IsLoopback() || xfp+fwd != "" && https(xfp) && https(fwd)
}

// handleReady answers GET /readyz (SPEC §13); sentences name files by role, never by a path outside the state directory.
func (s *server) handleReady(w http.ResponseWriter, r *http.Request) {
	reasons, warnings := []string{}, []string{}
	warn := func(format string, args ...any) { warnings = append(warnings, fmt.Sprintf(format, args...)) }
	if s.st.dir == "" {
		warn("no state directory: %v", s.st.cause)
	} else if fi, err := os.Stat(s.st.dir); err != nil { // unreadable: its files say why
	} else if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() { // the files' own guards cannot see this
		warn("the state directory is owned by uid %d, not this process's uid %d, who may remove or replace its files", uid, os.Geteuid())
	} else if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		warn("the state directory has mode %#o: group or other may remove or replace its files, the journal too (chmod 700)", perm)
	}
	errOf := func(_ any, err error) error { return err } // a load's error alone
	check := func(what, env, path string, pathErr, err error) {
		if pathErr != nil && !errors.Is(pathErr, s.st.cause) { // not the value: it may lie outside the state directory
			warn("%s is not an absolute path, so that file has no place (§2.1's no state directory)", env)
		}
		if err != nil && !errors.Is(err, errNoState) && !errors.Is(err, errFileAbsent) { // no place or no file: nothing failed
			reasons = append(reasons, what+s.hidePath(err.Error(), path))
		}
	}
	check("route registry unusable: ", "BRAMA_ROUTES_FILE", s.reg.path, s.reg.pathErr, errOf(s.reg.current()))
	check("vault unusable: ", "BRAMA_VAULT_FILE", s.vault.path, s.vault.pathErr, errOf(s.vault.load()))
	check("clients file unusable: ", "BRAMA_CLIENTS_FILE", s.clients.path, s.clients.pathErr, errOf(s.clients.load()))
	check("", "", "", nil, errOf(s.inv.overlay.load())) // the error names the overlay and the rule
	check("ledger unusable (served empty, never overwritten): ", "", "", nil, s.ledger.unreadable)
	check("journal unusable: ", "", "", nil, errOf(s.journal.size()))
	check("answer key unusable (every signed answer is refused): ", "", "", nil, errOf(readAnswerKey(s.st, false)))
	if ids := s.vault.unwrittenIDs(); len(ids) > 0 {
		warn("the vault refused to keep the rotated OAuth grant of %s: it is used from memory and written again at the next maintenance pass (a restart before that loses it)", strings.Join(ids, ", "))
	}
	if data, cause := s.catalog.current(); data == nil {
		warn("%s", cause)
	}
	fo, _ := s.journal.folded() // an error folds nothing
	if warnings = append(warnings, fo.bad...); fo.badN > len(fo.bad) {
		warn("the journal holds %d more unreadable lines (brama journal check lists them)", fo.badN-len(fo.bad))
	}
	invWarnings, subPayer := s.inv.readiness()
	if warnings = append(warnings, invWarnings...); !subPayer && !s.anyDirectPayer() {
		reasons = append(reasons, "no payer: no direct credential, declared deployment or active subscription")
	}
	ready := len(reasons) == 0 // a map's keys are written sorted: ready, reasons, warnings
	writeJSON(w, pick(ready, 200, 503), map[string]any{"ready": ready, "reasons": reasons, "warnings": warnings})
}

// hidePath keeps a file's location out of a sentence unless it lies inside the state directory.
func (s *server) hidePath(msg, path string) string {
	if path == "" || (s.st.dir != "" && strings.HasPrefix(path, s.st.dir+"/")) {
		return msg
	}
	return strings.ReplaceAll(msg, path, "(named by environment)")
}

// credentialChanged tells maintenance and the replay guard (SPEC §17) of its new credential; it.ID "" is no change.
func (s *server) credentialChanged(it overlayItem) {
	if it.ID != "" {
		s.maint.changed()
		s.replay.forget("", it.Provider)
	}
}

// handleModel serves a chat route: read the head, resolve, pay, call; the body is parsed whole only to translate (SPEC
// §7.6). oneCall routes make one planned call (SPEC §15): count_tokens, and embeddings (the provider's JSON as is).
func (s *server) handleModel(dialect string, oneCall bool) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		ri := infoFrom(r.Context())
		req, err := readCallerRequest(dialect, r, ri.body)
		if err != nil {
			return err
		}
		e := &engine{core: &s.core, agent: ri.client.AgentID, t: &ri.tally}
		ri.requestedModel, ri.streamed = req.head.Model, req.head.Stream && !oneCall
		c, cands, err := e.planChat(ri.client, req, oneCall)
		if ri.routingMode, ri.route = c.res.Mode, c.res.Route; err != nil {
			return err
		} else if oneCall {
			if ae := e.serveModelCall(r.Context(), w, req, c); ae != nil {
				return ae
			}
			return nil
		}
		route := func(w http.ResponseWriter) {
			if ae := e.serveChat(r.Context(), w, req, c, cands); ae != nil {
				s.fail(w, r, ae)
			}
		}
		// SPEC §12: a signed answer reserves its key only now, after plan's checks; an empty value is refused.
		if keys, asked := r.Header["Idempotency-Key"]; asked {
			e.t.remember = func(*apiError, int, bool, bool) {} // its kept answer is its guard
			return s.answers.serve(r.Context(), w, signedCall{client: ri.client.ID, keys: keys, t: &ri.tally, req: req}, route)
		}
		ae, remember := s.replay.check(ri.client.ID, ri.client.AgentID, r.Header, req.body, c, cands)
		if e.t.remember = remember; ae != nil { // SPEC §8.1
			w.Header().Set("Brama-Replay-Refused", "true")
			return ae
		}
		route(w)
		return nil
	}
}
