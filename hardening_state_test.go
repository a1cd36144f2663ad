package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// Planted in stale temporary files and orphan vault entries: nothing may
// keep them once serve has started.
const plantedStaleSecret = "sk-planted-stale-vault-copy-0123456789"

// plantCrashLeftovers writes what a crash leaves in dir: temporary files of
// the atomic writer (one a whole vault copy) and a vault holding a
// subscription secret the overlay never names. It returns the orphan's id.
func plantCrashLeftovers(t *testing.T, dir string) string {
	t.Helper()
	for _, d := range []string{"answers/local", ".routes.json.tmp5"} { // the second only looks like a temporary file
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	const orphan = "sub_00000000000000aa"
	vault := fmt.Sprintf(`{"schema_version":1,"direct":{},"subscriptions":{%q:{"api_key":%q}}}`, orphan, plantedStaleSecret)
	for name, data := range map[string]string{
		"vault.json":                                 vault,
		"donated-subscriptions.json":                 `{"schema_version":1,"items":[]}`, // the orphan is one
		".vault.json.tmp123456789":                   vault,
		".donated-subscriptions.json.tmp42":          `{"schema_version":1,"items":[]}`,
		".ledger.json.tmp7":                          "{",
		"answers/local/.0123abcd.json.tmp99":         "{}",
		"vault.json.lock":                            "",
		"notes.tmp1":                                 "not Brama's: kept",
		".hidden-but-not-ours":                       "kept",
		"answers/local/0123abcd.json.tmp99.finished": "kept",
		".routes.json.tmp5/inside":                   "a directory's: kept",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return orphan
}

// staleTemps lists the temporary files of the atomic writer under dir.
func staleTemps(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && staleTempName.MatchString(fi.Name()) {
			out = append(out, strings.TrimPrefix(p, dir+"/"))
		}
		return nil
	})
	return out
}

