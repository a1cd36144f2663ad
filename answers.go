package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Signed answers (SPEC §12): one provider spend per (client, Idempotency-Key). The first request publishes an in-progress record
// (os.Link), dispatches and completes it with the answer and its HMAC; later ones replay it. Requests without a key meet the
// replay guard (SPEC §8.1, below) instead.

const (
	answerInProgress = "in_progress" // record states (SPEC §12 item 4)
	answerComplete   = "complete"
	abandonedMessage = "this answer's process stopped before it was kept; a provider call may have been made" // SPEC §12 item 2
	unkeptMessage    = "this answer was given once but could not be kept (see the log's answer_unkept); a provider call was made"
)

var (
	errAnswerCorrupt     = errors.New("not a kept answer")  // wraps every decode error: not SPEC §12's shape
	errSignatureMismatch = errors.New("signature mismatch") // `brama answers verify`'s refusal
	// errServerShutdown cancels the requests running at serve's second signal: their log lines say server_shutdown, their kept
	// answers item 2's refusal.
	errServerShutdown = errors.New("the server is shutting down")
)

// answerRecord is one kept-answer file, members in SPEC §12's order; while in progress the members only completion knows are
// null.
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
	BodyBase64    *string `json:"body_base64"`
	Attempts      *int    `json:"attempts"` // null: unknown (an abandoned answer)
	Route         string  `json:"route"`
	Signature     *string `json:"signature"`
}

// answerTicket is a reservation this process holds for one key.
type answerTicket struct {
	path string
	rec  answerRecord
}

// decodeAnswerRecord strictly parses a kept-answer file; every error wraps errAnswerCorrupt.
func decodeAnswerRecord(b []byte) (*answerRecord, error) {
	rec := &answerRecord{}
	if err := decodeStrict("kept answer", b, rec); err != nil {
		return nil, fmt.Errorf("%w: %w", errAnswerCorrupt, err)
	}
	return rec, nil
}

// validate checks that the record's members agree with its state; the first rule broken is named.
func (rec *answerRecord) validate() error {
	open, done := rec.State == answerInProgress, rec.State == answerComplete
	isTime := func(s *string) bool {
		t, err := time.Parse(journalTimeFormat, *cmp.Or(s, new(string)))
		return err == nil && t.Format(journalTimeFormat) == *s
	}
	_, b64Err := base64.StdEncoding.Strict().DecodeString(*cmp.Or(rec.BodyBase64, new(string)))
	for _, c := range []rule{
		{rec.SchemaVersion != 1, "schema_version is not 1"},
		{rec.BootID == "", "boot_id is empty"},
		{!idPattern.MatchString(rec.Client), "client is not a client id"},
		{!isHexDigest(rec.KeySHA256), "key_sha256 is not 64 lower-case hex digits"},
		{!isHexDigest(rec.RequestSHA256), "request_sha256 is not 64 lower-case hex digits"},
		{!isTime(&rec.StartedAt), "started_at is not RFC 3339 UTC with milliseconds"},
		{rec.Attempts != nil && *rec.Attempts < 0, "attempts is negative"},
		{open && (rec.CompletedAt != nil || rec.Status != nil || rec.BodyBase64 != nil || rec.Attempts != nil || rec.Signature != nil),
			"an answer in progress has completion members"},
		{!open && !done, "state is neither in_progress nor complete"},
		{done && !isTime(rec.CompletedAt), "completed_at is not RFC 3339 UTC with milliseconds"},
		{done && (rec.Status == nil || *rec.Status < 100 || *rec.Status > 999), "status is not an HTTP status"},
		{done && (rec.BodyBase64 == nil || b64Err != nil), "body_base64 is not standard base64"},
		{done && (rec.Signature == nil || !isAnswerSignature(*rec.Signature)), "signature is not v1=<64 hex>"},
	} {
		if c.bad {
			return errors.New(c.why)
		}
	}
	return nil
}

