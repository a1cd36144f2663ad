package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// End-to-end tests of signed answers (SPEC §12) through a real daemon.
// They need the wiring (handleModel, routes, serve) to pass.

// answerPromptMarker is a planted marker: kept answers and logs must never
// hold the prompt (SPEC §12 item 7).
const answerPromptMarker = "PROMPT-MARKER-7f3a9c"

// okAnswer is the fake openai provider's buffered success.
func okAnswer(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, protocolFixtures[0].buffered)
}

// startAnswers runs a daemon whose openai provider is a counting fake.
func startAnswers(t *testing.T, h func(w http.ResponseWriter, r *http.Request, body []byte)) (*daemon, *fakeProvider, map[string]string) {
	t.Helper()
	fake := newFakeProvider(t, h)
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"`+plantedOpenAIKey+`"}`, "-local-credentials-stdin")
	return d, fake, env
}

// answerFile is where the daemon keeps (client, key)'s answer.
func answerFile(env map[string]string, client, key string) string {
	return filepath.Join(env["BRAMA_STATE_DIR"], "answers", client, hexSHA256([]byte(key))+".json")
}

// readKept is the answer record kept at path.
func readKept(t *testing.T, path string) *answerRecord {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := decodeAnswerRecord(raw)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// answerResult is one request's outcome, for goroutines that must not Fatal.
type answerResult struct {
	status int
	hdr    http.Header
	body   []byte
	err    error
}

func postAnswer(d *daemon, key, body string) answerResult {
	return postAnswerWith(http.DefaultClient, d, key, body)
}

func postAnswerWith(c *http.Client, d *daemon, key, body string) answerResult {
	req, err := http.NewRequest("POST", d.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return answerResult{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return answerResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answerResult{status: resp.StatusCode, hdr: resp.Header, body: b, err: err}
}

// wantConflict checks a §12 409: state_conflict, retryable as given, no
// attempts key.
func wantConflict(t *testing.T, status int, body []byte, retryable bool) {
	t.Helper()
	if status != 409 {
		t.Fatalf("status %d, want 409: %s", status, body)
	}
	e := envelopeOf(t, body)
	if e["code"] != "state_conflict" || e["retryable"] != retryable {
		t.Errorf("got code %v retryable %v, want state_conflict %v: %s", e["code"], e["retryable"], retryable, body)
	}
	if _, ok := e["attempts"]; ok {
		t.Errorf("a §12 409 carries attempts: %s", body)
	}
}

func TestSignedAnswerOneSpend(t *testing.T) {
	d, fake, env := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
	key := "order 42/retry?x=1"
	body := answerBody(answerPromptMarker)
	first := postAnswer(d, key, body)
	if first.err != nil || first.status != 200 {
		t.Fatalf("first: %d %v: %s", first.status, first.err, first.body)
	}
	sig := first.hdr.Get("Brama-Answer-Signature")
	if !isAnswerSignature(sig) || first.hdr.Get("Brama-Answer-Replayed") != "" || first.hdr.Get("Brama-Attempts") != "1" {
		t.Errorf("first answer headers: %v", first.hdr)
	}
	for _, got := range []answerResult{postAnswer(d, key, body), postAnswer(d, key, body)} {
		if got.status != 200 || !bytes.Equal(got.body, first.body) {
			t.Errorf("replay %d differs from the first answer:\n%s\nwant\n%s", got.status, got.body, first.body)
		}
		if got.hdr.Get("Brama-Answer-Replayed") != "true" || got.hdr.Get("Brama-Attempts") != "0" || got.hdr.Get("Brama-Answer-Signature") != sig ||
			got.hdr.Get("Brama-Route") == "" || got.hdr.Get("Brama-Route") != first.hdr.Get("Brama-Route") {
			t.Errorf("replay headers: %v (the first answer's Brama-Route %q)", got.hdr, first.hdr.Get("Brama-Route"))
		}
		id := got.hdr.Get("X-Request-Id") // the log line says what Brama-Attempts said: 0, the key present
		d.stderr.waitFor(t, `"msg":"request","request_id":"`+id)
		if line := requestLine(t, d.stderr.String(), "request_id", id); line["attempts"] != 0.0 {
			t.Errorf("a replay's log line: attempts %v, want 0 (the key present)", line["attempts"])
		}
	}
	if n := fake.calls.Load(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
	other := addClient(t, env, "other") // its keys are its own: the same key is its first answer
	if status, h, b := d.call("POST", "/v1/chat/completions", other, body, "Idempotency-Key", key); status != 200 || h.Get("Brama-Answer-Replayed") != "" || fake.calls.Load() != 2 {
		t.Errorf("another client's request with the key: %d %v %s, want a new answer and call", status, h, b)
	}

	stateDir := env["BRAMA_STATE_DIR"]
	assertOwnerOnly(t, filepath.Join(stateDir, "answers"))
	assertOwnerOnly(t, filepath.Join(stateDir, "answer-key"))
	if k, err := os.ReadFile(filepath.Join(stateDir, "answer-key")); err != nil || len(k) != 32 || bytes.Equal(k, make([]byte, 32)) {
		t.Errorf("answer key %x (%v), want 32 random bytes (SPEC §2)", k, err)
	}
	assertNoSecret(t, answerPromptMarker, logsBesidesFirstStart(d.stderr.String()), stateDir)
	kept := answerFile(env, "local", key)
	rec := readKept(t, kept)
	if rec.State != answerComplete || *rec.Status != 200 || *rec.Attempts != 1 || rec.Route != "openai/gpt-test" || *rec.Signature != sig ||
		rec.RequestSHA256 != hexSHA256([]byte(body)) || rec.KeySHA256 != hexSHA256([]byte(key)) || !bytes.Equal(rec.Body, first.body) {
		t.Errorf("kept record: %+v", rec)
	}

	// brama answers verify: the kept file and the raw body, then one changed byte.
	dir := t.TempDir()
	changed := append([]byte(nil), rec.Body...)
	changed[len(changed)/2] ^= 1
	tampered := *rec
	tampered.Body = changed
	tamperedFile, _ := marshalState(&tampered)
	open := answerRecord{SchemaVersion: 1, State: answerInProgress, BootID: rec.BootID, Client: rec.Client, KeySHA256: rec.KeySHA256,
		RequestSHA256: rec.RequestSHA256, StartedAt: rec.StartedAt, Route: rec.Route}
	openFile, _ := marshalState(&open)
	files := map[string][]byte{"body": rec.Body, "changed": changed, "tampered.json": tamperedFile, "open.json": openFile}
	for name, b := range files {
		os.WriteFile(filepath.Join(dir, name), b, 0o600)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{name: "kept file", args: []string{kept}, code: 0, want: "ok\n"},
		{name: "kept file with a changed body byte", args: []string{filepath.Join(dir, "tampered.json")}, code: 1, want: "brama: signature mismatch\n"},
		{name: "raw body", args: []string{"-signature", sig, filepath.Join(dir, "body")}, code: 0, want: "ok\n"},
		{name: "raw body, flag after file", args: []string{filepath.Join(dir, "body"), "-signature", sig}, code: 0, want: "ok\n"},
		{name: "raw body with a changed byte", args: []string{"-signature", sig, filepath.Join(dir, "changed")}, code: 1, want: "brama: signature mismatch\n"},
		{name: "malformed signature", args: []string{"-signature", "v2=00", filepath.Join(dir, "body")}, code: 2},
		{name: "an answer in progress", args: []string{filepath.Join(dir, "open.json")}, code: 1,
			want: "brama: " + filepath.Join(dir, "open.json") + ": the answer is still in progress; there is no signature to check\n"},
		{name: "a raw body without -signature", args: []string{filepath.Join(dir, "body")}, code: 1,
			want: "brama: " + filepath.Join(dir, "body") + `: not a kept answer: kept answer: json: unknown field "id"` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, env, "", append([]string{"answers", "verify"}, tc.args...)...)
			if code != tc.code || (tc.want != "" && out+errOut != tc.want) {
				t.Errorf("exit %d, output %q %q; want exit %d, %q", code, out, errOut, tc.code, tc.want)
			}
		})
	}
	// Another state directory has no answer key: verify says so, not "signature mismatch".
	if out, errOut, code := runCLI(t, stateEnv(t), "", "answers", "verify", kept); code != 1 || !strings.Contains(errOut, "answer key") {
		t.Errorf("verify without an answer key: exit %d, %q %q; want exit 1 naming the answer key", code, out, errOut)
	}
}

