package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// referenceBlock is the README block between the marker line and the end
// of the fenced block that follows it: one entry per code, separated by a
// blank line, each "STATUS CODE x-should-retry: V[ Retry-After: N]" then
// the body. TestErrorReferenceBodies keeps it equal to what serve answers.
func referenceBlock(t *testing.T, marker string) map[string]string {
	t.Helper()
	readme, err := os.ReadFile("ERRORS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), marker)
	if !ok {
		t.Fatalf("ERRORS.md has no %q block", marker)
	}
	_, rest, _ = strings.Cut(rest, "```text\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("ERRORS.md: the %q block is not fenced", marker)
	}
	entries := map[string]string{}
	for _, e := range strings.Split(strings.TrimSpace(block), "\n\n") {
		if e == "" {
			continue
		}
		head := strings.Fields(e)
		if len(head) < 2 {
			t.Fatalf("ERRORS.md: a reference entry without status and code: %q", e)
		}
		entries[head[1]] = e
	}
	return entries
}

var (
	loopbackPort = regexp.MustCompile(`127\.0\.0\.1:\d+`)
	subID        = regexp.MustCompile(`sub_[0-9a-f]{16}`)
)

// referenceEntry is what README shows for one answer: the status, code,
// x-should-retry and Retry-After, then the body with ports and ids
// normalized.
func referenceEntry(status int, hdr http.Header, body []byte) string {
	e := map[string]any{}
	code := "?"
	if err := json.Unmarshal(body, &e); err == nil {
		if inner, ok := e["error"].(map[string]any); ok {
			code, _ = inner["code"].(string)
		}
	}
	head := fmt.Sprintf("%d %s x-should-retry: %s", status, code, hdr.Get("X-Should-Retry"))
	if ra := hdr.Get("Retry-After"); ra != "" {
		head += " Retry-After: " + ra
	}
	b := strings.TrimSpace(string(body))
	b = loopbackPort.ReplaceAllString(b, "127.0.0.1:PORT")
	b = subID.ReplaceAllString(b, "sub_0123456789abcdef")
	return head + "\n" + b
}

// TestErrorReferenceBodies: README "Errors" shows, for every code of the
// table, the body a real `brama serve` answers over HTTP, with its status,
// x-should-retry and Retry-After, so the reference cannot drift from the
// code. On a mismatch it prints the entry README should hold.
func TestErrorReferenceBodies(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	testingOnlyNow = clock.now
	defer func() { testingOnlyNow = nil }()
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = referenceProvider(t).URL
	kimi := newKeyedFake(t, map[string]string{"k401": "401", "k429": "429"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = kimi.URL
	started := make(chan struct{}, 1)
	hanging := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		started <- struct{}{}
		<-r.Context().Done() // answers only when Brama gives up the call
	})
	env["BRAMA_PROVIDER_GROQ_BASE_URL"] = hanging.URL

	d, app, reauth, blocked := refusalScene(t, env, `{"openai":"`+plantedOpenAIKey+`","groq":"gsk-reference"}`)
	chat := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
	}
	if s, _, b := d.call("POST", "/v1/chat/completions", blocked, chat("kimi/k2")); s != 429 {
		t.Fatalf("blocking a2's subscription: %d %s", s, b)
	}
	clock.advance(20 * time.Second) // the block (Retry-After: 120) has 100 s left

	got := map[string]string{}
	record := func(status int, hdr http.Header, body []byte) {
		e := referenceEntry(status, hdr, body)
		got[strings.Fields(e)[1]] = e
	}
	for _, tc := range []struct {
		method, path, token, body string
		hdr                       []string
	}{
		{"POST", "/v1/chat/completions", d.token, "{", nil},
		{"POST", "/v1/chat/completions", "", chat("openai/gpt-ok"), nil},
		{"GET", "/v1/admin/routes", app, "", nil},
		{"POST", "/v1/chat/completions", d.token, chat("ghost"), nil},
		{"GET", "/v1/nothing", d.token, "", nil},
		{"POST", "/health", "", "", nil},
		{"POST", "/v1/chat/completions", d.token, answerBody("b"), []string{"Idempotency-Key", "taken"}},
		{"POST", "/v1/chat/completions", d.token, chat("openai/gpt-429"), nil},
		{"POST", "/v1/chat/completions", blocked, chat("kimi/k2"), nil},
		{"POST", "/v1/chat/completions", d.token, answerBody("x"), []string{"Idempotency-Key", "abandoned"}},
		{"POST", "/v1/chat/completions", d.token, chat("openai/gpt-400"), nil},
		{"POST", "/v1/chat/completions", d.token, chat("openai/gpt-bad"), nil},
		{"POST", "/v1/chat/completions", d.token, chat("openai/gpt-cut"), nil},
		{"POST", "/v1/chat/completions", d.token, chat("openai/gpt-quota"), nil},
		{"POST", "/v1/chat/completions", d.token, chat("nokey"), nil},
		{"POST", "/v1/chat/completions", d.token, chat("mistral/x"), nil},
		{"POST", "/v1/chat/completions", reauth, chat("kimi/k2"), nil},
		{"POST", "/v1/chat/completions", d.token, chat("openai/gpt-500"), nil},
		{"POST", "/v1/chat/completions", d.token, chat("openai/gpt-504"), nil},
	} {
		record(d.call(tc.method, tc.path, tc.token, tc.body, tc.hdr...))
	}

	// client_cancelled: the caller hangs up while the call is in flight; the
	// kept signed answer is what the key sent again gets.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", d.url+"/v1/chat/completions", strings.NewReader(chat("groq/llama")))
	req.Header.Set("Authorization", "Bearer "+d.token)
	req.Header.Set("Idempotency-Key", "hung-up")
	if err := hangUpAfter(req, cancel, started); !errors.Is(err, context.Canceled) {
		t.Fatalf("the hung-up request: %v", err)
	}
	for i := 0; ; i++ { // 409 while the hung-up request is still being kept
		status, hdr, body := d.call("POST", "/v1/chat/completions", d.token, chat("groq/llama"), "Idempotency-Key", "hung-up")
		if status != 409 {
			hdr.Del("Brama-Answer-Replayed")
			record(status, hdr, body)
			break
		}
		if i == 10000 {
			t.Fatalf("the hung-up answer was never kept: %d %s", status, body)
		}
	}

	// secure_transport_required: plain HTTP from a peer that is not loopback.
	if ip := nonLoopbackIP(); ip == "" {
		t.Log("no non-loopback interface: secure_transport_required not checked over HTTP here")
	} else {
		remote := startDaemon(t, stateEnv(t), "", "-addr", net.JoinHostPort(ip, "0"))
		record(remote.call("GET", "/v1/aliases", "", ""))
	}

	want := referenceBlock(t, "<!-- error bodies: TestErrorReferenceBodies -->")
	var codesSeen []string
	for code := range codes {
		codesSeen = append(codesSeen, code)
	}
	sort.Strings(codesSeen)
	for _, code := range codesSeen {
		g, ok := got[code]
		switch {
		case !ok && code == "secure_transport_required":
		case !ok:
			t.Errorf("no request above produced %s", code)
		case want[code] != g:
			t.Errorf("ERRORS.md's %s entry:\n%s\nserve answers:\n%s", code, want[code], g)
		}
		if _, ok := want[code]; !ok {
			t.Errorf("ERRORS.md's error reference has no %s entry", code)
		}
	}
	for code := range want {
		if _, ok := codes[code]; !ok {
			t.Errorf("ERRORS.md's error reference shows %s, which is not in the code table", code)
		}
	}
	assertNoSecret(t, plantedOpenAIKey, d.stderr.String(), env["BRAMA_STATE_DIR"])
}

