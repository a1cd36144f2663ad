package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// journalTimeFormat is every state time (SPEC §9 "at"): RFC 3339 UTC with milliseconds, so times sort as text.
const journalTimeFormat = "2006-01-02T15:04:05.000Z"

// journalRecord is one journal line (SPEC §9). A field never changes meaning once written: kinds and fields are only
// ever added. Lines of the retired kinds (check, subscription_refresh) stay readable, their fields skipped.
type journalRecord struct {
	Kind           string `json:"kind"`
	At             string `json:"at"` // journalTimeFormat
	SubscriptionID string `json:"subscription_id,omitempty"`
	Reason         string `json:"reason,omitempty"`
	Provider       string `json:"provider,omitempty"`
	Result         string `json:"result,omitempty"`
	Detail         string `json:"detail,omitempty"`
	Alias          string `json:"alias,omitempty"`
	*routeChange          // route_change only, where from and to are always written: null says "created" or "deleted"
	By             string `json:"by,omitempty"`
}

// routeChange is a route_change line's alias destinations before and after.
type routeChange struct {
	From *string `json:"from"`
	To   *string `json:"to"`
}

// journal is SPEC §9's append-only $STATE/journal.jsonl; any process may append, so it keeps no file open.
type journal struct {
	sys
	name            string                 // "" when there is no state directory
	testingOnlySync func(f *os.File) error // replaces f.Sync's result in append
	mu              sync.Mutex             // guards broken; held across an append so this process's appends queue
	broken          error                  // why name is "" (errNoState), or the fsync failure after which nothing is appended
	readMu          sync.Mutex             // guards fold
	fold            journalFold
}

// journalFold is what one file's complete lines said so far: requests read only new lines (issue 10: rereading took 5 GB).
type journalFold struct {
	file   fileIdentity    // dev and ino only
	off    int64           // bytes folded, always just after a '\n'
	lines  int             // lines folded, for line numbers
	retire map[string]bool // by subscription id: whether its last retire/reinstate is retire
	bad    []string        // /readyz's warning per unreadable line: its number and a reason that never quotes it
	badN   int
}

const maxReportedBadLines = 100 // unreadable lines /readyz names; the rest it counts

var errJournalUnusable = errors.New("journal unusable after a failed fsync")

// newJournal places the journal in st; without a state directory every operation refuses with the cause (SPEC §2.1).
func newJournal(st state, sy sys) *journal {
	j := &journal{sys: sy}
	j.name, j.broken = st.path("journal", "journal.jsonl")
	return j
}

// ready reports, changing nothing, whether an append could be made now (SPEC §2.1, §4.4): the guarded journal is
// writable, or its nearest existing ancestor lets this process create files (access(2): W_OK, W_OK|X_OK).
func (j *journal) ready() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.broken != nil {
		return j.broken
	}
	path, mode := j.name, uint32(0x2) // access(2)'s W_OK; package syscall has no names for the modes
	_, _, err := guardFile("journal", path, false)
	for errors.Is(err, errFileAbsent) || errors.Is(err, os.ErrNotExist) && filepath.Dir(path) != path {
		path, mode = filepath.Dir(path), 0x2|0x1 // W_OK|X_OK: a directory to create in (a plain file fails X_OK)
		_, err = os.Stat(path)
	}
	if err == nil { // cmp.Or would call Access after a failed Stat too
		err = syscall.Access(path, mode)
	}
	if err != nil {
		return fmt.Errorf("journal: cannot write %s: %w", path, err)
	}
	return nil
}

