package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Issue 21: what a newcomer meets first. Prefix aliases (SPEC §4.1, §5.1),
// the 404 texts, serve's notes and the CLI commands that replace editing files.

// TestPrefixAliasResolution: exact beats prefix, the longest prefix wins,
// <provider>/* serves the requested name, a fixed destination serves every
// matching name, and a prefix-matched name is a declared alias in every rule.
func TestPrefixAliasResolution(t *testing.T) {
	doc, err := parseRegistry([]byte(`{"deployments":[{"name":"qwen-local","endpoint":{"host":"127.0.0.1","port":11434}}],
		"routes":{"claude-*":"anthropic/*","claude-haiku-*":"qwen-local","claude-opus-5-5":"anthropic/pinned",
		"gpt-*":"openai/*","o*":"anthropic/fixed","grok-*":"nope/*"}}`))
	if err != nil {
		t.Fatal(err)
	}
	hasDirect := func(p string) bool { return p == "anthropic" }
	for _, tc := range []struct {
		name, route, model, mode string
		code, state              string // a refusal
	}{
		{name: "claude-opus-4-1", route: "anthropic/claude-opus-4-1", model: "claude-opus-4-1", mode: modeAlias},
		{name: "claude-opus-5-5", route: "anthropic/pinned", model: "pinned", mode: modeAlias},             // exact beats prefix
		{name: "claude-haiku-4-5", route: "local-openai/qwen-local", model: "qwen-local", mode: modeAlias}, // longest prefix
		{name: "claude-", route: "anthropic/claude-", model: "claude-", mode: modeAlias},                   // an empty rest matches
		{name: "o3-mini", route: "anthropic/fixed", model: "fixed", mode: modeAlias},
		{name: "openai/gpt-5", route: "openai/gpt-5", model: "gpt-5", mode: modeDirect}, // a canonical route is no prefix match
		{name: "gpt-5", code: "alias_unserviceable", state: stateCapabilityAbsent, route: "openai/gpt-5"},
		{name: "grok-4", code: "alias_unserviceable", state: stateCapabilityAbsent, route: "nope/grok-4"},
		{name: "claude-*", code: "alias_unknown", state: stateNoRoute}, // the key itself is no model
		{name: "Claude-opus", code: "alias_unknown", state: stateNoRoute},
		{name: "claude-x\x01", code: "alias_unknown", state: stateNoRoute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := resolveModel(tc.name, doc, nil, hasDirect)
			for range 50 { // Go varies a map's order at every walk: a match that hung on it would differ
				if again, _ := resolveModel(tc.name, doc, nil, hasDirect); again.Route != res.Route {
					t.Fatalf("resolved to %q, then %q", res.Route, again.Route)
				}
			}
			if tc.code != "" {
				ae := wantAPIError(t, err, tc.code, "")
				want := &aliasDetails{Alias: tc.name, State: tc.state}
				if tc.route != "" {
					want.Route = &tc.route
				}
				if diff := cmp.Diff(want, ae.Details); diff != "" {
					t.Errorf("details (-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Route != tc.route || res.Model != tc.model || res.Mode != tc.mode {
				t.Errorf("got route %q model %q mode %q, want %q %q %q", res.Route, res.Model, res.Mode, tc.route, tc.model, tc.mode)
			}
			if tc.mode == modeAlias && res.Alias != tc.name {
				t.Errorf("alias %q, want the requested name %q", res.Alias, tc.name)
			}
		})
	}
}

// TestPrefixAliasGuards: every §4.1 guard on prefix aliases, on read and on write.
func TestPrefixAliasGuards(t *testing.T) {
	for _, tc := range []struct{ alias, dest, want string }{
		{"*", "anthropic/*", "must match"},
		{"claude/*", "anthropic/*", "must match"},
		{"cl*de-*", "anthropic/*", "must match"},
		{"claude-**", "anthropic/*", "must match"},
		{"claude-opus", "anthropic/*", `only a prefix alias (ending in *) may route to <provider>/*`},
		{"claude-*", "anthropic/claude-*", `only a prefix alias`},
		{"claude-*", "*", `only a prefix alias`},
		{"claude-*", "anthropic/*/x", `only a prefix alias`},
	} {
		t.Run(tc.alias+"->"+tc.dest, func(t *testing.T) {
			b, _ := json.Marshal(map[string]any{"routes": map[string]string{tc.alias: tc.dest}})
			if _, err := parseRegistry(b); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parse: %v, want %q", err, tc.want)
			}
			f := newRegFixture(t)
			if _, err := f.reg.set(tc.alias, ptr(tc.dest), "t"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("set: %v, want %q", err, tc.want)
			}
		})
	}
	// Writers refuse what readers accept as capability_absent.
	f := newRegFixture(t)
	for dest, want := range map[string]string{"nope/*": `Provider "nope" is not one Brama knows`, "local-openai/*": `No single deployment or adapter named "*"`} {
		if _, err := f.reg.set("x-*", ptr(dest), "t"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("set x-* %s: %v, want %q", dest, err, want)
		}
	}
}

