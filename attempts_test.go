package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// requestLines are the request log lines of path.
func requestLines(logs, path string) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" && m["path"] == path {
			out = append(out, m)
		}
	}
	return out
}

// A caller that hangs up while its request waits on a grant refresh made
// no provider call: the request is client_cancelled, its signed answer's
// key is released (SPEC §7.4), no call is counted and no pass is asked for.
func TestHangUpDuringRefreshMakesNoCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		apiKey bool // a second subscription, an API key, after the expired grant
	}{
		{"one expired grant", false},
		{"an expired grant, then an API key", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				io.WriteString(w, protocolFixtures[1].buffered)
			})
			arrived, release := make(chan struct{}, 1), make(chan struct{})
			tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				arrived <- struct{}{}
				<-release // the flight outlives its hung-up caller
				io.WriteString(w, `{"access_token":"acc-new","refresh_token":"ref-new","expires_in":3600}`)
			})
			d, tok := oauthSetup(t, provider, tokenEndpoint)
			releaseOnce := sync.OnceFunc(func() { close(release) })
			t.Cleanup(releaseOnce) // before the daemon's stop, which waits for the flight
			donateGrant(t, d, "acc-stale", "ref-stale", time.Now().Add(-time.Hour).UnixMilli())
			if tc.apiKey {
				donate(t, d, "a1", "claude-code", "cc-api-key-0123")
			}
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "POST", d.url+"/v1/messages", strings.NewReader(chatBody(dialectMessages, "claude-code/claude-test", false, "")))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Idempotency-Key", "k1")
			if err := hangUpAfter(req, cancel, arrived); !errors.Is(err, context.Canceled) {
				t.Fatalf("the hung-up request: %v", err)
			}
			d.stderr.waitFor(t, `"path":"/v1/messages"`) // its log line: the request has settled
			if _, err := os.Stat(answerFile(d.env, "a1-app", "k1")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the key of a request that made no call was not released: %v", err)
			}
			releaseOnce()
			d.stop() // every request has written its log line
			lines := requestLines(d.stderr.String(), "/v1/messages")
			if len(lines) != 1 || lines[0]["outcome"] != "client_cancelled" || (lines[0]["attempts"] != nil && lines[0]["attempts"] != float64(0)) {
				t.Errorf("log line %v, want outcome client_cancelled and no call", lines)
			}
			if n := provider.calls.Load(); n != 0 {
				t.Errorf("the provider saw %d calls after the caller hung up", n)
			}
			if strings.Contains(d.stderr.String(), `"reason":"subscription_reauthorization_required"`) {
				t.Errorf("a hang-up asked for a maintenance pass as if no subscription were signed in")
			}
		})
	}
}

// A caller that hangs up while Brama reads a provider's buffered answer
// (or refusal) is client_cancelled in the log line, with the call counted
// (SPEC §7.4), not a provider failure.
func TestHangUpWhileTheAnswerIsRead(t *testing.T) {
	for _, tc := range []struct {
		name, model string
		status      int
	}{
		{"passthrough answer", "openai/gpt-test", 200},
		{"translated answer", "anthropic/claude-test", 200},
		{"refusal", "openai/gpt-test", 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			started, gone := make(chan struct{}), make(chan struct{})
			// More than any socket buffers hold: once written, Brama has the
			// headers and is reading the body.
			part := `{"id":"` + strings.Repeat("x", 32<<20)
			fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				w.Header().Set("Content-Length", fmt.Sprint(len(part)+100))
				w.WriteHeader(tc.status)
				io.WriteString(w, part)
				w.(http.Flusher).Flush()
				close(started)
				<-r.Context().Done() // the rest never comes; Brama hangs up
				close(gone)
			})
			env := stateEnv(t)
			env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
			env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL
			d := startDaemon(t, env, `{"openai":"k1","anthropic":"k2"}`, "-local-credentials-stdin")
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "POST", d.url+"/v1/chat/completions", strings.NewReader(chatBody(dialectChat, tc.model, false, "")))
			req.Header.Set("Authorization", "Bearer "+d.token)
			hangUpAfter(req, cancel, started)
			<-gone
			d.stop() // every request has written its log line
			lines := requestLines(d.stderr.String(), "/v1/chat/completions")
			if len(lines) != 1 || lines[0]["outcome"] != "client_cancelled" || lines[0]["attempts"] != float64(1) {
				t.Errorf("log line %v, want outcome client_cancelled after 1 call", lines)
			}
		})
	}
}

// A caller that hangs up while Brama writes a whole answer the provider gave did not get it: the log line says
// client_cancelled after the one call, not ok (SPEC §7.4), though the provider's side ended well.
func TestHangUpWhileTheAnswerIsWritten(t *testing.T) {
	answer := strings.Replace(opChatAnswer, `"pong"`, `"`+strings.Repeat("x", 32<<20)+`"`, 1) // more than socket buffers hold
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k1"}`, "-local-credentials-stdin")
	var waited atomic.Bool
	testingOnlyBeforeLog = func(r *http.Request) { <-r.Context().Done(); waited.Store(true) } // the hang-up lands before the log line
	defer func() { testingOnlyBeforeLog = nil }()
	req, _ := http.NewRequest("POST", d.url+"/v1/chat/completions", strings.NewReader(chatBody(dialectChat, "openai/gpt-test", false, "")))
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // the body unread: the connection is closed while Brama writes it
	d.stop()          // every request has written its log line
	if !waited.Load() {
		t.Error("the log line did not wait for the hang-up")
	}
	lines := requestLines(d.stderr.String(), "/v1/chat/completions")
	if resp.StatusCode != 200 || len(lines) != 1 || lines[0]["outcome"] != "client_cancelled" || lines[0]["attempts"] != float64(1) {
		t.Errorf("status %d, log line %v; want 200 begun, then outcome client_cancelled after 1 call", resp.StatusCode, lines)
	}
}

