package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A 401 on a credential the vault no longer holds says nothing about the
// one that replaced it: a PUT …/credential (a sign-in) landing while a call
// on a grant refreshed in this request, or on an API key, was on the wire is
// neither marked needs_reauthorization nor left unused (SPEC §7.2.4, §10.3, §11.1).
func TestAuthRefusalOfAReplacedGrantKeepsTheNewOne(t *testing.T) {
	const (
		refreshed = "acc-PLANTED-refreshed-0001"
		rotated   = "ref-PLANTED-rotated-0002"
		signedIn  = "acc-PLANTED-signed-in-0003"
		signedRef = "ref-PLANTED-signed-in-0004"
		oldKey    = "sk-ant-api-PLANTED-old-0007"
		newKey    = "sk-ant-api-PLANTED-new-0008"
	)
	expired := time.Now().Add(-time.Hour).UnixMilli()
	future := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	tests := []struct {
		name, donation, onWire, replacement, replaced string
		tokenCalls                                    int64
	}{
		{"grant refreshed in this request",
			fmt.Sprintf(`{"provider":"claude-code","oauth":{"access_token":"acc-PLANTED-old-0005","refresh_token":"ref-PLANTED-old-0006","expires_at_ms":%d}}`, expired),
			refreshed, `{"oauth":{"access_token":"` + signedIn + `","refresh_token":"` + signedRef + `","expires_at_ms":` + future + `}}`, signedIn, 1},
		{"api key", `{"provider":"claude-code","api_key":"` + oldKey + `"}`,
			oldKey, `{"api_key":"` + newKey + `"}`, newKey, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			onWire, release := make(chan struct{}), make(chan struct{})
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				switch cmp.Or(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), r.Header.Get("x-api-key")) {
				case tc.onWire:
					close(onWire)
					<-release // the sign-in lands while this call is on the wire
					http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"token revoked"}}`, 401)
				case tc.replaced:
					io.WriteString(w, protocolFixtures[1].buffered)
				default:
					http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"unknown token"}}`, 401)
				}
			})
			tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				io.WriteString(w, `{"access_token":"`+refreshed+`","refresh_token":"`+rotated+`","expires_in":3600}`)
			})
			d, tok := oauthSetup(t, provider, tokenEndpoint)
			s, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, tc.donation)
			id := donatedID(t, s, b, "a1", "claude-code")

			type answer struct {
				status int
				body   []byte
			}
			done := make(chan answer, 1)
			go func() {
				s, _, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
				done <- answer{s, b}
			}()
			<-onWire
			if s, _, b := d.call("PUT", "/v1/admin/subscriptions/a1/"+id+"/credential", d.token, tc.replacement); s != 200 {
				t.Fatalf("PUT credential: %d %s", s, b)
			}
			close(release)
			a := <-done
			if a.status != 200 {
				t.Errorf("request: %d %s, want 200 from the replacing credential (the second call)", a.status, a.body)
			}
			if got := credentialStateOf(t, d, "a1", id); got != credActive {
				t.Errorf("credential state = %q after a 401 on the replaced credential, want active (the sign-in's)", got)
			}
			if n := tokenEndpoint.calls.Load(); n != tc.tokenCalls {
				t.Errorf("token endpoint calls = %d, want %d", n, tc.tokenCalls)
			}
			logs := logsBesidesFirstStart(d.stderr.String())
			for _, s := range []string{refreshed, rotated, signedIn, signedRef, oldKey, newKey} {
				assertNoSecret(t, s, logs+string(a.body), d.env["BRAMA_STATE_DIR"])
			}
		})
	}
}

// A rotated grant the vault would not take lives in memory only, so the log
// names why the write failed (disk full, EACCES, a replaced vault), never
// the tokens (SPEC §17, §2.2). It sets
// the package hook testingOnlyRename, so it must not run in parallel.
func TestRefreshVaultWriteFailureLogsItsCause(t *testing.T) {
	const (
		access  = "at-PLANTED-rotated-0011"
		refresh = "rt-PLANTED-rotated-0012"
		old     = "rt-PLANTED-old-0013"
	)
	srv := fakeTokenEndpoint(t, tokenReply(200, `{"access_token":"`+access+`","refresh_token":"`+refresh+`","expires_in":60}`))
	f := newOAuthFixture(t, "claude-code", srv.URL)
	f.seed(t, oauthSubID, oauthGrant{AccessToken: "at-PLANTED-old-0014", RefreshToken: old})
	testingOnlyRename = func(oldpath, newpath string) error {
		if newpath == f.vaultPath {
			return errors.New("no space left on device (injected)")
		}
		return os.Rename(oldpath, newpath)
	}
	t.Cleanup(func() { testingOnlyRename = nil })
	if _, err := f.o.refresh(context.Background(), oauthSubID, "claude-code", ""); err != nil {
		t.Fatalf("refresh with an unwritable vault: %v; want the rotated grant, kept in memory", err)
	}
	logs := f.logs.String()
	if !strings.Contains(logs, "credential_refresh_unwritten") || !strings.Contains(logs, "no space left on device (injected)") {
		t.Errorf("the log does not name why the refreshed grant was not stored:\n%s", logs)
	}
	for _, s := range []string{access, refresh, old} {
		if strings.Contains(logs, s) {
			t.Errorf("the log quotes the secret %q", s)
		}
	}
}

