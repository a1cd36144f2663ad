package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	ledgerIDA = "sub_0123456789abcdef"
	ledgerIDB = "sub_fedcba9876543210"
)

// ledgerT0 is the injected clock's start.
var ledgerT0 = time.Date(2025, 10, 1, 12, 0, 0, 0, time.UTC)

// ledgerTimers stands in for time.AfterFunc: it records every write-behind
// armed and lets the test fire it.
type ledgerTimers struct {
	mu     sync.Mutex // guards timers
	timers []*ledgerTimer
}

type ledgerTimer struct {
	d       time.Duration
	f       func()
	stopped bool
}

func (t *ledgerTimer) Stop() bool {
	was := !t.stopped
	t.stopped = true
	return was
}

func (ts *ledgerTimers) afterFunc(d time.Duration, f func()) ledgerStopper {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := &ledgerTimer{d: d, f: f}
	ts.timers = append(ts.timers, t)
	return t
}

// fireLast runs the newest timer's function as time.AfterFunc would.
func (ts *ledgerTimers) fireLast(t *testing.T) {
	t.Helper()
	ts.mu.Lock()
	if len(ts.timers) == 0 {
		ts.mu.Unlock()
		t.Fatal("no write-behind was armed")
	}
	last := ts.timers[len(ts.timers)-1]
	ts.mu.Unlock()
	last.f()
}

func (ts *ledgerTimers) count() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.timers)
}

// ledgerLogLines returns the JSON log records with message msg.
func ledgerLogLines(t *testing.T, logs *syncBuffer, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// newTestLedger opens a ledger over st with a fake clock, fake timers and
// captured JSON logs.
func newTestLedger(st state) (*ledger, *testClock, *ledgerTimers, *syncBuffer) {
	clock := &testClock{t: ledgerT0}
	logs := &syncBuffer{}
	l := newLedger(st, slog.New(slog.NewJSONHandler(logs, nil)), clock.now)
	timers := &ledgerTimers{}
	l.afterFunc = timers.afterFunc
	return l, clock, timers, logs
}

// readLedgerFile parses ledger.json in dir with the loader's parser.
func readLedgerFile(t *testing.T, dir string) map[string]ledgerEntry {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ledgerFile))
	if err != nil {
		t.Fatal(err)
	}
	subs, err := parseLedger(b)
	if err != nil {
		t.Fatal(err)
	}
	return subs
}

func TestLedgerRoundTrip(t *testing.T) {
	dir := t.TempDir()
	l, clock, _, _ := newTestLedger(state{dir: dir})
	ms := ledgerT0.UnixMilli()
	l.recordWindows(ledgerIDA, "claude-code", []planWindow{
		{ID: "anthropic:5h", Label: "5 hours", UsedFraction: 0.25, ResetsAtMs: ms + 3600_000, RecordedAtMs: ms, Source: "traffic"},
		{ID: "anthropic:7d", Label: "7 days", UsedFraction: 1.5, ResetsAtMs: ms + 86400_000, RecordedAtMs: ms, Source: "traffic"},
	})
	l.recordWindows(ledgerIDA, "claude-code", []planWindow{{ID: "anthropic:5h", Label: "5 hours", UsedFraction: 0.5, RecordedAtMs: ms, Source: "usage_report"}})
	l.recordUse(ledgerIDA, "claude-code", true, 10, 20)
	l.recordUse(ledgerIDA, "claude-code", false, -1, 0)
	l.block(ledgerIDA, "claude-code", 15*time.Minute, "429 from provider")
	l.activate(ledgerIDA, "claude-code", ms+7200_000, ms)
	l.recordCheck(ledgerIDA, "claude-code", false, false, "usage report answered 500")
	l.recordCheck(ledgerIDA, "claude-code", true, true, "pong")
	clock.set(ledgerT0.Add(time.Second))
	l.disown(ledgerIDB, "codex", "invalid_grant")
	l.flush(false)

	wantA := ledgerEntry{
		Provider: "claude-code",
		Windows: []planWindow{
			{ID: "anthropic:5h", Label: "5 hours", UsedFraction: 0.5, RecordedAtMs: ms, Source: "usage_report"},
			{ID: "anthropic:7d", Label: "7 days", UsedFraction: 1, ResetsAtMs: ms + 86400_000, RecordedAtMs: ms, Source: "traffic"},
		},
		Block:      ledgerBlock{UntilMs: ms + 900_000, Reason: "429 from provider", RecordedAtMs: ms},
		Credential: ledgerCredential{State: credActive, RecordedAtMs: ms, ExpiresAtMs: ms + 7200_000, RefreshedAtMs: ms},
		Measured:   ledgerMeasured{Requests: 2, Failures: 1, InputTokens: 10, OutputTokens: 20, LastUsedMs: ms},
		UsageRead:  ledgerCheck{AtMs: ms, OK: false, Detail: "usage report answered 500"},
		Probe:      ledgerCheck{AtMs: ms, OK: true, Detail: "pong"},
	}
	wantB := ledgerEntry{Provider: "codex", Credential: ledgerCredential{State: credNeedsReauth, Cause: "invalid_grant", RecordedAtMs: ms + 1000}}

	l2 := newLedger(state{dir: dir}, slog.New(slog.DiscardHandler), clock.now)
	if err := l2.unreadable; err != nil {
		t.Fatalf("unreadable = %v", err)
	}
	for _, c := range []struct {
		name string
		id   string
		want ledgerEntry
	}{
		{name: "windows, block, use, checks", id: ledgerIDA, want: wantA},
		{name: "credential only", id: ledgerIDB, want: wantB},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, lg := range []*ledger{l, l2} {
				got, ok := lg.entries[c.id]
				if !ok {
					t.Fatalf("entry %s missing", c.id)
				}
				if diff := cmp.Diff(c.want, got); diff != "" {
					t.Errorf("entry mismatch (-want +got):\n%s", diff)
				}
			}
		})
	}
	if got := l2.entry(ledgerIDB).Credential.State; got != credNeedsReauth {
		t.Errorf("credentialState = %q", got)
	}
	_, ok := l2.entries["sub_0000000000000000"]
	got := l2.entry("sub_0000000000000000")
	if ok || got.Credential.State != credActive || got.Windows != nil {
		t.Errorf("missing entry = %+v, %v; want active credential, not found", got, ok)
	}
	// entry is a copy: changing it does not change the ledger.
	got = l2.entry(ledgerIDA)
	got.Windows[0].UsedFraction = 0.99
	if again := l2.entry(ledgerIDA); again.Windows[0].UsedFraction != 0.5 {
		t.Error("entry shares memory with the ledger")
	}
	fi, err := os.Stat(filepath.Join(dir, ledgerFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("ledger.json mode %#o, want 0600", fi.Mode().Perm())
	}
}