// body is a complete record's exact body bytes (validate vouched for them).
func (rec *answerRecord) body() []byte {
	b, _ := base64.StdEncoding.DecodeString(*rec.BodyBase64)
	return b
}

func isAnswerSignature(s string) bool { return strings.HasPrefix(s, "v1=") && isHexDigest(s[3:]) }

// signAnswer is SPEC §12's signature: v1=<hex HMAC-SHA256(answer key, body)>.
func signAnswer(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "v1=" + hex.EncodeToString(m.Sum(nil))
}

// checkIdempotencyKey applies SPEC §12: 1..255 printable ASCII characters.
func checkIdempotencyKey(key string) error {
	if len(key) < 1 || len(key) > 255 || strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
		return refuse("invalid_request", "Idempotency-Key must be 1 to 255 printable ASCII characters")
	}
	return nil
}

// answerStore keeps the signed answers of one state directory; only serve and `brama answers prune` write them (SPEC §2.3).
// bootID, drawn once per process, tells our records from a stopped process's.
type answerStore struct {
	sys
	st     state
	bootID string
	unkept sync.Map // record path → true: left in progress because completing it failed

	mu  sync.Mutex // guards key
	key []byte     // the answer key, once read or created
}

func newAnswerStore(st state, log *slog.Logger, now func() time.Time) *answerStore {
	return &answerStore{sys: sys{log: log, now: now}, st: st, bootID: rand.Text()}
}

// answerUnplaced is SPEC §2.1's refusal when an answer cannot be kept.
func answerUnplaced(cause error) *apiError {
	if ns := (*noStateError)(nil); errors.As(cause, &ns) {
		cause = ns.cause
	}
	return refuse("internal_error", "this request's one signed answer has no place to be kept: %v", cause).because(cause)
}

// signingKey reads $STATE/answer-key, creating it once with publishFile, so of two creators one wins.
func (a *answerStore) signingKey() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.key != nil {
		return a.key, nil
	}
	key, name, err := readAnswerKey(a.st)
	if errors.Is(err, errFileAbsent) {
		fresh := make([]byte, 32)
		rand.Read(fresh)
		if err = publishFile(name, fresh); err == nil || errors.Is(err, fs.ErrExist) {
			key, _, err = readAnswerKey(a.st)
		}
	}
	a.key = key
	return key, err
}

// readAnswerKey reads and guards $STATE/answer-key, and names it.
func readAnswerKey(st state) (key []byte, name string, err error) {
	if name, err = st.path("answer key", "answer-key"); err == nil {
		key, _, err = readGuarded("answer key", name)
	}
	if err == nil && len(key) != 32 {
		key, err = nil, fmt.Errorf("answer key %s holds %d bytes, want 32", name, len(key))
	}
	return key, name, err
}

// recordPath names the record for (client, key); answers/ and answers/<client>/ are directories, never a planted symlink out of
// the state directory.
func (a *answerStore) recordPath(client, key string) (string, error) {
	if !idPattern.MatchString(client) {
		return "", fmt.Errorf("client id %q cannot name a directory", client)
	}
	path, err := a.st.path("signed answers", filepath.Join("answers", client, hexSHA256([]byte(key))+".json"))
	for _, d := range []string{filepath.Dir(filepath.Dir(path)), filepath.Dir(path)} {
		if fi, lerr := os.Lstat(d); err == nil && lerr == nil && !fi.IsDir() {
			err = fmt.Errorf("%s is a symlink or not a directory", d)
		}
	}
	return path, err
}

// signedCall is a chat request carrying an Idempotency-Key as the store sees it: who asked, what, the route planned, and the
// engine's tally of calls.
type signedCall struct {
	client, route string
	keys          []string // the header's values: exactly one is allowed
	stream        bool
	body          []byte
	t             *tally
	envelope      func(http.ResponseWriter, error) *apiError // a refusal in the caller's dialect
}

