package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// newTestInventory builds an inventory over a fresh state directory.
func newTestInventory(t *testing.T, env map[string]string, clock *testClock) (*inventory, *journal) {
	t.Helper()
	st := resolveState(testEnv(env))
	vpath, verr := st.fileOrState(testEnv(env), "BRAMA_VAULT_FILE", "vault", "vault.json")
	j := newJournal(st, testSys(t, clock.now))
	return newInventory(st, newVault(vpath, verr), j, newLedger(st, testSys(t, nil).log, clock.now), testEnv(env), testSys(t, clock.now)), j
}

// overlayParse is the overlay's strict parser, as newInventory places it.
var overlayParse = newInventory(state{}, nil, nil, nil, func(string) string { return "" }, sys{}).overlay.parse

func TestParseOverlay(t *testing.T) {
	item := `{"id":"sub_0123456789abcdef","provider":"kimi","agent_id":"a1","label":"work","created_at":"2026-01-02T03:04:05.000Z"}`
	tests := []struct {
		name  string
		doc   string
		items int
		want  string // substring of the error; "" means valid
	}{
		{name: "empty file", doc: ``},
		{name: "no items", doc: `{"schema_version":1,"items":[]}`},
		{name: "null items", doc: `{"schema_version":1,"items":null}`},
		{name: "one item", doc: `{"schema_version":1,"items":[` + item + `]}`, items: 1},
		{name: "schema 2", doc: `{"schema_version":2,"items":[]}`, want: "schema_version"},
		{name: "unknown member", doc: `{"schema_version":1,"items":[],"status":{}}`, want: "unknown field"},
		{name: "status on an item", doc: `{"schema_version":1,"items":[` + strings.TrimSuffix(item, "}") + `,"status":"retired"}]}`, want: "unknown field"},
		{name: "duplicate key", doc: `{"schema_version":1,"schema_version":1,"items":[]}`, want: "duplicate key"},
		{name: "duplicate id", doc: `{"schema_version":1,"items":[` + item + `,` + item + `]}`, want: "twice"},
		{name: "bad id", doc: `{"schema_version":1,"items":[` + strings.Replace(item, "sub_0123456789abcdef", "sub_XYZ", 1) + `]}`, want: "16 lower-case hex"},
		{name: "local-openai", doc: `{"schema_version":1,"items":[` + strings.Replace(item, "kimi", "local-openai", 1) + `]}`, want: "takes no subscription"},
		{name: "bad agent", doc: `{"schema_version":1,"items":[` + strings.Replace(item, `"a1"`, `"A 1"`, 1) + `]}`, want: "agent_id"},
		{name: "bad time", doc: `{"schema_version":1,"items":[` + strings.Replace(item, "2026-01-02T03:04:05.000Z", "yesterday", 1) + `]}`, want: "created_at"},
		{name: "trailing data", doc: `{"schema_version":1,"items":[]} {}`, want: "after the JSON"},
		{name: "not UTF-8", doc: "{\"schema_version\":1,\"items\":[],\"\xff\":1}", want: "UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := overlayParse([]byte(tc.doc))
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), overlayInvalid) {
					t.Fatalf("err = %v, want %q naming %q", err, overlayInvalid, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("valid overlay refused: %v", err)
			}
			if len(doc.Items) != tc.items || doc.Items == nil {
				t.Errorf("items = %#v, want %d (non-nil)", doc.Items, tc.items)
			}
		})
	}
}

// overlayInvalid begins every refusal of the overlay file.
const overlayInvalid = "donated-subscription overlay is invalid: "