// A sign-in landing while the expired grant's refresh is on the wire wins
// (the refresh's result is discarded), and the request that waited for that
// refresh is served with the signed-in grant, not told to sign in again
// (SPEC §11.1: the caller retries with the current one).
func TestRefreshSupersededBySignInServesWithTheNewGrant(t *testing.T) {
	const (
		signedIn  = "acc-PLANTED-signed-in-0021"
		signedRef = "ref-PLANTED-signed-in-0022"
		discarded = "acc-PLANTED-discarded-0023"
		rotated   = "ref-PLANTED-rotated-0024"
	)
	grant := `{"oauth":{"access_token":"` + signedIn + `","refresh_token":"` + signedRef + `","expires_at_ms":` +
		strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10) + `}}`
	succeeds := func(w http.ResponseWriter) {
		io.WriteString(w, `{"access_token":"`+discarded+`","refresh_token":"`+rotated+`","expires_in":3600}`)
	}
	tests := []struct {
		name   string
		answer func(w http.ResponseWriter)
		put    string // the credential signed in meanwhile
		kept   string // what the vault must hold of it
	}{
		{"refresh succeeds", succeeds, grant, signedRef},
		{"refresh refused", func(w http.ResponseWriter) {
			http.Error(w, `{"error":"invalid_grant","error_description":"refresh token revoked"}`, 400)
		}, grant, signedRef},
		{"replaced by an API key", succeeds, `{"api_key":"` + signedIn + `"}`, signedIn}, // no grant left to compare
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if r.Header.Get("Authorization") != "Bearer "+signedIn && r.Header.Get("x-api-key") != signedIn {
					http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"unknown token"}}`, 401)
					return
				}
				io.WriteString(w, protocolFixtures[1].buffered)
			})
			onWire, release := make(chan struct{}), make(chan struct{})
			tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				close(onWire)
				<-release
				tc.answer(w)
			})
			d, tok := oauthSetup(t, provider, tokenEndpoint)
			id := donateGrant(t, d, "acc-PLANTED-old-0025", "ref-PLANTED-old-0026", time.Now().Add(-time.Hour).UnixMilli())
			done := make(chan []byte, 1)
			status := make(chan int, 1)
			go func() {
				s, _, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
				status <- s
				done <- b
			}()
			<-onWire
			if s, _, b := d.call("PUT", "/v1/admin/subscriptions/a1/"+id+"/credential", d.token, tc.put); s != 200 {
				t.Fatalf("PUT credential: %d %s", s, b)
			}
			close(release)
			if s, b := <-status, <-done; s != 200 {
				t.Errorf("request: %d %s, want 200 from the signed-in grant", s, b)
			}
			if got := credentialStateOf(t, d, "a1", id); got != credActive {
				t.Errorf("credential state = %q, want active (the sign-in's)", got)
			}
			vault, _ := os.ReadFile(filepath.Join(d.env["BRAMA_STATE_DIR"], "vault.json"))
			if !strings.Contains(string(vault), tc.kept) || strings.Contains(string(vault), rotated) {
				t.Errorf("the vault does not hold the signed-in grant alone:\n%s", vault)
			}
			logs := logsBesidesFirstStart(d.stderr.String())
			if !strings.Contains(logs, "credential_refresh_superseded") {
				t.Errorf("no credential_refresh_superseded in the log")
			}
			for _, s := range []string{signedIn, signedRef, discarded, rotated} {
				assertNoSecret(t, s, logs, d.env["BRAMA_STATE_DIR"])
			}
		})
	}
}

// The same race inside a pass: the usage read whose expired grant's refresh
// a sign-in superseded reads with the signed-in grant, and the pass reports
// nothing failed (SPEC §11.1, §11.2).
func TestPassRefreshSupersededBySignInReadsWithTheNewGrant(t *testing.T) {
	const signedIn = "acc-PLANTED-signed-in-0031"
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Header.Get("Authorization") != "Bearer "+signedIn {
			http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"unknown token"}}`, 401)
			return
		}
		io.WriteString(w, `{"five_hour":{"utilization":10,"resets_at":"2099-01-01T00:00:00Z"}}`)
	})
	onWire, release := make(chan struct{}), make(chan struct{})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		close(onWire)
		<-release
		io.WriteString(w, `{"access_token":"acc-PLANTED-discarded-0032","refresh_token":"ref-PLANTED-rotated-0033","expires_in":3600}`)
	})
	d, _ := oauthSetup(t, provider, tokenEndpoint)
	id := donateGrant(t, d, "acc-PLANTED-old-0034", "ref-PLANTED-old-0035", time.Now().Add(-time.Hour).UnixMilli())
	done := make(chan []byte, 1)
	go func() {
		_, _, b := d.call("POST", "/v1/admin/maintain", d.token, "")
		done <- b
	}()
	<-onWire
	put := `{"oauth":{"access_token":"` + signedIn + `","refresh_token":"ref-PLANTED-signed-in-0036","expires_at_ms":` +
		strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10) + `}}`
	if s, _, b := d.call("PUT", "/v1/admin/subscriptions/a1/"+id+"/credential", d.token, put); s != 200 {
		t.Fatalf("PUT credential: %d %s", s, b)
	}
	close(release)
	var rep passReport
	if b := <-done; json.Unmarshal(b, &rep) != nil || !rep.OK || rep.Usage.Read != 1 || len(rep.Usage.Failed) != 0 || rep.Credentials.Refused != 0 {
		t.Errorf("pass = %s, want ok with the one report read by the signed-in grant", b)
	}
	if got := credentialStateOf(t, d, "a1", id); got != credActive {
		t.Errorf("credential state = %q, want active", got)
	}
}

