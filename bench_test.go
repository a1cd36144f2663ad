package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

// The hot paths measured through the real server over loopback HTTP, with a
// direct call to the same in-process fake provider as the baseline. Compare
// ns/op of BenchmarkDirect* with BenchmarkGateway*: the difference is what
// Brama adds. Run: go test -run '^$' -bench . -benchmem

func benchPost(b *testing.B, url, token, body string) {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

func benchSetup(b *testing.B) (fake *fakeProvider, d *daemon) {
	fx := protocolFixtures[0]
	fake = fixtureProvider(b, fx)
	env := stateEnv(b)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	env["BRAMA_LOG_LEVEL"] = "error"
	return fake, startDaemon(b, env, `{"openai":"k"}`, "-local-credentials-stdin")
}

func BenchmarkDirectBuffered(b *testing.B) {
	fake, _ := benchSetup(b)
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"stream":false}`
	for b.Loop() {
		benchPost(b, fake.URL+"/chat/completions", "", body)
	}
}

func BenchmarkGatewayBuffered(b *testing.B) {
	_, d := benchSetup(b)
	body := chatBody(dialectChat, "openai/gpt-test", false, "")
	for b.Loop() {
		benchPost(b, d.url+"/v1/chat/completions", d.token, body)
	}
}

// BenchmarkGatewayTranslatedBuffered is a Messages caller's buffered answer from an OpenAI chat route: the
// provider's body translated into the caller's dialect.
func BenchmarkGatewayTranslatedBuffered(b *testing.B) {
	_, d := benchSetup(b)
	body := chatBody(dialectMessages, "openai/gpt-test", false, "")
	for b.Loop() {
		benchPost(b, d.url+"/v1/messages", d.token, body)
	}
}

func BenchmarkDirectStreamed(b *testing.B) {
	fake, _ := benchSetup(b)
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"stream":true}`
	for b.Loop() {
		benchPost(b, fake.URL+"/chat/completions", "", body)
	}
}

func BenchmarkGatewayStreamed(b *testing.B) {
	_, d := benchSetup(b)
	body := chatBody(dialectChat, "openai/gpt-test", true, "")
	for b.Loop() {
		benchPost(b, d.url+"/v1/chat/completions", d.token, body)
	}
}

// The passthrough fast path against its floor: a bare httputil.ReverseProxy
// with a bearer check and a connection pool, on the same stub in the same
// run. Compare BenchmarkFloor* with BenchmarkPassthrough*: buffered, and a
// 20-event chat stream. Run: go test -run '^$' -bench 'Floor|Passthrough' -benchmem

// stream20 is a chat stream of 20 events: 18 content chunks, the finish
// chunk and [DONE].
func stream20() string {
	var b strings.Builder
	for i := range 18 {
		fmt.Fprintf(&b, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word%d \"},\"finish_reason\":null}]}\n\n", i)
	}
	b.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// passthroughBench starts the stub, Brama in front of it and the floor
// proxy in front of it, and returns the two entry URLs and Brama's token.
func passthroughBench(b *testing.B) (brama, floor, token string) {
	stream := stream20()
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, stream)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, protocolFixtures[0].buffered)
	}))
	b.Cleanup(stub.Close)
	env := stateEnv(b)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = stub.URL
	env["BRAMA_LOG_LEVEL"] = "error"
	d := startDaemon(b, env, `{"openai":"k"}`, "-local-credentials-stdin")

	target, _ := url.Parse(stub.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = newProviderClient().Transport
	rp.FlushInterval = -1
	rp.Director = func(r *http.Request) {
		r.URL.Scheme, r.URL.Host, r.Host = target.Scheme, target.Host, target.Host
		r.URL.Path = "/chat/completions"
		r.Header.Set("Authorization", "Bearer k")
	}
	fp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+d.token {
			http.Error(w, "unauthorized", 401)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	b.Cleanup(fp.Close)
	return d.url + "/v1/chat/completions", fp.URL + "/v1/chat/completions", d.token
}

const (
	benchPassthroughBuffered = `{"model":"openai/gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"stream":false}`
	benchPassthroughStream   = `{"model":"openai/gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":100,"stream":true}`
)

func BenchmarkFloorBuffered(b *testing.B) {
	_, floor, token := passthroughBench(b)
	for b.Loop() {
		benchPost(b, floor, token, benchPassthroughBuffered)
	}
}

func BenchmarkPassthroughBuffered(b *testing.B) {
	brama, _, token := passthroughBench(b)
	for b.Loop() {
		benchPost(b, brama, token, benchPassthroughBuffered)
	}
}

func BenchmarkFloorStream20(b *testing.B) {
	_, floor, token := passthroughBench(b)
	for b.Loop() {
		benchPost(b, floor, token, benchPassthroughStream)
	}
}

func BenchmarkPassthroughStream20(b *testing.B) {
	brama, _, token := passthroughBench(b)
	for b.Loop() {
		benchPost(b, brama, token, benchPassthroughStream)
	}
}

// BenchmarkEncodeMessagesImage encodes a translated request's 1 MiB image toward Anthropic: its B/op (about the
// body's size, 1.4 MB in base64, for a body carried as sent) shows whether the image's data is also decoded.
func BenchmarkEncodeMessagesImage(b *testing.B) {
	url := "data:image/png;base64," + base64.StdEncoding.EncodeToString(make([]byte, 1<<20))
	req := chatRequest{Model: "m", MaxTokens: 10, Messages: []message{{Role: "user", Parts: []part{{Type: partImage, URL: url}}}}}
	for b.Loop() {
		if _, err := encodeMessages(&req, call{res: resolution{Model: "m"}}, http.Header{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTranslatedStream20 is a Messages caller's stream from the 20-event chat stream: every event translated.
func BenchmarkTranslatedStream20(b *testing.B) {
	brama, _, token := passthroughBench(b)
	body := `{"model":"openai/gpt-test","max_tokens":100,"messages":[{"role":"user","content":"hi"}],"stream":true}`
	for b.Loop() {
		benchPost(b, strings.Replace(brama, "/chat/completions", "/messages", 1), token, body)
	}
}
