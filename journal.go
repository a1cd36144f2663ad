package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// journalTimeFormat is every state time (SPEC §9 "at"): RFC 3339 UTC with
// milliseconds, so times sort as text.
const journalTimeFormat = "2006-01-02T15:04:05.000Z"

// journalRecord is one journal line (SPEC §9). A field never changes
// meaning once written, so kinds and fields are only ever added here.
type journalRecord struct {
	Kind           string   `json:"kind"`
	At             string   `json:"at"` // journalTimeFormat
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

// MarshalJSON writes from and to (null when nil) on route_change only, where
// their presence says "created" or "deleted" (SPEC §9).
func (r journalRecord) MarshalJSON() ([]byte, error) {
	type plain journalRecord // without this method
	if r.Kind == "route_change" {
		return json.Marshal(plain(r))
	}
	// The outer from/to are shallower than the embedded ones, so they win
	// (encoding/json's dominant-field rule) and omitempty drops them.
	return json.Marshal(struct {
		plain
		From *string `json:"from,omitempty"`
		To   *string `json:"to,omitempty"`
	}{plain: plain(r)})
}

// journal is SPEC §9's append-only $STATE/journal.jsonl. Any process may
// append, so it keeps no file open.
type journal struct {
	sys
	name    string        // the journal file; "" when there is no state directory
	noState *noStateError // why name is "", else nil

	testingOnlySync func(f *os.File) error // replaces f.Sync's result in append (nil in production)

	mu     sync.Mutex // guards broken; held across one append so this process's appends queue
	broken error      // the fsync failure that made the journal unusable; never cleared

	readMu sync.Mutex  // guards fold
	fold   journalFold // what the journal's complete lines say so far
}

// journalFold is the journal read up to a line end: retirement and bad lines.
type journalFold struct {
	file   fileIdentity     // dev and ino of the file folded
	off    int64            // bytes of file folded: always just after a '\n'
	lines  int              // complete lines in those bytes, for line numbers
	retire map[string]bool  // subscription ids whose last retire/reinstate is retire
	bad    []journalBadLine // the first maxReportedBadLines unreadable lines
	badN   int              // unreadable lines in all
}

// newJournal places the journal in st; without a state directory every
// operation refuses with the *noStateError (SPEC §2.1).
func newJournal(st state, sy sys) *journal {
	j := &journal{sys: sy}
	var err error
	j.name, err = st.path("journal", "journal.jsonl")
	errors.As(err, &j.noState) // path's only error
	return j
}

// errJournalUnusable wraps the fsync failure after which this process
// appends nothing: a retried fsync can report success for lost bytes.
var errJournalUnusable = errors.New("journal unusable after a failed fsync")

// unusable says why no append can be made at all. Callers hold mu.
func (j *journal) unusable() error {
	if j.noState != nil {
		return j.noState
	}
	if j.broken != nil {
		return fmt.Errorf("%w: %w", errJournalUnusable, j.broken)
	}
	return nil
}

// ready reports, changing nothing, whether an append could be made now (SPEC §2.1, §4.4).
func (j *journal) ready() error {
	j.mu.Lock()
	err := j.unusable()
	j.mu.Unlock()
	if err != nil {
		return err
	}
	f, _, err := j.open(0)
	if errors.Is(err, errFileAbsent) {
		return journalDirWritable(filepath.Dir(j.name))
	}
	if err == nil {
		err = f.Close()
	}
	return err
}

// open opens the guarded journal O_APPEND; create (0 or os.O_CREATE) makes
// a missing one 0600, and then id is zero.
func (j *journal) open(create int) (f *os.File, id fileIdentity, err error) {
	id, err = guardFile("journal", j.name)
	if err != nil && !(create != 0 && errors.Is(err, errFileAbsent)) {
		return nil, id, err
	}
	f, err = os.OpenFile(j.name, os.O_RDWR|os.O_APPEND|syscall.O_NOFOLLOW|create, 0o600) // O_NOFOLLOW: no symlink since the Lstat
	if err != nil {
		return nil, id, fmt.Errorf("journal: %w", err)
	}
	return f, id, nil
}

// journalDirWritable says whether a file could be created in dir: its nearest
// existing ancestor is a directory this process may write and search.
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

// append adds rec as one line, nil only once on disk (SPEC §9, STYLE B7): open
// O_APPEND, flock, one write, unlock, fsync, and fsync the directory of a new file.
func (j *journal) append(rec journalRecord) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.unusable(); err != nil {
		return err
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
	dir := filepath.Dir(j.name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	f, id, err := j.open(os.O_CREATE)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := writeJournalLine(f, line); err != nil {
		return err
	}
	err = f.Sync()
	if j.testingOnlySync != nil {
		err = j.testingOnlySync(f)
	}
	if err != nil {
		j.broken = err // never retry fsync; the page cache may be lying
		return j.unusable()
	}
	if id == (fileIdentity{}) { // this append created the file
		if err := syncDir(dir); err != nil {
			return fmt.Errorf("journal: make the new file durable: %w", err)
		}
	}
	return nil
}

// tornMark ends a torn final line before the next record's fresh line: no JSON
// text ends in ')', so a record that lost only its newline never becomes history.
var tornMark = []byte(" (torn)\n")

// writeJournalLine writes line and '\n' in one write, flocked so that two
// appenders never both mark one torn tail (the second mark would be a line of its own).
func writeJournalLine(f *os.File, line []byte) error {
	fd := int(f.Fd())
	if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
		return fmt.Errorf("journal: lock: %w", err)
	}
	defer syscall.Flock(fd, syscall.LOCK_UN)
	last := []byte{'\n'}
	fi, err := f.Stat()
	if err == nil && fi.Size() > 0 {
		_, err = f.ReadAt(last, fi.Size()-1)
	}
	if err != nil {
		return fmt.Errorf("journal: read last byte: %w", err)
	}
	buf := slices.Concat(tornMark, line, []byte{'\n'})
	if last[0] == '\n' {
		buf = buf[len(tornMark):] // else SPEC §9: the torn line stays, marked; this record starts fresh
	}
	if _, err := f.Write(buf); err != nil { // a short write is an error
		return fmt.Errorf("journal: write: %w", err)
	}
	return nil
}

// size is the journal's size in bytes for /metrics (SPEC §13).
func (j *journal) size() (int64, error) {
	if j.noState != nil {
		return 0, j.noState
	}
	id, err := guardFile("journal", j.name)
	if errors.Is(err, errFileAbsent) {
		return 0, nil
	}
	return id.size, err
}

// retired is the set of retired subscription ids: per subscription, the
// later of retire and reinstate in file order decides (SPEC §9).
func (j *journal) retired() (retired map[string]bool, err error) {
	err = j.folded(func(fo *journalFold) { retired = maps.Clone(fo.retire) })
	return retired, err
}

// maxReportedBadLines is how many unreadable lines /readyz names; the rest it counts.
const maxReportedBadLines = 100

// badLines returns the first unreadable lines and their number, for /readyz.
func (j *journal) badLines() (bad []journalBadLine, n int, err error) {
	err = j.folded(func(fo *journalFold) { bad, n = slices.Clone(fo.bad), fo.badN })
	return bad, n, err
}

// folded folds the lines completed since the last call (a shrunk or replaced
// file from the start), logging each bad line as it folds it, and lets read
// copy from the fold. Requests and probes ask often, so it reads only new
// lines (issue 10: rereading took 5 GB).
func (j *journal) folded(read func(*journalFold)) error {
	if j.noState != nil {
		return j.noState
	}
	j.readMu.Lock()
	defer j.readMu.Unlock()
	f, full, err := openGuarded("journal", j.name)
	switch {
	case errors.Is(err, errFileAbsent):
		j.fold = journalFold{retire: map[string]bool{}}
		read(&j.fold)
		return nil
	case err != nil:
		return err
	}
	defer f.Close()
	id := fileIdentity{dev: full.dev, ino: full.ino}
	if id != j.fold.file || full.size < j.fold.off || j.fold.retire == nil {
		j.fold = journalFold{file: id, retire: map[string]bool{}}
	}
	fo := &j.fold
	// Line by line, so a first fold takes a line's memory, not the file's.
	r := bufio.NewReader(io.NewSectionReader(f, fo.off, full.size-fo.off))
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF {
			break // a torn final line, or one still being written: not yet a line
		}
		if err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		fo.off += int64(len(line))
		fo.lines++
		rec, reason := parseJournalLine(line[:len(line)-1])
		switch {
		case reason != "":
			j.log.Warn("journal_line_unreadable", "line", fo.lines, "reason", reason)
			if fo.badN++; len(fo.bad) < maxReportedBadLines {
				fo.bad = append(fo.bad, journalBadLine{Line: fo.lines, Reason: reason})
			}
		case rec.SubscriptionID == "":
		case rec.Kind == "retire":
			fo.retire[rec.SubscriptionID] = true
		case rec.Kind == "reinstate":
			delete(fo.retire, rec.SubscriptionID)
		}
	}
	read(fo)
	return nil
}

