package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// regLogs is a slog handler that keeps every record (so tests can count
// warnings) and echoes it to t.Logf.
type regLogs struct {
	t    *testing.T
	mu   sync.Mutex // guards recs
	recs []slog.Record
}

func (h *regLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *regLogs) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *regLogs) WithGroup(string) slog.Handler            { return h }
func (h *regLogs) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	h.t.Logf("log: %s %s", r.Level, r.Message)
	return nil
}

// count is how many records with message msg were logged; attrs collects
// the value of attribute key on each.
func (h *regLogs) count(msg, key string) (n int, attrs []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.recs {
		if r.Message != msg {
			continue
		}
		n++
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				attrs = append(attrs, a.Value.String())
			}
			return true
		})
	}
	return n, attrs
}

// regFixture is a registry at $STATE/routes.json with a real journal in the
// same state directory.
type regFixture struct {
	path string
	j    *journal
	logs *regLogs
	reg  *registry
}

func newRegFixture(t *testing.T) *regFixture {
	t.Helper()
	st := state{dir: t.TempDir()}
	logs := &regLogs{t: t}
	log := slog.New(logs)
	path, err := registryPath(st, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	j := newJournal(st, sys{log: log, now: func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) }})
	return &regFixture{path: path, j: j, logs: logs, reg: newRegistry(path, nil, j)}
}

// regWrite writes content to name with mode 0600, as an operator would.
func regWrite(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(name, 0o600); err != nil {
		t.Fatal(err)
	}
}

