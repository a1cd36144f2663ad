package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The probes of issue 10 (what an attacker found), kept as end-to-end
// checks over real HTTP.

// bodyRoutes lists every route whose method carries a body, read from
// routes() itself (the only place URL patterns appear), with the wildcards
// filled in, so a route added later is covered too.
func bodyRoutes(t *testing.T) []struct{ method, path string } {
	t.Helper()
	src, err := os.ReadFile("server.go")
	if err != nil {
		t.Fatal(err)
	}
	fill := strings.NewReplacer("{agent_id}", "a1", "{subscription_id}", "sub_0123456789abcdef", "{key}", "k1", "{id}", "m1")
	var out []struct{ method, path string }
	for _, m := range regexp.MustCompile(`(?:s\.mux\.Handle(?:Func)?|handle)\("(POST|PUT|PATCH|DELETE) ([^"]+)"`).FindAllStringSubmatch(string(src), -1) {
		out = append(out, struct{ method, path string }{m[1], fill.Replace(m[2])})
	}
	if len(out) < 10 {
		t.Fatalf("found only %d body routes in routes()", len(out))
	}
	return out
}

func TestDeepBodyEveryRoute(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	tok := addClient(t, env, "ops", "-admin", "-agent", "a1")
	deep := strings.Repeat("[", 3_000_000)
	for _, rt := range bodyRoutes(t) {
		t.Run(rt.method+" "+rt.path, func(t *testing.T) {
			status, _, body := d.call(rt.method, rt.path, tok, deep)
			if status != 400 {
				t.Fatalf("status %d, want 400: %.300s", status, body)
			}
			e := envelopeOf(t, body)
			if e["code"] != "invalid_request" || !strings.Contains(fmt.Sprint(e["message"]), "1000 levels") {
				t.Errorf("refusal %v, want invalid_request naming the 1000-level limit", e)
			}
			if status, _, _ := d.call("GET", "/health", "", ""); status != 200 {
				t.Fatalf("/health answered %d after the deep body", status)
			}
		})
	}
	// 1,000 levels are still read (and then judged by the route itself).
	ok := strings.Repeat("[", 1000) + strings.Repeat("]", 1000)
	status, _, body := d.call("PUT", "/v1/admin/routes", tok, ok)
	if status != 400 || strings.Contains(string(body), "1000 levels") {
		t.Errorf("1000-deep body: %d %s, want the route's own 400", status, body)
	}
}

