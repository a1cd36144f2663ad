package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// opTokenEndpoint is a fake OAuth token endpoint: it counts calls, keeps
// every field it was sent (the tests grep for the PKCE verifier), answers an
// authorization_code grant for a known code with tokens minted from it,
// and refreshes by the rule in refresh.
type opTokenEndpoint struct {
	*fakeProvider
	mu      sync.Mutex // guards seen
	seen    []map[string]string
	codes   map[string][2]string                    // code → access, refresh it mints
	refresh func(refreshToken string) (int, string) // status and body for a refresh_token grant
}

func newOpTokenEndpoint(t *testing.T) *opTokenEndpoint {
	te := &opTokenEndpoint{codes: map[string][2]string{}}
	te.refresh = func(string) (int, string) {
		return 400, `{"error":"invalid_grant","error_description":"refresh token revoked"}`
	}
	te.fakeProvider = newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		fields := map[string]string{}
		if json.Unmarshal(body, &fields) != nil {
			t.Errorf("token request is not a JSON object of strings")
		}
		te.mu.Lock()
		te.seen = append(te.seen, fields)
		toks, known := te.codes[fields["code"]]
		te.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch fields["grant_type"] {
		case "authorization_code":
			if !known || fields["code_verifier"] == "" {
				w.WriteHeader(400)
				io.WriteString(w, `{"error":"invalid_grant","error_description":"unknown code"}`)
				return
			}
			fmt.Fprintf(w, `{"access_token":%q,"refresh_token":%q,"expires_in":3600}`, toks[0], toks[1])
		case "refresh_token":
			status, b := te.refresh(fields["refresh_token"])
			w.WriteHeader(status)
			io.WriteString(w, b)
		default:
			w.WriteHeader(400)
			io.WriteString(w, `{"error":"unsupported_grant_type"}`)
		}
	})
	return te
}

// verifiers returns every code_verifier the endpoint was sent.
func (te *opTokenEndpoint) verifiers() []string {
	te.mu.Lock()
	defer te.mu.Unlock()
	var out []string
	for _, f := range te.seen {
		if v := f["code_verifier"]; v != "" {
			out = append(out, v)
		}
	}
	return out
}

// opAnthropicAnswer is a minimal anthropic-messages answer.
const opAnthropicAnswer = `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"pong"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}`

// opChatAnswer is a minimal openai-chat answer.
const opChatAnswer = `{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"pong"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`

// bearerProvider is a fake claude-code provider that accepts only the
// access tokens in good and answers 401 to any other.
func bearerProvider(t *testing.T, good *sync.Map) *fakeProvider {
	return newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		if _, ok := good.Load(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")); !ok {
			w.WriteHeader(401)
			io.WriteString(w, `{"type":"error","error":{"type":"authentication_error","message":"invalid bearer token"}}`)
			return
		}
		io.WriteString(w, opAnthropicAnswer)
	})
}

// opJournal returns the journal's records of kind.
func opJournal(t *testing.T, env map[string]string, kind string) []journalRecord {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl"))
	if err != nil {
		t.Fatalf("journal: %v", err)
	}
	recs, bad, _ := readJournalLines(t, b)
	if len(bad) > 0 {
		t.Errorf("journal has unreadable lines: %+v", bad)
	}
	var out []journalRecord
	for _, r := range recs {
		if r.Kind == kind {
			out = append(out, r)
		}
	}
	return out
}

// credentialState reads one row's credential state from the admin listing.
func credentialStateOf(t *testing.T, d *daemon, agent, id string) string {
	t.Helper()
	s, _, b := d.call("GET", "/v1/admin/subscriptions/"+agent, d.token, "")
	if s != 200 {
		t.Fatalf("listing: %d %s", s, b)
	}
	for _, r := range listRows(t, b) {
		if r.ID == id && r.Credential != nil {
			return r.Credential.State
		}
	}
	t.Fatalf("no row %s in %s", id, b)
	return ""
}

