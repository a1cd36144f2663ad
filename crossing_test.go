package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Tests of what crosses Brama besides the body: transport, headers each way.

// A trusted proxy sets one forwarded header and passes the other on as the
// client wrote it, so a client on plain HTTP that forges the other one must
// still get 426: every header naming a proto must say https (SPEC §3.3).
func TestTrustedProxyForgedProto(t *testing.T) {
	ip := nonLoopbackIP()
	if ip == "" {
		t.Skip("no non-loopback interface: TestTransportGuard covers the rule without HTTP")
	}
	env := stateEnv(t)
	env["BRAMA_TRUSTED_PROXY_IPS"] = ip
	d := startDaemon(t, env, "", "-addr", net.JoinHostPort(ip, "0"))
	tests := []struct {
		name string
		hdr  []string
		want int
	}{
		{"the proxy's http beside a forged Forwarded https", []string{"X-Forwarded-Proto", "http", "Forwarded", "proto=https"}, 426},
		{"the proxy's Forwarded http beside a forged https", []string{"X-Forwarded-Proto", "https", "Forwarded", "for=192.0.2.9;proto=http"}, 426},
		{"no forwarded header", nil, 426},
		{"https", []string{"X-Forwarded-Proto", "https"}, 200},
		{"both https", []string{"X-Forwarded-Proto", "https", "Forwarded", `for=192.0.2.9;proto="https"`}, 200},
		{"Forwarded https, its element naming no proto", []string{"Forwarded", "proto=https, for=192.0.2.9"}, 426},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := d.call("GET", "/v1/aliases", d.token, "", tc.hdr...)
			if status != tc.want {
				t.Fatalf("status %d, want %d: %s", status, tc.want, body)
			}
			if tc.want == 426 {
				if e := envelopeOf(t, body); e["code"] != "secure_transport_required" {
					t.Errorf("refusal %v, want secure_transport_required", e)
				}
			}
		})
	}
}

// The fields a caller's Connection header names are hop-by-hop (RFC 9110
// §7.6.1), like Connection itself, TE, Upgrade, Keep-Alive and Proxy-*:
// none reaches the provider, not even a format option (SPEC §7.6).
func TestHopByHopHeadersStayWithTheCaller(t *testing.T) {
	fx := protocolFixtures[1]
	env := stateEnv(t)
	prov := newRecordingProvider(t, fx.buffered, "")
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = prov.URL
	d := startDaemon(t, env, fmt.Sprintf(`{%q:%q}`, fx.provider, fx.key), "-local-credentials-stdin")
	const proxySecret = "cHJveHktc2VjcmV0LXBsYW50ZWQ="
	status, _, body := d.call("POST", "/v1/messages", d.token, `{"model":"anthropic/claude-test","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		"Connection", "anthropic-beta, X-Hop", "anthropic-beta", "hop-only-beta", "X-Hop", "1",
		"TE", "trailers", "Upgrade", "h2c", "Keep-Alive", "timeout=5", "Proxy-Authorization", "Basic "+proxySecret)
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	got := prov.last(t).header
	for _, name := range []string{"Anthropic-Beta", "X-Hop", "Connection", "Te", "Upgrade", "Keep-Alive", "Proxy-Authorization"} {
		if v := got.Values(name); len(v) > 0 {
			t.Errorf("the provider got the caller's hop-by-hop %s: %q", name, v)
		}
	}
	if got.Get("anthropic-version") != "2023-06-01" {
		t.Errorf("anthropic-version %q, want Brama's default", got.Get("anthropic-version"))
	}
	assertNoSecret(t, proxySecret, d.stderr.String(), env["BRAMA_STATE_DIR"])
}

// A member name may hold any character JSON can, control characters too; a
// translated answer names it in Brama-Dropped (SPEC §7.6), escaped as JSON
// writes it, so the header stays one the caller's HTTP client can read.
func TestDroppedNamesWithControlCharacters(t *testing.T) {
	fx := protocolFixtures[1]
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, fx.buffered)
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL
	d := startDaemon(t, env, fmt.Sprintf(`{%q:%q}`, fx.provider, fx.key), "-local-credentials-stdin")
	body := `{"model":"anthropic/claude-test","max_tokens":5,"logit_bias":{"1":1},"x\u0000y\u00e9\r\nInjected: 1":1,"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequest("POST", d.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the caller could not read the answer: %v", err)
	}
	resp.Body.Close()
	want := `logit_bias, x\u0000yé\u000d\u000aInjected: 1`
	if resp.StatusCode != 200 || resp.Header.Get("Brama-Dropped") != want || resp.Header.Get("Injected") != "" {
		t.Errorf("%d Brama-Dropped %q (Injected %q), want 200 %q", resp.StatusCode, resp.Header.Get("Brama-Dropped"), resp.Header.Get("Injected"), want)
	}
}

