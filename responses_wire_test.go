package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// codexLikeDaemon is a daemon whose agent a1 has one codex subscription, on
// a fake that refuses what the ChatGPT codex backend refuses, as it says it.
func codexLikeDaemon(t *testing.T) (*daemon, *recordingProvider, string) {
	prov := newRecordingProvider(t, "", fixture(t, "codex.sse"))
	prov.alwaysStream = true
	prov.refuse = func(c recordedCall) (int, string) {
		var b map[string]json.RawMessage
		var items []struct{ Role string }
		json.Unmarshal(c.body, &b)
		json.Unmarshal(b["input"], &items)
		for _, it := range items {
			if it.Role == "system" {
				return 400, `{"detail":"System messages are not allowed"}`
			}
		}
		for _, name := range []string{"temperature", "top_p", "max_output_tokens", "metadata", "safety_identifier", "user"} {
			if b[name] != nil {
				return 400, fmt.Sprintf(`{"detail":"Unsupported parameter: %s"}`, name)
			}
		}
		return 0, ""
	}
	d, tok, _ := codexDaemon(t, prov.URL)
	return d, prov, tok
}

// TestTranslationTowardCodexSendsNoSystemItem: the codex backend refuses an
// input item of role system (400 "System messages are not allowed"), so an
// instruction after the first turn goes as a developer item, the role the
// Codex CLI gives its own (SPEC §6.2, §7.6).
func TestTranslationTowardCodexSendsNoSystemItem(t *testing.T) {
	d, prov, tok := codexLikeDaemon(t)
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"codex/gpt-5","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"q"},{"role":"system","content":"Now in French."},{"role":"user","content":"q2"}]}`},
		{"/v1/messages", `{"model":"codex/gpt-5","max_tokens":100,"system":"Be terse.","messages":[{"role":"user","content":"q"},{"role":"system","content":"Now in French."},{"role":"user","content":"q2"}]}`},
	} {
		status, _, body := d.call("POST", tc.path, tok, tc.body)
		if status != 200 {
			t.Errorf("%s: status %d %s, want 200", tc.path, status, body)
			continue
		}
		up := prov.last(t).body
		if got := jsonAt(t, up, "input[1].role"); got != `"developer"` {
			t.Errorf("%s: input[1].role = %s, want \"developer\" (%s)", tc.path, got, up)
		}
		if got := jsonAt(t, up, "input[1].content[0].text"); got != `"Now in French."` {
			t.Errorf("%s: input[1] text = %s, want the later instruction", tc.path, got)
		}
	}
}

// TestTranslationTowardCodexDropsWhatItRefuses: the codex backend refuses
// metadata, safety_identifier and user (400 "Unsupported parameter"), as it
// does temperature and top_p; translated toward codex they are dropped and
// named, the rest of what the OpenAI formats share carried (SPEC §6.2, §7.6).
func TestTranslationTowardCodexDropsWhatItRefuses(t *testing.T) {
	d, prov, tok := codexLikeDaemon(t)
	status, hdr, body := d.call("POST", "/v1/chat/completions", tok, `{"model":"codex/gpt-5","messages":[{"role":"user","content":"q"}],
		"temperature":0.2,"metadata":{"k":"v"},"safety_identifier":"s","user":"u","prompt_cache_key":"c","service_tier":"priority"}`)
	if status != 200 {
		t.Fatalf("status %d %s, want 200", status, body)
	}
	if got, want := hdr.Get("Brama-Dropped"), "temperature, metadata, safety_identifier, user"; got != want {
		t.Errorf("Brama-Dropped = %q, want %q", got, want)
	}
	up := prov.last(t).body
	for path, want := range map[string]string{"prompt_cache_key": `"c"`, "service_tier": `"priority"`} {
		if got := jsonAt(t, up, path); got != want {
			t.Errorf("upstream %s = %s, want %s", path, got, want)
		}
	}
}