func TestSignedAnswerConcurrent(t *testing.T) {
	release := make(chan struct{})
	d, fake, _ := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		select {
		case <-release:
			okAnswer(w)
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	// Its own transport: 20 concurrent dials can leave a spare connection
	// that never sends a request, which would hold the daemon's Shutdown
	// for 5 s unless closed first (cleanups run last-in, first-out).
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}
	const n = 20
	body := answerBody("concurrent")
	results := make(chan answerResult, n)
	for range n {
		go func() { results <- postAnswerWith(c, d, "same-key", body) }()
	}
	// The winner is held inside the provider, so the other 19 must all be
	// told the answer is still being produced.
	next := func() answerResult {
		select {
		case res := <-results:
			if res.err != nil {
				t.Fatal(res.err)
			}
			return res
		case <-time.After(30 * time.Second): // a hang guard, not synchronization
			t.Fatal("requests hung; more than one reached the provider?")
		}
		return answerResult{}
	}
	for range n - 1 {
		res := next()
		wantConflict(t, res.status, res.body, true)
	}
	close(release)
	won := next()
	if won.status != 200 {
		t.Fatalf("winner: %d %s", won.status, won.body)
	}
	for range n - 1 {
		res := postAnswerWith(c, d, "same-key", body)
		if res.err != nil || res.status != 200 || !bytes.Equal(res.body, won.body) || res.hdr.Get("Brama-Answer-Replayed") != "true" {
			t.Fatalf("retry after completion: %d %v %s", res.status, res.err, res.body)
		}
	}
	if got := fake.calls.Load(); got != 1 {
		t.Errorf("provider calls = %d, want 1", got)
	}
}

