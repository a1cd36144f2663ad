package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// matrixOutcomes are the provider answers of the attempt matrix: a fake
// answers the outcome its call's model names ("m-<outcome>").
var matrixOutcomes = []string{"ok", "401", "403", "429ra", "429", "quota402", "quota429",
	"400", "404", "413", "422", "500", "503", "cut", "cutbody", "malformed", "badusage", "slowcut"}

// matrixProvider answers every protocol path by the model a call names and
// counts the POST calls it saw (a maintenance pass's GET is not a call).
func matrixProvider(t *testing.T) (*fakeProvider, *atomic.Int64) {
	var calls atomic.Int64
	f := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Method != http.MethodPost {
			http.Error(w, `{"error":"no usage report here"}`, 404)
			return
		}
		calls.Add(1)
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		json.Unmarshal(body, &req)
		fail := func(status int, typ, code string) {
			http.Error(w, fmt.Sprintf(`{"type":"error","error":{"type":%q,"code":%q,"message":"refused"}}`, typ, code), status)
		}
		switch o := strings.TrimPrefix(req.Model, "m-"); o {
		case "ok":
			w.Header().Set("Content-Type", "application/json")
			switch {
			case strings.HasSuffix(r.URL.Path, "/count_tokens"):
				io.WriteString(w, `{"input_tokens":7}`)
			case strings.HasSuffix(r.URL.Path, "/embeddings"):
				io.WriteString(w, `{"object":"list","data":[{"embedding":[0.5]}]}`)
			case req.Stream:
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, fixture(t, "openai-chat.sse"))
			case strings.HasSuffix(r.URL.Path, "/v1/messages"):
				io.WriteString(w, protocolFixtures[1].buffered)
			default:
				io.WriteString(w, protocolFixtures[0].buffered)
			}
		case "401":
			fail(401, "authentication_error", "")
		case "403":
			fail(403, "permission_error", "")
		case "429ra":
			w.Header().Set("Retry-After", "30")
			fail(429, "rate_limit_error", "")
		case "429":
			fail(429, "rate_limit_error", "")
		case "quota402":
			fail(402, "billing_error", "")
		case "quota429":
			fail(429, "insufficient_quota", "insufficient_quota")
		case "cut":
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		case "cutbody":
			w.Header().Set("Content-Length", "500")
			io.WriteString(w, `{"id":"x","choi`)
			cutAfterFlush(w)
		case "malformed":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"x", not json`)
		case "badusage": // an answer whose usage is not the protocol's: its tokens cannot be counted
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"x","usage":"lots"}`)
		case "slowcut": // the first byte is slow to come, then the connection fails
			<-time.After(50 * time.Millisecond)
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		default:
			var status int
			fmt.Sscan(o, &status)
			fail(status, "invalid_request_error", "")
		}
	})
	return f, &calls
}

// matrixWant is what a caller must get for one outcome on one route kind.
type matrixWant struct {
	status     int
	code       string // "" : success
	calls      int
	retryAfter string
}

// oneCallWant is a route of one call without rotation: the provider's
// refusal classified (SPEC §8.2), its own Retry-After on a 429.
func oneCallWant(o string) matrixWant {
	switch o {
	case "ok":
		return matrixWant{200, "", 1, ""}
	case "401", "403", "malformed", "badusage":
		return matrixWant{502, "provider_failure", 1, ""}
	case "429ra":
		return matrixWant{429, "provider_rate_limited", 1, "30"}
	case "429":
		return matrixWant{429, "provider_rate_limited", 1, ""}
	case "quota402", "quota429":
		return matrixWant{502, "provider_quota_exhausted", 1, ""}
	case "500", "503":
		return matrixWant{503, "dependency_unavailable", 1, ""}
	case "cut", "cutbody", "slowcut":
		return matrixWant{502, "provider_incomplete", 1, ""}
	}
	var status int
	fmt.Sscan(o, &status)
	return matrixWant{status, "provider_rejected", 1, ""}
}

// poolWant is a subscription route on a pool of two (SPEC §7.2): a
// rotating refusal is tried on both, then §7.2.5's answer; a block's end
// is the Retry-After (15 min when the provider stated none).
func poolWant(o string) matrixWant {
	switch o {
	case "401", "403":
		return matrixWant{503, "subscription_reauthorization_required", 2, ""}
	case "429ra":
		return matrixWant{429, "provider_rate_limited", 2, "30"}
	case "429":
		return matrixWant{429, "provider_rate_limited", 2, "900"}
	case "quota402", "quota429":
		return matrixWant{502, "provider_quota_exhausted", 2, ""}
	}
	return oneCallWant(o)
}

// selectorWant is any or best with two candidates of one provider, the
// outcome's first and an answering second (SPEC §7.3): a pool refusal skips
// the provider's second; a refusal of the request moves on to it.
func selectorWant(o string) matrixWant {
	switch o {
	case "400", "404", "413", "422":
		return matrixWant{200, "", 2, ""}
	}
	return poolWant(o)
}

