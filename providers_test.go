package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestProviderBaseURL(t *testing.T) {
	openai, _ := lookupProvider("openai")
	claudeCode, _ := lookupProvider("claude-code")
	local, _ := lookupProvider("local-openai")
	tests := []struct {
		name string
		p    providerInfo
		env  map[string]string
		want string // "" means an error
	}{
		{"built in", openai, nil, "https://api.openai.com/v1"},
		{"https override, slash trimmed", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "https://proxy.example/v1/"}, "https://proxy.example/v1"},
		{"dash becomes underscore", claudeCode, map[string]string{"BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL": "http://127.0.0.1:8089"}, "http://127.0.0.1:8089"},
		{"http loopback 127/8", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "http://127.3.4.5:9/v1"}, "http://127.3.4.5:9/v1"},
		{"http ::1", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "http://[::1]:9/v1"}, "http://[::1]:9/v1"},
		{"http localhost", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "http://localhost:9"}, "http://localhost:9"},
		{"http non-loopback refused", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "http://10.0.0.1/v1"}, ""},
		{"http name refused", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "http://localhost.evil.example/v1"}, ""},
		{"other scheme refused", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "ftp://127.0.0.1/"}, ""},
		{"user info refused", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "https://u:p@proxy.example"}, ""},
		{"query refused", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "https://proxy.example/?k=1"}, ""},
		{"no host refused", openai, map[string]string{"BRAMA_PROVIDER_OPENAI_BASE_URL": "https:///v1"}, ""},
		{"other provider's variable ignored", openai, map[string]string{"BRAMA_PROVIDER_GROQ_BASE_URL": "http://10.0.0.1"}, "https://api.openai.com/v1"},
		{"local-openai has none", local, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := providerBaseURL(tt.p, func(k string) string { return tt.env[k] })
			if tt.want == "" {
				if err == nil || got != "" {
					t.Errorf("providerBaseURL = %q, %v; want a refusal", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("providerBaseURL = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestNewProviderClient(t *testing.T) {
	var followed atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere" {
			followed.Add(1)
			return
		}
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	c := newProviderClient()
	if c.Timeout != 0 {
		t.Errorf("Timeout = %v, want none", c.Timeout)
	}
	tr, ok := c.Transport.(*http.Transport)
	if !ok {
		t.Fatalf("Transport is %T", c.Transport)
	}
	if tr.Proxy != nil || tr.ResponseHeaderTimeout != 0 || tr.TLSHandshakeTimeout != 0 || tr.MaxIdleConnsPerHost < 64 {
		t.Errorf("transport: proxy set %v, header timeout %v, TLS timeout %v, idle per host %d",
			tr.Proxy != nil, tr.ResponseHeaderTimeout, tr.TLSHandshakeTimeout, tr.MaxIdleConnsPerHost)
	}
	if tr == http.DefaultTransport {
		t.Errorf("the default transport is shared")
	}
	resp, err := c.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTemporaryRedirect || followed.Load() != 0 {
		t.Errorf("status %d, followed %d times; want the redirect returned unfollowed", resp.StatusCode, followed.Load())
	}
}

// TestProviderCallRoundTrip drives each protocol against a fake provider
// over real HTTP: the request it receives and the answer Brama reads.
func TestProviderCallRoundTrip(t *testing.T) {
	tests := []struct {
		provider string
		stream   bool
		path     string
		cred     upstreamCredential
		auth     string // header name that must carry the credential
		answer   string // fixture file (stream) or JSON body
		want     chatAnswer
	}{
		{"openai", false, "/chat/completions", upstreamCredential{APIKey: "k"}, "Authorization",
			`{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`,
			chatAnswer{Text: "hi", Finish: finishStop, Usage: usage{1, 1, true}}},
		{"anthropic", true, "/v1/messages", upstreamCredential{APIKey: "k"}, "x-api-key", "anthropic-messages.sse",
			chatAnswer{Text: "Hello", ToolCalls: []toolCall{{ID: "toolu_01", Name: "get_weather", Arguments: `{"city": "Paris"}`}, {ID: "toolu_02", Name: "get_time", Arguments: "{}"}},
				Finish: finishToolCalls, Usage: usage{40, 42, true}}},
		{"codex", false, "/responses", upstreamCredential{AccessToken: "tok", AccountID: "acct"}, "chatgpt-account-id", "codex.sse",
			chatAnswer{Text: "Checking the weather.", ToolCalls: []toolCall{{ID: "call_c", Name: "get_weather", Arguments: `{"city":"Oslo"}`}},
				Finish: finishToolCalls, Usage: usage{1200, 64, true}}},
	}
	for _, tt := range tests {
		t.Run(tt.provider, func(t *testing.T) {
			p, _ := lookupProvider(tt.provider)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != tt.path || r.Header.Get(tt.auth) == "" {
					t.Errorf("got %s %s with %s=%q", r.Method, r.URL.Path, tt.auth, r.Header.Get(tt.auth))
				}
				if strings.HasSuffix(tt.answer, ".sse") {
					w.Header().Set("Content-Type", "text/event-stream")
					b, _ := os.ReadFile(filepath.Join("testdata", "providers", tt.answer))
					w.Write(b)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, tt.answer)
			}))
			t.Cleanup(srv.Close)
			base, err := providerBaseURL(p, func(string) string { return srv.URL })
			if err != nil {
				t.Fatal(err)
			}
			req := chatRequest{Messages: []message{{Role: "user", Parts: []part{{Type: partText, Text: "hi"}}}}, Stream: tt.stream}
			hr, err := buildUpstreamRequest(context.Background(), call{res: resolution{Provider: p, Model: "m"}, baseURL: base, cred: tt.cred}, &req)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := newProviderClient().Do(hr)
			if err != nil {
				t.Fatal(classifyTransport(err))
			}
			defer resp.Body.Close()
			var got chatAnswer
			if req.Stream || p.codex {
				got, err = assembleStream(p.protocol, resp.Body)
			} else {
				b, rerr := io.ReadAll(resp.Body)
				if rerr != nil {
					t.Fatal(rerr)
				}
				got, err = decodeUpstreamAnswer(p.protocol, b)
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEveryProviderHasAWireFormat is why buildUpstreamRequest needs no
// check of formatOf: every protocol of the table has a wire format.
func TestEveryProviderHasAWireFormat(t *testing.T) {
	for _, p := range providerTable {
		if formatOf(p.protocol) == nil {
			t.Errorf("provider %q: protocol %q has no wire format", p.id, p.protocol)
		}
	}
}

// TestUnusableBaseURLRefusedBeforeAnyCall: a provider whose base URL breaks SPEC §6.1's rule is refused 503
// dependency_unavailable naming the variable, with attempts 0: nothing is sent.
func TestUnusableBaseURLRefusedBeforeAnyCall(t *testing.T) {
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = "ftp://127.0.0.1:9/v1"
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	status, _, b := d.call("POST", "/v1/chat/completions", d.token, `{"model":"openai/gpt-test","messages":[{"role":"user","content":"hi"}]}`)
	e := envelopeOf(t, b)
	if status != 503 || e["code"] != "dependency_unavailable" || e["attempts"] != float64(0) ||
		!strings.Contains(string(b), "BRAMA_PROVIDER_OPENAI_BASE_URL") {
		t.Errorf("%d %s, want 503 dependency_unavailable naming the variable, attempts 0", status, b)
	}
}
