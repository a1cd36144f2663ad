package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
)

// journalTimeFormat is the "at" of every record (SPEC §9): RFC 3339 in UTC
// with milliseconds, so records sort and compare as text.
const journalTimeFormat = "2006-01-02T15:04:05.000Z"

// journalRecord is one journal line (SPEC §9). Unknown kinds and fields are
// skipped by readers; a field never changes meaning once written, so new
// kinds and fields are only ever added here.
type journalRecord struct {
	Kind           string   `json:"kind"`
	At             string   `json:"at"` // RFC 3339 UTC with milliseconds: 2006-01-02T15:04:05.000Z
	SubscriptionID string   `json:"subscription_id,omitempty"`
	Reason         string   `json:"reason,omitempty"`
	Provider       string   `json:"provider,omitempty"`
	Result         string   `json:"result,omitempty"`
	Attempted      *int     `json:"attempted,omitempty"`
	Detail         string   `json:"detail,omitempty"`
	AgentID        string   `json:"agent_id,omitempty"`
	Task           string   `json:"task,omitempty"`
	Model          string   `json:"model,omitempty"`
	Status         string   `json:"status,omitempty"`
	Score          *float64 `json:"score,omitempty"`
	Alias          string   `json:"alias,omitempty"`
	From           *string  `json:"from"` // route_change only: always present there, null on create
	To             *string  `json:"to"`   // route_change only: always present there, null on delete
	By             string   `json:"by,omitempty"`
}

// journalRecordJSON is journalRecord without its MarshalJSON.
type journalRecordJSON journalRecord

// MarshalJSON emits from and to (null when nil) for route_change records
// only: there their presence says "created" or "deleted" (SPEC §9), and on
// any other kind they mean nothing and are left out.
func (r journalRecord) MarshalJSON() ([]byte, error) {
	if r.Kind == "route_change" {
		return json.Marshal(journalRecordJSON(r))
	}
	// The outer from/to sit shallower than the embedded ones, so they win
	// (encoding/json's dominant-field rule) and omitempty drops them.
	return json.Marshal(struct {
		journalRecordJSON
		From *string `json:"from,omitempty"`
		To   *string `json:"to,omitempty"`
	}{journalRecordJSON: journalRecordJSON(r)})
}

// journal is the append-only record of SPEC §9 at $STATE/journal.jsonl. Any
// process may append (one O_APPEND write per line), so the journal holds no
// open file between calls and always reads what is on disk now.
type journal struct {
	sys
	name    string        // the journal file; "" when there is no state directory
	noState *noStateError // why name is "", else nil

	// testingOnlySync replaces f.Sync inside append (nil in production) so
	// tests can reach the broken path.
	testingOnlySync func(f *os.File) error

	mu     sync.Mutex // guards broken; held across one append so this process's appends queue
	broken error      // the fsync failure that made the journal unusable; never cleared

	readMu     sync.Mutex   // guards fold, logged*
	fold       journalFold  // what the journal's complete lines say so far
	loggedFile fileIdentity // dev and ino of the file whose bad lines were logged
	loggedLine int          // highest bad line of loggedFile logged so far: lines are only appended
}

// journalFold is the journal read up to a line end: retirement (SPEC §9)
// and the unreadable lines, for /readyz.
type journalFold struct {
	file   fileIdentity     // dev and ino of the file folded
	off    int64            // bytes of file folded: always just after a '\n'
	lines  int              // complete lines in those bytes, for line numbers
	retire map[string]bool  // subscription ids whose last retire/reinstate is retire
	bad    []journalBadLine // the first maxReportedBadLines unreadable lines
	badN   int              // unreadable lines in all
}

// newJournal places the journal in st. It never fails: without a state
// directory every operation refuses with the *noStateError instead (SPEC
// §2.1), so serving can go on.
func newJournal(st state, sy sys) *journal {
	j := &journal{sys: sy}
	var err error
	j.name, err = st.path("journal", "journal.jsonl")
	errors.As(err, &j.noState) // path's only error
	return j
}