func regRead(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// routeChanges reads the journal back and keeps its route_change records.
func (f *regFixture) routeChanges(t *testing.T) []journalRecord {
	t.Helper()
	recs, err := f.j.read()
	if err != nil {
		t.Fatal(err)
	}
	var out []journalRecord
	for _, r := range recs {
		if r.Kind == "route_change" {
			out = append(out, r)
		}
	}
	return out
}

func regStr(s string) *string { return &s }

// wantAPIError checks that err is an *apiError with code, no attempts key,
// and a message containing msg.
func wantAPIError(t *testing.T, err error, code, msg string) *apiError {
	t.Helper()
	var ae *apiError
	if !errors.As(err, &ae) {
		t.Fatalf("error = %v (%T), want an *apiError %s", err, err, code)
	}
	if ae.Code != code || !strings.Contains(ae.Message, msg) {
		t.Fatalf("error = %s: %s, want %s containing %q", ae.Code, ae.Message, code, msg)
	}
	if ae.Attempts != nil {
		t.Errorf("attempts = %d, want no attempts key (nothing was dispatched)", *ae.Attempts)
	}
	return ae
}

func TestRegistryPath(t *testing.T) {
	noHome := state{cause: errors.New("$HOME is not defined")}
	tests := []struct {
		name    string
		st      state
		env     map[string]string
		want    string
		wantErr bool
	}{
		{name: "state dir", st: state{dir: "/s"}, want: "/s/routes.json"},
		{name: "override wins", st: state{dir: "/s"}, env: map[string]string{"BRAMA_ROUTES_FILE": " /etc/brama/routes.json "}, want: "/etc/brama/routes.json"},
		{name: "override without state dir", st: noHome, env: map[string]string{"BRAMA_ROUTES_FILE": "/r.json"}, want: "/r.json"},
		{name: "neither", st: noHome, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := registryPath(tt.st, func(k string) string { return tt.env[k] })
			if tt.wantErr {
				if !errors.Is(err, errNoState) || !strings.Contains(err.Error(), "$HOME is not defined") {
					t.Fatalf("err = %v, want errNoState naming the cause", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("registryPath = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestRegistryWithoutStateDir(t *testing.T) {
	_, pathErr := registryPath(state{cause: errors.New("$HOME is not defined")}, func(string) string { return "" })
	r := newRegistry("", pathErr, newJournal(state{cause: errors.New("$HOME is not defined")}, testSys(t, nil)))
	doc, err := r.current()
	if err != nil || len(doc.Routes) != 0 {
		t.Fatalf("current = %v, %v; want the empty registry", doc, err)
	}
	_, err = r.set("chat", ptr("openai/gpt-4o"), "cli")
	wantAPIError(t, err, "dependency_unavailable", "$HOME is not defined")
	_, err = r.set("chat", nil, "cli")
	wantAPIError(t, err, "dependency_unavailable", "$HOME is not defined")
}

func TestRegistryCurrentParsesOnlyOnChange(t *testing.T) {
	f := newRegFixture(t)
	var parses int // files parsed so far: an unchanged file costs none
	f.reg.parse = func(b []byte) (*routesDoc, error) {
		if b != nil { // nil: the file is absent
			parses++
		}
		return parseRegistry(b)
	}
	doc, err := f.reg.current()
	if err != nil || len(doc.Routes) != 0 || parses != 0 {
		t.Fatalf("absent file: current = %v, %v, %d parses; want empty, no parse", doc, err, parses)
	}

	regWrite(t, f.path, `{"routes":{"a":"best"}}`)
	first, err := f.reg.current()
	if err != nil || first.Routes["a"] != "best" {
		t.Fatalf("current = %v, %v", first, err)
	}
	for range 3 {
		again, err := f.reg.current()
		if err != nil || again != first {
			t.Fatalf("unchanged file: current = %p, %v; want the cached %p", again, err, first)
		}
	}
	if parses != 1 {
		t.Fatalf("parses = %d after four reads of an unchanged file, want 1", parses)
	}

	// An invalid file: every alias is routes_file_invalid, logged once.
	if err := writeFileAtomic(f.path, []byte(`{"routes":{"a":"best"},"fallbacks":{}}`)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := f.reg.current(); err == nil || !strings.Contains(err.Error(), `"fallbacks"`) {
			t.Fatalf("invalid file: err = %v", err)
		}
	}
	if parses != 2 {
		t.Errorf("parses = %d, want 2: an unchanged invalid file is not parsed again", parses)
	}
	n, reasons := f.logs.count("inference_routes_invalid", "reason")
	if n != 1 || !strings.Contains(reasons[0], `registry field "fallbacks"`) {
		t.Errorf("inference_routes_invalid logged %d times (%q), want once with the reason", n, reasons)
	}

	// Fixed in place: the same registry object serves again.
	if err := writeFileAtomic(f.path, []byte(`{"routes":{"a":"best","b":"best"}}`)); err != nil {
		t.Fatal(err)
	}
	doc, err = f.reg.current()
	if err != nil || doc.Routes["b"] != "best" || parses != 3 {
		t.Fatalf("repaired file: current = %v, %v, %d parses", doc, err, parses)
	}

	// A different failure is logged again.
	if err := os.Chmod(f.path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.current(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("0640 file: err = %v, want the group/other rule", err)
	}
	if n, _ := f.logs.count("inference_routes_invalid", "reason"); n != 2 {
		t.Errorf("inference_routes_invalid logged %d times, want 2 (two distinct failures)", n)
	}
}

func TestRegistryCurrentRefusesSymlink(t *testing.T) {
	f := newRegFixture(t)
	target := filepath.Join(t.TempDir(), "elsewhere.json")
	regWrite(t, target, `{"routes":{"a":"best"}}`)
	if err := os.Symlink(target, f.path); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.current(); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("err = %v, want the symlink rule", err)
	}
	if _, err := f.reg.aliases(nil, nil); err == nil {
		t.Fatal("aliases of an unreadable registry: want an error")
	}
}

func TestRegistrySetRemove(t *testing.T) {
	f := newRegFixture(t)
	regWrite(t, f.path, regDoc(`{}`))

	steps := []struct {
		name   string
		do     func() (*routesDoc, error)
		routes map[string]string
		rec    journalRecord
	}{
		{name: "create", do: func() (*routesDoc, error) { return f.reg.set("chat", ptr("  anthropic/claude-sonnet-4-5 "), "local") },
			routes: map[string]string{"chat": "anthropic/claude-sonnet-4-5"},
			rec:    journalRecord{Kind: "route_change", routeChange: &routeChange{To: regStr("anthropic/claude-sonnet-4-5")}, Alias: "chat", By: "local"}},
		{name: "bare deployment", do: func() (*routesDoc, error) { return f.reg.set("cheap", ptr("qwen-local"), "cli") },
			routes: map[string]string{"chat": "anthropic/claude-sonnet-4-5", "cheap": "qwen-local"},
			rec:    journalRecord{Kind: "route_change", routeChange: &routeChange{To: regStr("qwen-local")}, Alias: "cheap", By: "cli"}},
		{name: "replace", do: func() (*routesDoc, error) { return f.reg.set("chat", ptr("best"), "local") },
			routes: map[string]string{"chat": "best", "cheap": "qwen-local"},
			rec:    journalRecord{Kind: "route_change", routeChange: &routeChange{From: regStr("anthropic/claude-sonnet-4-5"), To: regStr("best")}, Alias: "chat", By: "local"}},
		{name: "best needs no credential yet", do: func() (*routesDoc, error) { return f.reg.set("best", ptr("openai/gpt-4o"), "local") },
			routes: map[string]string{"best": "openai/gpt-4o", "chat": "best", "cheap": "qwen-local"},
			rec:    journalRecord{Kind: "route_change", routeChange: &routeChange{To: regStr("openai/gpt-4o")}, Alias: "best", By: "local"}},
		{name: "delete", do: func() (*routesDoc, error) { return f.reg.set("cheap", nil, "cli") },
			routes: map[string]string{"best": "openai/gpt-4o", "chat": "best"},
			rec:    journalRecord{Kind: "route_change", routeChange: &routeChange{From: regStr("qwen-local")}, Alias: "cheap", By: "cli"}},
	}
	for i, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			doc, err := s.do()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(s.routes, doc.Routes); diff != "" {
				t.Errorf("committed routes (-want +got):\n%s", diff)
			}
			if got := regRead(t, f.path); got != string(encodeRegistry(doc)) {
				t.Errorf("file is not the canonical encoding of the committed document:\n%s", got)
			}
			if fi, err := os.Stat(f.path); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("file mode = %v, %v; want 0600", fi.Mode().Perm(), err)
			}
			recs := f.routeChanges(t)
			if len(recs) != i+1 {
				t.Fatalf("route_change records = %d, want %d", len(recs), i+1)
			}
			want := s.rec
			want.At = "2025-01-02T03:04:05.000Z"
			if diff := cmp.Diff(want, recs[i], cmp.AllowUnexported(journalRecord{})); diff != "" {
				t.Errorf("journal record (-want +got):\n%s", diff)
			}
			cur, err := f.reg.current()
			if err != nil || !cmp.Equal(cur.Routes, s.routes) {
				t.Errorf("current after write = %v, %v", cur, err)
			}
		})
	}
}

func TestRegistryWriteRefusals(t *testing.T) {
	tests := []struct {
		name    string
		file    string // "" leaves the file absent
		do      func(r *registry) (*routesDoc, error)
		code    string
		msg     string
		details *aliasDetails
	}{
		{name: "alias pattern", do: func(r *registry) (*routesDoc, error) { return r.set("Chat", ptr("best"), "cli") },
			code: "invalid_request", msg: `alias "Chat" must match`},
		{name: "alias any", do: func(r *registry) (*routesDoc, error) { return r.set("any", ptr("best"), "cli") },
			code: "invalid_request", msg: "selector name"},
		{name: "wildcard destination", do: func(r *registry) (*routesDoc, error) { return r.set("a", ptr("openai/*"), "cli") },
			code: "invalid_request", msg: `contains "*"`},
		{name: "control character", do: func(r *registry) (*routesDoc, error) { return r.set("a", ptr("openai/a\x00b"), "cli") },
			code: "invalid_request", msg: "control character"},
		{name: "unknown provider", do: func(r *registry) (*routesDoc, error) { return r.set("a", ptr("nosuch/model"), "cli") },
			code: "invalid_request", msg: `Provider "nosuch" is not one Brama knows`},
		{name: "bare name matching no deployment", file: regDoc(`{}`), do: func(r *registry) (*routesDoc, error) { return r.set("a", ptr("llama"), "cli") },
			code: "invalid_request", msg: `"llama" names 0 deployments or adapters; a bare name must name exactly one`},
		{name: "local-openai naming no deployment", file: regDoc(`{}`), do: func(r *registry) (*routesDoc, error) { return r.set("a", ptr("local-openai/llama"), "cli") },
			code: "invalid_request", msg: `No single deployment or adapter named "llama"`},
		{name: "best to best", do: func(r *registry) (*routesDoc, error) { return r.set("best", ptr("best"), "cli") },
			code: "invalid_request", msg: "must name a canonical route"},
		{name: "registry on disk invalid", file: `{"routes":{},"fallbacks":{}}`, do: func(r *registry) (*routesDoc, error) { return r.set("a", ptr("best"), "cli") },
			code: "state_conflict", msg: `registry field "fallbacks"`},
		{name: "result too large", file: `{"routes":{` + regManyRoutes(2500) + `}}`, do: func(r *registry) (*routesDoc, error) {
			return r.set("a", ptr("openai/"+strings.Repeat("m", 500)), "cli")
		},
			code: "state_conflict", msg: "the route registry would be"},
		{name: "remove unknown alias", file: regDoc(`{"b":"best"}`), do: func(r *registry) (*routesDoc, error) { return r.set("a", nil, "cli") },
			code: "alias_unknown", msg: `alias "a" is not declared`, details: &aliasDetails{Alias: "a", State: "no_route"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newRegFixture(t)
			if tt.file != "" {
				regWrite(t, f.path, tt.file)
			}
			_, err := tt.do(f.reg)
			ae := wantAPIError(t, err, tt.code, tt.msg)
			if diff := cmp.Diff(tt.details, ae.Details); diff != "" {
				t.Errorf("details (-want +got):\n%s", diff)
			}
			if tt.file == "" {
				if _, err := os.Stat(f.path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a refused write created the registry (stat: %v)", err)
				}
			} else if got := regRead(t, f.path); got != tt.file {
				t.Errorf("a refused write changed the registry")
			}
			if recs := f.routeChanges(t); len(recs) != 0 {
				t.Errorf("a refused write journaled %d records", len(recs))
			}
		})
	}
}

// regManyRoutes is n aliases with 400-byte destinations, about n*430 bytes.
func regManyRoutes(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"a%d":"openai/%s"`, i, strings.Repeat("m", 400))
	}
	return b.String()
}

func TestRegistryConcurrentSet(t *testing.T) {
	f := newRegFixture(t)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.reg.set(fmt.Sprintf("alias-%02d", i), ptr("openai/gpt-4o"), "cli")
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	doc, err := parseRegistry([]byte(regRead(t, f.path)))
	if err != nil {
		t.Fatalf("file after concurrent writes: %v", err)
	}
	if len(doc.Routes) != 32 {
		t.Errorf("aliases in the file = %d, want 32", len(doc.Routes))
	}
	seen := map[string]bool{}
	for _, r := range f.routeChanges(t) {
		seen[r.Alias] = true
	}
	if len(seen) != 32 {
		t.Errorf("route_change records name %d aliases, want 32", len(seen))
	}
}

// TestRegistryRenameFailure sets the package hook testingOnlyRename, so it
// must not run in parallel with other writers.
func TestRegistryRenameFailure(t *testing.T) {
	f := newRegFixture(t)
	before := regDoc(`{"chat":"best"}`)
	regWrite(t, f.path, before)
	testingOnlyRename = func(oldpath, newpath string) error { return errors.New("injected rename failure") }
	t.Cleanup(func() { testingOnlyRename = nil })

	_, err := f.reg.set("chat", ptr("openai/gpt-4o"), "cli")
	wantAPIError(t, err, "internal_error", "injected rename failure")
	if got := regRead(t, f.path); got != before {
		t.Errorf("registry bytes changed after a failed rename:\n%s", got)
	}
	if recs := f.routeChanges(t); len(recs) != 0 {
		t.Errorf("a failed write journaled %d records", len(recs))
	}
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(f.path), ".routes.json.tmp*")); len(leftovers) != 0 {
		t.Errorf("temporary files left behind: %v", leftovers)
	}
}

func TestRegistryJournalNotReady(t *testing.T) {
	f := newRegFixture(t)
	before := regDoc(`{"chat":"best"}`)
	regWrite(t, f.path, before)
	// The registry file is named explicitly, but there is no state
	// directory, so there is no journal (SPEC §2.1).
	f.reg.j = newJournal(state{cause: errors.New("$HOME is not defined")}, testSys(t, nil))
	_, err := f.reg.set("chat", ptr("openai/gpt-4o"), "cli")
	wantAPIError(t, err, "dependency_unavailable", "$HOME is not defined")
	_, err = f.reg.set("chat", nil, "cli")
	wantAPIError(t, err, "dependency_unavailable", "$HOME is not defined")
	if got := regRead(t, f.path); got != before {
		t.Errorf("registry changed although the journal could not record it:\n%s", got)
	}
}

func TestRegistryJournalAppendFailsAfterRename(t *testing.T) {
	f := newRegFixture(t)
	f.j.testingOnlySync = func(*os.File) error { return errors.New("injected fsync failure") }
	doc, err := f.reg.set("chat", ptr("openai/gpt-4o"), "cli")
	if err != nil {
		t.Fatalf("set = %v; a journal failure after the rename must not fail the write", err)
	}
	if got := regRead(t, f.path); got != string(encodeRegistry(doc)) || doc.Routes["chat"] != "openai/gpt-4o" {
		t.Errorf("the change does not stand:\n%s", got)
	}
	n, causes := f.logs.count("journal_append_failed", "cause")
	if n != 1 || !strings.Contains(causes[0], "injected fsync failure") {
		t.Errorf("journal_append_failed logged %d times (%q), want once with the cause", n, causes)
	}
}

func TestMigrateRegistry(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "routes.json")
	regWrite(t, path, `{"routes":{"smart":"best","chat":"anthropic/claude-sonnet-4-5"},
		"fallbacks":{"chat":["openai/gpt-4o"]},"comment":"old",
		"deployments":[{"name":"qwen-local","endpoint":{"host":"127.0.0.1","port":11434}}]}`)
	want := `{
  "schema_version": 1,
  "deployments": [
    {
      "name": "qwen-local",
      "endpoint": {
        "host": "127.0.0.1",
        "port": 11434
      }
    }
  ],
  "routes": {
    "chat": "anthropic/claude-sonnet-4-5",
    "smart": "best"
  }
}
`
	committed, dropped, err := migrateRegistry(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, string(committed)); diff != "" {
		t.Errorf("committed bytes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"comment", "fallbacks"}, dropped); diff != "" {
		t.Errorf("dropped (-want +got):\n%s", diff)
	}
	if got := regRead(t, path); got != want {
		t.Errorf("file holds:\n%s", got)
	}

	again, dropped, err := migrateRegistry(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(committed) || len(dropped) != 0 || dropped == nil {
		t.Errorf("second run: committed %q, dropped %#v; want identical bytes and []", again, dropped)
	}
	if _, err := os.Stat(filepath.Join(dir, "journal.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("migrate wrote a journal (stat: %v)", err)
	}
}

func TestMigrateRegistryRefusals(t *testing.T) {
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
		symlink bool
		absent  bool
		msg     string
	}{
		{name: "absent", absent: true, msg: "does not exist"},
		{name: "symlink", content: `{"fallbacks":{}}`, symlink: true, msg: "symlink"},
		{name: "group readable", content: `{"fallbacks":{}}`, mode: 0o640, msg: "chmod 600"},
		{name: "not JSON", content: `{"fallbacks":`, msg: "registry: EOF"},
		{name: "array", content: `[{"routes":{}}]`, msg: "cannot unmarshal array"},
		{name: "empty", content: "", msg: "is empty"},
		{name: "duplicate keys", content: `{"routes":{"a":"best","a":"best"},"fallbacks":{}}`, msg: `duplicate key "a"`},
		{name: "kept members invalid", content: `{"routes":{"a":"openai/*"},"fallbacks":{}}`, msg: `contains "*"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "routes.json")
			target := path
			if tt.symlink {
				target = filepath.Join(dir, "real.json")
				if err := os.Symlink(target, path); err != nil {
					t.Fatal(err)
				}
			}
			if !tt.absent {
				regWrite(t, target, tt.content)
				if tt.mode != 0 {
					if err := os.Chmod(target, tt.mode); err != nil {
						t.Fatal(err)
					}
				}
			}
			_, _, err := migrateRegistry(path)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("migrate error = %v, want one containing %q", err, tt.msg)
			}
			if ents, _ := os.ReadDir(dir); tt.absent && len(ents) != 0 { // nothing made beside it, not even a lock file
				t.Errorf("a refused migration of an absent file left %s", ents[0].Name())
			}
			if tt.absent {
				return
			}
			if got := regRead(t, target); got != tt.content {
				t.Errorf("refused migration changed the file:\n%s", got)
			}
			if fi, err := os.Lstat(path); err != nil || tt.symlink != (fi.Mode()&os.ModeSymlink != 0) {
				t.Errorf("refused migration replaced the file (%v)", err)
			}
			if fi, err := os.Stat(target); err != nil || tt.mode != 0 && fi.Mode().Perm() != tt.mode {
				t.Errorf("refused migration changed the mode (%v)", err)
			}
		})
	}
}

