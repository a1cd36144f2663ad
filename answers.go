package main

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Signed answers (SPEC §12): one provider spend per (client, Idempotency-Key).
// The first request publishes an in-progress record (os.Link), dispatches and
// completes it with the answer and its HMAC; later ones replay it. The HTTP
// face is in server.go.

const (
	answerInProgress = "in_progress" // record states (SPEC §12 item 4)
	answerComplete   = "complete"
	// abandonedMessage is the kept refusal of SPEC §12 item 2.
	abandonedMessage = "this answer's process stopped before it was kept; a provider call may have been made"
	// unkeptMessage answers a key whose answer was given but could not be kept.
	unkeptMessage = "this answer was given once but could not be kept (see the log's answer_unkept); a provider call was made"
)

var (
	errAnswerCorrupt     = errors.New("not a kept answer")  // wraps every decode error: not SPEC §12's shape
	errSignatureMismatch = errors.New("signature mismatch") // `brama answers verify`'s refusal
)

// answerRecord is one kept-answer file, members in SPEC §12's order. While
// in progress the members that only completion knows are null.
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

// decodeAnswerRecord strictly parses a kept-answer file; every error wraps
// errAnswerCorrupt.
func decodeAnswerRecord(b []byte) (*answerRecord, error) {
	rec := &answerRecord{}
	if err := decodeStrict("kept answer", b, rec); err != nil {
		return nil, fmt.Errorf("%w: %w", errAnswerCorrupt, err)
	}
	return rec, nil
}

// validate checks that the record's members agree with its state.
func (rec *answerRecord) validate() error {
	switch {
	case rec.SchemaVersion != 1:
		return fmt.Errorf("schema_version %d, want 1", rec.SchemaVersion)
	case rec.BootID == "":
		return errors.New("boot_id is empty")
	case !idPattern.MatchString(rec.Client):
		return errors.New("client is not a client id")
	case !isHexDigest(rec.KeySHA256):
		return errors.New("key_sha256 is not 64 lower-case hex digits")
	case !isHexDigest(rec.RequestSHA256):
		return errors.New("request_sha256 is not 64 lower-case hex digits")
	case !isAnswerTime(rec.StartedAt):
		return errors.New("started_at is not RFC 3339 UTC with milliseconds")
	case rec.Attempts != nil && *rec.Attempts < 0:
		return errors.New("attempts is negative")
	case rec.State == answerInProgress && (rec.CompletedAt != nil || rec.Status != nil || rec.BodyBase64 != nil || rec.Attempts != nil || rec.Signature != nil):
		return errors.New("an answer in progress has completion members")
	case rec.State == answerInProgress:
		return nil
	case rec.State != answerComplete:
		return fmt.Errorf("state %q is neither %s nor %s", rec.State, answerInProgress, answerComplete)
	case rec.CompletedAt == nil || !isAnswerTime(*rec.CompletedAt):
		return errors.New("completed_at is not RFC 3339 UTC with milliseconds")
	case rec.Status == nil || *rec.Status < 100 || *rec.Status > 999:
		return errors.New("status is not an HTTP status")
	case rec.BodyBase64 == nil:
		return errors.New("body_base64 is missing")
	case rec.Signature == nil || !isAnswerSignature(*rec.Signature):
		return errors.New("signature is not v1=<64 hex>")
	}
	if _, err := base64.StdEncoding.Strict().DecodeString(*rec.BodyBase64); err != nil {
		return errors.New("body_base64 is not standard base64")
	}
	return nil
}

// body is a complete record's exact body bytes (validate vouched for them).
func (rec *answerRecord) body() []byte {
	b, _ := base64.StdEncoding.DecodeString(*rec.BodyBase64)
	return b
}

func isAnswerTime(s string) bool {
	t, err := time.Parse(journalTimeFormat, s)
	return err == nil && t.Format(journalTimeFormat) == s
}

func isAnswerSignature(s string) bool { return strings.HasPrefix(s, "v1=") && isHexDigest(s[3:]) }

// signAnswer is SPEC §12's signature: v1=<hex HMAC-SHA256(answer key, body)>.
func signAnswer(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "v1=" + hex.EncodeToString(m.Sum(nil))
}

// verifyAnswer compares sig with body's signature in constant time.
func verifyAnswer(key, body []byte, sig string) bool {
	return hmac.Equal([]byte(signAnswer(key, body)), []byte(sig))
}

// checkIdempotencyKey applies SPEC §12: 1..255 printable ASCII characters.
func checkIdempotencyKey(key string) error {
	if len(key) < 1 || len(key) > 255 || strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
		return refuse("invalid_request", "Idempotency-Key must be 1 to 255 printable ASCII characters")
	}
	return nil
}

