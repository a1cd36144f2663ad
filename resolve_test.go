package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// resolveDoc declares one alias for every row of SPEC §4.3 and §5.3.
const resolveDoc = `{
  "deployments": [
    {"name": "qwen-local", "endpoint": {"host": "127.0.0.1", "port": 11434}, "model": "qwen2.5:7b", "adapters": [{"name": "qwen-lora"}]},
    {"name": "tail", "endpoint": {"host": "100.100.1.2", "port": 8000}}
  ],
  "routes": {
    "chat": "anthropic/claude-sonnet-4-5",
    "gpt": "openai/gpt-4o",
    "cheap": "qwen-local",
    "lora": "qwen-lora",
    "tailnet": "local-openai/tail",
    "smart": "best",
    "best": "claude-code/claude-opus-4-1",
    "sub": "codex/gpt-5",
    "weird": "nosuch/model",
    "openai/gpt-4o-mini": "groq/llama-3.3-70b"
  }
}`

// resolveDirect has direct credentials for anthropic and groq only.
func resolveDirect(p string) bool { return p == "anthropic" || p == "groq" }

func resolveTestDoc(t *testing.T) *routesDoc {
	t.Helper()
	doc, err := parseRegistry([]byte(resolveDoc))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func regProvider(t *testing.T, id string) providerInfo {
	t.Helper()
	p, ok := lookupProvider(id)
	if !ok {
		t.Fatalf("provider %q unknown", id)
	}
	return p
}

func TestAliases(t *testing.T) {
	f := newRegFixture(t)
	regWrite(t, f.path, resolveDoc)
	table, err := f.reg.aliases(resolveDirect, nil)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ Alias, State, Route string }
	var got []row
	for _, r := range table.Aliases {
		if r.Route == nil || !strings.HasSuffix(r.Reason, ".") || strings.Count(r.Reason, ". ") > 0 {
			t.Errorf("alias %q: route %v, reason %q; want its route and one sentence", r.Alias, r.Route, r.Reason)
			continue
		}
		got = append(got, row{r.Alias, r.State, *r.Route})
	}
	want := []row{
		{"best", "serving", "claude-code/claude-opus-4-1"},
		{"chat", "serving", "anthropic/claude-sonnet-4-5"},
		{"cheap", "serving", "qwen-local"},
		{"gpt", "capability_absent", "openai/gpt-4o"},
		{"lora", "serving", "qwen-lora"},
		{"openai/gpt-4o-mini", "serving", "groq/llama-3.3-70b"},
		{"smart", "serving", "best"},
		{"sub", "serving", "codex/gpt-5"},
		{"tailnet", "serving", "local-openai/tail"},
		{"weird", "capability_absent", "nosuch/model"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("alias table (-want +got):\n%s", diff)
	}
	if table.Unserviceable != 2 {
		t.Errorf("unserviceable = %d, want 2", table.Unserviceable)
	}

	// Without any direct credential, anthropic and groq cannot serve either.
	table, err = f.reg.aliases(nil, nil)
	if err != nil || table.Unserviceable != 4 {
		t.Errorf("no credentials: unserviceable = %d, %v; want 4", table.Unserviceable, err)
	}
}

func TestAliasesEmptyAndInvalid(t *testing.T) {
	f := newRegFixture(t)
	table, err := f.reg.aliases(nil, nil)
	if err != nil || table.Aliases == nil || len(table.Aliases) != 0 {
		t.Fatalf("absent registry: %#v, %v; want an empty (non-nil) table", table, err)
	}
	regWrite(t, f.path, `{"routes":{"a":"best"},"fallbacks":{}}`)
	if _, err := f.reg.aliases(nil, nil); err == nil || !strings.Contains(err.Error(), `"fallbacks"`) {
		t.Fatalf("invalid registry: err = %v, want the reason", err)
	}
}

func TestResolveModel(t *testing.T) {
	invalid := errors.New(`registry field "fallbacks" is not part of schema 1; run brama routes migrate`)
	tests := []struct {
		name    string
		model   string
		docErr  error
		want    resolution
		code    string        // a refusal's code, when not ""
		details *aliasDetails // a refusal's details
	}{
		// §5.1 rule 1: selectors.
		{name: "any", model: "any", want: resolution{Mode: modeAny}},
		{name: "any any case", model: "ANY", want: resolution{Mode: modeAny}},
		{name: "any-vision-capable any case", model: "Any-Vision-Capable", want: resolution{Mode: modeAnyVision}},
		// rule 2: best.
		{name: "best", model: "best", want: resolution{Mode: modeBest}},
		// rule 3: aliases.
		{name: "alias to direct provider", model: "chat", want: resolution{Mode: modeAlias, Alias: "chat", Route: "anthropic/claude-sonnet-4-5",
			Provider: regProvider(t, "anthropic"), Model: "claude-sonnet-4-5"}},
		{name: "alias to subscription provider", model: "sub", want: resolution{Mode: modeSubscription, Alias: "sub", Route: "codex/gpt-5",
			Provider: regProvider(t, "codex"), Model: "gpt-5"}},
		{name: "alias to best", model: "smart", want: resolution{Mode: modeBest, Alias: "smart"}},
		{name: "alias to deployment", model: "cheap", want: resolution{Mode: modeAlias, Alias: "cheap", Route: "local-openai/qwen-local",
			Provider: regProvider(t, "local-openai"), Model: "qwen2.5:7b", BaseURL: "http://127.0.0.1:11434/v1"}},
		{name: "alias to adapter", model: "lora", want: resolution{Mode: modeAlias, Alias: "lora", Route: "local-openai/qwen-lora",
			Provider: regProvider(t, "local-openai"), Model: "qwen-lora", BaseURL: "http://127.0.0.1:11434/v1"}},
		{name: "alias to canonical local-openai", model: "tailnet", want: resolution{Mode: modeAlias, Alias: "tailnet", Route: "local-openai/tail",
			Provider: regProvider(t, "local-openai"), Model: "tail", BaseURL: "http://100.100.1.2:8000/v1"}},
		{name: "alias shadows a canonical route", model: "openai/gpt-4o-mini", want: resolution{Mode: modeAlias, Alias: "openai/gpt-4o-mini",
			Route: "groq/llama-3.3-70b", Provider: regProvider(t, "groq"), Model: "llama-3.3-70b"}},
		{name: "alias without direct credential", model: "gpt", code: "alias_unserviceable",
			details: &aliasDetails{Alias: "gpt", State: "capability_absent", Route: regStr("openai/gpt-4o")}},
		{name: "alias to unknown provider", model: "weird", code: "alias_unserviceable",
			details: &aliasDetails{Alias: "weird", State: "capability_absent", Route: regStr("nosuch/model")}},
		// rule 4: canonical routes.
		{name: "canonical direct", model: "openai/gpt-4o", want: resolution{Mode: modeDirect, Route: "openai/gpt-4o",
			Provider: regProvider(t, "openai"), Model: "gpt-4o"}},
		{name: "canonical splits at the first slash", model: "openrouter/meta/llama", want: resolution{Mode: modeDirect, Route: "openrouter/meta/llama",
			Provider: regProvider(t, "openrouter"), Model: "meta/llama"}},
		{name: "canonical subscription provider", model: "claude-code/claude-opus-4-1", want: resolution{Mode: modeSubscription,
			Route: "claude-code/claude-opus-4-1", Provider: regProvider(t, "claude-code"), Model: "claude-opus-4-1"}},
		{name: "canonical local-openai", model: "local-openai/qwen-lora", want: resolution{Mode: modeDirect, Route: "local-openai/qwen-lora",
			Provider: regProvider(t, "local-openai"), Model: "qwen-lora", BaseURL: "http://127.0.0.1:11434/v1"}},
		{name: "canonical local-openai without deployment", model: "local-openai/llama", code: "invalid_request"},
		// rule 5: anything else, a known provider with a model rule 4 refuses too.
		{name: "canonical empty model", model: "openai/", code: "alias_unknown", details: &aliasDetails{Alias: "openai/", State: "no_route"}},
		{name: "canonical control character", model: "openai/gpt\n4o", code: "alias_unknown", details: &aliasDetails{Alias: "openai/gpt\n4o", State: "no_route"}},
		{name: "canonical model too long", model: "openai/" + strings.Repeat("m", 513), code: "alias_unknown", details: &aliasDetails{Alias: "openai/" + strings.Repeat("m", 513), State: "no_route"}},
		{name: "unknown provider", model: "nosuch/model", code: "alias_unknown", details: &aliasDetails{Alias: "nosuch/model", State: "no_route"}},
		{name: "bare vendor model name", model: "gpt-4o", code: "alias_unknown", details: &aliasDetails{Alias: "gpt-4o", State: "no_route"}},
		{name: "selector-like case", model: "BEST", code: "alias_unknown", details: &aliasDetails{Alias: "BEST", State: "no_route"}},
		{name: "retired task selector", model: "task:x", code: "alias_unknown", details: &aliasDetails{Alias: "task:x", State: "no_route"}},
		{name: "retired task selector with slash", model: "task:a/b", code: "alias_unknown", details: &aliasDetails{Alias: "task:a/b", State: "no_route"}},
		{name: "empty model", model: "", code: "invalid_request"},
		// An invalid registry: aliases cannot be told apart from unknown names.
		{name: "invalid registry: alias", model: "chat", docErr: invalid, code: "alias_unserviceable",
			details: &aliasDetails{Alias: "chat", State: "routes_file_invalid"}},
		{name: "invalid registry: unknown name", model: "nothing", docErr: invalid, code: "alias_unserviceable",
			details: &aliasDetails{Alias: "nothing", State: "routes_file_invalid"}},
		{name: "invalid registry: local-openai needs deployments", model: "local-openai/qwen-local", docErr: invalid, code: "alias_unserviceable",
			details: &aliasDetails{Alias: "local-openai/qwen-local", State: "routes_file_invalid"}},
		{name: "invalid registry: selector", model: "any", docErr: invalid, want: resolution{Mode: modeAny}},
		{name: "invalid registry: retired task selector", model: "task:x", docErr: invalid, code: "alias_unserviceable",
			details: &aliasDetails{Alias: "task:x", State: "routes_file_invalid"}},
		{name: "invalid registry: best", model: "best", docErr: invalid, want: resolution{Mode: modeBest}},
		{name: "invalid registry: canonical", model: "openai/gpt-4o", docErr: invalid, want: resolution{Mode: modeDirect, Route: "openai/gpt-4o",
			Provider: regProvider(t, "openai"), Model: "gpt-4o"}},
	}
	doc := resolveTestDoc(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := doc
			if tt.docErr != nil {
				d = nil // an invalid registry has no document
			}
			got, err := resolveModel(tt.model, d, tt.docErr, resolveDirect)
			if tt.code != "" {
				ae := wantAPIError(t, err, tt.code, "")
				if diff := cmp.Diff(tt.details, ae.Details); diff != "" {
					t.Errorf("details (-want +got):\n%s", diff)
				}
				if ae.Status() == 0 || len(ae.Message) == 0 {
					t.Errorf("refusal without status or message: %+v", ae)
				}
				return
			}
			if err != nil {
				t.Fatalf("resolveModel(%q) = %v", tt.model, err)
			}
			sameRow := cmp.Comparer(func(a, b providerInfo) bool { return a.id == b.id }) // a row holds funcs
			if diff := cmp.Diff(tt.want, got, sameRow, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("resolution (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveModelStatuses(t *testing.T) {
	doc := resolveTestDoc(t)
	tests := []struct {
		name   string
		model  string
		status int
		body   string
	}{
		{name: "never declared", model: "nope", status: 404,
			body: `"code":"alias_unknown","retryable":false,"details":{"alias":"nope","state":"no_route","route":null}`},
		{name: "declared, not serving", model: "gpt", status: 503,
			body: `"code":"alias_unserviceable","retryable":false,"details":{"alias":"gpt","state":"capability_absent","route":"openai/gpt-4o"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := resolveModel(tt.model, doc, nil, resolveDirect)
			ae := asAPIError(err)
			b := string(regJSON(t, envelope{Error: *ae}))
			if ae.Status() != tt.status || !strings.Contains(b, tt.body) || strings.Contains(b, "attempts") {
				t.Errorf("status %d body %s; want %d with %s and no attempts", ae.Status(), b, tt.status, tt.body)
			}
		})
	}
}

func regJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
