package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// readPerfFile decodes perf.json from dir; ok=false when it does not exist.
func readPerfFile(t *testing.T, dir string) (perfDocument, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "perf.json"))
	if errors.Is(err, os.ErrNotExist) {
		return perfDocument{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var doc perfDocument
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("perf.json: %v", err)
	}
	return doc, true
}

func TestPerfRecord(t *testing.T) {
	clock := newCatalogClock()
	p := newPerfRegistry(state{cause: errors.New("no home")}, testSys(t, clock.now))
	p.record("anthropic/claude-sonnet-4-5", true, 2*time.Second, 100)
	p.record("anthropic/claude-sonnet-4-5", false, 500*time.Millisecond, 0)
	p.record("openai/gpt-5", true, 250*time.Millisecond, 50)
	p.record("openai/gpt-5", true, 0, 10)          // unmeasurable speed keeps the last one
	p.record("openai/gpt-5", true, time.Second, 0) // so does an answer of no tokens
	want := map[string]perfEntry{
		"anthropic/claude-sonnet-4-5": {Count: 2, Failures: 1, TotalLatencyMs: 2500, LastLatencyMs: 500, OutputTokens: 100, LastTokensPerS: 50},
		"openai/gpt-5":                {Count: 3, TotalLatencyMs: 1250, LastLatencyMs: 1000, OutputTokens: 60, LastTokensPerS: 200},
	}
	if diff := cmp.Diff(want, p.snapshot()); diff != "" {
		t.Errorf("snapshot mismatch (-want +got):\n%s", diff)
	}
	snap := p.snapshot()
	snap["openai/gpt-5"] = perfEntry{}
	if p.snapshot()["openai/gpt-5"].Count != 3 {
		t.Error("snapshot shares memory with the registry")
	}
}

func TestPerfFlushEvery30s(t *testing.T) {
	dir := t.TempDir()
	clock := newCatalogClock()
	t0 := clock.now()
	p := newPerfRegistry(state{dir: dir}, testSys(t, clock.now))
	if _, ok := readPerfFile(t, dir); ok {
		t.Fatal("perf.json written before any record")
	}
	steps := []struct {
		name      string
		at        time.Duration // since t0
		wantCount int64         // count for route r in perf.json after the record
		wantAt    time.Duration // flushed_at in perf.json
	}{
		{name: "first record flushes", at: 0, wantCount: 1, wantAt: 0},
		{name: "10 s later: no flush", at: 10 * time.Second, wantCount: 1, wantAt: 0},
		{name: "29 s later: no flush", at: 29 * time.Second, wantCount: 1, wantAt: 0},
		{name: "31 s later: flush", at: 31 * time.Second, wantCount: 4, wantAt: 31 * time.Second},
		{name: "40 s later: no flush", at: 40 * time.Second, wantCount: 4, wantAt: 31 * time.Second},
		{name: "61 s later: flush", at: 61 * time.Second, wantCount: 6, wantAt: 61 * time.Second},
	}
	for _, s := range steps {
		clock.advance(t0.Add(s.at).Sub(clock.now()))
		p.record("r", true, time.Millisecond, 1)
		doc, ok := readPerfFile(t, dir)
		if !ok {
			t.Fatalf("%s: no perf.json", s.name)
		}
		if doc.Routes["r"].Count != s.wantCount || !doc.FlushedAt.Equal(t0.Add(s.wantAt)) {
			t.Errorf("%s: perf.json count %d at %v, want %d at %v", s.name, doc.Routes["r"].Count, doc.FlushedAt, s.wantCount, t0.Add(s.wantAt))
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "perf.json"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("perf.json mode %#o, want 0600", fi.Mode().Perm())
	}

	// flush writes at once, whatever the last flush time.
	clock.advance(time.Second)
	p.flush(false)
	if doc, _ := readPerfFile(t, dir); doc.Routes["r"].Count != 6 || !doc.FlushedAt.Equal(t0.Add(62*time.Second)) {
		t.Errorf("after flush: %+v", doc)
	}

	// A change within 30 s of the last write is written by one write-behind.
	timers := &ledgerTimers{}
	p.afterFunc = timers.afterFunc
	clock.advance(time.Second)
	p.record("r", true, time.Millisecond, 1)
	if doc, _ := readPerfFile(t, dir); doc.Routes["r"].Count != 6 || timers.count() != 1 || timers.timers[0].d != 29*time.Second {
		t.Errorf("a record 1 s after a flush: perf.json count %d, %d write-behinds; want 6 and one in 29 s", doc.Routes["r"].Count, timers.count())
	}
	timers.fireLast(t)
	if doc, _ := readPerfFile(t, dir); doc.Routes["r"].Count != 7 {
		t.Errorf("after the write-behind: perf.json count %d, want 7", doc.Routes["r"].Count)
	}

	// A new registry starts from the file.
	again := newPerfRegistry(state{dir: dir}, testSys(t, clock.now))
	if diff := cmp.Diff(p.snapshot(), again.snapshot()); diff != "" {
		t.Errorf("reloaded registry differs (-before +after):\n%s", diff)
	}
}

func TestPerfLoad(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		mode      os.FileMode
		wantCount int64
		wantLog   bool
	}{
		{name: "good", body: `{"schema_version":1,"routes":{"r":{"count":7}}}`, mode: 0o600, wantCount: 7},
		{name: "not JSON", body: `{"schema`, mode: 0o600, wantLog: true},
		{name: "wrong schema", body: `{"schema_version":2,"routes":{"r":{"count":7}}}`, mode: 0o600, wantLog: true},
		{name: "unknown member (decodeStrict)", body: `{"schema_version":1,"routes":{"r":{"count":7,"extra":1}}}`, mode: 0o600, wantLog: true},
		{name: "group readable", body: `{"schema_version":1,"routes":{"r":{"count":7}}}`, mode: 0o640, wantLog: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			name := filepath.Join(dir, "perf.json")
			if err := os.WriteFile(name, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(name, tt.mode); err != nil {
				t.Fatal(err)
			}
			var logs catalogLogs
			p := newPerfRegistry(state{dir: dir}, sys{log: logs.logger(), now: time.Now})
			if got := p.snapshot()["r"].Count; got != tt.wantCount {
				t.Errorf("count %d, want %d", got, tt.wantCount)
			}
			if got := len(logs.lines(t, "perf_stats_unreadable")) == 1; got != tt.wantLog {
				t.Errorf("perf_stats_unreadable logged = %v, want %v", got, tt.wantLog)
			}
		})
	}
}