func TestSignInReplacesAndDonates(t *testing.T) {
	env := stateEnv(t)
	var good sync.Map
	prov := bearerProvider(t, &good)
	te := newOpTokenEndpoint(t)
	te.codes["planted-code-replace-0123456789"] = [2]string{"planted-access-new-0123456789", "planted-refresh-new-0123456789"}
	te.codes["planted-code-donate-0123456789"] = [2]string{"planted-access-don-0123456789", "planted-refresh-don-0123456789"}
	good.Store("planted-access-new-0123456789", true)
	good.Store("planted-access-don-0123456789", true)
	env["BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL"] = prov.URL
	env["BRAMA_OAUTH_CLAUDE_CODE_TOKEN_URL"] = te.URL + "/token"
	d := startDaemon(t, env, "")
	app := addClient(t, env, "app-a1", "-agent", "a1")
	withToken := maps.Clone(env)
	withToken["BRAMA_TOKEN"] = d.token

	s, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token,
		`{"provider":"claude-code","oauth":{"access_token":"planted-access-old-0123456789","refresh_token":"planted-refresh-old-0123456789","expires_at_ms":4102444800000}}`)
	id := donatedID(t, s, b, "a1", "claude-code")
	chat := chatBody(dialectMessages, "claude-code/claude-test", false, "")

	// The provider refuses the old token and the token endpoint its refresh
	// token: the credential needs reauthorization and nothing serves.
	s, _, b = d.call("POST", "/v1/messages", app, chat)
	if s != 503 || envelopeOf(t, b)["code"] != "subscription_reauthorization_required" {
		t.Fatalf("before sign-in: %d %s", s, b)
	}
	if st := credentialStateOf(t, d, "a1", id); st != credNeedsReauth {
		t.Fatalf("credential state before sign-in = %s", st)
	}

	var cliOut strings.Builder
	tests := []struct {
		name      string
		env       map[string]string
		stdin     string
		args      []string
		wantCode  int
		wantID    string // "" for a new id
		wantErr   string
		tokenCall bool
	}{
		{name: "pasted code of another sign-in", env: withToken, stdin: "planted-code-replace-0123456789#not-this-sign-in\n",
			args: []string{"-id", id}, wantCode: 1, wantErr: "another sign-in"},
		{name: "no code", env: withToken, stdin: "", args: []string{"-id", id}, wantCode: 1, wantErr: "no authorization code"},
		{name: "unknown id", env: withToken, stdin: "planted-code-replace-0123456789\n", args: []string{"-id", "sub_0000000000000000"}, wantCode: 1, wantErr: "no subscription"},
		{name: "refused code", env: withToken, stdin: "planted-code-unknown-0123456789\n", args: []string{"-id", id}, wantCode: 1, wantErr: "nothing was stored", tokenCall: true},
		{name: "replace with -id", env: withToken, stdin: "planted-code-replace-0123456789\n", args: []string{"-id", id}, wantID: id, tokenCall: true},
		{name: "donate, bearer on stdin", env: env, stdin: d.token + "\nplanted-code-donate-0123456789\n", args: []string{"-label", "laptop"}, tokenCall: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := te.calls.Load()
			args := append([]string{"subscription", "sign-in", "-provider", "claude-code", "-agent", "a1", "-gateway", d.url}, tc.args...)
			out, errOut, code := runCLI(t, tc.env, tc.stdin, args...)
			cliOut.WriteString(out + errOut)
			if code != tc.wantCode || !strings.Contains(errOut, tc.wantErr) {
				t.Fatalf("exit %d, stderr %q; want %d mentioning %q", code, errOut, tc.wantCode, tc.wantErr)
			}
			if called := te.calls.Load() > before; called != tc.tokenCall {
				t.Errorf("token endpoint called: %v, want %v", called, tc.tokenCall)
			}
			if !strings.Contains(errOut, "https://claude.com/cai/oauth/authorize?") && tc.wantErr == "" {
				t.Errorf("the authorize URL was not printed on stderr: %q", errOut)
			}
			if code != 0 {
				return
			}
			got := strings.TrimSpace(out)
			if (tc.wantID != "" && got != tc.wantID) || !isSubscriptionID(got) {
				t.Fatalf("stdout %q, want the subscription id %q", got, tc.wantID)
			}
			if st := credentialStateOf(t, d, "a1", got); st != credActive {
				t.Errorf("credential state after sign-in = %s, want active", st)
			}
			signIns := opJournal(t, env, "subscription_sign_in")
			last := signIns[len(signIns)-1]
			if last.SubscriptionID != got || last.Provider != "claude-code" || last.Result != "signed_in" || last.Detail == "" {
				t.Errorf("last subscription_sign_in = %+v", last)
			}
			if !logEvent(d.stderr.String(), "subscription_sign_in", map[string]string{"subscription_id": got, "agent_id": "a1", "result": "signed_in"}) {
				t.Errorf("no subscription_sign_in log line for %s:\n%s", got, d.stderr.String())
			}
		})
	}
	if n := len(opJournal(t, env, "subscription_sign_in")); n != 2 {
		t.Errorf("%d subscription_sign_in records, want 2 (one per successful sign-in)", n)
	}
	subs := readVaultSubs(t, env)
	if g := subs[id].OAuth; g == nil || g.AccessToken != "planted-access-new-0123456789" || g.RefreshToken != "planted-refresh-new-0123456789" || g.ExpiresAtMs == 0 {
		t.Errorf("vault grant of %s after sign-in = %+v", id, g)
	}
	// The subscription that needed reauthorization now serves.
	s, _, b = d.call("POST", "/v1/messages", app, chat)
	if s != 200 {
		t.Fatalf("after sign-in: %d %s", s, b)
	}

	secrets := append(te.verifiers(), "planted-code-replace-0123456789", "planted-code-donate-0123456789",
		"planted-access-new-0123456789", "planted-refresh-new-0123456789", "planted-access-don-0123456789", "planted-refresh-don-0123456789")
	if len(te.verifiers()) != 3 {
		t.Fatalf("token endpoint saw %d verifiers, want 3", len(te.verifiers()))
	}
	for _, secret := range secrets {
		assertNoSecret(t, secret, logsBesidesFirstStart(d.stderr.String())+cliOut.String(), env["BRAMA_STATE_DIR"])
	}
	assertOwnerOnly(t, env["BRAMA_STATE_DIR"])
}