// TestPrefixAliasServesOverHTTP: a client's default model name reaches the
// provider under its own name through `claude-*` → `anthropic/*`, set over
// PUT /v1/admin/routes; /v1/aliases shows the row, /v1/models does not.
func TestPrefixAliasServesOverHTTP(t *testing.T) {
	fake := fixtureProvider(t, protocolFixtures[1])
	env := stateEnv(t)
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"anthropic":"`+plantedAnthropicKey+`"}`, "-local-credentials-stdin")
	if status, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"claude/*","route":"anthropic/*"}`); status != 400 {
		t.Errorf("PUT claude/* = %d %s, want 400", status, b)
	}
	if status, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"claude-*","route":"anthropic/*"}`); status != 200 {
		t.Fatalf("PUT claude-* = %d %s", status, b)
	}
	status, h, b := d.call("POST", "/v1/messages", d.token, `{"model":"claude-opus-5-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
	if status != 200 || fake.calls.Load() != 1 || h.Get("Brama-Attempts") != "1" {
		t.Fatalf("POST = %d (provider calls %d, attempts %q) %s", status, fake.calls.Load(), h.Get("Brama-Attempts"), b)
	}
	var sent struct{ Model string }
	json.Unmarshal(fake.body(), &sent)
	if sent.Model != "claude-opus-5-5" {
		t.Errorf("provider was asked for %q, want claude-opus-5-5", sent.Model)
	}
	d.stderr.waitFor(t, `"routing_mode":"alias"`)
	_, _, b = d.call("GET", "/v1/aliases", d.token, "")
	var table aliasTable
	json.Unmarshal(b, &table)
	if len(table.Aliases) != 1 || table.Aliases[0].Alias != "claude-*" || table.Aliases[0].State != stateServing || *table.Aliases[0].Route != "anthropic/*" {
		t.Errorf("/v1/aliases = %s", b)
	}
	if _, _, b = d.call("GET", "/v1/models", d.token, ""); strings.Contains(string(b), "claude-*") {
		t.Errorf("/v1/models lists the prefix alias as a model: %s", b)
	}
	out, errOut, code := runCLI(t, env, "", "routes", "set", "gpt-*", "openai/*")
	if code != 0 || !strings.Contains(out, "gpt-*     capability_absent  openai/*     Every name starting with \"gpt-\" that no exact alias declares. No direct openai credential is configured.") {
		t.Errorf("routes set gpt-*: exit %d, %s%s", code, out, errOut)
	}
}

// TestAliasUnknownNamesTheFix: the 404 says what an operator runs; the
// details stay SPEC §5.2's.
func TestAliasUnknownNamesTheFix(t *testing.T) {
	d := startDaemon(t, stateEnv(t), "")
	for name, want := range map[string]string{
		"claude-opus-5-5": "brama routes set claude-opus-5-5 ROUTE",
		"Weird Name":      "brama routes set NAME ROUTE",
	} {
		body, _ := json.Marshal(map[string]any{"model": name, "max_tokens": 5, "messages": []any{map[string]string{"role": "user", "content": "hi"}}})
		status, _, b := d.call("POST", "/v1/messages", d.token, string(body))
		e := envelopeOf(t, b)
		msg, _ := e["message"].(string)
		if status != 404 || e["code"] != "alias_unknown" || !strings.Contains(msg, want) || !strings.Contains(msg, `brama routes set 'claude-*' 'anthropic/*'`) {
			t.Errorf("%s: %d %s", name, status, b)
		}
		if diff := cmp.Diff(map[string]any{"alias": name, "state": "no_route", "route": nil}, e["details"]); diff != "" {
			t.Errorf("%s details (-want +got):\n%s", name, diff)
		}
	}
}

// TestDoubleV1NotFound: a base URL ending in /v1 doubles it; the 404 says so.
func TestDoubleV1NotFound(t *testing.T) {
	d := startDaemon(t, stateEnv(t), "")
	for path, hint := range map[string]bool{"/v1/v1/messages": true, "/v1/v1/chat/completions": true, "/v2/messages": false} {
		status, _, b := d.call("POST", path, d.token, `{}`)
		msg, _ := envelopeOf(t, b)["message"].(string)
		if status != 404 || strings.Contains(msg, "ANTHROPIC_BASE_URL=http://127.0.0.1:8080, without /v1") != hint {
			t.Errorf("%s: %d %s", path, status, b)
		}
	}
}