func TestSignedAnswerTakenKey(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	d, fake, env := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		arrived <- struct{}{}
		<-release
		okAnswer(w)
	})
	first := make(chan answerResult, 1)
	go func() { first <- postAnswer(d, "k", answerBody("one")) }()
	select {
	case <-arrived:
	case res := <-first:
		close(release)
		t.Fatalf("the first request never reached the provider: %d %s", res.status, res.body)
	}

	assertOwnerOnly(t, answerFile(env, "local", "k")) // the in-progress record, as published
	res := postAnswer(d, "k", answerBody("one"))
	wantConflict(t, res.status, res.body, true)
	res = postAnswer(d, "k", answerBody("two"))
	wantConflict(t, res.status, res.body, false)

	close(release)
	if res := <-first; res.status != 200 {
		t.Fatalf("first: %d %s", res.status, res.body)
	}
	res = postAnswer(d, "k", answerBody("two"))
	wantConflict(t, res.status, res.body, false)
	if n := fake.calls.Load(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
}

// TestSignedAnswerKeepsTheSelectorsRoute: a selector's kept answer names
// the candidate route that answered, and so does its replay (README: the
// kept Brama-Route); the kept file's route is that route.
func TestSignedAnswerKeepsTheSelectorsRoute(t *testing.T) {
	d, env, fake, tok := oneCandidateDaemon(t, "kimi", "kimi/km-a")
	body := chatBody(dialectChat, "any", false, "")
	for i, what := range []string{"first answer", "replay"} {
		status, hdr, b := d.call("POST", "/v1/chat/completions", tok, body, "Idempotency-Key", "sel")
		if status != 200 || hdr.Get("Brama-Route") != "kimi/km-a" || (i == 1) != (hdr.Get("Brama-Answer-Replayed") == "true") {
			t.Errorf("%s: %d Brama-Route %q replayed %q, want 200 kimi/km-a: %s", what, status, hdr.Get("Brama-Route"), hdr.Get("Brama-Answer-Replayed"), b)
		}
	}
	if rec, err := readAnswerFile(answerFile(env, "a1-app", "sel")); err != nil || rec.Route != "kimi/km-a" {
		t.Errorf("kept record: route %q (%v), want kimi/km-a", rec.Route, err)
	}
	if n := fake.count("kimi-1"); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
}

func TestSignedAnswerRefusals(t *testing.T) {
	for _, tc := range []struct {
		name      string
		status    int // the fake provider's
		wantCode  string
		kept      bool
		wantCalls int64 // after the same request twice
	}{
		{name: "retryable refusal is not kept", status: 500, wantCode: "dependency_unavailable", kept: false, wantCalls: 2},
		{name: "non-retryable refusal is kept", status: 400, wantCode: "provider_rejected", kept: true, wantCalls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, fake, env := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				http.Error(w, `{"error":{"type":"invalid_request_error","message":"no"}}`, tc.status)
			})
			first := postAnswer(d, "r", answerBody("x"))
			if e := envelopeOf(t, first.body); e["code"] != tc.wantCode || e["attempts"] != 1.0 {
				t.Fatalf("first: %d %s", first.status, first.body)
			}
			if got := first.hdr.Get("Brama-Answer-Signature") != ""; got != tc.kept {
				t.Errorf("signed = %v, want %v", got, tc.kept)
			}
			_, err := os.Stat(answerFile(env, "local", "r"))
			if kept := err == nil; kept != tc.kept {
				t.Errorf("record kept = %v (%v), want %v", kept, err, tc.kept)
			}
			second := postAnswer(d, "r", answerBody("x"))
			if second.status != first.status || !bytes.Equal(second.body, first.body) {
				t.Errorf("second: %d %s, want %d %s", second.status, second.body, first.status, first.body)
			}
			if replayed := second.hdr.Get("Brama-Answer-Replayed") == "true"; replayed != tc.kept {
				t.Errorf("replayed = %v, want %v", replayed, tc.kept)
			}
			// A replayed kept refusal says x-should-retry like the first answer (SPEC §8.1).
			for _, res := range []answerResult{first, second} {
				if got := res.hdr.Get("X-Should-Retry"); got != fmt.Sprint(!tc.kept) {
					t.Errorf("x-should-retry = %q, want %v", got, !tc.kept)
				}
			}
			if n := fake.calls.Load(); n != tc.wantCalls {
				t.Errorf("provider calls = %d, want %d", n, tc.wantCalls)
			}
			id := second.hdr.Get("X-Request-Id") // a replayed refusal's log line names its code, as the first's
			d.stderr.waitFor(t, `"msg":"request","request_id":"`+id)
			if line := requestLine(t, d.stderr.String(), "request_id", id); line["outcome"] != tc.wantCode || line["retryable"] != !tc.kept {
				t.Errorf("second request's log line: outcome %v retryable %v, want %s %v", line["outcome"], line["retryable"], tc.wantCode, !tc.kept)
			}
		})
	}
}

