package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestClassifyRefusal(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	const key = "key-planted-0123456789"
	tests := []struct {
		name       string
		protocol   string
		status     int
		header     http.Header
		body       string
		class      string
		code       string
		retryAfter time.Duration
		sentence   string
		inMessage  string
	}{
		{"openai 401", "openai", 401, nil,
			`{"error":{"message":"Incorrect API key provided: ` + key + `.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`,
			refusalAuth, "provider_failure", 0, "Incorrect API key provided: [redacted].", `provider "openai" answered 401 (invalid_api_key): Incorrect API key provided: [redacted].`},
		{"openai 429 rate", "openai", 429, http.Header{"Retry-After": {"20"}},
			`{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`,
			refusalRate, "provider_rate_limited", 20 * time.Second, "Rate limit reached", "answered 429"},
		{"openai 429 quota", "openai", 429, nil,
			`{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			refusalQuota, "provider_quota_exhausted", 0, "You exceeded your current quota, please check your plan and billing details.", "(insufficient_quota)"},
		{"openai quota by type only", protoOpenAIChat, 429, nil,
			`{"error":{"message":"m","type":"insufficient_quota","code":null}}`,
			refusalQuota, "provider_quota_exhausted", 0, "m", `provider "openai-chat" answered 429 (insufficient_quota): m`},
		{"quota by code only", protoOpenAIChat, 429, nil,
			`{"error":{"message":"m","type":"requests","code":"insufficient_quota"}}`,
			refusalQuota, "provider_quota_exhausted", 0, "m", `provider "openai-chat" answered 429 (insufficient_quota): m`},
		{"a quota code in a 5xx is the provider's failure", protoOpenAIChat, 503, nil,
			`{"error":{"message":"m","type":"insufficient_quota","code":"insufficient_quota"}}`,
			refusalOther, "dependency_unavailable", 0, "m", "answered 503 (insufficient_quota)"},
		{"openai 404 model", "openai", 404, nil,
			`{"error":{"message":"The model 'gpt-9' does not exist","type":"invalid_request_error","code":"model_not_found"}}`,
			refusalModel, "provider_rejected", 0, "The model 'gpt-9' does not exist", "answered 404"},
		{"openai 500", "openai", 500, nil,
			`{"error":{"message":"The server had an error","type":"server_error","code":null}}`,
			refusalOther, "dependency_unavailable", 0, "The server had an error", "answered 500 (server_error)"},
		{"anthropic 403", "anthropic", 403, nil,
			`{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission"},"request_id":"req_1"}`,
			refusalAuth, "provider_failure", 0, "Your API key does not have permission", "answered 403 (permission_error)"},
		{"anthropic 402 billing", "anthropic", 402, nil,
			`{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low"}}`,
			refusalQuota, "provider_quota_exhausted", 0, "Your credit balance is too low", "(billing_error)"},
		{"anthropic 400 billing type", "anthropic", 400, nil,
			`{"type":"error","error":{"type":"billing_error","message":"low"}}`,
			refusalQuota, "provider_quota_exhausted", 0, "low", ""},
		{"anthropic 400 invalid", "anthropic", 400, nil,
			`{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: field required"}}`,
			refusalModel, "provider_rejected", 0, "max_tokens: field required", ""},
		{"anthropic 413", "anthropic", 413, nil,
			`{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}`,
			refusalModel, "provider_rejected", 0, "Request exceeds the maximum size", ""},
		{"anthropic 429 reset headers", "anthropic", 429,
			http.Header{"Anthropic-Ratelimit-Tokens-Remaining": {"0"}, "Anthropic-Ratelimit-Tokens-Reset": {"2025-06-01T12:01:30Z"},
				"Anthropic-Ratelimit-Requests-Remaining": {"10"}, "Anthropic-Ratelimit-Requests-Reset": {"2025-06-01T13:00:00Z"}},
			`{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`,
			refusalRate, "provider_rate_limited", 90 * time.Second, "Number of request tokens has exceeded your per-minute rate limit", ""},
		{"anthropic 529", "anthropic", 529, nil,
			`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
			refusalOther, "dependency_unavailable", 0, "Overloaded", ""},
		{"claude-code 429 unified window", "claude-code", 429,
			http.Header{"Anthropic-Ratelimit-Unified-5h-Utilization": {"1.0"}, "Anthropic-Ratelimit-Unified-5h-Reset": {"1748782800"},
				"Anthropic-Ratelimit-Unified-7d-Utilization": {"0.4"}, "Anthropic-Ratelimit-Unified-7d-Reset": {"1749000000"}},
			`{"type":"error","error":{"type":"rate_limit_error","message":"Rate limited"}}`,
			refusalRate, "provider_rate_limited", 0, "Rate limited", `provider "claude-code" answered 429`}, // TestRefusalStatingItsUsedUpWindowBlocksUntilItResets
		{"codex 429 detail", "codex", 429,
			http.Header{"X-Codex-Primary-Used-Percent": {"100"}, "X-Codex-Primary-Reset-After-Seconds": {"3600"},
				"X-Codex-Secondary-Used-Percent": {"40"}, "X-Codex-Secondary-Reset-After-Seconds": {"90000"}},
			`{"detail":"Usage limit reached"}`,
			refusalRate, "provider_rate_limited", 0, "Usage limit reached", `provider "codex" answered 429: Usage limit reached`},
		{"codex by status alone", "codex", 429, nil, `{"error":{"type":"insufficient_quota","message":"m"}}`,
			refusalRate, "provider_rate_limited", 0, "m", ""},
		{"codex 401 detail", "codex", 401, nil, `{"detail":"Could not validate credentials ` + key + `"}`,
			refusalAuth, "provider_failure", 0, "Could not validate credentials [redacted]", ""},
		{"codex 400 detail object", "codex", 400, nil, `{"detail":{"message":"Unsupported parameter: max_output_tokens"}}`,
			refusalModel, "provider_rejected", 0, "Unsupported parameter: max_output_tokens", ""},
		{"openrouter 402 numeric code", "openrouter", 402, nil, `{"error":{"code":402,"message":"Insufficient credits"}}`,
			refusalQuota, "provider_quota_exhausted", 0, "Insufficient credits", "(402)"},
		{"504 html", "openai", 504, nil, `<html><body>Gateway Timeout sk-abcdefghijkl</body></html>`,
			refusalOther, "dependency_timeout", 0, "", `provider "openai" answered 504`},
		{"502 empty", "groq", 502, nil, ``,
			refusalOther, "dependency_unavailable", 0, "", `provider "groq" answered 502`},
		{"redirect", "openai", 302, nil, ``,
			refusalOther, "provider_failure", 0, "", "answered 302"},
		{"error as string", "mistral", 422, nil, `{"error":"bad input ` + key + `"}`,
			refusalModel, "provider_rejected", 0, "bad input [redacted]", ""},
		{"secret-shaped token redacted", "openai", 400, nil, `{"error":{"message":"bad key sk-proj-abcdef123456 given","type":"invalid_request_error"}}`,
			refusalModel, "provider_rejected", 0, "bad key [redacted] given", ""},
		{"retry-after HTTP date", "openai", 429, http.Header{"Retry-After": {"Sun, 01 Jun 2025 12:05:00 GMT"}}, `{}`,
			refusalRate, "provider_rate_limited", 5 * time.Minute, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.header
			if h == nil {
				h = http.Header{}
			}
			p, _ := lookupProvider(tt.protocol)
			p.id = tt.protocol // protoOpenAIChat names none: an unknown provider, named as given
			r := classifyRefusal(p, tt.status, h, []byte(tt.body), key, now)
			if r.class != tt.class {
				t.Errorf("class = %q, want %q", r.class, tt.class)
			}
			if r.err == nil || r.err.Code != tt.code {
				t.Fatalf("err = %v, want code %q", r.err, tt.code)
			}
			if r.err.Attempts != nil {
				t.Errorf("attempts set")
			}
			if r.retryAfter != tt.retryAfter {
				t.Errorf("retryAfter = %v, want %v", r.retryAfter, tt.retryAfter)
			}
			if r.sentence != tt.sentence {
				t.Errorf("sentence = %q, want %q", r.sentence, tt.sentence)
			}
			if !strings.Contains(r.err.Message, tt.inMessage) {
				t.Errorf("message %q does not contain %q", r.err.Message, tt.inMessage)
			}
			if strings.Contains(r.err.Message, key) || strings.Contains(r.err.Message, "<html") {
				t.Errorf("message %q quotes a secret or the raw body", r.err.Message)
			}
		})
	}
}

// TestClassifyRefusalStatus: provider_rejected keeps the provider's 400,
// 404, 413 and 422, answers another 4xx as 400, and leaves 401/403/408/409
// to provider_failure (SPEC §8.2); only a retryable code carries the
// provider's wait.
func TestClassifyRefusalStatus(t *testing.T) {
	body := []byte(`{"error":{"message":"nope","type":"invalid_request_error"}}`)
	tests := []struct {
		status     int
		code       string
		httpStatus int
		retryAfter time.Duration // of the apiError (sent as Retry-After)
	}{
		{400, "provider_rejected", 400, 0},
		{404, "provider_rejected", 404, 0},
		{413, "provider_rejected", 413, 0},
		{422, "provider_rejected", 422, 0},
		{418, "provider_rejected", 400, 0},
		{410, "provider_rejected", 400, 0},
		{451, "provider_rejected", 400, 0},
		{401, "provider_failure", 502, 0},
		{403, "provider_failure", 502, 0},
		{408, "provider_failure", 502, 0},
		{409, "provider_failure", 502, 0},
		{402, "provider_quota_exhausted", 502, 0},
		{429, "provider_rate_limited", 429, 7 * time.Second},
		{500, "dependency_unavailable", 503, 7 * time.Second},
		{503, "dependency_unavailable", 503, 7 * time.Second},
		{504, "dependency_timeout", 504, 7 * time.Second},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.status), func(t *testing.T) {
			openai, _ := lookupProvider("openai")
			r := classifyRefusal(openai, tt.status, http.Header{"Retry-After": {"7"}}, body, "", time.Now())
			if r.err.Code != tt.code || r.err.Status() != tt.httpStatus || r.err.RetryAfter != tt.retryAfter {
				t.Errorf("provider %d → %s %d retry-after %v, want %s %d %v", tt.status, r.err.Code, r.err.Status(), r.err.RetryAfter, tt.code, tt.httpStatus, tt.retryAfter)
			}
		})
	}
}

// TestClassifyBeforeRedacting: a direct key "a" must not turn
// insufficient_quota into a rate limit (issue 10 item 4); the quoted text
// is redacted all the same.
func TestClassifyBeforeRedacting(t *testing.T) {
	body := []byte(`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`)
	openai, _ := lookupProvider("openai")
	r := classifyRefusal(openai, 429, http.Header{}, body, "a", time.Now())
	if r.class != refusalQuota || r.err.Code != "provider_quota_exhausted" {
		t.Errorf("key %q: class %q code %q, want quota / provider_quota_exhausted", "a", r.class, r.err.Code)
	}
	if !strings.HasSuffix(r.err.Message, "current quot[redacted]") {
		t.Errorf("the quoted sentence is not redacted: %q", r.err.Message)
	}
	ev, _ := splitRaw([]byte(`{"code":"insufficient_quota"}`), '{', nil)
	e := (&streamReader{secret: "a"}).inBandError(ev)
	var se *upstreamStreamError
	if !errors.As(e, &se) || se.Class != refusalQuota || se.Code != "insufficient_quot[redacted]" || !strings.Contains(e.Message, `"insufficient_quot[redacted]"`) {
		t.Errorf("in-band insufficient_quota with key %q: %v (%+v)", "a", e, se)
	}
}

func TestClassifyRefusalSentenceBound(t *testing.T) {
	openai, _ := lookupProvider("openai")
	// SPEC §10.3 counts characters: two-byte ones, after a one-byte one, and four-byte ones are cut at the 200th, never
	// inside one; a sentence of 200 is kept whole
	for _, tc := range []struct{ msg, want string }{
		{strings.Repeat("é", 300), strings.Repeat("é", 200)},
		{"x" + strings.Repeat("é", 300), "x" + strings.Repeat("é", 199)},
		{strings.Repeat("月", 150) + strings.Repeat("🙂", 100), strings.Repeat("月", 150) + strings.Repeat("🙂", 50)},
		{strings.Repeat("月", 200), strings.Repeat("月", 200)},
	} {
		r := classifyRefusal(openai, 400, http.Header{}, []byte(`{"error":{"message":"`+tc.msg+`"}}`), "", time.Now())
		if r.sentence != tc.want || !utf8.ValidString(r.sentence) {
			t.Errorf("sentence of %d characters, want %d: %q", utf8.RuneCountInString(r.sentence), utf8.RuneCountInString(tc.want), r.sentence)
		}
		if got := ledgerSentence(tc.msg); got != tc.want {
			t.Errorf("ledger sentence of %d characters, want %d", utf8.RuneCountInString(got), utf8.RuneCountInString(tc.want))
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 250e6, time.UTC) // an epoch reset counts from the instant, not its second
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
	}{
		{"none", http.Header{}, 0},
		{"seconds", http.Header{"Retry-After": {"7"}}, 7 * time.Second},
		{"ms wins", http.Header{"Retry-After-Ms": {"1500"}, "Retry-After": {"7"}}, 1500 * time.Millisecond},
		{"date in the past", http.Header{"Retry-After": {"Sun, 01 Jun 2025 11:00:00 GMT"}}, 0},
		{"garbage", http.Header{"Retry-After": {"soon"}}, 0},
		{"past date or 0 leaves the reset headers", http.Header{"Retry-After": {"0"},
			"Anthropic-Ratelimit-Unified-Status": {"rejected"}, "Anthropic-Ratelimit-Unified-Reset": {"1748779800"},
		}, 10*time.Minute - 250*time.Millisecond},
		{"capped", http.Header{"Retry-After": {"99999999999"}}, maxRetryAfter},
		{"openai exhausted limit only", http.Header{
			"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"6m0s"},
			"X-Ratelimit-Remaining-Tokens": {"100"}, "X-Ratelimit-Reset-Tokens": {"17h"},
		}, 6 * time.Minute},
		{"openai nothing exhausted", http.Header{
			"X-Ratelimit-Remaining-Requests": {"3"}, "X-Ratelimit-Reset-Requests": {"6m0s"},
		}, 0},
		{"claude-code unified rejected", http.Header{
			"Anthropic-Ratelimit-Unified-Status": {"rejected"}, "Anthropic-Ratelimit-Unified-Reset": {"1748779800"},
		}, 10*time.Minute - 250*time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryAfter(tt.header, now); got != tt.want {
				t.Errorf("retryAfter = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestClassifyTransport(t *testing.T) {
	// A port that refuses: listen, note the address, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String() + "/v1/chat/completions"
	ln.Close()

	// A server that reads the whole request, then hangs up without answering.
	hangup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		conn.Close()
	}))
	t.Cleanup(hangup.Close)

	// A server that answers 200 and hangs up mid-body.
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(200)
		io.WriteString(w, `{"choices":[`)
		http.NewResponseController(w).Flush()
		conn, _, _ := http.NewResponseController(w).Hijack()
		conn.Close()
	}))
	t.Cleanup(cut.Close)

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	tests := []struct {
		name     string
		ctx      context.Context
		url      string
		readBody bool
		code     string
	}{
		{"refused dial", context.Background(), refused, false, "dependency_unavailable"},
		{"hang-up after the request", context.Background(), hangup.URL, false, "provider_incomplete"},
		{"body cut", context.Background(), cut.URL, true, "provider_incomplete"},
		{"caller gone", cancelled, hangup.URL, false, "client_cancelled"},
	}
	client := newProviderClient()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(tt.ctx, "POST", tt.url, strings.NewReader(`{"model":"m"}`))
			resp, err := client.Do(req)
			if err == nil {
				if !tt.readBody {
					resp.Body.Close()
					t.Fatalf("call succeeded with %d", resp.StatusCode)
				}
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if err == nil {
				t.Fatal("no transport error")
			}
			ae := classifyTransport(err)
			if ae.Code != tt.code {
				t.Errorf("code = %q, want %q (%v)", ae.Code, tt.code, err)
			}
			if ae.Err != err {
				t.Errorf("cause not kept")
			}
			if strings.Contains(ae.Message, "Post \"") {
				t.Errorf("message %q repeats the URL wrapper", ae.Message)
			}
		})
	}
}

func TestClassifyTransportKinds(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code string
	}{
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: timeoutError{}}, "dependency_timeout"},
		{"dns", &net.DNSError{Err: "no such host", Name: "api.example"}, "dependency_unavailable"},
		{"dns timeout", &net.DNSError{Err: "i/o timeout", Name: "api.example", IsTimeout: true}, "dependency_timeout"},
		{"read timeout after send", &net.OpError{Op: "read", Net: "tcp", Err: timeoutError{}}, "provider_incomplete"},
		{"eof", io.ErrUnexpectedEOF, "provider_incomplete"},
		{"a certificate of an unknown authority (a real handshake)", untrustedTLSCall(t), "dependency_unavailable"},
		{"plain HTTP where TLS was expected", tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, "dependency_unavailable"},
		{"a TLS alert", tls.AlertError(40), "dependency_unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classifyTransport(tt.err); got.Code != tt.code || got.Err != tt.err {
				t.Errorf("classifyTransport = %v (cause %v), want %s keeping the cause", got, got.Err, tt.code)
			}
		})
	}
}

// untrustedTLSCall is the error of a call to a TLS server whose certificate the client does not trust: nothing was sent.
func untrustedTLSCall(t *testing.T) error {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err == nil {
		resp.Body.Close()
		t.Fatal("an untrusted certificate was accepted")
	}
	return err
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func FuzzProviderError(f *testing.F) {
	const secret = "planted-SECRET-4242"
	f.Add(429, []byte(`{"error":{"message":"quota planted-SECRET-4242","type":"insufficient_quota","code":"insufficient_quota"}}`), "12")
	f.Add(402, []byte(`{"type":"error","error":{"type":"billing_error","message":"low"}}`), "Sun, 01 Jun 2025 12:05:00 GMT")
	f.Add(401, []byte(`{"detail":"planted-SECRET-4242 is not valid"}`), "")
	f.Add(503, []byte(`{"error":"x"}`), "-1")
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, status int, body []byte, retry string) {
		h := http.Header{}
		h.Set("Retry-After", retry)
		h.Set("X-Codex-Primary-Used-Percent", "100")
		h.Set("X-Codex-Primary-Reset-After-Seconds", retry)
		for _, who := range []string{"openai", "anthropic", "codex", protoOpenAIChat} {
			p, _ := lookupProvider(who)
			p.id = who // protoOpenAIChat names none: an unknown provider, named as given
			r := classifyRefusal(p, status, h, body, secret, now)
			if r.err == nil {
				t.Fatal("no apiError")
			}
			if _, ok := codes[r.err.Code]; !ok {
				t.Fatalf("code %q is not in the table", r.err.Code)
			}
			if n := utf8.RuneCountInString(r.sentence); n > maxSentenceChars {
				t.Fatalf("sentence is %d characters", n)
			}
			if strings.Contains(r.sentence, secret) || strings.Contains(r.err.Message, secret) {
				t.Fatalf("planted secret quoted: %q / %q", r.sentence, r.err.Message)
			}
			if r.retryAfter < 0 || r.retryAfter > maxRetryAfter {
				t.Fatalf("retryAfter %v out of range", r.retryAfter)
			}
			switch r.class {
			case refusalAuth, refusalRate, refusalQuota, refusalModel, refusalOther:
			default:
				t.Fatalf("class %q", r.class)
			}
		}
	})
}