// TestTranslatedResponsesUsageHasItsDetails: a Responses answer's usage
// always has input_tokens_details and output_tokens_details; strict clients
// (Grok Build, Rust serde types) refuse a response.completed without them.
func TestTranslatedResponsesUsageHasItsDetails(t *testing.T) {
	env := stateEnv(t)
	f := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, fixture(t, "anthropic-messages.sse"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, messagesToolAnswer)
	})
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f}), "-local-credentials-stdin")
	for _, stream := range []bool{false, true} {
		status, _, out := d.call("POST", "/v1/responses", d.token, fmt.Sprintf(`{"model":"anthropic/claude-test","input":"hi","max_output_tokens":100,"stream":%v}`, stream))
		if status != 200 {
			t.Fatalf("stream=%v: status %d %s", stream, status, out)
		}
		resp, prefix := out, ""
		if stream {
			resp, prefix = nil, "response."
			for _, fr := range splitTestSSE(t, string(out)) {
				if fr.Event == "response.completed" {
					resp = []byte(fr.Data)
				}
			}
		}
		for _, path := range []string{"usage.input_tokens_details.cached_tokens", "usage.output_tokens_details.reasoning_tokens"} {
			if got := jsonAt(t, resp, prefix+path); got != "0" {
				t.Errorf("stream=%v: %s = %q, want 0", stream, path, got)
			}
		}
	}
}

// TestTranslationNamesUnknownItemMembers: a member of an input item that
// Brama does not carry (an assistant message's phase) is dropped and named,
// as a chat message's are; nothing is dropped silently (SPEC §7.6).
func TestTranslationNamesUnknownItemMembers(t *testing.T) {
	env := stateEnv(t)
	f := newTranslationFake(t, func(string) string { return messagesToolAnswer })
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f.fakeProvider}), "-local-credentials-stdin")
	status, hdr, body := d.call("POST", "/v1/responses", d.token, `{"model":"anthropic/claude-test","max_output_tokens":100,"input":[
		{"type":"message","role":"user","content":"q"},
		{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"a"}],"phase":"commentary"},
		{"type":"function_call","id":"fc_1","call_id":"c1","name":"f","arguments":"{}","extra":1},
		{"type":"function_call_output","call_id":"c1","output":"r"},
		{"type":"web_search_call","id":"ws_1","status":"completed","action":{"type":"search"}}]}`)
	if status != 200 {
		t.Fatalf("status %d %s", status, body)
	}
	if got, want := hdr.Get("Brama-Dropped"), "phase, extra, web_search_call"; got != want {
		t.Errorf("Brama-Dropped = %q, want %q", got, want)
	}
}

// TestTranslationCarriesVerbosity: Responses text.verbosity and chat's
// verbosity are one member in two places, carried between the two OpenAI
// formats, named toward messages, which has none (SPEC §7.6).
func TestTranslationCarriesVerbosity(t *testing.T) {
	d, fakes := translationDaemon(t)
	for _, tc := range []struct{ path, body, provider, member, dropped string }{
		{"/v1/responses", `{"model":"openai/gpt-test","input":"q","text":{"verbosity":"low"}}`, "openai", "verbosity", ""},
		{"/v1/chat/completions", `{"model":"openai-responses/gpt-test","messages":[{"role":"user","content":"q"}],"verbosity":"high"}`, "openai-responses", "text.verbosity", ""},
		{"/v1/responses", `{"model":"anthropic/claude-test","max_output_tokens":9,"input":"q","text":{"verbosity":"low"}}`, "anthropic", "verbosity", "verbosity"},
	} {
		status, hdr, body := d.call("POST", tc.path, d.token, tc.body)
		if status != 200 {
			t.Fatalf("%s to %s: status %d %s", tc.path, tc.provider, status, body)
		}
		want := map[string]string{"openai": `"low"`, "openai-responses": `"high"`, "anthropic": ""}[tc.provider]
		if got := jsonAt(t, fakes[tc.provider].body(), tc.member); got != want {
			t.Errorf("%s to %s: upstream %s = %s, want %s", tc.path, tc.provider, tc.member, got, want)
		}
		if got := hdr.Values("Brama-Dropped"); strings.Join(got, ",") != tc.dropped || (got == nil) != (tc.dropped == "") {
			t.Errorf("%s to %s: Brama-Dropped = %q, want %q (absent when nothing is dropped)", tc.path, tc.provider, got, tc.dropped)
		}
	}
}