// Whatever forwarded headers a client sends, a trusted proxy that appends
// its own http to either one leaves the request refused (SPEC §3.3).
func FuzzTransportGuard(f *testing.F) {
	f.Add("https", "proto=https", false)
	f.Add("https, https", `for="[2001:db8::1]:80";proto="https"`, true)
	f.Add("", "proto=https,", false)
	g, err := newTransportGuard("192.0.2.7")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, xfp, fwd string, proxySetsForwarded bool) {
		r, _ := http.NewRequest("GET", "http://brama/health", nil)
		r.RemoteAddr = "192.0.2.7:5000"
		r.Header.Add("X-Forwarded-Proto", xfp)
		r.Header.Add("Forwarded", fwd)
		if proxySetsForwarded {
			r.Header.Add("Forwarded", "for=192.0.2.9;proto=http")
		} else {
			r.Header.Add("X-Forwarded-Proto", "http")
		}
		if g.allows(r) {
			t.Fatalf("plain HTTP accepted: X-Forwarded-Proto %q, Forwarded %q", r.Header.Values("X-Forwarded-Proto"), r.Header.Values("Forwarded"))
		}
	})
}

// A direct key holding a control character (a key file read whole, its
// newline kept) cannot go in a header: net/http refuses before sending.
// That is no call and no credential to present: 503 credential_unauthorized
// with attempts 0 (SPEC §7.1, §8.1), not a provider_incomplete call that
// may have been billed. TestSubscriptionCredentialThatCannotBeSent covers pools.
func TestCredentialWithAControlCharacter(t *testing.T) {
	const chat = `{"model":"openai/gpt-test","messages":[{"role":"user","content":"hi"}]}`
	for _, secret := range []string{"sk-planted-key-0123456789\n", "sk-planted\x00key-0123456789"} {
		t.Run(fmt.Sprintf("%q", secret), func(t *testing.T) {
			fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {})
			// -local-credentials-stdin and credentials set refuse such a key: a vault edited by hand holds it
			env := stateEnv(t)
			env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
			vault, _ := json.Marshal(map[string]any{"schema_version": 1, "direct": map[string]any{"openai": map[string]string{"api_key": secret}}, "subscriptions": map[string]any{}})
			os.MkdirAll(env["BRAMA_STATE_DIR"], 0o700)
			if err := os.WriteFile(filepath.Join(env["BRAMA_STATE_DIR"], "vault.json"), vault, 0o600); err != nil {
				t.Fatal(err)
			}
			d := startDaemon(t, env, "")
			status, h, got := d.call("POST", "/v1/chat/completions", d.token, chat)
			e := envelopeOf(t, got)
			if status != 503 || e["code"] != "credential_unauthorized" || e["attempts"] != 0.0 || h.Get("Brama-Attempts") != "0" || fake.calls.Load() != 0 {
				t.Errorf("%d %s (Brama-Attempts %q, %d provider calls), want 503 credential_unauthorized, attempts 0, no call", status, got, h.Get("Brama-Attempts"), fake.calls.Load())
			}
			assertNoSecret(t, "key-0123456789", logsBesidesFirstStart(d.stderr.String())+string(got), d.env["BRAMA_STATE_DIR"])
		})
	}
	t.Run("a tab in a caller's format header", func(t *testing.T) { // a header value may hold one
		fx := protocolFixtures[1]
		prov := newRecordingProvider(t, fx.buffered, "")
		env := stateEnv(t)
		env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = prov.URL
		d := startDaemon(t, env, fmt.Sprintf(`{%q:%q}`, fx.provider, fx.key), "-local-credentials-stdin")
		status, _, got := d.call("POST", "/v1/messages", d.token, `{"model":"anthropic/claude-test","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "anthropic-beta", "beta-a\tb")
		if status != 200 || prov.last(t).header.Get("anthropic-beta") != "beta-a\tb" {
			t.Errorf("%d %s, want 200 with the caller's anthropic-beta passed", status, got)
		}
	})
}

// The log line's route is the route that answered (SPEC §13, §7.6's
// Brama-Route): for a selector, the candidate that served and billed.
func TestLogLineNamesTheRouteThatAnswered(t *testing.T) {
	d, env, _, tok := oneCandidateDaemon(t, "groq", "groq/gq-a")
	status, hdr, body := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, ""))
	if status != 200 || hdr.Get("Brama-Route") != "groq/gq-a" {
		t.Fatalf("any: %d %s (Brama-Route %q), want 200 from groq/gq-a", status, body, hdr.Get("Brama-Route"))
	}
	id := hdr.Get("X-Request-Id")
	d.stderr.waitFor(t, `"request_id":"`+id+`","method"`)
	for _, l := range strings.Split(d.stderr.String(), "\n") {
		if strings.Contains(l, `"msg":"request","request_id":"`+id+`"`) && !strings.Contains(l, `"route":"groq/gq-a"`) {
			t.Errorf("the log line does not name the route that answered:\n%s", l)
		}
	}
	assertNoSecret(t, "groq-1", logsBesidesFirstStart(d.stderr.String()), env["BRAMA_STATE_DIR"])
}

// TestDroppedHeaderStaysReadable: a long conversation drops hundreds of
// members (cache_control on every block, thinking blocks); Brama-Dropped
// and the log line name each member once, so the header stays a few bytes
// and a client with a 16 KiB header limit (Node's) reads the answer it
// paid for (SPEC §7.6).
func TestDroppedHeaderStaysReadable(t *testing.T) {
	d, fakes := translationDaemon(t)
	var turns []string
	for range 300 {
		turns = append(turns, `{"role":"user","content":[{"type":"text","text":"q","cache_control":{"type":"ephemeral"}}]}`,
			`{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}]}`)
	}
	body := `{"model":"openai/gpt-test","max_tokens":5,"x_unknown":1,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[` +
		strings.Join(turns, ",") + `,{"role":"user","content":"hi"}]}`
	status, hdr, got := d.call("POST", "/v1/messages", d.token, body)
	want := "x_unknown, cache_control, thinking"
	if status != 200 || hdr.Get("Brama-Dropped") != want {
		t.Fatalf("%d, Brama-Dropped %q, want 200 %q; %s", status, hdr.Get("Brama-Dropped"), want, got)
	}
	if n := strings.Count(string(fakes["openai"].body()), `"content":"q"`); n != 300 {
		t.Errorf("the provider got %d of the 300 user turns", n)
	}
	if !strings.Contains(d.stderr.String(), `"dropped":"`+want+`"`) {
		t.Errorf("the log line does not name each dropped member once:\n%s", d.stderr.String())
	}
}

// TestEveryAnswerIsNoStore: an answer is one caller's (a kept signed answer
// under GET, a completion, a refusal, a stream); a shared cache in front of
// Brama that does not take x-api-key for a credential must keep none.
func TestEveryAnswerIsNoStore(t *testing.T) {
	fake := fixtureProvider(t, protocolFixtures[0])
	env := stateEnv(t)
	env["BRAMA_MODEL_CATALOG_URL"], env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = "off", fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	for _, tc := range []struct{ method, path, token, body string }{
		{"POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", false, "")},
		{"POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", true, "")},
		{"GET", "/v1/models", d.token, ""},
		{"GET", "/v1/admin/routes", d.token, ""},
		{"GET", "/v1/models", "wrong", ""},
		{"GET", "/readyz", "", ""},
	} {
		status, hdr, _ := d.call(tc.method, tc.path, tc.token, tc.body)
		if got := hdr.Get("Cache-Control"); got != "no-store" {
			t.Errorf("%s %s (%d): Cache-Control %q, want no-store", tc.method, tc.path, status, got)
		}
	}
}

// TestCompressedBodyIsRefusedClearly: Brama reads request bodies as sent; a
// compressed one gets a refusal that names Content-Encoding, not a JSON
// parse error at byte 0, before any call (SPEC §8: a clear error).
func TestCompressedBodyIsRefusedClearly(t *testing.T) {
	fake := fixtureProvider(t, protocolFixtures[0])
	d := startDaemon(t, map[string]string{"BRAMA_MODEL_CATALOG_URL": "off", "BRAMA_PROVIDER_OPENAI_BASE_URL": fake.URL}, `{"openai":"k"}`, "-local-credentials-stdin")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, chatBody(dialectChat, "openai/gpt-test", false, ""))
	zw.Close()
	for _, hdr := range [][]string{{"Content-Encoding", "gzip"}, {"Content-Encoding", "identity", "Content-Encoding", "gzip"}} {
		status, _, body := d.call("POST", "/v1/chat/completions", d.token, gz.String(), hdr...)
		if e := envelopeOf(t, body); status != 400 || e["code"] != "invalid_request" || !strings.Contains(e["message"].(string), "Content-Encoding") || fake.calls.Load() != 0 {
			t.Errorf("a gzip body with %q: %d %s after %d calls, want 400 naming Content-Encoding before any call", hdr, status, body, fake.calls.Load())
		}
	}
	if status, _, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", false, ""), "Content-Encoding", "identity"); status != 200 {
		t.Errorf("Content-Encoding: identity: %d %s, want 200", status, body)
	}
	// A compressed body over the limit is refused for its size first, as any body over it is.
	small := startDaemon(t, map[string]string{"BRAMA_MODEL_CATALOG_URL": "off", "BRAMA_MAX_REQUEST_BYTES": "64"}, "")
	if status, _, body := small.call("POST", "/v1/chat/completions", small.token, gz.String(), "Content-Encoding", "gzip"); status != 413 {
		t.Errorf("a gzip body over BRAMA_MAX_REQUEST_BYTES: %d %s, want 413", status, body)
	}
}

// A pool credential no header could carry is never sent (SPEC §17): a
// refreshed access token holding a control character is a malformed token
// answer, a transport failure that stores nothing and changes no state; one
// a hand-edited vault holds is skipped like a blocked one (no call, no
// attempt), marked needs_reauthorization, and the next subscription serves.
func TestSubscriptionCredentialThatCannotBeSent(t *testing.T) {
	mustRead := func(t *testing.T, name string) []byte {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	const messages = `{"model":"claude-code/claude-test","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	t.Run("refreshed access token with its newline", func(t *testing.T) {
		fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {})
		tokens := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"access_token": "oat-planted-key-0123456789\n", "refresh_token": "ort-planted-2", "expires_in": 3600})
		})
		d, token := oauthSetup(t, fake, tokens)
		id := donateGrant(t, d, "oat-first-0123456789", "ort-planted", time.Now().Add(-time.Hour).UnixMilli())
		status, h, got := d.call("POST", "/v1/messages", token, messages)
		e := envelopeOf(t, got)
		if status != 503 || e["code"] != "dependency_unavailable" || e["attempts"] != 0.0 || h.Get("Brama-Attempts") != "0" || fake.calls.Load() != 0 ||
			!strings.Contains(e["message"].(string), "control character") {
			t.Errorf("%d %s (%d provider calls), want 503 dependency_unavailable naming the malformed token answer, attempts 0, no call", status, got, fake.calls.Load())
		}
		if st := credentialStateOf(t, d, "a1", id); st != "active" {
			t.Errorf("credential state %q, want active (a transport failure changes nothing)", st)
		}
		doc, err := newVault("", nil).parse(mustRead(t, filepath.Join(d.env["BRAMA_STATE_DIR"], "vault.json")))
		if g := doc.Subscriptions[id].OAuth; err != nil || g == nil || g.AccessToken != "oat-first-0123456789" || g.RefreshToken != "ort-planted" {
			t.Errorf("the vault's grant changed: %v %+v", err, g)
		}
		assertNoSecret(t, "key-0123456789", logsBesidesFirstStart(d.stderr.String())+string(got), d.env["BRAMA_STATE_DIR"])
	})
	for _, tc := range []struct {
		name string
		edit func(c *vaultCredential)
	}{
		{"vault api key with its newline", func(c *vaultCredential) { *c = vaultCredential{APIKey: "kimi-planted-key-0123456789\n"} }},
		{"vault access token with a NUL", func(c *vaultCredential) {
			*c = vaultCredential{OAuth: &oauthGrant{AccessToken: "oat-planted\x00key-0123456789", RefreshToken: "ort-1", ExpiresAtMs: time.Now().Add(time.Hour).UnixMilli()}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newKeyedFake(t, map[string]string{"kimi-good": "200"})
			env := stateEnv(t)
			env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
			d := startDaemon(t, env, "")
			token, ids := agentWithSubs(t, d, "a1", "kimi", "kimi-bad", "kimi-good")
			vaultPath := filepath.Join(env["BRAMA_STATE_DIR"], "vault.json")
			doc, err := newVault("", nil).parse(mustRead(t, vaultPath))
			if err != nil {
				t.Fatal(err)
			}
			c := doc.Subscriptions[ids[0]]
			tc.edit(&c)
			doc.Subscriptions[ids[0]] = c
			if err := writeState(vaultPath, doc); err != nil {
				t.Fatal(err)
			}
			status, h, got := d.call("POST", "/v1/chat/completions", token, `{"model":"kimi/km-a","messages":[{"role":"user","content":"hi"}]}`)
			fake.mu.Lock()
			calls := maps.Clone(fake.calls)
			fake.mu.Unlock()
			if status != 200 || h.Get("Brama-Attempts") != "1" || len(calls) != 1 || calls["kimi-good"] != 1 {
				t.Errorf("%d %s (Brama-Attempts %q, calls %v), want 200 from the second subscription after one call", status, got, h.Get("Brama-Attempts"), calls)
			}
			if st := credentialStateOf(t, d, "a1", ids[0]); st != "needs_reauthorization" {
				t.Errorf("the unsendable credential is %q, want needs_reauthorization", st)
			}
			assertNoSecret(t, "key-0123456789", logsBesidesFirstStart(d.stderr.String())+string(got), env["BRAMA_STATE_DIR"])
		})
	}
}
