package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// How a call kind is answered from its committed call: a chat request (passthrough or translated), count_tokens and
// embeddings. Signed answers (SPEC §12); the replay guard (§8.1).

// serveChat answers a planned chat request on w, passthrough or translated (SPEC §7.6), naming the model asked (a
// selector's: its candidate's route), or returns the refusal, told first to the replay guard (§8.1). After commit nothing
// is retried: a stream's failure is written in-band (streamed, §7.5), a buffered one returned.
func (e *engine) serveChat(ctx context.Context, w http.ResponseWriter, req *callerRequest, c call, cands []resolution) *apiError {
	deliver := func(ctx context.Context, c call, req *callerRequest, resp *http.Response) (u usage, failure *apiError, _ bool) {
		w.Header().Set("Brama-Route", c.res.Route)
		p, attempts, model := c.res.Provider, e.t.attempts, cmp.Or(e.route, req.head.Model)
		e.t.route = c.res.Route
		pass, tr := !req.translates(p), valueOr(req.sent, chatRequest{})
		if !pass && len(tr.Dropped) > 0 { // SPEC §7.6: nothing is dropped silently; tr and model serve translation only
			w.Header().Set("Brama-Dropped", headerText(strings.Join(tr.Dropped, ", ")))
			e.t.dropped = tr.Dropped
		}
		switch {
		case req.head.Stream:
			sa := openStreamAnswer(w, resp.Header, pass, req.dialect, tr, model, attempts)
			defer sa.close()
			var err error
			if u, err = sa.answer(c, resp.Body, nil, !pass, req.addsUsage(p)); err != nil {
				failure = asAPIError(err).withAttempts(attempts)        // a hang-up's is settle's
				e.t.remember(failure, attempts, ctx.Err() != nil, true) // before the caller can read it and fall back
				sa.finish(failure)
				e.log.Warn("stream_failed_after_commit", "request_id", e.t.requestID, "code", failure.Code, "cause", redact(fmt.Sprint(failure.Err), c.cred.bearer()))
			}
		case pass:
			u, failure = relayBuffered(w, c, resp, attempts, nil)
		default:
			u, failure = relayBuffered(w, c, resp, attempts, &callerStream{frames: formatOf(req.dialect).frames, req: tr, model: model})
		}
		return u, failure, req.head.Stream
	}
	kinds := map[string]budget{modeDirect: budgets.direct, modeAlias: budgets.direct, modeSubscription: budgets.subscription}
	j := &job{budget: cmp.Or(kinds[c.res.Mode], budgets.selector), build: buildChatRequest, commit: deliver}
	ae := e.attemptRoute(ctx, j, c, req, cands)
	e.t.remember(ae, e.t.attempts, ctx.Err() != nil, false) // the replay guard learns a refusal before the caller reads it
	return ae
}

