package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// oauthSubID is the subscription every OAuth test refreshes.
const oauthSubID = "sub_0123456789abcdef"

// oauthNow is the injected clock of every OAuth test.
var oauthNow = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// oauthFixture is an oauthClient over a t.TempDir() vault and ledger, with
// its log kept for grepping.
type oauthFixture struct {
	dir       string
	o         *oauthClient
	v         *vault
	l         *ledger
	vaultPath string
	logs      *syncBuffer
}

// oauthLogWriter sends log lines to t.Logf too.
type oauthLogWriter struct{ t *testing.T }

func (w oauthLogWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newOAuthFixture points provider's token endpoint at tokenURL ("" keeps
// the built-in one).
func newOAuthFixture(t *testing.T, provider, tokenURL string) *oauthFixture {
	t.Helper()
	dir := t.TempDir()
	env := map[string]string{}
	if tokenURL != "" {
		env["BRAMA_OAUTH_"+strings.ToUpper(strings.ReplaceAll(provider, "-", "_"))+"_TOKEN_URL"] = tokenURL
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(logs, oauthLogWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	now := func() time.Time { return oauthNow }
	f := &oauthFixture{dir: dir, vaultPath: filepath.Join(dir, "vault.json"), logs: logs}
	f.v = newVault(f.vaultPath, nil)
	f.l = newLedger(state{dir: dir}, log, now)
	f.o = newOAuth(testEnv(env), newProviderClient(), f.v, f.l, log, now)
	t.Cleanup(f.o.wg.Wait) // no refresh outlives its test
	return f
}

// seed stores g as subscription id's grant.
func (f *oauthFixture) seed(t *testing.T, id string, g oauthGrant) {
	t.Helper()
	err := f.v.update(func(d *vaultDoc) error {
		d.Subscriptions[id] = vaultCredential{OAuth: &g}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// stored reads subscription id's grant from the vault file itself.
func (f *oauthFixture) stored(t *testing.T, id string) oauthGrant {
	t.Helper()
	doc, _, err := readVault(f.vaultPath)
	if err != nil {
		t.Fatal(err)
	}
	g := doc.Subscriptions[id].OAuth
	if g == nil {
		t.Fatalf("vault holds no grant for %s", id)
	}
	return *g
}

// fakeTokenEndpoint is a real HTTP token endpoint serving h at /token.
func fakeTokenEndpoint(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// testJWT builds an unsigned JWT carrying claims.
func testJWT(claims map[string]any) string {
	b, _ := json.Marshal(claims)
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"alg":"none"}`)) + "." + enc.EncodeToString(b) + "." + enc.EncodeToString([]byte("sig"))
}

// tokenRequest is what a fake endpoint saw, from a JSON or form body.
func tokenRequest(t *testing.T, r *http.Request) (ctype string, fields map[string]string) {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Errorf("reading token request: %v", err)
	}
	fields = map[string]string{}
	ctype = r.Header.Get("Content-Type")
	if ctype == "application/json" {
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Errorf("token request is not a JSON object of strings: %v", err)
		}
		return ctype, fields
	}
	q, err := url.ParseQuery(string(b))
	if err != nil {
		t.Errorf("token request is not a form: %v", err)
	}
	for k := range q {
		fields[k] = q.Get(k)
	}
	return ctype, fields
}

func TestRefreshSuccess(t *testing.T) {
	exp := oauthNow.Add(2 * time.Hour).Unix()
	idToken := testJWT(map[string]any{"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "acct-42"}})
	jwtAccess := testJWT(map[string]any{"exp": exp})
	tests := []struct {
		name      string
		provider  string
		old       oauthGrant
		answer    map[string]any
		wantCtype string
		wantGrant oauthGrant
	}{
		{
			name:      "claude-code JSON body, expires_in, new refresh token",
			provider:  "claude-code",
			old:       oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old", ExpiresAtMs: 1},
			answer:    map[string]any{"access_token": "at-new", "refresh_token": "rt-new", "expires_in": 3600, "token_type": "Bearer"},
			wantCtype: "application/json",
			wantGrant: oauthGrant{AccessToken: "at-new", RefreshToken: "rt-new", ExpiresAtMs: oauthNow.Add(time.Hour).UnixMilli()},
		},
		{
			name:      "codex form body, JWT exp, account id from the id_token, refresh token kept",
			provider:  "codex",
			old:       oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old", ExpiresAtMs: 1},
			answer:    map[string]any{"access_token": jwtAccess, "id_token": idToken},
			wantCtype: "application/x-www-form-urlencoded",
			wantGrant: oauthGrant{AccessToken: jwtAccess, RefreshToken: "rt-old", IDToken: idToken, AccountID: "acct-42", ExpiresAtMs: exp * 1000},
		},
		{
			name:      "codex keeps a stored account id and id_token",
			provider:  "codex",
			old:       oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old", IDToken: "id-old", AccountID: "acct-old"},
			answer:    map[string]any{"access_token": "at-new", "expires_in": "60"},
			wantCtype: "application/x-www-form-urlencoded",
			wantGrant: oauthGrant{AccessToken: "at-new", RefreshToken: "rt-old", IDToken: "id-old", AccountID: "acct-old", ExpiresAtMs: oauthNow.Add(time.Minute).UnixMilli()},
		},
		{
			name:      "kimi form body, opaque token: expiry unknown",
			provider:  "kimi",
			old:       oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old", ExpiresAtMs: 5},
			answer:    map[string]any{"access_token": "at-new", "refresh_token": "rt-new"},
			wantCtype: "application/x-www-form-urlencoded",
			wantGrant: oauthGrant{AccessToken: "at-new", RefreshToken: "rt-new"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := lookupProvider(tc.provider)
			srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
				ctype, fields := tokenRequest(t, r)
				if ctype != tc.wantCtype || r.URL.Path != "/token" || r.Method != http.MethodPost {
					t.Errorf("request %s %s as %q, want POST /token as %q", r.Method, r.URL.Path, ctype, tc.wantCtype)
				}
				want := map[string]string{"grant_type": "refresh_token", "refresh_token": tc.old.RefreshToken, "client_id": p.clientID}
				if diff := cmp.Diff(want, fields); diff != "" {
					t.Errorf("token request fields (-want +got):\n%s", diff)
				}
				writeJSON(w, http.StatusOK, tc.answer)
			})
			f := newOAuthFixture(t, tc.provider, srv.URL+"/token")
			f.seed(t, oauthSubID, tc.old)
			g, err := f.o.refresh(context.Background(), oauthSubID, tc.provider, "")
			if err != nil {
				t.Fatalf("refresh: %v", err)
			}
			if diff := cmp.Diff(tc.wantGrant, g); diff != "" {
				t.Errorf("grant (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantGrant, f.stored(t, oauthSubID)); diff != "" {
				t.Errorf("vault grant (-want +got):\n%s", diff)
			}
			if fi, err := os.Stat(f.vaultPath); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("vault file: %v, mode %v; want 0600", err, fi.Mode().Perm())
			}
			e := f.l.entry(oauthSubID)
			c := e.Credential
			if c.State != credActive || c.ExpiresAtMs != tc.wantGrant.ExpiresAtMs || c.RefreshedAtMs != oauthNow.UnixMilli() {
				t.Errorf("ledger credential = %+v, want active, expires %d, refreshed %d", c, tc.wantGrant.ExpiresAtMs, oauthNow.UnixMilli())
			}
			if !strings.Contains(f.logs.String(), `"msg":"credential_refresh_ok"`) {
				t.Errorf("no credential_refresh_ok in the log")
			}
		})
	}
}

// hijackPartial answers status with headers promising more body than it
// sends, then closes the connection.
func hijackPartial(status int, partial string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n%s", status, http.StatusText(status), partial)
		buf.Flush()
		conn.Close()
	}
}

// tokenReply replies status with body.
func tokenReply(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

func TestRefreshFailures(t *testing.T) {
	tests := []struct {
		name       string
		status     int              // with body: a complete answer
		body       string           //
		h          http.HandlerFunc // else this handler; nil with status 0: nothing listens
		received   int              // with h
		definitive bool
		sentence   string // the error names it; definitive: the ledger's cause
		wantStatus string
		cause      error // errors.Is target, nil: any
	}{
		{name: "invalid_grant with description", status: 400, body: `{"error":"invalid_grant","error_description":"Refresh token  has been revoked"}`,
			definitive: true, sentence: "Refresh token has been revoked", wantStatus: "HTTP 400", cause: errTokenRefused},
		{name: "invalid_client without description", status: 401, body: `{"error":"invalid_client"}`,
			definitive: true, sentence: "invalid_client", wantStatus: "HTTP 401", cause: errTokenRefused},
		{name: "invalid_token in a 200", status: 200, body: `{"error":"invalid_token"}`,
			definitive: true, sentence: "invalid_token", wantStatus: "HTTP 200"},
		{name: "unauthorized_client", status: 400, body: `{"error":"unauthorized_client","error_description":""}`,
			definitive: true, sentence: "unauthorized_client", wantStatus: "HTTP 400"},
		{name: "complete 401 with a non-JSON body", status: 401, body: `<html>nope</html>`,
			definitive: true, sentence: "the token endpoint answered 401 Unauthorized", wantStatus: "HTTP 401"},
		{name: "complete 403 with an Anthropic-style error", status: 403, body: `{"type":"error","error":{"type":"permission_error","message":"OAuth disabled for this org"}}`,
			definitive: true, sentence: "OAuth disabled for this org", wantStatus: "HTTP 403"},
		{name: "partial 401 (hijacked after half a body)", h: hijackPartial(401, `{"error":"invalid_gr`),
			wantStatus: "HTTP 401", received: 20, cause: io.ErrUnexpectedEOF},
		{name: "partial 403", h: hijackPartial(403, ``), wantStatus: "HTTP 403", received: 0, cause: io.ErrUnexpectedEOF},
		{name: "500", status: 500, body: `{"error":"server_error"}`, sentence: "server_error", wantStatus: "HTTP 500", cause: errTokenRefused},
		{name: "an error that is no code", status: 429, body: `{"error":"Slow down, please"}`, wantStatus: "HTTP 429", cause: errTokenRefused},
		{name: "502 HTML", status: 502, body: `<html>bad gateway</html>`, wantStatus: "HTTP 502", cause: errTokenMalformed},
		{name: "429", status: 429, body: `{"error":"rate_limited"}`, sentence: "rate_limited", wantStatus: "HTTP 429"},
		{name: "OpenAI's reused refresh token", status: 400, body: `{"error":{"message":"Your refresh token has already been used.","type":"invalid_request_error","param":null,"code":"refresh_token_reused"}}`,
			definitive: true, sentence: "Your refresh token has already been used.", wantStatus: "HTTP 400", cause: errTokenRefused},
		{name: "OpenAI's expired refresh token, code only", status: 401, body: `{"error":{"code":"refresh_token_expired"}}`,
			definitive: true, sentence: "refresh_token_expired", wantStatus: "HTTP 401", cause: errTokenRefused},
		{name: "OpenAI's invalidated refresh token", status: 400, body: `{"error":{"type":"invalid_request_error","code":"refresh_token_invalidated"}}`,
			definitive: true, sentence: "refresh_token_invalidated", wantStatus: "HTTP 400", cause: errTokenRefused},
		{name: "another error object code is not definitive", status: 400, body: `{"error":{"type":"invalid_request_error","code":"unsupported_country"}}`, wantStatus: "HTTP 400"},
		{name: "invalid_request is not definitive", status: 400, body: `{"error":"invalid_request","error_description":"bad"}`, wantStatus: "HTTP 400"},
		{name: "200 non-JSON", status: 200, body: `access_token=x`, wantStatus: "HTTP 200", cause: errTokenMalformed},
		{name: "200 JSON without access_token", status: 200, body: `{"token_type":"Bearer"}`, wantStatus: "HTTP 200", cause: errTokenMalformed},
		{name: "connection refused", wantStatus: "no status", received: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var srv *httptest.Server
			received := tc.received
			switch {
			case tc.status != 0:
				srv = fakeTokenEndpoint(t, tokenReply(tc.status, tc.body))
				received = len(tc.body)
			case tc.h != nil:
				srv = fakeTokenEndpoint(t, tc.h)
			default:
				srv = httptest.NewServer(http.NotFoundHandler())
				srv.Close() // its port now refuses connections
			}
			endpoint := srv.URL + "/oauth/token"
			f := newOAuthFixture(t, "claude-code", endpoint)
			old := oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old", ExpiresAtMs: 7}
			f.seed(t, oauthSubID, old)
			f.l.activate(oauthSubID, "claude-code", 7, 3)
			before := f.l.entry(oauthSubID)

			_, err := f.o.refresh(context.Background(), oauthSubID, "claude-code", "")
			var re *endpointError
			if !errors.As(err, &re) {
				t.Fatalf("refresh error = %v (%T), want *endpointError", err, err)
			}
			if re.Definitive != tc.definitive {
				t.Errorf("Definitive = %v, want %v (%v)", re.Definitive, tc.definitive, err)
			}
			for _, want := range []string{endpoint, tc.wantStatus, fmt.Sprintf("%d bytes received", received), tc.sentence} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if errors.Unwrap(err) == nil {
				t.Errorf("error %q keeps no cause", err)
			}
			if tc.cause != nil && !errors.Is(err, tc.cause) {
				t.Errorf("error %q does not wrap %v", err, tc.cause)
			}
			if diff := cmp.Diff(old, f.stored(t, oauthSubID)); diff != "" {
				t.Errorf("vault changed (-want +got):\n%s", diff)
			}
			after := f.l.entry(oauthSubID)
			if tc.definitive {
				if after.Credential.State != credNeedsReauth || after.Credential.Cause != tc.sentence {
					t.Errorf("ledger credential = %+v, want needs_reauthorization with %q", after.Credential, tc.sentence)
				}
				if b, err := os.ReadFile(filepath.Join(f.dir, "ledger.json")); err != nil || !strings.Contains(string(b), credNeedsReauth) {
					t.Errorf("ledger.json was not written at once: %v", err)
				}
				if !strings.Contains(f.logs.String(), "credential_refresh_refused") {
					t.Errorf("no credential_refresh_refused in the log")
				}
				return
			}
			if diff := cmp.Diff(before, after); diff != "" {
				t.Errorf("transport failure changed the ledger (-before +after):\n%s", diff)
			}
			if !strings.Contains(f.logs.String(), "credential_refresh_failed") {
				t.Errorf("no credential_refresh_failed in the log")
			}
		})
	}
}

func TestRefreshSingleFlight(t *testing.T) {
	const callers = 50
	var calls atomic.Int32
	release := make(chan struct{})
	srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		<-release
		writeJSON(w, 200, map[string]any{"access_token": "at-new", "expires_in": 100})
	})
	f := newOAuthFixture(t, "kimi", srv.URL)
	f.seed(t, oauthSubID, oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old"})
	var joined sync.WaitGroup
	joined.Add(callers)
	f.o.testingOnlyJoined = func(string) { joined.Done() }
	type result struct {
		g   oauthGrant
		err error
	}
	results := make(chan result, callers)
	for range callers {
		go func() {
			g, err := f.o.refresh(context.Background(), oauthSubID, "kimi", "at-old")
			results <- result{g, err}
		}()
	}
	joined.Wait() // every caller has joined the one flight
	close(release)
	want := oauthGrant{AccessToken: "at-new", RefreshToken: "rt-old", ExpiresAtMs: oauthNow.Add(100 * time.Second).UnixMilli()}
	for range callers {
		r := <-results
		if r.err != nil || r.g != want {
			t.Errorf("refresh = %+v, %v; want %+v", r.g, r.err, want)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("token endpoint called %d times, want 1", n)
	}
}

func TestRefreshSkipsTokenNoLongerCurrent(t *testing.T) {
	var calls atomic.Int32
	srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		writeJSON(w, 200, map[string]any{"access_token": "at-3"})
	})
	f := newOAuthFixture(t, "codex", srv.URL)
	cur := oauthGrant{AccessToken: "at-2", RefreshToken: "rt-2", ExpiresAtMs: oauthNow.Add(time.Hour).UnixMilli()} // not expired: a lapsed one is refreshed
	f.seed(t, oauthSubID, cur)
	g, err := f.o.refresh(context.Background(), oauthSubID, "codex", "at-1")
	if err != nil || g != cur {
		t.Errorf("refresh = %+v, %v; want the current grant %+v", g, err, cur)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("token endpoint called %d times, want 0", n)
	}
}

func TestRefreshSuperseded(t *testing.T) {
	replaced := oauthGrant{AccessToken: "at-signed-in", RefreshToken: "rt-signed-in", ExpiresAtMs: 11}
	tests := []struct {
		name   string
		status int
		answer map[string]any
	}{
		{"new grant discarded", 200, map[string]any{"access_token": "at-new", "refresh_token": "rt-new"}},
		{"refusal of the replaced grant ignored", 400, map[string]any{"error": "invalid_grant"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var f *oauthFixture
			srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				f.seed(t, oauthSubID, replaced) // a sign-in lands while the refresh is on the wire
				writeJSON(w, tc.status, tc.answer)
			})
			f = newOAuthFixture(t, "claude-code", srv.URL)
			f.seed(t, oauthSubID, oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old"})
			f.l.activate(oauthSubID, "claude-code", 5, 6)
			before := f.l.entry(oauthSubID)
			_, err := f.o.refresh(context.Background(), oauthSubID, "claude-code", "")
			if !errors.Is(err, errRefreshSuperseded) {
				t.Fatalf("refresh error = %v, want errRefreshSuperseded", err)
			}
			if got := f.stored(t, oauthSubID); got != replaced {
				t.Errorf("vault = %+v, want the sign-in's grant kept", got)
			}
			after := f.l.entry(oauthSubID)
			if diff := cmp.Diff(before, after); diff != "" {
				t.Errorf("superseded refresh changed the ledger (-before +after):\n%s", diff)
			}
			if !strings.Contains(f.logs.String(), `"msg":"credential_refresh_superseded"`) {
				t.Errorf("no credential_refresh_superseded in the log")
			}
		})
	}
}

func TestRefreshWithoutRefreshToken(t *testing.T) {
	var calls atomic.Int32
	srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) { calls.Add(1) })
	f := newOAuthFixture(t, "kimi", srv.URL)
	f.seed(t, oauthSubID, oauthGrant{AccessToken: "at"})
	_, err := f.o.refresh(context.Background(), oauthSubID, "kimi", "")
	var re *endpointError
	if !errors.As(err, &re) || !re.Definitive || !errors.Is(err, errNoRefreshToken) {
		t.Errorf("refresh error = %v, want a definitive errNoRefreshToken", err)
	}
	if e := f.l.entry(oauthSubID); e.Credential.State != credNeedsReauth || e.Credential.Cause != errNoRefreshToken.Error() {
		t.Errorf("ledger credential = %+v, want needs_reauthorization", e.Credential)
	}
	if calls.Load() != 0 {
		t.Errorf("token endpoint called without a refresh token")
	}
}

