package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// subRow is the part of a listing row the tests read.
type subRow struct {
	ID         string `json:"id"`
	Provider   string `json:"provider"`
	Label      string `json:"label"`
	Status     string `json:"status"`
	Credential *struct {
		State string `json:"state"`
	} `json:"credential"`
}

// listRows decodes a listing body.
func listRows(t *testing.T, b []byte) []subRow {
	t.Helper()
	var body struct {
		Subscriptions []subRow `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &body); err != nil || body.Subscriptions == nil {
		t.Fatalf("not a listing: %s", b)
	}
	return body.Subscriptions
}

// donatedID decodes a 201 donation answer and checks its shape.
func donatedID(t *testing.T, status int, b []byte, wantAgent, wantProvider string) string {
	t.Helper()
	if status != 201 {
		t.Fatalf("donation answered %d: %s", status, b)
	}
	var body map[string]map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("donation answer not JSON: %s", b)
	}
	sub := body["subscription"]
	if len(body) != 1 || len(sub) != 5 {
		t.Errorf("donation answer members: %s; want exactly subscription{id,provider,agent_id,label,status}", b)
	}
	id, _ := sub["id"].(string)
	if !isSubscriptionID(id) || sub["agent_id"] != wantAgent || sub["provider"] != wantProvider || sub["status"] != "active" {
		t.Errorf("donation answer = %s", b)
	}
	return id
}

// readOverlay reads the overlay file of env's state directory.
func readOverlay(t *testing.T, env map[string]string) *overlayDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], overlayFile))
	if errors.Is(err, os.ErrNotExist) {
		return &overlayDoc{SchemaVersion: 1, Items: []overlayItem{}}
	}
	if err != nil {
		t.Fatal(err)
	}
	doc, err := overlayParse(b)
	if err != nil {
		t.Fatalf("overlay on disk: %v", err)
	}
	return doc
}

// readVaultSubs returns the vault's subscriptions section.
func readVaultSubs(t *testing.T, env map[string]string) map[string]vaultCredential {
	t.Helper()
	doc, _, err := readVault(filepath.Join(env["BRAMA_STATE_DIR"], "vault.json"))
	if err != nil {
		t.Fatal(err)
	}
	return doc.Subscriptions
}

func TestSubscriptionDonationPaths(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	bound := addClient(t, env, "app-a1", "-agent", "a1")
	keys := map[string]string{}
	tests := []struct {
		name  string
		token string
		body  string
		path  string
	}{
		{name: "bound bearer", token: bound, path: "/v1/subscriptions/a1",
			body: `{"provider":"kimi","label":"work","api_key":"sk-planted-bound-0123456789"}`},
		{name: "bound bearer, another provider", token: bound, path: "/v1/subscriptions/a1",
			body: `{"provider":"openai","api_key":"sk-planted-second-0123456789"}`},
		{name: "admin twin with oauth", token: d.token, path: "/v1/admin/subscriptions/a1",
			body: `{"provider":"claude-code","label":"max","oauth":{"access_token":"planted-access-0123456789","refresh_token":"planted-refresh-0123456789","expires_at_ms":1790000000000}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, _, b := d.call("POST", tc.path, tc.token, tc.body)
			var req donation
			json.Unmarshal([]byte(tc.body), &req)
			id := donatedID(t, status, b, "a1", req.Provider)
			secret := req.APIKey
			if req.OAuth != nil {
				secret = req.OAuth.RefreshToken
				keys[id+"/access"] = req.OAuth.AccessToken
			}
			keys[id] = secret
			if strings.Contains(string(b), secret) {
				t.Errorf("the donation answer echoes the secret")
			}
			if got := readVaultSubs(t, env)[id]; got.APIKey != req.APIKey || (req.OAuth != nil && (got.OAuth == nil || *got.OAuth != *req.OAuth)) {
				t.Errorf("vault holds %+v for %s, want the donated credential", got, id)
			}
		})
	}
	status, _, b := d.call("GET", "/v1/subscriptions/a1", bound, "")
	if status != 200 {
		t.Fatalf("listing: %d %s", status, b)
	}
	rows := listRows(t, b)
	items := readOverlay(t, env).Items
	if len(rows) != 3 || len(items) != 3 {
		t.Fatalf("listing has %d rows and the overlay %d items, want 3 each: %s", len(rows), len(items), b)
	}
	for i, r := range rows {
		if r.ID != items[i].ID || r.Status != "active" || r.Credential == nil || r.Credential.State != "active" {
			t.Errorf("row %d = %+v, want overlay order and active", i, r)
		}
	}
	if rows[0].Label != "work" || rows[1].Label != "" {
		t.Errorf("labels = %q, %q", rows[0].Label, rows[1].Label)
	}
	// The admin twin's listing sees the same rows as the bound bearer.
	status, _, b2 := d.call("GET", "/v1/admin/subscriptions/a1", d.token, "")
	if status != 200 || len(listRows(t, b2)) != 3 {
		t.Errorf("admin listing: %d %s", status, b2)
	}
	// Retiring writes the journal; then no planted secret may be anywhere
	// but the vault: overlay, journal, ledger, logs.
	if s, _, b := d.call("DELETE", "/v1/subscriptions/a1/"+rows[0].ID, bound, ""); s != 200 {
		t.Fatalf("retire: %d %s", s, b)
	}
	for _, secret := range keys {
		if strings.Contains(string(b)+string(b2), secret) {
			t.Errorf("a listing carries a planted secret")
		}
		assertNoSecret(t, secret, logsBesidesFirstStart(d.stderr.String()), env["BRAMA_STATE_DIR"])
	}
	assertOwnerOnly(t, env["BRAMA_STATE_DIR"])
}