// serveModelCall makes the one call of POST /v1/messages/count_tokens (the anthropic-messages provider's own count, else
// a local estimate) or of POST /v1/embeddings (a direct route to an openai-chat provider, its JSON as is), SPEC §15.
func (e *engine) serveModelCall(ctx context.Context, w http.ResponseWriter, req *callerRequest, c call) *apiError {
	p, embed := c.res.Provider, req.dialect == "embeddings"
	j := &job{budget: budgets.oneCall, build: func(ctx context.Context, c call, req *callerRequest) (*http.Request, error) {
		return req.passthrough(ctx, c, "/v1/messages/count_tokens", false)
	}, commit: func(_ context.Context, c call, _ *callerRequest, resp *http.Response) (u usage, ae *apiError, _ bool) {
		w.Header().Set("Brama-Route", c.res.Route)
		if embed { // a JSON object as received, else provider_failure
			u, ae = relayBuffered(w, c, resp, e.t.attempts, nil)
			return u, ae, false
		}
		var ans struct {
			InputTokens *int `json:"input_tokens"`
		}
		if b, err := readWhole(p, resp); err != nil {
			return u, asAPIError(err).withAttempts(e.t.attempts), false
		} else if err = json.Unmarshal(b, &ans); err != nil || ans.InputTokens == nil {
			return u, malformedAnswer(protoAnthropic, err).withAttempts(e.t.attempts), false
		}
		writeAnswer(w, resp.Header, true, "application/json", e.t.attempts,
			fmt.Appendf(nil, "{\"input_tokens\":%d}\n", *ans.InputTokens))
		return u, nil, false
	}}
	switch {
	case embed && c.res.Mode != modeDirect && c.res.Mode != modeAlias:
		return refuse("invalid_request", "embeddings take a direct or alias route; %q is paid by a subscription", req.head.Model)
	case embed && p.protocol != protoOpenAIChat:
		return refuse("invalid_request", "embeddings need an openai-chat provider; %q speaks %s", p.id, p.protocol)
	case embed:
		out := req.body.edit(memberEdit{"model", must(json.Marshal(c.res.Model))}) // the rest as received
		j.budget, j.build = budgets.direct, func(ctx context.Context, c call, _ *callerRequest) (*http.Request, error) {
			return newProviderRequest(ctx, c, nil, "/embeddings", out, false)
		}
	case p.protocol != protoAnthropic: // count_tokens; also selectors and best: no one route to ask
		if c.res.Route != "" {
			w.Header().Set("Brama-Route", c.res.Route)
		}
		w.Header().Set("Brama-Estimate", "true")
		writeJSON(w, http.StatusOK, map[string]int{"input_tokens": estimateInputTokens(req.body)})
		return nil
	}
	return e.attemptRoute(ctx, j, c, req, nil)
}

const (
	maxReplayMessage = 256           // message bytes a replay entry keeps: 10,000 entries stay a few MB
	answerInProgress = "in_progress" // record states (SPEC §12 item 4)
	answerComplete   = "complete"
	abandonedMessage = "this answer's process stopped before it was kept; a provider call may have been made" // SPEC §12 item 2
	unplaced         = "this request's one signed answer has no place to be kept: %v"                         // SPEC §2.1
)

var (
	errAnswerCorrupt     = errors.New("not a kept answer")           // wraps every decode error: not SPEC §12's shape
	errSignatureMismatch = errors.New("signature mismatch")          // `brama answers verify`'s refusal
	errServerShutdown    = errors.New("the server is shutting down") // serve's second signal: what it cancels keeps item 2's refusal
	errReplayRefused     = errors.New("replay guard: the same request was refused after a provider call")
	echoedInput          = []string{"instructions", "input", "prompt", "messages", "system"} // a kept answer's nulls (item 7)
)

// answerRecord is one kept-answer file (SPEC §12); in progress, the members only completion knows are null. Reserved by
// this process, it knows its path and the key that will sign it.
type answerRecord struct {
	SchemaVersion int     `json:"schema_version"`
	State         string  `json:"state"`
	BootID        string  `json:"boot_id"`
	Client        string  `json:"client"`
	KeySHA256     string  `json:"key_sha256"`
	RequestSHA256 string  `json:"request_sha256"`
	StartedAt     string  `json:"started_at"`
	CompletedAt   *string `json:"completed_at"`
	Status        *int    `json:"status"`
	Body          []byte  `json:"body_base64"` // encoding/json's standard base64
	Attempts      *int    `json:"attempts"`    // null: unknown (an abandoned answer)
	Route         string  `json:"route"`
	Signature     *string `json:"signature"`
	path          string
	key           []byte
}

// decodeAnswerRecord strictly parses a kept-answer file (decodeStrict runs validate); every error wraps errAnswerCorrupt.
func decodeAnswerRecord(b []byte) (*answerRecord, error) {
	rec := &answerRecord{}
	if err := decodeStrict("kept answer", b, rec); err != nil {
		return nil, fmt.Errorf("%w: %w", errAnswerCorrupt, err)
	}
	return rec, nil
}