func TestPerfNoStateDir(t *testing.T) {
	var logs catalogLogs
	p := newPerfRegistry(state{cause: errors.New("$HOME is not defined")}, sys{log: logs.logger(), now: newCatalogClock().now})
	for range 3 {
		p.record("openai/gpt-5", true, time.Second, 3)
	}
	lines := logs.lines(t, "perf_stats_unplaced")
	if len(lines) != 1 {
		t.Fatalf("%d perf_stats_unplaced lines, want 1", len(lines))
	}
	if cause, _ := lines[0]["cause"].(string); !strings.Contains(cause, "$HOME is not defined") {
		t.Errorf("cause %q does not name the home cause", cause)
	}
	if lines[0]["level"] != "WARN" {
		t.Errorf("level %v, want WARN", lines[0]["level"])
	}
	if got := p.snapshot()["openai/gpt-5"].Count; got != 3 {
		t.Errorf("count %d, want 3 kept in memory", got)
	}
	p.flush(false)
}

// promSample is one exposition line: name{labels} value.
var promSample = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$`)

// scrape reads d's GET /metrics (SPEC §13) as sample → value, a sample
// named as written (`name` or `name{route="…"}`).
func (d *daemon) scrape(t testing.TB) map[string]float64 {
	t.Helper()
	status, _, body := d.call("GET", "/metrics", d.token, "")
	if status != 200 {
		t.Fatalf("GET /metrics: %d %s", status, body)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		if m := promSample.FindStringSubmatch(line); m != nil {
			out[m[1]+m[2]], _ = strconv.ParseFloat(m[4], 64)
		}
	}
	return out
}

// parsePromLabels reads `k="v",…` with the exposition format's escapes.
func parsePromLabels(t *testing.T, s string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for s != "" {
		eq := strings.Index(s, `="`)
		if eq < 0 {
			t.Fatalf("label %q has no value", s)
		}
		key := s[:eq]
		s = s[eq+2:]
		var v strings.Builder
		i := 0
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' {
				i++
				if i == len(s) {
					t.Fatal("dangling escape")
				}
				switch s[i] {
				case '\\', '"':
					v.WriteByte(s[i])
				case 'n':
					v.WriteByte('\n')
				default:
					t.Fatalf("bad escape \\%c", s[i])
				}
				continue
			}
			v.WriteByte(s[i])
		}
		if i == len(s) {
			t.Fatalf("unterminated label value in %q", s)
		}
		out[key] = v.String()
		s = strings.TrimPrefix(s[i+1:], ",")
	}
	return out
}

