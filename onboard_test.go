package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

func TestOnboardWithoutStateDir(t *testing.T) {
	out, errOut, code := runCLI(t, map[string]string{}, "", "onboard", "-model", "openai/gpt-test", "-allow-provider-cost")
	if code != 1 || !strings.Contains(errOut, "onboarding progress has no state directory: $HOME is not defined") || out != "" {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 naming the cause", code, out, errOut)
	}
}

func TestOnboardJourney(t *testing.T) {
	env := stateEnv(t)
	var fail atomic.Bool
	prov := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("Authorization") != "Bearer "+plantedOpenAIKey {
			w.WriteHeader(401)
			io.WriteString(w, `{"error":{"type":"invalid_request_error","code":"invalid_api_key","message":"bad key"}}`)
			return
		}
		if fail.Load() {
			w.WriteHeader(500)
			io.WriteString(w, `{"error":{"type":"server_error","message":"upstream down"}}`)
			return
		}
		io.WriteString(w, opChatAnswer)
	})
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = prov.URL
	progress := filepath.Join(env["BRAMA_STATE_DIR"], onboardFile)
	steps := func(t *testing.T) map[string]onboardStep {
		t.Helper()
		b, _, err := readGuarded(onboardRole, progress)
		if err == nil {
			_, err = parseOnboarding(b)
		}
		var prog struct{ Steps map[string]onboardStep }
		if err != nil || json.Unmarshal(b, &prog) != nil {
			t.Fatalf("progress: %v", err)
		}
		return prog.Steps
	}
	const billable = "next: brama onboard -model <route> -allow-provider-cost\n"

	tests := []struct {
		name      string
		setup     func(t *testing.T)
		args      []string
		code      int
		out       string
		errHas    string
		calls     int64
		wantSteps []string
	}{
		{name: "no client", args: nil, code: 1,
			out:       "done state-directory\nnext: brama clients add <id> -admin\n",
			wantSteps: []string{"state-directory"}},
		{name: "no credential", setup: func(t *testing.T) { addClient(t, env, "local", "-admin") }, code: 1,
			out:       "done state-directory\ndone client\nnext: brama credentials set <provider>\n",
			wantSteps: []string{"state-directory", "client"}},
		{name: "a named route with no payer at all names its provider", args: []string{"-model", "anthropic/claude-test"}, code: 1,
			out: "done state-directory\ndone client\nnext: brama credentials set anthropic\n", errHas: "no direct credential",
			wantSteps: []string{"state-directory", "client"}},
		{name: "a deployment by its bare name", setup: func(t *testing.T) {
			if _, errOut, code := runCLI(t, env, "", "deployments", "add", "qwen", "-port", "11434"); code != 0 {
				t.Fatal(errOut)
			}
		}, args: []string{"-model", "qwen"}, code: 0, // SPEC §14: -model names a deployment, called as local-openai/qwen; no key needed
			out:       "done state-directory\ndone client\ndone route\nnext: brama onboard -model qwen -allow-provider-cost\n",
			wantSteps: []string{"state-directory", "client", "route"}},
		{name: "an alias named like a deployment is the alias", setup: func(t *testing.T) {
			if _, errOut, code := runCLI(t, env, "", "routes", "set", "qwen", "anthropic/claude-test"); code != 0 {
				t.Fatal(errOut)
			}
		}, args: []string{"-model", "qwen"}, code: 1,
			out: "done state-directory\ndone client\n", errHas: `alias "qwen" cannot serve: No direct anthropic credential`,
			wantSteps: []string{"state-directory", "client", "route"}},
		{name: "stops before the billable step", setup: func(t *testing.T) {
			if _, errOut, code := runCLI(t, env, plantedOpenAIKey+"\n", "credentials", "set", "openai"); code != 0 {
				t.Fatal(errOut)
			}
		}, code: 0, out: "done state-directory\ndone client\ndone route\n" + billable,
			wantSteps: []string{"state-directory", "client", "route"}},
		{name: "a model without permission", args: []string{"-model", "openai/gpt-test"}, code: 0,
			out:       "done state-directory\ndone client\ndone route\nnext: brama onboard -model openai/gpt-test -allow-provider-cost\n",
			wantSteps: []string{"state-directory", "client", "route"}},
		{name: "permission without a model", args: []string{"-allow-provider-cost"}, code: 0,
			out:       "done state-directory\ndone client\ndone route\n" + billable,
			wantSteps: []string{"state-directory", "client", "route"}},
		{name: "a subscription route is refused", args: []string{"-model", "claude-code/claude-test", "-allow-provider-cost"}, code: 1,
			out: "done state-directory\ndone client\n", errHas: "paid by an agent's subscription; onboarding calls a direct route",
			wantSteps: []string{"state-directory", "client", "route"}},
		{name: "a selector is refused", args: []string{"-model", "any", "-allow-provider-cost"}, code: 1,
			out: "done state-directory\ndone client\n", errHas: "paid by an agent's subscription; onboarding calls a direct route",
			wantSteps: []string{"state-directory", "client", "route"}},
		{name: "no key for the named route", args: []string{"-model", "anthropic/claude-test", "-allow-provider-cost"}, code: 1,
			out: "done state-directory\ndone client\nnext: brama credentials set anthropic\n", errHas: "no direct credential",
			wantSteps: []string{"state-directory", "client", "route"}},
		{name: "the provider refuses", setup: func(*testing.T) { fail.Store(true) }, args: []string{"-model", "openai/gpt-test", "-allow-provider-cost"}, code: 1,
			out: "done state-directory\ndone client\ndone route\n", errHas: "no model answer", calls: 1,
			wantSteps: []string{"state-directory", "client", "route"}},
		{name: "one real answer completes", setup: func(*testing.T) { fail.Store(false) }, args: []string{"-model", "openai/gpt-test", "-allow-provider-cost"}, code: 0,
			out: "done state-directory\ndone client\ndone route\ndone answer\n", calls: 1,
			wantSteps: []string{"state-directory", "client", "route", "answer"}},
		{name: "complete stays complete", code: 0,
			out:       "done state-directory\ndone client\ndone route\ndone answer\n",
			wantSteps: []string{"state-directory", "client", "route", "answer"}},
		{name: "a model named after completion is called again", args: []string{"-model", "openai/gpt-test", "-allow-provider-cost"}, code: 0,
			out: "done state-directory\ndone client\ndone route\ndone answer\n", calls: 1,
			wantSteps: []string{"state-directory", "client", "route", "answer"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup(t)
			}
			before := prov.calls.Load()
			out, errOut, code := runCLI(t, env, "", append([]string{"onboard"}, tc.args...)...)
			if code != tc.code || out != tc.out || !strings.Contains(errOut, tc.errHas) {
				t.Errorf("exit %d, stdout %q, stderr %q\nwant exit %d, stdout %q, stderr mentioning %q", code, out, errOut, tc.code, tc.out, tc.errHas)
			}
			if got := prov.calls.Load() - before; got != tc.calls {
				t.Errorf("%d provider calls, want %d", got, tc.calls)
			}
			got := steps(t)
			if len(got) != len(tc.wantSteps) {
				t.Errorf("progress holds %v, want %v", got, tc.wantSteps)
			}
			for _, s := range tc.wantSteps {
				if got[s].DoneAt.IsZero() {
					t.Errorf("progress lacks step %s: %v", s, got)
				}
			}
			if strings.Contains(out+errOut, plantedOpenAIKey) {
				t.Errorf("onboarding printed the key")
			}
		})
	}
	if m := steps(t)["answer"].Model; m != "openai/gpt-test" {
		t.Errorf("answer step model = %q", m)
	}
	if fi, err := os.Stat(progress); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("progress file mode: %v %v", fi.Mode(), err)
	}
	assertOwnerOnly(t, env["BRAMA_STATE_DIR"])
	assertNoSecret(t, plantedOpenAIKey, "", env["BRAMA_STATE_DIR"])
}

