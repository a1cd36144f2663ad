package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// fakeJWT builds an unsigned JWT with claims (import reads claims only).
func fakeJWT(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(claims)) + ".sig"
}

func TestParseImportFile(t *testing.T) {
	access := fakeJWT(`{"exp":1790000000}`)
	idTok := fakeJWT(`{"https://api.openai.com/auth":{"chatgpt_account_id":"acct-from-jwt"}}`)
	tests := []struct {
		name     string
		provider string
		file     string
		want     oauthGrant
		wantErr  string
	}{
		{name: "claude-code", provider: "claude-code",
			file: `{"claudeAiOauth":{"accessToken":"sk-ant-oat01-a","refreshToken":"sk-ant-ort01-r","expiresAt":1790000000000,"scopes":["user:inference"],"subscriptionType":"max"}}`,
			want: oauthGrant{AccessToken: "sk-ant-oat01-a", RefreshToken: "sk-ant-ort01-r", ExpiresAtMs: 1790000000000}},
		{name: "claude-code without expiry", provider: "claude-code",
			file: `{"claudeAiOauth":{"accessToken":"a","refreshToken":"r"}}`,
			want: oauthGrant{AccessToken: "a", RefreshToken: "r"}},
		{name: "codex with account id", provider: "codex",
			file: `{"OPENAI_API_KEY":null,"tokens":{"id_token":"` + idTok + `","access_token":"` + access + `","refresh_token":"rt","account_id":"acct-1"},"last_refresh":"2026-01-01T00:00:00Z"}`,
			want: oauthGrant{AccessToken: access, RefreshToken: "rt", IDToken: idTok, AccountID: "acct-1", ExpiresAtMs: 1790000000000}},
		{name: "codex account from id_token", provider: "codex",
			file: `{"tokens":{"id_token":"` + idTok + `","access_token":"opaque","refresh_token":"rt"}}`,
			want: oauthGrant{AccessToken: "opaque", RefreshToken: "rt", IDToken: idTok, AccountID: "acct-from-jwt"}},
		{name: "claude file given as codex", provider: "codex", file: `{"claudeAiOauth":{"accessToken":"a","refreshToken":"r"}}`, wantErr: "no tokens object"},
		{name: "codex file given as claude-code", provider: "claude-code", file: `{"tokens":{"access_token":"a","refresh_token":"r"}}`, wantErr: "no claudeAiOauth object"},
		{name: "no refresh token", provider: "claude-code", file: `{"claudeAiOauth":{"accessToken":"a"}}`, wantErr: "oauth needs access_token and refresh_token"},
		{name: "negative expiry", provider: "claude-code", file: `{"claudeAiOauth":{"accessToken":"a","refreshToken":"r","expiresAt":-5}}`, wantErr: "negative"},
		{name: "expiry not a number", provider: "claude-code", file: `{"claudeAiOauth":{"accessToken":"a","refreshToken":"r","expiresAt":"soon"}}`, wantErr: "expiresAt"},
		{name: "not JSON, token not quoted", provider: "codex", file: `{"tokens":{"access_token":"sk-secret-0123456789" "x"}}`, wantErr: "syntax error at byte"},
		{name: "token not a string, not quoted", provider: "claude-code", file: `{"claudeAiOauth":{"accessToken":90123456789,"refreshToken":"r"}}`,
			wantErr: "member claudeAiOauth.accessToken is not a string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := parseImportFile(tc.provider, []byte(tc.file))
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, errImportFile) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want errImportFile naming %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "sk-secret") || strings.Contains(err.Error(), "90123456789") {
					t.Errorf("the error quotes a token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g != tc.want {
				t.Errorf("grant = %+v\nwant    %+v", g, tc.want)
			}
		})
	}
}