func TestSubscriptionAgentIsolation(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	tokA := addClient(t, env, "app-a", "-agent", "a")
	tokB := addClient(t, env, "app-b", "-agent", "b")
	plain := addClient(t, env, "app")
	s, _, b := d.call("POST", "/v1/subscriptions/b", tokB, `{"provider":"kimi","api_key":"sk-b-0123456789"}`)
	idB := donatedID(t, s, b, "b", "kimi")
	s, _, b = d.call("POST", "/v1/subscriptions/a", tokA, `{"provider":"kimi","api_key":"sk-a-0123456789"}`)
	idA := donatedID(t, s, b, "a", "kimi")

	tests := []struct {
		name, method, path, token, body string
		want                            int
		code                            string
	}{
		{name: "list other", method: "GET", path: "/v1/subscriptions/b", token: tokA, want: 403, code: "forbidden"},
		{name: "donate for other", method: "POST", path: "/v1/subscriptions/b", token: tokA, body: `{"provider":"kimi","api_key":"sk-x-0123456789"}`, want: 403, code: "forbidden"},
		{name: "retire other's under its path", method: "DELETE", path: "/v1/subscriptions/b/" + idB, token: tokA, want: 403, code: "forbidden"},
		{name: "other's id under own path", method: "DELETE", path: "/v1/subscriptions/a/" + idB, token: tokA, want: 404, code: "not_found"},
		{name: "unknown id", method: "DELETE", path: "/v1/subscriptions/a/sub_0000000000000000", token: tokA, want: 404, code: "not_found"},
		{name: "no agent at all", method: "GET", path: "/v1/subscriptions/a", token: plain, want: 403, code: "forbidden"},
		{name: "admin without agent on agent route", method: "GET", path: "/v1/subscriptions/a", token: d.token, want: 403, code: "forbidden"},
		{name: "caller on admin twin", method: "GET", path: "/v1/admin/subscriptions/a", token: tokA, want: 403, code: "forbidden"},
		{name: "admin lists any agent", method: "GET", path: "/v1/admin/subscriptions/b", token: d.token, want: 200},
		{name: "admin reinstate other's id under a", method: "POST", path: "/v1/admin/subscriptions/a/" + idB + "/reinstate", token: d.token, body: `{"reason":"x"}`, want: 404, code: "not_found"},
		{name: "own listing", method: "GET", path: "/v1/subscriptions/a", token: tokA, want: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, b := d.call(tc.method, tc.path, tc.token, tc.body)
			if s != tc.want {
				t.Fatalf("%d %s, want %d", s, b, tc.want)
			}
			if tc.code != "" {
				e := envelopeOf(t, b)
				if e["code"] != tc.code {
					t.Errorf("code = %v, want %s", e["code"], tc.code)
				}
				if strings.HasPrefix(tc.name, "no agent") && !strings.Contains(fmt.Sprint(e["message"]), "bearer bound") {
					t.Errorf("403 message %q does not say to use a bound bearer", e["message"])
				}
				if tc.code == "not_found" && strings.Contains(fmt.Sprint(e["message"]), `"b"`) {
					t.Errorf("404 names the owner: %v", e["message"])
				}
			}
		})
	}
	// Nothing above changed b's subscription or the overlay.
	if items := readOverlay(t, env).Items; len(items) != 2 || items[0].ID != idB || items[1].ID != idA {
		t.Errorf("overlay after refused requests: %+v", items)
	}
	if jb, _ := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl")); strings.Contains(string(jb), "retire") {
		t.Errorf("a refused retire reached the journal:\n%s", jb)
	}
}