func TestWriteMetrics(t *testing.T) {
	weird := "odd/\"quoted\" \\path\nline"
	perf := map[string]perfEntry{
		"openai/gpt-5":                {Count: 3, Failures: 1, TotalLatencyMs: 1234567, LastLatencyMs: 10, OutputTokens: 99, LastTokensPerS: 12.5},
		"anthropic/claude-sonnet-4-5": {Count: 1},
		weird:                         {Count: 2, LastTokensPerS: math.Inf(1)},
	}
	extra := map[string]float64{"brama_attempts_total": 7, "brama_journal_bytes": 4096, "bad name": 1, "brama_route_requests_total": 424242, "brama_huge": 1e20}
	var b strings.Builder
	writeMetrics(&b, perf, extra)
	out := b.String()

	var again strings.Builder
	writeMetrics(&again, perf, extra)
	if again.String() != out {
		t.Error("writeMetrics is not deterministic")
	}

	values := map[string]map[string]string{} // metric → route → value
	types := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "# TYPE ") {
			f := strings.Fields(line)
			types[f[2]] = f[3]
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		m := promSample.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("line %q is not `name{labels} value`", line)
		}
		if _, err := strconv.ParseFloat(m[4], 64); err != nil {
			t.Errorf("line %q: value: %v", line, err)
		}
		if types[m[1]] == "" {
			t.Errorf("sample %s before its # TYPE line", m[1])
		}
		if values[m[1]] == nil {
			values[m[1]] = map[string]string{}
		}
		values[m[1]][parsePromLabels(t, m[3])["route"]] = m[4]
	}
	checks := []struct {
		name, metric, route, want string
	}{
		{"count", "brama_route_requests_total", "openai/gpt-5", "3"},
		{"failures", "brama_route_failures_total", "openai/gpt-5", "1"},
		{"latency as an integer", "brama_route_latency_milliseconds_total", "openai/gpt-5", "1234567"},
		{"tokens per second", "brama_route_last_tokens_per_second", "openai/gpt-5", "12.5"},
		{"escaped route round-trips", "brama_route_requests_total", weird, "2"},
		{"infinity", "brama_route_last_tokens_per_second", weird, "+Inf"},
		{"extra counter", "brama_attempts_total", "", "7"},
		{"extra gauge", "brama_journal_bytes", "", "4096"},
		{"a whole number past 1e15 as %g", "brama_huge", "", "1e+20"},
	}
	for _, c := range checks {
		if got := values[c.metric][c.route]; got != c.want {
			t.Errorf("%s: %s{route=%q} = %q, want %q", c.name, c.metric, c.route, got, c.want)
		}
	}
	if types["brama_attempts_total"] != "counter" || types["brama_journal_bytes"] != "gauge" {
		t.Errorf("extra types = %v", types)
	}
	if strings.Contains(out, "bad name") || strings.Contains(out, "424242") {
		t.Error("an invalid or colliding extra metric was written")
	}
	if !strings.Contains(out, `route="odd/\"quoted\" \\path\nline"`) {
		t.Errorf("route label not escaped as the format requires:\n%s", out)
	}
	if i, j := strings.Index(out, "anthropic/"), strings.Index(out, "openai/"); i < 0 || i > j {
		t.Error("routes are not sorted")
	}
}

// TestPersistedUnencodableKeepsFile: a snapshot that cannot be encoded is logged and never replaces the file on disk.
func TestPersistedUnencodableKeepsFile(t *testing.T) {
	dir := t.TempDir()
	clock := newCatalogClock()
	p := newPerfRegistry(state{dir: dir}, testSys(t, clock.now))
	p.record("r", true, time.Millisecond, 1)
	before, err := os.ReadFile(filepath.Join(dir, "perf.json"))
	if err != nil {
		t.Fatal(err)
	}
	p.doc = func(map[string]perfEntry, time.Time) any { return math.NaN() }
	p.record("r", true, time.Millisecond, 1)
	p.flush(false)
	after, err := os.ReadFile(filepath.Join(dir, "perf.json"))
	if err != nil || string(after) != string(before) {
		t.Errorf("perf.json after an unencodable snapshot = %q, %v; want it unchanged: %q", after, err, before)
	}
}