// rawConn opens a TCP connection to the daemon and sends head verbatim.
func rawConn(t *testing.T, d *daemon, head string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(d.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSlowUnauthenticatedBodiesAreRefusedAndClosed(t *testing.T) {
	d := startDaemon(t, stateEnv(t), "")
	bound := time.Now().Add(30 * time.Second) // the test's bound; a pass takes well under a second
	// Each request's chunked body never ends: no last chunk is sent. Besides
	// the refusals, routes that never read a body must not wait for it.
	kinds := []struct {
		head string
		want int
		n    int
	}{
		{"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer nope\r\n", 401, 440},
		{"PUT /v1/admin/routes HTTP/1.1\r\nx-api-key: nope\r\n", 401, 20},
		{"GET /health HTTP/1.1\r\n", 200, 20},
		{"POST /nowhere HTTP/1.1\r\n", 404, 20},
	}
	errs := make(chan error, 500)
	var wg sync.WaitGroup
	for _, k := range kinds {
		for i := range k.n {
			c := rawConn(t, d, k.head+"Host: brama\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n")
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.SetReadDeadline(bound)
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					errs <- fmt.Errorf("%.30s #%d: no answer: %v", k.head, i, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != k.want || !resp.Close {
					errs <- fmt.Errorf("%.30s #%d: %d close=%v %s, want %d with Connection: close", k.head, i, resp.StatusCode, resp.Close, b, k.want)
					return
				}
				if _, err := br.ReadByte(); err == nil {
					errs <- fmt.Errorf("%.30s #%d: the server kept the connection open after answering", k.head, i)
				} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
					errs <- fmt.Errorf("%.30s #%d: not closed within the bound", k.head, i)
				}
			}()
		}
	}
	if status, _, _ := d.call("GET", "/health", "", ""); status != 200 {
		t.Errorf("/health answered %d while 500 slow bodies were held", status)
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 5 {
		t.Errorf("… and %d more connections failed", n-5)
	}
	if status, _, _ := d.call("GET", "/health", "", ""); status != 200 {
		t.Errorf("/health answered %d after the slow bodies", status)
	}
}

// TestTokenHeaders: SPEC §3.1 over HTTP. A 401 says which case it was, in
// words a person can act on, and never quotes a token or names a client;
// both headers carrying the same token count as one.
func TestTokenHeaders(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	tok := addClient(t, env, "app")
	const (
		noToken   = "no token: send Authorization: Bearer <token> or x-api-key"
		twoTokens = "two tokens: send one (ANTHROPIC_API_KEY and ANTHROPIC_AUTH_TOKEN both set?)"
		unknown   = "this token is not one of this gateway's clients"
	)
	tests := []struct {
		name string
		hdr  []string
		want string // the 401 message; "": 200
	}{
		{"bearer", []string{"Authorization", "Bearer " + tok}, ""},
		{"x-api-key", []string{"x-api-key", tok}, ""},
		{"x-api-key of another case", []string{"X-API-KEY", tok}, ""},
		{"both headers, the same token", []string{"Authorization", "Bearer " + tok, "x-api-key", tok}, ""},
		{"no header", nil, noToken},
		{"empty x-api-key", []string{"x-api-key", ""}, noToken},
		{"empty bearer", []string{"Authorization", "Bearer "}, noToken},
		{"another scheme", []string{"Authorization", "Basic " + tok}, noToken},
		{"both headers, two tokens", []string{"Authorization", "Bearer " + tok, "x-api-key", d.token}, twoTokens},
		{"x-api-key twice", []string{"x-api-key", tok, "x-api-key", tok}, twoTokens},
		{"bearer twice", []string{"Authorization", "Bearer " + tok, "Authorization", "Bearer " + tok}, twoTokens},
		{"a list in one header", []string{"x-api-key", tok + "," + d.token}, twoTokens},
		{"unknown bearer", []string{"Authorization", "Bearer brama_nope"}, unknown},
		{"unknown x-api-key", []string{"x-api-key", "brama_nope"}, unknown},
		{"x-api-key with a scheme", []string{"x-api-key", "Bearer " + tok}, unknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := d.call("GET", "/v1/aliases", "", "", tc.hdr...)
			if tc.want == "" {
				if status != 200 {
					t.Fatalf("status %d, want 200: %s", status, body)
				}
				return
			}
			if e := envelopeOf(t, body); status != 401 || e["code"] != "unauthenticated" || e["message"] != tc.want {
				t.Errorf("%d %v, want 401 unauthenticated %q", status, e, tc.want)
			}
			for _, s := range []string{tok, d.token, "brama_nope", "app", "local"} {
				if strings.Contains(string(body), s) {
					t.Errorf("the refusal quotes a token or names a client (%q): %s", s, body)
				}
			}
		})
	}
}

func TestMaxRequestBytes(t *testing.T) {
	big := strings.Repeat("x", 4000) // the provider's answer is larger than the caller's limit
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, big)
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	env["BRAMA_MAX_REQUEST_BYTES"] = "1024"
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	const head, tail = `{"model":"openai/gpt-test","messages":[{"role":"user","content":"`, `"}]}`
	pad := func(n int) string { // a chat body of exactly n bytes
		return head + strings.Repeat("u", n-len(head)-len(tail)) + tail
	}
	tests := []struct {
		name    string
		body    string
		chunked bool
		want    int
	}{
		{"at the limit", pad(1024), false, 200},
		{"one byte over", pad(1025), false, 413},
		{"chunked over", pad(5000), true, 413},
		{"chunked within", pad(900), true, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := fake.calls.Load()
			var rd io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				rd = io.MultiReader(rd) // no length known: sent chunked
			}
			req, _ := http.NewRequest("POST", d.url+"/v1/chat/completions", rd)
			req.Header.Set("Authorization", "Bearer "+d.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, tc.want, b)
			}
			calls := fake.calls.Load() - before
			if tc.want == 413 {
				if e := envelopeOf(t, b); e["code"] != "invalid_request" || !strings.Contains(fmt.Sprint(e["message"]), "BRAMA_MAX_REQUEST_BYTES") {
					t.Errorf("refusal %v, want invalid_request naming BRAMA_MAX_REQUEST_BYTES", e)
				}
				if calls != 0 {
					t.Errorf("%d provider calls for an oversized body, want 0", calls)
				}
			} else if !strings.Contains(string(b), big) {
				t.Errorf("the provider's %d-byte answer was not relayed whole", len(big))
			}
		})
	}
	_, errOut, code := runCLI(t, map[string]string{"BRAMA_STATE_DIR": t.TempDir(), "BRAMA_MAX_REQUEST_BYTES": "lots"}, "", "serve", "-addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errOut, "BRAMA_MAX_REQUEST_BYTES") {
		t.Errorf("serve with BRAMA_MAX_REQUEST_BYTES=lots: exit %d %s, want 1 naming it", code, errOut)
	}
}