func readAnswerFile(name string) (*answerRecord, error) {
	rec, _, err := (&stateFile[*answerRecord]{role: "kept answer", path: name, parse: decodeAnswerRecord, absentErr: true}).read()
	return rec, err
}

// validate checks that the record's members agree with its state, so a replay never meets a missing member.
func (rec *answerRecord) validate() error {
	open, done := rec.State == answerInProgress, rec.State == answerComplete
	isTime := func(s *string) bool {
		t, err := time.Parse(journalTimeFormat, *cmp.Or(s, new(string))) // nil parses as "": not a time
		return err == nil && t.Format(journalTimeFormat) == *s
	}
	return firstBroken([]rule{
		{rec.BootID == "" || !idPattern.MatchString(rec.Client), "boot_id is empty or client is not a client id"},
		{!isHexDigest(rec.KeySHA256) || !isHexDigest(rec.RequestSHA256), "key_sha256 or request_sha256 is not lower-case hex"},
		{!isTime(&rec.StartedAt) || done && !isTime(rec.CompletedAt), "started_at or completed_at is not RFC 3339 UTC with ms"},
		{rec.Attempts != nil && *rec.Attempts < 0, "attempts is negative"},
		{open && (rec.CompletedAt != nil || rec.Status != nil || rec.Body != nil || rec.Attempts != nil || rec.Signature != nil),
			"an answer in progress has completion members"},
		{!open && !done, "state is neither in_progress nor complete"},
		{done && (rec.Status == nil || *rec.Status < 100 || *rec.Status > 999), "status is not an HTTP status"},
		{done && rec.Body == nil, "body_base64 is null"},
		{done && (rec.Signature == nil || !isAnswerSignature(*rec.Signature)), "signature is not v1=<64 hex>"},
	})
}

func isAnswerSignature(s string) bool { return strings.HasPrefix(s, "v1=") && isHexDigest(s[3:]) }

// signAnswer is SPEC §12's signature: v1=<hex HMAC-SHA256(answer key, body)>.
func signAnswer(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return fmt.Sprintf("v1=%x", m.Sum(nil))
}

// readAnswerKey reads and guards $STATE/answer-key; create makes an absent one with publishFile, so of two creators one wins.
func readAnswerKey(st state, create bool) (key []byte, err error) {
	name, err := st.path("answer key", "answer-key")
	if err == nil {
		key, _, err = readGuarded("answer key", name)
	}
	if fresh := make([]byte, 32); create && errors.Is(err, errFileAbsent) {
		rand.Read(fresh)
		if err = publishFile(name, fresh); err == nil || errors.Is(err, os.ErrExist) {
			return readAnswerKey(st, false)
		}
	}
	if err == nil && len(key) != 32 {
		return nil, fmt.Errorf("answer key %s holds %d bytes, want 32", name, len(key))
	}
	return key, err
}

// answerStore keeps the signed answers; bootID, drawn once per process, tells our records from a stopped process's.
type answerStore struct {
	sys
	st     state
	bootID string
	unkept sync.Map // record path → true: left in progress because completing it failed
}

func newAnswerStore(st state, log *slog.Logger, now func() time.Time) *answerStore {
	return &answerStore{sys: sys{log: log, now: now}, st: st, bootID: rand.Text()}
}

// signedCall is a chat request carrying an Idempotency-Key as the store sees it.
type signedCall struct {
	client string
	keys   []string       // the header's values: exactly one is allowed
	t      *tally         // its route: the one planned, then the one that answered (a selector's candidate)
	req    *callerRequest // its body is digested; a refusal is written in its dialect
}