func TestSignedAnswerRefusedBeforeReservation(t *testing.T) {
	d, fake, env := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
	stream := `{"model":"openai/gpt-test","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name   string
		body   string
		keys   []string
		status int
		code   string
	}{
		{name: "stream", body: stream, keys: []string{"s"}, status: 400, code: "invalid_request"},
		{name: "empty key", body: answerBody("x"), keys: []string{""}, status: 400, code: "invalid_request"},
		{name: "key too long", body: answerBody("x"), keys: []string{strings.Repeat("k", 256)}, status: 400, code: "invalid_request"},
		{name: "non-ASCII key", body: answerBody("x"), keys: []string{"clé"}, status: 400, code: "invalid_request"},
		{name: "tab in key", body: answerBody("x"), keys: []string{"a\tb"}, status: 400, code: "invalid_request"},
		{name: "two keys", body: answerBody("x"), keys: []string{"a", "b"}, status: 400, code: "invalid_request"},
		{name: "unknown model", body: strings.Replace(answerBody("x"), "openai/gpt-test", "ghost", 1), keys: []string{"g"}, status: 404, code: "alias_unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			for _, k := range tc.keys {
				hdr = append(hdr, "Idempotency-Key", k)
			}
			status, h, b := d.call("POST", "/v1/chat/completions", d.token, tc.body, hdr...)
			e := envelopeOf(t, b)
			if status != tc.status || e["code"] != tc.code {
				t.Errorf("got %d %s, want %d %s", status, b, tc.status, tc.code)
			}
			if _, ok := e["attempts"]; ok || h.Get("Brama-Attempts") != "" {
				t.Errorf("a refusal before reservation carries attempts: %v %s", h, b)
			}
		})
	}
	if n := fake.calls.Load(); n != 0 {
		t.Errorf("provider calls = %d, want 0", n)
	}
	if _, err := os.Stat(filepath.Join(env["BRAMA_STATE_DIR"], "answers")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused request left answers behind: %v", err)
	}
}

func TestSignedAnswerWithoutStateDirectory(t *testing.T) {
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
	env := map[string]string{"BRAMA_MODEL_CATALOG_URL": "off", "BRAMA_PROVIDER_OPENAI_BASE_URL": fake.URL}
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	res := postAnswer(d, "k", answerBody("x"))
	e := envelopeOf(t, res.body)
	want := "this request's one signed answer has no place to be kept: $HOME is not defined"
	if res.status != 500 || e["code"] != "internal_error" || e["message"] != want || e["retryable"] != false {
		t.Errorf("got %d %s, want 500 internal_error %q", res.status, res.body, want)
	}
	if _, ok := e["attempts"]; ok || res.hdr.Get("Brama-Attempts") != "" {
		t.Errorf("carries attempts: %v %s", res.hdr, res.body)
	}
	if n := fake.calls.Load(); n != 0 {
		t.Errorf("provider calls = %d, want 0", n)
	}
	if status, _, b := d.call("POST", "/v1/chat/completions", d.token, answerBody("x")); status != 200 {
		t.Errorf("without a key the request is still served: %d %s", status, b)
	}
}

func TestSignedAnswerAbandoned(t *testing.T) {
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	body := answerBody("x")
	old := newAnswerStore(resolveState(testEnv(env)), slog.New(slog.DiscardHandler), time.Now)
	if tk, err := old.reserve(signedOf("k", body, "openai/gpt-test")); err != nil || tk.State != answerInProgress {
		t.Fatalf("reserve in the stopped process: %v %v", tk, err)
	}
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	for _, path := range []string{"first", "again"} {
		res := postAnswer(d, "k", body)
		e := envelopeOf(t, res.body)
		if res.status != 500 || e["code"] != "internal_error" || e["message"] != abandonedMessage || e["retryable"] != false {
			t.Errorf("%s: got %d %s", path, res.status, res.body)
		}
		if _, ok := e["attempts"]; ok || res.hdr.Get("Brama-Answer-Replayed") != "true" || !isAnswerSignature(res.hdr.Get("Brama-Answer-Signature")) {
			t.Errorf("%s: headers %v body %s", path, res.hdr, res.body)
		}
	}
	raw, _ := os.ReadFile(answerFile(env, "local", "k"))
	if rec, err := decodeAnswerRecord(raw); err != nil || rec.State != answerComplete || rec.Attempts != nil {
		t.Errorf("abandoned record: %v %s", err, raw)
	}
	if n := fake.calls.Load(); n != 0 {
		t.Errorf("provider calls = %d, want 0", n)
	}
}

// TestSignedAnswerSurvivesARestart: a kept answer is another process's once serve restarts, and is replayed as kept, never
// taken for an abandoned one (SPEC §12 items 2 and 4): the same body and signature, no call.
func TestSignedAnswerSurvivesARestart(t *testing.T) {
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	first := postAnswer(d, "k", answerBody("x"))
	d.stop()
	d2 := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	d2.token = d.token
	again := postAnswer(d2, "k", answerBody("x"))
	if first.status != 200 || again.status != 200 || string(again.body) != string(first.body) || again.hdr.Get("Brama-Answer-Replayed") != "true" ||
		again.hdr.Get("Brama-Answer-Signature") != first.hdr.Get("Brama-Answer-Signature") || fake.calls.Load() != 1 {
		t.Errorf("after a restart: %d %s (replayed %q), first %d %s; %d provider calls; want the kept answer replayed, 1 call",
			again.status, again.body, again.hdr.Get("Brama-Answer-Replayed"), first.status, first.body, fake.calls.Load())
	}
}

// An abandoned answer first met on /v1/messages is kept and replayed in
// that dialect's envelope, with the top-level "type":"error" (SPEC §8.1).
func TestSignedAnswerAbandonedOnMessages(t *testing.T) {
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	body := chatBody(dialectMessages, "openai/gpt-test", false, "")
	old := newAnswerStore(resolveState(testEnv(env)), slog.New(slog.DiscardHandler), time.Now)
	if _, err := old.reserve(signedOf("k", body, "openai/gpt-test")); err != nil {
		t.Fatalf("reserve in the stopped process: %v", err)
	}
	d := startDaemon(t, env, `{"openai":"k"}`, "-local-credentials-stdin")
	for i := range 2 {
		status, _, b := d.call("POST", "/v1/messages", d.token, body, "Idempotency-Key", "k")
		var env struct{ Type string }
		if json.Unmarshal(b, &env); status != 500 || env.Type != "error" || envelopeOf(t, b)["message"] != abandonedMessage {
			t.Errorf("request %d: %d %s, want the abandoned 500 with \"type\":\"error\"", i, status, b)
		}
	}
	if n := fake.calls.Load(); n != 0 {
		t.Errorf("provider calls = %d, want 0", n)
	}
}

// TestSignedAnswerCutByShutdown: a signed answer whose call the second stop
// signal cut is kept as a stopped process's answer (SPEC §12 item 2's 500
// internal_error, here with its known attempts), not as a caller's hang-up.
func TestSignedAnswerCutByShutdown(t *testing.T) {
	arrived := make(chan struct{})
	d, fake, env := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		close(arrived)
		<-r.Context().Done() // a long generation, cut by Brama
	})
	postThenCut(t, d, "k-shutdown", arrived)
	b, err := os.ReadFile(answerFile(env, "local", "k-shutdown"))
	if err != nil {
		t.Fatalf("no kept answer: %v", err)
	}
	var rec answerRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.Status == nil || *rec.Status != 500 || rec.Attempts == nil || *rec.Attempts != 1 {
		t.Fatalf("kept record %s, want status 500 after 1 attempt", b)
	}
	if body := string(rec.Body); !strings.Contains(body, `"code":"internal_error"`) || !strings.Contains(body, abandonedMessage) {
		t.Errorf("kept body %s, want SPEC §12 item 2's internal_error", body)
	}
	if fake.calls.Load() != 1 {
		t.Errorf("provider calls = %d, want 1", fake.calls.Load())
	}
	if logs := d.stderr.String(); !regexp.MustCompile(`"msg":"request",[^\n]*"outcome":"server_shutdown"`).MatchString(logs) {
		t.Errorf("no request log line with outcome server_shutdown (REFERENCE: a second stop signal's cut):\n%s", logs)
	}
}

// postThenCut posts a signed request with key and, once arrived closes, stops serve with two signals: the first drains,
// the second cuts what still runs. It returns when serve has stopped and the request has its answer.
func postThenCut(t *testing.T, d *daemon, key string, arrived <-chan struct{}) {
	t.Helper()
	done := make(chan answerResult, 1)
	go func() { done <- postAnswer(d, key, answerBody("")) }()
	<-arrived
	stopped := make(chan struct{})
	go func() { d.stop(); close(stopped) }()
	d.stderr.waitFor(t, `"msg":"serve_draining"`)
	d.cut()
	<-stopped
	<-done
}

// TestSignedAnswerCutByShutdownBeforeACall: a signed request the second stop signal cuts before any provider call made
// none, so its key is released, not kept as item 2's refusal (SPEC §12 item 3).
func TestSignedAnswerCutByShutdownBeforeACall(t *testing.T) {
	d, fake, env := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
	arrived := make(chan struct{})
	testingOnlyBeforeCall = func(ctx context.Context) {
		close(arrived)
		<-ctx.Done() // the call waits; the cut comes first
	}
	defer func() { testingOnlyBeforeCall = nil }()
	postThenCut(t, d, "k-shutdown-early", arrived)
	if _, err := os.Stat(answerFile(env, "local", "k-shutdown-early")); !errors.Is(err, os.ErrNotExist) || fake.calls.Load() != 0 {
		t.Errorf("kept answer file: %v, %d provider calls; want the key released and no call", err, fake.calls.Load())
	}
}

// TestSignedAnswerUnkept: an answer whose completion could not be written
// (a full disk) is given once, unsigned; the key then stays in progress in
// this process, and sending it again is the non-retryable refusal that says
// a provider call was made, not a 409 to retry for ever (SPEC §12, §8.1).
func TestSignedAnswerUnkept(t *testing.T) {
	d, fake, _ := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		testingOnlyRename = func(string, string) error { return errors.New("injected: no space left on device") }
		okAnswer(w)
	})
	defer func() { testingOnlyRename = nil }()
	body := answerBody("unkept")
	first := postAnswer(d, "order-7", body)
	if first.status != 200 || first.hdr.Get("Brama-Answer-Signature") != "" {
		t.Fatalf("first: %d %v, want the answer, unsigned", first.status, first.hdr)
	}
	for _, again := range []answerResult{postAnswer(d, "order-7", body), postAnswer(d, "order-7", body)} {
		e := envelopeOf(t, again.body)
		if again.status != 500 || e["code"] != "internal_error" || e["retryable"] != false || again.hdr.Get("x-should-retry") != "false" ||
			!strings.Contains(e["message"].(string), "a provider call was made") {
			t.Errorf("the key sent again: %d %s, want 500 internal_error, not retryable", again.status, again.body)
		}
	}
	if n := fake.calls.Load(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
	if line := `"msg":"answer_unkept","request_id":"` + first.hdr.Get("X-Request-Id"); !strings.Contains(d.stderr.String(), line) {
		t.Errorf("no answer_unkept line (REFERENCE.md) for the first request:\n%s", d.stderr.String())
	}
}