// specRegistry is the example document of SPEC §4.1.
const specRegistry = `{
  "schema_version": 1,
  "deployments": [
    {"name": "qwen-local", "endpoint": {"host": "127.0.0.1", "port": 11434}, "model": "qwen2.5:7b", "adapters": [{"name": "qwen-lora"}]}
  ],
  "routes": {
    "chat": "anthropic/claude-sonnet-4-5",
    "cheap": "qwen-local",
    "smart": "best"
  }
}`

// regDoc builds a registry document around routes with the SPEC example's
// deployment.
func regDoc(routes string) string {
	return `{"deployments":[{"name":"qwen-local","endpoint":{"host":"127.0.0.1","port":11434},"adapters":[{"name":"qwen-lora"}]}],"routes":` + routes + `}`
}

// regDeployment builds a registry document with one deployment object.
func regDeployment(dep string) string {
	return `{"deployments":[` + dep + `],"routes":{}}`
}

func TestParseRegistry(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    *routesDoc // checked when wantErr is ""
		wantErr string     // a substring of the refusal
	}{
		{name: "spec example", in: specRegistry, want: &routesDoc{
			SchemaVersion: 1,
			Deployments: []deployment{{
				Name: "qwen-local", Endpoint: deploymentEndpoint{Host: "127.0.0.1", Port: 11434},
				Model: "qwen2.5:7b", Adapters: []adapter{{Name: "qwen-lora"}},
			}},
			Routes: map[string]string{"chat": "anthropic/claude-sonnet-4-5", "cheap": "qwen-local", "smart": "best"},
		}},
		{name: "empty file", in: "", want: emptyRoutesDoc()},
		{name: "whitespace only", in: " \n\t\r\n", want: emptyRoutesDoc()},
		{name: "empty object", in: "{}", want: emptyRoutesDoc()},
		{name: "schema_version absent reads as 1", in: `{"routes":{"a":"openai/gpt-4o"}}`, want: &routesDoc{
			SchemaVersion: 1, Deployments: []deployment{}, Routes: map[string]string{"a": "openai/gpt-4o"},
		}},
		{name: "empty adapters list is no adapters", in: regDeployment(`{"name":"d","endpoint":{"host":"100.64.0.1","port":1},"adapters":[]}`), want: &routesDoc{
			SchemaVersion: 1, Deployments: []deployment{{Name: "d", Endpoint: deploymentEndpoint{Host: "100.64.0.1", Port: 1}}}, Routes: map[string]string{},
		}},
		{name: "unknown provider accepted by the reader", in: `{"routes":{"a":"nosuch/model"}}`, want: &routesDoc{
			SchemaVersion: 1, Deployments: []deployment{}, Routes: map[string]string{"a": "nosuch/model"},
		}},
		{name: "adapter as bare destination", in: regDoc(`{"lora":"qwen-lora"}`), want: func() *routesDoc {
			d, _ := parseRegistry([]byte(regDoc(`{}`)))
			d.Routes["lora"] = "qwen-lora"
			return d
		}()},

		{name: "unknown top-level field", in: `{"schema_version":1,"routes":{},"fallbacks":{"a":["b"]}}`,
			wantErr: `registry field "fallbacks" is not part of schema 1; run brama routes migrate`},
		{name: "empty top-level field name", in: `{"routes":{},"":{}}`, wantErr: `registry field "" is not part of schema 1; run brama routes migrate`},
		{name: "top-level field case differs", in: `{"Routes":{}}`, wantErr: `registry field "Routes" is not part of schema 1`},
		{name: "schema_version 2", in: `{"schema_version":2}`, wantErr: `schema_version 2 is not 1`},
		{name: "schema_version string", in: `{"schema_version":"1"}`, wantErr: `cannot unmarshal string into Go struct field routesDoc.schema_version of type int`},
		{name: "top level array", in: `[]`, wantErr: "cannot unmarshal array into Go value of type map"},
		{name: "top level null", in: `null`, wantErr: "must be one JSON object, not null"},
		{name: "not JSON", in: `{"routes":`, wantErr: "registry: EOF"},
		{name: "two top-level numbers", in: `00`, wantErr: "cannot unmarshal number"},
		{name: "nested deeper than the limit", in: `{"fallbacks":` + strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1) + `}`, wantErr: "nests deeper"},
		{name: "trailing value", in: `{} {}`, wantErr: "data after the JSON document"},
		{name: "invalid UTF-8", in: "{\"routes\":{\"a\":\"openai/\xff\"}}", wantErr: "not valid UTF-8"},
		{name: "larger than 1 MiB", in: `{"routes":{}}` + strings.Repeat(" ", maxRegistryBytes), wantErr: "limit is 1 MiB"},
		{name: "duplicate top-level key", in: `{"routes":{},"routes":{}}`, wantErr: `duplicate key "routes"`},
		{name: "duplicate alias", in: `{"routes":{"a":"best","a":"openai/x"}}`, wantErr: `duplicate key "a"`},
		{name: "duplicate alias by escape", in: `{"routes":{"a":"best","\u0061":"best"}}`, wantErr: `duplicate key "a"`},
		{name: "duplicate deployment member", in: regDeployment(`{"name":"d","name":"e","endpoint":{"host":"127.0.0.1","port":1}}`), wantErr: `duplicate key "name"`},
		{name: "duplicate in second deployment endpoint", in: `{"deployments":[{"name":"a","endpoint":{"host":"127.0.0.1","port":1}},{"name":"b","endpoint":{"host":"127.0.0.1","port":1,"port":2}}]}`, wantErr: `duplicate key "port"`},
		{name: "deployments null", in: `{"deployments":null}`, wantErr: `registry member "deployments" cannot be null`},
		{name: "routes null", in: `{"routes":null}`, wantErr: `registry member "routes" cannot be null`},
		{name: "schema_version null", in: `{"schema_version":null}`, wantErr: `registry member "schema_version" cannot be null`},
		{name: "deployment model null", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"model":null}`), wantErr: `registry member "model" cannot be null`},
		{name: "deployment adapters null", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"adapters":null}`), wantErr: `registry member "adapters" cannot be null`},
		{name: "destination null", in: regDoc(`{"a":null}`), wantErr: `route "a": destination "" is not 1-512 bytes of UTF-8 without control characters or surrounding space`},
		{name: "deployment null", in: regDeployment(`null`), wantErr: `deployment "": a deployment name must match`},
		{name: "fallback list as destination", in: `{"routes":{"chat":["openai/a","openai/b"]}}`, wantErr: `cannot unmarshal array into Go struct field routesDoc.routes of type string`},
		{name: "deployment not an object", in: regDeployment(`"qwen"`), wantErr: `cannot unmarshal string into Go struct field routesDoc.deployments of type main.deployment`},
		{name: "deployment without name", in: regDeployment(`{"endpoint":{"host":"127.0.0.1","port":1}}`), wantErr: `deployment "": a deployment name must match`},
		{name: "deployment unknown member", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"api_key":"x"}`), wantErr: `unknown field "api_key"`},
		{name: "deployment member case differs", in: regDeployment(`{"Name":"d","name":"d","endpoint":{"host":"127.0.0.1","port":1}}`), wantErr: `unknown member "Name" (member names are exact: "name")`},
		{name: "deployment member with an empty name", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"":1}`), wantErr: `unknown field ""`},
		{name: "endpoint member case differs", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","Port":1,"port":1}}`), wantErr: `unknown member "Port" (member names are exact: "port")`},
		{name: "adapter member case differs", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"adapters":[{"name":"l","Name":"l"}]}`), wantErr: `unknown member "Name" (member names are exact: "name")`},
		{name: "endpoint unknown member", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1,"tls":true}}`), wantErr: `unknown field "tls"`},
		{name: "endpoint missing", in: regDeployment(`{"name":"d"}`), wantErr: `deployment "d": endpoint host "" is not an IPv4 loopback`},
		{name: "endpoint public host", in: regDeployment(`{"name":"d","endpoint":{"host":"8.8.8.8","port":1}}`), wantErr: `deployment "d": endpoint host "8.8.8.8" is not an IPv4 loopback`},
		{name: "endpoint hostname", in: regDeployment(`{"name":"d","endpoint":{"host":"localhost","port":1}}`), wantErr: `endpoint host "localhost"`},
		{name: "endpoint IPv6 loopback", in: regDeployment(`{"name":"d","endpoint":{"host":"::1","port":1}}`), wantErr: `endpoint host "::1"`},
		{name: "endpoint beyond 100.64/10", in: regDeployment(`{"name":"d","endpoint":{"host":"100.128.0.1","port":1}}`), wantErr: `endpoint host "100.128.0.1"`},
		{name: "endpoint port zero", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":0}}`), wantErr: `deployment "d": endpoint port 0`},
		{name: "endpoint port too large", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":70000}}`), wantErr: `endpoint port 70000`},
		{name: "endpoint port fraction", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1.5}}`), wantErr: `cannot unmarshal number 1.5 into Go struct field deploymentEndpoint.deployments.endpoint.port of type int`},
		{name: "deployment name pattern", in: regDeployment(`{"name":"Qwen","endpoint":{"host":"127.0.0.1","port":1}}`), wantErr: `deployment "Qwen": a deployment name must match`},
		{name: "deployment names unique", in: `{"deployments":[{"name":"d","endpoint":{"host":"127.0.0.1","port":1}},{"name":"d","endpoint":{"host":"127.0.0.2","port":1}}]}`, wantErr: `deployment "d" is declared twice`},
		{name: "deployment empty model", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"model":""}`), wantErr: `registry member "model" cannot be ""`},
		{name: "adapter unknown member", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"adapters":[{"name":"l","path":"/x"}]}`), wantErr: `unknown field "path"`},
		{name: "adapter name pattern", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"adapters":[{"name":"L"}]}`), wantErr: `adapter "L": an adapter name must match`},
		{name: "alias pattern", in: regDoc(`{"Chat":"best"}`), wantErr: `alias "Chat" must match`},
		{name: "alias too long", in: regDoc(`{"` + strings.Repeat("a", 129) + `":"best"}`), wantErr: "must match [a-z0-9._/-]{1,128}"},
		{name: "alias any", in: regDoc(`{"any":"best"}`), wantErr: `alias "any" is a selector name`},
		{name: "alias any-vision-capable", in: regDoc(`{"any-vision-capable":"best"}`), wantErr: `alias "any-vision-capable" is a selector name`},
		{name: "alias best to best", in: regDoc(`{"best":"best"}`), wantErr: `route "best" must name a canonical route`},
		{name: "alias best to deployment", in: regDoc(`{"best":"qwen-local"}`), wantErr: `route "best" must name a canonical route of a subscription-capable provider, not "qwen-local"`},
		{name: "alias best to a deployment's canonical form", in: regDoc(`{"best":"local-openai/qwen-local"}`), wantErr: `route "best" must name a canonical route of a subscription-capable provider, not "local-openai/qwen-local"`},
		{name: "destination empty", in: regDoc(`{"a":""}`), wantErr: `route "a": destination "" is not 1-512 bytes of UTF-8 without control characters or surrounding space`},
		{name: "destination untrimmed", in: regDoc(`{"a":" openai/x"}`), wantErr: `route "a": destination " openai/x" is not 1-512 bytes of UTF-8 without control characters or surrounding space`},
		{name: "destination wildcard", in: regDoc(`{"a":"openai/*"}`), wantErr: `route "a": destination "openai/*" contains "*"`},
		{name: "destination control character", in: regDoc(`{"a":"openai/x\u0007"}`), wantErr: `route "a": destination "openai/x\a" is not 1-512 bytes of UTF-8 without control characters or surrounding space`},
		{name: "destination too long", in: regDoc(`{"a":"openai/` + strings.Repeat("m", 510) + `"}`), wantErr: `route "a": destination "openai/mmm`},
		{name: "destination too long, quoted as far as 512 bytes", in: regDoc(`{"a":"openai/` + strings.Repeat("m", 510) + `"}`),
			wantErr: `mmm" is not 1-512 bytes`},
		{name: "destination bad provider", in: regDoc(`{"a":"OpenAI/x"}`), wantErr: `route "a": destination "OpenAI/x" is not a canonical route`},
		{name: "destination empty model", in: regDoc(`{"a":"openai/"}`), wantErr: `route "a": destination "openai/" is not a canonical route: the provider must match [a-z0-9._-]{1,64} and the model be non-empty`},
		{name: "bare name matching nothing", in: regDoc(`{"a":"llama"}`), wantErr: `route "a": destination "llama" names 0 deployments or adapters; a bare name must name exactly one`},
		{name: "bare name matching two", in: `{"deployments":[{"name":"x","endpoint":{"host":"127.0.0.1","port":1}},{"name":"y","endpoint":{"host":"127.0.0.1","port":2},"adapters":[{"name":"x"}]}],"routes":{"a":"x"}}`, wantErr: `route "a": destination "x" names 2 deployments or adapters`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRegistry([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseRegistry error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseRegistry: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("document mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseRegistryUnknownFieldExactMessage(t *testing.T) {
	_, err := parseRegistry([]byte(`{"schema_version":1,"deployments":[],"routes":{},"fallbacks":{}}`))
	want := `registry field "fallbacks" is not part of schema 1; run brama routes migrate`
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want exactly %q", err, want)
	}
}

func TestEncodeRegistryCanonical(t *testing.T) {
	tests := []struct {
		name string
		doc  *routesDoc
		want string
	}{
		{name: "empty document", doc: emptyRoutesDoc(), want: "{\n  \"schema_version\": 1,\n  \"deployments\": [],\n  \"routes\": {}\n}\n"},
		{name: "routes sorted, optional members omitted", doc: &routesDoc{SchemaVersion: 1,
			Deployments: []deployment{{Name: "d", Endpoint: deploymentEndpoint{Host: "127.0.0.1", Port: 8000}}},
			Routes:      map[string]string{"z": "best", "a": "d"},
		}, want: `{
  "schema_version": 1,
  "deployments": [
    {
      "name": "d",
      "endpoint": {
        "host": "127.0.0.1",
        "port": 8000
      }
    }
  ],
  "routes": {
    "a": "d",
    "z": "best"
  }
}
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(encodeRegistry(tt.doc))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("encoding mismatch (-want +got):\n%s", diff)
			}
			back, err := parseRegistry([]byte(got))
			if err != nil {
				t.Fatalf("canonical bytes do not parse: %v", err)
			}
			if again := string(encodeRegistry(back)); again != got {
				t.Errorf("re-encoding changed the bytes:\n%s", again)
			}
		})
	}
}

func FuzzParseRegistry(f *testing.F) {
	f.Add([]byte(specRegistry))
	f.Add([]byte(""))
	f.Add([]byte(`{"schema_version":1,"routes":{},"fallbacks":{}}`))
	f.Add([]byte(`{"routes":{"a":"best","a":"openai/x"}}`))
	f.Add([]byte(regDoc(`{"a":"qwen-lora","b":"local-openai/qwen-local","best":"codex/gpt-5"}`)))
	f.Add([]byte(`{"deployments":[{"name":"d","endpoint":{"host":"100.64.0.1","port":1},"model":"m<&>","adapters":[]}],"routes":{"x":"nosuch/\u00e9\ud800"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := parseRegistry(data)
		if err != nil {
			return
		}
		enc := encodeRegistry(doc)
		back, err := parseRegistry(enc)
		if err != nil {
			t.Fatalf("accepted document re-encodes to bytes that do not parse: %v\n%s", err, enc)
		}
		if diff := cmp.Diff(doc, back); diff != "" {
			t.Fatalf("round trip changed the document (-first +second):\n%s", diff)
		}
		if again := encodeRegistry(back); string(again) != string(enc) {
			t.Fatalf("canonical encoding is not stable:\n%s\n%s", enc, again)
		}
	})
}

// registryPath is where main and routes migrate find the registry (SPEC §2.1).
func registryPath(st state, getenv func(string) string) (string, error) {
	return st.fileOrState(getenv, "BRAMA_ROUTES_FILE", registryRole, "routes.json")
}