// serve answers c (SPEC §12), replaying a kept answer or keeping dispatch's; the error is a refusal for the caller to write.
// After dispatch the reservation is kept (signed) or released (item 3). After a provider call started, a hang-up or panic
// is kept (499, 500) so the key never spends twice; a retryable refusal, or one before dispatch, is released.
func (a *answerStore) serve(ctx context.Context, w http.ResponseWriter, c signedCall, dispatch func(http.ResponseWriter)) error {
	t, err := a.reserve(c)
	if err != nil {
		return err
	}
	if h := w.Header(); t.State == answerComplete { // replayed, with no provider call
		var env envelope
		if *t.Status/100 != 2 && json.Unmarshal(t.Body, &env) == nil && env.Error.Code != "" { // a kept refusal
			c.t.outcome, c.t.retryable = env.Error.Code, env.Error.Retryable
		}
		maps.Copy(h, http.Header{"Brama-Answer-Signature": {*t.Signature}, "Brama-Answer-Replayed": {"true"}, "Brama-Attempts": {"0"},
			"Content-Type": {"application/json"}, "X-Should-Retry": {fmt.Sprint(env.Error.Retryable)}}) // as delivered (SPEC §8.1)
		if t.Route != "" { // README: every answer names its route
			h.Set("Brama-Route", t.Route)
		}
		w.WriteHeader(*t.Status)
		w.Write(t.Body)
		c.t.counted = true
		return nil
	}
	rec, panicked := &httptest.ResponseRecorder{HeaderMap: http.Header{}, Body: new(bytes.Buffer)}, true // Code 0 until written
	// After a panic too the key is kept or released; the panic goes on (the connection is lost anyway).
	defer func() {
		calls, dispatched := c.t.attempts, c.t.attempts > 0 || rec.HeaderMap.Get("Brama-Attempts") != ""
		cut := func(ae *apiError) {
			rec = httptest.NewRecorder()
			writeAPIError(rec, c.req.caller, ae.withAttempts(calls))
			c.t.outcome, c.t.retryable = ae.Code, false
		}
		t.Route = c.t.route // a selector's: the candidate that answered
		switch {
		case rec.Code/100 == 2 && !panicked:
		case calls > 0 && panicked:
			cut(refuse("internal_error", "the answer failed inside Brama after a provider call started"))
		case calls > 0 && context.Cause(ctx) == errServerShutdown: // a stopped process's answer (item 2)
			cut(refuse("internal_error", abandonedMessage))
			c.t.outcome = "server_shutdown" // as every request a second stop signal cuts is logged
		case calls > 0 && ctx.Err() != nil:
			cut(refuse("client_cancelled", "the caller hung up after a provider call started"))
		case panicked, ctx.Err() != nil, rec.HeaderMap.Get("X-Should-Retry") == "true", !dispatched: // released
			if err := errors.Join(os.Remove(t.path), syncDir(filepath.Dir(t.path))); err != nil {
				a.log.Error("answer_release_failed", "request_id", c.t.requestID, "err", err)
			}
			t = nil
		}
		if t != nil { // nil: released
			if err := a.keep(t, rec, &calls); err != nil { // paid for: given unsigned rather than lost
				a.log.Error("answer_unkept", "request_id", c.t.requestID, "err", err)
			}
		}
		if !panicked {
			maps.Copy(w.Header(), rec.HeaderMap)
			w.WriteHeader(cmp.Or(rec.Code, http.StatusOK))
			w.Write(rec.Body.Bytes())
		}
	}()
	dispatch(rec)
	panicked = false
	return nil
}