// TestRefreshWithoutVaultGrant: a refresh starts from the vault's grant (SPEC §11.1); an unreadable vault, or one that
// holds no grant for the subscription (an API key donated meanwhile), fails naming why: no token call, the credential
// state unchanged, credential_refresh_failed logged.
func TestRefreshWithoutVaultGrant(t *testing.T) {
	for _, tc := range []struct{ name, vault, want string }{
		{"vault unreadable", `{"schema_version":`, "refresh " + oauthSubID + ": vault: "},
		{"an API key, no grant", `{"schema_version":1,"direct":{},"subscriptions":{"` + oauthSubID + `":{"api_key":"sk-k"}}}`,
			"refresh " + oauthSubID + ": the vault holds no OAuth grant for it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) { calls.Add(1) })
			f := newOAuthFixture(t, "kimi", srv.URL)
			if err := os.WriteFile(f.vaultPath, []byte(tc.vault), 0o600); err != nil {
				t.Fatal(err)
			}
			f.l.activate(oauthSubID, "kimi", 7, 3)
			before := f.l.entry(oauthSubID)
			_, err := f.o.refresh(context.Background(), oauthSubID, "kimi", "")
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("refresh error = %v, want one starting %q", err, tc.want)
			}
			if diff := cmp.Diff(before, f.l.entry(oauthSubID)); diff != "" {
				t.Errorf("the failed refresh changed the ledger (-before +after):\n%s", diff)
			}
			if calls.Load() != 0 || !strings.Contains(f.logs.String(), `"msg":"credential_refresh_failed"`) {
				t.Errorf("token calls %d, log %s; want none and credential_refresh_failed", calls.Load(), f.logs)
			}
		})
	}
}

