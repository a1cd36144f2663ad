package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// readiness is GET /readyz's body, as the tests read it.
type readiness struct {
	Ready    bool     `json:"ready"`
	Reasons  []string `json:"reasons"`
	Warnings []string `json:"warnings"`
}

// runCLI runs one brama command in-process and returns stdout, stderr and
// the exit code main would use.
func runCLI(t *testing.T, env map[string]string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(context.Background(), nil, args, testEnv(env), strings.NewReader(stdin), &out, &errb)
	code := exitCode(err, &errb)
	return out.String(), errb.String(), code
}

// addClient makes a client through the CLI and returns its token.
func addClient(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	out, errOut, code := runCLI(t, env, "", append([]string{"clients", "add"}, args...)...)
	if code != 0 {
		t.Fatalf("clients add %v: exit %d: %s", args, code, errOut)
	}
	return strings.TrimSpace(out)
}

// TestBearerAndAgentRefusals: who may call (SPEC §3.1); TestTokenHeaders
// holds the 401 messages.
func TestBearerAndAgentRefusals(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	if d.token == "" {
		t.Fatal("first start printed no admin token")
	}
	callerTok := addClient(t, env, "app")
	tests := []struct {
		name      string
		method    string
		path      string
		token     string
		hdr       []string
		wantCode  int
		wantErr   string
		wantAllow string // a 405's Allow, as the mux would send it (RFC 9110 §15.5.6); none elsewhere
	}{
		{name: "missing bearer", method: "GET", path: "/v1/aliases", wantCode: 401, wantErr: "unauthenticated"},
		{name: "other scheme", method: "GET", path: "/v1/aliases", hdr: []string{"Authorization", "Basic " + callerTok}, wantCode: 401, wantErr: "unauthenticated"},
		{name: "unknown bearer", method: "GET", path: "/v1/aliases", token: "brama_nope", wantCode: 401, wantErr: "unauthenticated"},
		{name: "repeated bearer", method: "GET", path: "/v1/aliases", token: callerTok, hdr: []string{"Authorization", "Bearer " + callerTok}, wantCode: 401, wantErr: "unauthenticated"},
		{name: "caller ok", method: "GET", path: "/v1/aliases", token: callerTok, wantCode: 200},
		{name: "caller on admin", method: "GET", path: "/v1/admin/routes", token: callerTok, wantCode: 403, wantErr: "forbidden"},
		{name: "admin on admin", method: "GET", path: "/v1/admin/routes", token: d.token, wantCode: 200},
		{name: "unknown path", method: "GET", path: "/v1/nothing", token: callerTok, wantCode: 404, wantErr: "not_found"},
		{name: "unknown path without auth", method: "POST", path: "/nope", wantCode: 404, wantErr: "not_found"},
		{name: "wrong method", method: "POST", path: "/health", wantCode: 405, wantErr: "method_not_allowed", wantAllow: "GET, HEAD"},
		{name: "wrong method on admin", method: "PATCH", path: "/v1/admin/routes", token: d.token, wantCode: 405, wantErr: "method_not_allowed", wantAllow: "DELETE, GET, HEAD, PUT"},
		{name: "health without auth", method: "GET", path: "/health", wantCode: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := d.call(tc.method, tc.path, tc.token, "", tc.hdr...)
			if status != tc.wantCode {
				t.Fatalf("status = %d, want %d: %s", status, tc.wantCode, body)
			}
			if hdr.Get("X-Request-Id") == "" {
				t.Errorf("no X-Request-Id")
			}
			if got := strings.Join(hdr.Values("Allow"), ", "); got != tc.wantAllow {
				t.Errorf("Allow = %q, want %q", got, tc.wantAllow)
			}
			if tc.wantErr == "" {
				return
			}
			e := envelopeOf(t, body)
			if e["code"] != tc.wantErr {
				t.Errorf("code = %v, want %s", e["code"], tc.wantErr)
			}
			if _, ok := e["attempts"]; ok {
				t.Errorf("refusal before dispatch carries attempts: %s", body)
			}
		})
	}
}

