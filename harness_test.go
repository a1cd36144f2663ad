package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the server's logger and the test to
// share.
type syncBuffer struct {
	mu      sync.Mutex // guards b, written
	b       bytes.Buffer
	written chan struct{} // closed (and dropped) at each Write; made by waitFor
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written != nil {
		close(s.written)
		s.written = nil
	}
	return s.b.Write(p)
}

// waitFor returns once the buffer holds sub, failing t after 30 s.
func (s *syncBuffer) waitFor(t testing.TB, sub string) {
	t.Helper()
	limit := time.After(30 * time.Second)
	for {
		s.mu.Lock()
		if strings.Contains(s.b.String(), sub) {
			s.mu.Unlock()
			return
		}
		if s.written == nil {
			s.written = make(chan struct{})
		}
		written := s.written
		s.mu.Unlock()
		select {
		case <-written:
		case <-limit:
			t.Fatalf("no %q in the log after 30 s:\n%s", sub, s.String())
		}
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// daemon is a real `brama serve` started through run on 127.0.0.1:0.
type daemon struct {
	t      testing.TB
	url    string
	token  string // the admin token printed at first start ("" when a clients file existed)
	stderr *syncBuffer
	stdout *syncBuffer // what serve printed after its "listening on" line
	env    map[string]string
	stop   func() // cancels serve (the first signal) and waits for run to return nil
	cut    func() // the second signal: serve cuts what still runs
}

// testEnv returns a getenv over m (nothing from the real environment).
// Every outside address a test did not point at a fake is sealed off: the
// catalogue is off, and provider, usage and token URLs go to a closed
// loopback port, so no test can reach beyond this machine.
func testEnv(m map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := m[k]; ok {
			return v
		}
		switch {
		case k == "BRAMA_MODEL_CATALOG_URL":
			return "off"
		case strings.HasPrefix(k, "BRAMA_PROVIDER_") && (strings.HasSuffix(k, "_BASE_URL") || strings.HasSuffix(k, "_USAGE_URL")),
			strings.HasPrefix(k, "BRAMA_OAUTH_") && strings.HasSuffix(k, "_TOKEN_URL"):
			return "http://127.0.0.1:9"
		}
		return ""
	}
}

// startDaemon runs serve with env until the test ends, then checks that run
// returned nil after cancellation.
func startDaemon(t testing.TB, env map[string]string, stdin string, args ...string) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	cut := make(chan struct{})
	d := &daemon{t: t, stderr: &syncBuffer{}, stdout: &syncBuffer{}, env: env, cut: sync.OnceFunc(func() { close(cut) })}
	done := make(chan error, 1)
	go func() {
		err := run(ctx, cut, append([]string{"serve", "-addr", "127.0.0.1:0"}, args...), testEnv(env), strings.NewReader(stdin), pw, d.stderr)
		pw.CloseWithError(io.EOF)
		done <- err
	}()
	br := bufio.NewReader(pr)
	line, err := br.ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("serve did not start: %v; stderr:\n%s", <-done, d.stderr.String())
	}
	go io.Copy(d.stdout, br)
	d.url = strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
	if m := regexp.MustCompile(`bearer token \(shown once\): (\S+)`).FindStringSubmatch(d.stderr.String()); m != nil {
		d.token = m[1]
	}
	var once sync.Once
	d.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run returned %v after cancel", err)
			}
		})
	}
	t.Cleanup(d.stop)
	return d
}

// call makes one request and returns the status, headers and body.
func (d *daemon) call(method, path, token, body string, hdr ...string) (int, http.Header, []byte) {
	d.t.Helper()
	req, err := http.NewRequest(method, d.url+path, strings.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, b
}

// envelopeOf decodes an error body into a generic map and fails the test
// when it is not the SPEC §8.1 envelope.
func envelopeOf(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var env struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil || env.Error == nil {
		t.Fatalf("not an error envelope: %s", b)
	}
	for _, k := range []string{"message", "type", "code", "retryable"} {
		if _, ok := env.Error[k]; !ok {
			t.Errorf("envelope lacks %q: %s", k, b)
		}
	}
	return env.Error
}

// stateEnv is an environment with a fresh state directory.
func stateEnv(t testing.TB) map[string]string {
	return map[string]string{"BRAMA_STATE_DIR": filepath.Join(t.TempDir(), "state"), "BRAMA_MODEL_CATALOG_URL": "off"}
}

// assertOwnerOnly fails when any file under dir is readable or writable by
// group or other, or a directory is not 0700.
func assertOwnerOnly(t *testing.T, dir string) {
	t.Helper()
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Errorf("walk %s: %v", p, err)
			return nil
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %#o: readable or writable beyond its owner", p, fi.Mode().Perm())
		}
		return nil
	})
}

// assertNoSecret fails when secret appears in any file under dir (except
// the vault), or in logs.
func assertNoSecret(t *testing.T, secret, logs string, dirs ...string) {
	t.Helper()
	if secret == "" {
		t.Fatal("assertNoSecret with an empty secret proves nothing")
	}
	if strings.Contains(logs, secret) {
		t.Errorf("the planted secret appears in the logs")
	}
	for _, dir := range dirs {
		filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err != nil || fi.IsDir() || filepath.Base(p) == "vault.json" {
				return nil
			}
			b, _ := os.ReadFile(p)
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("the planted secret appears in %s", p)
			}
			return nil
		})
	}
}

// logsBesidesFirstStart drops the one stderr line that shows the first
// admin token on purpose (SPEC §3.1).
func logsBesidesFirstStart(stderr string) string {
	var keep []string
	for _, l := range strings.Split(stderr, "\n") {
		if !strings.Contains(l, "bearer token (shown once)") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// testClock is an injected clock the test moves by hand.
type testClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// openStream posts a streamed chat request and returns the open response;
// the caller reads and closes it.
func (d *daemon) openStream(path, token, body string) *http.Response {
	d.t.Helper()
	req, err := http.NewRequest("POST", d.url+path, strings.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// hangUpAfter sends req in the background, cancels it once started is
// closed (the provider has the call) and returns the client's error.
func hangUpAfter(req *http.Request, cancel context.CancelFunc, started <-chan struct{}) error {
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel()
	return <-errc
}

// cutAfterFlush sends what a fake provider wrote so far, then drops the
// connection: a body or stream cut mid-way.
func cutAfterFlush(w http.ResponseWriter) {
	w.(http.Flusher).Flush()
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
	}
}

// logEvent reports whether logs hold a JSON line of event msg whose members hold want's values (a string member
// holding the wanted text).
func logEvent(logs, msg string, want map[string]string) bool {
	for l := range strings.SplitSeq(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil || m["msg"] != msg {
			continue
		}
		if !slices.ContainsFunc(slices.Collect(maps.Keys(want)), func(k string) bool { return !strings.Contains(fmt.Sprint(m[k]), want[k]) }) {
			return true
		}
	}
	return false
}