// TestRefreshVaultWriteFails: a rotated grant the vault refuses is kept in
// memory and used, the credential stays active, a second refused rotation
// replaces the first, and the next vault write (a pass's) stores it (SPEC §17). It sets the package hook
// testingOnlyRename, so it must not run in parallel with other writers.
func TestRefreshVaultWriteFails(t *testing.T) {
	var rotations atomic.Int32 // each token call rotates: rt-new, then rt-new2
	srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		n := ""
		if rotations.Add(1) > 1 {
			n = "2"
		}
		tokenReply(200, `{"access_token":"at-new`+n+`","refresh_token":"rt-new`+n+`","expires_in":60}`)(w, r)
	})
	f := newOAuthFixture(t, "claude-code", srv.URL)
	old := oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old"}
	f.seed(t, oauthSubID, old)
	testingOnlyRename = func(oldpath, newpath string) error {
		if newpath == f.vaultPath {
			return errors.New("injected rename failure")
		}
		return os.Rename(oldpath, newpath)
	}
	t.Cleanup(func() { testingOnlyRename = nil })
	g, err := f.o.refresh(context.Background(), oauthSubID, "claude-code", "")
	if err != nil || g.AccessToken != "at-new" || g.RefreshToken != "rt-new" {
		t.Fatalf("refresh = %+v, %v; want the rotated grant", g, err)
	}
	if got := f.stored(t, oauthSubID); got != old {
		t.Errorf("vault = %+v, want the old grant on disk", got)
	}
	if doc, err := f.v.load(); err != nil || doc.Subscriptions[oauthSubID].OAuth.RefreshToken != "rt-new" || len(f.v.unwrittenIDs()) != 1 {
		t.Errorf("the daemon's view of the vault lost the rotated grant: %v", err)
	}
	if st := f.l.entry(oauthSubID).Credential.State; st != credActive {
		t.Errorf("credential state = %q, want %q", st, credActive)
	}
	f.v.writeUnwritten(f.o.log) // the vault still refuses: kept, and logged naming the grant's subscription
	if want := `"msg":"credential_refresh_unwritten","subscriptions":["` + oauthSubID + `"]`; !strings.Contains(f.logs.String(), want) {
		t.Errorf("the pass's failed write is not logged as %s:\n%s", want, f.logs.String())
	}
	// A second rotation the vault refuses replaces the first, still against the grant on disk (rt-old).
	if g, err := f.o.refresh(context.Background(), oauthSubID, "claude-code", ""); err != nil || g.RefreshToken != "rt-new2" {
		t.Fatalf("second refresh = %+v, %v; want the rotated grant", g, err)
	}
	if doc, err := f.v.load(); err != nil || doc.Subscriptions[oauthSubID].OAuth.RefreshToken != "rt-new2" || len(f.v.unwrittenIDs()) != 1 {
		t.Errorf("the daemon's view of the vault lost the second rotation: %v", err)
	}
	testingOnlyRename = nil
	f.v.writeUnwritten(f.o.log)
	if got := f.stored(t, oauthSubID); got.RefreshToken != "rt-new2" || len(f.v.unwrittenIDs()) != 0 {
		t.Errorf("after a write the vault holds %+v (unwritten %v), want the rotated grant", got, f.v.unwrittenIDs())
	}
}

