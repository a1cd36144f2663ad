// Command fake is the recording provider behind examples/clients: one
// loopback server standing in for every upstream Brama calls while real
// clients (Claude Code, the Codex CLI, the official SDKs) talk to Brama.
//
// Roles, by path prefix (point Brama's BRAMA_PROVIDER_<ID>_BASE_URL at them):
//
//	/anthropic/v1/messages[/count_tokens]  anthropic (x-api-key)
//	/claude-code/v1/messages[/count_tokens] claude-code: refuses 401 unless
//	    Authorization is "Bearer fake-cc-access", anthropic-beta holds
//	    oauth-2025-04-20 and the first system block is Claude Code's prefix
//	/openai/v1/chat/completions, /openai/v1/responses  openai, openai-responses
//	/codex/responses  the ChatGPT codex backend: refuses 400 {"detail":…}
//	    unless SPEC §6.2's headers and body rules hold
//	/oauth/token  a token endpoint that answers every grant
//
// Answers follow the request: a conversation ending in a tool result gets a
// text quoting it; a request offering the scripted tool gets a call to it;
// a request with a JSON schema (response_format, text.format,
// output_format / output_config.format, or a forced tool) gets JSON of that
// schema; anything else gets a short text. Buffered or SSE as asked.
//
// Control (the harness's, never Brama's): POST /_script with
// {"tool","args","fail","match","retry_after"} replaces the script and
// forgets the recorded calls; GET /_calls lists every call since then
// (role, method, path, query, headers, raw body, what was answered).
// "fail" is one of 400, 401, 422, 429, 500, cut, malformed and applies to
// calls whose raw body contains "match" (every call when empty). "calls"
// adds parallel tool calls, "say" a text before them, "think" a reasoning
// block before the answer, "finish":"length" ends it at the output limit,
// "hold" stops a stream halfway until the caller hangs up; "fail":"inband"
// sends half a stream, then the format's own error event.
//
// It prints "listening on http://ADDR" and serves until interrupted.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "`address` to listen on")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	f := &fake{}
	go http.Serve(ln, f)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
}

// script is what the harness asks the fake to do next.
type script struct {
	Tool       string         `json:"tool"`        // tool to call when a request offers it
	Args       string         `json:"args"`        // its arguments, a JSON object text
	Calls      []scriptedCall `json:"calls"`       // more calls, in parallel, to tools the request offers
	Think      string         `json:"think"`       // reasoning the answer shows first (thinking block, reasoning item)
	Say        string         `json:"say"`         // text before the tool calls
	Finish     string         `json:"finish"`      // "length": the answer ends at its output limit
	Hold       bool           `json:"hold"`        // a stream stops halfway until the caller hangs up
	Interleave bool           `json:"interleave"`  // a chat stream's parallel calls interleave their arguments
	Fail       string         `json:"fail"`        // 400, 401, 422, 429, 500, cut, malformed, inband
	Match      string         `json:"match"`       // fail only calls whose body contains this
	RetryAfter string         `json:"retry_after"` // Retry-After on a 429 or 500
}

// scriptedCall is one tool call the script asks for.
type scriptedCall struct {
	Tool string `json:"tool"`
	Args string `json:"args"`
	ID   string `json:"id"` // the call id to answer with ("" the fake's own)
}