func TestCredentialPut(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	s, _, b := d.call("POST", "/v1/admin/subscriptions/a", d.token, `{"provider":"kimi","api_key":"sk-put-old-0123456789"}`)
	idA := donatedID(t, s, b, "a", "kimi")
	s, _, b = d.call("POST", "/v1/admin/subscriptions/a", d.token, `{"provider":"openai","api_key":"sk-put-retired-0123456789"}`)
	idRetired := donatedID(t, s, b, "a", "openai")
	s, _, b = d.call("POST", "/v1/admin/subscriptions/b", d.token, `{"provider":"kimi","api_key":"sk-put-b-0123456789"}`)
	idB := donatedID(t, s, b, "b", "kimi")
	if s, _, b := d.call("DELETE", "/v1/admin/subscriptions/a/"+idRetired, d.token, ""); s != 200 {
		t.Fatalf("retire: %d %s", s, b)
	}
	path := func(agent, id string) string { return "/v1/admin/subscriptions/" + agent + "/" + id + "/credential" }
	caller := addClient(t, env, "app")

	tests := []struct {
		name, path, token, body string
		want                    int
		code                    string
		vaultKey                string // the key the vault holds for idA afterwards ("" unchecked)
	}{
		{name: "api key", path: path("a", idA), token: d.token, body: `{"api_key":"sk-put-new-0123456789"}`, want: 200, vaultKey: "sk-put-new-0123456789"},
		{name: "oauth grant", path: path("a", idA), token: d.token, body: `{"oauth":{"access_token":"put-access-0123456789","refresh_token":"put-refresh-0123456789","expires_at_ms":4102444800000}}`, want: 200},
		{name: "both", path: path("a", idA), token: d.token, body: `{"api_key":"sk-x-0123456789","oauth":{"access_token":"x","refresh_token":"y","expires_at_ms":0}}`, want: 400, code: "invalid_request"},
		{name: "neither", path: path("a", idA), token: d.token, body: `{}`, want: 400, code: "invalid_request"},
		{name: "unknown member", path: path("a", idA), token: d.token, body: `{"api_key":"sk-x-0123456789","label":"x"}`, want: 400, code: "invalid_request"},
		{name: "unknown grant member", path: path("a", idA), token: d.token, body: `{"oauth":{"access_token":"x","refresh_token":"y","expires_at_ms":0,"scope":"z"}}`, want: 400, code: "invalid_request"},
		{name: "not json", path: path("a", idA), token: d.token, body: `sk-put-raw`, want: 400, code: "invalid_request"},
		{name: "another agent's id", path: path("a", idB), token: d.token, body: `{"api_key":"sk-put-stolen-0123456789"}`, want: 404, code: "not_found"},
		{name: "retired", path: path("a", idRetired), token: d.token, body: `{"api_key":"sk-put-late-0123456789"}`, want: 409, code: "state_conflict"},
		{name: "not admin", path: path("a", idA), token: caller, body: `{"api_key":"sk-put-caller-0123456789"}`, want: 403, code: "forbidden"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(opJournal(t, env, "subscription_sign_in"))
			s, _, b := d.call("PUT", tc.path, tc.token, tc.body)
			if s != tc.want {
				t.Fatalf("%d %s, want %d", s, b, tc.want)
			}
			after := len(opJournal(t, env, "subscription_sign_in"))
			if tc.code != "" {
				if envelopeOf(t, b)["code"] != tc.code {
					t.Errorf("code: %s, want %s", b, tc.code)
				}
				if after != before {
					t.Errorf("a refused PUT journaled a sign-in")
				}
				return
			}
			if after != before+1 {
				t.Errorf("journal sign-ins %d → %d, want one more", before, after)
			}
			if strings.Contains(string(b), "0123456789") {
				t.Errorf("the answer echoes the secret: %s", b)
			}
			if tc.vaultKey != "" && readVaultSubs(t, env)[idA].APIKey != tc.vaultKey {
				t.Errorf("vault does not hold the new key")
			}
		})
	}
	if g := readVaultSubs(t, env)[idA].OAuth; g == nil || g.RefreshToken != "put-refresh-0123456789" {
		t.Errorf("the last accepted credential is not in the vault: %+v", g)
	}
	if k := readVaultSubs(t, env)[idB].APIKey; k != "sk-put-b-0123456789" {
		t.Errorf("another agent's credential changed")
	}
	for _, secret := range []string{"sk-put-new-0123456789", "put-refresh-0123456789", "sk-put-stolen-0123456789", "sk-put-late-0123456789"} {
		assertNoSecret(t, secret, logsBesidesFirstStart(d.stderr.String()), env["BRAMA_STATE_DIR"])
	}
}

