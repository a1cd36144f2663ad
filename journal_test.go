package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// journalTestNow is a fixed clock: no test asserts on the wall clock.
// read returns every readable record in file order. Serving never needs
// them all (it folds), so this lives with the tests.
func (j *journal) read() (recs []journalRecord, err error) {
	_, err = j.scan(&journalFold{}, func(rec journalRecord, reason string) {
		if reason == "" {
			recs = append(recs, rec)
		}
	})
	return recs, err
}

// retired is the journal's retired set (folded's retire).
func (j *journal) retired() (map[string]bool, error) {
	fo, err := j.folded()
	maps.DeleteFunc(fo.retire, func(_ string, retired bool) bool { return !retired }) // a reinstated one reads false
	return fo.retire, err
}

func journalTestNow() time.Time { return time.Date(2025, 3, 4, 5, 6, 7, 890_000_000, time.UTC) }

// journalLogs keeps a journal's log output for assertions and also routes
// it to t.Logf (STYLE B9).
type journalLogs struct {
	t   *testing.T
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (l *journalLogs) Write(p []byte) (int, error) {
	l.t.Logf("%s", bytes.TrimRight(p, "\n"))
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *journalLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// newTestJournal places a journal in a state directory that does not exist
// yet, logging to t.Logf and to the returned buffer.
func newTestJournal(t *testing.T) (*journal, *journalLogs) {
	t.Helper()
	logs := &journalLogs{t: t}
	st := state{dir: filepath.Join(t.TempDir(), "state")}
	return newJournal(st, sys{log: slog.New(slog.NewJSONHandler(logs, nil)), now: journalTestNow}), logs
}

func journalPtr[T any](v T) *T { return &v }

// writeJournalFile puts raw bytes where j keeps its journal (0600, 0700).
func writeJournalFile(t *testing.T, j *journal, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(j.name), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(j.name, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// journalAppendRaw appends raw bytes to the journal file, as a foreign or crashed
// writer would.
func journalAppendRaw(t *testing.T, j *journal, data string) {
	t.Helper()
	f, err := os.OpenFile(j.name, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
}

func TestJournalAppendReadRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		rec  journalRecord
	}{
		{"retire", journalRecord{Kind: "retire", SubscriptionID: "sub_0123456789abcdef", Reason: "retired by admin"}},
		{"reinstate keeps its own at", journalRecord{Kind: "reinstate", At: "2024-01-01T00:00:00.000Z", SubscriptionID: "sub_1"}},
		{"refresh", journalRecord{Kind: "subscription_refresh", Provider: "anthropic", Reason: "operator", Result: "failed", Detail: "no grant"}},
		{"sign in", journalRecord{Kind: "subscription_sign_in", SubscriptionID: "sub_2", Provider: "claude-code", Result: "signed_in"}},
		{"route create", journalRecord{Kind: "route_change", routeChange: &routeChange{To: journalPtr("openai/gpt-5")}, Alias: "best", By: "cli"}},
		{"route delete", journalRecord{Kind: "route_change", routeChange: &routeChange{From: journalPtr("openai/gpt-5")}, Alias: "best", By: "admin"}},
		{"newline in a field stays one line", journalRecord{Kind: "retire", SubscriptionID: "sub_3", Reason: "a\nb"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, _ := newTestJournal(t)
			other := journalRecord{Kind: "future_kind", At: "2024-01-01T00:00:00.000Z", Detail: "first"}
			if err := j.append(other); err != nil {
				t.Fatal(err)
			}
			if err := j.append(tt.rec); err != nil {
				t.Fatal(err)
			}
			got, err := j.read()
			if err != nil {
				t.Fatal(err)
			}
			want := tt.rec
			if want.At == "" {
				want.At = "2025-03-04T05:06:07.890Z"
			}
			if diff := cmp.Diff([]journalRecord{other, want}, got, cmp.AllowUnexported(journalRecord{})); diff != "" {
				t.Errorf("read mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestJournalAppendRefusesRecordWithoutKind(t *testing.T) {
	j, _ := newTestJournal(t)
	if err := j.append(journalRecord{SubscriptionID: "sub_1"}); err == nil {
		t.Fatal("append without kind succeeded")
	}
	if _, err := os.Stat(j.name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused append touched the file: %v", err)
	}
}

func TestJournalFileModes(t *testing.T) {
	j, _ := newTestJournal(t)
	if err := j.append(journalRecord{Kind: "retire", SubscriptionID: "sub_1"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		path string
		want os.FileMode
	}{
		{"file", j.name, 0o600},
		{"dir", filepath.Dir(j.name), 0o700 | os.ModeDir},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode(); got != c.want {
			t.Errorf("%s mode = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestJournalConcurrentAppends(t *testing.T) {
	j, _ := newTestJournal(t)
	// Four journals on one file stand in for four processes: they share no
	// mutex, only O_APPEND and the file lock.
	js := []*journal{j}
	for range 3 {
		js = append(js, newJournal(state{dir: filepath.Dir(j.name)}, testSys(t, journalTestNow)))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- js[i%len(js)].append(journalRecord{Kind: "retire", SubscriptionID: fmt.Sprintf("sub_%02d", i)})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	data, err := os.ReadFile(j.name)
	if err != nil {
		t.Fatal(err)
	}
	recs, bad, torn := readJournalLines(t, data)
	if len(bad) != 0 || torn {
		t.Fatalf("bad lines %v, torn %v", bad, torn)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		seen[r.SubscriptionID] = true
	}
	if len(recs) != 32 || len(seen) != 32 || bytes.Count(data, []byte("\n")) != 32 {
		t.Errorf("got %d records, %d distinct, %d lines; want 32 of each", len(recs), len(seen), bytes.Count(data, []byte("\n")))
	}
}

func TestJournalTornFinalLine(t *testing.T) {
	j, logs := newTestJournal(t)
	first := `{"kind":"retire","at":"2025-01-01T00:00:00.000Z","subscription_id":"sub_1"}` + "\n"
	writeJournalFile(t, j, first+`{"kind":"retire","at":"2025-01-01T00:00:01.000Z","subscription_id":"sub_TORNSECRET`)

	recs, err := j.read()
	if err != nil {
		t.Fatal(err)
	}
	want := []journalRecord{{Kind: "retire", At: "2025-01-01T00:00:00.000Z", SubscriptionID: "sub_1"}}
	if diff := cmp.Diff(want, recs, cmp.AllowUnexported(journalRecord{})); diff != "" {
		t.Errorf("read with torn tail (-want +got):\n%s", diff)
	}
	var out bytes.Buffer
	ok, err := checkJournal(j, &out)
	if err != nil || !ok || out.String() != "final line torn (ignored)\n" {
		t.Errorf("checkJournal = %v, %v, output %q; want true, nil, the torn line note", ok, err, out.String())
	}
	if got, err := j.retired(); err != nil || !cmp.Equal(got, map[string]bool{"sub_1": true}) {
		t.Errorf("retired = %v, %v; the torn retire must not count", got, err)
	}

	next := journalRecord{Kind: "reinstate", SubscriptionID: "sub_1", Reason: "back"}
	if err := j.append(next); err != nil {
		t.Fatal(err)
	}
	recs, err = j.read()
	if err != nil {
		t.Fatal(err)
	}
	next.At = journalTestNow().Format(journalTimeFormat)
	if diff := cmp.Diff(append(want, next), recs, cmp.AllowUnexported(journalRecord{})); diff != "" {
		t.Errorf("read after append (-want +got):\n%s", diff)
	}
	if got, err := j.retired(); err != nil || len(got) != 0 {
		t.Errorf("retired after reinstate = %v, %v; want none", got, err)
	}
	// SPEC §9: the torn line is no longer final, so it is reported like any
	// other unreadable line; never silently taken as history.
	out.Reset()
	ok, err = checkJournal(j, &out)
	if err != nil || ok || !strings.HasPrefix(out.String(), "line 2: ") || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("checkJournal after append = %v, %v, output %q; want line 2 reported", ok, err, out.String())
	}
	if strings.Contains(out.String()+logs.String(), "TORNSECRET") {
		t.Errorf("line text leaked into output or logs")
	}
}

func TestJournalUnreadableMiddleLine(t *testing.T) {
	tests := []struct {
		name, line, reason string
	}{
		{"not JSON", "SECRET garbage", "not JSON"},
		{"interrupted object", `{"kind":"retire","at":"SECRET`, "malformed or incomplete JSON object (an interrupted write?)"},
		{"array", `["SECRET"]`, "not a JSON object"},
		{"empty", "", "empty line"},
		{"missing kind", `{"at":"2025-01-01T00:00:00.000Z","detail":"SECRET"}`, "missing kind"},
		{"kind not a string", `{"kind":7,"at":"x","detail":"SECRET"}`, "kind is empty or not a string"},
		{"missing at", `{"kind":"retire","detail":"SECRET"}`, "missing at"},
		{"wrong field type", `{"kind":"retire","at":"x","subscription_id":["SECRET"]}`, "field subscription_id has the wrong type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, logs := newTestJournal(t)
			good := `{"kind":"retire","at":"2025-01-01T00:00:00.000Z","subscription_id":"sub_1"}` + "\n"
			writeJournalFile(t, j, good+tt.line+"\n"+good)
			var out bytes.Buffer
			ok, err := checkJournal(j, &out)
			if err != nil || ok {
				t.Errorf("checkJournal = %v, %v; want false, nil", ok, err)
			}
			if want := "line 2: " + tt.reason + "\n"; out.String() != want {
				t.Errorf("checkJournal printed %q, want %q", out.String(), want)
			}
			for range 2 { // the second fold must not log the line again
				if _, err := j.retired(); err != nil {
					t.Errorf("retired = %v", err)
				}
				recs, err := j.read()
				if err != nil || len(recs) != 2 {
					t.Errorf("read = %d records, %v; want the 2 readable ones", len(recs), err)
				}
			}
			if got := strings.Count(logs.String(), `"msg":"journal_line_unreadable"`); got != 1 {
				t.Errorf("logged journal_line_unreadable %d times, want 1:\n%s", got, logs.String())
			}
			if !strings.Contains(logs.String(), `"line":2`) {
				t.Errorf("log lacks the line number:\n%s", logs.String())
			}
			if strings.Contains(out.String()+logs.String(), "SECRET") {
				t.Errorf("line text leaked into output or logs")
			}
		})
	}
}

func TestJournalNoStateDirectory(t *testing.T) {
	cause := errors.New("$HOME is not defined")
	j := newJournal(state{cause: cause}, testSys(t, journalTestNow))
	ops := []struct {
		name string
		op   func() error
	}{
		{"append", func() error { return j.append(journalRecord{Kind: "retire", SubscriptionID: "sub_1"}) }},
		{"read", func() error { _, err := j.read(); return err }},
		{"ready", j.ready},
		{"size", func() error { _, err := j.size(); return err }},
		{"retired", func() error { _, err := j.retired(); return err }},
		{"check", func() error {
			ok, err := checkJournal(j, &bytes.Buffer{})
			if ok {
				return errors.New("checkJournal said ok")
			}
			return err
		}},
	}
	for _, tt := range ops {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op()
			if !errors.Is(err, errNoState) {
				t.Fatalf("err = %v, want errNoState", err)
			}
			if !errors.Is(err, cause) || !strings.Contains(err.Error(), "$HOME is not defined") || !strings.Contains(err.Error(), "journal") {
				t.Errorf("err %q does not name the journal and the cause", err)
			}
		})
	}
}

func TestJournalAbsentFileIsEmpty(t *testing.T) {
	j, _ := newTestJournal(t)
	if err := j.ready(); err != nil {
		t.Errorf("ready = %v, want nil", err)
	}
	if recs, err := j.read(); err != nil || len(recs) != 0 {
		t.Errorf("read = %v, %v", recs, err)
	}
	if n, err := j.size(); err != nil || n != 0 {
		t.Errorf("size = %d, %v", n, err)
	}
	if got, err := j.retired(); err != nil || len(got) != 0 {
		t.Errorf("retired = %v, %v", got, err)
	}
	var out bytes.Buffer
	if ok, err := checkJournal(j, &out); !ok || err != nil || out.Len() != 0 {
		t.Errorf("checkJournal = %v, %v, %q", ok, err, out.String())
	}
	if _, err := os.Stat(filepath.Dir(j.name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("reading an absent journal created the state directory: %v", err)
	}
}

func TestJournalRefusesUnguardedFile(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, j *journal)
		want  string
	}{
		{"group readable", func(t *testing.T, j *journal) {
			writeJournalFile(t, j, "")
			if err := os.Chmod(j.name, 0o640); err != nil {
				t.Fatal(err)
			}
		}, "chmod 600"},
		{"symlink", func(t *testing.T, j *journal) {
			target := filepath.Join(t.TempDir(), "elsewhere")
			if err := os.WriteFile(target, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(j.name), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, j.name); err != nil {
				t.Fatal(err)
			}
		}, "is a symlink"}, // not "symlink": the test's directory is named so
		{"directory", func(t *testing.T, j *journal) {
			if err := os.MkdirAll(j.name, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, _ := newTestJournal(t)
			tt.setup(t, j)
			for _, op := range []struct {
				name string
				err  error
			}{
				{"ready", j.ready()},
				{"append", j.append(journalRecord{Kind: "retire", SubscriptionID: "sub_1"})},
				{"read", func() error { _, err := j.read(); return err }()},
				{"retired", func() error { _, err := j.retired(); return err }()},
			} {
				if op.err == nil || !strings.Contains(op.err.Error(), tt.want) {
					t.Errorf("%s = %v, want an error naming %q", op.name, op.err, tt.want)
				}
			}
		})
	}
}

func TestJournalSyncFailureMakesItUnusable(t *testing.T) {
	j, _ := newTestJournal(t)
	syncErr := errors.New("EIO")
	calls := 0
	j.testingOnlySync = func(f *os.File) error { calls++; return syncErr }
	err := j.append(journalRecord{Kind: "retire", SubscriptionID: "sub_1"})
	if !errors.Is(err, errJournalUnusable) || !errors.Is(err, syncErr) {
		t.Fatalf("append = %v, want errJournalUnusable wrapping the fsync error", err)
	}
	j.testingOnlySync = nil
	for _, op := range []struct {
		name string
		err  error
	}{
		{"append", j.append(journalRecord{Kind: "retire", SubscriptionID: "sub_2"})},
		{"ready", j.ready()},
		{"size (/readyz)", func() error { _, err := j.size(); return err }()},
	} {
		if !errors.Is(op.err, errJournalUnusable) {
			t.Errorf("%s after fsync failure = %v, want errJournalUnusable", op.name, op.err)
		}
	}
	if calls != 1 {
		t.Errorf("fsync attempted %d times, want 1 (never retried)", calls)
	}
	if recs, err := j.read(); err != nil || len(recs) != 1 {
		t.Errorf("read = %d records, %v; the refused second append must write nothing", len(recs), err)
	}
}

// TestJournalAppendNamesItsCause: an append the file system refuses fails naming the cause (SPEC §2.1's journal row;
// RUNBOOK "A full disk": journal_append_failed), and a line that did not reach the file is never acknowledged.
func TestJournalAppendNamesItsCause(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, j *journal) (cause error, names string)
	}{
		{"state directory a dangling symlink", func(t *testing.T, j *journal) (error, string) {
			dir := filepath.Dir(j.name)
			if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(t.TempDir(), "gone"), dir); err != nil {
				t.Fatal(err)
			}
			return fs.ErrExist, dir
		}},
		{"file size limit reached", func(t *testing.T, j *journal) (error, string) {
			const limit = 1 << 30 // sparse: nothing else this test process writes grows a file that far
			writeJournalFile(t, j, "")
			if err := os.Truncate(j.name, limit); err != nil {
				t.Fatal(err)
			}
			var old syscall.Rlimit
			if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
				t.Fatal(err)
			} else if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: limit, Max: old.Max}); err != nil {
				t.Skipf("cannot lower RLIMIT_FSIZE: %v", err)
			}
			t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old) })
			return syscall.EFBIG, j.name // the runtime ignores SIGXFSZ: write(2) says EFBIG
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, _ := newTestJournal(t)
			cause, names := tt.setup(t, j)
			before, _ := os.Stat(j.name)
			err := j.append(journalRecord{Kind: "retire", SubscriptionID: "sub_1"})
			if !errors.Is(err, cause) || !strings.Contains(err.Error(), names) {
				t.Errorf("append = %v, want an error naming %s and wrapping %v", err, names, cause)
			}
			if after, _ := os.Stat(j.name); before != nil && (after == nil || after.Size() != before.Size()) {
				t.Errorf("the refused append changed the journal's size")
			}
		})
	}
}

