package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// refusingProvider is an openai-chat fake that answers by the model a call
// names, "gpt-<behavior>": "ok" (also "test"), "bad" (200, not JSON), "cut" (the
// connection closed before an answer), "cutstream" (a committed stream cut
// after its first chunk), "quota" (429 insufficient_quota), or a status
// ("400", "500", …; 429 and 5xx with Retry-After: 7) with an OpenAI error body
// whose sentence quotes the presented key.
func refusingProvider(t *testing.T) *fakeProvider {
	return newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req struct {
			Model string `json:"model"`
		}
		json.Unmarshal(body, &req)
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch b := strings.TrimPrefix(req.Model, "gpt-"); b {
		case "ok", "test":
			okAnswer(w)
		case "bad":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "<html>not an answer</html>")
		case "cut":
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		case "cutstream":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}`+"\n\n")
			cutAfterFlush(w)
		case "quota":
			http.Error(w, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`, 429)
		default:
			status, err := strconv.Atoi(b)
			if err != nil {
				status = 418
			}
			if status == 429 || status >= 500 {
				w.Header().Set("Retry-After", "7")
			}
			msg := "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens (key " + key + ")."
			http.Error(w, `{"error":{"message":`+strconv.Quote(msg)+`,"type":"invalid_request_error","code":"context_length_exceeded"}}`, status)
		}
	})
}