// append adds rec as one line, nil only once on disk (SPEC §9, STYLE B7): O_APPEND, flock (two appenders never
// both mark one torn tail), one write, unlock, fsync, and fsync the directory of a new file.
func (j *journal) append(rec journalRecord) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.broken != nil {
		return j.broken
	} else if rec.Kind == "" {
		return errors.New("journal record has no kind")
	}
	rec.At = cmp.Or(rec.At, j.now().UTC().Format(journalTimeFormat))
	line, _ := json.Marshal(rec) // strings only: it always marshals
	if _, _, err := guardFile("journal", j.name, false); err != nil && !errors.Is(err, errFileAbsent) {
		return err
	}
	f, err := flockFile(j.name, os.O_RDWR|os.O_APPEND|os.O_CREATE, syscall.LOCK_EX) // no symlink since the guard
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer f.Close() // also unlocks after a failed write
	fi, err := f.Stat()
	if last := make([]byte, 1); err == nil && fi.Size() > 0 { // SPEC §9: a torn final line stays, marked
		if _, err = f.ReadAt(last, fi.Size()-1); err == nil && last[0] != '\n' {
			line = slices.Concat([]byte(" (torn)\n"), line) // no JSON text ends in ')'; this record starts fresh
		}
	}
	if err == nil {
		_, err = f.Write(append(line, '\n')) // a short write is an error
	}
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if err = f.Sync(); j.testingOnlySync != nil { // a test's injected failure replaces the result
		err = j.testingOnlySync(f)
	}
	if err != nil {
		j.broken = fmt.Errorf("%w: %w", errJournalUnusable, err) // never retry fsync; the page cache may be lying
		return j.broken
	}
	if fi.Size() == 0 {
		if err := syncDir(filepath.Dir(j.name)); err != nil {
			return fmt.Errorf("journal: make the new file durable: %w", err)
		}
	}
	return nil
}

// size is the journal's size in bytes for /metrics (SPEC §13); its error is what makes it unusable for /readyz: the
// guards, no state directory, or a failed fsync (appends refuse from then on).
func (j *journal) size() (int64, error) {
	j.mu.Lock()
	broken := j.broken
	j.mu.Unlock()
	_, id, err := guardFile("journal", j.name, false) // name "" (no state directory): absent, and broken says why
	if err == nil || errors.Is(err, errFileAbsent) {
		err = broken // the file passes the guards or is absent: appends decide
	}
	return max(id.size, 0), err // an absent file's identity has size -1
}

// folded folds the lines completed since the last call, logging each bad one, and returns a copy: retire is true for
// the retired subscription ids, where the later of retire and reinstate in file order decides (SPEC §9).
func (j *journal) folded() (journalFold, error) {
	j.readMu.Lock()
	defer j.readMu.Unlock()
	fo := &j.fold
	_, err := j.scan(fo, func(_ journalRecord, reason string) {
		if reason != "" {
			j.log.Warn("journal_line_unreadable", "line", fo.lines, "reason", reason)
		}
	})
	if err != nil {
		return journalFold{}, err
	}
	return journalFold{retire: maps.Clone(fo.retire), bad: slices.Clone(fo.bad), badN: fo.badN}, nil
}

// checkJournal is `brama journal check` (SPEC §16.1): each unreadable line's number and reason; ok when none.
func checkJournal(j *journal, stdout io.Writer) (ok bool, err error) {
	var fo journalFold
	torn, err := j.scan(&fo, func(_ journalRecord, reason string) {
		if reason != "" {
			fmt.Fprintf(stdout, "line %d: %s\n", fo.lines, reason)
		}
	})
	if torn {
		fmt.Fprintln(stdout, "final line torn (ignored)")
	}
	return fo.badN == 0 && err == nil, err
}

// scan folds the complete lines past fo into it, visiting each parsed; anew if fo is empty, another file's or past EOF.
func (j *journal) scan(fo *journalFold, visit func(journalRecord, string)) (torn bool, err error) {
	if j.name == "" {
		return false, j.broken
	}
	f, full, err := guardFile("journal", j.name, true)
	if err != nil && !errors.Is(err, errFileAbsent) {
		return false, err
	}
	if id := (fileIdentity{dev: full.dev, ino: full.ino}); f == nil || id != fo.file || full.size < fo.off || fo.retire == nil {
		*fo = journalFold{file: id, retire: map[string]bool{}}
	}
	if f == nil {
		return false, nil
	}
	defer f.Close()
	br := bufio.NewReader(io.NewSectionReader(f, fo.off, full.size-fo.off))
	for { // a final line without '\n' (torn, or being written) is only reported
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			return len(line) > 0, nil
		} else if err != nil {
			return false, fmt.Errorf("journal: %w", err)
		}
		fo.off += int64(len(line))
		fo.lines++
		rec, reason := parseJournalLine(line[:len(line)-1])
		if reason != "" && fo.badN < maxReportedBadLines {
			fo.bad = append(fo.bad, fmt.Sprintf("journal line %d is unreadable: %s", fo.lines, reason))
		} else if reason == "" && rec.SubscriptionID != "" && (rec.Kind == "retire" || rec.Kind == "reinstate") {
			fo.retire[rec.SubscriptionID] = rec.Kind == "retire"
		}
		fo.badN += boolCount(reason != "")
		visit(rec, reason)
	}
}