// FuzzParseImportFile: no panic, every refusal is errImportFile, and an
// accepted grant has both tokens and passes the donation check.
func FuzzParseImportFile(f *testing.F) {
	f.Add(false, []byte(`{"claudeAiOauth":{"accessToken":"a","refreshToken":"r","expiresAt":1790000000000}}`))
	f.Add(true, []byte(`{"tokens":{"id_token":"x.eyJleHAiOjF9.y","access_token":"a.eyJleHAiOjE3OTAwMDAwMDB9.s","refresh_token":"r"}}`))
	f.Add(true, []byte(`{"tokens":null}`))
	f.Fuzz(func(t *testing.T, codex bool, data []byte) {
		provider := "claude-code"
		if codex {
			provider = "codex"
		}
		g, err := parseImportFile(provider, data)
		if err != nil {
			if !errors.Is(err, errImportFile) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		if g.AccessToken == "" || g.RefreshToken == "" || g.ExpiresAtMs < 0 {
			t.Fatalf("accepted an unusable grant: %+v", g)
		}
		if _, err := checkCredential(provider, vaultCredential{OAuth: &g}); err != nil {
			t.Fatalf("accepted grant fails the donation check: %v", err)
		}
	})
}

// TestGatewayRefusesPlainHTTPToARemoteHost: the CLIs that call the daemon
// send its admin bearer (and API keys, OAuth grants) only over https:// or
// to a loopback host, the rule SPEC §6.1 sets for provider URLs; serve
// refuses a plain-http peer that is not loopback anyway (§3.3).
func TestGatewayRefusesPlainHTTPToARemoteHost(t *testing.T) {
	env := map[string]string{"BRAMA_TOKEN": "brama_planted-gateway-bearer"}
	for _, gw := range []string{"http://gateway.invalid:8080", "http://192.0.2.1:8080"} {
		_, errOut, code := runCLI(t, env, "", "subscription", "list", "-agent", "a1", "-gateway", gw)
		if code != 2 || !strings.Contains(errOut, "loopback") {
			t.Errorf("-gateway %s: exit %d %q; want 2 before any connection", gw, code, errOut)
		}
	}
	for _, gw := range []string{"http://localhost:1", "http://[::1]:1", "https://127.0.0.1:1"} {
		if _, errOut, code := runCLI(t, env, "", "subscription", "list", "-agent", "a1", "-gateway", gw); code != 1 || !strings.Contains(errOut, "cannot reach the gateway") {
			t.Errorf("-gateway %s: exit %d %q; want it tried (1: cannot reach)", gw, code, errOut)
		}
	}
}

// TestCommandTable: every row of the CLI table is listed by `brama help`
// with its purpose; its -h prints usage, purpose, flags and example on
// stdout (exit 0); a stray flag and a wrong positional count are usage
// errors (exit 2) naming its help; `brama version` and `brama -version`
// print the version GET /health reports.
func TestCommandTable(t *testing.T) {
	env := stateEnv(t)
	list, _, code := runCLI(t, env, "", "help")
	if code != 0 {
		t.Fatalf("brama help: exit %d", code)
	}
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(c.name) + ` +` + regexp.QuoteMeta(c.purpose) + `$`).MatchString(list) {
				t.Errorf("brama help lacks the line %q: %q", c.name+"  "+c.purpose, list)
			}
			if !strings.Contains(c.example, "brama "+c.name) || strings.Contains(c.purpose, "\n") {
				t.Errorf("row %q: example %q is not of it, or purpose %q is not one line", c.name, c.example, c.purpose)
			}
			words := strings.Fields(c.name)
			out, errOut, code := runCLI(t, env, "", append(words, "-h")...)
			if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: brama "+c.name+" "+c.args+"\n") ||
				!strings.Contains(out, c.purpose) || !strings.HasSuffix(out, "example:\n  "+c.example+"\n") {
				t.Errorf("-h: exit %d, stderr %q, stdout %q; want exit 0 and usage, purpose, flags, example on stdout", code, errOut, out)
			}
			if hasFlags := strings.Contains(out, "\n\nflags:\n"); hasFlags != (len(c.flags) > 0) {
				t.Errorf("-h prints a flags: heading %v, want it exactly when the command has flags: %q", hasFlags, out)
			}
			for _, f := range c.need {
				if !strings.Contains(out, "  -"+f+" ") {
					t.Errorf("-h names no required -%s: %q", f, out)
				}
			}
			see := "; see brama " + c.name + " -h\n"
			for _, args := range [][]string{
				append(words, "-no-such-flag"),
				append(words, slices.Repeat([]string{"x"}, c.pos+1)...),
			} {
				out, errOut, code := runCLI(t, env, "", args...)
				if code != 2 || out != "" || !strings.HasPrefix(errOut, "brama "+c.name+": ") || !strings.HasSuffix(errOut, see) {
					t.Errorf("brama %v: exit %d, stdout %q, stderr %q; want exit 2 naming %q", args, code, out, errOut, see)
				}
			}
		})
	}
	d := startDaemon(t, env, "")
	_, _, body := d.call("GET", "/health", "", "")
	var health struct{ Version string }
	if err := json.Unmarshal(body, &health); err != nil || health.Version == "" {
		t.Fatalf("/health = %s", body)
	}
	for _, arg := range []string{"version", "-version"} {
		if out, _, code := runCLI(t, env, "", arg); code != 0 || out != "brama "+health.Version+"\n" {
			t.Errorf("brama %s: exit %d %q; want the version /health reports, %q", arg, code, out, health.Version)
		}
	}
}