func TestRefreshWaiterHangsUp(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		writeJSON(w, 200, map[string]any{"access_token": "at-new"})
	})
	f := newOAuthFixture(t, "kimi", srv.URL)
	f.seed(t, oauthSubID, oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old"})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := f.o.refresh(ctx, oauthSubID, "kimi", "")
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("hung-up caller got %v, want context.Canceled", err)
	}
	close(release)
	f.o.wg.Wait()
	if got := f.stored(t, oauthSubID).AccessToken; got != "at-new" {
		t.Errorf("vault access token = %q: the refresh did not finish for the others", got)
	}
}

func TestOAuthSecretsNeverQuoted(t *testing.T) {
	const (
		access   = "at-PLANTED-access-0001"
		refresh  = "rt-PLANTED-refresh-0002"
		fresh    = "at-PLANTED-new-0003"
		code     = "code-PLANTED-0004"
		skShaped = "sk-ant-oat01-PLANTEDPLANTED"
	)
	echo := fmt.Sprintf("token %s / %s / %s is revoked", access, refresh, skShaped)
	verifierSeen := make(chan string, 1)
	tests := []struct {
		name string
		h    http.HandlerFunc
		run  func(f *oauthFixture) error
	}{
		{"definitive refusal echoing the tokens", tokenReply(400, fmt.Sprintf(`{"error":"invalid_grant","error_description":%q}`, echo)), nil},
		{"transport failure echoing the tokens", tokenReply(503, fmt.Sprintf(`{"error":%q}`, echo)), nil},
		{"partial body", hijackPartial(401, `{"error":"`+refresh), nil},
		{"success", tokenReply(200, fmt.Sprintf(`{"access_token":%q}`, fresh)), nil},
		{"exchange refused echoing code and verifier", func(w http.ResponseWriter, r *http.Request) {
			_, fields := tokenRequest(t, r)
			verifierSeen <- fields["code_verifier"]
			writeJSON(w, 400, map[string]string{"error": "invalid_grant", "error_description": "bad " + fields["code_verifier"] + " " + fields["code"]})
		}, func(f *oauthFixture) error {
			s, _ := newSignIn("claude-code")
			_, err := f.o.exchangeCode(context.Background(), s, code+"#"+s.state)
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := fakeTokenEndpoint(t, tc.h)
			f := newOAuthFixture(t, "claude-code", srv.URL)
			f.seed(t, oauthSubID, oauthGrant{AccessToken: access, RefreshToken: refresh})
			var err error
			if tc.run != nil {
				err = tc.run(f)
			} else {
				_, err = f.o.refresh(context.Background(), oauthSubID, "claude-code", access)
			}
			e := f.l.entry(oauthSubID)
			planted := []string{access, refresh, fresh, code, skShaped}
			select {
			case v := <-verifierSeen:
				planted = append(planted, v)
			default:
			}
			ledgerFile, _ := os.ReadFile(filepath.Join(f.dir, "ledger.json"))
			for _, where := range []struct{ what, text string }{
				{"log", f.logs.String()}, {"error", fmt.Sprint(err)}, {"ledger cause", e.Credential.Cause}, {"ledger.json", string(ledgerFile)},
			} {
				for _, s := range planted {
					if strings.Contains(where.text, s) {
						t.Errorf("%s quotes a secret %q: %s", where.what, s, where.text)
					}
				}
			}
		})
	}
}

