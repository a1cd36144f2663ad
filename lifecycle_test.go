package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The daemon's life: start, readiness, shutdown (SPEC §2.3, §11.2, §13, §16).

// TestMaintainCutByShutdownIsNotOK: a pass the first stop signal cuts
// mid-read read nothing and failed nothing, yet it did not run to its end;
// POST /v1/admin/maintain must not answer it ok (brama maintain would exit 0).
func TestMaintainCutByShutdownIsNotOK(t *testing.T) {
	fake := newMaintProviderFake(t, &testClock{t: time.Now()})
	d, _ := maintDaemon(t, fake)
	d.stderr.waitFor(t, `"msg":"maintenance_pass_done"`) // the start pass, before any subscription
	arrived := make(chan struct{})
	fake.handle(fakeKimiUsage, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done() // a slow report: the read is still running at shutdown
	})
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"plantedKimiKey"}`)
	donatedID(t, status, b, "a1", "kimi")

	type answer struct {
		status int
		body   string
	}
	answered := make(chan answer, 1)
	go func() {
		status, _, b := d.call("POST", "/v1/admin/maintain", d.token, "")
		answered <- answer{status, string(b)}
	}()
	<-arrived
	stopped := make(chan struct{})
	go func() { d.stop(); close(stopped) }() // the first signal: the running request drains, the pass is cut
	got := <-answered
	if got.status == http.StatusOK {
		t.Fatalf("a pass cut by shutdown answered %d %s, want a refusal", got.status, got.body)
	}
	if e := envelopeOf(t, []byte(got.body)); e["code"] != "dependency_unavailable" {
		t.Errorf("envelope %v, want dependency_unavailable", e)
	}
	<-stopped // every goroutine has ended: the cut read recorded nothing
	if strings.Contains(d.stderr.String(), "usage_read_failed") {
		t.Errorf("the read cut by shutdown was recorded as failed:\n%s", d.stderr)
	}
}

// TestReadyzWarnsOfARelativeFileVariable: a relative BRAMA_ROUTES_FILE,
// BRAMA_VAULT_FILE or BRAMA_CLIENTS_FILE leaves that file without a place
// (README: §2.1's "no state directory", naming it); /readyz says so, as it
// does for the state directory, instead of nothing at all.
func TestReadyzWarnsOfARelativeFileVariable(t *testing.T) {
	for _, name := range []string{"BRAMA_ROUTES_FILE", "BRAMA_VAULT_FILE", "BRAMA_CLIENTS_FILE"} {
		t.Run(name, func(t *testing.T) {
			env := stateEnv(t)
			env[name] = "relative.json"
			d := startDaemon(t, env, "")
			_, _, b := d.call("GET", "/readyz", "", "")
			var rd readiness
			if err := json.Unmarshal(b, &rd); err != nil {
				t.Fatal(err)
			}
			want := name + " is not an absolute path"
			if !slices.ContainsFunc(rd.Warnings, func(w string) bool { return strings.Contains(w, want) }) || strings.Contains(string(b), "relative.json") {
				t.Errorf("/readyz %s, want a warning naming %s, not its value (a path outside the state directory)", b, want)
			}
		})
	}
}

// TestReadyzWarnsOfAnExposedStateDirectory: a state directory group or other
// may write, or another user owns, lets someone else remove the journal
// (bringing retired subscriptions back) or replace a file; the files' own
// guards cannot see it, so /readyz warns, naming the rule, not the path
// (SPEC §13). Without a state directory it warns with the cause.
func TestReadyzWarnsOfAnExposedStateDirectory(t *testing.T) {
	for _, tc := range []struct {
		mode  os.FileMode // 0: no state directory at all
		owner int         // chown the directory to this uid (as root only); 0: leave it
		want  string
	}{
		{0o700, 0, ""},
		{0o750, 0, ""},
		{0o770, 0, "the state directory has mode 0770"},
		{0o1777, 0, "the state directory has mode 0777"},
		{0o700, 65534, "the state directory is owned by uid 65534, not this process's uid 0, who may remove or replace its files"},
		{0, 0, "no state directory: $HOME is not defined"},
	} {
		env, dir := stateEnv(t), "\x00" // a path no answer holds
		if tc.mode == 0 {
			env = map[string]string{}
		} else {
			dir = env["BRAMA_STATE_DIR"]
			os.MkdirAll(dir, 0o700)
			os.Chmod(dir, tc.mode)
		}
		if tc.owner != 0 && os.Geteuid() != 0 {
			continue // only root gives a directory away
		} else if tc.owner != 0 {
			os.Chown(dir, tc.owner, tc.owner)
		}
		d := startDaemon(t, env, "")
		_, _, b := d.call("GET", "/readyz", "", "")
		var rd readiness
		if err := json.Unmarshal(b, &rd); err != nil {
			t.Fatal(err)
		}
		warned := slices.ContainsFunc(rd.Warnings, func(w string) bool { return strings.Contains(w, "state directory") })
		if tc.want == "" && warned || tc.want != "" && !slices.Contains(rd.Warnings, tc.want) && !slices.ContainsFunc(rd.Warnings,
			func(w string) bool { return strings.HasPrefix(w, tc.want+":") }) || strings.Contains(string(b), dir) {
			t.Errorf("mode %#o, owner %d: /readyz %s, want a warning %q (none when empty), without the path", tc.mode, tc.owner, b, tc.want)
		}
	}
}

// cancelOnWrite cancels its context at the first write: a serve that
// started listening when it should have refused ends instead of blocking.
type cancelOnWrite struct {
	syncBuffer
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.cancel()
	return w.syncBuffer.Write(p)
}

// TestServeRefusesABadAddr: an -addr that is empty, has no port or a port
// out of range is a usage error (exit 2, SPEC §16.1) naming the flag and why,
// before any state is touched; an empty one used to listen on every interface
// at a random port.
func TestServeRefusesABadAddr(t *testing.T) {
	for addr, why := range map[string]string{
		"":                "missing port in address",
		"8080":            "address 8080: missing port in address",
		"127.0.0.1:":      "no port",
		"127.0.0.1:99999": "address 99999: invalid port",
		"127.0.0.1:-1":    "address -1: invalid port",
	} {
		t.Run(addr, func(t *testing.T) {
			env := stateEnv(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stdout := &cancelOnWrite{cancel: cancel}
			var stderr bytes.Buffer
			err := run(ctx, nil, []string{"serve", "-addr", addr}, testEnv(env), strings.NewReader(""), stdout, &stderr)
			code := exitCode(err, &stderr)
			want := fmt.Sprintf("brama serve: -addr %q is not HOST:PORT to listen on (e.g. 127.0.0.1:8080): %s; "+
				"see brama serve -h\n", addr, why)
			if code != 2 || stderr.String() != want || stdout.String() != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2, stderr %q", code, stdout.String(), stderr.String(), want)
			}
			if _, err := os.Stat(env["BRAMA_STATE_DIR"]); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a refused serve touched the state directory: %v", err)
			}
		})
	}
}

// TestServeOnAPortInUse: the listener's refusal is exit 1 naming it (README).
func TestServeOnAPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	env := stateEnv(t)
	out, errOut, code := runCLI(t, env, "", "serve", "-addr", ln.Addr().String())
	if code != 1 || out != "" || !strings.Contains(errOut, "address already in use") {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 naming the address in use", code, out, errOut)
	}
	// The first admin client's token is shown once: not to a start that fails.
	if _, err := os.Stat(filepath.Join(env["BRAMA_STATE_DIR"], "clients.json")); !errors.Is(err, os.ErrNotExist) || strings.Contains(errOut, "shown once") {
		t.Errorf("a start on a port in use made the first admin client (%v), its token on stderr %q, where the next start shows none", err, errOut)
	}
}

// TestLogLevelInvalidIsLogged: a BRAMA_LOG_LEVEL slog cannot read falls
// back to info, as README says, but says so, as a bad …_SECS does; a
// level it reads, any case, or none says nothing.
func TestLogLevelInvalidIsLogged(t *testing.T) {
	for level, warned := range map[string]bool{"verbose": true, "2": true, "": false, "debug": false, " WARN ": false, "info+2": false} {
		var logs bytes.Buffer
		(&cliEnv{stderr: &logs, getenv: testEnv(map[string]string{"BRAMA_LOG_LEVEL": level})}).sys().log.Error("probe")
		if got := strings.Contains(logs.String(), `"msg":"log_level_invalid"`); got != warned {
			t.Errorf("BRAMA_LOG_LEVEL=%q: logged log_level_invalid %v, want %v:\n%s", level, got, warned, logs.String())
		}
	}
}

// TestMetricsCarryTheMaintenanceState: /metrics, the one exposition (SPEC
// §13), carries the maintenance state: passes, dropped requests, whether
// one runs or is pending, the armed due moment and how the last pass went.
func TestMetricsCarryTheMaintenanceState(t *testing.T) {
	fake := newMaintProviderFake(t, &testClock{t: time.Now()})
	d, _ := maintDaemon(t, fake)
	d.stderr.waitFor(t, `"msg":"maintenance_pass_done"`)
	expires := time.Now().Add(time.Hour).Truncate(time.Second)
	donateGrant(t, d, "plantedAccessCC", "plantedRefreshCC", expires.UnixMilli())
	if s, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); s != http.StatusOK {
		t.Fatalf("POST /v1/admin/maintain = %d %s", s, b)
	}
	var m map[string]float64
	for range 10000 { // the loop arms the due timer just after the pass answered
		if m = d.scrape(t); m["brama_maintenance_next_due_timestamp_seconds"] != 0 {
			break
		}
	}
	if due := m["brama_maintenance_next_due_timestamp_seconds"]; due > float64(expires.Unix()) || due < float64(expires.Add(-5*time.Minute).Unix()) ||
		m["brama_maintenance_passes_total"] < 2 || m["brama_maintenance_last_pass_ok"] != 1 || m["brama_maintenance_last_pass_finished_timestamp_seconds"] == 0 {
		t.Fatalf("/metrics maintenance = %v; want the grant's expiry %d next, two passes, the last ok", m, expires.Unix())
	}
	_, _, mb := d.call("GET", "/metrics", d.token, "")
	for _, want := range []string{
		"# TYPE brama_maintenance_passes_total counter\nbrama_maintenance_passes_total " + formatMetric(m["brama_maintenance_passes_total"]) + "\n",
		"# TYPE brama_maintenance_requests_dropped_total counter\nbrama_maintenance_requests_dropped_total 0\n",
		"# TYPE brama_maintenance_running gauge\nbrama_maintenance_running 0\n",
		"# TYPE brama_maintenance_pending gauge\nbrama_maintenance_pending 0\n",
		"# TYPE brama_maintenance_next_due_timestamp_seconds gauge\nbrama_maintenance_next_due_timestamp_seconds " + formatMetric(m["brama_maintenance_next_due_timestamp_seconds"]) + "\n",
	} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("/metrics lacks\n%s\nin\n%s", want, mb)
		}
	}
}

// TestLocalCredentialsRefuseABlankKey: -local-credentials-stdin with a
// provider whose key is empty or blank used to serve, /readyz ready with a
// payer that could pay nothing; it is refused naming the provider (exit 1),
// as credentials set refuses an empty key. So is null, which decoded to no
// map at all and put the vault's direct keys back in use (SPEC §16).
func TestLocalCredentialsRefuseABlankKey(t *testing.T) {
	env := stateEnv(t)
	if _, errOut, code := runCLI(t, env, "sk-vault\n", "credentials", "set", "openai"); code != 0 {
		t.Fatalf("credentials set: %s", errOut)
	}
	for stdin, want := range map[string]string{"sk-a\x00b\n": "printable", "\n": "empty"} { // as credentials set refuses
		if _, errOut, code := runCLI(t, env, stdin, "credentials", "set", "anthropic"); code != 1 || !strings.Contains(errOut, want) {
			t.Errorf("credentials set with stdin %q: exit %d, stderr %q; want exit 1 saying %q", stdin, code, errOut, want)
		}
	}
	if _, errOut, code := runCLI(t, env, "sk-x\n", "credentials", "set", "claude-code"); code != 1 || !strings.Contains(errOut, `"claude-code" is not a provider that takes a direct API key`) {
		t.Errorf("credentials set for a subscription provider: exit %d, stderr %q; want exit 1 naming the rule", code, errOut)
	}
	const planted = "sk-planted-local-0123456789" // no refusal quotes a key
	for stdin, want := range map[string]string{`{"openai":""}`: "empty", `{"openai":"k","anthropic":" \t"}`: "empty", "null": "JSON object",
		`{"openai":"sk-a\u0000b"}`: "printable", `["` + planted + `"]`: "cannot unmarshal",
		`{"openai":"` + planted + `"} {"anthropic":"` + planted + `"}`: "data after the JSON document",
		`{"nobody":"` + planted + `"}`:                                 `"nobody" is not a provider that takes a direct API key`,
		`{"claude-code":"` + planted + `"}`:                            `"claude-code" is not a provider that takes a direct API key`} {
		ctx, cancel := context.WithCancel(context.Background())
		stdout := &cancelOnWrite{cancel: cancel} // a serve that listens ends at once
		var stderr bytes.Buffer
		err := run(ctx, nil, []string{"serve", "-addr", "127.0.0.1:0", "-local-credentials-stdin"}, testEnv(env), strings.NewReader(stdin), stdout, &stderr)
		cancel()
		code := exitCode(err, &stderr)
		out, errOut := stdout.String(), stderr.String()
		if code != 1 || out != "" || !strings.Contains(errOut, "-local-credentials-stdin") || !strings.Contains(errOut, want) {
			t.Errorf("stdin %s: exit %d, stdout %q, stderr %q; want exit 1 saying %q", stdin, code, out, errOut, want)
		}
		if strings.Contains(errOut, planted) {
			t.Errorf("stdin %s: the refusal quotes the key: %s", stdin, errOut)
		}
	}
}

// TestLocalCredentialsTrimAKeysNewline: a key read from a file keeps its
// newline (`jq -Rs '{openai:.}' < key`); serve takes it trimmed, as
// `credentials set` does, instead of failing every call 503.
func TestLocalCredentialsTrimAKeysNewline(t *testing.T) {
	prov := newRecordingProvider(t, protocolFixtures[0].buffered, "")
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = prov.URL
	d := startDaemon(t, env, `{"openai":"sk-from-a-file\n"}`, "-local-credentials-stdin")
	status, _, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", false, ""))
	if got := prov.last(t).header.Get("Authorization"); status != 200 || got != "Bearer sk-from-a-file" {
		t.Errorf("%d %s, provider saw Authorization %q; want 200 with the key trimmed", status, body, got)
	}
}

// TestShutdownPerfFlushFailureIsLogged: serve's last perf.json write, at
// shutdown, logs perf_stats_flush_failed when it fails, as every other
// write of it does, instead of losing the numbers without a word.
func TestShutdownPerfFlushFailureIsLogged(t *testing.T) {
	fake := fixtureProvider(t, protocolFixtures[0])
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	if s, _, b := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", false, "")); s != 200 {
		t.Fatalf("chat: %d %s", s, b)
	}
	perf := filepath.Join(env["BRAMA_STATE_DIR"], "perf.json")
	if err := os.Remove(perf); err != nil { // written at the first request
		t.Fatal(err)
	}
	if err := os.Mkdir(perf, 0o700); err != nil { // no file can replace a directory
		t.Fatal(err)
	}
	d.stop()
	if !strings.Contains(d.stderr.String(), `"msg":"perf_stats_flush_failed"`) {
		t.Errorf("the failed shutdown flush of perf.json left no log line:\n%s", d.stderr.String())
	}
}