func TestLedgerUnreadableIsNeverOverwritten(t *testing.T) {
	valid := `{"schema_version":1,"subscriptions":{"` + ledgerIDA + `":{"provider":"codex","windows":[],"block":{"until_ms":0,"reason":"","recorded_at_ms":0},"credential":{"state":"active","cause":"","recorded_at_ms":0,"expires_at_ms":0,"refreshed_at_ms":0},"measured":{"requests":0,"failures":0,"input_tokens":0,"output_tokens":0,"last_used_ms":0},"usage_read":{"at_ms":0,"ok":true,"detail":""},"probe":{"at_ms":0,"ok":true,"detail":"PLANTED-BYTES"}}}}`
	cases := []struct {
		name    string
		content string
		mode    os.FileMode
		want    string // in unreadable's text
	}{
		{name: "unknown top-level member", content: `{"schema_version":1,"subscriptions":{},"extra":"PLANTED-BYTES"}`, want: `unknown field "extra"`},
		{name: "unknown entry member", content: strings.Replace(valid, `"provider":"codex"`, `"provider":"codex","colour":"PLANTED-BYTES"`, 1), want: `unknown field "colour"`},
		{name: "duplicate key", content: strings.Replace(valid, `"provider":"codex"`, `"provider":"codex","provider":"PLANTED-BYTES"`, 1), want: `duplicate key "provider"`},
		{name: "wrong schema_version", content: strings.Replace(valid, `"schema_version":1`, `"schema_version":2`, 1), want: "schema_version 2 is not 1"},
		{name: "malformed subscription id", content: strings.Replace(valid, ledgerIDA, "sub_XYZ", 1), want: `"sub_XYZ" is not sub_<16 hex>`},
		{name: "id holding a verb", content: strings.Replace(valid, ledgerIDA, "sub_%d%w", 1), want: `member "sub_%d%w" is not`},
		{name: "state holding a verb", content: strings.Replace(valid, `"state":"active"`, `"state":"x%s"`, 1), want: `credential.state "x%s" is not`},
		{name: "stored disabled state", content: strings.Replace(valid, `"state":"active"`, `"state":"disabled"`, 1), want: "credential.state \"disabled\""},
		{name: "not JSON", content: "PLANTED-BYTES", want: "ledger"},
		{name: "trailing data", content: valid + `{}`, want: "data after the JSON document"},
		{name: "group-readable file", content: valid, mode: 0o644, want: "chmod 600"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			name := filepath.Join(dir, ledgerFile)
			mode := c.mode
			if mode == 0 {
				mode = 0o600
			}
			if err := os.WriteFile(name, []byte(c.content), mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(name, mode); err != nil { // umask may have narrowed it
				t.Fatal(err)
			}
			l, clock, timers, logs := newTestLedger(state{dir: dir})
			err := l.unreadable
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("unreadable = %v, want one containing %q", err, c.want)
			}
			if _, ok := l.entries[ledgerIDA]; ok {
				t.Error("an unreadable ledger is not served empty")
			}
			l.block(ledgerIDA, "codex", time.Minute, "429")
			l.recordUse(ledgerIDA, "codex", true, 1, 1)
			clock.set(ledgerT0.Add(100 * time.Millisecond))
			l.recordUse(ledgerIDA, "codex", true, 1, 1)
			if timers.count() != 0 {
				t.Error("a write-behind was armed for an unreadable ledger")
			}
			l.flush(false)
			if !l.blockedUntil(ledgerIDA).Equal(ledgerT0.Add(time.Minute)) {
				t.Error("mutations do not apply in memory")
			}
			if b, err := os.ReadFile(name); err != nil || string(b) != c.content {
				t.Errorf("ledger.json changed: %q, %v", b, err)
			}
			if tried := ledgerLogLines(t, logs, "ledger_write_failed"); len(tried) > 0 {
				t.Errorf("an unreadable ledger was written somewhere: %v", tried)
			}
			lines := ledgerLogLines(t, logs, "ledger_unreadable")
			if len(lines) != 1 || lines[0]["level"] != "ERROR" {
				t.Errorf("ledger_unreadable records = %v, want one at ERROR", lines)
			}
			if strings.Contains(logs.String(), "PLANTED-BYTES") {
				t.Errorf("the log quotes the file's bytes: %s", logs.String())
			}
		})
	}
}