// TestCLIRefusals: `brama` alone prints the list as a usage error; a run function's usage error names its
// command's help; a refusal prints its cause and nothing on stdout (no table of a file that cannot be read, no
// "removed 0" without a state directory); a bad -older-than removes nothing.
func TestCLIRefusals(t *testing.T) {
	env := stateEnv(t)
	help, _, _ := runCLI(t, env, "", "help")
	if !strings.HasPrefix(help, "usage: brama COMMAND [flags] [arguments]; brama COMMAND -h prints its flags and an example\n\n  serve ") {
		t.Errorf("brama help = %q, want the usage line, a blank line, then the commands", help)
	}
	broken := filepath.Join(t.TempDir(), "broken.json")
	os.WriteFile(broken, []byte("{"), 0o600)
	for _, f := range []string{"BRAMA_CLIENTS_FILE", "BRAMA_ROUTES_FILE", "BRAMA_VAULT_FILE"} {
		env[f] = broken
	}
	prune := "brama answers prune: want a -older-than of zero or more (a duration such as 720h); see brama answers prune -h\n"
	signIn := []string{"subscription", "sign-in", "-agent", "a1", "-provider"}
	for _, tc := range []struct {
		env            map[string]string
		args           []string
		code           int
		stderr, suffix string // stderr exactly, or ending in suffix
	}{
		{env: env, args: nil, code: 2, stderr: help + "brama: want a command\n"},
		{env: env, args: []string{"answers", "prune", "-older-than", "a while"}, code: 2, stderr: prune},
		{env: env, args: []string{"answers", "prune", "-older-than", "-1h"}, code: 2, stderr: prune},
		{env: map[string]string{}, args: []string{"answers", "prune", "-older-than", "1h"}, code: 1,
			stderr: "brama: signed answers has no state directory: $HOME is not defined\n"},
		{env: env, args: append(signIn, "kimi"), code: 2, stderr: `brama subscription sign-in: -provider "kimi" has no sign-in (claude-code or codex); ` +
			"donate its grant or replace it with PUT …/credential; see brama subscription sign-in -h\n"},
		{env: env, args: append(signIn, "codex", "-id", "sub_0123456789abcdef", "-label", "laptop"), code: 2,
			stderr: "brama subscription sign-in: -label names a new subscription; with -id the subscription keeps its label; see brama subscription sign-in -h\n"},
		{env: env, args: []string{"clients", "list"}, code: 1, stderr: "brama: clients file: EOF\n"},
		{env: env, args: []string{"deployments", "list"}, code: 1, suffix: "\nbrama: registry: EOF\n"}, // after the warning
		{env: env, args: []string{"credentials", "list"}, code: 1, stderr: "brama: vault: EOF\n"},
	} {
		out, errOut, code := runCLI(t, tc.env, "", tc.args...)
		if code != tc.code || out != "" || tc.stderr != "" && errOut != tc.stderr || !strings.HasSuffix(errOut, tc.suffix) {
			t.Errorf("brama %q: exit %d, stdout %q, stderr %q; want exit %d, no stdout, stderr %q%q",
				tc.args, code, out, errOut, tc.code, tc.stderr, tc.suffix)
		}
	}
}

// TestSubscriptionListTable: a row's USED is its fullest window's fraction (marked when the row is stale), "-"
// without windows; the agent is sent as one escaped path segment, whatever it holds.
func TestSubscriptionListTable(t *testing.T) {
	asked := make(chan string, 2)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked <- r.RequestURI
		w.Write([]byte(`{"subscriptions":[
			{"id":"sub_1","provider":"claude-code","status":"active","label":"laptop","credential":{"state":"active"},"stale":true,
			 "windows":[{"id":"anthropic:5h","used_fraction":0.8},{"id":"anthropic:7d","used_fraction":0.25}]},
			{"id":"sub_2","provider":"codex","status":"active","windows":[{"id":"codex:5h","used_fraction":0.5}]},
			{"id":"sub_3","provider":"kimi","status":"retired","credential":{"state":"disabled"},"windows":[]}]}`))
	}))
	defer gw.Close()
	out, errOut, code := runCLI(t, map[string]string{"BRAMA_TOKEN": "brama_t"}, "", "subscription", "list", "-agent", "a1/x?y", "-gateway", gw.URL)
	want := "ID     PROVIDER     STATUS   CREDENTIAL  USED         LABEL\n" +
		"sub_1  claude-code  active   active      80% (stale)  laptop\n" +
		"sub_2  codex        active   -           50%          -\n" +
		"sub_3  kimi         retired  disabled    -            -\n" +
		"3 subscription(s), 1 retired\n"
	if code != 0 || out != want {
		t.Errorf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", code, errOut, out, want)
	}
	if len(asked) != 1 {
		t.Fatalf("the gateway was asked %d times, want once", len(asked))
	} else if uri := <-asked; uri != "/v1/admin/subscriptions/a1%2Fx%3Fy" {
		t.Errorf("the gateway was asked for %q, want the agent as one escaped segment", uri)
	}
}