// TestServeNotes: under its address serve prints its state directory and,
// while nothing can pay, the one next step; once something can, ready.
func TestServeNotes(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	d.stdout.waitFor(t, "next:")
	want := "state: " + env["BRAMA_STATE_DIR"] + "\nnext: brama credentials set anthropic (the API key on stdin), then brama routes set 'claude-*' 'anthropic/*'"
	if !strings.HasPrefix(d.stdout.String(), want) {
		t.Errorf("serve printed %q, want it to start %q", d.stdout.String(), want)
	}
	d.stop()
	for name, setup := range map[string]func(env map[string]string){
		"direct key": func(env map[string]string) { runCLI(t, env, "sk-x\n", "credentials", "set", "anthropic") },
		"deployment": func(env map[string]string) { runCLI(t, env, "", "deployments", "add", "qwen", "-port", "11434") },
	} {
		env := stateEnv(t)
		setup(env)
		d := startDaemon(t, env, "")
		d.stdout.waitFor(t, "ready:")
		if strings.Contains(d.stdout.String(), "next:") {
			t.Errorf("%s: serve printed %q", name, d.stdout.String())
		}
	}
	d = startDaemon(t, map[string]string{"BRAMA_MODEL_CATALOG_URL": "off"}, "") // no HOME, no state directory
	d.stdout.waitFor(t, "next:")
	if !strings.Contains(d.stdout.String(), "state: none ($HOME is not defined): nothing is kept") {
		t.Errorf("serve with no state printed %q", d.stdout.String())
	}
}

// TestCLIWritesNameFileAndWarnWithoutServe: each writing command says the
// file it wrote, and warns while no serve holds the state directory.
func TestCLIWritesNameFileAndWarnWithoutServe(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	warning := "brama: warning: no brama serve holds " + filepath.Join(dir, "serve.lock")
	steps := []struct {
		stdin string
		args  []string
		file  string
	}{
		{"", []string{"deployments", "add", "qwen", "-port", "11434"}, "routes.json"},
		{"", []string{"routes", "set", "cheap", "qwen"}, "routes.json"},
		{"", []string{"routes", "rm", "cheap"}, "routes.json"},
		{"", []string{"routes", "migrate"}, "routes.json"},
		{"", []string{"deployments", "rm", "qwen"}, "routes.json"},
		{"sk-x\n", []string{"credentials", "set", "anthropic"}, "vault.json"},
		{"", []string{"credentials", "rm", "anthropic"}, "vault.json"},
		{"", []string{"clients", "add", "c1"}, "clients.json"},
		{"", []string{"clients", "rm", "c1"}, "clients.json"},
	}
	check := func(served bool) {
		for _, s := range steps {
			_, errOut, code := runCLI(t, env, s.stdin, s.args...)
			if code != 0 || !strings.Contains(errOut, "brama: wrote "+filepath.Join(dir, s.file)+"\n") || strings.Contains(errOut, warning) == served {
				t.Errorf("served=%v %v: exit %d, stderr:\n%s", served, s.args, code, errOut)
			}
		}
	}
	check(false)
	if _, err := os.Stat(filepath.Join(dir, "serve.lock")); err == nil {
		t.Error("the check created serve.lock")
	}
	startDaemon(t, env, "")
	check(true)
}