// vaultOrphans lists the vault's subscription ids the overlay does not name.
func vaultOrphans(t *testing.T, dir string) []string {
	t.Helper()
	v, _, err := readVault(filepath.Join(dir, "vault.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ov overlayDoc
	if b, err := os.ReadFile(filepath.Join(dir, overlayFile)); err == nil {
		if err := json.Unmarshal(b, &ov); err != nil {
			t.Fatal(err)
		}
	}
	var out []string
	for id := range v.Subscriptions {
		if !slices.ContainsFunc(ov.Items, func(it overlayItem) bool { return it.ID == id }) {
			out = append(out, id)
		}
	}
	return out
}

// TestServeRemovesCrashLeftovers: serve removes the atomic writer's stale
// temporary files at start, but keeps an orphaned vault credential and
// counts it in one log line; the operator's prune removes it (SPEC §17).
func TestServeRemovesCrashLeftovers(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	orphan := plantCrashLeftovers(t, dir)
	d := startDaemon(t, env, "")
	if o := vaultOrphans(t, dir); len(o) != 1 {
		t.Errorf("orphans after start = %v, want %s kept", o, orphan)
	}
	env["BRAMA_TOKEN"] = d.token
	if out, errOut, code := runCLI(t, env, "", "subscription", "prune-orphans", "-gateway", d.url); code != 0 || out != "removed 1 orphaned credential(s) from the vault: "+orphan+"\n" {
		t.Errorf("prune-orphans: exit %d %q %s", code, out, errOut)
	}
	// A second prune finds none: it answers an empty list, logs nothing and writes nothing.
	if s, _, b := d.call("POST", "/v1/admin/vault/prune-orphans", d.token, ""); s != 200 || string(b) != `{"ok":true,"removed":[]}`+"\n" {
		t.Errorf("prune-orphans with none left: %d %s, want 200 removing []", s, b)
	}
	d.stop()
	if left := staleTemps(t, dir); len(left) != 0 {
		t.Errorf("stale temporary files left: %v", left)
	}
	for _, kept := range []string{"notes.tmp1", ".hidden-but-not-ours", "answers/local/0123abcd.json.tmp99.finished", ".routes.json.tmp5/inside"} {
		if _, err := os.Stat(filepath.Join(dir, kept)); err != nil {
			t.Errorf("%s is not Brama's temporary file but was removed", kept)
		}
	}
	if o := vaultOrphans(t, dir); len(o) != 0 {
		t.Errorf("vault secrets without a subscription: %v", o)
	}
	logs := d.stderr.String()
	if !strings.Contains(logs, `"msg":"state_temp_files_removed","count":4`) {
		t.Errorf("no state_temp_files_removed line counting 4 in:\n%s", logs)
	}
	if !strings.Contains(logs, `"msg":"vault_orphans_unremoved","count":1,`) || strings.Count(logs, "vault_orphans_unremoved") != 1 {
		t.Errorf("no one vault_orphans_unremoved line counting 1 in:\n%s", logs)
	}
	if !strings.Contains(logs, `"msg":"vault_orphans_removed","count":1,"subscription_ids":"`+orphan+`"`) || strings.Count(logs, "vault_orphans_removed") != 1 {
		t.Errorf("no one vault_orphans_removed line naming %s in:\n%s", orphan, logs)
	}
	assertNoSecret(t, plantedStaleSecret, logs, dir)
}

// TestServeSweepsNoDirectoryNotMadeYet: a file named by environment in a directory not made yet (its first write makes
// it) has no temporary files to sweep, and serve says nothing of them.
func TestServeSweepsNoDirectoryNotMadeYet(t *testing.T) {
	env := stateEnv(t)
	env["BRAMA_VAULT_FILE"] = filepath.Join(t.TempDir(), "not-yet", "vault.json")
	d := startDaemon(t, env, "")
	d.stop()
	if logs := d.stderr.String(); strings.Contains(logs, "state_temp_files") {
		t.Errorf("serve reported temporary files of a directory that does not exist:\n%s", logs)
	}
}

// TestServeReportsUnremovedTemps: a stale temporary file whose lock is a planted symlink is neither removed nor
// counted as removed: serve starts and logs state_temp_files_unremoved with the cause (AUTHORIZATION.md).
func TestServeReportsUnremovedTemps(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".notes.json.tmp1"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "notes.json.lock")); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, env, "")
	d.stop()
	if left := staleTemps(t, dir); !slices.Equal(left, []string{".notes.json.tmp1"}) {
		t.Errorf("stale temporary files left: %v, want the one behind the planted lock", left)
	}
	logs := d.stderr.String()
	if !strings.Contains(logs, `"msg":"state_temp_files_unremoved","removed":0,"cause":"`) || strings.Contains(logs, "state_temp_files_removed") {
		t.Errorf("no state_temp_files_unremoved line (and no state_temp_files_removed) in:\n%s", logs)
	}
	if _, err := os.Lstat(outside); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sweep followed the planted lock: %s exists (%v)", outside, err)
	}
}