// serve answers c (SPEC §12): reserving is the last step before dispatch runs the provider calls; a kept answer is replayed
// without one. The error is a refusal made before any reservation, for the caller to write.
func (a *answerStore) serve(ctx context.Context, w http.ResponseWriter, c signedCall, dispatch func(http.ResponseWriter)) (replayed bool, err error) {
	if err = checkIdempotencyKey(c.keys[0]); len(c.keys) > 1 {
		err = refuse("invalid_request", "send one Idempotency-Key header")
	} else if err == nil && c.stream {
		err = refuse("invalid_request", "Idempotency-Key keeps one buffered answer; it cannot be used with stream: true")
	}
	var t *answerTicket
	var kept *answerRecord
	if err == nil {
		t, kept, err = a.reserve(c)
	}
	if kept != nil {
		a.replay(w, c.t, kept)
	}
	if err != nil || kept != nil {
		return kept != nil, err
	}
	rec, panicked := &httptest.ResponseRecorder{HeaderMap: http.Header{}, Body: new(bytes.Buffer)}, true // Code 0 until written
	defer func() {
		if panicked { // keep or release; the panic goes on, and the connection is lost anyway
			a.settle(ctx, c, t, rec, true)
		}
	}()
	dispatch(rec)
	panicked = false
	rec = a.settle(ctx, c, t, rec, false)
	maps.Copy(w.Header(), rec.HeaderMap)
	w.WriteHeader(cmp.Or(rec.Code, http.StatusOK))
	w.Write(rec.Body.Bytes())
	return false, nil
}

// reserve, the last step before the first provider call (SPEC §12 item 1), returns this request's ticket, the record to replay,
// or item 2's refusal; no place: §2.1's.
func (a *answerStore) reserve(c signedCall) (*answerTicket, *answerRecord, error) {
	path, err := a.recordPath(c.client, c.keys[0])
	if err == nil {
		_, err = a.signingKey()
	}
	if err != nil {
		return nil, nil, answerUnplaced(err)
	}
	t := &answerTicket{path, answerRecord{SchemaVersion: 1, State: answerInProgress, BootID: a.bootID, Client: c.client,
		KeySHA256: hexSHA256([]byte(c.keys[0])), RequestSHA256: hexSHA256(c.body),
		StartedAt: a.now().UTC().Format(journalTimeFormat), Route: c.route}}
	data, _ := marshalState(&t.rec) // strings and ints always encode
	// A record removed between our failed link and our read (a released retryable refusal, or a prune) frees the key: try again,
	// a few times.
	for range 3 {
		if err := publishFile(path, data); err == nil {
			return t, nil, nil
		} else if !errors.Is(err, fs.ErrExist) {
			return nil, nil, answerUnplaced(err)
		}
		if rec, err := a.taken(c, path, t.rec.RequestSHA256); !errors.Is(err, errFileAbsent) {
			return nil, rec, err
		}
	}
	return nil, nil, answerBusy()
}

// answerBusy is the 409 of a key whose answer is still being produced, the one retryable state_conflict (SPEC §8.1).
func answerBusy() *apiError {
	ae := refuse("state_conflict", "the answer for this Idempotency-Key is still being produced; retry later")
	ae.Retryable = true
	return ae
}