// TestTranslationNamesUnknownMembersOfGroupedTools: an unknown member of a
// tool inside a namespace group, or in the Codex CLI's additional_tools
// item, is named as a top-level tool's is (SPEC §7.6).
func TestTranslationNamesUnknownMembersOfGroupedTools(t *testing.T) {
	env := stateEnv(t)
	f := newTranslationFake(t, func(string) string { return messagesToolAnswer })
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f.fakeProvider}), "-local-credentials-stdin")
	status, hdr, body := d.call("POST", "/v1/responses", d.token, `{"model":"anthropic/claude-test","max_output_tokens":100,
		"tools":[{"type":"namespace","name":"mcp__a","tools":[{"type":"function","name":"f","defer_loading":true}]}],
		"input":[{"type":"additional_tools","role":"developer","tools":[{"type":"function","name":"g","defer_loading":true},
			{"type":"namespace","name":"ns","tools":[{"type":"function","name":"h","defer_loading":true}]}]},
			{"type":"message","role":"user","content":"q"}]}`)
	if status != 200 {
		t.Fatalf("status %d %s", status, body)
	}
	if got, want := hdr.Get("Brama-Dropped"), "defer_loading"; got != want {
		t.Errorf("Brama-Dropped = %q, want %q", got, want)
	}
}

// TestTranslationKeepsAConversationWithAnEarlierRefusal: an assistant item
// holding only a refusal part (an OpenAI model refused earlier) is dropped
// and named, the turn with it; the request is served, not refused 400 as a
// turn without content would be (SPEC §7.6: refused only what Brama cannot read).
func TestTranslationKeepsAConversationWithAnEarlierRefusal(t *testing.T) {
	env := stateEnv(t)
	f := newTranslationFake(t, func(string) string { return messagesToolAnswer })
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"anthropic": f.fakeProvider}), "-local-credentials-stdin")
	status, hdr, body := d.call("POST", "/v1/responses", d.token, `{"model":"anthropic/claude-test","max_output_tokens":100,"input":[
		{"type":"message","role":"user","content":"q"},
		{"type":"message","role":"assistant","content":[{"type":"refusal","refusal":"I can't help with that."}]},
		{"type":"message","role":"user","content":"then something else"}]}`)
	if status != 200 {
		t.Fatalf("status %d %s, want 200", status, body)
	}
	if got, want := hdr.Get("Brama-Dropped"), "refusal"; got != want {
		t.Errorf("Brama-Dropped = %q, want %q", got, want)
	}
	if got := jsonAt(t, f.body(), "messages[1].role"); got == `"assistant"` {
		t.Errorf("an assistant turn without content reached the provider: %s", f.body())
	}
}

// TestTranslationTowardCodexNamesTheOutputLimit: codex never gets an output
// limit (SPEC §6.2), so the caller's own is dropped, and named under the
// caller's name for it (§7.6: nothing is dropped silently).
func TestTranslationTowardCodexNamesTheOutputLimit(t *testing.T) {
	d, prov, tok := codexLikeDaemon(t)
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":"codex/gpt-5","messages":[{"role":"user","content":"q"}],"max_tokens":50}`, "max_tokens"},
		{"/v1/chat/completions", `{"model":"codex/gpt-5","messages":[{"role":"user","content":"q"}],"max_completion_tokens":50}`, "max_completion_tokens"},
		{"/v1/messages", `{"model":"codex/gpt-5","max_tokens":50,"messages":[{"role":"user","content":"q"}]}`, "max_tokens"},
		{"/v1/chat/completions", `{"model":"codex/gpt-5","messages":[{"role":"user","content":"q"}]}`, ""},
	} {
		status, hdr, body := d.call("POST", tc.path, tok, tc.body)
		if status != 200 {
			t.Fatalf("%s: status %d %s", tc.body, status, body)
		}
		if got := hdr.Get("Brama-Dropped"); got != tc.want {
			t.Errorf("%s: Brama-Dropped = %q, want %q (provider got %s)", tc.body, got, tc.want, prov.last(t).body)
		}
	}
}