// TestSignedAnswerReleaseFailed: a retryable refusal releases its key; when
// the record cannot be removed (here a non-empty directory stands in its
// place) the failure is logged answer_release_failed (AUTHORIZATION.md).
func TestSignedAnswerReleaseFailed(t *testing.T) {
	var record atomic.Value // the reservation's path, known once the daemon runs
	d, _, env := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		os.Remove(record.Load().(string))
		os.MkdirAll(filepath.Join(record.Load().(string), "in-the-way"), 0o700)
		http.Error(w, `{"error":{"type":"server_error","message":"busy"}}`, 500)
	})
	record.Store(answerFile(env, "local", "k-release"))
	res := postAnswer(d, "k-release", answerBody("x"))
	if e := envelopeOf(t, res.body); e["code"] != "dependency_unavailable" || e["retryable"] != true {
		t.Fatalf("got %d %s, want the retryable refusal", res.status, res.body)
	}
	d.stderr.waitFor(t, `"msg":"request","request_id":"`+res.hdr.Get("X-Request-Id"))
	if line := `"msg":"answer_release_failed","request_id":"` + res.hdr.Get("X-Request-Id"); !strings.Contains(d.stderr.String(), line) {
		t.Errorf("no answer_release_failed line for the request:\n%s", d.stderr.String())
	}
}