// TestCredentialPutJournalsItsOutcome: a replacement the vault refuses is journaled as a failed sign-in (SPEC §9's
// result "failed"); one stored that the journal then refuses answers 503 naming both, the credential kept. It sets
// the package hook testingOnlyRename, so it must not run in parallel with other writers.
func TestCredentialPutJournalsItsOutcome(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	s, _, b := d.call("POST", "/v1/admin/subscriptions/a", d.token, `{"provider":"kimi","api_key":"sk-put-0-0123456789"}`)
	id := donatedID(t, s, b, "a", "kimi")
	vaultPath, journalPath := filepath.Join(env["BRAMA_STATE_DIR"], "vault.json"), filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl")
	if err := os.WriteFile(journalPath, nil, 0o600); err != nil { // empty: opJournal reads it before the first sign-in
		t.Fatal(err)
	}
	t.Cleanup(func() { testingOnlyRename = nil })
	tests := []struct {
		name, key string
		rename    func(oldpath, newpath string) error // the vault's; nil: os.Rename
		status    int
		code      string
		msg       string // the refusal's
		result    string // the sign-in journaled, with detail ("": none)
		detail    string
		vaultKey  string
		level     string // the subscription_sign_in log line's: INFO only when stored and journaled
	}{
		{name: "stored", key: "sk-put-1-0123456789", status: 200, result: "signed_in",
			detail: "credential replaced by sign-in of client local", vaultKey: "sk-put-1-0123456789", level: "INFO"},
		{name: "the vault refuses", key: "sk-put-2-0123456789", rename: func(string, string) error { return errors.New("injected rename failure") },
			status: 503, code: "dependency_unavailable", msg: "injected rename failure", result: "failed",
			detail: "credential not replaced (client local): injected rename failure", vaultKey: "sk-put-1-0123456789", level: "WARN"},
		{name: "the journal refuses", key: "sk-put-3-0123456789", rename: func(oldpath, newpath string) error {
			err := os.Rename(oldpath, newpath)
			os.Chmod(journalPath, 0o640) // the append after the vault write refuses a group-readable journal
			return err
		}, status: 503, code: "dependency_unavailable", msg: id + " was stored, but the journal refused the sign-in: journal " + journalPath +
			" has mode 0640; it must not be readable or writable by group or other (chmod 600)",
			vaultKey: "sk-put-3-0123456789", level: "WARN"},
		{name: "both refuse", key: "sk-put-4-0123456789", rename: func(string, string) error {
			os.Chmod(journalPath, 0o640) // the journal was ready before the write; its append after the failure refuses
			return errors.New("injected rename failure")
		}, status: 503, code: "dependency_unavailable", msg: "injected rename failure", // the write's refusal, never "was stored"
			vaultKey: "sk-put-3-0123456789", level: "WARN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			testingOnlyRename = func(oldpath, newpath string) error {
				if newpath == vaultPath && tc.rename != nil {
					return tc.rename(oldpath, newpath)
				}
				return os.Rename(oldpath, newpath)
			}
			before := opJournal(t, env, "subscription_sign_in")
			logged := signInLogLines(t, d.stderr.String())
			s, _, b := d.call("PUT", "/v1/admin/subscriptions/a/"+id+"/credential", d.token, `{"api_key":"`+tc.key+`"}`)
			testingOnlyRename = nil
			os.Chmod(journalPath, 0o600)
			if s != tc.status || tc.code != "" && (envelopeOf(t, b)["code"] != tc.code || envelopeOf(t, b)["message"] != tc.msg) {
				t.Errorf("%d %s, want %d %s %q", s, b, tc.status, tc.code, tc.msg)
			}
			after := opJournal(t, env, "subscription_sign_in")
			want := len(before)
			if tc.result != "" {
				want++
			}
			if len(after) != want {
				t.Errorf("%d subscription_sign_in records, want %d", len(after), want)
			} else if last := after[len(after)-1]; tc.result != "" && (last.SubscriptionID != id || last.Result != tc.result || last.Detail != tc.detail) {
				t.Errorf("last subscription_sign_in = %+v, want %s %q", last, tc.result, tc.detail)
			}
			if k := readVaultSubs(t, env)[id].APIKey; k != tc.vaultKey {
				t.Errorf("the vault holds %q, want %q", k, tc.vaultKey)
			}
			if lines := signInLogLines(t, d.stderr.String())[len(logged):]; len(lines) != 1 ||
				lines[0]["level"] != tc.level || lines[0]["subscription_id"] != id {
				t.Errorf("this call's subscription_sign_in log lines = %v, want one at level %s for %s", lines, tc.level, id)
			}
		})
	}
}

