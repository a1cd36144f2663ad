package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func newCatalogClock() *testClock {
	return &testClock{t: time.Date(2025, 10, 1, 12, 0, 0, 0, time.UTC)}
}

// catalogLogs captures slog JSON lines from any goroutine.
type catalogLogs struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (l *catalogLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines returns the captured records whose msg is msg.
func (l *catalogLogs) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

func (l *catalogLogs) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func catalogFixture(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "catalog", "api.json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// quietLog is a logger for tests that do not look at the log.
func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func catalogEnv(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// catalogServer is a fake catalogue URL. Each request reports its number on
// arrived; requests numbered in block wait for release (or the client to
// go away) before answering status with the fixture.
type catalogServer struct {
	srv     *httptest.Server
	count   atomic.Int64
	arrived chan int64
	release chan struct{}
}

func newCatalogServer(t *testing.T, body []byte, status func(n int64) int, block func(n int64) bool) *catalogServer {
	t.Helper()
	cs := &catalogServer{arrived: make(chan int64, 100), release: make(chan struct{})}
	cs.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := cs.count.Add(1)
		cs.arrived <- n
		if block != nil && block(n) {
			select {
			case <-cs.release:
			case <-r.Context().Done():
				return
			}
		}
		code := http.StatusOK
		if status != nil {
			code = status(n)
		}
		w.WriteHeader(code)
		if code == http.StatusOK {
			w.Write(body)
		} else {
			io.WriteString(w, `{"error":"secret-upstream-detail"}`)
		}
	}))
	t.Cleanup(cs.srv.Close)
	return cs
}

// startCatalog starts c's background reads and returns wait, which waits for
// the reads in flight (the WaitGroup start holds counts exactly those), and
// stop, which cancels and waits.
func startCatalog(t *testing.T, c *catalog) (wait, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c.start(ctx, &wg)
	stop = func() {
		cancel()
		wg.Wait()
	}
	t.Cleanup(stop)
	return wg.Wait, stop
}

// reads counts the source reads the catalogue logged as settled, good or failed.
func (l *catalogLogs) reads(t *testing.T) int {
	return len(l.lines(t, "model_catalog_read")) + len(l.lines(t, "model_catalog_read_failed"))
}

func (c *catalog) testRefreshing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refreshing
}

func TestCatalogVendor(t *testing.T) {
	tests := []struct {
		name, provider, want string
	}{
		{"claude-code", "claude-code", "anthropic"},
		{"codex", "codex", "openai"},
		{"openai-responses", "openai-responses", "openai"},
		{"kimi", "kimi", "moonshotai"},
		{"local-openai", "local-openai", ""},
		{"anthropic", "anthropic", "anthropic"},
		{"groq", "groq", "groq"},
		{"together", "together", "togetherai"}, // models.dev's keys
		{"fireworks", "fireworks", "fireworks-ai"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if p, _ := lookupProvider(tt.provider); p.vendor != tt.want {
				t.Errorf("vendor of %q = %q, want %q", tt.provider, p.vendor, tt.want)
			}
		})
	}
	for _, p := range providerTable {
		if p.id != "local-openai" && p.vendor == "" {
			t.Errorf("provider %s has no catalogue vendor", p.id)
		}
	}
}

// TestParseCatalogNamesOneBrokenVendor: of several vendors that are not objects, the refusal names the first in
// sorted order every time, not one picked by map order (a warning that changes between restarts misleads).
func TestParseCatalogNamesOneBrokenVendor(t *testing.T) {
	for range 20 {
		if _, err := parseCatalog([]byte(`{"b":1,"a":2,"c":3}`), nil); err == nil || !strings.Contains(err.Error(), `provider "a"`) {
			t.Fatalf("parseCatalog error = %v, want it to name provider \"a\"", err)
		}
	}
}

