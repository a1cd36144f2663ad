package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestStreamSendsItsStatusAtCommit: the stream commits when the provider
// answers 2xx, and the caller then gets its 200 with Brama-Attempts (SPEC
// §1 "committed", §7.4, §7.5), even while the provider stays silent; not
// only with the provider's first event or the first keep-alive 15 s later.
func TestStreamSendsItsStatusAtCommit(t *testing.T) {
	release := make(chan struct{}, 1)
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select { // silent until the caller has its status
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, lfFixture(t, map[string]string{"/chat/completions": "openai-chat.sse",
			"/v1/messages": "anthropic-messages.sse", "/responses": "openai-responses.sse"}[r.URL.Path]))
	})
	env := stateEnv(t)
	for _, p := range []string{"OPENAI", "ANTHROPIC", "OPENAI_RESPONSES"} {
		env["BRAMA_PROVIDER_"+p+"_BASE_URL"] = fake.URL
	}
	d := startDaemon(t, env, `{"openai":"k1","anthropic":"k2","openai-responses":"k3"}`, "-local-credentials-stdin")
	for _, tc := range []struct{ dialect, model, terminal string }{
		{dialectChat, "openai/gpt-test", "data: [DONE]"},                             // passthrough
		{dialectMessages, "anthropic/claude-test", "event: message_stop"},            // passthrough
		{dialectResponses, "openai-responses/gpt-resp", "event: response.completed"}, // passthrough
		{dialectMessages, "openai/gpt-test", "event: message_stop"},                  // translated
	} {
		t.Run(tc.dialect+" from "+tc.model, func(t *testing.T) {
			resp := d.openStream(dialectPaths[tc.dialect], d.token, chatBody(tc.dialect, tc.model, true, ""))
			defer resp.Body.Close()
			release <- struct{}{} // the provider speaks only once the caller has its status
			got, err := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.Header.Get("Brama-Attempts") != "1" || err != nil {
				t.Fatalf("status %d, Brama-Attempts %q, read error %v", resp.StatusCode, resp.Header.Get("Brama-Attempts"), err)
			}
			if strings.HasPrefix(string(got), ": keep-alive") || !strings.Contains(string(got), tc.terminal) {
				t.Errorf("the caller's status came with the first keep-alive, not at commit, or the stream did not complete: %.200q", got)
			}
		})
	}
}

// lfFixture is a provider fixture with "\n" line ends, for tests that
// split it into events.
func lfFixture(t testing.TB, name string) string {
	return strings.ReplaceAll(fixture(t, name), "\r\n", "\n")
}
