package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStreamKeepAlive shortens the interval and holds the provider silent
// until the caller has seen a keep-alive comment; the stream then completes.
// Silent from its headers on, the first keep-alive is the first write: under
// -race the timer's first run raced its own creation (relay.go).
func TestStreamKeepAlive(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before int // provider frames sent before the silence
	}{{"silent after the first event", 1}, {"silent before the first event", 0}} {
		t.Run(tc.name, func(t *testing.T) { testStreamKeepAlive(t, tc.before) })
	}
}

func testStreamKeepAlive(t *testing.T, before int) {
	testingOnlyKeepAlive = 20 * time.Millisecond
	defer func() { testingOnlyKeepAlive = 0 }()
	frames := strings.SplitAfter(fixture(t, "openai-chat.sse"), "\n\n")
	sawKeepAlive := make(chan struct{})
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, f := range frames[:before] {
			io.WriteString(w, f)
		}
		w.(http.Flusher).Flush()
		select {
		case <-sawKeepAlive:
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second): // no keep-alive came: finish, and the test fails below
		}
		for _, f := range frames[before:] {
			io.WriteString(w, f)
		}
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	resp := d.openStream("/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", true, ""))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var rest strings.Builder
	seen := false
	for {
		line, err := br.ReadString('\n')
		if !seen && strings.HasPrefix(line, ": keep-alive") {
			seen = true
			close(sawKeepAlive)
		}
		if seen {
			rest.WriteString(line)
		}
		if err != nil {
			break
		}
	}
	if !seen {
		t.Fatal("no keep-alive comment during 'silence'")
	}
	if !strings.Contains(rest.String(), "data: [DONE]") {
		t.Errorf("the stream did not complete after the keep-alive: %q", rest.String())
	}
}

func TestModelsEmbeddingsStatsMetrics(t *testing.T) {
	fx := protocolFixtures[0]
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		switch r.URL.Path {
		case "/embeddings":
			io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"emb-up"}`)
		default:
			io.WriteString(w, fx.buffered)
		}
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	catalogue := filepath.Join(t.TempDir(), "models.json")
	os.WriteFile(catalogue, []byte(`{"openai":{"id":"openai","models":{"gpt-cat":{"id":"gpt-cat","release_date":"2026-01-01","modalities":{"input":["text"],"output":["text"]}}}},"anthropic":{"id":"anthropic","models":{"claude-cat":{"id":"claude-cat"}}}}`), 0o600)
	env["BRAMA_MODEL_CATALOG_PATH"] = catalogue
	d := startDaemon(t, env, `{"openai":"`+plantedOpenAIKey+`"}`, "-local-credentials-stdin")
	d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"emb","route":"openai/text-embedding-test"}`)

	status, _, body := d.call("GET", "/v1/models", d.token, "")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID    string `json:"id"`
			State string `json:"brama_state"`
		} `json:"data"`
	}
	json.Unmarshal(body, &models)
	ids := map[string]string{}
	for _, m := range models.Data {
		ids[m.ID] = m.State
	}
	if status != 200 || models.Object != "list" || ids["emb"] != "serving" {
		t.Errorf("/v1/models: %d %s", status, body)
	}
	if _, ok := ids["openai/gpt-cat"]; !ok {
		t.Errorf("/v1/models lacks the catalogue model of a provider that can serve: %s", body)
	}
	if _, ok := ids["anthropic/claude-cat"]; ok {
		t.Errorf("/v1/models lists a model of a provider without a credential: %s", body)
	}

	status, hdr, body := d.call("POST", "/v1/embeddings", d.token, `{"input": "hello", "model": "emb"}`)
	if status != 200 || !strings.Contains(string(body), `"embedding":[0.5]`) || hdr.Get("Brama-Attempts") != "1" {
		t.Errorf("/v1/embeddings: %d %s", status, body)
	}
	if got := hdr.Get("Brama-Route"); got != "openai/text-embedding-test" { // README: every answer names its route
		t.Errorf("/v1/embeddings Brama-Route = %q, want openai/text-embedding-test", got)
	}
	var up map[string]any
	json.Unmarshal(fake.body(), &up)
	if up["model"] != "text-embedding-test" || up["input"] != "hello" {
		t.Errorf("upstream embeddings body = %v", up)
	}
	if got, want := string(fake.body()), `{"input": "hello", "model": "text-embedding-test"}`; got != want { // the rest as sent
		t.Errorf("upstream embeddings body = %s, want %s", got, want)
	}
	d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", false, ""))

	if m := d.scrape(t); m["brama_route_requests_total{route=\"openai/gpt-test\"}"] != 1 || m["brama_route_requests_total{route=\"openai/text-embedding-test\"}"] != 1 || m["brama_journal_bytes"] == 0 {
		t.Errorf("/metrics: %v", m)
	}
	status, hdr, body = d.call("GET", "/metrics", d.token, "")
	if status != 200 || hdr.Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" || // Prometheus' text format
		!strings.Contains(string(body), `brama_route_requests_total{route="openai/gpt-test"} 1`) ||
		!strings.Contains(string(body), "brama_attempts_total 2") {
		t.Errorf("/metrics: %d %s", status, body)
	}
	if s, _, _ := d.call("GET", "/metrics", "", ""); s != 401 {
		t.Errorf("/metrics without a bearer = %d, want 401", s)
	}
	assertNoSecret(t, plantedOpenAIKey, d.stderr.String(), env["BRAMA_STATE_DIR"])
}