// TestShouldRetryEveryCode: every error response of every route says
// x-should-retry equal to its body's retryable, and a retryable one with a
// known wait says Retry-After (SPEC §8.1), for every code of SPEC §8.2 the
// daemon can be made to answer over HTTP. (client_cancelled is only logged;
// secure_transport_required needs a non-loopback peer: both are covered
// below by TestWriteAPIErrorEveryCode.)
func TestShouldRetryEveryCode(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	testingOnlyNow = clock.now
	defer func() { testingOnlyNow = nil }()
	env := stateEnv(t)
	openai := refusingProvider(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = openai.URL
	kimi := newKeyedFake(t, map[string]string{"k401": "401", "k429": "429"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = kimi.URL

	d, app, reauth, blocked := refusalScene(t, env, `{"openai":"`+plantedOpenAIKey+`"}`)
	if s, _, b := d.call("POST", "/v1/chat/completions", blocked, chatBody(dialectChat, "kimi/k2", false, "")); s != 429 {
		t.Fatalf("blocking a2's subscription: %d %s", s, b)
	}
	clock.advance(20 * time.Second) // the block (Retry-After: 120) has 100 s left

	chat := func(model string) string { return chatBody(dialectChat, model, false, "") }
	tests := []struct {
		name       string
		method     string
		path       string
		token      string
		body       string
		hdr        []string
		status     int
		code       string
		retryAfter string // "" : no Retry-After
	}{
		{name: "malformed JSON", method: "POST", path: "/v1/chat/completions", token: d.token, body: "{", status: 400, code: "invalid_request"},
		{name: "wrong bearer", method: "POST", path: "/v1/chat/completions", token: "nope", body: chat("openai/gpt-ok"), status: 401, code: "unauthenticated"},
		{name: "non-admin on admin route", method: "GET", path: "/v1/admin/routes", token: app, status: 403, code: "forbidden"},
		{name: "unknown alias", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("ghost"), status: 404, code: "alias_unknown"},
		{name: "unknown path", method: "GET", path: "/nope", token: d.token, status: 404, code: "not_found"},
		{name: "wrong method", method: "GET", path: "/v1/chat/completions", token: d.token, status: 405, code: "method_not_allowed"},
		{name: "key with another body", method: "POST", path: "/v1/chat/completions", token: d.token, body: answerBody("b"), hdr: []string{"Idempotency-Key", "taken"}, status: 409, code: "state_conflict"},
		{name: "provider 429", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-429"), status: 429, code: "provider_rate_limited", retryAfter: "7"},
		{name: "subscription blocked", method: "POST", path: "/v1/chat/completions", token: blocked, body: chat("kimi/k2"), status: 429, code: "subscription_unavailable", retryAfter: "100"},
		{name: "abandoned signed answer", method: "POST", path: "/v1/chat/completions", token: d.token, body: answerBody("x"), hdr: []string{"Idempotency-Key", "abandoned"}, status: 500, code: "internal_error"},
		{name: "provider 400", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-400"), status: 400, code: "provider_rejected"},
		{name: "provider 404", method: "POST", path: "/v1/responses", token: d.token, body: chatBody(dialectResponses, "openai/gpt-404", false, ""), status: 404, code: "provider_rejected"},
		{name: "provider 413", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-413"), status: 413, code: "provider_rejected"},
		{name: "provider 422", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-422"), status: 422, code: "provider_rejected"},
		{name: "provider 418", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-418"), status: 400, code: "provider_rejected"},
		{name: "malformed answer", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-bad"), status: 502, code: "provider_failure"},
		{name: "provider 408", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-408"), status: 502, code: "provider_failure"},
		{name: "provider 409", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-409"), status: 502, code: "provider_failure"},
		{name: "direct 401", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-401"), status: 502, code: "provider_failure"},
		{name: "direct 403", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-403"), status: 502, code: "provider_failure"},
		{name: "connection cut", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-cut"), status: 502, code: "provider_incomplete"},
		{name: "quota", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-quota"), status: 502, code: "provider_quota_exhausted"},
		{name: "provider 402", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-402"), status: 502, code: "provider_quota_exhausted"},
		{name: "alias not serving", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("nokey"), status: 503, code: "alias_unserviceable"},
		{name: "no direct key", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("mistral/x"), status: 503, code: "credential_unauthorized"},
		{name: "subscription refused the credential", method: "POST", path: "/v1/messages", token: reauth, body: chatBody(dialectMessages, "kimi/k2", false, ""), status: 503, code: "subscription_reauthorization_required"},
		{name: "provider 500", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-500"), status: 503, code: "dependency_unavailable", retryAfter: "7"},
		{name: "provider 503", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-503"), status: 503, code: "dependency_unavailable", retryAfter: "7"},
		{name: "provider 504", method: "POST", path: "/v1/chat/completions", token: d.token, body: chat("openai/gpt-504"), status: 504, code: "dependency_timeout", retryAfter: "7"},
	}
	seen := map[string]bool{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := d.call(tc.method, tc.path, tc.token, tc.body, tc.hdr...)
			e := envelopeOf(t, body)
			if status != tc.status || e["code"] != tc.code {
				t.Fatalf("%d %s, want %d %s", status, body, tc.status, tc.code)
			}
			if got, want := hdr.Get("X-Should-Retry"), fmt.Sprint(e["retryable"]); got != want {
				t.Errorf("x-should-retry = %q, body's retryable = %s", got, want)
			}
			if got := hdr.Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tc.retryAfter)
			}
			if strings.Contains(string(body), plantedOpenAIKey) {
				t.Errorf("the body quotes the presented key: %s", body)
			}
			seen[tc.code] = true
		})
	}
	for code := range codes {
		if !seen[code] && code != "client_cancelled" && code != "secure_transport_required" {
			t.Errorf("code %s is in SPEC §8.2's table but no row above produces it", code)
		}
	}
	assertNoSecret(t, plantedOpenAIKey, d.stderr.String(), env["BRAMA_STATE_DIR"])
}

// TestWriteAPIErrorEveryCode: the one error writer says x-should-retry for
// every code of the table, the messages dialect's paths get the top-level
// "type":"error", and only a retryable code carries Retry-After.
func TestWriteAPIErrorEveryCode(t *testing.T) {
	for code, info := range codes {
		for _, path := range []string{"/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/admin/routes"} {
			w := httptest.NewRecorder()
			ae := refuse(code, "m")
			ae.RetryAfter = 1500 * time.Millisecond
			writeAPIError(w, httptest.NewRequest("POST", path, nil), ae)
			var body struct {
				Type  *string `json:"type"`
				Error struct {
					Retryable bool `json:"retryable"`
				} `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("%s on %s: %v", code, path, err)
			}
			if got := w.Header().Get("X-Should-Retry"); got != fmt.Sprint(body.Error.Retryable) || body.Error.Retryable != info.retryable {
				t.Errorf("%s on %s: x-should-retry %q, retryable %v", code, path, got, body.Error.Retryable)
			}
			wantRA := ""
			if info.retryable {
				wantRA = "2" // rounded up: never come back early
			}
			if got := w.Header().Get("Retry-After"); got != wantRA {
				t.Errorf("%s on %s: Retry-After %q, want %q", code, path, got, wantRA)
			}
			messages := strings.HasPrefix(path, "/v1/messages")
			if (body.Type != nil) != messages || (messages && *body.Type != "error") {
				t.Errorf("%s on %s: top-level type %v", code, path, body.Type)
			}
		}
	}
}

// TestWriteJSONUnencodable: a value encoding/json refuses (a NaN) is answered whole as the internal_error envelope
// writeAPIError would write (SPEC §8.2), never as the status asked for with a cut body.
func TestWriteJSONUnencodable(t *testing.T) {
	w := httptest.NewRecorder()
	writeJSON(w, 200, map[string]float64{"used_fraction": math.NaN()})
	var want bytes.Buffer
	encodeJSON(&want, envelope{Error: *refuse("internal_error", "internal error")})
	if w.Code != 500 || w.Header().Get("Content-Type") != "application/json" || w.Body.String() != want.String() {
		t.Errorf("%d %q %s, want 500 application/json %s", w.Code, w.Header().Get("Content-Type"), w.Body, want.String())
	}
}

// TestProviderRejected: the provider refused the request itself; Brama
// answers its 4xx (so clients that retry a 5xx do not), once, quoting its
// sentence with the presented key redacted (SPEC §8.2).
func TestProviderRejected(t *testing.T) {
	env := stateEnv(t)
	fake := refusingProvider(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"`+plantedOpenAIKey+`"}`, "-local-credentials-stdin")
	for _, tc := range []struct {
		provider, want int
	}{{400, 400}, {404, 404}, {413, 413}, {422, 422}, {418, 400}, {410, 400}} {
		t.Run(fmt.Sprint(tc.provider), func(t *testing.T) {
			before := fake.calls.Load()
			status, hdr, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, fmt.Sprintf("openai/gpt-%d", tc.provider), false, ""))
			e := envelopeOf(t, body)
			if status != tc.want || e["code"] != "provider_rejected" || e["type"] != "request_error" || e["retryable"] != false || e["attempts"] != 1.0 || hdr.Get("Brama-Attempts") != "1" {
				t.Errorf("provider %d: %d %s, want %d provider_rejected, attempts 1", tc.provider, status, body, tc.want)
			}
			msg, _ := e["message"].(string)
			if !strings.Contains(msg, "maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens (key [redacted])") {
				t.Errorf("the provider's sentence is not quoted, redacted: %q", msg)
			}
			if n := fake.calls.Load() - before; n != 1 {
				t.Errorf("provider calls = %d, want 1", n)
			}
		})
	}
	assertNoSecret(t, plantedOpenAIKey, d.stderr.String(), env["BRAMA_STATE_DIR"])
}

// TestShortKeyKeepsQuotaClass: with a direct key "a", a provider 429
// insufficient_quota stays provider_quota_exhausted (issue 10 item 4).
func TestShortKeyKeepsQuotaClass(t *testing.T) {
	env := stateEnv(t)
	fake := refusingProvider(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"a"}`, "-local-credentials-stdin")
	status, hdr, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-quota", false, ""))
	if e := envelopeOf(t, body); status != 502 || e["code"] != "provider_quota_exhausted" || e["retryable"] != false || hdr.Get("X-Should-Retry") != "false" {
		t.Errorf("key %q, provider 429 insufficient_quota: %d %s x-should-retry %q", "a", status, body, hdr.Get("X-Should-Retry"))
	}
}

// TestSelectorEndsRejected: a selector whose candidates all refused the
// request itself ends in provider_rejected with the last refusal's status
// (SPEC §7.2.5 e); a rate refusal among them takes precedence (b).
func TestSelectorEndsRejected(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"groq-1": "400", "kimi-1": "404"})
	env["BRAMA_PROVIDER_GROQ_BASE_URL"] = fake.URL
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	for _, put := range []string{`{"alias":"g1","route":"groq/gq-a"}`, `{"alias":"k1","route":"kimi/km-a"}`} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
			t.Fatalf("PUT %s: %d %s", put, s, b)
		}
	}
	tok, _ := agentWithSubs(t, d, "a1", "groq", "groq-1")
	donate(t, d, "a1", "kimi", "kimi-1")

	status, hdr, body := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, ""))
	e := envelopeOf(t, body)
	if status != 404 || e["code"] != "provider_rejected" || e["attempts"] != 2.0 || hdr.Get("X-Should-Retry") != "false" {
		t.Errorf("groq 400 then kimi 404: %d %s, want 404 provider_rejected, attempts 2", status, body)
	}
	if msg, _ := e["message"].(string); !strings.Contains(msg, "groq/gq-a: refused the request") || !strings.Contains(msg, "kimi/km-a: refused the request") {
		t.Errorf("the message does not list each candidate: %q", msg)
	}

	fake.set("kimi-1", "429")
	status, hdr, body = d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, `,"temperature":0.5`))
	if e := envelopeOf(t, body); status != 429 || e["code"] != "provider_rate_limited" || hdr.Get("Retry-After") != "120" {
		t.Errorf("groq 400 then kimi 429: %d %s Retry-After %q, want 429 provider_rate_limited, 120", status, body, hdr.Get("Retry-After"))
	}
}

// TestMessagesErrorType: on the messages dialect's paths every buffered
// error body carries a top-level "type":"error" beside "error"; on the
// other dialects it does not (SPEC §8.1).
func TestMessagesErrorType(t *testing.T) {
	env := stateEnv(t)
	fake := refusingProvider(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	for _, tc := range []struct {
		name, path, token, body string
		messages                bool
	}{
		{"malformed", "/v1/messages", d.token, "{", true},
		{"unauthenticated", "/v1/messages", "nope", chatBody(dialectMessages, "openai/gpt-ok", false, ""), true},
		{"provider 400", "/v1/messages", d.token, chatBody(dialectMessages, "openai/gpt-400", false, ""), true},
		{"provider 500", "/v1/messages", d.token, chatBody(dialectMessages, "openai/gpt-500", false, ""), true},
		{"count_tokens", "/v1/messages/count_tokens", d.token, "{", true},
		{"chat provider 400", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-400", false, ""), false},
		{"responses malformed", "/v1/responses", d.token, "{", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, body := d.call("POST", tc.path, tc.token, tc.body)
			envelopeOf(t, body)
			var top map[string]json.RawMessage
			json.Unmarshal(body, &top)
			if got := string(top["type"]); (got == `"error"`) != tc.messages || (!tc.messages && got != "") {
				t.Errorf("top-level type = %s on %s: %s", got, tc.path, body)
			}
		})
	}
}

// TestInBandErrorRedactsPresentedKey: a provider stream that echoes the
// presented key in an in-band error's code reaches the caller redacted, in
// all three dialects, for every direct provider (issue 10 item 3). The
// messages dialect's in-band error carries its top-level "type":"error".
func TestInBandErrorRedactsPresentedKey(t *testing.T) {
	env := stateEnv(t)
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		key := r.Header.Get("X-Api-Key")
		if key == "" {
			key = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		w.Header().Set("Content-Type", "text/event-stream")
		switch {
		case strings.HasSuffix(r.URL.Path, "/messages"):
			fmt.Fprintf(w, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"key_%s\",\"message\":\"bad key %s\"}}\n\n", key, key)
		case strings.HasSuffix(r.URL.Path, "/responses"):
			fmt.Fprintf(w, "event: error\ndata: {\"type\":\"error\",\"code\":\"key_%s\",\"message\":\"bad key %s\"}\n\n", key, key)
		default:
			fmt.Fprintf(w, "data: {\"error\":{\"code\":\"key_%s\",\"message\":\"bad key %s\"}}\n\n", key, key)
		}
	})
	creds := map[string]string{}
	for _, p := range providerTable {
		if p.cred == credDirect {
			creds[p.id] = "gsk_planted_" + strings.ReplaceAll(p.id, "-", "_") + "_0123456789"
			env["BRAMA_PROVIDER_"+strings.ToUpper(strings.ReplaceAll(p.id, "-", "_"))+"_BASE_URL"] = fake.URL
		}
	}
	stdin, _ := json.Marshal(creds)
	d := startDaemon(t, env, string(stdin), "-local-credentials-stdin")
	for id, key := range creds {
		for _, dialect := range []string{dialectChat, dialectMessages, dialectResponses} {
			t.Run(id+"/"+dialect, func(t *testing.T) {
				resp := d.openStream(dialectPaths[dialect], d.token, chatBody(dialect, id+"/m", true, ""))
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				s := string(b)
				if resp.StatusCode != 200 || !strings.Contains(s, "provider_incomplete") || !strings.Contains(s, "key_[redacted]") {
					t.Errorf("%d %q: want the in-band provider_incomplete quoting key_[redacted]", resp.StatusCode, s)
				}
				if strings.Contains(s, key) {
					t.Errorf("the in-band error quotes the presented key: %q", s)
				}
				if dialect == dialectMessages && !strings.Contains(s, `data: {"type":"error","error":{`) {
					t.Errorf("the messages in-band error lacks its top-level type: %q", s)
				}
			})
		}
	}
	logs := d.stderr.String()
	for _, key := range creds {
		assertNoSecret(t, key, logs, env["BRAMA_STATE_DIR"])
	}
}

// refusalScene starts a daemon with direct keys creds (JSON) on env in which
// every refusal of SPEC §8.2 can be asked for: a signed answer abandoned by
// a stopped process (key "abandoned"), a signed answer kept (key "taken"),
// an alias whose provider has no key ("nokey"), a caller client (app), and
// agents whose kimi subscription answers 401 (reauth) and 429 (blocked).
func refusalScene(t *testing.T, env map[string]string, creds string) (d *daemon, app, reauth, blocked string) {
	t.Helper()
	old := newAnswerStore(resolveState(testEnv(env)), slog.New(slog.DiscardHandler), time.Now)
	if _, err := old.reserve(signedOf("abandoned", answerBody("x"), "openai/gpt-test")); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, env, creds, "-local-credentials-stdin")
	if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"nokey","route":"anthropic/claude-x"}`); s != 200 {
		t.Fatalf("PUT alias: %d %s", s, b)
	}
	app = addClient(t, env, "app")
	reauth, _ = agentWithSubs(t, d, "a1", "kimi", "k401")
	blocked, _ = agentWithSubs(t, d, "a2", "kimi", "k429")
	if r := postAnswer(d, "taken", answerBody("a")); r.status != 200 {
		t.Fatalf("first signed answer: %d %s", r.status, r.body)
	}
	return d, app, reauth, blocked
}

// TestRedactionSurvivesChangedWhitespace: a provider that quotes the
// presented key with its whitespace changed (doubled, a tab, a newline
// inside) reaches the caller, the log and the ledger as [redacted]
// (SPEC §17), on a direct route and a subscription route.
func TestRedactionSurvivesChangedWhitespace(t *testing.T) {
	const tail = "SeCrEtTaIl"
	for _, tc := range []struct {
		name, key string
		alter     func(string) string
	}{
		{"inner space doubled and a tab", "plain key 0123 " + tail, func(k string) string {
			return strings.Replace(strings.Replace(k, " ", "  ", 1), " ", "\t", -1)
		}},
		{"a newline inside", "plain-key-0123-" + tail, func(k string) string { return k[:8] + "\n" + k[8:] }},
		{"spaces removed", "plain key 0123 " + tail, func(k string) string { return strings.ReplaceAll(k, " ", "") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if r.Method == http.MethodGet { // a maintenance pass's usage read
					http.Error(w, `{"error":"none"}`, 404)
					return
				}
				quoted := tc.alter(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
				status := 401
				if strings.Contains(string(body), "openai/") || strings.Contains(string(body), `"gpt-`) {
					status = 400
				}
				http.Error(w, `{"error":{"message":`+strconv.Quote("Incorrect API key provided: "+quoted+".")+`,"type":"invalid_request_error"}}`, status)
			})
			env := stateEnv(t)
			env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
			env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
			d := startDaemon(t, env, fmt.Sprintf(`{"openai":%q}`, tc.key), "-local-credentials-stdin")
			token, ids := agentWithSubs(t, d, "a1", "kimi", tc.key)
			for _, call := range []struct{ token, body, code string }{
				{d.token, chatBody(dialectChat, "openai/gpt-test", false, ""), "provider_rejected"},
				{token, `{"model":"kimi/km-a","messages":[{"role":"user","content":"hi"}]}`, "subscription_reauthorization_required"},
			} {
				_, _, got := d.call("POST", "/v1/chat/completions", call.token, call.body)
				if e := envelopeOf(t, got); e["code"] != call.code || !strings.Contains(e["message"].(string), "Incorrect API key provided: [redacted].") {
					t.Errorf("%s, want %s quoting the key as [redacted]", got, call.code)
				}
				assertNoSecret(t, tail, string(got))
			}
			if st := credentialStateOf(t, d, "a1", ids[0]); st != "needs_reauthorization" {
				t.Errorf("credential state %q, want needs_reauthorization", st)
			}
			ledger, _ := os.ReadFile(filepath.Join(env["BRAMA_STATE_DIR"], ledgerFile))
			if !bytes.Contains(ledger, []byte("Incorrect API key provided: [redacted].")) {
				t.Errorf("the ledger's cause does not quote the key as [redacted]:\n%s", ledger)
			}
			assertNoSecret(t, tail, logsBesidesFirstStart(d.stderr.String()), env["BRAMA_STATE_DIR"])
		})
	}
}