// TestTranslationRefusesAStoredConversation: previous_response_id,
// conversation and prompt name what only the provider that stored them holds; across
// formats they are refused before any call, as item_reference is, and kept
// untouched on the passthrough path (SPEC §7.6).
func TestTranslationRefusesAStoredConversation(t *testing.T) {
	d, fakes := translationDaemon(t)
	for _, tc := range []struct {
		model, member string
		status        int
	}{
		{"anthropic/claude-test", `"previous_response_id":"resp_1"`, 400},
		{"openai/gpt-test", `"conversation":{"id":"conv_1"}`, 400},
		{"openai/gpt-test", `"prompt":{"id":"pmpt_1","version":"2"}`, 400},
		{"anthropic/claude-test", `"prompt":{"id":"pmpt_1"}`, 400},
		{"anthropic/claude-test", `"previous_response_id":null`, 200},
		{"openai-responses/gpt-test", `"prompt":{"id":"pmpt_1"}`, 200},
		{"openai-responses/gpt-test", `"previous_response_id":"resp_1"`, 200},
	} {
		f := fakes[strings.SplitN(tc.model, "/", 2)[0]]
		before := f.calls.Load()
		status, _, body := d.call("POST", "/v1/responses", d.token, `{"model":"`+tc.model+`","max_output_tokens":9,"input":"q",`+tc.member+`}`)
		calls := f.calls.Load() - before
		if status != tc.status {
			t.Fatalf("%s with %s: %d %s, want %d", tc.model, tc.member, status, body, tc.status)
		}
		name, _, _ := strings.Cut(tc.member[1:], `"`)
		if tc.status == 400 && (envelopeOf(t, body)["code"] != "invalid_request" || calls != 0 || !strings.Contains(envelopeOf(t, body)["message"].(string), name)) {
			t.Errorf("%s with %s: %s after %d calls, want invalid_request before any call", tc.model, tc.member, body, calls)
		}
		if tc.status == 200 && tc.model == "openai-responses/gpt-test" && !strings.Contains(string(f.body()), tc.member) {
			t.Errorf("passthrough lost %s: provider saw %s", tc.member, f.body())
		}
	}
}

// TestTranslationDropsAReferenceToAnEarlierAnswer: the Vercel AI SDK's
// Responses provider (store: true, its default) sends an earlier step's text
// back as an item_reference to its msg_ id; across formats the reference is
// dropped and named (only that text is lost), as a reasoning item is, so its
// tool loop goes on; a reference to anything else is refused (SPEC §7.6).
func TestTranslationDropsAReferenceToAnEarlierAnswer(t *testing.T) {
	d, fakes := translationDaemon(t)
	input := func(ref string) string {
		return `{"model":"anthropic/claude-test","max_output_tokens":9,"input":[{"role":"user","content":"weather?"},
			{"type":"item_reference","id":"` + ref + `"},
			{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{}"},
			{"type":"function_call_output","call_id":"call_1","output":"sunny"}],
			"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]}`
	}
	for _, ref := range []string{"msg_0123", "rs_0123"} {
		status, hdr, body := d.call("POST", "/v1/responses", d.token, input(ref))
		sent := string(fakes["anthropic"].body())
		if status != 200 || hdr.Get("Brama-Dropped") != "item_reference" || strings.Contains(sent, ref) || !strings.Contains(sent, `"tool_use_id":"call_1"`) {
			t.Errorf("a reference to %s: %d %s, Brama-Dropped %q; provider saw %s; want 200 with item_reference named and the call kept", ref, status, body, hdr.Get("Brama-Dropped"), sent)
		}
	}
	before := fakes["anthropic"].calls.Load()
	status, _, body := d.call("POST", "/v1/responses", d.token, input("fc_0123"))
	if status != 400 || envelopeOf(t, body)["code"] != "invalid_request" || fakes["anthropic"].calls.Load() != before {
		t.Errorf("a reference to a call: %d %s, want 400 invalid_request before any call", status, body)
	}
}