// referenceProvider answers as OpenAI does for the models the reference
// shows: gpt-400 a context-length refusal quoting the presented key,
// gpt-429 a rate limit with Retry-After, gpt-quota insufficient_quota,
// gpt-500 and gpt-504 server errors, gpt-bad a body that is not JSON,
// gpt-cut a connection closed before any answer.
func referenceProvider(t *testing.T) *fakeProvider {
	return newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req struct {
			Model string `json:"model"`
		}
		json.Unmarshal(body, &req)
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		openaiError := func(status int, typ, code, msg string) {
			b, _ := json.Marshal(map[string]any{"error": map[string]string{"message": msg, "type": typ, "code": code}})
			http.Error(w, string(b), status)
		}
		switch req.Model {
		case "gpt-400":
			openaiError(400, "invalid_request_error", "context_length_exceeded", "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. (key "+key+")")
		case "gpt-429":
			w.Header().Set("Retry-After", "7")
			openaiError(429, "requests", "rate_limit_exceeded", "Rate limit reached for gpt-4o on requests per min (RPM): Limit 500, Used 500.")
		case "gpt-quota":
			openaiError(429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota, please check your plan and billing details.")
		case "gpt-500":
			openaiError(500, "server_error", "", "The server had an error while processing your request.")
		case "gpt-504":
			http.Error(w, "<html>504 Gateway Time-out</html>", 504)
		case "gpt-bad":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "<html>not an answer</html>")
		case "gpt-cut":
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		default:
			okAnswer(w)
		}
	})
}

// nonLoopbackIP is an IPv4 address of this machine that is not loopback,
// or "" when it has none.
func nonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}

// TestRunbookFullDisk follows README "Runbook", "A full disk": a state write
// that fails for want of space (injected where the atomic writer renames,
// as TestAdminRouteWriteRenameFails does) answers 500 internal_error, logs
// request_refused with the cause, leaves the file as it was and no
// temporary file; once space is free the same command succeeds with no
// repair and no restart.
func TestRunbookFullDisk(t *testing.T) {
	env := stateEnv(t)
	d := startDaemon(t, env, "")
	path := filepath.Join(env["BRAMA_STATE_DIR"], "routes.json")
	put := `{"alias":"chat","route":"openai/gpt-4o"}`
	testingOnlyRename = func(string, string) error {
		return &os.LinkError{Op: "rename", Err: syscall.ENOSPC}
	}
	defer func() { testingOnlyRename = nil }()
	s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put)
	if s != 500 || envelopeOf(t, b)["code"] != "internal_error" {
		t.Errorf("PUT on a full disk: %d %s, want 500 internal_error", s, b)
	}
	if logs := d.stderr.String(); !strings.Contains(logs, `"msg":"request_refused"`) || !strings.Contains(logs, "no space left on device") {
		t.Errorf("the operator sees no request_refused line naming the full disk:\n%s", logs)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed write left routes.json behind: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
	testingOnlyRename = nil // the operator freed space
	if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, put); s != 200 {
		t.Fatalf("the same PUT once space is free: %d %s", s, b)
	}
	if s, _, b := d.call("GET", "/v1/aliases", d.token, ""); s != 200 || !strings.Contains(string(b), `"alias":"chat"`) {
		t.Errorf("the alias written after the repair: %d %s", s, b)
	}
}