// TestJournalReadyRefusesAnUnwritablePlace: ready asks access(2) whether this process may write the journal or
// create it in its nearest existing ancestor, so a registry write refuses before staging (SPEC §4.4). Root passes
// access(2).
func TestJournalReadyRefusesAnUnwritablePlace(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("access(2) grants root every write")
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, j *journal) (names string)
	}{
		{"a read-only journal", func(t *testing.T, j *journal) string {
			writeJournalFile(t, j, "")
			if err := os.Chmod(j.name, 0o400); err != nil {
				t.Fatal(err)
			}
			return j.name
		}},
		{"no journal in a read-only state directory", func(t *testing.T, j *journal) string {
			if err := os.MkdirAll(filepath.Dir(j.name), 0o500); err != nil {
				t.Fatal(err)
			}
			return filepath.Dir(j.name)
		}},
		{"no state directory in a read-only parent", func(t *testing.T, j *journal) string {
			parent := filepath.Dir(filepath.Dir(j.name))
			if err := os.Chmod(parent, 0o500); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Chmod(parent, 0o700) }) // t.TempDir's removal needs it
			return parent
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, _ := newTestJournal(t)
			names := tt.setup(t, j)
			want := "journal: cannot write " + names + ": permission denied"
			if err := j.ready(); err == nil || err.Error() != want || !errors.Is(err, fs.ErrPermission) {
				t.Errorf("ready = %v, want %q", err, want)
			}
		})
	}
}