func TestSubscriptionRetireAndReinstate(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	tok := addClient(t, env, "app-a1", "-agent", "a1")
	s, _, b := d.call("POST", "/v1/subscriptions/a1", tok, `{"provider":"kimi","api_key":"sk-r-0123456789"}`)
	id := donatedID(t, s, b, "a1", "kimi")
	s, _, b = d.call("POST", "/v1/subscriptions/a1", tok, `{"provider":"kimi","api_key":"sk-s-0123456789"}`)
	other := donatedID(t, s, b, "a1", "kimi")
	journalPath := filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl")
	journalOf := func() []journalRecord {
		jb, _ := os.ReadFile(journalPath)
		recs, bad, torn := readJournalLines(t, jb)
		if len(bad) != 0 || torn {
			t.Fatalf("journal has bad lines: %+v torn=%v", bad, torn)
		}
		var out []journalRecord
		for _, r := range recs {
			if r.Kind == "retire" || r.Kind == "reinstate" {
				out = append(out, r)
			}
		}
		return out
	}
	statusOf := func(id string) (string, string) {
		t.Helper()
		s, _, b := d.call("GET", "/v1/admin/subscriptions/a1", d.token, "")
		if s != 200 {
			t.Fatalf("listing: %d %s", s, b)
		}
		for _, r := range listRows(t, b) {
			if r.ID == id {
				return r.Status, r.Credential.State
			}
		}
		t.Fatalf("%s not listed: %s", id, b)
		return "", ""
	}

	steps := []struct {
		name, method, path, token, body string
		want                            int
		code                            string
		status, cred                    string // expected listing of id afterwards
		journal                         []string
	}{
		{name: "retire with reason", method: "DELETE", path: "/v1/subscriptions/a1/" + id + "?reason=card+lost", token: tok, want: 200,
			status: "retired", cred: "disabled", journal: []string{"retire " + id + " card lost"}},
		{name: "retire again is fine", method: "DELETE", path: "/v1/subscriptions/a1/" + id, token: tok, want: 200,
			status: "retired", cred: "disabled", journal: []string{"retire " + id + " card lost"}},
		{name: "reinstate needs a reason", method: "POST", path: "/v1/admin/subscriptions/a1/" + id + "/reinstate", token: d.token, body: `{"reason":""}`, want: 400, code: "invalid_request",
			status: "retired", cred: "disabled", journal: []string{"retire " + id + " card lost"}},
		{name: "reinstate body is strict", method: "POST", path: "/v1/admin/subscriptions/a1/" + id + "/reinstate", token: d.token, body: `{"reason":"x","why":1}`, want: 400, code: "invalid_request",
			status: "retired", cred: "disabled", journal: []string{"retire " + id + " card lost"}},
		{name: "reinstate", method: "POST", path: "/v1/admin/subscriptions/a1/" + id + "/reinstate", token: d.token, body: `{"reason":"found it"}`, want: 200,
			status: "active", cred: "active", journal: []string{"retire " + id + " card lost", "reinstate " + id + " found it"}},
		{name: "admin retire, default reason", method: "DELETE", path: "/v1/admin/subscriptions/a1/" + id, token: d.token, want: 200,
			status: "retired", cred: "disabled", journal: []string{"retire " + id + " card lost", "reinstate " + id + " found it", "retire " + id + " retired by local"}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			s, _, b := d.call(st.method, st.path, st.token, st.body)
			if s != st.want {
				t.Fatalf("%d %s, want %d", s, b, st.want)
			}
			if st.code != "" && envelopeOf(t, b)["code"] != st.code {
				t.Errorf("code: %s, want %s", b, st.code)
			}
			if st.want == 200 && string(b) != "{\"ok\":true}\n" {
				t.Errorf("answer %q, want {\"ok\":true}", b)
			}
			if gs, gc := statusOf(id); gs != st.status || gc != st.cred {
				t.Errorf("listing shows %s/%s, want %s/%s", gs, gc, st.status, st.cred)
			}
			var got []string
			for _, r := range journalOf() {
				got = append(got, r.Kind+" "+r.SubscriptionID+" "+r.Reason)
			}
			if strings.Join(got, "\n") != strings.Join(st.journal, "\n") {
				t.Errorf("journal:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(st.journal, "\n"))
			}
		})
	}
	if gs, _ := statusOf(other); gs != "active" {
		t.Errorf("the other subscription is %s", gs)
	}

	// A journal that cannot take a line refuses before anything changes.
	os.Chmod(journalPath, 0o644)
	s, _, b = d.call("DELETE", "/v1/subscriptions/a1/"+other, tok, "")
	if e := envelopeOf(t, b); s != 503 || e["code"] != "dependency_unavailable" || !strings.Contains(fmt.Sprint(e["message"]), "journal") {
		t.Errorf("retire with an unusable journal: %d %s, want 503 naming the journal", s, b)
	}
	os.Chmod(journalPath, 0o600)
	if n := len(journalOf()); n != 3 {
		t.Errorf("journal has %d retire/reinstate lines after the refusal, want 3", n)
	}
	if gs, _ := statusOf(other); gs != "active" {
		t.Errorf("a refused retire changed the other subscription to %s", gs)
	}
	for _, ev := range []string{"subscription_donated", "subscription_retire", "subscription_reinstate"} {
		if !logEvent(d.stderr.String(), ev, map[string]string{"subscription_id": id, "agent_id": "a1"}) {
			t.Errorf("no %s line for %s of agent a1:\n%s", ev, id, d.stderr.String())
		}
	}
}