// parseJournalLine reads one line or says why not (SPEC §9), skipping unknown fields; from and to on route_change only.
func parseJournalLine(line []byte) (r journalRecord, reason string) {
	var m map[string]json.RawMessage
	err := json.Unmarshal(line, &m)
	if lead := bytes.Trim(line, " \t\r"); len(lead) == 0 { // JSON's whitespace, not Unicode's
		return r, "empty line"
	} else if err != nil && lead[0] == '{' { // only a syntax error: a map takes any object
		return r, "malformed or incomplete JSON object (an interrupted write?)"
	} else if errors.As(err, new(*json.SyntaxError)) {
		return r, "not JSON"
	} else if m == nil { // valid JSON: an array, a scalar or null
		return r, "not a JSON object"
	}
	rv := reflect.ValueOf(&r).Elem()
	for i, f := range reflect.VisibleFields(rv.Type()) { // i < 2: kind and at, non-empty strings; then the rest
		if f.Anonymous && r.Kind == "route_change" { // from and to are read there only
			r.routeChange = &routeChange{}
		}
		if f.Anonymous || len(f.Index) > 1 && r.routeChange == nil { // the pointer itself, or from/to of another kind
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",") // keys match the tags exactly: json.Unmarshal folds case
		raw, ok := m[name]
		field := rv.FieldByIndex(f.Index).Addr().Interface()
		if i < 2 && !ok {
			return journalRecord{}, "missing " + name
		} else if i < 2 && (json.Unmarshal(raw, field) != nil || *field.(*string) == "") { // null leaves it ""
			return journalRecord{}, name + " is empty or not a string"
		} else if ok && json.Unmarshal(raw, field) != nil {
			return journalRecord{}, "field " + name + " has the wrong type"
		}
	}
	return r, ""
}

func boolCount(b bool) int { return pick(b, 1, 0) }

// validator is a document with rules beyond its shape; validate may fill in sections.
type validator interface{ validate() error }

