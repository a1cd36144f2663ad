package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestConcurrentAdminRouteWrites(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	var wg sync.WaitGroup
	statuses := make([]int, 32)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _, _ = d.call("PUT", "/v1/admin/routes", d.token, fmt.Sprintf(`{"alias":"a%02d","route":"openai/gpt-%d"}`, i, i))
		}()
	}
	wg.Wait()
	for i, s := range statuses {
		if s != 200 {
			t.Errorf("PUT %d answered %d", i, s)
		}
	}
	dir := env["BRAMA_STATE_DIR"]
	b, err := os.ReadFile(filepath.Join(dir, "routes.json"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := parseRegistry(b)
	if err != nil {
		t.Fatalf("registry after 32 concurrent writes is invalid: %v", err)
	}
	if len(doc.Routes) != 32 {
		t.Errorf("registry holds %d aliases, want 32", len(doc.Routes))
	}
	jb, _ := os.ReadFile(filepath.Join(dir, "journal.jsonl"))
	recs, bad, torn := readJournalLines(t, jb)
	n := 0
	for _, r := range recs {
		if r.Kind == "route_change" && r.By == "local" && r.From == nil && r.To != nil {
			n++
		}
	}
	if n != 32 || len(bad) != 0 || torn {
		t.Errorf("journal: %d route_change lines (want 32), %d bad, torn=%v", n, len(bad), torn)
	}
	status, hdr, body := d.call("GET", "/v1/admin/routes", d.token, "")
	if status != 200 || !bytes.Equal(body, b) || hdr.Get("Content-Type") != "application/json" {
		t.Errorf("GET /v1/admin/routes = %d (%s), not the committed file as application/json:\n%s", status, hdr.Get("Content-Type"), body)
	}
	assertOwnerOnly(t, dir)
}

// TestAdminRouteWriteRenameFails injects a rename failure; it must not run
// in parallel with other writers (testingOnlyRename is package-wide).
func TestAdminRouteWriteRenameFails(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"keep","route":"openai/gpt-4o"}`); s != 200 {
		t.Fatalf("first PUT: %d %s", s, b)
	}
	path := filepath.Join(env["BRAMA_STATE_DIR"], "routes.json")
	before, _ := os.ReadFile(path)
	testingOnlyRename = func(string, string) error { return errors.New("injected rename failure") }
	defer func() { testingOnlyRename = nil }()
	s, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"lost","route":"openai/gpt-4o"}`)
	if s != 500 || envelopeOf(t, b)["code"] != "internal_error" {
		t.Errorf("PUT with a failing rename: %d %s, want 500 internal_error", s, b)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Errorf("a failed rename changed the registry:\n%s\nwant\n%s", after, before)
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestAdminRouteBodies(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	tests := []struct {
		name, method, body string
		status             int
		code               string
	}{
		{"malformed JSON", "PUT", `{"alias":`, 400, "invalid_request"},
		{"unknown member", "PUT", `{"alias":"a","route":"openai/x","extra":1}`, 400, "invalid_request"},
		{"unknown provider", "PUT", `{"alias":"a","route":"nope/x"}`, 400, "invalid_request"},
		{"bad alias", "PUT", `{"alias":"A B","route":"openai/x"}`, 400, "invalid_request"},
		{"delete unknown", "DELETE", `{"alias":"ghost"}`, 404, "alias_unknown"},
		{"PUT without route", "PUT", `{"alias":"a"}`, 400, "invalid_request"},
		{"DELETE with a route", "DELETE", `{"alias":"a","route":"openai/x"}`, 400, "invalid_request"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, b := d.call(tc.method, "/v1/admin/routes", d.token, tc.body)
			e := envelopeOf(t, b)
			if s != tc.status || e["code"] != tc.code {
				t.Fatalf("%d %s, want %d %s", s, b, tc.status, tc.code)
			}
			if _, ok := e["attempts"]; ok {
				t.Errorf("attempts on a refusal before dispatch: %s", b)
			}
			if tc.code == "invalid_request" && tc.name == "unknown member" && !strings.Contains(fmt.Sprint(e["message"]), "extra") {
				t.Errorf("message does not name the unknown field: %v", e["message"])
			}
		})
	}
}