// TestSubscriptionOverlayWriteFails injects a rename failure for the overlay
// only; it must not run in parallel with other writers (testingOnlyRename is
// package-wide).
func TestSubscriptionOverlayWriteFails(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	tok := addClient(t, env, "app-a1", "-agent", "a1")
	s, _, b := d.call("POST", "/v1/subscriptions/a1", tok, `{"provider":"kimi","api_key":"sk-kept-0123456789"}`)
	kept := donatedID(t, s, b, "a1", "kimi")

	var mu sync.Mutex // guards renamed: other writers of the daemon may rename too
	var renamed []string
	testingOnlyRename = func(oldpath, newpath string) error {
		if b := filepath.Base(newpath); b == "vault.json" || b == overlayFile {
			mu.Lock()
			renamed = append(renamed, b)
			mu.Unlock()
		}
		if filepath.Base(newpath) == overlayFile {
			return errors.New("injected overlay rename failure")
		}
		return os.Rename(oldpath, newpath)
	}
	defer func() { testingOnlyRename = nil }()
	s, _, b = d.call("POST", "/v1/subscriptions/a1", tok, `{"provider":"kimi","api_key":"sk-orphan-0123456789"}`)
	testingOnlyRename = nil
	mu.Lock()
	defer mu.Unlock()
	if s != 500 || envelopeOf(t, b)["code"] != "internal_error" {
		t.Fatalf("donation with a failing overlay write: %d %s, want 500 internal_error", s, b)
	}
	if !logEvent(d.stderr.String(), "subscription_overlay_write_failed", map[string]string{"subscription_id": "sub_", "cause": "injected overlay rename failure"}) {
		t.Errorf("no subscription_overlay_write_failed line naming its cause:\n%s", d.stderr.String())
	}
	// The vault first, then the overlay; its failure takes the secret back.
	if want := "vault.json," + overlayFile + ",vault.json"; strings.Join(renamed, ",") != want {
		t.Errorf("renames = %v, want %s", renamed, want)
	}
	items := readOverlay(t, env).Items
	if len(items) != 1 || items[0].ID != kept {
		t.Errorf("overlay after the failure = %+v, want only %s", items, kept)
	}
	for id, c := range readVaultSubs(t, env) {
		if id != kept {
			t.Errorf("the vault keeps %s (key %q) after its donation failed", id, c.APIKey)
		}
	}
	if s, _, b := d.call("GET", "/v1/subscriptions/a1", tok, ""); s != 200 || len(listRows(t, b)) != 1 {
		t.Errorf("listing after the failure: %d %s, want only the kept subscription", s, b)
	}
	ents, _ := os.ReadDir(env["BRAMA_STATE_DIR"])
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
	// An orphan that appears while serve runs (here: written beside it) is
	// reported by /readyz and by the inventory until the operator prunes it.
	const orphan = "sub_00000000000000ff"
	v := newVault(filepath.Join(env["BRAMA_STATE_DIR"], "vault.json"), nil)
	if err := v.update(func(d *vaultDoc) error {
		d.Subscriptions[orphan] = vaultCredential{APIKey: "sk-orphan-0123456789"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, b := d.call("GET", "/readyz", "", ""); !strings.Contains(string(b), "no overlay entry, unused: "+orphan) {
		t.Errorf("/readyz does not warn about the orphan %s: %s", orphan, b)
	}
	st := resolveState(testEnv(env))
	inv := newInventory(st, v, newJournal(st, testSys(t, nil)), newLedger(st, testSys(t, nil).log, time.Now), testEnv(env), testSys(t, nil))
	if got, err := inv.orphans(); err != nil || len(got) != 1 || got[0] != orphan {
		t.Errorf("orphans = %v, %v; want [%s]", got, err, orphan)
	}
}

func TestSubscriptionDonationBodies(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	tok := addClient(t, env, "app-a1", "-agent", "a1")
	const key = "sk-body-secret-0123456789"
	grant := `{"access_token":"acc-secret-0123456789","refresh_token":"ref-secret-0123456789","expires_at_ms":0}`
	tests := []struct {
		name, body, mention string
	}{
		{"unknown provider", `{"provider":"nope","api_key":"` + key + `"}`, "nope"},
		{"local-openai", `{"provider":"local-openai","api_key":"` + key + `"}`, "local-openai"},
		{"neither", `{"provider":"kimi"}`, "exactly one"},
		{"both", `{"provider":"kimi","api_key":"` + key + `","oauth":` + grant + `}`, "exactly one"},
		{"oauth for a direct provider", `{"provider":"openai","oauth":` + grant + `}`, "oauth"},
		{"grant without refresh token", `{"provider":"codex","oauth":{"access_token":"acc-secret-0123456789","expires_at_ms":0}}`, "refresh_token"},
		{"unknown member", `{"provider":"kimi","api_key":"` + key + `","plan":"pro"}`, "plan"},
		{"unknown grant member", `{"provider":"kimi","oauth":{"access_token":"a","refresh_token":"b","expires_at_ms":0,"scope":"x"}}`, "scope"},
		{"label too long", `{"provider":"kimi","api_key":"` + key + `","label":"` + strings.Repeat("x", 129) + `"}`, "label"},
		{"label with a newline", `{"provider":"kimi","api_key":"` + key + `","label":"a\nb"}`, "label"},
		{"key with a newline", `{"provider":"kimi","api_key":"` + key + `\nmore"}`, "api_key"},
		{"access token with its file's newline", `{"provider":"claude-code","oauth":{"access_token":"acc-secret-0123456789\n","refresh_token":"ref-secret-0123456789","expires_at_ms":0}}`, "printable"},
		{"refresh token with a NUL", `{"provider":"codex","oauth":{"access_token":"acc-secret-0123456789","refresh_token":"ref-secret\u0000-0123456789","expires_at_ms":0}}`, "printable"},
		{"malformed", `{"provider":"kimi","api_key":"` + key, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, b := d.call("POST", "/v1/subscriptions/a1", tok, tc.body)
			e := envelopeOf(t, b)
			if s != 400 || e["code"] != "invalid_request" {
				t.Fatalf("%d %s, want 400 invalid_request", s, b)
			}
			if !strings.Contains(fmt.Sprint(e["message"]), tc.mention) {
				t.Errorf("message %q does not mention %q", e["message"], tc.mention)
			}
			for _, secret := range []string{key, "acc-secret", "ref-secret"} {
				if strings.Contains(string(b), secret) {
					t.Errorf("the refusal quotes a secret: %s", b)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(env["BRAMA_STATE_DIR"], overlayFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused donation created the overlay (%v)", err)
	}
	if subs := readVaultSubs(t, env); len(subs) != 0 {
		t.Errorf("a refused donation wrote the vault: %d entries", len(subs))
	}
	assertNoSecret(t, key, logsBesidesFirstStart(d.stderr.String()), env["BRAMA_STATE_DIR"])
}

// TestSubscriptionReadiness: an active subscription is a payer, one that
// needs reauthorization is a warning, and a broken overlay is a reason
// (SPEC §13).
func TestSubscriptionReadiness(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	ready := func() readiness {
		t.Helper()
		_, _, b := d.call("GET", "/readyz", "", "")
		var rd readiness
		if err := json.Unmarshal(b, &rd); err != nil {
			t.Fatalf("/readyz: %s", b)
		}
		return rd
	}
	if rd := ready(); rd.Ready {
		t.Fatalf("ready with no payer at all: %+v", rd)
	}
	s, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"sk-ready-0123456789"}`)
	donatedID(t, s, b, "a1", "kimi")
	if rd := ready(); !rd.Ready {
		t.Errorf("an active subscription is not a payer: %+v", rd)
	}
	path := filepath.Join(env["BRAMA_STATE_DIR"], overlayFile)
	good, _ := os.ReadFile(path)
	os.WriteFile(path, append([]byte(`{"extra":true,`), good[1:]...), 0o600)
	rd := ready()
	if rd.Ready || !strings.Contains(strings.Join(rd.Reasons, "\n"), "overlay") || !strings.Contains(strings.Join(rd.Reasons, "\n"), "extra") {
		t.Errorf("a broken overlay is not a reason naming it: %+v", rd)
	}
	if s, _, b := d.call("GET", "/v1/admin/subscriptions/a1", d.token, ""); s != 503 || envelopeOf(t, b)["code"] != "dependency_unavailable" {
		t.Errorf("listing over a broken overlay: %d %s, want 503", s, b)
	}
	os.WriteFile(path, good, 0o600)
	if rd := ready(); !rd.Ready {
		t.Errorf("not ready after the overlay was repaired: %+v", rd)
	}
}

func TestSubscriptionsWithoutStateDir(t *testing.T) {
	d := startDaemon(t, map[string]string{"BRAMA_MODEL_CATALOG_URL": "off"}, "")
	if d.token == "" {
		t.Fatal("no process-only admin token printed")
	}
	tests := []struct{ name, method, path, body string }{
		{"list", "GET", "/v1/admin/subscriptions/a1", ""},
		{"donate", "POST", "/v1/admin/subscriptions/a1", `{"provider":"kimi","api_key":"sk-nostate-0123456789"}`},
		{"retire", "DELETE", "/v1/admin/subscriptions/a1/sub_0123456789abcdef", ""},
		{"reinstate", "POST", "/v1/admin/subscriptions/a1/sub_0123456789abcdef/reinstate", `{"reason":"x"}`},
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
}

func TestSubscriptionCLI(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	withToken := maps.Clone(env)
	withToken["BRAMA_TOKEN"] = d.token
	gw := []string{"-gateway", d.url}
	cli := func(t *testing.T, env map[string]string, stdin string, args ...string) (string, string, int) {
		t.Helper()
		return runCLI(t, env, stdin, append(args, gw...)...)
	}

	// add: the key on stdin (token from BRAMA_TOKEN), then token and key on stdin.
	out, errOut, code := cli(t, withToken, "sk-cli-one-0123456789\n", "subscription", "add", "-provider", "kimi", "-agent", "a1", "-label", "first")
	id1 := strings.TrimSpace(out)
	if code != 0 || !isSubscriptionID(id1) || !strings.Contains(errOut, "donated kimi subscription "+id1) {
		t.Fatalf("add: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = cli(t, env, d.token+"\nsk-cli-two-0123456789\n", "subscription", "add", "-agent", "a1", "-provider", "openai")
	id2 := strings.TrimSpace(out)
	if code != 0 || !isSubscriptionID(id2) {
		t.Fatalf("add with the token on stdin: exit %d, %q %q", code, out, errOut)
	}
	grantFile := filepath.Join(t.TempDir(), "grant.json")
	os.WriteFile(grantFile, []byte(`{"access_token":"acc-cli-0123456789","refresh_token":"ref-cli-0123456789","expires_at_ms":1790000000000}`), 0o600)
	out, errOut, code = cli(t, withToken, "", "subscription", "add", "-provider", "kimi", "-agent", "a1", "-oauth-file", grantFile)
	id3 := strings.TrimSpace(out)
	if code != 0 || !isSubscriptionID(id3) {
		t.Fatalf("add -oauth-file: exit %d, %q %q", code, out, errOut)
	}
	claudeFile := filepath.Join(t.TempDir(), ".credentials.json")
	os.WriteFile(claudeFile, []byte(`{"claudeAiOauth":{"accessToken":"sk-ant-oat01-cli-0123456789","refreshToken":"sk-ant-ort01-cli-0123456789","expiresAt":1790000000000}}`), 0o600)
	out, errOut, code = cli(t, withToken, "", "subscription", "import", "-provider", "claude-code", "-from", claudeFile, "-agent", "a1", "-label", "laptop")
	id4 := strings.TrimSpace(out)
	if code != 0 || !isSubscriptionID(id4) {
		t.Fatalf("import: exit %d, %q %q", code, out, errOut)
	}
	if !strings.Contains(errOut, "after Brama's first refresh, Claude Code will need to sign in again") || !strings.Contains(errOut, "if Claude Code refreshes first") {
		t.Errorf("import does not say who must sign in again: %q", errOut)
	}
	vault := readVaultSubs(t, env)
	if vault[id1].APIKey != "sk-cli-one-0123456789" || vault[id2].APIKey != "sk-cli-two-0123456789" ||
		vault[id3].OAuth == nil || vault[id3].OAuth.RefreshToken != "ref-cli-0123456789" ||
		vault[id4].OAuth == nil || vault[id4].OAuth.AccessToken != "sk-ant-oat01-cli-0123456789" || vault[id4].OAuth.ExpiresAtMs != 1790000000000 {
		t.Errorf("vault after the CLI donations: %+v", vault)
	}

	// retire and reinstate, then list as a table and as JSON.
	if out, errOut, code := cli(t, withToken, "", "subscription", "retire", id1, "-agent", "a1", "-reason", "rotated key"); code != 0 || out != "retired "+id1+"\n" {
		t.Fatalf("retire: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code := cli(t, withToken, "", "subscription", "retire", "-agent", "a1", id2); code != 0 {
		t.Fatalf("retire without a reason: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code := cli(t, withToken, "", "subscription", "reinstate", "-agent", "a1", "-reason", "back", id2); code != 0 || out != "reinstated "+id2+"\n" {
		t.Fatalf("reinstate: exit %d, %q %q", code, out, errOut)
	}
	out, _, code = cli(t, withToken, "", "subscription", "list", "-agent", "a1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 6 || !regexp.MustCompile(`^ID\s+PROVIDER\s+STATUS\s+CREDENTIAL\s+USED\s+LABEL$`).MatchString(lines[0]) {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	wantRows := []string{id1 + ` +kimi +retired +disabled +- +first`, id2 + ` +openai +active +active +- +-$`, id3 + ` +kimi +active +active +- +-$`, id4 + ` +claude-code +active +active +- +laptop`}
	for i, w := range wantRows {
		if !regexp.MustCompile("^" + w).MatchString(lines[i+1]) {
			t.Errorf("row %d = %q, want %q", i, lines[i+1], w)
		}
	}
	if lines[5] != "4 subscription(s), 1 retired" {
		t.Errorf("summary = %q", lines[5])
	}
	out, _, code = cli(t, withToken, "", "subscription", "list", "-json", "-agent", "a1")
	_, _, body := d.call("GET", "/v1/admin/subscriptions/a1", d.token, "")
	if code != 0 || out != string(body) || len(listRows(t, []byte(out))) != 4 {
		t.Errorf("list -json printed %q, want the body %q", out, body)
	}
	jb, _ := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl"))
	for _, want := range []string{`"kind":"retire","at":`, `"subscription_id":"` + id1 + `","reason":"rotated key"`, `"reason":"retired by local"`, `"kind":"reinstate"`} {
		if !strings.Contains(string(jb), want) {
			t.Errorf("journal lacks %s:\n%s", want, jb)
		}
	}
	for _, secret := range []string{"sk-cli-one-0123456789", "ref-cli-0123456789", "sk-ant-ort01-cli-0123456789"} {
		assertNoSecret(t, secret, logsBesidesFirstStart(d.stderr.String()), env["BRAMA_STATE_DIR"])
	}

	// Refusals: exit 2 for the command line, 1 for everything else.
	tests := []struct {
		name     string
		env      map[string]string
		stdin    string
		args     []string
		code     int
		mentions string
	}{
		{"reinstate without reason", withToken, "", []string{"subscription", "reinstate", "-agent", "a1", id1}, 2, "-reason"},
		{"list without agent", withToken, "", []string{"subscription", "list"}, 2, "-agent"},
		{"retire without id", withToken, "", []string{"subscription", "retire", "-agent", "a1"}, 2, "brama subscription retire: want -agent A [-reason R] ID; see brama subscription retire -h"},
		{"unknown subcommand", withToken, "", []string{"subscription", "frobnicate"}, 2, "subscription wants one of add, list, retire, reinstate, import, sign-in, prune-orphans"},
		{"a flag where the subcommand goes", withToken, "", []string{"subscription", "-agent", "a1"}, 2, "brama: subscription wants one of add,"},
		{"import of kimi", withToken, "", []string{"subscription", "import", "-provider", "kimi", "-from", claudeFile, "-agent", "a1"}, 2, "claude-code or codex"},
		{"no token", env, "", []string{"subscription", "list", "-agent", "a1"}, 1, "BRAMA_TOKEN"},
		{"wrong token", env, "brama_wrong\n", []string{"subscription", "list", "-agent", "a1"}, 1, "401 unauthenticated"},
		{"bad agent id", withToken, "sk-x-0123456789\n", []string{"subscription", "add", "-provider", "kimi", "-agent", "Ghost"}, 1, "must match"},
		{"no key", withToken, "", []string{"subscription", "add", "-provider", "kimi", "-agent", "a1"}, 1, "no API key"},
		{"retire unknown id", withToken, "", []string{"subscription", "retire", "-agent", "a1", "sub_0000000000000000"}, 1, "404 not_found"},
		{"bad oauth file", withToken, "", []string{"subscription", "add", "-provider", "kimi", "-agent", "a1", "-oauth-file", claudeFile}, 1, "unknown field"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := cli(t, tc.env, tc.stdin, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.mentions) {
				t.Errorf("exit %d, stderr %q; want exit %d mentioning %q (stdout %q)", code, errOut, tc.code, tc.mentions, out)
			}
		})
	}
	if _, errOut, code := runCLI(t, withToken, "", "subscription", "list", "-agent", "a1", "-gateway", "ftp://x"); code != 2 || !strings.Contains(errOut, "-gateway") {
		t.Errorf("bad -gateway: exit %d, %q", code, errOut)
	}
	if _, errOut, code := runCLI(t, withToken, "", "subscription", "list", "-agent", "a1", "-gateway", "http://127.0.0.1:1"); code != 1 || !strings.Contains(errOut, "cannot reach the gateway") {
		t.Errorf("unreachable gateway: exit %d, %q", code, errOut)
	}
	// The listing JSON must still decode as rows after all of this.
	var body2 map[string]json.RawMessage
	if err := json.Unmarshal(body, &body2); err != nil || len(body2) != 1 {
		t.Errorf("listing body members: %s", body)
	}
}

// TestSubscriptionPoolLimit: an agent holds at most 64 non-retired
// subscriptions of a provider; the 65th donation is 400 naming the limit,
// and a retirement or another provider makes room (SPEC §17).
func TestSubscriptionPoolLimit(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	tok := addClient(t, env, "app-a1", "-agent", "a1")
	donate := func(provider string, i int) (int, []byte) {
		s, _, b := d.call("POST", "/v1/subscriptions/a1", tok, fmt.Sprintf(`{"provider":%q,"api_key":"sk-pool-%03d-0123456789"}`, provider, i))
		return s, b
	}
	var first string
	for i := range maxPoolSize {
		s, b := donate("kimi", i)
		if id := donatedID(t, s, b, "a1", "kimi"); i == 0 {
			first = id
		}
	}
	s, b := donate("kimi", maxPoolSize)
	if e := envelopeOf(t, b); s != 400 || e["code"] != "invalid_request" || !strings.Contains(fmt.Sprint(e["message"]), "64 non-retired kimi subscriptions, the limit") {
		t.Fatalf("the 65th kimi donation = %d %s, want 400 invalid_request naming the limit", s, b)
	}
	if n := len(readOverlay(t, env).Items); n != maxPoolSize {
		t.Errorf("the overlay holds %d items after the refusal, want %d", n, maxPoolSize)
	}
	if n := len(readVaultSubs(t, env)); n != maxPoolSize {
		t.Errorf("the vault holds %d subscriptions after the refusal, want %d", n, maxPoolSize)
	}
	// A full pool's credential may still be replaced: the limit is on subscriptions, not on keys.
	put := `{"api_key":"sk-pool-new-0123456789"}`
	if s, _, b := d.call("PUT", "/v1/admin/subscriptions/a1/"+first+"/credential", d.token, put); s != 200 {
		t.Errorf("replacing a credential in a full pool: %d %s, want 200", s, b)
	}
	s, b = donate("deepseek", 0)
	donatedID(t, s, b, "a1", "deepseek")
	if s, _, b := d.call("DELETE", "/v1/subscriptions/a1/"+first, tok, ""); s != 200 {
		t.Fatalf("retire: %d %s", s, b)
	}
	s, b = donate("kimi", maxPoolSize)
	donatedID(t, s, b, "a1", "kimi")
}

// TestOverlayLostKeepsCredentialsAndRefusesDonations: with the overlay
// deleted or emptied and serve restarted, the vault still holds every
// credential, /readyz names them (never a secret) and says to restore the
// overlay, one log line counts them, and a donation or a prune is refused
// 503 naming the cause until the overlay is restored (SPEC §17).
func TestOverlayLostKeepsCredentialsAndRefusesDonations(t *testing.T) {
	for _, lose := range []string{"deleted", "emptied"} {
		t.Run(lose, func(t *testing.T) {
			env := stateEnv(t)
			d := startDaemon(t, env, "")
			admin := d.token // printed at first start only
			s, _, b := d.call("POST", "/v1/admin/subscriptions/a1", admin, `{"provider":"kimi","api_key":"plantedKimiKeyKept"}`)
			id := donatedID(t, s, b, "a1", "kimi")
			d.stop()
			overlay := filepath.Join(env["BRAMA_STATE_DIR"], overlayFile)
			saved, err := os.ReadFile(overlay)
			if err != nil {
				t.Fatal(err)
			}
			if lose == "deleted" {
				err = os.Remove(overlay)
			} else {
				err = os.Truncate(overlay, 0)
			}
			if err != nil {
				t.Fatal(err)
			}

			d = startDaemon(t, env, "")
			if subs := readVaultSubs(t, env); subs[id].APIKey != "plantedKimiKeyKept" {
				t.Fatalf("the vault lost %s's credential at start: %v", id, subs)
			}
			if n := strings.Count(d.stderr.String(), `"msg":"vault_orphans_unremoved","count":1,`); n != 1 {
				t.Errorf("%d vault_orphans_unremoved lines counting 1, want 1:\n%s", n, d.stderr.String())
			}
			_, _, rb := d.call("GET", "/readyz", "", "")
			if !strings.Contains(string(rb), "unused: "+id+"; "+overlayFile+" is missing or empty: restore it") || strings.Contains(string(rb), "plantedKimiKeyKept") {
				t.Errorf("/readyz does not name %s and the restore, or quotes the secret: %s", id, rb)
			}
			for _, path := range []string{"/v1/admin/subscriptions/a1", "/v1/admin/vault/prune-orphans"} {
				s, _, b := d.call("POST", path, admin, `{"provider":"kimi","api_key":"plantedKimiKeyNew"}`)
				if path != "/v1/admin/subscriptions/a1" {
					s, _, b = d.call("POST", path, admin, "")
				}
				e := envelopeOf(t, b)
				if s != 503 || e["code"] != "dependency_unavailable" || !strings.Contains(fmt.Sprint(e["message"]), "restore donated-subscriptions.json") {
					t.Errorf("POST %s while the overlay is %s: %d %s, want 503 dependency_unavailable naming the restore", path, lose, s, b)
				}
			}
			if subs := readVaultSubs(t, env); len(subs) != 1 || subs[id].APIKey != "plantedKimiKeyKept" {
				t.Errorf("the refused writes changed the vault: %d entries", len(subs))
			}
			if err := os.WriteFile(overlay, saved, 0o600); err != nil { // the operator restores it
				t.Fatal(err)
			}
			s, _, b = d.call("POST", "/v1/admin/subscriptions/a1", admin, `{"provider":"kimi","api_key":"plantedKimiKeyNew"}`)
			donatedID(t, s, b, "a1", "kimi")
			if n := len(readOverlay(t, env).Items); n != 2 {
				t.Errorf("the overlay holds %d items after the restore and a donation, want 2", n)
			}
		})
	}
}