// TestSignedAnswerDropsEchoedPrompt: an OpenAI Responses answer echoes the
// caller's instructions (and its input, twice: the last null); the kept body,
// the first answer and the replay carry them as null, byte for byte alike,
// under one signature (SPEC §12 item 7).
// A kept 2xx answer is replayed as it was delivered, even when its body holds an error member (a failed
// provider's body): x-should-retry: false as on any paid answer, and the log line's outcome is the first delivery's.
func TestSignedAnswerReplaysA2xxAsDelivered(t *testing.T) {
	d, _, _ := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,`+
			`"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"error":{"code":"server_error","message":"x"}}`)
	})
	var outcomes []any
	for i, res := range []answerResult{postAnswer(d, "failed-1", answerBody("hi")), postAnswer(d, "failed-1", answerBody("hi"))} {
		if res.status != 200 || res.hdr.Get("X-Should-Retry") != "false" || (i == 1) != (res.hdr.Get("Brama-Answer-Replayed") == "true") {
			t.Errorf("answer %d: %d X-Should-Retry %q replayed %q, want 200, false", i, res.status, res.hdr.Get("X-Should-Retry"), res.hdr.Get("Brama-Answer-Replayed"))
		}
		id := res.hdr.Get("X-Request-Id")
		d.stderr.waitFor(t, `"msg":"request","request_id":"`+id)
		outcomes = append(outcomes, requestLine(t, d.stderr.String(), "request_id", id)["outcome"])
	}
	if outcomes[0] != outcomes[1] {
		t.Errorf("log line outcomes %v, want the replay's as the first delivery's", outcomes)
	}
}