// decodeStrict is the one strict decoder of state files and admin bodies (SPEC §2.2): no bad UTF-8, deep nesting,
// duplicate, unknown or case-folded key, trailing data, or a schema_version but 1; then validate.
func decodeStrict(role string, b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var err error
	if !utf8.Valid(b) {
		err = errors.New("not valid UTF-8")
	} else if err = checkNesting(b); err == nil { // checkKeys recurses: the depth is bounded first
		err = checkKeys(json.NewDecoder(bytes.NewReader(b)), reflect.TypeOf(v))
	}
	if err == nil {
		err = dec.Decode(v)
	}
	if _, end := dec.Token(); err == nil && end != io.EOF {
		err = errors.New("data after the JSON document")
	}
	if sv := reflect.Indirect(reflect.ValueOf(v)); err == nil && sv.Kind() == reflect.Struct { // every state document's
		if n := sv.FieldByName("SchemaVersion"); n.CanInt() && n.Int() != 1 {
			err = fmt.Errorf("schema_version %d is not 1", n.Int())
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", role, err)
	} else if d, ok := v.(validator); ok {
		return d.validate()
	}
	return nil
}

// maxJSONDepth is the deepest JSON nesting Brama reads (SPEC §8.2).
const maxJSONDepth = 1000

var errTooDeep = fmt.Errorf("JSON nests deeper than %d levels", maxJSONDepth)

// checkNesting refuses b too deep before any parser runs, without allocating (issue 10: 3,000,000 deep took the stack).
func checkNesting(b []byte) error {
	depth, inString, escaped := 0, false, false
	for _, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString:
			escaped, inString = c == '\\', c != '"'
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			if depth++; depth > maxJSONDepth {
				return errTooDeep
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return nil
}

// checkKeys refuses, in the value dec reads next (decoded as t; nil: unchecked), a key named twice (encoding/json keeps
// the last) and a struct member in another case (encoding/json takes it; SPEC §2.2). checkNesting bounded the depth.
func checkKeys(dec *json.Decoder, t reflect.Type) error {
	open, err := dec.Token()
	if err != nil || open != json.Delim('{') && open != json.Delim('[') {
		return err
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var items reflect.Type // a map's members' or an array's items'
	if t != nil && (t.Kind() == reflect.Map || t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		items = t.Elem()
	}
	seen := map[string]bool{}
	for dec.More() {
		elem := items
		if open == json.Delim('{') {
			tok, err := dec.Token() // the decoder allows only a string here
			if err != nil {
				return err
			}
			key := tok.(string)
			if seen[key] {
				return fmt.Errorf("duplicate key %q", key)
			}
			seen[key] = true
			for i := 0; t != nil && t.Kind() == reflect.Struct && i < t.NumField(); i++ {
				if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name == key {
					elem = t.Field(i).Type
					break
				} else if strings.EqualFold(name, key) {
					return fmt.Errorf("unknown member %q (member names are exact: %q)", key, name)
				}
			}
		}
		if err := checkKeys(dec, elem); err != nil {
			return err
		}
	}
	_, err = dec.Token() // the closing delimiter
	return err
}

// codes is the one table of SPEC §8.2: a code fixes the HTTP status, the type and whether a caller may retry.
var codes = map[string]struct {
	status    int
	typ       string
	retryable bool
}{
	"invalid_request":                       {400, "request_error", false},
	"unauthenticated":                       {401, "authentication_error", false},
	"forbidden":                             {403, "authorization_error", false},
	"alias_unknown":                         {404, "request_error", false},
	"not_found":                             {404, "request_error", false},
	"method_not_allowed":                    {405, "request_error", false},
	"state_conflict":                        {409, "state_error", false},
	"secure_transport_required":             {426, "transport_error", false},
	"provider_rate_limited":                 {429, "capacity_error", true},
	"subscription_unavailable":              {429, "capacity_error", true},
	"client_cancelled":                      {499, "request_error", false},
	"internal_error":                        {500, "internal_error", false},
	"provider_rejected":                     {400, "request_error", false}, // or the provider's 404, 413, 422
	"provider_failure":                      {502, "provider_error", false},
	"provider_incomplete":                   {502, "provider_error", false},
	"provider_quota_exhausted":              {502, "provider_error", false},
	"alias_unserviceable":                   {503, "dependency_error", false},
	"credential_unauthorized":               {503, "authorization_error", false},
	"subscription_reauthorization_required": {503, "authorization_error", false},
	"dependency_unavailable":                {503, "dependency_error", true},
	"dependency_timeout":                    {504, "dependency_error", true},
}

// Bounds on quoted text: an envelope message's bytes (SPEC §8.1), a provider sentence's characters (ledger, logs: §10.3).
const (
	maxMessageBytes  = 2048
	maxSentenceChars = 200
)

// apiError is the only error a client sees, and its envelope's "error" member: refuse fills type and retryable from
// the code; Attempts is set exactly when the request reached dispatch; Details only on alias refusals.
type apiError struct {
	Message    string        `json:"message"` // client-safe: no secrets, no prompts, no raw provider bodies
	Type       string        `json:"type"`
	Code       string        `json:"code"`
	Retryable  bool          `json:"retryable"`          // the code's, but for SPEC §12's in-progress 409
	Attempts   *int          `json:"attempts,omitempty"` // nil: refused before dispatch, so no "attempts" key
	Details    *aliasDetails `json:"details,omitempty"`
	RetryAfter time.Duration `json:"-"` // a retryable refusal's known wait, sent as Retry-After (SPEC §8.1)
	Err        error         `json:"-"` // cause: logged, never sent
	status     int           // 0: from the code table; set only by withStatus
}

// aliasDetails is the "details" member of alias refusals (SPEC §5.2).
type aliasDetails struct {
	Alias string  `json:"alias"`
	State string  `json:"state"`
	Route *string `json:"route"`
}

// refuse is how every refusal is made: code and a client-safe message.
func refuse(code, format string, args ...any) *apiError {
	c := codes[code] // an unknown code has status 0, which WriteHeader refuses loudly
	msg := truncateUTF8(fmt.Sprintf(format, args...), maxMessageBytes)
	return &apiError{Code: code, Message: msg, Type: c.typ, Retryable: c.retryable}
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }
func (e *apiError) Unwrap() error { return e.Err }

func (e *apiError) Status() int { return cmp.Or(e.status, codes[e.Code].status) }

// withStatus answers e with status (0: the table's), for invalid_request's 413 and provider_rejected's 4xx (SPEC §8.2).
func (e *apiError) withStatus(status int) *apiError {
	e.status = status
	return e
}

// withAttempts marks e as a refusal made after dispatch began.
func (e *apiError) withAttempts(n int) *apiError {
	e.Attempts = &n
	return e
}

// because records the cause for the log; it never reaches the client.
func (e *apiError) because(err error) *apiError {
	e.Err = err
	return e
}

// envelope is SPEC §8.1's wire shape; Type is "error" on the messages dialect, whose clients expect it.
type envelope struct {
	Type  string   `json:"type,omitempty"`
	Error apiError `json:"error"`
}

// asAPIError maps nil and an apiError to themselves, no state directory to dependency_unavailable, else internal_error.
func asAPIError(err error) *apiError {
	if ae, ok := errors.AsType[*apiError](err); err == nil || ok {
		return ae
	} else if errors.Is(err, errNoState) {
		return refuse("dependency_unavailable", "%s", err.Error()).because(err)
	}
	return refuse("internal_error", "internal error").because(err)
}

// encodeJSON writes v and a newline as every Brama body: `<` stays `<` (a 401 says `Bearer <token>`): no body is HTML.
func encodeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// writeJSON writes v as the JSON body with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	if encodeJSON(&b, v) != nil { // a failed Encode writes nothing
		status = 500
		b.WriteString(`{"error":{"message":"internal error","type":"internal_error","code":"internal_error","retryable":false}}` + "\n")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// writeAPIError writes err's envelope for r, with x-should-retry, Retry-After (SPEC §8.1) and Brama-Attempts (SPEC §7.4).
func writeAPIError(w http.ResponseWriter, r *http.Request, err error) *apiError {
	ae := asAPIError(err)
	h := w.Header()
	if ae.Attempts != nil {
		h.Set("Brama-Attempts", strconv.Itoa(*ae.Attempts))
	}
	h.Set("X-Should-Retry", strconv.FormatBool(ae.Retryable))
	if ae.Retryable && ae.RetryAfter > 0 { // rounded up: never back early (RFC 9110 §10.2.3)
		h.Set("Retry-After", strconv.FormatInt(int64((ae.RetryAfter+time.Second-1)/time.Second), 10))
	}
	messages := r != nil && (r.URL.Path == "/v1/messages" || strings.HasPrefix(r.URL.Path, "/v1/messages/"))
	writeJSON(w, ae.Status(), envelope{Type: pick(messages, "error", ""), Error: *ae})
	return ae
}

func truncateUTF8(s string, n int) string {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:min(n, len(s))]
}

// secretShaped matches API-key-shaped tokens (sk-…, sk-ant-…, brama_…), never quoted back (SPEC §8.1).
var secretShaped = regexp.MustCompile(`(sk-(ant-)?|brama_)[A-Za-z0-9_\-]{6,}`)

// redact replaces each presented secret, however its whitespace changed (SPEC §17), and each secret-shaped token.
func redact(s string, presented ...string) string {
	for _, p := range presented {
		var runes []string
		for _, r := range strings.Join(strings.Fields(p), "") {
			runes = append(runes, regexp.QuoteMeta(string(r)))
		}
		if len(runes) > 0 {
			s = regexp.MustCompile(strings.Join(runes, `[\s\v\x{85}\p{Z}]*`)).ReplaceAllLiteralString(s, "[redacted]")
		}
	}
	return secretShaped.ReplaceAllString(s, "[redacted]")
}

// cleanQuoted makes provider text safe to quote: valid UTF-8, one line, redacted, then cut to max characters.
func cleanQuoted(s, presented string, max int) string {
	r := []rune(redact(strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " "), presented))
	return string(r[:min(max, len(r))])
}