// A refresh asked for because access token T was refused is skipped when the
// vault holds another one, but not when that one is itself expired: an
// imported grant whose access token lapsed, landing while T was on the wire,
// is refreshed before its call, not marked needs_reauthorization for the
// lapsed token (SPEC §7.2.3, §11.1).
func TestRefusedTokenReplacedByAnExpiredGrantIsRefreshed(t *testing.T) {
	const (
		first       = "acc-PLANTED-first-0041"
		imported    = "acc-PLANTED-imported-0042"
		importedRef = "ref-PLANTED-imported-0043"
		renewed     = "acc-PLANTED-renewed-0044"
	)
	onWire, release := make(chan struct{}), make(chan struct{})
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		switch r.Header.Get("Authorization") {
		case "Bearer " + first:
			close(onWire)
			<-release
			http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"token revoked"}}`, 401)
		case "Bearer " + renewed:
			io.WriteString(w, protocolFixtures[1].buffered)
		default: // the imported access token has lapsed
			http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"token expired"}}`, 401)
		}
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if !strings.Contains(string(body), importedRef) {
			http.Error(w, `{"error":"invalid_grant"}`, 400)
			return
		}
		io.WriteString(w, `{"access_token":"`+renewed+`","refresh_token":"ref-PLANTED-renewed-0045","expires_in":3600}`)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	id := donateGrant(t, d, first, "ref-PLANTED-first-0046", time.Now().Add(time.Hour).UnixMilli())
	status := make(chan int, 1)
	go func() {
		s, _, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
		if s != 200 {
			t.Errorf("request: %d %s, want 200 from the refreshed imported grant", s, b)
		}
		status <- s
	}()
	<-onWire
	put := `{"oauth":{"access_token":"` + imported + `","refresh_token":"` + importedRef + `","expires_at_ms":` +
		strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10) + `}}`
	if s, _, b := d.call("PUT", "/v1/admin/subscriptions/a1/"+id+"/credential", d.token, put); s != 200 {
		t.Fatalf("PUT credential: %d %s", s, b)
	}
	close(release)
	<-status
	if got := credentialStateOf(t, d, "a1", id); got != credActive {
		t.Errorf("credential state = %q, want active", got)
	}
	if n := tokenEndpoint.calls.Load(); n != 1 {
		t.Errorf("token endpoint calls = %d, want 1 (the imported grant's refresh)", n)
	}
}