// errJournalUnusable wraps the fsync failure after which this process
// appends nothing more: the page cache may hold bytes that never reach the
// disk, and a retried fsync can report success anyway.
var errJournalUnusable = errors.New("journal unusable after a failed fsync")

// ready reports whether an append could be made now, so operations that
// must journal can refuse before changing anything (SPEC §2.1, §4.4). It
// changes nothing on disk.
func (j *journal) ready() error {
	if j.noState != nil {
		return j.noState
	}
	j.mu.Lock()
	broken := j.broken
	j.mu.Unlock()
	if broken != nil {
		return fmt.Errorf("%w: %w", errJournalUnusable, broken)
	}
	_, err := guardFile("journal", j.name)
	if errors.Is(err, errFileAbsent) {
		return journalDirWritable(filepath.Dir(j.name))
	}
	if err != nil {
		return err
	}
	f, err := os.OpenFile(j.name, os.O_RDWR|os.O_APPEND|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return f.Close()
}

// journalDirWritable says whether a file could be created in dir: the nearest
// existing ancestor must be a directory this process may write and search
// (MkdirAll creates the rest).
func journalDirWritable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if errors.Is(err, fs.ErrNotExist) && filepath.Dir(d) != d {
			continue
		}
		if err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("journal: %s is not a directory", d)
		}
		const wOK, xOK = 0x2, 0x1 // access(2) mode bits
		if err := syscall.Access(d, wOK|xOK); err != nil {
			return fmt.Errorf("journal: cannot create files in %s: %w", d, err)
		}
		return nil
	}
}

// append adds rec as one line and returns nil only once the line is on disk
// (SPEC §9, STYLE B7). At is set from now when empty. The syscall order:
// open O_APPEND (creating 0600 in a 0700 directory), flock so no two
// appenders both see a torn tail, read the last byte, one write of the line
// (prefixed with '\n' when the file ends in a torn line, so this record
// starts on a fresh one), unlock, fsync, and fsync the directory when this
// append created the file.
func (j *journal) append(rec journalRecord) error {
	if j.noState != nil {
		return j.noState
	}
	if rec.Kind == "" {
		return errors.New("journal record has no kind")
	}
	if rec.At == "" {
		rec.At = j.now().UTC().Format(journalTimeFormat)
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("journal %s record: %w", rec.Kind, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.broken != nil {
		return fmt.Errorf("%w: %w", errJournalUnusable, j.broken)
	}
	dir := filepath.Dir(j.name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	_, err = guardFile("journal", j.name)
	created := errors.Is(err, errFileAbsent)
	if err != nil && !created {
		return err
	}
	// O_NOFOLLOW closes the gap between guardFile's Lstat and this open.
	f, err := os.OpenFile(j.name, os.O_RDWR|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	if err := writeJournalLine(f, line); err != nil {
		return err
	}
	sync := f.Sync
	if j.testingOnlySync != nil {
		sync = func() error { return j.testingOnlySync(f) }
	}
	if err := sync(); err != nil {
		j.broken = err // never retry fsync; the page cache may be lying
		return fmt.Errorf("%w: %w", errJournalUnusable, err)
	}
	if created {
		if err := syncDir(dir); err != nil {
			return fmt.Errorf("journal: make the new file durable: %w", err)
		}
	}
	return nil
}

// writeJournalLine writes line and its '\n' to the O_APPEND file f in one write,
// under an exclusive flock on f so that concurrent appenders (other
// processes included) never both prefix a torn tail with '\n' and so leave
// an empty line.
func writeJournalLine(f *os.File, line []byte) error {
	fd := int(f.Fd())
	if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
		return fmt.Errorf("journal: lock: %w", err)
	}
	defer syscall.Flock(fd, syscall.LOCK_UN)
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	buf := make([]byte, 0, len(line)+2)
	if fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, fi.Size()-1); err != nil {
			return fmt.Errorf("journal: read last byte: %w", err)
		}
		if last[0] != '\n' {
			buf = append(buf, '\n') // SPEC §9: the torn line stays; this record starts fresh
		}
	}
	buf = append(append(buf, line...), '\n')
	n, err := f.Write(buf)
	if err == nil && n != len(buf) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("journal: write: %w", err)
	}
	return nil
}