func TestFailedDonationTakesItsSecretBack(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	d := startDaemon(t, env, "")
	testingOnlyRename = func(oldpath, newpath string) error {
		if filepath.Base(newpath) == overlayFile {
			return errors.New("injected overlay rename failure")
		}
		return os.Rename(oldpath, newpath)
	}
	defer func() { testingOnlyRename = nil }()
	status, _, body := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"kimi-key-planted-0123"}`)
	if status != 500 {
		t.Fatalf("donation with a failing overlay write: %d %s, want 500", status, body)
	}
	if o := vaultOrphans(t, dir); len(o) != 0 {
		t.Errorf("the failed donation left its secret in the vault: %v", o)
	}
}

// TestKillNineDuringDonations runs the real binary through 20 kill -9
// cycles while donations run concurrently; afterwards the state directory
// holds no temporary file, and once the operator prunes the orphans the
// vault holds no secret without a subscription.
func TestKillNineDuringDonations(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the real binary")
	}
	bin := builtBinary(t)
	dir := filepath.Join(t.TempDir(), "state")
	plantCrashLeftovers(t, dir)
	env := []string{"PATH=" + os.Getenv("PATH"), "BRAMA_STATE_DIR=" + dir, "BRAMA_MODEL_CATALOG_URL=off", "BRAMA_LOG_LEVEL=warn"}
	var token string
	start := func() (*exec.Cmd, string) {
		cmd := exec.Command(bin, "serve", "-addr", "127.0.0.1:0")
		cmd.Env = env
		stdout, _ := cmd.StdoutPipe()
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		errs := bufio.NewReader(stderr)
		for token == "" { // after the line counting the planted orphan
			line, err := errs.ReadString('\n')
			if err != nil {
				t.Fatalf("first start printed no token: %v", err)
			}
			if _, tok, ok := strings.Cut(line, "(shown once): "); ok {
				token = strings.TrimSpace(tok)
			}
		}
		go io.Copy(io.Discard, errs)
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			cmd.Process.Kill()
			t.Fatalf("serve did not start: %v", err)
		}
		return cmd, strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
	}
	var donated atomic.Int64
	// Donations spread over providers: an agent holds at most 64 of one (SPEC §17).
	providers := []string{"kimi", "openai", "anthropic", "openrouter", "groq", "mistral", "deepseek", "xai", "together", "fireworks", "cerebras", "claude-code"}
	post := func(url, path, body string) (*http.Response, error) {
		req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		return http.DefaultClient.Do(req)
	}
	donate := func(url string, n int) error {
		body := fmt.Sprintf(`{"provider":%q,"api_key":"kimi-key-%d-0123456789"}`, providers[max(n, 0)%len(providers)], n)
		resp, err := post(url, "/v1/admin/subscriptions/a1", body)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusCreated {
			donated.Add(1)
		}
		return nil
	}
	n := 0
	for cycle := range 20 {
		cmd, url := start()
		// Eight donors; the kill lands once a few donations have answered,
		// while the others are still writing.
		answered := make(chan struct{}, 64)
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					if donate(url, cycle*10000+w*1000+i) != nil {
						return // the daemon is gone
					}
					answered <- struct{}{}
				}
			}()
		}
		for range 3 + cycle%5 {
			<-answered
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		go func() {
			for range answered {
			}
		}()
		wg.Wait()
		close(answered)
		n++
	}
	cmd, url := start()
	if err := donate(url, -1); err != nil {
		t.Fatalf("donation after the kills: %v", err)
	}
	// A kill between a donation's vault and overlay writes leaves an orphan:
	// kept at start, removed by the operator's prune (SPEC §17).
	resp, err := post(url, "/v1/admin/vault/prune-orphans", "")
	if err != nil {
		t.Fatalf("prune-orphans: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("prune-orphans answered %d", resp.StatusCode)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve after SIGTERM: %v", err)
	}
	if donated.Load() < int64(n) {
		t.Fatalf("only %d donations succeeded in %d cycles: the kills did not land during donations", donated.Load(), n)
	}
	t.Logf("%d donations answered 201 across %d kill -9 cycles", donated.Load(), n)
	if left := staleTemps(t, dir); len(left) != 0 {
		t.Errorf("after %d kill -9 cycles, stale temporary files: %v", n, left)
	}
	if o := vaultOrphans(t, dir); len(o) != 0 {
		t.Errorf("after %d kill -9 cycles, vault secrets without a subscription: %v", n, o)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "vault.json")); strings.Contains(string(b), plantedStaleSecret) {
		t.Error("the orphan's secret survived in the vault")
	}
}

// TestServeRemovesVaultLeftoversOutsideState: with BRAMA_VAULT_FILE outside
// the state directory, a crash's copy of the vault beside it is removed too;
// another program's temporary file in that folder is not Brama's and stays.
func TestServeRemovesVaultLeftoversOutsideState(t *testing.T) {
	env := stateEnv(t)
	secrets := t.TempDir()
	vaultFile := filepath.Join(secrets, "brama-vault.json")
	env["BRAMA_VAULT_FILE"] = vaultFile
	vault := fmt.Sprintf(`{"schema_version":1,"direct":{},"subscriptions":{"sub_00000000000000aa":{"api_key":%q}}}`, plantedStaleSecret)
	for name, data := range map[string]string{
		".brama-vault.json.tmp123456789": vault,
		".other-program.json.tmp5":       "kept",
	} {
		if err := os.WriteFile(filepath.Join(secrets, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, env, "")
	d.stop()
	if _, err := os.Stat(filepath.Join(secrets, ".brama-vault.json.tmp123456789")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the crash's copy of the vault beside BRAMA_VAULT_FILE is still there (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(secrets, ".other-program.json.tmp5")); err != nil {
		t.Errorf("another program's temporary file was removed: %v", err)
	}
	assertNoSecret(t, plantedStaleSecret, d.stderr.String(), env["BRAMA_STATE_DIR"])
}

// TestServeKeepsTheSubscriptionsOfAVaultElsewhere: a BRAMA_VAULT_FILE
// outside the state directory may hold the subscriptions of another state
// directory's overlay (a moved state directory, a second daemon sharing the
// direct keys), so serve never removes them: /readyz reports them as unused
// (SPEC §10.1), and the credential is not lost.
func TestServeKeepsTheSubscriptionsOfAVaultElsewhere(t *testing.T) {
	vaultFile := filepath.Join(t.TempDir(), "vault.json")
	first := stateEnv(t)
	first["BRAMA_VAULT_FILE"] = vaultFile
	d := startDaemon(t, first, "")
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"plantedKimiKeyElsewhere"}`)
	id := donatedID(t, status, b, "a1", "kimi")
	// This state directory's overlay names every credential: there is nothing to prune, wherever the vault lies.
	if s, _, b := d.call("POST", "/v1/admin/vault/prune-orphans", d.token, ""); s != 200 || string(b) != `{"ok":true,"removed":[]}`+"\n" {
		t.Errorf("prune-orphans with no orphan, vault elsewhere: %d %s, want 200 removing []", s, b)
	}
	d.stop()

	second := stateEnv(t) // a new state directory beside the same vault
	second["BRAMA_VAULT_FILE"] = vaultFile
	d = startDaemon(t, second, "")
	if vb, _ := os.ReadFile(vaultFile); !strings.Contains(string(vb), "plantedKimiKeyElsewhere") {
		t.Errorf("serve removed the subscription credential of a vault outside its state directory: %s", vb)
	}
	if _, _, rb := d.call("GET", "/readyz", d.token, ""); !strings.Contains(string(rb), "with no overlay entry, unused: "+id) {
		t.Errorf("/readyz does not report the unused credential %s: %s", id, rb)
	}
	if strings.Contains(d.stderr.String(), "vault_orphans_removed") {
		t.Error("serve logged vault_orphans_removed")
	}
	// Even with an overlay of its own, this state directory prunes nothing there.
	if err := os.WriteFile(filepath.Join(second["BRAMA_STATE_DIR"], overlayFile), []byte(`{"schema_version":1,"items":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, _, b := d.call("POST", "/v1/admin/vault/prune-orphans", d.token, ""); s != 409 || envelopeOf(t, b)["code"] != "state_conflict" {
		t.Errorf("prune-orphans of a vault elsewhere: %d %s, want 409 state_conflict", s, b)
	}
	if vb, _ := os.ReadFile(vaultFile); !strings.Contains(string(vb), "plantedKimiKeyElsewhere") {
		t.Error("the refused prune removed the credential")
	}
}

// TestServeKeepsTheVaultWhenTheOverlayIsMissing: with no overlay file at all
// (lost, or not yet restored from a backup), every vault subscription would
// look orphaned; serve keeps them and /readyz reports them, so restoring the
// overlay brings the subscriptions back with their credentials.
func TestServeKeepsTheVaultWhenTheOverlayIsMissing(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"plantedKimiKeyKept"}`)
	id := donatedID(t, status, b, "a1", "kimi")
	admin := d.token // printed at first start only
	d.stop()
	overlay := filepath.Join(env["BRAMA_STATE_DIR"], "donated-subscriptions.json")
	saved, err := os.ReadFile(overlay)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(overlay)

	d = startDaemon(t, env, "")
	vault := filepath.Join(env["BRAMA_STATE_DIR"], "vault.json")
	if vb, _ := os.ReadFile(vault); !strings.Contains(string(vb), "plantedKimiKeyKept") || strings.Contains(d.stderr.String(), "vault_orphans_removed") {
		t.Fatalf("serve removed a credential because the overlay was missing: %s", vb)
	}
	if _, _, rb := d.call("GET", "/readyz", d.token, ""); !strings.Contains(string(rb), id) {
		t.Errorf("/readyz does not report the unused credential %s: %s", id, rb)
	}
	d.stop()
	if err := os.WriteFile(overlay, saved, 0o600); err != nil { // the operator restores it
		t.Fatal(err)
	}
	d = startDaemon(t, env, "")
	d.token = admin
	if got := credentialStateOf(t, d, "a1", id); got != credActive {
		t.Errorf("after the overlay came back: credential %s, want %s", got, credActive)
	}
}