// TestUnwritableVaultKeepsTheRotatedGrant over HTTP: a grant rotated while
// the vault refuses writes is used from memory (no second token call),
// the credential stays active, /readyz warns naming the subscription, and
// the next maintenance pass writes it; the rotated refresh token is never
// lost (SPEC §17). It sets the package hook testingOnlyRename, so it must
// not run in parallel.
func TestUnwritableVaultKeepsTheRotatedGrant(t *testing.T) {
	for _, handEdit := range []bool{false, true} {
		t.Run(fmt.Sprint("hand edit ", handEdit), func(t *testing.T) { unwritableVaultKeepsTheRotatedGrant(t, handEdit) })
	}
}

// unwritableVaultKeepsTheRotatedGrant: the grant kept in memory is written by the next pass that can, unless the
// operator replaced the credential by hand meanwhile (the file's then wins, and nothing is left to write).
func unwritableVaultKeepsTheRotatedGrant(t *testing.T, handEdit bool) {
	var refuseVault atomic.Bool
	testingOnlyRename = func(oldpath, newpath string) error {
		if refuseVault.Load() && filepath.Base(newpath) == "vault.json" {
			return syscall.EACCES
		}
		return os.Rename(oldpath, newpath)
	}
	t.Cleanup(func() { testingOnlyRename = nil }) // after the daemon stops: cleanups run last first
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Header.Get("Authorization") != "Bearer acc-rotated-0031" {
			http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"expired token"}}`, 401)
			return
		}
		io.WriteString(w, protocolFixtures[1].buffered)
	})
	tokens := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		io.WriteString(w, `{"access_token":"acc-rotated-0031","refresh_token":"ref-rotated-0032","expires_in":3600}`)
	})
	d, tok := oauthSetup(t, provider, tokens)
	vaultPath := filepath.Join(d.env["BRAMA_STATE_DIR"], "vault.json")
	id := donateGrant(t, d, "acc-old-0033", "ref-old-0034", time.Now().Add(time.Hour).UnixMilli())
	onDisk := func() oauthGrant {
		t.Helper()
		doc, _, err := readVault(vaultPath)
		if err != nil || doc.Subscriptions[id].OAuth == nil {
			t.Fatalf("vault: %v", err)
		}
		return *doc.Subscriptions[id].OAuth
	}
	readyz := func() string {
		_, _, b := d.call("GET", "/readyz", "", "")
		return string(b)
	}

	refuseVault.Store(true)
	for i, want := range []string{"2", "1"} { // the refused token, the refresh and the rotated one; then the rotated one at once
		status, h, body := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
		if status != 200 || h.Get("Brama-Attempts") != want {
			t.Fatalf("request %d: %d %s (attempts %q), want 200 after %s calls", i, status, body, h.Get("Brama-Attempts"), want)
		}
	}
	if n := tokens.calls.Load(); n != 1 {
		t.Errorf("token calls = %d, want 1: the rotated grant is used from memory", n)
	}
	if g := onDisk(); g.RefreshToken != "ref-old-0034" {
		t.Errorf("the unwritable vault holds %q", g.RefreshToken)
	}
	if st := credentialStateOf(t, d, "a1", id); st != "active" {
		t.Errorf("credential state %q, want active", st)
	}
	if r := readyz(); !strings.Contains(r, "the vault refused to keep the rotated OAuth grant of "+id) {
		t.Errorf("/readyz does not warn about the unwritten grant: %s", r)
	}
	if s, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); s != 200 || onDisk().RefreshToken != "ref-old-0034" {
		t.Errorf("a pass while the vault still refuses: %d %s", s, b)
	}

	if handEdit { // the operator replaces the credential by hand with an API key: the file's wins, nothing to write
		doc, _, _ := readVault(vaultPath)
		doc.Subscriptions[id] = vaultCredential{APIKey: "sk-hand-edited-0035"}
		if err := os.WriteFile(vaultPath, must(marshalState(doc)), 0o600); err != nil {
			t.Fatal(err)
		}
		if r := readyz(); strings.Contains(r, "rotated OAuth grant") || !strings.Contains(r, `"ready":true`) {
			t.Errorf("/readyz after the hand edit: %s", r)
		}
		return
	}
	refuseVault.Store(false)
	if s, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); s != 200 {
		t.Fatalf("maintain: %d %s", s, b)
	}
	if g := onDisk(); g.AccessToken != "acc-rotated-0031" || g.RefreshToken != "ref-rotated-0032" {
		t.Errorf("after the pass the vault holds %+v, want the rotated grant", g)
	}
	if r := readyz(); strings.Contains(r, "rotated OAuth grant") {
		t.Errorf("/readyz still warns after the grant was written: %s", r)
	}
	assertNoSecret(t, "rotated-003", logsBesidesFirstStart(d.stderr.String()), d.env["BRAMA_STATE_DIR"])
}