func TestMigrateCLI(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	os.MkdirAll(dir, 0o700)
	path := filepath.Join(dir, "routes.json")
	os.WriteFile(path, []byte(`{"routes":{"chat":"openai/gpt-4o"},"fallbacks":{"chat":["anthropic/x"]},"mystery":true}`), 0o600)

	out1, errOut, code := runCLI(t, env, "", "routes", "migrate")
	if code != 0 {
		t.Fatalf("migrate: exit %d: %s", code, errOut)
	}
	file1, _ := os.ReadFile(path)
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(file1, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc) != 3 || doc["schema_version"] == nil || doc["deployments"] == nil || doc["routes"] == nil {
		t.Errorf("committed members = %v, want exactly schema_version, deployments, routes", keysOf(doc))
	}
	if out1 != string(file1) {
		t.Errorf("printed %q, committed %q", out1, file1)
	}
	out2, _, code := runCLI(t, env, "", "routes", "migrate")
	file2, _ := os.ReadFile(path)
	if code != 0 || out2 != out1 || !bytes.Equal(file1, file2) {
		t.Errorf("second migrate: exit %d, printed the same: %v, file identical: %v", code, out2 == out1, bytes.Equal(file1, file2))
	}
	jsonOut, _, _ := runCLI(t, env, "", "routes", "migrate", "-json")
	if !strings.Contains(jsonOut, `"ok":true`) || !strings.Contains(jsonOut, `"dropped":[]`) {
		t.Errorf("-json after migration: %s", jsonOut)
	}
	// -file needs no state directory: with none, the named file is migrated all the same.
	if out, errOut, code := runCLI(t, map[string]string{}, "", "routes", "migrate", "-file", path); code != 0 || out != out1 {
		t.Errorf("migrate -file with no state directory: exit %d, %q %q; want exit 0 printing the document", code, out, errOut)
	}

	t.Run("group-readable", func(t *testing.T) {
		os.Chmod(path, 0o640)
		defer os.Chmod(path, 0o600)
		before, _ := os.ReadFile(path)
		_, errOut, code := runCLI(t, env, "", "routes", "migrate")
		after, _ := os.ReadFile(path)
		if code != 1 || !strings.HasPrefix(errOut, "route migration error: ") || !bytes.Equal(before, after) {
			t.Errorf("exit %d, stderr %q, untouched %v; want exit 1 and the file untouched", code, errOut, bytes.Equal(before, after))
		}
	})
	t.Run("symlink", func(t *testing.T) {
		link := filepath.Join(dir, "link.json")
		os.Symlink(path, link)
		before, _ := os.ReadFile(path)
		_, errOut, code := runCLI(t, env, "", "routes", "migrate", "-file", link)
		after, _ := os.ReadFile(path)
		fi, _ := os.Lstat(link)
		if code != 1 || !strings.Contains(errOut, "symlink") || !bytes.Equal(before, after) || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("exit %d, stderr %q; want exit 1 naming the symlink rule, link and target untouched", code, errOut)
		}
	})
}

func keysOf(m map[string]json.RawMessage) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func TestJournalCheckCLI(t *testing.T) {
	tests := []struct {
		name     string
		content  string
		wantCode int
		wantOut  string
	}{
		{"clean", `{"kind":"retire","at":"2026-01-01T00:00:00.000Z","subscription_id":"s"}` + "\n", 0, ""},
		{"torn final line", `{"kind":"retire","at":"2026-01-01T00:00:00.000Z"}` + "\n" + `{"kind":"reti`, 0, "final line torn (ignored)"},
		{"corrupt middle line", `{"kind":"retire","at":"2026-01-01T00:00:00.000Z"}` + "\nnot json\n" + `{"kind":"retire","at":"2026-01-01T00:00:00.000Z"}` + "\n", 1, "line 2: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := stateEnv(t)
			os.MkdirAll(env["BRAMA_STATE_DIR"], 0o700)
			os.WriteFile(filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl"), []byte(tc.content), 0o600)
			out, errOut, code := runCLI(t, env, "", "journal", "check")
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, out, errOut, tc.wantCode, tc.wantOut)
			}
		})
	}
}

func TestTornJournalThenAppend(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	os.MkdirAll(dir, 0o700)
	jpath := filepath.Join(dir, "journal.jsonl")
	os.WriteFile(jpath, []byte(`{"kind":"route_change","at":"2026-01-01T00:00:00.000Z","alias":"x","from":null,"to":"openai/a","by":"cli"}`+"\n"+`{"kind":"route_ch`), 0o600)
	d := startDaemon(t, env, "")
	if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"y","route":"openai/gpt-4o"}`); s != 200 {
		t.Fatalf("PUT after a torn journal: %d %s", s, b)
	}
	b, _ := os.ReadFile(jpath)
	recs, _, torn := readJournalLines(t, b)
	if torn || len(recs) != 2 || recs[1].Alias != "y" {
		t.Errorf("after the append: %d readable records (want 2: the old and the new), torn=%v", len(recs), torn)
	}
}

// TestRoutesListJSONIsTheAliasesBody: `brama routes list -json` prints the very bytes GET /v1/aliases answers (its
// help says so), a destination's HTML characters (&, <, >) as they are in both.
func TestRoutesListJSONIsTheAliasesBody(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	if _, errOut, code := runCLI(t, env, "", "routes", "set", "odd", "openai/a&b<c>"); code != 0 {
		t.Fatalf("routes set: exit %d: %s", code, errOut)
	}
	out, errOut, code := runCLI(t, env, "", "routes", "list", "-json")
	status, _, body := d.call("GET", "/v1/aliases", d.token, "")
	if code != 0 || status != 200 || out != string(body) || !strings.Contains(out, `"openai/a&b<c>"`) {
		t.Errorf("routes list -json (exit %d, %s):\n%s\nGET /v1/aliases (%d):\n%s", code, errOut, out, status, body)
	}
	// Without -json: one aligned row per alias, then the count that cannot serve.
	want := "ALIAS  STATE              ROUTE          REASON\n" +
		"odd    capability_absent  openai/a&b<c>  No direct openai credential is configured.\n" +
		"1 alias(es), 1 cannot serve\n"
	if out, errOut, code := runCLI(t, env, "", "routes", "list"); code != 0 || out != want {
		t.Errorf("routes list: exit %d, %q %q; want %q", code, out, errOut, want)
	}
}