func TestLedgerWriteCoalescing(t *testing.T) {
	dir := t.TempDir()
	l, clock, timers, _ := newTestLedger(state{dir: dir})
	use := func(l *ledger) { l.recordUse(ledgerIDA, "claude-code", true, 1, 1) }
	steps := []struct {
		name         string
		at           time.Duration // since ledgerT0
		do           func(l *ledger)
		fire         bool          // fire the newest write-behind instead of do
		wantRequests int64         // measured.requests in ledger.json afterwards
		wantBlocked  bool          // ledger.json holds the block
		wantTimers   int           // write-behinds armed so far
		wantDelay    time.Duration // the newest write-behind's delay
	}{
		{name: "first change writes at once", at: 0, do: use, wantRequests: 1},
		{name: "second within a second arms one write-behind", at: 300 * time.Millisecond, do: use, wantRequests: 1, wantTimers: 1, wantDelay: 700 * time.Millisecond},
		{name: "third joins the armed write-behind", at: 600 * time.Millisecond, do: use, wantRequests: 1, wantTimers: 1, wantDelay: 700 * time.Millisecond},
		{name: "the write-behind writes all three", at: time.Second, fire: true, wantRequests: 3, wantTimers: 1, wantDelay: 700 * time.Millisecond},
		{name: "a block writes at once", at: 1100 * time.Millisecond, do: func(l *ledger) {
			l.block(ledgerIDA, "claude-code", time.Hour, "429")
		}, wantRequests: 3, wantBlocked: true, wantTimers: 1, wantDelay: 700 * time.Millisecond},
		{name: "a use after the block waits", at: 1500 * time.Millisecond, do: use, wantRequests: 3, wantBlocked: true, wantTimers: 2, wantDelay: 600 * time.Millisecond},
		{name: "a credential change writes at once and takes the pending use along", at: 1600 * time.Millisecond, do: func(l *ledger) {
			l.disown(ledgerIDA, "claude-code", "")
		}, wantRequests: 4, wantBlocked: true, wantTimers: 2, wantDelay: 600 * time.Millisecond},
		{name: "the stopped write-behind firing late writes nothing new", at: 2100 * time.Millisecond, fire: true, wantRequests: 4, wantBlocked: true, wantTimers: 2, wantDelay: 600 * time.Millisecond},
		{name: "a second later a use writes at once", at: 2700 * time.Millisecond, do: use, wantRequests: 5, wantBlocked: true, wantTimers: 2, wantDelay: 600 * time.Millisecond},
		{name: "flush writes what waits", at: 2800 * time.Millisecond, do: func(l *ledger) {
			use(l)
			l.flush(false)
		}, wantRequests: 6, wantBlocked: true, wantTimers: 3, wantDelay: 900 * time.Millisecond},
	}
	for _, s := range steps {
		clock.set(ledgerT0.Add(s.at))
		if s.fire {
			timers.fireLast(t)
		} else {
			s.do(l)
		}
		got := readLedgerFile(t, dir)[ledgerIDA]
		if got.Measured.Requests != s.wantRequests || (got.Block.UntilMs != 0) != s.wantBlocked {
			t.Errorf("%s: file has requests %d, block %d; want %d, blocked %v", s.name, got.Measured.Requests, got.Block.UntilMs, s.wantRequests, s.wantBlocked)
		}
		if n := timers.count(); n != s.wantTimers {
			t.Errorf("%s: %d write-behinds armed, want %d", s.name, n, s.wantTimers)
		} else if n > 0 && timers.timers[n-1].d != s.wantDelay {
			t.Errorf("%s: write-behind delay %v, want %v", s.name, timers.timers[n-1].d, s.wantDelay)
		}
	}
	if n := timers.count(); n > 0 && !timers.timers[n-1].stopped {
		t.Error("flush left the write-behind armed")
	}
}

func TestLedgerUnplaced(t *testing.T) {
	l, _, timers, logs := newTestLedger(state{cause: errors.New("$HOME is not defined")})
	if lines := ledgerLogLines(t, logs, "ledger_unplaced"); len(lines) != 0 { // SPEC §2.1: at the first mutation
		t.Errorf("ledger_unplaced logged before any mutation: %v", lines)
	}
	l.recordUse(ledgerIDA, "codex", true, 1, 2)
	l.block(ledgerIDA, "codex", time.Minute, "429")
	l.disown(ledgerIDB, "codex", "401")
	l.recordCheck(ledgerIDA, "codex", false, true, "")
	l.flush(false)
	if err := l.unreadable; err != nil {
		t.Errorf("unreadable = %v; no state directory is not an unreadable file", err)
	}
	if timers.count() != 0 {
		t.Error("a write-behind was armed without a state directory")
	}
	if e := l.entry(ledgerIDA); e.Measured.Requests != 1 || l.entry(ledgerIDB).Credential.State != credNeedsReauth {
		t.Errorf("memory-only ledger lost changes: %+v", e)
	}
	lines := ledgerLogLines(t, logs, "ledger_unplaced")
	if len(lines) != 1 {
		t.Fatalf("%d ledger_unplaced records, want 1:\n%s", len(lines), logs.String())
	}
	if lines[0]["level"] != "WARN" || !strings.Contains(lines[0]["cause"].(string), "$HOME is not defined") {
		t.Errorf("ledger_unplaced = %v, want WARN with the cause", lines[0])
	}
}

func TestLedgerFullness(t *testing.T) {
	ms := ledgerT0.UnixMilli()
	cases := []struct {
		name    string
		windows []planWindow
		want    float64
	}{
		{name: "no reading", want: 0},
		{name: "highest current window", windows: []planWindow{{ID: "a", UsedFraction: 0.3, ResetsAtMs: ms + 1}, {ID: "b", UsedFraction: 0.7, ResetsAtMs: ms + 2}}, want: 0.7},
		{name: "a window whose reset passed counts 0", windows: []planWindow{{ID: "a", UsedFraction: 0.3, ResetsAtMs: ms + 1}, {ID: "b", UsedFraction: 0.9, ResetsAtMs: ms}}, want: 0.3},
		{name: "an unknown reset counts", windows: []planWindow{{ID: "a", UsedFraction: 0.4}}, want: 0.4},
		{name: "out-of-range readings are clamped", windows: []planWindow{{ID: "a", UsedFraction: 7}}, want: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, _, _, _ := newTestLedger(state{dir: t.TempDir()})
			if c.windows != nil {
				l.recordWindows(ledgerIDA, "codex", c.windows)
			}
			if got := l.freedom(ledgerIDA, ledgerT0); got[1] != c.want {
				t.Errorf("freedom = %v, want fullness %v", got, c.want)
			}
		})
	}
}

