package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestJournalTornRecordNeverBecomesHistory: a short write can leave a whole
// record without its newline (the append was refused, "not changed"). SPEC §9
// ignores that torn final line, and the next append must not turn it into
// history: it stays an unreadable line (README: "like any other").
func TestJournalTornRecordNeverBecomesHistory(t *testing.T) {
	j, _ := newTestJournal(t)
	first := `{"kind":"retire","at":"2025-01-01T00:00:00.000Z","subscription_id":"sub_1","reason":"r"}` + "\n"
	torn := `{"kind":"retire","at":"2025-01-01T00:00:01.000Z","subscription_id":"sub_2","reason":"r"}`
	writeJournalFile(t, j, first+torn)
	if got, err := j.retired(); err != nil || !cmp.Equal(got, map[string]bool{"sub_1": true}) {
		t.Fatalf("retired with the torn tail = %v, %v; want only sub_1", got, err)
	}

	if err := j.append(journalRecord{Kind: "reinstate", SubscriptionID: "sub_1", Reason: "back"}); err != nil {
		t.Fatal(err)
	}
	if got, err := j.retired(); err != nil || len(got) != 0 {
		t.Errorf("retired after the next append = %v, %v; the torn retire of sub_2 became history", got, err)
	}
	var out bytes.Buffer
	ok, err := checkJournal(j, &out)
	if err != nil || ok || !strings.HasPrefix(out.String(), "line 2: ") {
		t.Errorf("journal check after the next append = %v, %v, %q; want line 2 reported", ok, err, out.String())
	}
	recs, _ := j.read()
	if len(recs) != 2 || recs[1].Kind != "reinstate" {
		t.Errorf("records after the append = %+v; want the first retire and the reinstate", recs)
	}
}

// bigJournal writes a 1,000,000-line (152 MiB) journal into a fresh state
// directory, never holding it whole in this process's memory.
func bigJournal(b *testing.B) string {
	dir := filepath.Join(b.TempDir(), "state")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "journal.jsonl"), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i := range 1_000_000 {
		kind := "retire"
		if i%2 == 1 {
			kind = "reinstate"
		}
		fmt.Fprintf(w, `{"kind":%q,"at":"2026-11-29T22:00:00.000Z","subscription_id":"sub_%016x","reason":"rotated by the operator during the quarterly key review"}`+"\n", kind, i/2)
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		b.Fatal(err)
	}
	return dir
}

// BenchmarkJournalFirstFold folds bigJournal from the start, as the first
// request, probe or pass after serve starts does. Run it alone (-run XXX
// -benchtime 1x): peak-RSS-MiB is the process's.
func BenchmarkJournalFirstFold(b *testing.B) {
	dir := bigJournal(b)
	sy := sys{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), now: journalTestNow}
	b.ReportAllocs()
	for b.Loop() {
		j := newJournal(state{dir: dir}, sy)
		if got, err := j.retired(); err != nil || len(got) != 0 {
			b.Fatalf("retired = %d ids, %v", len(got), err)
		}
	}
	b.ReportMetric(processPeakRSSMB(), "peak-RSS-MiB")
}

// BenchmarkJournalCheck is `brama journal check` on bigJournal; run it alone
// as BenchmarkJournalFirstFold.
func BenchmarkJournalCheck(b *testing.B) {
	dir := bigJournal(b)
	sy := sys{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), now: journalTestNow}
	b.ReportAllocs()
	for b.Loop() {
		if ok, err := checkJournal(newJournal(state{dir: dir}, sy), io.Discard); !ok || err != nil {
			b.Fatalf("journal check = %v, %v", ok, err)
		}
	}
	b.ReportMetric(processPeakRSSMB(), "peak-RSS-MiB")
}