// TestAttemptMatrix: for every route kind and every provider outcome, the
// calls the provider saw equal Brama-Attempts and the envelope's attempts,
// within each kind's budget (SPEC §7.1–§7.3, §7.4, §8.1, §15), and the
// answer is the one SPEC §8.2 names.
func TestAttemptMatrix(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	testingOnlyNow = clock.now
	defer func() { testingOnlyNow = nil }()
	fake, calls := matrixProvider(t)
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0" // the selector rows repeat one body
	for _, p := range []string{"OPENAI", "ANTHROPIC", "KIMI"} {
		env["BRAMA_PROVIDER_"+p+"_BASE_URL"] = fake.URL
	}
	d := startDaemon(t, env, `{"openai":"k-direct","anthropic":"k-direct-a"}`, "-local-credentials-stdin")
	put := func(alias, route string) {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, fmt.Sprintf(`{"alias":%q,"route":%q}`, alias, route)); s != 200 {
			t.Fatalf("PUT %s: %d %s", alias, s, b)
		}
	}
	put("c2", "kimi/m-ok") // every selector's second candidate
	chat := func(model string, stream bool, extra string) string {
		return chatBody(dialectChat, model, stream, extra)
	}
	// stream is d.call for a stream, whose body a failure after commit cuts.
	stream := func(tok, model string) (int, http.Header, []byte) {
		req, _ := http.NewRequest("POST", d.url+"/v1/chat/completions", strings.NewReader(chat(model, true, "")))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	kinds := []struct {
		name string
		want func(o string) matrixWant
		// call makes the request of outcome o as agent (its subscriptions given).
		call func(o, tok string, subs []string) (int, http.Header, []byte)
		subs string // the provider of the agent's two subscriptions ("": none)
	}{
		{"direct", oneCallWant, func(o, _ string, _ []string) (int, http.Header, []byte) {
			return d.call("POST", "/v1/chat/completions", d.token, chat("openai/m-"+o, false, ""))
		}, ""},
		{"direct stream", oneCallWant, func(o, _ string, _ []string) (int, http.Header, []byte) {
			return stream(d.token, "openai/m-"+o)
		}, ""},
		{"alias", oneCallWant, func(o, _ string, _ []string) (int, http.Header, []byte) {
			put("al-"+o, "openai/m-"+o)
			return d.call("POST", "/v1/messages", d.token, chatBody(dialectMessages, "al-"+o, false, ""))
		}, ""},
		{"subscription", poolWant, func(o, tok string, _ []string) (int, http.Header, []byte) {
			return d.call("POST", "/v1/chat/completions", tok, chat("kimi/m-"+o, false, ""))
		}, "kimi"},
		{"subscription stream", poolWant, func(o, tok string, _ []string) (int, http.Header, []byte) {
			return stream(tok, "kimi/m-"+o)
		}, "kimi"},
		{"any", selectorWant, func(o, tok string, _ []string) (int, http.Header, []byte) {
			put("c1", "kimi/m-"+o)
			return d.call("POST", "/v1/chat/completions", tok, chat("any", false, ""))
		}, "kimi"},
		{"best", selectorWant, func(o, tok string, _ []string) (int, http.Header, []byte) {
			put("c1", "kimi/m-ok")
			put("best", "kimi/m-"+o)
			return d.call("POST", "/v1/chat/completions", tok, chat("best", false, ""))
		}, "kimi"},
		{"count_tokens direct", oneCallWant, func(o, _ string, _ []string) (int, http.Header, []byte) {
			return d.call("POST", "/v1/messages/count_tokens", d.token, chatBody(dialectMessages, "anthropic/m-"+o, false, ""))
		}, ""},
		{"embeddings", oneCallWant, func(o, _ string, _ []string) (int, http.Header, []byte) {
			return d.call("POST", "/v1/embeddings", d.token, `{"model":"openai/m-`+o+`","input":"hi"}`)
		}, ""},
	}
	n := 0
	for _, k := range kinds {
		for _, o := range matrixOutcomes {
			t.Run(k.name+"/"+o, func(t *testing.T) {
				var tok string
				var subs []string
				if k.subs != "" {
					n++
					tok, subs = agentWithSubs(t, d, fmt.Sprintf("mx%d", n), k.subs, fmt.Sprintf("key-mx%d-1", n), fmt.Sprintf("key-mx%d-2", n))
				}
				w := k.want(o)
				if strings.Contains(k.name, "stream") && (o == "malformed" || o == "badusage" || o == "cutbody") {
					w = matrixWant{200, "", 1, ""} // committed, then failed in-band (SPEC §7.5)
				}
				before := calls.Load()
				status, hdr, body := k.call(o, tok, subs)
				w.check(t, int(calls.Load()-before), status, hdr, body)
			})
		}
	}
}

// check fails t unless an answer is w's and states, in Brama-Attempts and
// the envelope's attempts, the got calls the providers saw.
func (w matrixWant) check(t *testing.T, got, status int, hdr http.Header, body []byte) {
	t.Helper()
	if status != w.status || got != w.calls {
		t.Fatalf("%d after %d calls, want %d after %d: %s", status, got, w.status, w.calls, body)
	}
	if a := hdr.Get("Brama-Attempts"); a != fmt.Sprint(got) {
		t.Errorf("Brama-Attempts %q, the providers saw %d calls", a, got)
	}
	if ra := hdr.Get("Retry-After"); ra != w.retryAfter {
		t.Errorf("Retry-After %q, want %q", ra, w.retryAfter)
	}
	if w.code == "" {
		return
	}
	if e := envelopeOf(t, body); e["code"] != w.code || e["attempts"] != float64(got) {
		t.Errorf("code %v attempts %v, want %s with %d (the calls the providers saw)", e["code"], e["attempts"], w.code, got)
	}
}