// TestFailedSignInDonationJournalsNothing: a sign-in that would donate a new subscription and fails on Brama's side
// (the vault refuses the write) replaced no grant: it journals no subscription_sign_in and logs none (SPEC §9's
// "a sign-in replaced (or failed to replace) a grant"), and the vault holds nothing of it.
func TestFailedSignInDonationJournalsNothing(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	journalPath := filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl")
	if err := os.WriteFile(journalPath, nil, 0o600); err != nil { // empty: opJournal reads it
		t.Fatal(err)
	}
	testingOnlyRename = func(string, string) error { return errors.New("injected rename failure") }
	s, _, b := d.call("POST", "/v1/admin/subscriptions/a1?via=sign-in", d.token, `{"provider":"kimi","api_key":"sk-signin-fails-0123456789"}`)
	testingOnlyRename = nil
	if s != 503 || envelopeOf(t, b)["message"] != "injected rename failure" {
		t.Errorf("%d %s, want 503 naming the failed write", s, b)
	}
	if recs := opJournal(t, env, "subscription_sign_in"); len(recs) != 0 {
		t.Errorf("a failed donation journaled %+v", recs)
	}
	if lines := signInLogLines(t, d.stderr.String()); len(lines) != 0 {
		t.Errorf("a failed donation logged %v", lines)
	}
	if subs := readVaultSubs(t, env); len(subs) != 0 {
		t.Errorf("the vault holds %v after a failed donation", subs)
	}
	// The same sign-in, once the write succeeds, is journaled: the silence above is the failure's, not the route's.
	s, _, b = d.call("POST", "/v1/admin/subscriptions/a1?via=sign-in", d.token, `{"provider":"kimi","api_key":"sk-signin-fails-0123456789"}`)
	if recs := opJournal(t, env, "subscription_sign_in"); s != 201 || len(recs) != 1 || recs[0].Result != "signed_in" {
		t.Errorf("the sign-in after the repair: %d %s, journaled %+v; want 201 and one signed_in record", s, b, recs)
	}
}