func TestOnboardRefusesUnreadableProgress(t *testing.T) {
	tests := []struct {
		name, content string
		mode          os.FileMode
		mentions      string
	}{
		{"group readable", `{"schema_version":1,"steps":{}}`, 0o644, "chmod 600"},
		{"unknown step", `{"schema_version":1,"steps":{"dance":{"done_at":"2025-01-01T00:00:00.000Z"}}}`, 0o600, `"dance"`},
		{"not json", `{"schema_version":1,`, 0o600, "onboarding.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := stateEnv(t)
			dir := env["BRAMA_STATE_DIR"]
			os.MkdirAll(dir, 0o700)
			path := filepath.Join(dir, onboardFile)
			os.WriteFile(path, []byte(tc.content), tc.mode)
			os.Chmod(path, tc.mode)
			out, errOut, code := runCLI(t, env, "", "onboard")
			if code != 1 || out != "" || !strings.Contains(errOut, tc.mentions) {
				t.Errorf("exit %d, %q %q; want 1 mentioning %q", code, out, errOut, tc.mentions)
			}
			if b, _ := os.ReadFile(path); string(b) != tc.content {
				t.Errorf("the unreadable progress file was overwritten")
			}
		})
	}
}

func FuzzParseOnboarding(f *testing.F) {
	f.Add([]byte(`{"schema_version":1,"steps":{"state-directory":{"done_at":"2025-01-01T00:00:00.000Z"},"answer":{"done_at":"2025-01-01T00:00:01.000Z","model":"openai/gpt-4o"}}}`))
	f.Add([]byte(`{"schema_version":1,"steps":{}}`))
	f.Add([]byte(`{"schema_version":2}`))
	f.Add([]byte(`{"schema_version":1,"steps":{"client":{"done_at":"x"}}}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		prog, err := parseOnboarding(b)
		if err != nil {
			if !errors.Is(err, errOnboardingInvalid) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		enc, err := marshalState(prog)
		if err != nil {
			t.Fatalf("accepted progress does not encode: %v", err)
		}
		again, err := parseOnboarding(enc)
		if err != nil {
			t.Fatalf("re-encoded progress is refused: %v\n%s", err, enc)
		}
		enc2, _ := marshalState(again)
		if string(enc) != string(enc2) {
			t.Fatalf("round trip changed the progress:\n%s\n%s", enc, enc2)
		}
	})
}

// TestOnboardWithAnInvalidRegistry: a -model that the invalid registry cannot resolve ends onboarding at the route step,
// naming the registry, with no call.
func TestOnboardWithAnInvalidRegistry(t *testing.T) {
	env := stateEnv(t)
	addClient(t, env, "local", "-admin")
	if err := os.WriteFile(filepath.Join(env["BRAMA_STATE_DIR"], "routes.json"), []byte(`{"schema_version":1,`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, env, "", "onboard", "-model", "qwen", "-allow-provider-cost")
	if code != 1 || out != "done state-directory\ndone client\n" || !strings.Contains(errOut, "the route registry is invalid") {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 after the client step naming the invalid registry", code, out, errOut)
	}
}