func TestJournalRetiredFold(t *testing.T) {
	tests := []struct {
		name string
		recs []journalRecord
		want map[string]bool
	}{
		{"none", nil, map[string]bool{}},
		{"retire", []journalRecord{{Kind: "retire", SubscriptionID: "a"}}, map[string]bool{"a": true}},
		{"later reinstate wins", []journalRecord{{Kind: "retire", SubscriptionID: "a"}, {Kind: "reinstate", SubscriptionID: "a"}}, map[string]bool{}},
		{"later retire wins", []journalRecord{{Kind: "reinstate", SubscriptionID: "a"}, {Kind: "retire", SubscriptionID: "a"}}, map[string]bool{"a": true}},
		{"per subscription", []journalRecord{
			{Kind: "retire", SubscriptionID: "a"}, {Kind: "retire", SubscriptionID: "b"},
			{Kind: "reinstate", SubscriptionID: "a"}, {Kind: "subscription_sign_in", SubscriptionID: "b"},
		}, map[string]bool{"b": true}},
		{"other kinds ignored", []journalRecord{{Kind: "check", SubscriptionID: "a"}, {Kind: "retire"}}, map[string]bool{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, _ := newTestJournal(t)
			for _, r := range tt.recs {
				if err := j.append(r); err != nil {
					t.Fatal(err)
				}
			}
			got, err := j.retired()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("retired (-want +got):\n%s", diff)
			}
		})
	}
}