// TestSignInRefusedBeforeItsSubscriptionWasReadJournalsNothing: a credential replacement refused before Brama could
// read the subscription it names (the overlay is unreadable) journals and logs no subscription_sign_in: the id was
// never checked against the agent's subscriptions, and the append-only journal keeps only what Brama could tell.
func TestSignInRefusedBeforeItsSubscriptionWasReadJournalsNothing(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	id := donate(t, d, "a1", "kimi", "sk-overlay-0-0123456789")
	if err := os.WriteFile(filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl"), nil, 0o600); err != nil { // opJournal reads it
		t.Fatal(err)
	}
	overlay := filepath.Join(env["BRAMA_STATE_DIR"], overlayFile)
	if err := os.Chmod(overlay, 0o640); err != nil { // the overlay's guard refuses a group-readable file
		t.Fatal(err)
	}
	before, logged := opJournal(t, env, "subscription_sign_in"), len(signInLogLines(t, d.stderr.String()))
	s, _, b := d.call("PUT", "/v1/admin/subscriptions/a1/"+id+"/credential", d.token, `{"api_key":"sk-overlay-1-0123456789"}`)
	os.Chmod(overlay, 0o600)
	if s < 500 {
		t.Errorf("%d %s, want a 5xx naming the overlay", s, b)
	}
	if after := opJournal(t, env, "subscription_sign_in"); len(after) != len(before) {
		t.Errorf("journaled %+v for a replacement that read no subscription", after[len(before):])
	}
	if lines := signInLogLines(t, d.stderr.String())[logged:]; len(lines) != 0 {
		t.Errorf("logged %v for a replacement that read no subscription", lines)
	}
	if k := readVaultSubs(t, env)[id].APIKey; k != "sk-overlay-0-0123456789" {
		t.Errorf("the vault holds %q, want the first key", k)
	}
}

// signInLogLines is every subscription_sign_in line of a daemon's log, decoded, in order.
func signInLogLines(t *testing.T, logs string) (out []map[string]any) {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `"msg":"subscription_sign_in"`) {
			m := map[string]any{}
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			out = append(out, m)
		}
	}
	return out
}

// TestOperatorRoutesWithoutStateDir: every route of this work item must
// journal or read the inventory, so without a state directory each refuses
// 503 naming the cause, and onboarding exits 1 naming it.
func TestOperatorRoutesWithoutStateDir(t *testing.T) {
	d := startDaemon(t, map[string]string{"BRAMA_MODEL_CATALOG_URL": "off"}, "")
	tests := []struct{ name, method, path, body string }{
		{"credential", "PUT", "/v1/admin/subscriptions/a1/sub_0123456789abcdef/credential", `{"api_key":"sk-nostate-0123456789"}`},
		{"probe", "POST", "/v1/admin/subscriptions/a1/sub_0123456789abcdef/probe", ""},
		{"sign-in donation", "POST", "/v1/admin/subscriptions/a1?via=sign-in", `{"provider":"kimi","api_key":"sk-nostate-0123456789"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, b := d.call(tc.method, tc.path, d.token, tc.body)
			e := envelopeOf(t, b)
			if s != 503 || e["code"] != "dependency_unavailable" || !strings.Contains(fmt.Sprint(e["message"]), "$HOME is not defined") {
				t.Errorf("%d %s, want 503 dependency_unavailable naming the cause", s, b)
			}
		})
	}
	// /readyz says there is no state directory, and blames no BRAMA_*_FILE that nobody set.
	if _, _, b := d.call("GET", "/readyz", "", ""); !strings.Contains(string(b), "$HOME is not defined") || strings.Contains(string(b), "not an absolute path") {
		t.Errorf("/readyz without a state directory: %s", b)
	}
	out, errOut, code := runCLI(t, map[string]string{"BRAMA_TOKEN": d.token}, "", "subscription", "list", "-agent", "a1", "-gateway", d.url)
	if code != 1 || !strings.Contains(errOut, "$HOME is not defined") {
		t.Errorf("subscription CLI without a state dir: exit %d, %q %q", code, out, errOut)
	}
}

// TestOneSIGINTEndsSignIn: a built brama waiting at sign-in's code prompt
// (reading stdin) ends at the first SIGINT (SPEC §17).
func TestOneSIGINTEndsSignIn(t *testing.T) {
	bin := builtBinary(t)
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	cmd := exec.Command(bin, "subscription", "sign-in", "-provider", "claude-code", "-agent", "a1", "-gateway", d.url)
	cmd.Env = append(noHomeEnv(), "BRAMA_TOKEN="+d.token)
	stdin, _ := cmd.StdinPipe() // kept open: the command waits for a line
	defer stdin.Close()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(stderr)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			cmd.Process.Kill()
			t.Fatalf("sign-in ended before its code prompt: %v %q", err, line)
		}
		if strings.Contains(line, "paste the code") {
			break
		}
	}
	go io.Copy(io.Discard, rd)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	cmd.Process.Signal(os.Interrupt)
	select {
	case <-waited:
	case <-time.After(30 * time.Second): // a failure bound, not a synchronisation
		cmd.Process.Kill()
		<-waited
		t.Fatal("sign-in still waits for its code after one SIGINT")
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Errorf("sign-in ended with %v, want ended by SIGINT", cmd.ProcessState)
	}
}