// taken applies SPEC §12 item 2 to the record at path, checking a complete record's signature. A missing record is errFileAbsent.
func (a *answerStore) taken(c signedCall, path, requestSHA string) (*answerRecord, error) {
	rec, err := readAnswerFile(path)
	if errors.Is(err, errFileAbsent) {
		return nil, err
	}
	if err == nil && rec.State == answerComplete {
		var key []byte
		if key, err = a.signingKey(); err == nil && !hmac.Equal([]byte(signAnswer(key, rec.body())), []byte(*rec.Signature)) {
			err = errSignatureMismatch
		}
	}
	_, unkept := a.unkept.Load(path)
	switch open := err == nil && rec.State == answerInProgress; {
	case err != nil:
		return nil, refuse("internal_error", "the kept answer for this Idempotency-Key is unreadable").because(err)
	case rec.RequestSHA256 != requestSHA:
		return nil, refuse("state_conflict", "this Idempotency-Key was used with another request body")
	case open && rec.BootID != a.bootID: // a stopped process's: kept as item 2's refusal, attempts unknown
		e := httptest.NewRecorder()
		ae := c.envelope(e, refuse("internal_error", abandonedMessage))
		if rec, err = a.complete(&answerTicket{path, *rec}, ae.Status(), e.Body.Bytes(), nil, rec.Route); err != nil {
			return nil, refuse("internal_error", "the abandoned answer for this Idempotency-Key could not be kept").because(err)
		}
		a.log.Warn("answer_abandoned", "client", rec.Client, "key_sha256", rec.KeySHA256, "boot_id", rec.BootID)
	case open && unkept:
		return nil, refuse("internal_error", unkeptMessage)
	case open:
		return nil, answerBusy()
	}
	return rec, nil
}

// readAnswerFile reads, guards and decodes the record at name.
func readAnswerFile(name string) (*answerRecord, error) {
	f := stateFile[*answerRecord]{role: "kept answer", path: name, parse: decodeAnswerRecord, absentErr: true}
	return f.fresh()
}

// settle keeps or releases the reservation after dispatch (SPEC §12 item 3) and returns what the caller gets, signed when kept.
// After a provider call started, a hang-up or panic is kept (499, 500) so the key never spends twice; a retryable refusal, or one
// made before dispatch, is released.
func (a *answerStore) settle(ctx context.Context, c signedCall, t *answerTicket, rec *httptest.ResponseRecorder, panicked bool) *httptest.ResponseRecorder {
	calls, attempts := c.t.attempts, (*int)(nil)
	if calls > 0 {
		attempts = &calls
	}
	if n, err := strconv.Atoi(rec.HeaderMap.Get("Brama-Attempts")); err == nil {
		attempts = &n
	}
	var env envelope
	json.Unmarshal(rec.Body.Bytes(), &env)
	var cut *apiError
	switch {
	case rec.Code >= 200 && rec.Code <= 299 && !panicked:
	case calls > 0 && panicked:
		cut = refuse("internal_error", "the answer failed inside Brama after a provider call started")
	case calls > 0 && context.Cause(ctx) == errServerShutdown: // a stopped process's answer (item 2)
		cut = refuse("internal_error", abandonedMessage)
	case calls > 0 && ctx.Err() != nil:
		cut = refuse("client_cancelled", "the caller hung up after a provider call started")
	case panicked, ctx.Err() != nil, env.Error.Retryable, attempts == nil:
		err := os.Remove(t.path)
		if err == nil {
			err = syncDir(filepath.Dir(t.path))
		}
		if err != nil {
			a.log.Error("answer_release_failed", "request_id", c.t.requestID, "err", err)
		}
		return rec
	}
	route := cmp.Or(rec.HeaderMap.Get("Brama-Route"), c.route) // a selector's: the candidate that answered
	if cut != nil {
		rec, attempts = httptest.NewRecorder(), &calls
		c.envelope(rec, cut.withAttempts(calls))
		c.t.outcome, c.t.retryable = cut.Code, false
	}
	rec.Body = bytes.NewBuffer(withoutPromptEcho(rec.Body.Bytes())) // the first answer is the kept body (item 7)
	kept, err := a.complete(t, rec.Code, rec.Body.Bytes(), attempts, route)
	if err != nil {
		// The answer exists and was paid for: give it unsigned rather than lose it. The record stays in progress, so the key
		// never spends twice; sent again it is refused, after a restart it reads as abandoned.
		a.unkept.Store(t.path, true)
		a.log.Error("answer_unkept", "request_id", c.t.requestID, "err", err)
		return rec
	}
	rec.HeaderMap.Set("Brama-Answer-Signature", *kept.Signature)
	return rec
}