// reserve, the last step before the first provider call (SPEC §12 item 1), returns the key's record: this request's
// reservation (in progress) or a complete one to replay (its signature checked); else a refusal: a bad key, a busy one,
// one left unkept, or, with no place, §2.1's. A stopped process's reservation is first completed as item 2's refusal.
func (a *answerStore) reserve(c signedCall) (*answerRecord, error) {
	if k := c.keys[0]; len(c.keys) > 1 || len(k) < 1 || len(k) > 255 || c.req.head.Stream ||
		strings.ContainsFunc(k, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
		return nil, refuse("invalid_request",
			"send one Idempotency-Key header of 1 to 255 printable ASCII characters, on a buffered request (not stream: true)")
	}
	// A client id names a directory: the clients file's validation holds it to idPattern.
	path, err := a.st.path("signed answers", filepath.Join("answers", c.client, hexSHA256([]byte(c.keys[0]))+".json"))
	for _, d := range []string{filepath.Dir(filepath.Dir(path)), filepath.Dir(path)} { // never a planted symlink
		if fi, lerr := os.Lstat(d); err == nil && lerr == nil && !fi.IsDir() {
			err = fmt.Errorf("%s is a symlink or not a directory", d)
		}
	}
	key, kerr := readAnswerKey(a.st, true)
	if err = cmp.Or(err, kerr); errors.Is(err, errNoState) { // SPEC §2.1: no place, and the home's cause
		err = a.st.cause
	}
	if err != nil {
		return nil, refuse("internal_error", unplaced, err).because(err)
	}
	t := &answerRecord{SchemaVersion: 1, State: answerInProgress, BootID: a.bootID, Client: c.client,
		KeySHA256: hexSHA256([]byte(c.keys[0])), RequestSHA256: hexSHA256(c.req.body.src),
		StartedAt: a.now().UTC().Format(journalTimeFormat), Route: c.t.route, path: path, key: key}
	data, _ := marshalState(t) // strings and ints always encode
	// A record removed (released, or pruned) or completed since our failed link frees or answers the key: try a few times.
	for range 3 {
		if err := publishFile(path, data); err == nil {
			return t, nil
		} else if !errors.Is(err, os.ErrExist) {
			return nil, refuse("internal_error", unplaced, err).because(err)
		}
		rec, err := readAnswerFile(path)
		_, unkept := a.unkept.Load(path)
		switch open := err == nil && rec.State == answerInProgress; {
		case errors.Is(err, errFileAbsent):
			continue
		case err != nil || rec.State == answerComplete && !hmac.Equal([]byte(signAnswer(key, rec.Body)), []byte(*rec.Signature)):
			err = cmp.Or(err, errSignatureMismatch)
			return nil, refuse("internal_error", "the kept answer for this Idempotency-Key is unreadable").because(err)
		case rec.RequestSHA256 != t.RequestSHA256:
			return nil, refuse("state_conflict", "this Idempotency-Key was used with another request body")
		case open && rec.BootID != a.bootID: // a stopped process's: kept as item 2's refusal, attempts unknown
			e := httptest.NewRecorder()
			writeAPIError(e, c.req.caller, refuse("internal_error", abandonedMessage))
			rec.path, rec.key = path, key
			if err = a.keep(rec, e, nil); err != nil {
				return nil, refuse("internal_error", "the abandoned answer for this Idempotency-Key could not be kept").because(err)
			}
			a.log.Warn("answer_abandoned", "client", rec.Client, "key_sha256", rec.KeySHA256, "boot_id", rec.BootID)
		case open && unkept:
			const why = "this answer was given once but could not be kept (see the log's answer_unkept); a provider call was made"
			return nil, refuse("internal_error", why)
		case open:
			continue // still being produced
		}
		return rec, nil
	}
	const busy = "the answer for this Idempotency-Key is still being produced; retry later" // the one retryable 409 (SPEC §8.1)
	return nil, &apiError{Code: "state_conflict", Type: codes["state_conflict"].typ, Message: busy, Retryable: true}
}

// keep completes the reservation t with the answer w holds (SPEC §12 item 3), signing w; attempts nil is
// unknown (item 2). The one way a record is completed: a kept answer, a cut one, a stopped process's. A keep that fails
// leaves t in progress, marked unkept: its key never spends twice (item 2).
func (a *answerStore) keep(t *answerRecord, w *httptest.ResponseRecorder, attempts *int) error {
	body := w.Body.Bytes() // the first answer is the kept body, the members repeating the caller's input null (item 7)
	if o, err := parseRawObject(body); err == nil {
		var edits []memberEdit
		for _, m := range o.members { // OpenAI Responses' instructions; a repeated member is edited when any is not null
			if k := string(m.key); slices.Contains(echoedInput, k) && string(o.src[m.val:m.end]) != "null" {
				edits = append(edits, memberEdit{k, []byte("null")})
			}
		}
		body = o.edit(edits...)
	}
	done, sig, status := a.now().UTC().Format(journalTimeFormat), signAnswer(t.key, body), w.Code
	t.State, t.CompletedAt, t.Status, t.Signature, t.Attempts = answerComplete, &done, &status, &sig, attempts
	t.Body, w.Body = append([]byte{}, body...), bytes.NewBuffer(body) // the record's own copy; w gives the kept body
	if err := writeState(t.path, t); err != nil {
		a.unkept.Store(t.path, true)
		return err
	}
	w.HeaderMap.Set("Brama-Answer-Signature", sig)
	return nil
}