func TestJournalRetiredReadsOnlyTheNewTail(t *testing.T) {
	j, logs := newTestJournal(t)
	mustRetired := func(want map[string]bool) {
		t.Helper()
		got, err := j.retired()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("retired (-want +got):\n%s", diff)
		}
	}
	for _, id := range []string{"sub_a", "sub_b"} {
		if err := j.append(journalRecord{Kind: "retire", SubscriptionID: id}); err != nil {
			t.Fatal(err)
		}
	}
	mustRetired(map[string]bool{"sub_a": true, "sub_b": true})
	got, _ := j.retired()
	got["sub_z"] = true // the caller owns its copy
	mustRetired(map[string]bool{"sub_a": true, "sub_b": true})

	// Rewrite sub_a's line in place (same file, same size): the folded
	// prefix is not read again, so the fold still says sub_a.
	f, err := os.OpenFile(j.name, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(j.name)
	if _, err := f.WriteAt([]byte("sub_x"), int64(bytes.Index(data, []byte("sub_a")))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := j.append(journalRecord{Kind: "reinstate", SubscriptionID: "sub_b"}); err != nil {
		t.Fatal(err)
	}
	mustRetired(map[string]bool{"sub_a": true})

	// A line still arriving is not consumed until its newline lands.
	journalAppendRaw(t, j, `{"kind":"retire","at":"2025-01-01T00:00:00.000Z",`)
	mustRetired(map[string]bool{"sub_a": true})
	journalAppendRaw(t, j, `"subscription_id":"sub_c"}`+"\n"+"garbage\n")
	mustRetired(map[string]bool{"sub_a": true, "sub_c": true})
	if !strings.Contains(logs.String(), `"line":5`) {
		t.Errorf("the unreadable line 5 was not logged with its number:\n%s", logs.String())
	}

	// A replaced file (new inode) is folded from the start, though it is longer than the part already folded.
	replaced := `{"kind":"retire","at":"2025-01-01T00:00:00.000Z","subscription_id":"sub_new"}` + "\n" +
		strings.Repeat(`{"kind":"reinstate","at":"2025-01-01T00:00:00.000Z","subscription_id":"sub_pad"}`+"\n", 20)
	if old, _ := os.ReadFile(j.name); len(replaced) <= len(old) {
		t.Fatalf("the replacement (%d bytes) must be longer than the journal (%d)", len(replaced), len(old))
	}
	if err := writeFileAtomic(j.name, []byte(replaced)); err != nil {
		t.Fatal(err)
	}
	mustRetired(map[string]bool{"sub_new": true})

	// So is a file that shrank.
	if err := os.Truncate(j.name, 0); err != nil {
		t.Fatal(err)
	}
	mustRetired(map[string]bool{})
	if err := j.append(journalRecord{Kind: "retire", SubscriptionID: "sub_d"}); err != nil {
		t.Fatal(err)
	}
	mustRetired(map[string]bool{"sub_d": true})

	// And a file that went away folds to nothing.
	if err := os.Remove(j.name); err != nil {
		t.Fatal(err)
	}
	mustRetired(map[string]bool{})
}

// TestJournalRetiredKindsStayReadable: lines of the retired kinds `check`
// and `subscription_refresh` (SPEC §9), as the old code wrote them, are
// still readable history: the journal reads them, `journal check` passes,
// and they change nothing in the retire/reinstate fold.
func TestJournalRetiredKindsStayReadable(t *testing.T) {
	j, logs := newTestJournal(t)
	lines := []string{
		`{"kind":"check","at":"2025-03-04T05:06:07.890Z","agent_id":"a","task":"t","model":"openai/gpt-5","status":"pass","score":1}`,
		`{"kind":"retire","at":"2025-03-04T05:06:08.000Z","subscription_id":"sub_1","reason":"gone"}`,
		`{"kind":"subscription_refresh","at":"2025-03-04T05:06:09.000Z","provider":"codex","reason":"rotated","result":"failed","attempted":0,"detail":"no grant"}`,
		`{"kind":"check","at":"2025-03-04T05:06:10.000Z","agent_id":"a","task":"t","model":"anthropic/claude","status":"fail","score":0}`,
		`{"kind":"retire","at":"2025-03-04T05:06:11.000Z","subscription_id":"sub_2"}`,
		`{"kind":"reinstate","at":"2025-03-04T05:06:12.000Z","subscription_id":"sub_2","reason":"back"}`,
	}
	data := strings.Join(lines, "\n") + "\n"
	writeJournalFile(t, j, data)
	recs, err := j.read()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, r := range recs {
		kinds = append(kinds, r.Kind)
	}
	if want := []string{"check", "retire", "subscription_refresh", "check", "retire", "reinstate"}; !cmp.Equal(want, kinds) {
		t.Errorf("read kinds = %v, want %v", kinds, want)
	}
	got, err := j.retired()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]bool{"sub_1": true}, got); diff != "" {
		t.Errorf("retired (-want +got):\n%s", diff)
	}
	var out bytes.Buffer
	if ok, err := checkJournal(j, &out); !ok || err != nil || out.Len() != 0 {
		t.Errorf("checkJournal = %v, %v, %q; want ok and nothing reported", ok, err, out.String())
	}
	if strings.Contains(logs.String(), "journal_line_unreadable") {
		t.Errorf("a retired kind was logged unreadable: %s", logs)
	}
	n, err := j.size()
	if err != nil || n != int64(len(data)) {
		t.Errorf("size = %d, %v; file holds %d bytes", n, err, len(data))
	}
}
