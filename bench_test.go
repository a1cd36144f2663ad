package main

import (
	"io"
	"net/http"
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