// TestCLIGatewayAnswers: an admin command quotes the gateway's envelope; an answer that is not what Brama's route
// answers (another server's 404 page, a 200 of another shape) is named so, quoting nothing of it.
func TestCLIGatewayAnswers(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   string
	}{
		{404, "<html>Not Found</html>", "brama: the gateway answered 404 unknown: not what Brama's GET /v1/admin/subscriptions/a1 answers\n"},
		{200, `[1,2]`, "brama: the gateway answered 200 unknown: not what Brama's GET /v1/admin/subscriptions/a1 answers\n"},
		{502, `{"message":"upstream connect error"}`, "brama: the gateway answered 502 unknown: not what Brama's GET /v1/admin/subscriptions/a1 answers\n"},
		{200, `{"error":{"code":"x","message":"a 2xx of another shape"},"subscriptions":7}`,
			"brama: the gateway answered 200 unknown: not what Brama's GET /v1/admin/subscriptions/a1 answers\n"},
		{503, `{"error":{"code":"dependency_unavailable","message":"the vault is unreadable"}}`,
			"brama: the gateway answered 503 dependency_unavailable: the vault is unreadable\n"},
	} {
		gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			w.Write([]byte(tc.body))
		}))
		out, errOut, code := runCLI(t, map[string]string{"BRAMA_TOKEN": "brama_t"}, "", "subscription", "list", "-agent", "a1", "-gateway", gw.URL)
		gw.Close()
		if code != 1 || out != "" || errOut != tc.want {
			t.Errorf("gateway answering %d %s: exit %d, stdout %q, stderr %q; want exit 1 and %q", tc.status, tc.body, code, out, errOut, tc.want)
		}
	}
	// A donation's 201 that names no subscription is no donation the command can report.
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		w.Write([]byte(`{"subscription":{"provider":"kimi","status":"active"}}`))
	}))
	defer gw.Close()
	out, errOut, code := runCLI(t, map[string]string{"BRAMA_TOKEN": "brama_t"}, "sk-kimi-0123456789\n", "subscription", "add", "-provider", "kimi", "-agent", "a1", "-gateway", gw.URL)
	if code != 1 || out != "" || errOut != "brama: the gateway's answer names no subscription\n" {
		t.Errorf("a 201 naming no subscription: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestClientsAddRefusesATakenID: `brama clients add` prints the token alone on stdout and says on stderr that it is
// shown once; a second add of that id is refused by the clients file's validation, which every write passes before it
// is written, says nothing of a token, and the file keeps the first client alone.
func TestClientsAddRefusesATakenID(t *testing.T) {
	env := stateEnv(t)
	out, errOut, code := runCLI(t, env, "", "clients", "add", "app")
	if !strings.HasPrefix(out, "brama_") || strings.Count(out, "\n") != 1 ||
		!strings.Contains(errOut, `brama: created caller client "app"; bearer token (shown once) on stdout`) {
		t.Fatalf("first add: exit %d, stdout %q, stderr %q; want the token alone on stdout, stderr saying it is shown once", code, out, errOut)
	}
	name := filepath.Join(env["BRAMA_STATE_DIR"], "clients.json")
	before, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCLI(t, env, "", "clients", "add", "app")
	if after, _ := os.ReadFile(name); code != 1 || out != "" || !strings.Contains(errOut, "duplicate client id") ||
		strings.Contains(errOut, "shown once") || string(before) != string(after) {
		t.Errorf("second add: exit %d, stdout %q, stderr %q; want exit 1 naming the duplicate, no token, the file unchanged", code, out, errOut)
	}
}