func TestLedgerNextDue(t *testing.T) {
	at := func(d time.Duration) int64 { return ledgerT0.Add(d).UnixMilli() }
	cases := []struct {
		name string
		set  func(l *ledger)
		want time.Duration // since ledgerT0; -1: nothing due
	}{
		{name: "empty ledger", set: func(*ledger) {}, want: -1},
		{name: "only past moments", set: func(l *ledger) {
			l.activate(ledgerIDA, "codex", at(-time.Hour), 0)
			l.recordWindows(ledgerIDA, "codex", []planWindow{{ID: "codex:primary", ResetsAtMs: at(0)}})
		}, want: -1},
		{name: "grant expiry is earliest", set: func(l *ledger) {
			l.activate(ledgerIDA, "codex", at(time.Minute), 0)
			l.recordWindows(ledgerIDB, "claude-code", []planWindow{{ID: "anthropic:5h", ResetsAtMs: at(time.Hour)}})
			l.block(ledgerIDB, "claude-code", 2*time.Minute, "429")
		}, want: time.Minute},
		{name: "window reset is earliest, past ones ignored", set: func(l *ledger) {
			l.activate(ledgerIDA, "codex", at(-time.Minute), 0)
			l.recordWindows(ledgerIDA, "codex", []planWindow{{ID: "codex:primary", ResetsAtMs: at(-time.Second)}, {ID: "codex:secondary", ResetsAtMs: at(30 * time.Second)}})
			l.block(ledgerIDB, "claude-code", 2*time.Minute, "429")
		}, want: 30 * time.Second},
		{name: "block end is earliest", set: func(l *ledger) {
			l.activate(ledgerIDA, "codex", at(time.Hour), 0)
			l.block(ledgerIDB, "claude-code", time.Second, "429")
		}, want: time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, _, _, _ := newTestLedger(state{dir: t.TempDir()})
			c.set(l)
			got := l.nextDue(ledgerT0, nil)
			ok := !got.IsZero()
			if c.want < 0 {
				if ok {
					t.Errorf("nextDue = %v, want nothing due", got)
				}
				return
			}
			if !ok || !got.Equal(ledgerT0.Add(c.want)) {
				t.Errorf("nextDue = %v, %v; want %v", got, ok, ledgerT0.Add(c.want))
			}
		})
	}
}

func TestLedgerBlock(t *testing.T) {
	cases := []struct {
		name      string
		until     time.Duration // the stated wait, at ledgerT0
		window    time.Duration // the reset of a used-up window, since ledgerT0 (0: none)
		then      time.Duration // a second block recorded at once (0: none)
		at        time.Duration // when blockedUntil is asked
		wantUntil time.Duration // -1: not blocked
	}{
		{name: "inside the block", until: 15 * time.Minute, at: time.Minute, wantUntil: 15 * time.Minute},
		{name: "block ended", until: 15 * time.Minute, at: 15 * time.Minute, wantUntil: -1},
		{name: "capped at 7 days", until: 30 * 24 * time.Hour, at: time.Hour, wantUntil: 7 * 24 * time.Hour},
		{name: "no stated wait blocks 15 minutes", until: -time.Minute, at: 0, wantUntil: 15 * time.Minute},
		{name: "no stated wait: until the used-up window resets", window: 3 * time.Hour, at: time.Hour, wantUntil: 3 * time.Hour},
		{name: "a stated wait wins over the used-up window", until: time.Minute, window: 3 * time.Hour, wantUntil: time.Minute},
		{name: "a later, shorter block keeps the longer", until: 2 * time.Hour, then: time.Minute, at: 2 * time.Minute, wantUntil: 2 * time.Hour},
		{name: "a later, longer block extends it", until: 15 * time.Minute, then: 2 * time.Hour, at: time.Minute, wantUntil: 2 * time.Hour},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, clock, _, _ := newTestLedger(state{dir: t.TempDir()})
			if c.window != 0 {
				reset := ledgerT0.Add(c.window).UnixMilli()
				l.recordWindows(ledgerIDA, "claude-code", []planWindow{{ID: "anthropic:5h", UsedFraction: 1, ResetsAtMs: reset}})
			}
			l.block(ledgerIDA, "claude-code", c.until, "429")
			if c.then != 0 {
				l.block(ledgerIDA, "claude-code", c.then, "429 again")
			}
			clock.set(ledgerT0.Add(c.at))
			got := l.blockedUntil(ledgerIDA)
			if c.wantUntil < 0 {
				if !got.IsZero() {
					t.Errorf("blockedUntil = %v, want zero", got)
				}
			} else if !got.Equal(ledgerT0.Add(c.wantUntil)) {
				t.Errorf("blockedUntil = %v, want %v", got, ledgerT0.Add(c.wantUntil))
			}
		})
	}
}

func TestLedgerSentences(t *testing.T) {
	const secret = "sk-ant-api03-PLANTEDsecret0123456789"
	long := strings.Repeat("é", 300) // 600 bytes
	cases := []struct {
		name  string
		cause string
		want  string
	}{
		{name: "sk-shaped secret redacted", cause: "provider said: bad key " + secret + " (401)", want: "provider said: bad key [redacted] (401)"},
		{name: "trimmed to 200 characters, not bytes (SPEC §10.3)", cause: long, want: strings.Repeat("é", 200)},
		{name: "one line", cause: "token endpoint said:\n  invalid_grant\t(400)", want: "token endpoint said: invalid_grant (400)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			l, _, _, _ := newTestLedger(state{dir: dir})
			l.disown(ledgerIDA, "claude-code", c.cause)
			l.block(ledgerIDA, "claude-code", time.Minute, c.cause)
			l.recordCheck(ledgerIDA, "claude-code", false, false, c.cause)
			l.recordCheck(ledgerIDA, "claude-code", true, false, c.cause)
			l.flush(false)
			e := readLedgerFile(t, dir)[ledgerIDA]
			got := []string{e.Credential.Cause, e.Block.Reason, e.UsageRead.Detail, e.Probe.Detail}
			if diff := cmp.Diff([]string{c.want, c.want, c.want, c.want}, got); diff != "" {
				t.Errorf("sentences mismatch (-want +got):\n%s", diff)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, ledgerFile)); bytes.Contains(b, []byte("PLANTED")) {
				t.Error("ledger.json holds the secret")
			}
		})
	}
}