// TestDeploymentsCLI: deployments are added, listed and removed by command,
// through the registry's writer and under the reader's guards.
func TestDeploymentsCLI(t *testing.T) {
	env := stateEnv(t)
	ok := func(stdin string, args ...string) string {
		t.Helper()
		out, errOut, code := runCLI(t, env, stdin, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	if out := ok("", "deployments", "add", "qwen-local", "-port", "11434", "-model", "qwen2.5:7b"); !strings.Contains(out, "added deployment qwen-local at http://127.0.0.1:11434/v1") {
		t.Errorf("add printed %q", out)
	}
	ok("", "deployments", "add", "-host", "100.64.0.7", "-port", "8000", "tailnet")
	if out := ok("", "routes", "set", "cheap", "qwen-local"); !strings.Contains(out, "cheap  serving  qwen-local") {
		t.Errorf("routes set printed %q", out)
	}
	want := "NAME        ENDPOINT                   MODEL       ADAPTERS\n" +
		"qwen-local  http://127.0.0.1:11434/v1  qwen2.5:7b  -\n" +
		"tailnet     http://100.64.0.7:8000/v1  tailnet     -\n"
	if out := ok("", "deployments", "list"); out != want {
		t.Errorf("list:\n%s\nwant:\n%s", out, want)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"add", "qwen-local", "-port", "1"}, 1, `deployment "qwen-local" is already declared`},
		{[]string{"add", "far", "-host", "8.8.8.8", "-port", "1"}, 1, `is not an IPv4 loopback or 100.64.0.0/10 literal`},
		{[]string{"add", "noport"}, 1, `endpoint port 0 is not a port`},
		{[]string{"add", "Bad Name", "-port", "1"}, 1, `a deployment name must match`},
		{[]string{"add"}, 2, `brama deployments add: want NAME -port PORT`},
		{[]string{"rm", "qwen-local"}, 1, `registry route "cheap": destination "qwen-local" names 0 deployments or adapters; a bare name must name exactly one`},
		{[]string{"rm", "ghost"}, 1, `no deployment "ghost" is declared`},
	} {
		if _, errOut, code := runCLI(t, env, "", append([]string{"deployments"}, tc.args...)...); code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d %s, want %d %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	ok("", "routes", "rm", "cheap")
	ok("", "deployments", "rm", "qwen-local")
	if out := ok("", "deployments", "list"); strings.Contains(out, "qwen-local") || !strings.Contains(out, "tailnet") {
		t.Errorf("after rm:\n%s", out)
	}
	routes := filepath.Join(env["BRAMA_STATE_DIR"], "routes.json") // adapters are declared in the file only
	os.WriteFile(routes, []byte(`{"schema_version":1,"deployments":[{"name":"tailnet","endpoint":{"host":"100.64.0.7","port":8000},`+
		`"adapters":[{"name":"lora-a"},{"name":"lora-b"}]}],"routes":{}}`), 0o600)
	want = "NAME     ENDPOINT                   MODEL    ADAPTERS\n" +
		"tailnet  http://100.64.0.7:8000/v1  tailnet  lora-a,lora-b\n"
	if out := ok("", "deployments", "list"); out != want {
		t.Errorf("list with adapters:\n%s\nwant:\n%s", out, want)
	}
}

// TestCredentialsAndClientsList: the lists name providers and clients,
// never a key, a token or a digest.
func TestCredentialsAndClientsList(t *testing.T) {
	env := stateEnv(t)
	for _, p := range []string{"openai", "anthropic"} {
		if _, errOut, code := runCLI(t, env, plantedAnthropicKey+"\n", "credentials", "set", p); code != 0 {
			t.Fatal(errOut)
		}
	}
	out, _, _ := runCLI(t, env, "", "credentials", "list")
	if out != "anthropic\nopenai\n" {
		t.Errorf("credentials list = %q", out)
	}
	runCLI(t, env, "", "credentials", "rm", "openai")
	if out, _, _ = runCLI(t, env, "", "credentials", "list"); out != "anthropic\n" {
		t.Errorf("after rm: %q", out)
	}
	if _, errOut, code := runCLI(t, env, "", "credentials", "rm", "openai"); code != 1 || !strings.Contains(errOut, `no direct credential for "openai"`) {
		t.Errorf("second rm: %d %s", code, errOut)
	}
	if out, _, _ = runCLI(t, env, "", "clients", "list"); out != "ID  ROLE  AGENT  ALLOWED\n" {
		t.Errorf("clients list with no file = %q", out)
	}
	tok1 := addClient(t, env, "-admin", "ops")
	tok2 := addClient(t, env, "-agent", "a1", "-allow", "chat", "-allow", "claude-opus-5-5", "bot")
	out, _, _ = runCLI(t, env, "", "clients", "list")
	want := "ID   ROLE    AGENT  ALLOWED\n" +
		"ops  admin   -      (any model)\n" +
		"bot  caller  a1     chat,claude-opus-5-5\n"
	if out != want {
		t.Errorf("clients list:\n%s\nwant:\n%s", out, want)
	}
	for _, secret := range []string{tok1, tok2, hexSHA256([]byte(tok1)), hexSHA256([]byte(tok2))} {
		if strings.Contains(out, secret) {
			t.Error("clients list shows a token or digest")
		}
	}
}

// TestUnjournaledWritesNeedNoJournal: a registry write the journal does not record (a deployment) is made while the
// journal is unusable; one it records (a route) is refused naming it (SPEC §4.4, §9).
func TestUnjournaledWritesNeedNoJournal(t *testing.T) {
	env := stateEnv(t)
	journal := filepath.Join(env["BRAMA_STATE_DIR"], "journal.jsonl")
	if err := os.MkdirAll(env["BRAMA_STATE_DIR"], 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(journal, nil, 0o644); err != nil { // group-readable: every journal guard refuses it
		t.Fatal(err)
	}
	if _, errOut, code := runCLI(t, env, "", "deployments", "add", "qwen-local", "-port", "11434"); code != 0 {
		t.Errorf("deployments add with an unusable journal: exit %d, %s", code, errOut)
	}
	if _, errOut, code := runCLI(t, env, "", "routes", "set", "chat", "qwen-local"); code == 0 || !strings.Contains(errOut, "journal") {
		t.Errorf("routes set with an unusable journal: exit %d, %s; want refused naming the journal", code, errOut)
	}
}