// FuzzParseOverlay: no panic, every refusal is overlayInvalid's, and an
// accepted overlay re-encodes to a document that parses to the same value.
func FuzzParseOverlay(f *testing.F) {
	f.Add([]byte(`{"schema_version":1,"items":[{"id":"sub_0123456789abcdef","provider":"kimi","agent_id":"a1","label":"work","created_at":"2026-01-02T03:04:05.000Z"}]}`))
	f.Add([]byte(`{"schema_version":1,"items":null}`))
	f.Add([]byte(`{"schema_version":1,"items":[{"id":"sub_0123456789abcdef"}]}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := overlayParse(data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), overlayInvalid) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		b, err := marshalState(doc)
		if err != nil {
			t.Fatalf("accepted overlay does not encode: %v", err)
		}
		again, err := overlayParse(b)
		if err != nil || !reflect.DeepEqual(doc, again) {
			t.Fatalf("round trip: %v\n%#v\n%#v", err, doc, again)
		}
	})
}

func TestCheckLabelAndReason(t *testing.T) {
	tests := []struct {
		name   string
		text   string
		label  bool // accepted as a label
		reason bool // accepted as a reason
	}{
		{name: "empty", text: "", label: true, reason: false},
		{name: "plain", text: "work account", label: true, reason: true},
		{name: "unicode", text: "Zażółć gęślą jaźń ✓", label: true, reason: true},
		{name: "128 bytes", text: strings.Repeat("x", 128), label: true, reason: true},
		{name: "129 bytes", text: strings.Repeat("x", 129), label: false, reason: true},
		{name: "newline", text: "a\nb", label: false, reason: false},
		{name: "tab", text: "a\tb", label: false, reason: false},
		{name: "escape", text: "a\x1b[31mb", label: false, reason: false},
		{name: "bad UTF-8", text: "a\xffb", label: false, reason: false},
		{name: "blank reason", text: "   ", label: true, reason: false},
		{name: "long reason", text: strings.Repeat("y", 513), label: false, reason: false},
	}
	// A reason is checked before the subscription is looked up: an accepted one reaches the 404.
	inv, _ := newTestInventory(t, stateEnv(t), &testClock{t: time.Unix(1_800_000_000, 0)})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			item := overlayItem{ID: "sub_0123456789abcdef", Provider: "kimi", AgentID: "a1", Label: tc.text, CreatedAt: "2026-01-02T03:04:05.000Z"}
			if got := checkItem(item, nil) == nil; got != tc.label {
				t.Errorf("label accepted = %v, want %v", got, tc.label)
			}
			err := inv.setRetired("retire", "a1", "sub_0123456789abcdef", tc.text)
			if got := asAPIError(err).Code != "invalid_request"; got != tc.reason {
				t.Errorf("reason accepted = %v (%v), want %v", got, err, tc.reason)
			}
		})
	}
}

// TestEnvSeconds: BRAMA_SUBSCRIPTION_CACHE_TTL_SECS (whole seconds ≥ 0) and
// BRAMA_MAX_REQUEST_BYTES (whole bytes ≥ 1) go through envWhole; junk is the
// default and an error naming the variable.
func TestEnvSeconds(t *testing.T) {
	const name = "BRAMA_SUBSCRIPTION_CACHE_TTL_SECS"
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", 60 * time.Second, false},
		{" 5 ", 5 * time.Second, false},
		{"0", 0, false},
		{"-1", 60 * time.Second, true},
		{"1.5", 60 * time.Second, true},
		{"forever", 60 * time.Second, true},
		{"2147483648", 60 * time.Second, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var logs bytes.Buffer
			got := envSeconds(testEnv(map[string]string{name: tc.in}), name, "ttl_bad", 0, 60, slog.New(slog.NewJSONHandler(&logs, nil)))
			var rec struct {
				Msg, Cause string
				UsingSecs  int `json:"using_secs"`
			}
			err := json.Unmarshal(logs.Bytes(), &rec)
			if got != tc.want || (err == nil) != tc.wantErr {
				t.Errorf("= %v, logged %q; want %v, a warning %v", got, logs.String(), tc.want, tc.wantErr)
			}
			want := name + "=\"" + strings.TrimSpace(tc.in) + "\" is not a whole number of seconds ≥ 0"
			if err == nil && (rec.Msg != "ttl_bad" || rec.Cause != want || rec.UsingSecs != 60) {
				t.Errorf("logged %+v, want ttl_bad with cause %q, using_secs 60", rec, want)
			}
		})
	}
	const bytes = "BRAMA_MAX_REQUEST_BYTES"
	for in, want := range map[string]int64{"": defaultMaxRequestBytes, "1": 1, "1024": 1024, "0": -1, "lots": -1} {
		n, err := envWhole(testEnv(map[string]string{bytes: in}), bytes, "bytes", 1, defaultMaxRequestBytes, 64)
		if want == -1 {
			if err == nil || err.Error() != bytes+"=\""+in+"\" is not a whole number of bytes ≥ 1" {
				t.Errorf("%s=%q: %d, %v; want the refusal", bytes, in, n, err)
			}
		} else if n != want || err != nil {
			t.Errorf("%s=%q: %d, %v; want %d", bytes, in, n, err, want)
		}
	}
}

// TestInventoryListingCache: a listing is kept for the TTL on the injected
// clock, a retirement another process journals shows only after it, a local
// mutation shows at once, and eligibility (pool) never sees the cache.
func TestInventoryListingCache(t *testing.T) {
	env := stateEnv(t)
	env["BRAMA_SUBSCRIPTION_CACHE_TTL_SECS"] = "30"
	clock := &testClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	inv, j := newTestInventory(t, env, clock)
	a, err := inv.store(overlayItem{AgentID: "a1", Provider: "kimi", Label: "one"}, vaultCredential{APIKey: "sk-cache-one-0123456789"}, "")
	if err != nil {
		t.Fatal(err)
	}
	statuses := func() string {
		t.Helper()
		rows, err := inv.list("a1")
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, r := range rows {
			s = append(s, r.Status)
		}
		return strings.Join(s, ",")
	}
	poolSize := func() int {
		t.Helper()
		p, err := inv.pool("a1", "kimi")
		if err != nil {
			t.Fatal(err)
		}
		return len(p)
	}
	if got := statuses(); got != "active" {
		t.Fatalf("first listing = %q", got)
	}
	// Another process retires it: only the journal changes.
	other := newJournal(resolveState(testEnv(env)), testSys(t, clock.now))
	if err := other.append(journalRecord{Kind: "retire", SubscriptionID: a.ID, Reason: "elsewhere"}); err != nil {
		t.Fatal(err)
	}
	clock.advance(29 * time.Second)
	if got := statuses(); got != "active" {
		t.Errorf("listing inside the TTL = %q, want the cached active", got)
	}
	if n := poolSize(); n != 0 {
		t.Errorf("pool sees %d subscriptions: eligibility read the cache, not the journal", n)
	}
	clock.advance(time.Second)
	if got := statuses(); got != "retired" {
		t.Errorf("listing at the TTL = %q, want retired", got)
	}
	// Local mutations invalidate at once, well inside the TTL.
	steps := []struct {
		name string
		do   func() error
		want string
	}{
		{"reinstate", func() error { return inv.setRetired("reinstate", "a1", a.ID, "back") }, "active"},
		{"donate", func() error {
			_, err := inv.store(overlayItem{AgentID: "a1", Provider: "openai"}, vaultCredential{APIKey: "sk-cache-two-0123456789"}, "")
			return err
		}, "active,active"},
		{"replace credential", func() error { // before the retire: a retired one's is refused
			inv.l.disown(a.ID, "kimi", "refused")
			_, err := inv.store(overlayItem{AgentID: "a1", ID: a.ID}, vaultCredential{APIKey: "sk-cache-new-0123456789"}, "")
			return err
		}, "active,active"},
		{"retire", func() error { return inv.setRetired("retire", "a1", a.ID, "gone") }, "retired,active"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			statuses() // fill the cache
			clock.advance(time.Second)
			if err := st.do(); err != nil {
				t.Fatal(err)
			}
			if got := statuses(); got != st.want {
				t.Errorf("listing right after %s = %q, want %q", st.name, got, st.want)
			}
		})
	}
	if c, _ := inv.credential(a.ID); c.APIKey != "sk-cache-new-0123456789" {
		t.Errorf("credential after replacement = %+v", c)
	}
	if s := inv.l.entry(a.ID).Credential.State; s != credActive {
		t.Errorf("ledger credential after replacement = %s, want active", s)
	}
	if n := len(journalRecords(t, j)); n != 3 {
		t.Errorf("journal has %d lines, want 3 (retire elsewhere, reinstate, retire)", n)
	}
	// A clock stepped back (an NTP correction) is no age inside the TTL: the listing is read again.
	statuses()
	if err := other.append(journalRecord{Kind: "reinstate", SubscriptionID: a.ID, Reason: "elsewhere"}); err != nil {
		t.Fatal(err)
	}
	clock.advance(-time.Hour)
	if got := statuses(); got != "active,active" {
		t.Errorf("listing after the clock stepped back = %q, want the journal's active,active", got)
	}
}

// journalRecords reads every record of j.
func journalRecords(t *testing.T, j *journal) []journalRecord {
	t.Helper()
	recs, err := j.read()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// Listing an agent that has no subscriptions leaves nothing in the listing
// cache: an admin reading unknown agent ids (any id matching the rule)
// grew it by one entry each, never forgotten (seed: caches have TTLs).
func TestInventoryListingCacheKeepsOnlyAgentsWithSubscriptions(t *testing.T) {
	env := stateEnv(t)
	clock := &testClock{t: time.Unix(1_800_000_000, 0)}
	inv, _ := newTestInventory(t, env, clock)
	if _, err := inv.store(overlayItem{AgentID: "a1", Provider: "kimi"}, vaultCredential{APIKey: "sk-cached-0123456789"}, ""); err != nil {
		t.Fatal(err)
	}
	for _, agent := range []string{"a1", "nobody-0", "nobody-1", "nobody-2"} {
		if _, err := inv.list(agent); err != nil {
			t.Fatal(err)
		}
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if _, ok := inv.cache["a1"]; !ok || len(inv.cache) != 1 {
		t.Errorf("the listing cache holds %d agents, want a1's listing alone", len(inv.cache))
	}
}

func TestInventoryTTLZeroDisablesCache(t *testing.T) {
	env := stateEnv(t)
	env["BRAMA_SUBSCRIPTION_CACHE_TTL_SECS"] = "0"
	clock := &testClock{t: time.Unix(1_800_000_000, 0)}
	inv, _ := newTestInventory(t, env, clock)
	it, err := inv.store(overlayItem{AgentID: "a1", Provider: "kimi"}, vaultCredential{APIKey: "sk-ttl0-0123456789"}, "")
	if err != nil {
		t.Fatal(err)
	}
	inv.list("a1")
	other := newJournal(resolveState(testEnv(env)), testSys(t, clock.now))
	other.append(journalRecord{Kind: "retire", SubscriptionID: it.ID, Reason: "x"})
	if rows, _ := inv.list("a1"); len(rows) != 1 || rows[0].Status != "retired" {
		t.Errorf("with TTL 0 the listing is %+v, want it read afresh (retired)", rows)
	}
}

func TestInventoryQueries(t *testing.T) {
	env := stateEnv(t)
	clock := &testClock{t: time.Unix(1_800_000_000, 0)}
	inv, _ := newTestInventory(t, env, clock)
	donate := func(agent, provider string) string {
		t.Helper()
		it, err := inv.store(overlayItem{AgentID: agent, Provider: provider}, vaultCredential{APIKey: "sk-q-0123456789"}, "")
		if err != nil {
			t.Fatal(err)
		}
		return it.ID
	}
	k1, o1, k2, b1 := donate("a1", "kimi"), donate("a1", "openai"), donate("a1", "kimi"), donate("b1", "kimi")
	if err := inv.setRetired("retire", "a1", k1, "x"); err != nil {
		t.Fatal(err)
	}
	ids := func(items []overlayItem, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, it := range items {
			s = append(s, it.ID)
		}
		return strings.Join(s, ",")
	}
	tests := []struct{ name, got, want string }{
		{"pool a1 kimi", ids(inv.pool("a1", "kimi")), k2},
		{"pool a1 openai", ids(inv.pool("a1", "openai")), o1},
		{"pool b1 kimi", ids(inv.pool("b1", "kimi")), b1},
		{"pool b1 openai", ids(inv.pool("b1", "openai")), ""},
		{"agentItems a1", ids(inv.pool("a1", "")), o1 + "," + k2},
		{"items", ids(func() ([]overlayItem, error) { items, _, err := inv.view(); return items, err }()), strings.Join([]string{k1, o1, k2, b1}, ",")},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	if it, _, err := inv.owned("a1", k1, ""); err != nil || it.ID != k1 {
		t.Errorf("owned misses a retired subscription of its owner: %v", err)
	}
	if _, _, err := inv.owned("a1", k1, "reinstate it"); asAPIError(err).Code != "state_conflict" {
		t.Errorf("owned of a retired subscription, refusing retired ones: %v", err)
	}
	if _, _, err := inv.owned("a1", b1, ""); asAPIError(err).Code != "not_found" {
		t.Errorf("owned finds another agent's subscription: %v", err)
	}
	if _, retired, _ := inv.view(); !retired[k1] {
		t.Error("view says k1 is not retired")
	}
	if _, err := inv.credential("sub_ffffffffffffffff"); asAPIError(err).Code != "credential_unauthorized" {
		t.Errorf("credential of an unknown id: %v", err)
	}
	if err := inv.setRetired("retire", "b1", k2, "x"); asAPIError(err).Code != "not_found" {
		t.Errorf("retire of another agent's id: %v, want not_found", err)
	}
	// A hand-broken overlay is 503 for every reader, eligibility included.
	os.WriteFile(filepath.Join(env["BRAMA_STATE_DIR"], overlayFile), []byte(`{"schema_version":1,"items":[],"x":1}`), 0o600)
	for name, err := range map[string]error{
		"pool": func() error { _, err := inv.pool("a1", "kimi"); return err }(),
		"list": func() error { _, err := inv.list("zz"); return err }(),
	} {
		if ae := asAPIError(err); ae.Code != "dependency_unavailable" || !strings.Contains(ae.Message, "overlay") {
			t.Errorf("%s over a broken overlay: %v, want 503 naming the overlay", name, err)
		}
	}
}

func TestInventoryWithoutStateDir(t *testing.T) {
	env := map[string]string{}
	clock := &testClock{t: time.Unix(1_800_000_000, 0)}
	inv, _ := newTestInventory(t, env, clock)
	calls := map[string]error{
		"list": func() error { _, err := inv.list("a1"); return err }(),
		"pool": func() error { _, err := inv.pool("a1", "kimi"); return err }(),
		"donate": func() error {
			_, err := inv.store(overlayItem{AgentID: "a1", Provider: "kimi"}, vaultCredential{APIKey: "k"}, "")
			return err
		}(),
		"retire":    inv.setRetired("retire", "a1", "sub_0123456789abcdef", "x"),
		"reinstate": inv.setRetired("reinstate", "a1", "sub_0123456789abcdef", "x"),
	}
	for name, err := range calls {
		ae := asAPIError(err)
		if ae.Code != "dependency_unavailable" || !strings.Contains(ae.Message, "$HOME is not defined") {
			t.Errorf("%s without a state directory: %v, want 503 naming the cause", name, err)
		}
	}
}

// TestInventoryDonationFillsGrant: a donated codex grant without expiry or
// account takes them from its JWTs (SPEC §6.2), in the vault and the ledger.
func TestInventoryDonationFillsGrant(t *testing.T) {
	env := stateEnv(t)
	clock := &testClock{t: time.Unix(1_800_000_000, 0)}
	inv, _ := newTestInventory(t, env, clock)
	g := oauthGrant{
		AccessToken:  fakeJWT(`{"exp":1790000000}`),
		RefreshToken: "rt-fill-0123456789",
		IDToken:      fakeJWT(`{"https://api.openai.com/auth":{"chatgpt_account_id":"acct-9"}}`),
	}
	it, err := inv.store(overlayItem{AgentID: "a1", Provider: "codex"}, vaultCredential{OAuth: &g}, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := inv.credential(it.ID)
	if err != nil || c.OAuth == nil || c.OAuth.ExpiresAtMs != 1790000000000 || c.OAuth.AccountID != "acct-9" {
		t.Fatalf("vault grant = %+v, %v; want expiry and account from the JWTs", c.OAuth, err)
	}
	if g.ExpiresAtMs != 0 {
		t.Error("donate changed the caller's grant")
	}
	if e := inv.l.entry(it.ID); e.Credential.ExpiresAtMs != 1790000000000 || e.Credential.State != credActive {
		t.Errorf("ledger credential = %+v, want active with the grant's expiry", e.Credential)
	}
}

// TestInventoryReadiness: an active credential makes a payer; every non-retired subscription not active is counted
// in one reauthorization warning; a retired one counts for neither (SPEC §13).
func TestInventoryReadiness(t *testing.T) {
	inv, _ := newTestInventory(t, stateEnv(t), &testClock{t: time.Unix(1_800_000_000, 0)})
	var ids []string
	for range 3 {
		it, err := inv.store(overlayItem{AgentID: "a1", Provider: "kimi"}, vaultCredential{APIKey: "sk-ready-0123456789"}, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, it.ID)
	}
	if err := inv.setRetired("retire", "a1", ids[2], "gone"); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		reauth  string // the subscription whose credential is refused now
		warning string
		payer   bool
	}{
		{"", "", true},
		{ids[2], "", true}, // retired: not counted
		{ids[1], "1 subscription(s) need reauthorization", true},
		{ids[0], "2 subscription(s) need reauthorization", false},
	} {
		if step.reauth != "" {
			inv.l.disown(step.reauth, "kimi", "refused")
		}
		warnings, payer := inv.readiness()
		if got := strings.Join(warnings, "\n"); payer != step.payer || (step.warning == "") != (got == "") ||
			!strings.Contains(got, step.warning) {
			t.Errorf("after %q: warnings %q, payer %v; want %q, payer %v", step.reauth, got, payer, step.warning, step.payer)
		}
	}
}

// TestInventoryCacheExpiresForEveryAgent: once the TTL has passed, every agent's listing is read afresh, not only
// that of the agent whose listing noticed it.
func TestInventoryCacheExpiresForEveryAgent(t *testing.T) {
	env := stateEnv(t)
	clock := &testClock{t: time.Unix(1_800_000_000, 0)}
	inv, _ := newTestInventory(t, env, clock)
	var ids []string
	for _, agent := range []string{"a1", "b1"} {
		it, err := inv.store(overlayItem{AgentID: agent, Provider: "kimi"}, vaultCredential{APIKey: "sk-exp-0123456789"}, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, it.ID)
		inv.list(agent) // cached
	}
	other := newJournal(resolveState(testEnv(env)), testSys(t, clock.now)) // a change the cache cannot see
	other.append(journalRecord{Kind: "retire", SubscriptionID: ids[1], Reason: "x"})
	clock.advance(inv.ttl + time.Second)
	inv.list("a1") // notices the TTL
	if rows, _ := inv.list("b1"); len(rows) != 1 || rows[0].Status != "retired" {
		t.Errorf("b1's listing after the TTL is %+v, want it read afresh (retired)", rows)
	}
}

// TestCredentialIsACopy: a grant handed out by credential is the caller's own; changing it leaves the vault's cache.
func TestCredentialIsACopy(t *testing.T) {
	env := stateEnv(t)
	inv, _ := newTestInventory(t, env, &testClock{t: time.Unix(1_800_000_000, 0)})
	it, err := inv.store(overlayItem{AgentID: "a1", Provider: "claude-code"}, vaultCredential{OAuth: &oauthGrant{AccessToken: "at-0123456789", RefreshToken: "rt-0123456789"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := inv.credential(it.ID)
	c.OAuth.AccessToken = "changed by a caller"
	if again, err := inv.credential(it.ID); err != nil || again.OAuth.AccessToken != "at-0123456789" {
		t.Errorf("credential after a caller changed its copy = %+v, %v; want the vault's grant", again.OAuth, err)
	}
}