// answerStore keeps the signed answers of one state directory; only serve and
// `brama answers prune` write them (SPEC §2.3).
type answerStore struct {
	sys
	st     state
	bootID string // drawn once per process: tells our records from a stopped process's

	mu     sync.Mutex      // guards key and unkept
	key    []byte          // the answer key, once read or created
	unkept map[string]bool // records left in progress because completing them failed
}

// newAnswerStore makes the store and draws this process's boot id.
func newAnswerStore(st state, log *slog.Logger, now func() time.Time) *answerStore {
	b := make([]byte, 16)
	rand.Read(b)
	return &answerStore{sys: sys{log: log, now: now}, st: st, bootID: hex.EncodeToString(b)}
}

// answerUnplaced is SPEC §2.1's refusal when an answer cannot be kept.
func answerUnplaced(cause error) *apiError {
	if ns := (*noStateError)(nil); errors.As(cause, &ns) {
		cause = ns.cause
	}
	return refuse("internal_error", "this request's one signed answer has no place to be kept: %v", cause).because(cause)
}

// signingKey reads $STATE/answer-key, creating it once with publishFile,
// so of two creators one wins.
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
	if err != nil {
		return nil, err
	}
	a.key = key
	return key, nil
}

// readAnswerKey reads and guards $STATE/answer-key, and names it.
func readAnswerKey(st state) (key []byte, name string, err error) {
	if name, err = st.path("answer key", "answer-key"); err == nil {
		key, _, err = readGuarded("answer key", name)
	}
	if err == nil && len(key) != 32 {
		err = fmt.Errorf("answer key %s holds %d bytes, want 32", name, len(key))
	}
	return key, name, err
}

// answerTicket is a reservation this process holds for one key.
type answerTicket struct {
	path string
	rec  answerRecord
}

// recordPath names the record for (client, key); answers/ and answers/<client>/
// are directories, never a planted symlink out of the state directory.
func (a *answerStore) recordPath(client, key string) (string, error) {
	if !idPattern.MatchString(client) {
		return "", fmt.Errorf("client id %q cannot name a directory", client)
	}
	path, err := a.st.path("signed answers", filepath.Join("answers", client, hexSHA256([]byte(key))+".json"))
	if err != nil {
		return "", err
	}
	for _, d := range []string{filepath.Dir(filepath.Dir(path)), filepath.Dir(path)} {
		if fi, err := os.Lstat(d); err == nil && !fi.IsDir() {
			return "", fmt.Errorf("%s is a symlink or not a directory", d)
		}
	}
	return path, nil
}

// reserve, the last step before the first provider call (SPEC §12 item 1), returns this
// request's ticket, the record to replay, or item 2's refusal (in r's dialect); no place: §2.1's.
func (a *answerStore) reserve(r *http.Request, client, key string, body []byte, route string) (*answerTicket, *answerRecord, error) {
	path, err := a.recordPath(client, key)
	if err == nil {
		_, err = a.signingKey()
	}
	if err != nil {
		return nil, nil, answerUnplaced(err)
	}
	t := &answerTicket{path: path, rec: answerRecord{
		SchemaVersion: 1, State: answerInProgress, BootID: a.bootID, Client: client,
		KeySHA256: hexSHA256([]byte(key)), RequestSHA256: hexSHA256(body),
		StartedAt: a.now().UTC().Format(journalTimeFormat), Route: route,
	}}
	data, _ := marshalState(&t.rec) // strings and ints always encode
	// A record removed between our failed link and our read (a released
	// retryable refusal, or a prune) frees the key: try again, a few times.
	for range 3 {
		err := publishFile(path, data)
		if err == nil {
			return t, nil, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, nil, answerUnplaced(err)
		}
		rec, err := a.taken(r, path, t.rec.RequestSHA256)
		if !errors.Is(err, errFileAbsent) {
			return nil, rec, err
		}
	}
	return nil, nil, answerBusy()
}

// answerBusy is the 409 of a key whose answer is still being produced, the
// one retryable state_conflict (SPEC §8.1).
func answerBusy() *apiError {
	ae := refuse("state_conflict", "the answer for this Idempotency-Key is still being produced; retry later")
	ae.Retryable = ptrTo(true)
	return ae
}