// complete keeps an answer (SPEC §12 item 3) in place of the reservation t.
func (a *answerStore) complete(t *answerTicket, status int, body []byte, attempts *int, route string) (*answerRecord, error) {
	key, err := a.signingKey()
	if err != nil {
		return nil, err
	}
	rec := t.rec
	done, b64, sig := a.now().UTC().Format(journalTimeFormat), base64.StdEncoding.EncodeToString(body), signAnswer(key, body)
	rec.State, rec.CompletedAt, rec.Status, rec.BodyBase64, rec.Attempts, rec.Signature = answerComplete, &done, &status, &b64, attempts, &sig
	rec.Route = cmp.Or(route, rec.Route)
	return &rec, writeState(t.path, &rec)
}

// replay answers from a complete record, with no provider call.
func (a *answerStore) replay(w http.ResponseWriter, t *tally, rec *answerRecord) {
	body, h := rec.body(), w.Header()
	var env envelope
	if json.Unmarshal(body, &env) == nil && env.Error.Code != "" {
		t.outcome, t.retryable = env.Error.Code, env.Error.Retryable
		h.Set("X-Should-Retry", strconv.FormatBool(env.Error.Retryable)) // SPEC §8.1
	}
	t.attempts = 0
	h.Set("Brama-Answer-Signature", *rec.Signature)
	h.Set("Brama-Answer-Replayed", "true")
	h.Set("Brama-Attempts", "0")
	if rec.Route != "" { // README: every answer names its route
		h.Set("Brama-Route", rec.Route)
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(*rec.Status)
	w.Write(body)
}

// withoutPromptEcho is body with each member that repeats the caller's input (OpenAI Responses echoes instructions) set to null
// (SPEC §12 item 7); any other byte, and a body that is no JSON object, stays.
func withoutPromptEcho(body []byte) []byte {
	o, err := parseRawObject(body)
	if err != nil {
		return body
	}
	var edits []memberEdit
	for _, k := range []string{"instructions", "input", "prompt", "messages", "system"} {
		if v := o.value(k); v != nil && string(v) != "null" {
			edits = append(edits, memberEdit{k, []byte("null")})
		}
	}
	return o.edit(edits...)
}

// verifyAnswerFile is `brama answers verify` (SPEC §12 item 6): sig over file, or a kept answer's own signature over its body.
func verifyAnswerFile(st state, file, sig string) error {
	key, _, err := readAnswerKey(st)
	if err != nil {
		return err
	}
	body, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if sig == "" {
		rec, err := decodeAnswerRecord(body)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		} else if rec.State != answerComplete {
			return fmt.Errorf("%s: the answer is still in progress; there is no signature to check", file)
		}
		body, sig = rec.body(), *rec.Signature
	}
	if !hmac.Equal([]byte(signAnswer(key, body)), []byte(sig)) {
		return errSignatureMismatch
	}
	return nil
}

// pruneAnswers removes the complete records under dir completed before cutoff (SPEC §12 item 7); serve may run, as they never
// change again.
func pruneAnswers(dir string, cutoff time.Time, skip func(name string, err error)) (int, error) {
	removed := 0
	err := filepath.WalkDir(dir, func(name string, d fs.DirEntry, err error) error {
		switch {
		case errors.Is(err, fs.ErrNotExist) && name == dir:
			return filepath.SkipDir
		case err != nil:
			return err
		case d.IsDir() || !strings.HasSuffix(name, ".json") || strings.HasPrefix(d.Name(), "."):
			return nil // temporary files are not records
		}
		rec, err := readAnswerFile(name)
		if err != nil {
			skip(name, err)
			return nil
		}
		if rec.State != answerComplete {
			return nil
		}
		if done, _ := time.Parse(journalTimeFormat, *rec.CompletedAt); !done.Before(cutoff) {
			return nil
		}
		if err := os.Remove(name); err != nil {
			return err
		}
		removed++
		return syncDir(filepath.Dir(name))
	})
	return removed, err
}