// TestModelsListsOnlyAllowedModels: a client with allowed_models is shown
// only the names it may use (SPEC §3.1, §15); an admin without a list sees all.
func TestModelsListsOnlyAllowedModels(t *testing.T) {
	env := stateEnv(t)
	catalogue := filepath.Join(t.TempDir(), "models.json")
	os.WriteFile(catalogue, []byte(`{"openai":{"models":{"gpt-cat":{"id":"gpt-cat"},"gpt-dear":{"id":"gpt-dear"}}}}`), 0o600)
	env["BRAMA_MODEL_CATALOG_PATH"] = catalogue
	d := startDaemon(t, env, `{"openai":"`+plantedOpenAIKey+`"}`, "-local-credentials-stdin")
	for _, alias := range []string{"chat", "dear"} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"`+alias+`","route":"openai/gpt-cat"}`); s != 200 {
			t.Fatalf("declaring %s: %d %s", alias, s, b)
		}
	}
	app := addClient(t, env, "app", "-allow", "chat", "-allow", "openai/gpt-cat")
	listed := func(token string) []string {
		status, _, body := d.call("GET", "/v1/models", token, "")
		var models struct{ Data []struct{ ID string } }
		if err := json.Unmarshal(body, &models); status != 200 || err != nil {
			t.Fatalf("/v1/models: %d %s", status, body)
		}
		var ids []string
		for _, m := range models.Data {
			ids = append(ids, m.ID)
		}
		return ids
	}
	if got, want := strings.Join(listed(app), " "), "chat openai/gpt-cat"; got != want {
		t.Errorf("/v1/models for a client allowed chat and openai/gpt-cat lists %q, want %q", got, want)
	}
	if got, want := strings.Join(listed(d.token), " "), "chat dear openai/gpt-cat openai/gpt-dear"; got != want {
		t.Errorf("/v1/models for the admin lists %q, want %q", got, want)
	}
	aliases := func(token string) string {
		var table aliasTable
		if status, _, body := d.call("GET", "/v1/aliases", token, ""); status != 200 || json.Unmarshal(body, &table) != nil {
			t.Fatalf("/v1/aliases: %d %s", status, body)
		}
		var names []string
		for _, a := range table.Aliases {
			names = append(names, a.Alias)
		}
		return strings.Join(names, " ")
	}
	if got, all := aliases(app), aliases(d.token); got != "chat" || all != "chat dear" {
		t.Errorf("/v1/aliases lists %q for the client allowed chat, %q for the admin; want \"chat\", \"chat dear\"", got, all)
	}
	// A name outside the list is refused before dispatch (README "Who may call").
	status, _, body := d.call("POST", "/v1/chat/completions", app, chatBody(dialectChat, "dear", false, ""))
	if e := envelopeOf(t, body); status != 403 || e["code"] != "forbidden" || e["attempts"] != nil || e["message"] != `this client may not use model "dear"` {
		t.Errorf("a model outside the client's list: %d %s, want 403 forbidden without attempts", status, body)
	}
}

func TestPerfStatsUnplacedOnce(t *testing.T) {
	fx := protocolFixtures[0]
	fake := fixtureProvider(t, fx)
	env := map[string]string{"BRAMA_MODEL_CATALOG_URL": "off", "BRAMA_PROVIDER_OPENAI_BASE_URL": fake.URL}
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	if strings.Contains(d.stderr.String(), "perf_stats_unplaced") {
		t.Fatal("perf_stats_unplaced logged before any dispatch")
	}
	for range 3 {
		if s, _, b := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", false, "")); s != 200 {
			t.Fatalf("dispatch without a state directory: %d %s", s, b)
		}
	}
	logs := d.stderr.String()
	if n := strings.Count(logs, `"msg":"perf_stats_unplaced"`); n != 1 || !strings.Contains(logs, "$HOME is not defined") {
		t.Errorf("perf_stats_unplaced logged %d times (want 1, naming the cause)", n)
	}
}

func TestReadyzNamesUnusableStateFiles(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "ledger.json"), []byte(`{"schema_version":1,"subscriptions":{},"extra":1}`), 0o600)
	os.WriteFile(filepath.Join(dir, "journal.jsonl"), []byte("{}\n"), 0o644)
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	status, _, body := d.call("GET", "/readyz", "", "")
	var rd readiness
	json.Unmarshal(body, &rd)
	joined := strings.Join(rd.Reasons, "\n")
	if status != 503 || rd.Ready || !strings.Contains(joined, "ledger unusable") || !strings.Contains(joined, "journal unusable") {
		t.Errorf("/readyz with an unreadable ledger and a group-readable journal: %d %s", status, body)
	}
	os.Remove(filepath.Join(dir, "journal.jsonl"))
	os.WriteFile(filepath.Join(dir, "ledger.json"), []byte(`{"schema_version":1,"subscriptions":{}}`), 0o600)
	status, _, body = d.call("GET", "/readyz", "", "")
	json.Unmarshal(body, &rd)
	if strings.Contains(strings.Join(rd.Reasons, "\n"), "journal unusable") {
		t.Errorf("/readyz still names the removed journal: %s", body)
	}
	if status != 503 || !strings.Contains(strings.Join(rd.Reasons, "\n"), "ledger unusable") {
		t.Errorf("the ledger was read once at start and is never overwritten; it stays named until a restart: %d %s", status, body)
	}
}

// An answer key that fails the §2.2 guards makes every signed answer a 500,
// so /readyz names it (SPEC §13: every state file that exists must open).
func TestReadyzNamesAnUnusableAnswerKey(t *testing.T) {
	env := stateEnv(t)
	key := filepath.Join(env["BRAMA_STATE_DIR"], "answer-key")
	os.MkdirAll(env["BRAMA_STATE_DIR"], 0o700)
	os.WriteFile(key, bytes.Repeat([]byte{7}, 32), 0o644)
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	status, _, body := d.call("GET", "/readyz", "", "")
	var rd readiness
	json.Unmarshal(body, &rd)
	if status != 503 || !strings.Contains(strings.Join(rd.Reasons, "\n"), "answer key") {
		t.Errorf("/readyz with a group-readable answer key: %d %s, want 503 naming it", status, body)
	}
	os.Chmod(key, 0o600)
	if status, _, body := d.call("GET", "/readyz", "", ""); status != 200 {
		t.Errorf("/readyz after the answer key was repaired: %d %s", status, body)
	}
	os.WriteFile(key, bytes.Repeat([]byte{7}, 16), 0o600) // SPEC §2: 32 raw bytes; a short key does not parse
	status, _, body = d.call("GET", "/readyz", "", "")
	if rd = (readiness{}); json.Unmarshal(body, &rd) != nil || status != 503 || !strings.Contains(strings.Join(rd.Reasons, "\n"), "answer key") {
		t.Errorf("/readyz with a 16-byte answer key: %d %s, want 503 naming it", status, body)
	}
	os.Remove(key) // absent, it is made by the first signed answer: /readyz reads, and makes nothing
	status, _, body = d.call("GET", "/readyz", "", "")
	if _, err := os.Stat(key); status != 200 || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/readyz without an answer key: %d %s, the key's stat %v; want 200 and no key made", status, body, err)
	}
}

// BRAMA_STATE_DIR written with a trailing slash (as env files often have it)
// is the same state directory: /readyz names its registry, not "(named by
// environment)" (SPEC §2.1, Runbook "An invalid registry").
func TestReadyzNamesTheRegistryOfAStateDirWithATrailingSlash(t *testing.T) {
	env := stateEnv(t)
	dir := env["BRAMA_STATE_DIR"]
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "routes.json"), []byte(`{"routes":{}}`), 0o644)
	env["BRAMA_STATE_DIR"] = dir + "/"
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	status, _, body := d.call("GET", "/readyz", "", "")
	if want := filepath.Join(dir, "routes.json"); status != 503 || !strings.Contains(string(body), want) || strings.Contains(string(body), "named by environment") {
		t.Errorf("/readyz with a group-readable registry in %s/: %d %s; want 503 naming %s", dir, status, body, want)
	}
}

// TestModelsListsTheAgentsSubscriptionModels: a caller with an agent sees
// the catalogue models of the providers its agent's subscriptions serve;
// a caller without one, or whose agent has none there, does not (SPEC §15).
// Every caller sees those of a provider the deployment's direct key pays.
func TestModelsListsTheAgentsSubscriptionModels(t *testing.T) {
	env := stateEnv(t)
	catalogue := filepath.Join(t.TempDir(), "models.json")
	os.WriteFile(catalogue, []byte(`{"moonshotai":{"models":{"k2-cat":{"id":"k2-cat"}}},"anthropic":{"models":{"claude-cat":{"id":"claude-cat"}}},"openai":{"models":{"gpt-cat":{"id":"gpt-cat"}}}}`), 0o600)
	env["BRAMA_MODEL_CATALOG_PATH"] = catalogue
	d := startDaemon(t, env, `{"openai":"sk-direct-0123"}`, "-local-credentials-stdin")
	tok, _ := agentWithSubs(t, d, "a1", "kimi", "kimi-key-0123")
	other := addClient(t, env, "a2-app", "-agent", "a2")
	for _, tc := range []struct {
		name, token, want string
	}{
		{"a1's bound client", tok, "openai/gpt-cat kimi/k2-cat"},
		{"a2's bound client, no subscription", other, "openai/gpt-cat"},
		{"the admin, no agent", d.token, "openai/gpt-cat"},
	} {
		status, _, body := d.call("GET", "/v1/models", tc.token, "")
		var models struct{ Data []struct{ ID string } }
		if err := json.Unmarshal(body, &models); status != 200 || err != nil {
			t.Fatalf("%s: /v1/models %d %s", tc.name, status, body)
		}
		var ids []string
		for _, m := range models.Data {
			ids = append(ids, m.ID)
		}
		if got := strings.Join(ids, " "); got != tc.want {
			t.Errorf("%s: /v1/models lists %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestRelativeStateDirIsNoStateDir: a relative BRAMA_STATE_DIR ("~/.brama"
// copied into a unit file, "state") would keep state in the working
// directory, which SPEC §2.1 never does: it counts as no state directory.
func TestRelativeStateDirIsNoStateDir(t *testing.T) {
	routesSet := []string{"routes", "set", "chat", "openai/gpt-4o"}
	for _, tc := range []struct {
		name, env, dir string
		args           []string
	}{
		{"~/.brama", "BRAMA_STATE_DIR", "~/.brama", routesSet}, {"state", "BRAMA_STATE_DIR", "state", routesSet},
		{"./state", "BRAMA_STATE_DIR", "./state", routesSet},
		{"relative HOME", "HOME", "home", routesSet}, // <home>/.brama would be the working directory's too
		{"relative routes file", "BRAMA_ROUTES_FILE", "routes.json", routesSet},
		{"relative clients file", "BRAMA_CLIENTS_FILE", "clients.json", []string{"clients", "add", "app"}},
		{"relative vault", "BRAMA_VAULT_FILE", "vault.json", []string{"credentials", "set", "openai"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cwd := t.TempDir()
			t.Chdir(cwd)
			env := map[string]string{"HOME": t.TempDir()}
			env[tc.env] = tc.dir
			_, errOut, code := runCLI(t, env, "sk-test-0123456789\n", tc.args...)
			if code != 1 || !strings.Contains(errOut, "not an absolute path") {
				t.Errorf("%v with %s=%s: exit %d %q; want 1 naming the rule", tc.args, tc.env, tc.dir, code, errOut)
			}
			if ents, _ := os.ReadDir(cwd); len(ents) != 0 {
				t.Errorf("the working directory holds %d entries (%s...)", len(ents), ents[0].Name())
			}
		})
	}
}

// TestAllowlistCoversOpenRouterFallbacks: OpenRouter's `models` member names
// models it may call in place of the one named, so a client with
// allowed_models may list only models it may use as `openrouter/<model>`
// (SPEC §3.1); a client without a list, a request without the member, and
// another provider's request pass it untouched.
func TestAllowlistCoversOpenRouterFallbacks(t *testing.T) {
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","model":"cheap","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	})
	env := stateEnv(t)
	env["BRAMA_MODEL_CATALOG_URL"] = "off"
	env["BRAMA_PROVIDER_OPENROUTER_BASE_URL"] = fake.URL
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openrouter":"`+plantedOpenAIKey+`","openai":"k2"}`, "-local-credentials-stdin")
	app := addClient(t, env, "app", "-allow", "openrouter/cheap", "-allow", "openrouter/spare", "-allow", "openai/gpt-test")
	for _, tc := range []struct {
		name, token, model, models string
		status                     int
		message                    string
	}{
		{"a fallback outside the list", app, "openrouter/cheap", `["spare","costly/model"]`, 403, `this client may not use model "openrouter/costly/model" (named in models)`},
		{"a fallback that is no name", app, "openrouter/cheap", `["spare",7]`, 403, `this client may not use models: it must be a list of model names`},
		{"fallbacks inside the list", app, "openrouter/cheap", `["spare","cheap"]`, 200, ""},
		{"no fallbacks", app, "openrouter/cheap", "", 200, ""},
		{"a client without a list", d.token, "openrouter/cheap", `["costly/model"]`, 200, ""},
		{"a client without a list, fallbacks that are no names", d.token, "openrouter/cheap", `["spare",7]`, 200, ""},
		{"another provider's request", app, "openai/gpt-test", `["costly/model"]`, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, member := fake.calls.Load(), ""
			if tc.models != "" {
				member = `"models":` + tc.models + `,`
			}
			body := `{"model":"` + tc.model + `",` + member + `"messages":[{"role":"user","content":"hi"}],"max_tokens":10}`
			status, _, got := d.call("POST", "/v1/chat/completions", tc.token, body)
			if status != tc.status {
				t.Fatalf("%d %s, want %d", status, got, tc.status)
			}
			calls := fake.calls.Load() - before
			if tc.status != 200 {
				if e := envelopeOf(t, got); e["code"] != "forbidden" || e["message"] != tc.message || calls != 0 {
					t.Errorf("%s after %d calls, want forbidden %q before any call", got, calls, tc.message)
				}
				return
			}
			if sent := fake.body(); calls != 1 || !strings.Contains(string(sent), member) {
				t.Errorf("%d calls, provider saw %s, want the models member untouched", calls, sent)
			}
		})
	}
}