// TestAliasWithAnUnreadableVault: a vault from a newer schema (or failing a
// guard) is unreadable, and SPEC §2.2 answers that 503 credential_unauthorized
// wherever a credential is needed: through an alias as on the canonical route,
// never "no direct credential is configured", which sends the operator to set
// a key the vault already holds.
func TestAliasWithAnUnreadableVault(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	d := startDaemon(t, env, "")
	const key = "sk-planted-newer-vault-0123456789"
	vault := `{"schema_version":2,"direct":{"openai":{"api_key":"` + key + `"}},"subscriptions":{}}`
	if err := os.WriteFile(filepath.Join(dir, "vault.json"), []byte(vault), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "routes.json"), []byte(`{"schema_version":1,"routes":{"fast":"openai/gpt-4o"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"openai/gpt-4o", "fast"} {
		status, _, b := d.call("POST", "/v1/chat/completions", d.token, `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`)
		if e := envelopeOf(t, b); status != 503 || e["code"] != "credential_unauthorized" || e["message"] != "the vault is unreadable" {
			t.Errorf("model %q, vault of schema 2: %d %s, want 503 credential_unauthorized naming the vault", model, status, b)
		}
		if strings.Contains(string(b), key) {
			t.Errorf("the refusal quotes the vault's key: %s", b)
		}
	}
}

// TestPlantedLockSymlinkIsNotFollowed: a lock file planted as a symlink must
// not make Brama create or open a file outside the state directory; the
// writer refuses, naming the lock, and the target stays untouched.
func TestPlantedLockSymlinkIsNotFollowed(t *testing.T) {
	tests := []struct {
		name, lock string
		args       []string
	}{
		{"vault", "vault.json.lock", []string{"credentials", "set", "openai"}},
		{"clients file", "clients.json.lock", []string{"clients", "add", "app"}},
		{"route registry", "routes.json.lock", []string{"routes", "set", "fast", "openai/gpt-4o"}},
		{"serve", "serve.lock", []string{"serve", "-addr", "127.0.0.1:0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := stateEnv(t)
			dir := env["BRAMA_STATE_DIR"]
			outside := filepath.Join(t.TempDir(), "outside")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(dir, tt.lock)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // serve, when it starts, stops at once
			var errb bytes.Buffer
			code := exitCode(run(ctx, nil, tt.args, testEnv(env), strings.NewReader("sk-planted-0123456789\n"), io.Discard, &errb), &errb)
			errOut := errb.String()
			if _, err := os.Lstat(outside); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%v followed the planted %s: %s exists (%v)", tt.args, tt.lock, outside, err)
			}
			if code != 1 || !strings.Contains(errOut, tt.lock) {
				t.Errorf("%v with %s a symlink: exit %d, stderr %q; want exit 1 naming it", tt.args, tt.lock, code, errOut)
			}
		})
	}
}

// TestSignedAnswerPlantedDirectorySymlink: answers/ or answers/<client>/
// planted as a symlink would put kept answers (and the reservation that
// guards one spend) outside the state directory; the request is refused as
// having no place to be kept (SPEC §2.1's 500), before any provider call.
func TestSignedAnswerPlantedDirectorySymlink(t *testing.T) {
	for _, planted := range []string{"answers", filepath.Join("answers", "local")} {
		t.Run(planted, func(t *testing.T) {
			d, fake, env := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
			outside := t.TempDir()
			link := filepath.Join(env["BRAMA_STATE_DIR"], planted)
			if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, link); err != nil {
				t.Fatal(err)
			}
			got := postAnswer(d, "k1", answerBody("hi"))
			e := envelopeOf(t, got.body)
			if got.status != 500 || e["code"] != "internal_error" || !strings.Contains(fmt.Sprint(e["message"]), "has no place to be kept") {
				t.Errorf("answers through a planted %s symlink: %d %s; want 500 no place to be kept", planted, got.status, got.body)
			}
			if n := fake.calls.Load(); n != 0 {
				t.Errorf("the provider was called %d times", n)
			}
			var found []string
			filepath.Walk(outside, func(p string, fi os.FileInfo, err error) error {
				if err == nil && !fi.IsDir() {
					found = append(found, p)
				}
				return nil
			})
			if len(found) != 0 {
				t.Errorf("files written outside the state directory: %v", found)
			}
		})
	}
}

// TestStrictDecoderMatchesMemberNamesExactly: encoding/json takes "Direct"
// for "direct", so {"direct":…,"Direct":…} was a duplicate the strict decoder
// let through (the later won, where another reader of the file takes the
// first) and "ALIAS" an unknown member it accepted (SPEC §2.2, §4.4).
func TestStrictDecoderMatchesMemberNamesExactly(t *testing.T) {
	for _, tt := range []struct {
		name, doc, member string
		parse             func([]byte) error
	}{
		{"vault duplicate by case", `{"schema_version":1,"direct":{"openai":{"api_key":"A"}},"Direct":{"openai":{"api_key":"B"}}}`, `"Direct"`,
			func(b []byte) error { _, err := newVault("", nil).parse(b); return err }},
		{"vault member in a map", `{"schema_version":1,"direct":{"openai":{"API_KEY":"A"}}}`, `"API_KEY"`,
			func(b []byte) error { _, err := newVault("", nil).parse(b); return err }},
		{"ledger window", `{"schema_version":1,"subscriptions":{"sub_0123456789abcdef":{"provider":"codex","windows":[{"ID":"codex:primary"}],"credential":{"state":"active"}}}}`, `"ID"`,
			func(b []byte) error { _, err := parseLedger(b); return err }},
		{"overlay", `{"schema_version":1,"Items":[]}`, `"Items"`,
			func(b []byte) error { _, err := overlayParse(b); return err }},
		{"clients file", `{"clients":[{"id":"app","Role":"admin","role":"caller","token_sha256":"` + strings.Repeat("a", 64) + `"}]}`, `"Role"`,
			func(b []byte) error { _, err := parseClients(b); return err }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.parse([]byte(tt.doc)); err == nil || !strings.Contains(err.Error(), tt.member) {
				t.Errorf("parse = %v; want a refusal naming %s", err, tt.member)
			}
		})
	}
	// Maps keep case-sensitive keys: these are two routes, not one twice.
	if err := decodeStrict("perf", []byte(`{"schema_version":1,"routes":{"openai/GPT-4o":{},"openai/gpt-4o":{}}}`), &perfDocument{}); err != nil {
		t.Errorf("perf.json with two routes differing in case: %v", err)
	}

	d := startDaemon(t, stateEnv(t), `{"openai":"k"}`, "-local-credentials-stdin")
	for _, body := range []string{`{"ALIAS":"fast","route":"openai/gpt-4o"}`, `{"alias":"fast","Alias":"evil","route":"openai/gpt-4o"}`} {
		status, _, b := d.call("PUT", "/v1/admin/routes", d.token, body)
		if e := envelopeOf(t, b); status != 400 || e["code"] != "invalid_request" {
			t.Errorf("PUT /v1/admin/routes %s: %d %s; want 400 invalid_request", body, status, b)
		}
	}
	if _, _, b := d.call("GET", "/v1/aliases", d.token, ""); strings.Contains(string(b), `"alias":"`) {
		t.Errorf("an alias was set from a refused body: %s", b)
	}
}

// TestServeKeepsTheVaultWhenTheOverlayIsEmpty: a 0-byte overlay (a restore
// that hit a full disk; Brama's own writes are never empty) names no
// subscription, as a missing one does; serve must not take that as every
// credential being an orphan and delete them from the vault at start.
func TestServeKeepsTheVaultWhenTheOverlayIsEmpty(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"plantedKimiKeyKept"}`)
	id := donatedID(t, status, b, "a1", "kimi")
	d.stop()
	if err := os.Truncate(filepath.Join(env["BRAMA_STATE_DIR"], overlayFile), 0); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, env, "")
	d.stop()
	if vb, _ := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], "vault.json")); !strings.Contains(string(vb), id) || strings.Contains(d.stderr.String(), "vault_orphans_removed") {
		t.Errorf("serve removed subscription %s's credential because the overlay was empty: %s", id, vb)
	}
}