// checkJournal is `brama journal check` (SPEC §16.1), line by line so it
// takes a line's memory; ok is false when a non-final line is unreadable.
func checkJournal(j *journal, stdout io.Writer) (ok bool, err error) {
	if j.noState != nil {
		return false, j.noState
	}
	f, _, err := openGuarded("journal", j.name)
	if errors.Is(err, errFileAbsent) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	r, ok := bufio.NewReader(f), true
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		switch {
		case err == io.EOF && len(line) > 0:
			fmt.Fprintln(stdout, "final line torn (ignored)")
			return ok, nil
		case err == io.EOF:
			return ok, nil
		case err != nil:
			return false, fmt.Errorf("journal: %w", err)
		}
		if _, reason := parseJournalLine(line[:len(line)-1]); reason != "" {
			fmt.Fprintf(stdout, "line %d: %s\n", n, reason)
			ok = false
		}
	}
}

// journalBadLine is one unreadable line: its number and a reason that never
// quotes it (it may hold data).
type journalBadLine struct {
	Line   int
	Reason string
}

// readJournalLines parses journal bytes (SPEC §9): each line ending in '\n'
// is a record or a bad line; a final line without one is torn and ignored.
func readJournalLines(data []byte) (recs []journalRecord, bad []journalBadLine, torn bool) {
	for n := 1; len(data) > 0; n++ {
		line, rest, ok := bytes.Cut(data, []byte{'\n'})
		if !ok {
			return recs, bad, true
		}
		data = rest
		if rec, reason := parseJournalLine(line); reason != "" {
			bad = append(bad, journalBadLine{Line: n, Reason: reason})
		} else {
			recs = append(recs, rec)
		}
	}
	return recs, bad, false
}

// parseJournalLine reads one line or says why not (SPEC §9). Keys match
// exactly and from/to only on route_change, so a record re-encodes to what was
// read; unknown kinds and fields are skipped, so it is not decodeStrict.
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
	json.Unmarshal(line, &m)        // a valid object
	v := reflect.ValueOf(&r).Elem() // Kind comes first, so it is known at from and to
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		raw, ok := m[name]
		required := name == "kind" || name == "at" // non-empty strings
		if !ok || (name == "from" || name == "to") && r.Kind != "route_change" {
			if required {
				return journalRecord{}, "missing " + name
			}
			continue
		}
		err := json.Unmarshal(raw, v.Field(i).Addr().Interface())
		switch {
		case required && (err != nil || string(raw) == "null"): // raw holds no blanks
			return journalRecord{}, name + " is not a string"
		case required && v.Field(i).String() == "":
			return journalRecord{}, name + " is empty"
		case err != nil:
			return journalRecord{}, "field " + name + " has the wrong type"
		}
	}
	return r, ""
}