func TestTransportGuard(t *testing.T) {
	tests := []struct {
		name    string
		trusted string
		remote  string
		hdr     map[string]string
		want    bool
	}{
		{name: "loopback v4", remote: "127.0.0.1:5000", want: true},
		{name: "loopback v6", remote: "[::1]:5000", want: true},
		{name: "remote plain", remote: "192.0.2.7:5000", want: false},
		{name: "remote claims https, untrusted", remote: "192.0.2.7:5000", hdr: map[string]string{"X-Forwarded-Proto": "https"}, want: false},
		{name: "trusted proxy, https", trusted: "192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"X-Forwarded-Proto": "https"}, want: true},
		{name: "trusted proxy, Forwarded", trusted: "10.9.9.9, 192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"Forwarded": `for=1.2.3.4;proto="https"`}, want: true},
		{name: "trusted proxy, http", trusted: "192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"X-Forwarded-Proto": "http"}, want: false},
		// A proxy that appends: the client's forged https comes first, the
		// trusted proxy's own value last (RFC 7239 §4).
		{name: "trusted proxy appended http to a forged https", trusted: "192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"X-Forwarded-Proto": "https, http"}, want: false},
		{name: "trusted proxy added an http line after a forged https", trusted: "192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"X-Forwarded-Proto": "https\nhttp"}, want: false},
		{name: "trusted proxy added a Forwarded line after a forged https", trusted: "192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"Forwarded": "proto=https\nfor=192.0.2.9;proto=http"}, want: false},
		{name: "trusted proxy appended https to a client's http", trusted: "192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"X-Forwarded-Proto": "http, https"}, want: true},
		// The proxy sets one header and passes the client's other one on.
		{name: "trusted proxy's http beside a forged Forwarded https", trusted: "192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"X-Forwarded-Proto": "http", "Forwarded": "proto=https"}, want: false},
		{name: "trusted proxy's Forwarded http beside a forged https", trusted: "192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"X-Forwarded-Proto": "https", "Forwarded": "for=192.0.2.9;proto=http"}, want: false},
		{name: "trusted proxy, both https", trusted: "192.0.2.7", remote: "192.0.2.7:5000", hdr: map[string]string{"X-Forwarded-Proto": "https", "Forwarded": "proto=https"}, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := newTransportGuard(tc.trusted)
			if err != nil {
				t.Fatal(err)
			}
			r, _ := http.NewRequest("GET", "http://x/health", nil)
			r.RemoteAddr = tc.remote
			for k, lines := range tc.hdr {
				for _, v := range strings.Split(lines, "\n") { // one header line each
					r.Header.Add(k, v)
				}
			}
			if got := g.allows(r); got != tc.want {
				t.Errorf("allows = %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := newTransportGuard("not-an-ip"); err == nil {
		t.Error("a bad BRAMA_TRUSTED_PROXY_IPS entry was accepted")
	}
}

func TestClientsFileHoldsDigestsOnly(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	tok := addClient(t, env, "app", "-allow", "chat")
	if !strings.HasPrefix(tok, "brama_") || len(tok) != len("brama_")+43 {
		t.Errorf("token %q is not brama_ + 43 base64url characters", tok)
	}
	if status, _, body := d.call("GET", "/v1/aliases", tok, ""); status != 200 {
		t.Fatalf("new client refused: %d %s (the daemon must re-read clients.json on change)", status, body)
	}
	for _, secret := range []string{tok, d.token} {
		assertNoSecret(t, secret, logsBesidesFirstStart(d.stderr.String()), env["BRAMA_STATE_DIR"])
	}
	b, err := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], "clients.json"))
	if err != nil || !bytes.Contains(b, []byte(hexSHA256([]byte(tok)))) {
		t.Errorf("clients.json lacks the token's digest: %v", err)
	}
	assertOwnerOnly(t, env["BRAMA_STATE_DIR"])
}

func TestClientsFileRules(t *testing.T) {
	dig := strings.Repeat("a", 64)
	tests := []struct {
		name string
		doc  string
		want string // substring of the error; "" means valid
	}{
		{name: "valid", doc: `{"clients":[{"id":"local","token_sha256":"` + dig + `","role":"admin"}]}`},
		{name: "unknown field", doc: `{"clients":[{"id":"x","token_sha256":"` + dig + `","role":"admin","extra":1}]}`, want: "unknown field"},
		{name: "duplicate id", doc: `{"clients":[{"id":"x","token_sha256":"` + dig + `","role":"admin"},{"id":"x","token_sha256":"` + strings.Repeat("b", 64) + `","role":"admin"}]}`, want: "duplicate client id"},
		{name: "duplicate digest", doc: `{"clients":[{"id":"x","token_sha256":"` + dig + `","role":"admin"},{"id":"y","token_sha256":"` + dig + `","role":"admin"}]}`, want: "duplicate token digest"},
		{name: "bad id", doc: `{"clients":[{"id":"X!","token_sha256":"` + dig + `","role":"admin"}]}`, want: "must match"},
		{name: "wildcard allow", doc: `{"clients":[{"id":"x","token_sha256":"` + dig + `","role":"caller","allowed_models":["*"]}]}`, want: "wildcard"},
		{name: "empty allow", doc: `{"clients":[{"id":"x","token_sha256":"` + dig + `","role":"caller","allowed_models":[" "]}]}`, want: "wildcard"},
		{name: "bad role", doc: `{"clients":[{"id":"x","token_sha256":"` + dig + `","role":"root"}]}`, want: "role"},
		{name: "duplicate key", doc: `{"clients":[],"clients":[]}`, want: "duplicate key"},
		{name: "null clients", doc: `{"clients":null}`, want: `"clients" cannot be null`},
		{name: "no clients", doc: `{}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseClients([]byte(tc.doc))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("valid file refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %q", err, tc.want)
			}
		})
	}
}

func TestServeRefusesInvalidClientsFile(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"clients":[{"id":"x","token_sha256":"zz","role":"admin"}]}`, "token_sha256"},
		// null once read as "no file": serve replaced the file with a new admin client
		{`{"clients":null}`, `"clients" cannot be null`},
	} {
		env := stateEnv(t)
		name := filepath.Join(env["BRAMA_STATE_DIR"], "clients.json")
		os.MkdirAll(filepath.Dir(name), 0o700)
		os.WriteFile(name, []byte(tc.doc), 0o600)
		ctx, drained := context.WithCancel(context.Background())
		drained() // a serve that starts ends at once, failing the test rather than hanging it
		var errb bytes.Buffer
		code := exitCode(run(ctx, nil, []string{"serve", "-addr", "127.0.0.1:0"}, testEnv(env), strings.NewReader(""), new(bytes.Buffer), &errb), &errb)
		if errOut := errb.String(); code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("serve with clients file %s: exit %d, stderr %q; want exit 1 naming %q", tc.doc, code, errOut, tc.want)
		}
		if b, _ := os.ReadFile(name); string(b) != tc.doc {
			t.Errorf("serve rewrote the clients file %s: %s", tc.doc, b)
		}
	}
}

func TestSecondServeRefused(t *testing.T) {
	env := stateEnv(t)
	startDaemon(t, env, "")
	_, errOut, code := runCLI(t, env, "", "serve", "-addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errOut, "serve.lock") {
		t.Fatalf("second serve: exit %d, stderr %q; want exit 1 naming serve.lock", code, errOut)
	}
}

// A caller that hangs up right after reading a stream's terminal event (the
// Codex CLI does so after response.completed) had its whole answer: the log
// line says ok with its one call, not client_cancelled.
func TestHangUpAfterTheTerminalEventIsOK(t *testing.T) {
	// Translated streams end flushed (finish); a passthrough's last event is flushed as the handler returns.
	for _, fx := range protocolFixtures[:2] {
		t.Run(fx.provider, func(t *testing.T) {
			env := stateEnv(t)
			d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{fx.provider: fixtureProvider(t, fx)}), "-local-credentials-stdin")
			var waited atomic.Bool
			testingOnlyBeforeLog = func(r *http.Request) { <-r.Context().Done(); waited.Store(true) } // the hang-up lands before the log line
			defer func() { testingOnlyBeforeLog = nil }()
			resp := d.openStream("/v1/responses", d.token, chatBody(dialectResponses, fx.model, true, ""))
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() && !(strings.HasPrefix(sc.Text(), "data:") && strings.Contains(sc.Text(), `"response.completed"`)) {
			}
			resp.Body.Close() // the hang-up, the stream's 0-chunk never read
			d.stop()          // every request has written its log line
			if !waited.Load() {
				t.Error("the log line did not wait for the hang-up")
			}
			lines := requestLines(d.stderr.String(), "/v1/responses")
			if len(lines) != 1 || lines[0]["outcome"] != "ok" || lines[0]["attempts"] != float64(1) {
				t.Errorf("log line %v, want outcome ok after 1 call", lines)
			}
		})
	}
}

// TestEmptyAllowlistSurvivesRewrites: "allowed_models": [] allows no model (SPEC §3.1: when present, exact
// membership), and a rewrite of clients.json by another command keeps it so: it once came back absent (any model).
func TestEmptyAllowlistSurvivesRewrites(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	name := filepath.Join(env["BRAMA_STATE_DIR"], "clients.json")
	doc, err := parseClients(must(os.ReadFile(name)))
	if err != nil {
		t.Fatal(err)
	}
	tok := "brama_" + strings.Repeat("n", 43)
	app := `,{"id":"app","token_sha256":"` + hexSHA256([]byte(tok)) + `","role":"caller","allowed_models":[]}]}`
	if err := writeFileAtomic(name, bytes.Replace(must(json.Marshal(doc)), []byte("]}"), []byte(app), 1)); err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"hand-written", "after clients add"} {
		status, _, body := d.call("POST", "/v1/chat/completions", tok, `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`)
		if status != 403 || !bytes.Contains(body, []byte(`"forbidden"`)) {
			t.Errorf("%s: a client allowed no model got %d %s, want 403 forbidden", step, status, body)
		}
		addClient(t, env, "other"+strconv.Itoa(len(step)))
	}
	if !regexp.MustCompile(`"allowed_models": ?\[\]`).Match(must(os.ReadFile(name))) {
		t.Errorf("clients.json lost app's empty allowed_models")
	}
	if out, _, _ := runCLI(t, env, "", "clients", "list"); !regexp.MustCompile(`(?m)^app +caller +- +\(no model\)$`).MatchString(out) {
		t.Errorf("clients list does not show app allowed no model:\n%s", out)
	}
}

// TestClientsFileSpoiledWhileServing: a clients file that becomes unusable while serving (a hand edit) refuses every
// bearer 401, saying that no token can be checked and where to look, never which client a token was.
func TestClientsFileSpoiledWhileServing(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	if err := os.WriteFile(filepath.Join(env["BRAMA_STATE_DIR"], "clients.json"), []byte(`{"clients":[`), 0o600); err != nil {
		t.Fatal(err)
	}
	status, _, b := d.call("GET", "/v1/aliases", d.token, "")
	if e := envelopeOf(t, b); status != 401 || e["code"] != "unauthenticated" || !strings.Contains(string(b), "clients file is unusable") {
		t.Errorf("%d %s, want 401 unauthenticated saying the clients file is unusable", status, b)
	}
}