// call is one recorded request.
type call struct {
	Role    string            `json:"role"`
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Query   string            `json:"query"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	Answer  string            `json:"answer"`
	Status  int               `json:"status"`
	Reply   string            `json:"reply"` // the bytes the fake wrote back
}

// recorder keeps what the fake writes back, for the harness to compare
// with what the caller received.
type recorder struct {
	http.ResponseWriter
	status int
	buf    []byte
}

func (rw *recorder) WriteHeader(code int) {
	if rw.status == 0 {
		rw.status = code
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *recorder) Write(b []byte) (int, error) {
	if rw.status == 0 {
		rw.status = 200
	}
	rw.buf = append(rw.buf, b...)
	return rw.ResponseWriter.Write(b)
}

func (rw *recorder) Flush() { rw.ResponseWriter.(http.Flusher).Flush() }

type fake struct {
	mu    sync.Mutex // guards sc, calls
	sc    script
	calls []call
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/_script":
		var sc script
		if err := json.NewDecoder(r.Body).Decode(&sc); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		f.mu.Lock()
		f.sc, f.calls = sc, nil
		f.mu.Unlock()
		return
	case "/_calls":
		f.mu.Lock()
		b, _ := json.Marshal(append([]call{}, f.calls...)) // [] when none
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
		return
	}
	raw, _ := io.ReadAll(r.Body)
	role, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	c := call{Role: role, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Headers: map[string]string{}, Body: string(raw)}
	for k, v := range r.Header {
		c.Headers[strings.ToLower(k)] = strings.Join(v, ", ")
	}
	f.mu.Lock()
	sc := f.sc
	f.mu.Unlock()
	rw := &recorder{ResponseWriter: w}
	c.Answer = f.serve(rw, r, role, "/"+rest, raw, sc)
	c.Status, c.Reply = rw.status, string(rw.buf)
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	if c.Answer == "cut" {
		panic(http.ErrAbortHandler) // close the connection mid-answer
	}
}

// serve answers one provider call and says how (for the record).
func (f *fake) serve(w http.ResponseWriter, r *http.Request, role, path string, raw []byte, sc script) string {
	var body map[string]any
	if r.Method == "POST" && path != "/token" {
		if err := json.Unmarshal(raw, &body); err != nil {
			return refuse(w, role, 400, "body is not a JSON object")
		}
	}
	format := ""
	switch {
	case role == "oauth" && path == "/token":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"access_token":"fake-refreshed-access","refresh_token":"fake-refreshed-refresh","expires_in":86400}`)
		return "token"
	case (role == "anthropic" || role == "claude-code") && path == "/v1/messages/count_tokens":
		if why := checkRole(r, role, body); why != "" {
			return refuse(w, role, 401, why)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"input_tokens":42}`)
		return "count_tokens"
	case (role == "anthropic" || role == "claude-code") && path == "/v1/messages":
		format = "messages"
	case role == "openai" && path == "/v1/chat/completions":
		format = "chat"
	case role == "openai" && path == "/v1/responses", role == "codex" && path == "/responses":
		format = "responses"
	default:
		return refuse(w, role, 404, "no such path "+r.Method+" "+r.URL.Path)
	}
	if why := checkRole(r, role, body); why != "" {
		status := 401
		if role == "codex" {
			status = 400
		}
		return refuse(w, role, status, why)
	}
	if sc.Fail != "" && (sc.Match == "" || strings.Contains(string(raw), sc.Match)) {
		stream, _ := body["stream"].(bool)
		return fail(w, role, format, sc, stream)
	}
	a := decide(format, body, sc)
	stream, _ := body["stream"].(bool)
	model, _ := body["model"].(string)
	so, _ := body["stream_options"].(map[string]any)
	a.noUsage = format == "chat" && so["include_usage"] != true
	if sc.Hold && stream {
		return hold(w, r, format, model, a)
	}
	render(w, format, model, a, stream)
	return a.kind
}

// hold streams the first half of the answer, then waits for the caller to
// hang up (at most 20 s): "hung-up" when it did, "held" when it did not.
func hold(w http.ResponseWriter, r *http.Request, format, model string, a answer) string {
	w.Header().Set("Content-Type", "text/event-stream")
	evs := events(format, model, a)
	for _, e := range evs[:len(evs)/2] {
		writeEvent(w, e)
	}
	select {
	case <-r.Context().Done():
		return "hung-up"
	case <-time.After(20 * time.Second):
		return "held"
	}
}

const claudeCodePrefix = "You are Claude Code, Anthropic's official CLI for Claude."

// checkRole enforces what each upstream requires of its callers (SPEC §6.2);
// it returns why a call is refused, or "".
func checkRole(r *http.Request, role string, body map[string]any) string {
	switch role {
	case "anthropic":
		if r.Header.Get("x-api-key") != "fake-anthropic-key" {
			return "x-api-key is not the deployment's anthropic key"
		}
		if r.Header.Get("anthropic-version") == "" {
			return "anthropic-version header missing"
		}
	case "claude-code":
		if r.Header.Get("Authorization") != "Bearer fake-cc-access" {
			return "OAuth bearer is not the donated grant's access token"
		}
		if r.Header.Get("x-api-key") != "" {
			return "x-api-key sent beside the OAuth bearer"
		}
		if !strings.Contains(r.Header.Get("anthropic-beta"), "oauth-2025-04-20") {
			return "anthropic-beta lacks oauth-2025-04-20"
		}
		if body != nil && firstSystemText(body["system"]) != claudeCodePrefix {
			return "first system block is not Claude Code's prefix"
		}
	case "openai":
		if r.Header.Get("Authorization") != "Bearer fake-openai-key" {
			return "bearer is not the deployment's openai key"
		}
	case "codex":
		switch {
		case r.Header.Get("Authorization") != "Bearer fake-codex-access":
			return "bearer is not the donated grant's access token"
		case r.Header.Get("chatgpt-account-id") != "acct-fake":
			return "chatgpt-account-id missing or wrong"
		case r.Header.Get("OpenAI-Beta") != "responses=experimental":
			return "OpenAI-Beta is not responses=experimental"
		case r.Header.Get("originator") != "codex_cli_rs":
			return "originator is not codex_cli_rs"
		case body["stream"] != true:
			return "Stream must be set to true"
		case body["store"] != false:
			return "Store must be set to false"
		case body["max_output_tokens"] != nil:
			return "Unsupported parameter: max_output_tokens"
		}
		if s, _ := body["instructions"].(string); s == "" {
			return "Instructions are required"
		}
	}
	return ""
}

func firstSystemText(v any) string {
	switch s := v.(type) {
	case string:
		return s
	case []any:
		if len(s) > 0 {
			if b, ok := s[0].(map[string]any); ok {
				t, _ := b["text"].(string)
				return t
			}
		}
	}
	return ""
}

// refuse answers an error in the role's own error shape.
func refuse(w http.ResponseWriter, role string, status int, msg string) string {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var b []byte
	switch role {
	case "anthropic", "claude-code":
		typ := map[int]string{400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 422: "invalid_request_error", 429: "rate_limit_error", 500: "api_error"}[status]
		b, _ = json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
	case "codex":
		b, _ = json.Marshal(map[string]any{"detail": msg})
	default:
		typ := map[int]string{400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error", 422: "invalid_request_error", 429: "requests", 500: "server_error"}[status]
		b, _ = json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": nil}})
	}
	w.Write(b)
	return fmt.Sprint(status)
}

// fail answers the scripted failure.
func fail(w http.ResponseWriter, role, format string, sc script, stream bool) string {
	switch sc.Fail {
	case "400":
		refuse(w, role, 400, "prompt is too long: 250000 tokens > 200000 maximum")
		return "fail-400"
	case "401":
		refuse(w, role, 401, "invalid x-api-key")
		return "fail-401"
	case "422":
		refuse(w, role, 422, "unprocessable: the fake cannot take this")
		return "fail-422"
	case "429", "500":
		if sc.RetryAfter != "" {
			w.Header().Set("Retry-After", sc.RetryAfter)
		}
		status := 429
		if sc.Fail == "500" {
			status = 500
		}
		refuse(w, role, status, "fake "+sc.Fail+" failure")
		return "fail-" + sc.Fail
	case "malformed":
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "event: message\ndata: {this is not json\n\n")
		} else {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "<html>this is not json</html>")
		}
		return "fail-malformed"
	case "inband":
		if !stream {
			refuse(w, role, 500, "an in-band failure asked of a buffered call")
			return "fail-inband"
		}
		w.Header().Set("Content-Type", "text/event-stream")
		evs := events(format, "fake-model", answer{kind: "text", text: "This answer fails in its stream"})
		for _, e := range evs[:len(evs)/2] {
			writeEvent(w, e)
		}
		switch format {
		case "messages":
			writeEvent(w, event{"error", map[string]any{"type": "error", "error": map[string]any{"type": "overloaded_error", "message": "Overloaded"}}})
		case "chat":
			writeEvent(w, event{"", map[string]any{"error": map[string]any{"message": "The server had an error", "type": "server_error", "code": nil}}})
		default:
			writeEvent(w, event{"error", map[string]any{"type": "error", "code": "server_error", "message": "The server had an error", "sequence_number": 99}})
		}
		return "fail-inband"
	case "cut":
		a := answer{kind: "text", text: "This answer is cut off before its end, mid sentence and mid stream"}
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			evs := events(format, "fake-model", a)
			for _, e := range evs[:len(evs)/2] {
				writeEvent(w, e)
			}
		} else {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "4096")
			w.WriteHeader(200)
			io.WriteString(w, `{"id":"cut","content":[{"type":"text","text":"This answer`)
			w.(http.Flusher).Flush()
		}
		return "cut"
	}
	return refuse(w, role, 500, "unknown scripted failure "+sc.Fail)
}