func TestParseCatalog(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    catalogData
		wantErr bool
	}{
		{name: "empty object", in: `{}`, want: catalogData{}},
		{name: "null", in: `null`, wantErr: true},
		{name: "array", in: `[]`, wantErr: true},
		{name: "not JSON", in: `{"a":`, wantErr: true},
		{name: "provider not an object", in: `{"a":[1]}`, wantErr: true},
		{name: "provider null", in: `{"a":null}`, wantErr: true},
		{name: "no models", in: `{"a":{"id":"a"}}`, want: catalogData{"a": {map[string]modelInfo{}}}},
		{name: "a vendor named empty is left out (a provider without a vendor lists none)", in: `{"":{"models":{"m":{}}}}`, want: catalogData{}},
		{name: "models not an object", in: `{"a":{"models":[1,2]}}`, want: catalogData{"a": {map[string]modelInfo{}}}},
		{name: "a model named empty is left out", in: `{"a":{"models":{"":{"limit":{"output":5}},"m":{}}}}`,
			want: catalogData{"a": {map[string]modelInfo{"m": {ID: "m"}}}}},
		{
			name: "all fields, unknown ones ignored",
			in:   `{"a":{"id":"a","extra":{"x":1},"models":{"m":{"id":"other","cost":{"input":1},"release_date":"2025-01-02","limit":{"context":1000,"output":100,"input":5},"modalities":{"input":["text","image"],"output":["text"]}}}}}`,
			want: catalogData{"a": {map[string]modelInfo{"m": {
				ID: "m", ReleaseDate: "2025-01-02", Limit: catalogLimit{Context: 1000, Output: 100},
				Modalities: catalogModalities{Input: []string{"text", "image"}, Output: []string{"text"}},
			}}}},
		},
		{
			name: "wrong types are left out",
			in:   `{"a":{"models":{"m":{"release_date":20250102,"limit":{"context":"big","output":1.5},"modalities":{"input":"text","output":["text",3]}},"n":"x","o":null}}}`,
			want: catalogData{"a": {map[string]modelInfo{"m": {ID: "m", Modalities: catalogModalities{Output: []string{"text"}}}}}},
		},
		{
			name: "bad dates and limits",
			in:   `{"a":{"models":{"m":{"release_date":"soon","limit":{"context":-5,"output":1e300}},"n":{"release_date":"2025-06","limit":{"output":4096.0}}}}}`,
			want: catalogData{"a": {map[string]modelInfo{"m": {ID: "m"}, "n": {ID: "n", ReleaseDate: "2025-06", Limit: catalogLimit{Output: 4096}}}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseCatalog([]byte(tt.in), nil)
			if tt.wantErr {
				if !errors.Is(err, errCatalogShape) {
					t.Fatalf("parseCatalog error = %v, want errCatalogShape", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parseCatalog mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseCatalogFixture(t *testing.T) {
	got, err := parseCatalog(catalogFixture(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := modelInfo{ID: "claude-sonnet-4-5", ReleaseDate: "2025-09-29", Limit: catalogLimit{Output: 64000, Context: 200000},
		Modalities: catalogModalities{Input: []string{"text", "image", "pdf"}, Output: []string{"text"}}}
	if diff := cmp.Diff(want, got["anthropic"].Models["claude-sonnet-4-5"]); diff != "" {
		t.Errorf("claude-sonnet-4-5 mismatch (-want +got):\n%s", diff)
	}
	again, err := parseCatalog(mustMarshal(t, got), nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, again); diff != "" {
		t.Errorf("re-encoded catalogue differs (-first +second):\n%s", diff)
	}
}

func TestNewCatalogEnv(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		wantPath string
		wantURL  string
		wantTTL  time.Duration
	}{
		{name: "defaults", env: nil, wantURL: defaultCatalogURL, wantTTL: 900 * time.Second},
		{name: "path wins", env: map[string]string{"BRAMA_MODEL_CATALOG_PATH": " /x/api.json ", "BRAMA_MODEL_CATALOG_URL": "http://h/"}, wantPath: "/x/api.json", wantTTL: 900 * time.Second},
		{name: "url", env: map[string]string{"BRAMA_MODEL_CATALOG_URL": "http://h/api.json"}, wantURL: "http://h/api.json", wantTTL: 900 * time.Second},
		{name: "off", env: map[string]string{"BRAMA_MODEL_CATALOG_URL": "off"}, wantTTL: 900 * time.Second},
		{name: "ttl", env: map[string]string{"BRAMA_MODEL_CATALOG_TTL_SECS": "60"}, wantURL: defaultCatalogURL, wantTTL: time.Minute},
		{name: "bad ttl", env: map[string]string{"BRAMA_MODEL_CATALOG_TTL_SECS": "-1"}, wantURL: defaultCatalogURL, wantTTL: 900 * time.Second},
		{name: "junk ttl", env: map[string]string{"BRAMA_MODEL_CATALOG_TTL_SECS": "soon"}, wantURL: defaultCatalogURL, wantTTL: 900 * time.Second},
		{name: "zero ttl", env: map[string]string{"BRAMA_MODEL_CATALOG_TTL_SECS": "0"}, wantURL: defaultCatalogURL, wantTTL: 900 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCatalog(state{dir: t.TempDir()}, catalogEnv(tt.env), http.DefaultClient, quietLog(), time.Now)
			if c.path != tt.wantPath || c.url != tt.wantURL || c.ttl != tt.wantTTL {
				t.Errorf("got path %q url %q ttl %v, want %q %q %v", c.path, c.url, c.ttl, tt.wantPath, tt.wantURL, tt.wantTTL)
			}
		})
	}
}

func TestCatalogFileSource(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api.json")
	writeModel := func(output int) {
		t.Helper()
		body := fmt.Sprintf(`{"anthropic":{"models":{"m":{"limit":{"output":%d}}}}}`, output)
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeModel(100)
	clock := newCatalogClock()
	var logs catalogLogs
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_PATH": file}), http.DefaultClient, logs.logger(), clock.now)

	steps := []struct {
		name      string
		advance   time.Duration
		rewrite   int // new output limit written before the step; 0: none
		wantLimit int
		wantReads int
	}{
		{name: "first lookup reads", wantLimit: 100, wantReads: 1},
		{name: "fresh memory is used", wantLimit: 100, wantReads: 1},
		{name: "file changed, memory still fresh", advance: 10 * time.Second, rewrite: 200, wantLimit: 100, wantReads: 1},
		{name: "just before the TTL", advance: 889 * time.Second, wantLimit: 100, wantReads: 1},
		{name: "TTL passed: re-read", advance: time.Second, wantLimit: 200, wantReads: 2},
		{name: "fresh again", advance: time.Minute, wantLimit: 200, wantReads: 2},
	}
	for _, s := range steps {
		clock.advance(s.advance)
		if s.rewrite != 0 {
			writeModel(s.rewrite)
		}
		got, cause := outputLimit(c, "claude-code", "m")
		if got != s.wantLimit || cause != "" {
			t.Errorf("%s: outputLimit = %d, %q; want %d", s.name, got, cause, s.wantLimit)
		}
		if r := logs.reads(t); r != s.wantReads {
			t.Errorf("%s: %d reads, want %d", s.name, r, s.wantReads)
		}
	}

	// A failed re-read keeps the older copy and waits a TTL before the next try.
	os.Remove(file)
	clock.advance(900 * time.Second)
	if got, _ := outputLimit(c, "anthropic", "m"); got != 200 {
		t.Errorf("after a failed re-read: limit %d, want the older 200", got)
	}
	outputLimit(c, "anthropic", "m")
	if r := logs.reads(t); r != 3 {
		t.Errorf("%d reads, want 3 (no retry within the TTL)", r)
	}
}

// TestCatalogFileSourceCorrupt: a file that cannot be read or parsed is not
// read again at every lookup (each would parse it under the catalogue's
// lock) but when it changes, or a TTL after the failed read (SPEC §6.4).
func TestCatalogFileSourceCorrupt(t *testing.T) {
	file := filepath.Join(t.TempDir(), "api.json")
	os.WriteFile(file, []byte(`{"anthropic":`), 0o644)
	clock := newCatalogClock()
	var logs catalogLogs
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_PATH": file}), http.DefaultClient, logs.logger(), clock.now)
	for _, s := range []struct {
		name      string
		advance   time.Duration
		write     string // the file's new text before the step; "" none
		wantLimit int
		wantReads int
	}{
		{name: "first lookup reads", wantReads: 1},
		{name: "unchanged: not read again", advance: time.Second, wantReads: 1},
		{name: "still unchanged", advance: time.Minute, wantReads: 1},
		{name: "mended: read at once", write: `{"anthropic":{"models":{"m":{"limit":{"output":70}}}}}`, wantLimit: 70, wantReads: 2},
		{name: "broken again, memory fresh", write: `[`, wantLimit: 70, wantReads: 2},
		{name: "TTL passed: the bad re-read keeps the older copy", advance: 900 * time.Second, wantLimit: 70, wantReads: 3},
	} {
		clock.advance(s.advance)
		if s.write != "" {
			os.WriteFile(file, []byte(s.write), 0o644)
			os.Chtimes(file, time.Time{}, clock.now()) // the test clock only moves on; the file's time with it
		}
		if got, _ := outputLimit(c, "anthropic", "m"); got != s.wantLimit {
			t.Errorf("%s: outputLimit = %d, want %d", s.name, got, s.wantLimit)
		}
		if r := logs.reads(t); r != s.wantReads {
			t.Errorf("%s: %d reads, want %d", s.name, r, s.wantReads)
		}
	}
}

func TestCatalogFileSourceMissing(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secret-place", "api.json")
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_PATH": file}), http.DefaultClient, quietLog(), newCatalogClock().now)
	_, ok, cause := c.lookup(anthropicRow, "m")
	if ok || !strings.HasPrefix(cause, "the model catalogue is unavailable: ") || !strings.Contains(cause, "no such file") {
		t.Errorf("lookup = %v, %q; want unavailable naming the missing file", ok, cause)
	}
	data, why := c.current()
	if data != nil || strings.Contains(why, "secret-place") {
		t.Errorf("current = %v, %q; want nil without the path", data, why)
	}
}

func TestCatalogURLStartReadsOnce(t *testing.T) {
	cs := newCatalogServer(t, catalogFixture(t), nil, nil)
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": cs.srv.URL}), cs.srv.Client(), quietLog(), newCatalogClock().now)
	wait, stop := startCatalog(t, c)
	wait()
	for range 10 {
		if n, cause := outputLimit(c, "anthropic", "claude-sonnet-4-5"); n != 64000 {
			t.Fatalf("outputLimit = %d, %q; want 64000", n, cause)
		}
	}
	stop()
	if n := cs.count.Load(); n != 1 {
		t.Errorf("%d catalogue reads, want 1", n)
	}
}

func TestCatalogURLLookupDoesNotWait(t *testing.T) {
	cs := newCatalogServer(t, catalogFixture(t), nil, func(int64) bool { return true })
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": cs.srv.URL}), cs.srv.Client(), quietLog(), newCatalogClock().now)
	wait, _ := startCatalog(t, c)
	<-cs.arrived // the read is in flight and held by the server
	_, ok, cause := c.lookup(anthropicRow, "claude-sonnet-4-5")
	if ok || cause != "the model catalogue is unavailable: the first catalogue read has not finished" {
		t.Errorf("lookup during the first read = %v, %q", ok, cause)
	}
	if data, _ := c.current(); data != nil {
		t.Error("current during the first read is not nil")
	}
	close(cs.release)
	wait()
	if _, ok, cause := c.lookup(anthropicRow, "claude-sonnet-4-5"); !ok {
		t.Errorf("lookup after the read = false, %q", cause)
	}
}

func TestCatalogURLStaleSingleFlight(t *testing.T) {
	cs := newCatalogServer(t, catalogFixture(t), nil, func(n int64) bool { return n >= 2 })
	clock := newCatalogClock()
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": cs.srv.URL}), cs.srv.Client(), quietLog(), clock.now)
	wait, stop := startCatalog(t, c)
	wait()
	<-cs.arrived

	clock.advance(900 * time.Second)
	lookups := func() {
		var wg sync.WaitGroup
		var served atomic.Int64
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, ok, _ := c.lookup(anthropicRow, "claude-sonnet-4-5"); ok {
					served.Add(1) // stale memory still answers
				}
			}()
		}
		wg.Wait()
		if served.Load() != 20 {
			t.Errorf("%d of 20 lookups served from stale memory", served.Load())
		}
	}
	lookups()
	if n := <-cs.arrived; n != 2 {
		t.Fatalf("refresh arrived as request %d, want 2", n)
	}
	// The refresh is held by the server: more stale lookups must not start
	// another read beside it (one would be counted below).
	lookups()
	close(cs.release)
	wait()
	c.lookup(anthropicRow, "claude-sonnet-4-5") // fresh: no further read
	if c.testRefreshing() {
		t.Error("a fresh catalogue queued another read")
	}
	stop()
	if n := cs.count.Load(); n != 2 {
		t.Errorf("%d catalogue reads, want 2 (start + one refresh)", n)
	}
}

func TestCatalogURLFailureNotRetriedWithinTTL(t *testing.T) {
	cs := newCatalogServer(t, catalogFixture(t), func(n int64) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}, nil)
	clock := newCatalogClock()
	var logs catalogLogs
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": cs.srv.URL}), cs.srv.Client(), logs.logger(), clock.now)
	wait, stop := startCatalog(t, c)
	wait()

	_, ok, cause := c.lookup(anthropicRow, "claude-sonnet-4-5")
	if ok || cause != "the model catalogue is unavailable: catalogue read: HTTP status 503" {
		t.Errorf("lookup after a failed read = %v, %q", ok, cause)
	}
	clock.advance(899 * time.Second)
	c.lookup(anthropicRow, "claude-sonnet-4-5")
	if c.testRefreshing() {
		t.Fatal("a failed read was retried within the TTL")
	}
	clock.advance(time.Second)
	c.lookup(anthropicRow, "claude-sonnet-4-5")
	if !c.testRefreshing() {
		t.Fatal("no retry once the TTL passed")
	}
	wait()
	if _, ok, cause := c.lookup(anthropicRow, "claude-sonnet-4-5"); !ok {
		t.Errorf("lookup after the retry = false, %q", cause)
	}
	stop()
	if n := cs.count.Load(); n != 2 {
		t.Errorf("%d catalogue reads, want 2", n)
	}
	if strings.Contains(logs.buf.String(), "secret-upstream-detail") {
		t.Error("the log quotes the upstream body")
	}
	if got := len(logs.lines(t, "model_catalog_read_failed")); got != 1 {
		t.Errorf("%d model_catalog_read_failed lines, want 1", got)
	}
}

func TestCatalogCache(t *testing.T) {
	stateDir := t.TempDir()
	st := state{dir: stateDir}
	cs := newCatalogServer(t, catalogFixture(t), nil, nil)
	c := newCatalog(st, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": cs.srv.URL}), cs.srv.Client(), quietLog(), newCatalogClock().now)
	wait, stop := startCatalog(t, c)
	wait()
	stop()

	name := filepath.Join(stateDir, "model-metadata.json")
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("cache mode %#o, want 0600", fi.Mode().Perm())
	}
	var cc catalogCache
	b, _ := os.ReadFile(name)
	if err := json.Unmarshal(b, &cc); err != nil || !cc.FetchedAt.Equal(newCatalogClock().now()) {
		t.Errorf("cache = %s (%v), want fetched_at of the read", b, err)
	}
	if !bytes.Contains(cc.Body, []byte(`"context":`)) || !bytes.Contains(cc.Body, []byte(`"input":`)) || bytes.Contains(cc.Body, []byte(`"Context"`)) {
		t.Errorf("cache body %.200s: want api.json's member names (limit.context, modalities.input)", cc.Body)
	}

	failing := newCatalogServer(t, nil, func(int64) int { return http.StatusInternalServerError }, nil)
	tests := []struct {
		name  string
		env   map[string]string
		reads int // source reads settled: serve starts the catalogue either way, and "off" reads nothing
	}{
		{name: "off", env: map[string]string{"BRAMA_MODEL_CATALOG_URL": "off"}},
		{name: "failing URL", env: map[string]string{"BRAMA_MODEL_CATALOG_URL": failing.srv.URL}, reads: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs catalogLogs
			fresh := newCatalog(st, catalogEnv(tt.env), failing.srv.Client(), logs.logger(), newCatalogClock().now)
			wait, _ := startCatalog(t, fresh)
			if wait(); logs.reads(t) != tt.reads {
				t.Errorf("%d source reads, want %d:\n%s", logs.reads(t), tt.reads, logs.buf.String())
			}
			if n, cause := outputLimit(fresh, "codex", "gpt-5"); n != 128000 {
				t.Errorf("outputLimit from the cache = %d, %q; want 128000", n, cause)
			}
			if now, _ := os.ReadFile(name); !bytes.Equal(now, b) { // a failed read never replaces the last good copy
				t.Errorf("the cache after %s = %.200s, want the last good read's", tt.name, now)
			}
		})
	}

	empty := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": "off"}), http.DefaultClient, quietLog(), time.Now)
	if data, why := empty.current(); data != nil || why != "the model catalogue is unavailable: live reads are off (BRAMA_MODEL_CATALOG_URL=off) and there is no cached copy" {
		t.Errorf("off without a cache: current = %v, %q", data, why)
	}
}

// TestCatalogCacheWriteFailed: a good read that cannot be kept in the cache (here a non-empty directory
// stands in its place) still settles memory, and is logged model_metadata_cache_write_failed (AUTHORIZATION.md).
func TestCatalogCacheWriteFailed(t *testing.T) {
	stateDir := t.TempDir()
	os.MkdirAll(filepath.Join(stateDir, "model-metadata.json", "in-the-way"), 0o700)
	cs := newCatalogServer(t, catalogFixture(t), nil, nil)
	var logs catalogLogs
	c := newCatalog(state{dir: stateDir}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": cs.srv.URL}), cs.srv.Client(), logs.logger(), newCatalogClock().now)
	wait, stop := startCatalog(t, c)
	wait()
	stop()
	if n, cause := outputLimit(c, "codex", "gpt-5"); n != 128000 {
		t.Errorf("outputLimit from memory = %d, %q; want 128000", n, cause)
	}
	if lines := logs.lines(t, "model_metadata_cache_write_failed"); len(lines) != 1 {
		t.Errorf("%d model_metadata_cache_write_failed lines, want 1", len(lines))
	}
}

func TestCatalogCacheGuarded(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "model-metadata.json")
	body := `{"fetched_at":"2025-10-01T12:00:00Z","body":{"openai":{"models":{"gpt-5":{"limit":{"output":5}}}}}}`
	if err := os.WriteFile(name, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs catalogLogs
	c := newCatalog(state{dir: dir}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": "off"}), http.DefaultClient, logs.logger(), time.Now)
	if data, why := c.current(); data != nil || !strings.Contains(why, "the cached copy is unreadable") || !strings.Contains(why, "chmod 600") {
		t.Errorf("group-readable cache: current = %v, %q; want refused naming the copy and the rule", data, why)
	}
	if n := len(logs.lines(t, "model_metadata_cache_unreadable")); n != 1 {
		t.Errorf("%d model_metadata_cache_unreadable lines, want 1", n)
	}
}

func TestCatalogNoStateDir(t *testing.T) {
	cs := newCatalogServer(t, catalogFixture(t), nil, nil)
	clock := newCatalogClock()
	var logs catalogLogs
	st := state{cause: errors.New("$HOME is not defined")}
	c := newCatalog(st, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": cs.srv.URL}), cs.srv.Client(), logs.logger(), clock.now)
	wait, stop := startCatalog(t, c)
	wait()
	if n, cause := outputLimit(c, "kimi", "kimi-k2-0711-preview"); n != 16384 {
		t.Errorf("outputLimit from memory = %d, %q", n, cause)
	}
	clock.advance(time.Hour)
	kimi, _ := lookupProvider("kimi")
	c.lookup(kimi, "kimi-k2-0711-preview")
	wait()
	stop()
	lines := logs.lines(t, "model_metadata_cache_unplaced")
	if len(lines) != 1 {
		t.Fatalf("%d model_metadata_cache_unplaced lines, want 1", len(lines))
	}
	if cause, _ := lines[0]["cause"].(string); !strings.Contains(cause, "$HOME is not defined") {
		t.Errorf("cause %q does not name the home cause", cause)
	}
	for _, event := range []string{"model_metadata_cache_write_failed", "model_metadata_cache_unreadable"} { // it has no place
		if n := len(logs.lines(t, event)); n != 0 {
			t.Errorf("%d %s lines, want none", n, event)
		}
	}
}

func TestCatalogStartNeverCalled(t *testing.T) {
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_URL": "http://127.0.0.1:1/"}), http.DefaultClient, quietLog(), time.Now)
	_, ok, cause := c.lookup(anthropicRow, "m")
	if ok || cause != "the model catalogue is unavailable: no catalogue read has been started" {
		t.Errorf("lookup = %v, %q", ok, cause)
	}
	if c.testRefreshing() {
		t.Error("a lookup queued background work without start")
	}
}

func TestCatalogOutputLimit(t *testing.T) {
	file := filepath.Join(t.TempDir(), "api.json")
	if err := os.WriteFile(file, catalogFixture(t), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_PATH": file}), http.DefaultClient, quietLog(), time.Now)
	tests := []struct {
		name, provider, model string
		want                  int
		wantCause             string
	}{
		{"known", "anthropic", "claude-3-5-haiku-20241022", 8192, ""},
		{"known through claude-code", "claude-code", "claude-sonnet-4-5", 64000, ""},
		{"no limit", "anthropic", "claude-no-limit", 0, "the catalogue has no output limit for anthropic/claude-no-limit"},
		{"zero limit", "codex", "gpt-image-1", 0, "the catalogue has no output limit for openai/gpt-image-1"},
		{"unknown model", "anthropic", "x", 0, "the catalogue has no entry for anthropic/x"},
		{"unknown vendor", "groq", "x", 0, "the catalogue has no entry for groq/x"},
		{"local-openai", "local-openai", "x", 0, "the catalogue has no vendor for provider local-openai"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, cause := outputLimit(c, tt.provider, tt.model)
			if got != tt.want || cause != tt.wantCause {
				t.Errorf("outputLimit(%s, %s) = %d, %q; want %d, %q", tt.provider, tt.model, got, cause, tt.want, tt.wantCause)
			}
		})
	}
}

func TestCatalogModels(t *testing.T) {
	file := filepath.Join(t.TempDir(), "api.json")
	if err := os.WriteFile(file, catalogFixture(t), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCatalog(state{dir: t.TempDir()}, catalogEnv(map[string]string{"BRAMA_MODEL_CATALOG_PATH": file}), http.DefaultClient, quietLog(), time.Now)
	tests := []struct {
		name, provider string
		want           []string
	}{
		{"kimi: date desc, then id", "kimi", []string{"kimi-k2-0905-preview", "kimi-k2-turbo-preview", "kimi-k2-0711-preview", "kimi-undated"}},
		{"codex", "codex", []string{"gpt-5", "gpt-image-1"}},
		{"local-openai", "local-openai", nil},
		{"unknown vendor", "groq", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, m := range c.models(tt.provider) {
				got = append(got, m.ID)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("models(%s) mismatch (-want +got):\n%s", tt.provider, diff)
			}
		})
	}
}

func FuzzParseCatalog(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"a":{"models":{"m":{"release_date":"2025-01-02","limit":{"context":10,"output":5},"modalities":{"input":["text"],"output":["text"]}}}}}`))
	f.Add([]byte(`{"a":{"models":{"m":{"limit":{"output":1e9}},"n":null,"o":[]}},"b":{"models":7}}`))
	f.Add([]byte(`{"a":null}`))
	f.Add([]byte("{\"\xff\":{\"models\":{\"\xfe\":{\"modalities\":{\"input\":[\"\xfd\"]}}}}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := parseCatalog(data, nil)
		if err != nil {
			if !errors.Is(err, errCatalogShape) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		again, err := parseCatalog(mustMarshal(t, got), nil)
		if err != nil {
			t.Fatalf("re-encoded catalogue refused: %v", err)
		}
		if diff := cmp.Diff(got, again); diff != "" {
			t.Fatalf("round trip changed the catalogue (-first +second):\n%s", diff)
		}
	})
}

// A catalogue URL's query (where a private mirror's key sits) is never
// quoted: not in /readyz, which needs no token, nor in the log (SPEC §6.4).
func TestCatalogURLFailureQuotesNoQuery(t *testing.T) {
	const planted = "planted-catalog-key-0123"
	for _, tc := range []struct{ name, url, shown string }{
		{"refused connection", "http://127.0.0.1:9/api.json?key=" + planted, "catalogue read:"},
		{"unparsable port", "http://127.0.0.1:notaport/api.json?key=" + planted, "catalogue read:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := stateEnv(t)
			env["BRAMA_MODEL_CATALOG_URL"] = tc.url
			d := startDaemon(t, env, "")
			var body []byte
			for i := 0; !strings.Contains(string(body), tc.shown); i++ { // until the first read settled
				if i == 10000 {
					t.Fatalf("/readyz never showed the failed catalogue read: %s", body)
				}
				_, _, body = d.call("GET", "/readyz", "", "")
			}
			d.stop()
			if strings.Contains(string(body), "HTTP status") { // no answer came: the transport's cause is named, no status
				t.Errorf("/readyz names a status for a read that got none: %s", body)
			}
			assertNoSecret(t, planted, string(body)+d.stderr.String(), env["BRAMA_STATE_DIR"])
		})
	}
}

// mustMarshal is the model metadata cache's encoding of a catalogue: api.json's shape, which parseCatalog reads back.
func mustMarshal(t *testing.T, data catalogData) []byte {
	t.Helper()
	b, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var anthropicRow, _ = lookupProvider("anthropic")

// outputLimit is §6.4's max_tokens lookup as applyMaxTokens reads it: the model's output limit, or 0 with the cause.
func outputLimit(c *catalog, provider, model string) (int, string) {
	p, _ := lookupProvider(provider)
	p.id = provider // an unknown one, named as given
	info, _, cause := c.lookup(p, model)
	return int(info.Limit.Output), cause
}