func TestPerfEntriesOnlyForServedRoutes(t *testing.T) {
	var down atomic.Bool
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if down.Load() {
			w.WriteHeader(503)
			return
		}
		var req struct{ Model string }
		json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "application/json")
		if req.Model != "gpt-test" {
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"message":"The model does not exist","type":"invalid_request_error","code":"model_not_found"}}`)
			return
		}
		io.WriteString(w, protocolFixtures[0].buffered)
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	for i := range 50 {
		if status, _, body := d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, fmt.Sprintf("openai/u%d-invented", i), false, "")); status < 400 {
			t.Fatalf("invented model answered %d: %s", status, body)
		}
	}
	for _, ok := range []bool{true, false} {
		down.Store(!ok) // one success creates the entry; a failure then counts on it
		d.call("POST", "/v1/chat/completions", d.token, chatBody(dialectChat, "openai/gpt-test", false, ""))
	}
	_, _, metrics := d.call("GET", "/metrics", d.token, "")
	if strings.Contains(string(metrics), "invented") {
		t.Errorf("/metrics holds entries for routes that never served:\n%s", metrics)
	}
	want := `brama_route_requests_total{route="openai/gpt-test"} 2` + "\n"
	if !strings.Contains(string(metrics), want) || !strings.Contains(string(metrics), `brama_route_failures_total{route="openai/gpt-test"} 1`) {
		t.Errorf("/metrics lacks the served route's two requests and one failure:\n%s", metrics)
	}
}

func TestPathAgentIDs(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	for _, rt := range []struct{ method, path string }{
		{"GET", "/v1/admin/subscriptions/%2e%2e"},
		{"GET", "/v1/admin/subscriptions/%2E"},
		{"GET", "/v1/subscriptions/%2e%2e"},
		{"GET", "/v1/admin/subscriptions/A1"},
		{"POST", "/v1/admin/subscriptions/a%2fb"},
		{"DELETE", "/v1/admin/subscriptions/a_1/sub_0123456789abcdef"},
		{"POST", "/v1/admin/subscriptions/" + strings.Repeat("a", 65) + "/sub_0123456789abcdef/reinstate"},
		{"PUT", "/v1/admin/subscriptions/%20/sub_0123456789abcdef/credential"},
		{"POST", "/v1/admin/subscriptions/%2e%2e/sub_0123456789abcdef/probe"},
		{"DELETE", "/v1/subscriptions/%2e%2e/sub_0123456789abcdef"},
	} {
		t.Run(rt.method+" "+rt.path, func(t *testing.T) {
			status, _, body := d.call(rt.method, rt.path, d.token, "{}")
			if status != 400 {
				t.Fatalf("status %d, want 400: %s", status, body)
			}
			if e := envelopeOf(t, body); e["code"] != "invalid_request" || !strings.Contains(fmt.Sprint(e["message"]), "agent id") {
				t.Errorf("refusal %v, want invalid_request naming the agent id", e)
			}
		})
	}
	if status, _, body := d.call("GET", "/v1/admin/subscriptions/a1", d.token, ""); status != 200 {
		t.Errorf("a valid agent id: %d %s", status, body)
	}
}

// requestLine finds the one request log line whose field key is value.
func requestLine(t *testing.T, logs, key, value string) map[string]any {
	t.Helper()
	for _, l := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" && m[key] == value {
			return m
		}
	}
	t.Fatalf("no request log line with %s=%q in:\n%s", key, value, logs)
	return nil
}

func TestOptionsStar(t *testing.T) {
	d := startDaemon(t, stateEnv(t), "")
	c := rawConn(t, d, "OPTIONS * HTTP/1.1\r\nHost: brama\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || envelopeOf(t, b)["code"] != "not_found" {
		t.Errorf("OPTIONS *: %d %s, want 404 not_found in the envelope", resp.StatusCode, b)
	}
	id := resp.Header.Get("X-Request-Id")
	if id == "" {
		t.Fatal("OPTIONS * has no X-Request-Id")
	}
	c.Close()
	d.stop() // the log line is written before serve returns
	if l := requestLine(t, d.stderr.String(), "request_id", id); l["method"] != "OPTIONS" || l["outcome"] != "not_found" || l["status"] != 404.0 {
		t.Errorf("log line %v, want method OPTIONS, outcome not_found and status 404", l)
	}
}

// TestShutdownDrainsThenCuts, on the real binary: at the first SIGTERM
// serve stops taking requests and a running request, buffered or streamed,
// goes on to its end, with no grace period of Brama's own (SPEC §7.4); a
// second SIGTERM cuts it, logged server_shutdown.
func TestShutdownDrainsThenCuts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and signals the real binary")
	}
	bin := builtBinary(t)
	frames := strings.SplitAfter(fixture(t, "openai-chat.sse"), "\n\n")
	for _, tc := range []struct {
		name        string
		stream, cut bool
		sig         syscall.Signal // 0: SIGTERM
		nohup       bool           // started with SIGHUP ignored, as nohup does: a SIGHUP first is no signal
	}{
		{"a stream drains", true, false, 0, false},
		{"a stream is cut", true, true, 0, false},
		{"a buffered request drains", false, false, 0, false},
		{"a buffered request is cut", false, true, 0, false},
		{"a stream drains at SIGHUP (a closed terminal)", true, false, syscall.SIGHUP, false},
		{"a stream is cut at the second SIGHUP", true, true, syscall.SIGHUP, false},
		{"under nohup a SIGHUP then a SIGTERM drains", true, false, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrived, rest, hungUp := make(chan struct{}), make(chan struct{}), make(chan struct{})
			fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if tc.stream {
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, frames[0]+frames[1])
					w.(http.Flusher).Flush()
				}
				close(arrived)
				select { // a long generation: it goes on when the test says so
				case <-rest:
					if tc.stream {
						io.WriteString(w, strings.Join(frames[2:], ""))
					} else {
						io.WriteString(w, protocolFixtures[0].buffered)
					}
				case <-r.Context().Done():
					close(hungUp)
				}
			})
			cmd := exec.Command(bin, "serve", "-addr", "127.0.0.1:0", "-local-credentials-stdin")
			if tc.nohup { // an ignored signal stays ignored across exec
				cmd = exec.Command("sh", "-c", `trap "" HUP; exec "$0" "$@"`, bin, "serve", "-addr", "127.0.0.1:0", "-local-credentials-stdin")
			}
			stdout, stderr := startOpenAIServe(t, cmd, fake.URL)
			logs := make(chan string, 64)
			go func() {
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					logs <- sc.Text()
				}
				close(logs)
			}()
			waitLog := func(sub string) string {
				t.Helper()
				for line := range logs {
					if strings.Contains(line, sub) {
						return line
					}
				}
				t.Fatalf("serve's log ended without %q", sub)
				return ""
			}
			token := strings.TrimSpace(strings.SplitN(waitLog("(shown once): "), "(shown once): ", 2)[1])
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatalf("serve did not start: %v", err)
			}
			d := &daemon{t: t, url: strings.TrimSpace(strings.TrimPrefix(line, "listening on "))}
			answer := make(chan string, 1) // the caller's whole answer, or its error
			go func() {
				req, _ := http.NewRequest("POST", d.url+"/v1/chat/completions", strings.NewReader(chatBody(dialectChat, "openai/gpt-test", tc.stream, "")))
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					answer <- err.Error()
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				answer <- fmt.Sprint(resp.StatusCode, " ", resp.Header.Get("X-Request-Id"), " ", string(b), err)
			}()
			<-arrived
			sig := cmp.Or(tc.sig, syscall.SIGTERM)
			if tc.nohup {
				cmd.Process.Signal(syscall.SIGHUP)
			}
			cmd.Process.Signal(sig)
			waitLog(`"msg":"serve_draining"`)
			want := `"outcome":"ok"`
			if tc.cut {
				cmd.Process.Signal(sig)
				<-hungUp // the provider call was cancelled
				want = `"outcome":"server_shutdown"`
				<-answer
			} else {
				close(rest)
				end := `"finish_reason":"tool_calls"` // the buffered answer's
				if tc.stream {
					end = "data: [DONE]"
				}
				if got := <-answer; !strings.HasPrefix(got, "200 ") || !strings.Contains(got, end) {
					t.Errorf("the request did not run to its end while draining: %s", got)
				}
			}
			if l := waitLog(`"msg":"request"`); !strings.Contains(l, want) {
				t.Errorf("request log line %s, want %s", l, want)
			}
			for range logs {
			}
			if err := cmd.Wait(); err != nil {
				t.Errorf("serve exited with %v, want 0", err)
			}
		})
	}
}

// An agent refusal decided by the headers (bearer-bound and path agent
// disagreeing, a bad path agent id, no agent for an agent's route) is
// answered before the body is read, and the connection closed (SPEC §7.4).
func TestAgentRefusalsBeforeTheBody(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	bound := addClient(t, env, "bound", "-agent", "a1")
	caller := addClient(t, env, "app")
	tests := []struct {
		name, head string
		want       int
	}{
		{"path agent differs from the bearer's", "POST /v1/subscriptions/a2 HTTP/1.1\r\nAuthorization: Bearer " + bound + "\r\n", 403},
		{"no agent for an agent's route", "POST /v1/subscriptions/a1 HTTP/1.1\r\nAuthorization: Bearer " + caller + "\r\n", 403},
		{"bad path agent id", "POST /v1/admin/subscriptions/A1 HTTP/1.1\r\nAuthorization: Bearer " + d.token + "\r\n", 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, d, tc.head+"Host: brama\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n")
			c.SetReadDeadline(time.Now().Add(10 * time.Second)) // the test's bound, never reached when the body is not awaited
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer while the body was still open: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.want || !resp.Close {
				t.Errorf("%d close=%v %s, want %d with Connection: close", resp.StatusCode, resp.Close, b, tc.want)
			}
			// A whole small body, already in the server's buffer, changes nothing: the header says the same.
			c = rawConn(t, d, tc.head+"Host: brama\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			if resp, err = http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != tc.want || !resp.Close {
				t.Errorf("with a whole body: %v, %v; want %d with Connection: close", resp, err, tc.want)
			}
		})
	}
}

// A request without a body has nothing left to read: its answer keeps the connection, and the log line gives the
// answer's status, also when a handler wrote its body without a status of its own.
func TestBodilessRequestKeepsTheConnection(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	resp, err := http.Get(d.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Errorf("GET /health: %d close=%v, want 200 without Connection: close", resp.StatusCode, resp.Close)
	}
	_, metrics, _ := d.call("GET", "/metrics", d.token, "") // written without a WriteHeader of its own
	d.stop()                                                // every request has written its log line
	for _, id := range []string{resp.Header.Get("X-Request-Id"), metrics.Get("X-Request-Id")} {
		if l := requestLine(t, d.stderr.String(), "request_id", id); l["status"] != 200.0 {
			t.Errorf("%s log line status %v, want 200", l["path"], l["status"])
		}
	}
}

// TestServeSurvivesAClosedLogReader, on the real binary: serve's log read by
// a pipe (`brama serve 2>&1 | logger`) whose reader is gone must not end the
// process at its next log line, cutting the generations it is running; the
// log lines are lost, the answers are not.
func TestServeSurvivesAClosedLogReader(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	fx := protocolFixtures[0]
	fake := fixtureProvider(t, fx)
	cmd := exec.Command(builtBinary(t), "serve", "-addr", "127.0.0.1:0", "-local-credentials-stdin")
	stdout, stderr := startOpenAIServe(t, cmd, fake.URL)
	var token string
	for sc := bufio.NewScanner(stderr); token == "" && sc.Scan(); {
		if _, tok, ok := strings.Cut(sc.Text(), "(shown once): "); ok {
			token = strings.TrimSpace(tok)
		}
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || token == "" {
		t.Fatalf("serve did not start: %v", err)
	}
	stderr.Close() // the log's reader is gone
	d := &daemon{t: t, url: strings.TrimSpace(strings.TrimPrefix(line, "listening on "))}
	for i := range 3 {
		req, _ := http.NewRequest("POST", d.url+"/v1/chat/completions", strings.NewReader(chatBody(dialectChat, "openai/gpt-test", false, "")))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("request %d after the log reader left: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d after the log reader left: %d", i, resp.StatusCode)
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve exited with %v, want 0", err)
	}
}

// startOpenAIServe starts cmd, the real binary's `serve -local-credentials-stdin`
// or a wrapper of it, with a fresh state directory and one openai key toward
// baseURL; it is killed when the test ends.
func startOpenAIServe(t *testing.T, cmd *exec.Cmd, baseURL string) (stdout, stderr io.ReadCloser) {
	t.Helper()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "BRAMA_STATE_DIR=" + t.TempDir(), "BRAMA_MODEL_CATALOG_URL=off", "BRAMA_PROVIDER_OPENAI_BASE_URL=" + baseURL}
	cmd.Stdin = strings.NewReader(`{"openai":"k"}`)
	stdout, _ = cmd.StdoutPipe()
	stderr, _ = cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return stdout, stderr
}

// TestCutRequestLogsServerShutdown, in process: a request still running when the second stop signal cuts it is
// logged server_shutdown, its provider call cancelled (TestShutdownDrainsThenCuts shows the same on the binary).
func TestCutRequestLogsServerShutdown(t *testing.T) {
	arrived, hungUp := make(chan struct{}), make(chan struct{})
	prov := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		close(arrived)
		<-r.Context().Done()
		close(hungUp)
	})
	env := stateEnv(t)
	d := startDaemon(t, env, providerEnv(env, map[string]*fakeProvider{"openai": prov}), "-local-credentials-stdin")
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", d.url+"/v1/chat/completions", strings.NewReader(chatBody(dialectChat, "openai/gpt-test", false, "")))
		req.Header.Set("Authorization", "Bearer "+d.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	<-arrived
	stopped := make(chan struct{})
	go func() { d.stop(); close(stopped) }()
	d.stderr.waitFor(t, `"msg":"serve_draining"`)
	d.cut()
	<-hungUp
	<-stopped
	<-answered
	if l := requestLines(d.stderr.String(), "/v1/chat/completions"); len(l) != 1 || l[0]["outcome"] != "server_shutdown" {
		t.Errorf("request log lines %v, want one with outcome server_shutdown", l)
	}
}