// size is the journal's size in bytes for /stats (SPEC §13); an absent
// journal is empty.
func (j *journal) size() (int64, error) {
	if j.noState != nil {
		return 0, j.noState
	}
	id, err := guardFile("journal", j.name)
	if errors.Is(err, errFileAbsent) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return id.size, nil
}

// readAll returns the journal's bytes and identity; an absent journal is
// empty.
func (j *journal) readAll() ([]byte, fileIdentity, error) {
	if j.noState != nil {
		return nil, fileIdentity{}, j.noState
	}
	data, id, err := readGuarded("journal", j.name)
	if errors.Is(err, errFileAbsent) {
		return nil, fileIdentity{}, nil
	}
	return data, id, err
}

// retired folds retire and reinstate (SPEC §9: the later one in file order
// decides, per subscription) into the set of retired subscription ids.
// Eligibility asks on every request (SPEC §2.3), so the fold is kept and
// each call reads only the complete lines appended since the last; a torn
// final line waits until it completes. A file that shrank or was replaced
// is folded again from the start. The caller owns the returned map.
func (j *journal) retired() (map[string]bool, error) {
	if j.noState != nil {
		return nil, j.noState
	}
	j.readMu.Lock()
	defer j.readMu.Unlock()
	if err := j.foldTail(); err != nil {
		return nil, err
	}
	return maps.Clone(j.fold.retire), nil
}

// maxReportedBadLines is how many unreadable lines /readyz names one by
// one; the rest it counts.
const maxReportedBadLines = 100

// badLines returns the journal's unreadable complete lines (the first
// maxReportedBadLines of them) and how many there are in all, for /readyz.
// Like retired it folds only what was appended since the last call, so a
// readiness probe never rereads the whole journal (issue 10: 16 concurrent
// probes at 300 k lines took 4.9 s and 5.3 GB).
func (j *journal) badLines() ([]journalBadLine, int, error) {
	if j.noState != nil {
		return nil, 0, j.noState
	}
	j.readMu.Lock()
	defer j.readMu.Unlock()
	if err := j.foldTail(); err != nil {
		return nil, 0, err
	}
	return slices.Clone(j.fold.bad), j.fold.badN, nil
}

// foldTail brings the fold up to the journal's last complete line, and
// logs journal_line_unreadable once for each bad line (never the line
// itself: it may hold data). Callers hold readMu.
func (j *journal) foldTail() error {
	f, full, err := openGuarded("journal", j.name)
	if errors.Is(err, errFileAbsent) {
		j.fold = journalFold{retire: map[string]bool{}}
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	id := fileIdentity{dev: full.dev, ino: full.ino}
	if id != j.fold.file || full.size < j.fold.off || j.fold.retire == nil {
		j.fold = journalFold{file: id, retire: map[string]bool{}}
	}
	if id != j.loggedFile {
		j.loggedFile, j.loggedLine = id, 0
	}
	fo := &j.fold
	if full.size == fo.off {
		return nil
	}
	tail := make([]byte, full.size-fo.off)
	if _, err := f.ReadAt(tail, fo.off); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	end := bytes.LastIndexByte(tail, '\n')
	if end < 0 {
		return nil // only a torn (or still arriving) line so far
	}
	tail = tail[:end+1]
	recs, bad, _ := readJournalLines(tail)
	for _, b := range bad {
		b.Line += fo.lines
		if b.Line > j.loggedLine {
			j.log.Warn("journal_line_unreadable", "line", b.Line, "reason", b.Reason)
			j.loggedLine = b.Line
		}
		if fo.badN++; len(fo.bad) < maxReportedBadLines {
			fo.bad = append(fo.bad, b)
		}
	}
	for _, r := range recs {
		switch {
		case r.SubscriptionID == "":
		case r.Kind == "retire":
			fo.retire[r.SubscriptionID] = true
		case r.Kind == "reinstate":
			delete(fo.retire, r.SubscriptionID)
		}
	}
	fo.off += int64(len(tail))
	fo.lines += bytes.Count(tail, []byte{'\n'})
	return nil
}

// checkJournal is `brama journal check` (SPEC §16.1): it prints
// "line N: <reason>" for each unreadable line and "final line torn
// (ignored)" for a torn final line. ok is false when any non-final line is
// unreadable; err says the journal could not be read at all.
func checkJournal(j *journal, stdout io.Writer) (ok bool, err error) {
	data, _, err := j.readAll()
	if err != nil {
		return false, err
	}
	_, bad, torn := readJournalLines(data)
	for _, b := range bad {
		fmt.Fprintf(stdout, "line %d: %s\n", b.Line, b.Reason)
	}
	if torn {
		fmt.Fprintln(stdout, "final line torn (ignored)")
	}
	return len(bad) == 0, nil
}

// journalBadLine is one unreadable non-final line: its 1-based number and a
// short reason that never quotes the line (it may hold data).
type journalBadLine struct {
	Line   int
	Reason string
}

// readJournalLines parses journal bytes (SPEC §9). Each line ending in '\n'
// is a record or a bad line; a final line without '\n' is a torn write and
// is ignored, whatever it holds. It is pure so it can be fuzzed.
func readJournalLines(data []byte) (recs []journalRecord, bad []journalBadLine, torn bool) {
	for n := 1; len(data) > 0; n++ {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return recs, bad, true
		}
		rec, reason := parseJournalLine(data[:i])
		data = data[i+1:]
		if reason != "" {
			bad = append(bad, journalBadLine{Line: n, Reason: reason})
			continue
		}
		recs = append(recs, rec)
	}
	return recs, bad, false
}