// An embeddings answer is the provider's JSON as is; a 2xx body that is no
// JSON object is provider_failure, one cut mid-way provider_incomplete,
// each after its one call (SPEC §8.2, §15).
func TestEmbeddingsAnswerIsJSON(t *testing.T) {
	const good = `{"object":"list", "data":[{"embedding":[0.5, 1e-7]}],"usage":{"prompt_tokens":2}}`
	for _, tc := range []struct {
		name, body string
		cut        bool
		status     int
		code       string
	}{
		{"the provider's bytes", good, false, 200, ""},
		{"not JSON", "<html>busy</html>", false, 502, "provider_failure"},
		{"empty", "", false, 502, "provider_failure"},
		{"cut mid-body", `{"object":"li`, true, 502, "provider_incomplete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if tc.cut {
					w.Header().Set("Content-Length", "64")
				}
				io.WriteString(w, tc.body)
				if !tc.cut {
					return
				}
				cutAfterFlush(w)
			})
			env := stateEnv(t)
			env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
			d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
			status, h, b := d.call("POST", "/v1/embeddings", d.token, `{"model":"openai/emb","input":"hi"}`)
			if status != tc.status || h.Get("Brama-Attempts") != "1" || fake.calls.Load() != 1 {
				t.Fatalf("%d %s (attempts %q, %d calls), want %d after 1 call", status, b, h.Get("Brama-Attempts"), fake.calls.Load(), tc.status)
			}
			if tc.code == "" {
				if string(b) != good {
					t.Errorf("caller got %s, want the provider's bytes %s", b, good)
				}
				return
			}
			if e := envelopeOf(t, b); e["code"] != tc.code || e["attempts"] != float64(1) {
				t.Errorf("%s, want %s after 1 call", b, tc.code)
			}
		})
	}
}

// count_tokens classifies a provider's answer as chat does (SPEC §8.2): a
// body cut mid-way is provider_incomplete, one that is whole but no count
// is provider_failure; either after one call.
func TestCountTokensAnswerCutOrMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, body, code string
		cut              bool
	}{
		{"cut mid-body", `{"input_tok`, "provider_incomplete", true},
		{"whole but not a count", `{"tokens":3}`, "provider_failure", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if !tc.cut {
					io.WriteString(w, tc.body)
					return
				}
				w.Header().Set("Content-Length", "64")
				w.WriteHeader(200)
				io.WriteString(w, tc.body)
				cutAfterFlush(w)
			})
			env := stateEnv(t)
			env["BRAMA_PROVIDER_ANTHROPIC_BASE_URL"] = fake.URL
			d := startDaemon(t, env, `{"anthropic":"k"}`, "-local-credentials-stdin")
			status, h, b := d.call("POST", "/v1/messages/count_tokens", d.token, `{"model":"anthropic/claude-test","messages":[{"role":"user","content":"hi"}]}`)
			if e := envelopeOf(t, b); status != 502 || e["code"] != tc.code || e["attempts"] != float64(1) || h.Get("Brama-Attempts") != "1" {
				t.Errorf("%d %s, want 502 %s after 1 call", status, b, tc.code)
			}
			if n := fake.calls.Load(); n != 1 {
				t.Errorf("the provider saw %d calls, want 1", n)
			}
		})
	}
}

// A caller that hangs up after a refusal that rotates, before the next
// credential's call, makes no second call and none is counted (SPEC §7.4):
// the log line states the one call the provider saw.
func TestHangUpBetweenTwoCalls(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"k1": "429", "k2": "200"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tok, ids := agentWithSubs(t, d, "a1", "kimi", "k1", "k2")
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan struct{})
	var calls atomic.Int32
	testingOnlyBeforeCall = func(callCtx context.Context) {
		if calls.Add(1) == 2 { // the 429 is read; the caller hangs up now
			close(second)
			<-callCtx.Done()
		}
	}
	defer func() { testingOnlyBeforeCall = nil }()
	req, _ := http.NewRequestWithContext(ctx, "POST", d.url+"/v1/chat/completions", strings.NewReader(chatBody(dialectChat, "kimi/k2-test", false, "")))
	req.Header.Set("Authorization", "Bearer "+tok)
	if err := hangUpAfter(req, cancel, second); !errors.Is(err, context.Canceled) {
		t.Fatalf("the hung-up request: %v", err)
	}
	d.stop() // every request has written its log line
	lines := requestLines(d.stderr.String(), "/v1/chat/completions")
	if len(lines) != 1 || lines[0]["outcome"] != "client_cancelled" || lines[0]["attempts"] != float64(1) {
		t.Errorf("log line %v, want outcome client_cancelled after the 1 call made", lines)
	}
	if fake.count("k1") != 1 || fake.count("k2") != 0 {
		t.Errorf("calls k1 %d k2 %d, want 1 and 0", fake.count("k1"), fake.count("k2"))
	}
	ledger := readLedgerFile(t, env["BRAMA_STATE_DIR"]) // the unsent call is no request of k2's either
	if got := [2]int64{ledger[ids[0]].Measured.Requests, ledger[ids[1]].Measured.Requests}; got != [2]int64{1, 0} {
		t.Errorf("ledger measured.requests k1 %d k2 %d, want 1 and 0", got[0], got[1])
	}
}