func TestSignedAnswerDropsEchoedPrompt(t *testing.T) {
	const secret = "SECRET-PROMPT-4b1d8e"
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req struct {
			Instructions string          `json:"instructions"`
			Input        json.RawMessage `json:"input"`
		}
		json.Unmarshal(body, &req)
		ins, _ := json.Marshal(req.Instructions)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_1","object":"response","created_at":1,"status":"completed","error":null,"incomplete_details":null,
 "instructions":%s,"input":%s,"model":"gpt-resp","output":[{"type":"message","id":"m1","status":"completed","role":"assistant",
 "content":[{"type":"output_text","text":"Hello","annotations":[]}]}],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4},
 "input":null}`, ins, req.Input) // input twice: the first, not null, is edited all the same
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_OPENAI_RESPONSES_BASE_URL"] = fake.URL
	d := startDaemon(t, env, `{"openai-responses":"`+plantedResponsesKey+`"}`, "-local-credentials-stdin")
	body := `{"model":"openai-responses/gpt-resp","instructions":"` + secret + ` be brief","input":"` + secret + ` hi"}`
	post := func() (int, http.Header, []byte) {
		return d.call("POST", "/v1/responses", d.token, body, "Idempotency-Key", "echo-1")
	}
	status, hdr, first := post()
	if status != 200 || bytes.Contains(first, []byte(secret)) || !bytes.Contains(first, []byte(`"instructions":null`)) ||
		!bytes.Contains(first, []byte(`"input":null`)) || !bytes.Contains(first, []byte(`"text":"Hello"`)) {
		t.Fatalf("first answer %d: %s; want the answer with instructions and input null", status, first)
	}
	status, rhdr, replay := post()
	if status != 200 || !bytes.Equal(replay, first) || rhdr.Get("Brama-Answer-Replayed") != "true" {
		t.Errorf("replay %d differs from the first answer:\n%s\nwant\n%s", status, replay, first)
	}
	sig := hdr.Get("Brama-Answer-Signature")
	if rhdr.Get("Brama-Answer-Signature") != sig {
		t.Errorf("replay signature %q, first %q", rhdr.Get("Brama-Answer-Signature"), sig)
	}
	raw := filepath.Join(t.TempDir(), "body")
	os.WriteFile(raw, first, 0o600)
	if out, errOut, code := runCLI(t, env, "", "answers", "verify", "-signature", sig, raw); code != 0 || out != "ok\n" {
		t.Errorf("the first answer's signature does not verify its bytes: exit %d %q %q", code, out, errOut)
	}
	kept, err := os.ReadFile(answerFile(env, "local", "echo-1"))
	if rec, derr := decodeAnswerRecord(kept); err != nil || derr != nil || !bytes.Equal(rec.Body, first) {
		t.Errorf("the kept body is not the first answer: %v %v", err, derr)
	}
	if out, errOut, code := runCLI(t, env, "", "answers", "verify", answerFile(env, "local", "echo-1")); code != 0 || out != "ok\n" {
		t.Errorf("the kept file does not verify: exit %d %q %q", code, out, errOut)
	}
	if n := fake.calls.Load(); n != 1 {
		t.Errorf("provider calls = %d, want 1", n)
	}
	assertNoSecret(t, secret, logsBesidesFirstStart(d.stderr.String()), filepath.Join(env["BRAMA_STATE_DIR"], "answers"))
}

// TestSignedAnswerTamperedIsNotReplayed (SPEC §12): a kept answer whose body no longer matches its signature is never
// replayed: the key is refused 500 internal_error, the changed body is not served, and no call is made.
func TestSignedAnswerTamperedIsNotReplayed(t *testing.T) {
	d, fake, env := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, protocolFixtures[0].buffered)
	})
	body := answerBody("hi")
	for _, spoil := range []struct {
		name string
		edit func(rec *answerRecord) []byte
	}{
		{"a body its signature does not sign", func(rec *answerRecord) []byte {
			rec.Body[len(rec.Body)/2] ^= 1
			return must(marshalState(rec))
		}},
		{"a record cut in half", func(rec *answerRecord) []byte { b := must(marshalState(rec)); return b[:len(b)/2] }},
	} {
		t.Run(spoil.name, func(t *testing.T) {
			key := "k-" + strings.ReplaceAll(spoil.name, " ", "-")
			if first := postAnswer(d, key, body); first.status != 200 {
				t.Fatalf("first: %d %s %v", first.status, first.body, first.err)
			}
			path := answerFile(env, "local", key)
			rec := readKept(t, path)
			if err := os.WriteFile(path, spoil.edit(rec), 0o600); err != nil {
				t.Fatal(err)
			}
			calls := fake.calls.Load()
			again := postAnswer(d, key, body)
			if e := envelopeOf(t, again.body); again.status != 500 || e["code"] != "internal_error" ||
				e["message"] != "the kept answer for this Idempotency-Key is unreadable" || fake.calls.Load() != calls {
				t.Errorf("the spoiled key: %d %s, %d calls; want 500 internal_error and no call", again.status, again.body, fake.calls.Load()-calls)
			}
		})
	}
}

// TestSignedAnswerReleasedAfterAPanicBeforeACall (SPEC §12 item 3): a request that panics before any provider call
// releases its key, so the same request again is dispatched and answered.
func TestSignedAnswerReleasedAfterAPanicBeforeACall(t *testing.T) {
	d, fake, _ := startAnswers(t, func(w http.ResponseWriter, r *http.Request, body []byte) { okAnswer(w) })
	var calls atomic.Int32
	testingOnlyBeforeCall = func(context.Context) {
		if calls.Add(1) == 1 {
			panic("planted panic")
		}
	}
	defer func() { testingOnlyBeforeCall = nil }()
	postAnswer(d, "k-early-panic", answerBody("x")) // the panic aborts the connection (or Go's transport sends it again)
	res := postAnswer(d, "k-early-panic", answerBody("x"))
	if res.err != nil || res.status != 200 || res.hdr.Get("Brama-Answer-Replayed") != "" || fake.calls.Load() != 1 {
		t.Errorf("after a panic before any call: %d %s %v, %d provider calls; want the request dispatched again and answered, 1 call",
			res.status, res.body, res.err, fake.calls.Load())
	}
}

// TestSignedAnswerKeptAfterAPanicPastACall (SPEC §12 item 3): a request that panics after a provider call started keeps
// its key as 500 internal_error, so the key sent again is answered that refusal with no call; it never spends twice.
func TestSignedAnswerKeptAfterAPanicPastACall(t *testing.T) {
	env := stateEnv(t)
	fake := newKeyedFake(t, map[string]string{"k1": "429", "k2": "200"})
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	tok, _ := agentWithSubs(t, d, "a1", "kimi", "k1", "k2")
	var calls atomic.Int32
	testingOnlyBeforeCall = func(context.Context) {
		if calls.Add(1) == 2 { // k1's 429 is read: the rotation to k2 panics before its call
			panic("planted panic")
		}
	}
	defer func() { testingOnlyBeforeCall = nil }()
	post := func() (int, []byte, error) {
		req, _ := http.NewRequest("POST", d.url+"/v1/chat/completions", strings.NewReader(chatBody(dialectChat, "kimi/k2-test", false, "")))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Idempotency-Key", "k-panic")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	// The panic aborts the connection; Go's transport sends a POST with an Idempotency-Key again by itself, so each
	// post already reads the kept refusal.
	for i := range 2 {
		status, b, err := post()
		if e := envelopeOf(t, b); err != nil || status != 500 || e["code"] != "internal_error" || fake.count("k1") != 1 || fake.count("k2") != 0 {
			t.Errorf("post %d: %d %s %v, calls k1 %d k2 %d; want the kept 500 internal_error and no call after k1's",
				i, status, b, err, fake.count("k1"), fake.count("k2"))
		}
	}
}