// replayGuard refuses again, without a call, a request refused after a provider call (SPEC §8.1, §17: the Codex CLI and the
// official SDKs re-send a refused request, each maybe billed again), until its window ends or the operator's fix. In memory;
// every entry lives one window, so queue is in expiry order.
type replayGuard struct {
	window  time.Duration // 0: off
	now     func() time.Time
	mu      sync.Mutex                         // guards refused, held and queue
	refused map[[sha256.Size]byte]*replayEntry // digest (its client's own) → refusal
	held    map[string]int                     // client id → its entries in refused: a client with none takes no digest
	queue   []*replayEntry                     // a forgotten entry stays queued until its time passes
}

// replayEntry is one remembered refusal (status 0: its code's); a fix of its alias or providers forgets it (SPEC §17).
type replayEntry struct {
	status        int
	code, message string
	alias, client string
	providers     []string
	until         time.Time // refused at until - window
	key           [sha256.Size]byte
}

// newReplayGuard reads BRAMA_REPLAY_GUARD_SECS: unset is 120 s, 0 turns the guard off; anything unreadable is logged and 120 s.
func newReplayGuard(getenv func(string) string, log *slog.Logger, now func() time.Time) *replayGuard {
	window := envSeconds(getenv, "BRAMA_REPLAY_GUARD_SECS", "replay_guard_secs_invalid", 0, 120, log)
	return &replayGuard{window: window, now: now, refused: map[[sha256.Size]byte]*replayEntry{}, held: map[string]int{}}
}

// replayLeftOut is what a digest leaves out, strict and loose: stream members (SPEC §17: a buffered fallback from a failed
// stream asks the same request), client_metadata (digested apart in key order: the Codex CLI re-sends it from a hash map),
// and for the loose key (all six) the output limit (Claude Code's fallback asks 64000 of 128000).
var replayLeftOut = []memberEdit{{key: "stream"}, {key: "stream_options"}, {key: "client_metadata"},
	{key: "max_tokens"}, {key: "max_completion_tokens"}, {key: "max_output_tokens"}}

// replayKeyOf digests client, scope and the body's bytes but replayLeftOut: no generic decode, so the cost is the body's.
func replayKeyOf(clientID, scope string, body rawObject, loose bool) [sha256.Size]byte {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s%d:%s%t:", len(clientID), clientID, len(scope), scope, loose)
	meta := body.value("client_metadata")
	if o, ok := splitRaw(meta, '{', nil); ok {
		slices.SortFunc(o.members, func(a, b jsonMember) int { return bytes.Compare(a.key, b.key) })
		for _, m := range o.members {
			fmt.Fprintf(h, "%d:%s", len(m.key), m.key)
			h.Write(o.src[m.val:m.end])
		}
	} else {
		h.Write(meta) // not an object: its bytes as they are
	}
	body.writeEdited(h, replayLeftOut[:3+3*boolCount(loose)]...)
	return [sha256.Size]byte(h.Sum(nil))
}

// locked runs f holding mu, first forgetting every entry whose time has passed, so refused holds only live ones.
func (g *replayGuard) locked(f func(now time.Time)) {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.queue) > 0 && !now.Before(g.queue[0].until) {
		if q := g.queue[0]; g.refused[q.key] == q {
			g.drop(q)
		}
		g.queue = g.queue[1:]
	}
	if len(g.queue) == 0 {
		g.queue = nil // let the backing array go
	}
	f(now)
}