func TestRefreshRefusesBadOverrideWithoutLedgerChange(t *testing.T) {
	f := newOAuthFixture(t, "codex", "http://auth.example/token")
	f.seed(t, oauthSubID, oauthGrant{AccessToken: "a", RefreshToken: "r"})
	_, err := f.o.refresh(context.Background(), oauthSubID, "codex", "")
	if err == nil || !strings.Contains(err.Error(), "BRAMA_OAUTH_CODEX_TOKEN_URL: unusable URL") {
		t.Errorf("refresh error = %v, want the override refused", err)
	}
	if st := f.l.entry(oauthSubID).Credential.State; st != credActive {
		t.Errorf("credential state = %q, want active", st)
	}
}

// TestRefreshAfterShutdown: once shutdown has waited for the flights, no new one starts (its rotated token could not
// be kept by a process on its way out): a refresh is refused and the token endpoint is never called.
func TestRefreshAfterShutdown(t *testing.T) {
	var calls atomic.Int32
	srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Write([]byte(`{"access_token":"at-new","refresh_token":"rt-new","expires_in":3600}`))
	})
	f := newOAuthFixture(t, "claude-code", srv.URL+"/token")
	f.seed(t, oauthSubID, oauthGrant{AccessToken: "at-old", RefreshToken: "rt-old", ExpiresAtMs: 1})
	f.o.shutdown(make(chan struct{}))
	if _, err := f.o.refresh(context.Background(), oauthSubID, "claude-code", ""); err == nil || err.Error() != "brama is shutting down" {
		t.Errorf("refresh after shutdown: err = %v, want brama is shutting down", err)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("token endpoint called %d times after shutdown, want 0", n)
	}
	if g := f.stored(t, oauthSubID); g.RefreshToken != "rt-old" {
		t.Errorf("vault grant %+v, want the old one untouched", g)
	}
}