func TestLedgerSubscribe(t *testing.T) {
	l, _, _, _ := newTestLedger(state{dir: t.TempDir()})
	ch := l.changed
	select {
	case <-ch:
		t.Fatal("signalled before any change")
	default:
	}
	l.recordUse(ledgerIDA, "codex", true, 1, 1)
	l.recordUse(ledgerIDA, "codex", true, 1, 1) // the buffer is full: must not block
	<-ch
	select {
	case <-ch:
		t.Fatal("two signals buffered; want one")
	default:
	}
	l.activate(ledgerIDA, "codex", 1, 0)
	<-ch
}

// TestLedgerConcurrent exercises every method at once under -race.
func TestLedgerConcurrent(t *testing.T) {
	dir := t.TempDir()
	l, clock, timers, _ := newTestLedger(state{dir: dir})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				clock.set(ledgerT0.Add(time.Duration(i*50+j) * 10 * time.Millisecond))
				l.recordUse(ledgerIDA, "codex", j%2 == 0, 1, 1)
				l.recordWindows(ledgerIDB, "codex", []planWindow{{ID: "codex:primary", UsedFraction: 0.1, ResetsAtMs: int64(j)}})
				if j%10 == 0 {
					l.block(ledgerIDB, "codex", time.Minute, "429")
				}
				(&inventory{l: l}).row(overlayItem{ID: ledgerIDA}, false, ledgerT0)
				l.freedom(ledgerIDB, ledgerT0)
				l.entry(ledgerIDB)
				l.nextDue(ledgerT0, nil)
				if timers.count() > 0 && j%7 == 0 {
					timers.fireLast(t)
				}
			}
		}()
	}
	wg.Wait()
	l.flush(false)
	if got := readLedgerFile(t, dir)[ledgerIDA].Measured.Requests; got != 400 {
		t.Errorf("file has %d requests after flush, want 400", got)
	}
}