// taken applies SPEC §12 item 2 to the record at path, checking a complete
// record's signature. A missing record is errFileAbsent.
func (a *answerStore) taken(r *http.Request, path, requestSHA string) (*answerRecord, error) {
	rec, err := readAnswerFile(path)
	if errors.Is(err, errFileAbsent) {
		return nil, err
	}
	if err == nil && rec.State == answerComplete {
		var key []byte
		if key, err = a.signingKey(); err == nil && !verifyAnswer(key, rec.body(), *rec.Signature) {
			err = errSignatureMismatch
		}
	}
	switch {
	case err != nil:
		return nil, refuse("internal_error", "the kept answer for this Idempotency-Key is unreadable").because(err)
	case rec.RequestSHA256 != requestSHA:
		return nil, refuse("state_conflict", "this Idempotency-Key was used with another request body")
	case rec.State == answerInProgress && rec.BootID != a.bootID:
		return a.abandon(r, path, rec)
	case rec.State == answerInProgress && a.wasUnkept(path):
		return nil, refuse("internal_error", unkeptMessage)
	case rec.State == answerInProgress:
		return nil, answerBusy()
	}
	return rec, nil
}

// readAnswerFile reads, guards and decodes the record at name.
func readAnswerFile(name string) (*answerRecord, error) {
	f := stateFile[*answerRecord]{role: "kept answer", path: name, parse: decodeAnswerRecord, absentErr: true}
	return f.fresh()
}

// abandon keeps a stopped process's in-progress record as SPEC §12 item 2's
// refusal in r's envelope, with no attempts key: how many calls it made is unknown.
func (a *answerStore) abandon(r *http.Request, path string, rec *answerRecord) (*answerRecord, error) {
	c := newCapture()
	ae := writeAPIError(c, r, refuse("internal_error", abandonedMessage))
	kept, err := a.complete(&answerTicket{path: path, rec: *rec}, ae.Status(), c.Body.Bytes(), nil, rec.Route)
	if err != nil {
		return nil, refuse("internal_error", "the abandoned answer for this Idempotency-Key could not be kept").because(err)
	}
	a.log.Warn("answer_abandoned", "client", rec.Client, "key_sha256", rec.KeySHA256, "boot_id", rec.BootID)
	return kept, nil
}

// complete keeps an answer (SPEC §12 item 3) in place of the reservation.
func (a *answerStore) complete(t *answerTicket, status int, body []byte, attempts *int, route string) (*answerRecord, error) {
	key, err := a.signingKey()
	if err != nil {
		return nil, err
	}
	rec := t.rec
	done := a.now().UTC().Format(journalTimeFormat)
	b64 := base64.StdEncoding.EncodeToString(body)
	sig := signAnswer(key, body)
	rec.State, rec.CompletedAt, rec.Status, rec.BodyBase64, rec.Attempts, rec.Signature = answerComplete, &done, &status, &b64, attempts, &sig
	rec.Route = cmp.Or(route, rec.Route)
	if err := writeState(t.path, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// promptEchoes are the members of an answer that repeat the caller's input
// (OpenAI Responses echoes instructions): kept as null (SPEC §12 item 7).
var promptEchoes = []string{"instructions", "input", "prompt", "messages", "system"}

// withoutPromptEcho is body with each echoed prompt member set to null; any
// other byte, and a body that is no JSON object, stays as it was.
func withoutPromptEcho(body []byte) []byte {
	o, err := parseRawObject(body)
	if err != nil {
		return body
	}
	var edits []memberEdit
	for _, k := range promptEchoes {
		if v := o.value(k); v != nil && string(v) != "null" {
			edits = append(edits, memberEdit{k, []byte("null")})
		}
	}
	return o.edit(edits...)
}

// markUnkept remembers, for this process, that the record at path stays in
// progress because its completion failed; wasUnkept reads it.
func (a *answerStore) markUnkept(path string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unkept == nil {
		a.unkept = map[string]bool{}
	}
	a.unkept[path] = true
}

func (a *answerStore) wasUnkept(path string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unkept[path]
}

// release removes a reservation so the key is free again.
func (a *answerStore) release(t *answerTicket) error {
	if err := os.Remove(t.path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(t.path))
}

// verifyAnswerFile is `brama answers verify` (SPEC §12 item 6): sig over
// file, or a kept answer's own signature over its body.
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
		}
		if rec.State != answerComplete {
			return fmt.Errorf("%s: the answer is still in progress; there is no signature to check", file)
		}
		body, sig = rec.body(), *rec.Signature
	}
	if !verifyAnswer(key, body, sig) {
		return errSignatureMismatch
	}
	return nil
}

// pruneAnswers removes the complete records under dir completed before
// cutoff (SPEC §12 item 7); serve may run, as they never change again.
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

// hexSHA256 is b's SHA-256 in lower-case hex.
func hexSHA256(b []byte) string {
	d := sha256.Sum256(b)
	return hex.EncodeToString(d[:])
}

// isHexDigest reports whether s is a SHA-256 in lower-case hex.
func isHexDigest(s string) bool {
	_, err := hex.DecodeString(s)
	return len(s) == 64 && err == nil && strings.ToLower(s) == s
}