// parseJournalLine reads one line, or says in a few words why it cannot:
// a line is readable when it is a JSON object with non-empty string "kind"
// and "at" and every known field has its type. Keys match exactly (not
// encoding/json's case-insensitive match), and from/to are read only on
// route_change, where alone they mean something, so a record re-encodes to
// what was read. It is the one lenient reader of a state file, not
// decodeStrict, on purpose: SPEC §9 has readers skip unknown kinds and
// fields, and keep reading past a bad line, named by a reason that never
// quotes it.
func parseJournalLine(line []byte) (journalRecord, string) {
	var r journalRecord
	lead := bytes.TrimLeft(line, " \t\r") // JSON's whitespace, not Unicode's
	switch {
	case len(bytes.TrimRight(lead, " \t\r")) == 0:
		return r, "empty line"
	case !json.Valid(line) && lead[0] == '{':
		return r, "malformed or incomplete JSON object (an interrupted write?)"
	case !json.Valid(line):
		return r, "not JSON"
	case lead[0] != '{':
		return r, "not a JSON object"
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return r, "not a JSON object"
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"kind", &r.Kind}, {"at", &r.At}} {
		raw, ok := m[f.name]
		if !ok {
			return r, "missing " + f.name
		}
		var s *string
		if err := json.Unmarshal(raw, &s); err != nil || s == nil {
			return r, f.name + " is not a string"
		}
		if *s == "" {
			return r, f.name + " is empty"
		}
		*f.dst = *s
	}
	fields := []journalField{{"subscription_id", &r.SubscriptionID}, {"reason", &r.Reason},
		{"provider", &r.Provider}, {"result", &r.Result}, {"attempted", &r.Attempted}, {"detail", &r.Detail},
		{"agent_id", &r.AgentID}, {"task", &r.Task}, {"model", &r.Model}, {"status", &r.Status},
		{"score", &r.Score}, {"alias", &r.Alias}, {"by", &r.By}}
	if r.Kind == "route_change" {
		fields = append(fields, journalField{"from", &r.From}, journalField{"to", &r.To})
	}
	for _, f := range fields {
		raw, ok := m[f.name]
		if !ok {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return journalRecord{}, "field " + f.name + " has the wrong type"
		}
	}
	return r, ""
}

// journalField is one optional member of a record and where it decodes to.
type journalField struct {
	name string
	dst  any
}