func FuzzLedgerFile(f *testing.F) {
	f.Add([]byte(`{"schema_version":1,"subscriptions":{}}`))
	f.Add([]byte(`{"schema_version":1,"subscriptions":{"sub_0123456789abcdef":{"provider":"codex","windows":[{"id":"codex:primary","label":"5 hours","used_fraction":0.5,"resets_at_ms":1,"recorded_at_ms":2,"source":"traffic"}],"credential":{"state":"needs_reauthorization","cause":"x"}}}}`))
	f.Add([]byte(`{"schema_version":1,"subscriptions":{"sub_0123456789abcdef":{"provider":"a","provider":"b"}}}`))
	f.Add([]byte(`{"schema_version":2}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, data []byte) {
		subs, err := parseLedger(data)
		if err != nil {
			if subs != nil {
				t.Fatalf("refused with entries: %v", err)
			}
			return
		}
		b, err := marshalState(ledgerDoc{SchemaVersion: 1, Subscriptions: subs})
		if err != nil {
			t.Fatalf("accepted ledger does not encode: %v", err)
		}
		again, err := parseLedger(b)
		if err != nil {
			t.Fatalf("re-encoded ledger refused: %v\n%s", err, b)
		}
		if diff := cmp.Diff(subs, again); diff != "" {
			t.Fatalf("round trip changed the ledger (-first +second):\n%s", diff)
		}
	})
}

func TestLedgerUsageReportReplacesItsWindows(t *testing.T) {
	l, clock, _, _ := newTestLedger(state{dir: t.TempDir()})
	now := clock.now()
	report := func(ids ...string) []planWindow {
		var ws []planWindow
		for _, id := range ids {
			ws = append(ws, planWindow{ID: id, UsedFraction: 0.5, ResetsAtMs: now.Add(time.Hour).UnixMilli(), Source: windowSourceReport})
		}
		return ws
	}
	l.recordWindows(ledgerIDA, "kimi", []planWindow{{ID: "anthropic:5h", UsedFraction: 0.1, Source: windowSourceTraffic}})
	l.recordWindows(ledgerIDA, "kimi", report("kimi:usage", "kimi:limit-0"))
	l.recordWindows(ledgerIDA, "kimi", report("kimi:usage"))
	e := l.entry(ledgerIDA)
	var got []string
	for _, w := range e.Windows {
		got = append(got, w.ID)
	}
	if diff := cmp.Diff([]string{"anthropic:5h", "kimi:usage"}, got); diff != "" {
		t.Errorf("windows after a report that no longer names kimi:limit-0 (-want +got):\n%s", diff)
	}
}

func TestLedgerNextDueSkipsNeedsReauthorization(t *testing.T) {
	l, clock, _, _ := newTestLedger(state{dir: t.TempDir()})
	now := clock.now()
	l.activate(ledgerIDA, "kimi", now.Add(time.Hour).UnixMilli(), 0)
	l.activate(ledgerIDB, "kimi", now.Add(2*time.Hour).UnixMilli(), 0)
	l.disown(ledgerIDA, "kimi", "refused")
	if due := l.nextDue(now, nil); due.IsZero() || !due.Equal(now.Add(2*time.Hour).Truncate(time.Millisecond)) {
		t.Errorf("nextDue = %v, want the active grant's expiry (the one needing sign-in has nothing due)", due)
	}
}

func TestParsePlanWindows(t *testing.T) {
	now := ledgerT0
	ms := now.UnixMilli()
	cases := []struct {
		name     string
		provider string
		headers  map[string]string
		want     []planWindow
	}{
		{name: "claude-code 5h and 7d", provider: "claude-code", headers: map[string]string{
			"anthropic-ratelimit-unified-5h-utilization": "0.42",
			"anthropic-ratelimit-unified-5h-reset":       "1790000000",
			"anthropic-ratelimit-unified-7d-utilization": "0.1",
			"anthropic-ratelimit-unified-7d-reset":       "1790500000",
		}, want: []planWindow{
			{ID: "anthropic:5h", Label: "5 hours", UsedFraction: 0.42, ResetsAtMs: 1790000000000, RecordedAtMs: ms, Source: "traffic"},
			{ID: "anthropic:7d", Label: "7 days", UsedFraction: 0.1, ResetsAtMs: 1790500000000, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "claude-code clamps and ignores bad resets", provider: "claude-code", headers: map[string]string{
			"anthropic-ratelimit-unified-5h-utilization": "1.7",
			"anthropic-ratelimit-unified-5h-reset":       "-5",
			"anthropic-ratelimit-unified-7d-utilization": " -0.2 ",
			"anthropic-ratelimit-unified-7d-reset":       "soon",
		}, want: []planWindow{
			{ID: "anthropic:5h", Label: "5 hours", UsedFraction: 1, RecordedAtMs: ms, Source: "traffic"},
			{ID: "anthropic:7d", Label: "7 days", UsedFraction: 0, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "claude-code bad utilization skips the window", provider: "claude-code", headers: map[string]string{
			"anthropic-ratelimit-unified-5h-utilization": "NaN",
			"anthropic-ratelimit-unified-5h-reset":       "1790000000",
			"anthropic-ratelimit-unified-7d-utilization": "half",
			"anthropic-ratelimit-unified-7d-reset":       "1e400",
		}},
		{name: "claude-code infinite utilization skips the window", provider: "claude-code", headers: map[string]string{
			"anthropic-ratelimit-unified-5h-utilization": "Infinity",
			"anthropic-ratelimit-unified-5h-reset":       "1790000000",
			"anthropic-ratelimit-unified-7d-utilization": "-Inf",
		}},
		{name: "codex primary and secondary", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":          "25",
			"x-codex-primary-window-minutes":        "300",
			"x-codex-primary-reset-after-seconds":   "600",
			"x-codex-secondary-used-percent":        "80.5",
			"x-codex-secondary-window-minutes":      "10080",
			"x-codex-secondary-reset-after-seconds": "86400",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "5 hours", UsedFraction: 0.25, ResetsAtMs: ms + 600_000, RecordedAtMs: ms, Source: "traffic"},
			{ID: "codex:secondary", Label: "7 days", UsedFraction: 0.805, ResetsAtMs: ms + 86400_000, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex odd minutes, clamped percent, bad reset", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":          "250",
			"x-codex-primary-window-minutes":        "45",
			"x-codex-primary-reset-after-seconds":   "-1",
			"x-codex-secondary-used-percent":        "-3",
			"x-codex-secondary-window-minutes":      "1.5",
			"x-codex-secondary-reset-after-seconds": "Inf",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "45 minutes", UsedFraction: 1, RecordedAtMs: ms, Source: "traffic"},
			{ID: "codex:secondary", Label: "secondary window", UsedFraction: 0, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex reset-at (epoch seconds) without the countdown", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":     "7",
			"x-codex-primary-window-minutes":   "300",
			"x-codex-primary-reset-at":         "1790000000",
			"x-codex-secondary-used-percent":   "100",
			"x-codex-secondary-reset-at":       "1790500000",
			"x-codex-secondary-window-minutes": "10080",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "5 hours", UsedFraction: 0.07, ResetsAtMs: 1790000000000, RecordedAtMs: ms, Source: "traffic"},
			{ID: "codex:secondary", Label: "7 days", UsedFraction: 1, ResetsAtMs: 1790500000000, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex countdown wins over reset-at", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":        "7",
			"x-codex-primary-reset-at":            "1790000000",
			"x-codex-primary-reset-after-seconds": "600",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "primary window", UsedFraction: 0.07, ResetsAtMs: ms + 600_000, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex zero-length window states no reset", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":   "0",
			"x-codex-primary-window-minutes": "0",
			"x-codex-primary-reset-at":       "1790000000",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "primary window", UsedFraction: 0, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex one hour, missing secondary", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":   "0",
			"x-codex-primary-window-minutes": "60",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "1 hour", UsedFraction: 0, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex bad percent skips the window", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":        "25%",
			"x-codex-primary-reset-after-seconds": "60",
		}},
		{name: "other providers state none", provider: "anthropic", headers: map[string]string{
			"anthropic-ratelimit-unified-5h-utilization": "0.5",
			"x-codex-primary-used-percent":               "25",
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range c.headers {
				h.Set(k, v)
			}
			if diff := cmp.Diff(c.want, parsePlanWindows(c.provider, h, now)); diff != "" {
				t.Errorf("windows mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzPlanWindows(f *testing.F) {
	f.Add("0.42", "1790000000", "1.5", "-1", "25", "300", "600")
	f.Add("NaN", "1e400", "-0", "9e18", "Inf", "0x10", "-0.0001")
	f.Fuzz(func(t *testing.T, util5, reset5, util7, pct, mins, after, reset7 string) {
		now := ledgerT0
		h := http.Header{}
		h.Set("anthropic-ratelimit-unified-5h-utilization", util5)
		h.Set("anthropic-ratelimit-unified-5h-reset", reset5)
		h.Set("anthropic-ratelimit-unified-7d-utilization", util7)
		h.Set("anthropic-ratelimit-unified-7d-reset", reset7)
		for _, w := range []string{"primary", "secondary"} {
			h.Set("x-codex-"+w+"-used-percent", pct)
			h.Set("x-codex-"+w+"-window-minutes", mins)
			h.Set("x-codex-"+w+"-reset-after-seconds", after)
		}
		for _, p := range []string{"claude-code", "codex", "kimi"} {
			for _, w := range parsePlanWindows(p, h, now) {
				if !(w.UsedFraction >= 0 && w.UsedFraction <= 1) || math.IsNaN(w.UsedFraction) {
					t.Fatalf("%s %s: used_fraction %v outside [0,1]", p, w.ID, w.UsedFraction)
				}
				if w.ResetsAtMs < 0 {
					t.Fatalf("%s %s: negative reset %d", p, w.ID, w.ResetsAtMs)
				}
				if w.Label == "" || w.Source != "traffic" || w.RecordedAtMs != now.UnixMilli() {
					t.Fatalf("%s: malformed window %+v", p, w)
				}
			}
		}
	})
}

// TestRefusalHeadersUpdatePlanWindows proves SPEC §6.3's "every
// subscription answer's headers update the ledger" for a refusal too: the
// 429 that says the 7-day window is spent shows in the listing as a full
// window with its reset, not the earlier answer's reading.
func TestRefusalHeadersUpdatePlanWindows(t *testing.T) {
	reset := time.Now().Add(72 * time.Hour).Unix()
	var refuse atomic.Bool
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("anthropic-ratelimit-unified-7d-reset", strconv.FormatInt(reset, 10))
		if refuse.Load() {
			w.Header().Set("anthropic-ratelimit-unified-7d-utilization", "1.0")
			w.Header().Set("anthropic-ratelimit-unified-7d-status", "rejected")
			http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"weekly limit reached"}}`, http.StatusTooManyRequests)
			return
		}
		w.Header().Set("anthropic-ratelimit-unified-7d-utilization", "0.5")
		io.WriteString(w, protocolFixtures[1].buffered)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, "no refresh expected", http.StatusInternalServerError)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	id := donateGrant(t, d, "acc-one", "ref-one", time.Now().Add(time.Hour).UnixMilli())
	chat := chatBody(dialectMessages, "claude-code/claude-test", false, "")
	if status, _, b := d.call("POST", "/v1/messages", tok, chat); status != http.StatusOK {
		t.Fatalf("first call: %d %s", status, b)
	}
	refuse.Store(true)
	if status, _, b := d.call("POST", "/v1/messages", tok, chat); status != http.StatusTooManyRequests {
		t.Fatalf("second call: %d %s, want 429", status, b)
	}
	_, _, b := d.call("GET", "/v1/admin/subscriptions/a1", d.token, "")
	var body struct {
		Subscriptions []struct {
			ID      string       `json:"id"`
			Windows []planWindow `json:"windows"`
		} `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &body); err != nil || len(body.Subscriptions) != 1 || body.Subscriptions[0].ID != id {
		t.Fatalf("listing: %v %s", err, b)
	}
	ws := body.Subscriptions[0].Windows
	if len(ws) != 1 || ws[0].ID != "anthropic:7d" || ws[0].UsedFraction != 1 || ws[0].ResetsAtMs != reset*1000 {
		t.Errorf("windows after the 429 = %+v, want anthropic:7d full, resetting at %d", ws, reset*1000)
	}
}

// TestBlockKeepsTheStatedResetWhenRetryAfterHasPassed: a Retry-After date
// already past on Brama's clock (the provider's clock is behind) states no
// wait, so the block ends at the reset the plan-window headers state (SPEC
// §7.2.4), not 15 minutes from now, which would spend a refused call every
// 15 minutes until the weekly window resets.
func TestBlockKeepsTheStatedResetWhenRetryAfterHasPassed(t *testing.T) {
	reset := time.Now().Add(72 * time.Hour).Unix()
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Retry-After", time.Now().Add(-30*time.Second).UTC().Format(http.TimeFormat))
		w.Header().Set("anthropic-ratelimit-unified-7d-utilization", "1.0")
		w.Header().Set("anthropic-ratelimit-unified-7d-reset", strconv.FormatInt(reset, 10))
		w.Header().Set("anthropic-ratelimit-unified-7d-status", "rejected")
		http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"weekly limit reached"}}`, http.StatusTooManyRequests)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, "no refresh expected", http.StatusInternalServerError)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	donateGrant(t, d, "acc-one", "ref-one", time.Now().Add(time.Hour).UnixMilli())
	if status, _, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, "")); status != http.StatusTooManyRequests {
		t.Fatalf("call: %d %s, want 429", status, b)
	}
	_, _, b := d.call("GET", "/v1/admin/subscriptions/a1", d.token, "")
	var body struct {
		Subscriptions []struct {
			Block *ledgerBlock `json:"block"`
		} `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &body); err != nil || len(body.Subscriptions) != 1 || body.Subscriptions[0].Block == nil {
		t.Fatalf("listing: %v %s", err, b)
	}
	if got := body.Subscriptions[0].Block.UntilMs; got < reset*1000 || got >= (reset+1)*1000 { // the reset's second
		t.Errorf("block until %s, want the stated weekly reset %s", time.UnixMilli(got).UTC(), time.Unix(reset, 0).UTC())
	}
}

// TestBareRefusalBlocksUntilTheUsedUpWindowResets: a 429 stating no reset
// blocks until the reset of a window the ledger holds as used up (SPEC
// §7.2.4: "retry-after, reset headers, or the window reset"), not 15 min
// (a call refused every 15 min for hours); a window not used up says nothing.
func TestBareRefusalBlocksUntilTheUsedUpWindowResets(t *testing.T) {
	for _, tc := range []struct {
		name     string
		used     string
		wantHour bool
	}{
		{"a used-up 5h window", "1.0", true},
		{"a window half used", "0.5", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reset := time.Now().Add(3 * time.Hour).Unix()
			var calls atomic.Int64
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if calls.Add(1) == 1 { // an answer whose headers state the window
					w.Header().Set("anthropic-ratelimit-unified-5h-utilization", tc.used)
					w.Header().Set("anthropic-ratelimit-unified-5h-reset", strconv.FormatInt(reset, 10))
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, protocolFixtures[1].buffered)
					return
				}
				http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, http.StatusTooManyRequests)
			})
			tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				http.Error(w, "no refresh expected", http.StatusInternalServerError)
			})
			d, tok := oauthSetup(t, provider, tokenEndpoint)
			donateGrant(t, d, "acc-one", "ref-one", time.Now().Add(time.Hour).UnixMilli())
			if status, _, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, "")); status != 200 {
				t.Fatalf("first call: %d %s", status, b)
			}
			status, h, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
			wait, _ := strconv.Atoi(h.Get("Retry-After"))
			if status != http.StatusTooManyRequests {
				t.Fatalf("second call: %d %s, want 429", status, b)
			}
			if hours := wait > 2*3600; hours != tc.wantHour || !tc.wantHour && wait > 900 {
				t.Errorf("Retry-After %d s, want the window's reset (%v) or at most 15 min", wait, tc.wantHour)
			}
		})
	}
}

// TestLedgerWithoutSubscriptions: a ledger.json stating no subscriptions (the
// member absent or null) is an empty ledger that takes mutations, not a nil
// map that panics at the first one.
func TestLedgerWithoutSubscriptions(t *testing.T) {
	for _, content := range []string{`{"schema_version":1}`, `{"schema_version":1,"subscriptions":null}`} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ledgerFile), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		l, _, _, _ := newTestLedger(state{dir: dir})
		if l.unreadable != nil {
			t.Fatalf("%s: unreadable = %v", content, l.unreadable)
		}
		l.recordUse(ledgerIDA, "codex", true, 1, 1)
		if got := readLedgerFile(t, dir)[ledgerIDA].Measured.Requests; got != 1 {
			t.Errorf("%s: requests = %d after one use, want 1", content, got)
		}
	}
}

// TestRefusalStatingItsUsedUpWindowBlocksUntilItResets: a 429 whose own headers state a plan window used up (claude-code's
// utilization, codex's used percent) and no Retry-After blocks until that window resets, not 15 min (SPEC §6.3, §7.2.4).
func TestRefusalStatingItsUsedUpWindowBlocksUntilItResets(t *testing.T) {
	reset := time.Now().Add(3 * time.Hour)
	for _, tc := range []struct {
		name     string
		headers  map[string]string
		wantHour bool
	}{
		{"claude-code 5h window used up", map[string]string{"anthropic-ratelimit-unified-5h-utilization": "1.0",
			"anthropic-ratelimit-unified-5h-reset":       strconv.FormatInt(reset.Unix(), 10),
			"anthropic-ratelimit-unified-7d-utilization": "0.4"}, true},
		{"claude-code window half used", map[string]string{"anthropic-ratelimit-unified-5h-utilization": "0.5",
			"anthropic-ratelimit-unified-5h-reset": strconv.FormatInt(reset.Unix(), 10)}, false},
		{"codex primary window used up", map[string]string{"x-codex-primary-used-percent": "100",
			"x-codex-primary-reset-after-seconds": "10800", "x-codex-secondary-used-percent": "40",
			"x-codex-secondary-reset-after-seconds": "90000"}, true},
		{"codex both windows used up: the later reset", map[string]string{"x-codex-primary-used-percent": "100",
			"x-codex-primary-reset-after-seconds": "60", "x-codex-secondary-used-percent": "100.0",
			"x-codex-secondary-reset-after-seconds": "10800"}, true},
		{"codex used-up window stating only reset-at", map[string]string{"x-codex-primary-used-percent": "100",
			"x-codex-primary-reset-at": strconv.FormatInt(reset.Unix(), 10)}, true},
		{"codex windows partly used", map[string]string{"x-codex-primary-used-percent": "60",
			"x-codex-primary-reset-after-seconds": "10800"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				for k, v := range tc.headers {
					w.Header().Set(k, v)
				}
				http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, http.StatusTooManyRequests)
			})
			d, tok := (*daemon)(nil), ""
			path, body := "/v1/messages", chatBody(dialectMessages, "claude-code/claude-test", false, "")
			if strings.HasPrefix(tc.name, "codex") {
				d, tok, _ = codexDaemon(t, provider.URL)
				path, body = "/v1/chat/completions", chatBody(dialectChat, "codex/gpt-5", false, "")
			} else {
				d, tok = oauthSetup(t, provider, provider)
				donateGrant(t, d, "acc-one", "ref-one", time.Now().Add(time.Hour).UnixMilli())
			}
			status, h, b := d.call("POST", path, tok, body)
			wait, _ := strconv.Atoi(h.Get("Retry-After"))
			if status != http.StatusTooManyRequests {
				t.Fatalf("call: %d %s, want 429", status, b)
			}
			if hours := wait > 2*3600; hours != tc.wantHour || !tc.wantHour && wait > 900 {
				t.Errorf("Retry-After %d s, want the window's reset (%v) or at most 15 min", wait, tc.wantHour)
			}
		})
	}
}

// TestUsageReportIsAWholeReading: a usage report replaces the report's windows, dropping one it no longer names; a
// traffic reading names only its own and drops none, nor does a reading of no window (SPEC §6.3, §11.2).
func TestUsageReportIsAWholeReading(t *testing.T) {
	l, _, _, _ := newTestLedger(state{dir: t.TempDir()})
	report := func(ids ...string) (ws []planWindow) {
		for _, id := range ids {
			ws = append(ws, planWindow{ID: id, UsedFraction: 0.5, Source: windowSourceReport})
		}
		return ws
	}
	ids := func() (out []string) {
		for _, w := range l.entry(ledgerIDA).Windows {
			out = append(out, w.ID)
		}
		return out
	}
	l.recordWindows(ledgerIDA, "kimi", report("kimi:usage", "kimi:limit-0"))
	l.recordWindows(ledgerIDA, "kimi", []planWindow{{ID: "kimi:usage", UsedFraction: 0.7, Source: windowSourceTraffic}})
	if got := ids(); !slices.Equal(got, []string{"kimi:usage", "kimi:limit-0"}) {
		t.Errorf("after a traffic reading of one window: %v, want both kept", got)
	}
	l.recordWindows(ledgerIDA, "kimi", report("kimi:usage"))
	if got := ids(); !slices.Equal(got, []string{"kimi:usage"}) {
		t.Errorf("after a report naming one window: %v, want the other dropped", got)
	}
	l.recordWindows(ledgerIDA, "kimi", report()) // no reading at all: nothing to replace
	if got := ids(); !slices.Equal(got, []string{"kimi:usage"}) {
		t.Errorf("after an empty reading: %v, want the window kept", got)
	}
}