// drop forgets e, and its client with its last entry: a client pays for a digest only while it holds one.
func (g *replayGuard) drop(e *replayEntry) {
	delete(g.refused, e.key)
	if g.held[e.client]--; g.held[e.client] == 0 {
		delete(g.held, e.client)
	}
}

// forget drops every refusal of a request through alias or provider ("" names none): the operator's fix (SPEC §17).
func (g *replayGuard) forget(alias, provider string) {
	g.locked(func(time.Time) {
		for _, e := range g.refused {
			if alias != "" && e.alias == alias || provider != "" && slices.Contains(e.providers, provider) {
				g.drop(e)
			}
		}
	})
}

// check is the replay guard at a planned request of client (SPEC §8.1). refusal repeats the one remembered under the
// request's strict or loose key (its status and code, not retryable, no call made); a client with none remembered takes
// no digest. remember is tally's (a no-op when off): a non-retryable refusal after a call, not a reauthorization (signing in must
// pass), is kept for the request until the window ends. A refusal that may have generated is kept under the loose key,
// which the same request also has: a caller that fixes its output limit after provider_rejected asks a new request.
func (g *replayGuard) check(client, agent string, h http.Header, body rawObject, c call, cands []resolution) (
	refusal *apiError, remember func(ae *apiError, attempts int, hungUp, streamed bool)) {
	if g.window <= 0 {
		return nil, func(*apiError, int, bool, bool) {}
	}
	scope := func() string { // what reaches a provider beside the body: route, key fingerprint (§17), agent, version headers (§6.2)
		return fmt.Sprintf("%q", [][]string{{agent, c.res.Route, c.res.BaseURL, hexSHA256([]byte(c.cred.APIKey))},
			h.Values("anthropic-version"), h.Values("anthropic-beta"), h.Values("openai-beta")})
	}
	var e *replayEntry
	held := false
	g.locked(func(time.Time) { held = g.held[client] > 0 })
	if held { // the digests cost the body's bytes: taken outside the lock every request passes
		s := scope()
		strict, loose := replayKeyOf(client, s, body, false), replayKeyOf(client, s, body, true)
		g.locked(func(time.Time) { e = cmp.Or(g.refused[strict], g.refused[loose]) })
	}
	if e != nil {
		refusal = refuse(e.code, "this request repeats one refused at %s after a provider call (%s); the same request is refused without a provider call until %s (BRAMA_REPLAY_GUARD_SECS)",
			e.until.Add(-g.window).UTC().Format(time.RFC3339), strings.TrimSuffix(e.code+": "+e.message, ": "), e.until.UTC().Format(time.RFC3339))
		refusal.withStatus(e.status).because(errReplayRefused).withAttempts(0)
	}
	return refusal, func(ae *apiError, attempts int, hungUp, streamed bool) {
		if ae == nil || attempts == 0 || hungUp || ae.Retryable ||
			ae.Code == "client_cancelled" || ae.Code == "subscription_reauthorization_required" {
			return
		}
		loose := ae.Code == "provider_incomplete" || ae.Code == "provider_failure"
		e := &replayEntry{code: ae.Code, alias: c.res.Alias, client: client, key: replayKeyOf(client, scope(), body, loose)}
		if !streamed { // a streamed one, met in-band under a 200, keeps its code's status and no message
			e.status, e.message = ae.Status(), truncateUTF8(ae.Message, maxReplayMessage)
		}
		for _, cand := range append([]resolution{c.res}, cands...) { // a provider twice does no harm
			e.providers = append(e.providers, cand.Provider.id)
		}
		g.locked(func(now time.Time) {
			if e.until = now.Add(g.window); g.refused[e.key] == nil {
				g.held[client]++
			}
			g.refused[e.key] = e
			g.queue = append(g.queue, e)
		})
	}
}
