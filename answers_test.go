package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func answerBody(prompt string) string {
	return `{"model":"openai/gpt-test","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":50}`
}

// TestSignedAnswerHangUp drives the answer store's serve with a cancelled
// request: after a provider call started the key is kept as 499, before
// any call it is released (SPEC §7.4).
func TestSignedAnswerHangUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls int
		kept  bool
	}{
		{name: "after a provider call", calls: 1, kept: true},
		{name: "after two provider calls", calls: 2, kept: true},
		{name: "before any provider call", calls: 0, kept: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAnswerStore(state{dir: t.TempDir()}, slog.New(slog.DiscardHandler), time.Now)
			body := answerBody("x")
			ta := &tally{route: "openai/gpt-test"}
			r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
			ctx, cancel := context.WithCancel(context.Background())
			w := httptest.NewRecorder()
			c := signedCall{client: "local", keys: []string{"k"}, t: ta,
				req: &callerRequest{body: rawObject{src: []byte(body)}, caller: r}}
			a.serve(ctx, w, c, func(w http.ResponseWriter) {
				ta.attempts = tc.calls // as the engine's account does
				cancel()               // the caller hangs up while the call is in flight
				writeAPIError(w, r, refuse("provider_incomplete", "cut").withAttempts(tc.calls))
			})
			path := filepath.Join(a.st.dir, "answers", "local", hexSHA256([]byte("k"))+".json")
			raw, err := os.ReadFile(path)
			if !tc.kept {
				if !errors.Is(err, os.ErrNotExist) {
					t.Errorf("the key was not released: %v %s", err, raw)
				}
				return
			}
			rec, err := decodeAnswerRecord(raw)
			if err != nil {
				t.Fatal(err)
			}
			e := envelopeOf(t, rec.Body)
			if *rec.Status != 499 || e["code"] != "client_cancelled" || e["retryable"] != false || e["attempts"] != float64(tc.calls) || *rec.Attempts != tc.calls {
				t.Errorf("kept %d %s attempts %d", *rec.Status, rec.Body, *rec.Attempts)
			}
			if w.Code != 499 || !bytes.Equal(w.Body.Bytes(), rec.Body) {
				t.Errorf("answered %d %s", w.Code, w.Body.Bytes())
			}
		})
	}
}

func TestAnswersPrune(t *testing.T) {
	env := stateEnv(t)
	a := newAnswerStore(resolveState(testEnv(env)), slog.New(slog.DiscardHandler), time.Now)
	longAgo := func() time.Time { return time.Date(2000, 1, 2, 3, 4, 5, 0, time.UTC) }
	keep := func(key string, now func() time.Time, complete bool) string {
		a.now = now
		tk, err := a.reserve(signedOf(key, "{}", "r"))
		if err != nil {
			t.Fatal(err)
		}
		if complete {
			if err := a.keep(tk, answered(200, `{"ok":true}`), new(int)); err != nil {
				t.Fatal(err)
			}
		}
		return tk.path
	}
	oldDone := keep("old-complete", longAgo, true)
	oldBusy := keep("old-in-progress", longAgo, false)
	recent := keep("recent-complete", time.Now, true)
	answers := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		err := run(context.Background(), nil, append([]string{"answers"}, args...), testEnv(env), strings.NewReader(""), &out, &errb)
		code := exitCode(err, &errb)
		return out.String(), errb.String(), code
	}
	out, errOut, code := answers("prune", "-older-than", "24h")
	if code != 0 || out != "removed 1 complete answers older than 24h0m0s\n" {
		t.Errorf("prune: exit %d %q %q", code, out, errOut)
	}
	for path, want := range map[string]bool{oldDone: false, oldBusy: true, recent: true} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s exists = %v, want %v", filepath.Base(path), err == nil, want)
		}
	}
	if _, _, code := answers("prune"); code != 2 {
		t.Errorf("prune without -older-than: exit %d, want 2", code)
	}
}

// TestCheckIdempotencyKey: SPEC §12's key is one header of 1..255 printable ASCII characters.
func TestCheckIdempotencyKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  string
		ok   bool
	}{
		{name: "one char", key: "a", ok: true},
		{name: "255 chars", key: strings.Repeat("x", 255), ok: true},
		{name: "printable punctuation and space", key: "a b/c?d=%7E~", ok: true},
		{name: "empty", key: ""},
		{name: "256 chars", key: strings.Repeat("x", 256)},
		{name: "newline", key: "a\nb"},
		{name: "DEL", key: "a\x7f"},
		{name: "UTF-8", key: "ключ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAnswerStore(state{dir: t.TempDir()}, slog.New(slog.DiscardHandler), time.Now)
			if _, err := a.reserve(signedOf(tc.key, "{}", "")); (err == nil) != tc.ok {
				t.Errorf("reserve with key %q = %v, want ok %v", tc.key, err, tc.ok)
			}
		})
	}
}

// Seeds for FuzzAnswerRecord, also used by TestDecodeAnswerRecord.
const (
	seedInProgress = `{"schema_version":1,"state":"in_progress","boot_id":"b","client":"local","key_sha256":"2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae","request_sha256":"44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","started_at":"2026-01-02T03:04:05.000Z","completed_at":null,"status":null,"body_base64":null,"attempts":null,"route":"openai/gpt-test","signature":null}`
	seedComplete   = `{"schema_version":1,"state":"complete","boot_id":"b","client":"local","key_sha256":"2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae","request_sha256":"44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","started_at":"2026-01-02T03:04:05.000Z","completed_at":"2026-01-02T03:04:06.123Z","status":200,"body_base64":"e30K","attempts":1,"route":"openai/gpt-test","signature":"v1=0000000000000000000000000000000000000000000000000000000000000000"}`
)

func TestDecodeAnswerRecord(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want string // "" accepts; else a substring of the error
	}{
		{name: "in progress", doc: seedInProgress},
		{name: "complete", doc: seedComplete},
		{name: "unknown member", doc: strings.Replace(seedComplete, `"route"`, `"prompt":"x","route"`, 1), want: "unknown field"},
		{name: "duplicate member", doc: strings.Replace(seedComplete, `"route"`, `"status":200,"route"`, 1), want: "duplicate"},
		{name: "in progress with a body", doc: strings.Replace(seedInProgress, `"body_base64":null`, `"body_base64":"e30K"`, 1), want: "completion members"},
		{name: "bad base64", doc: strings.Replace(seedComplete, "e30K", "e30", 1), want: "base64"},
		{name: "upper-case digest", doc: strings.Replace(seedComplete, "2c26b4", "2C26B4", 1), want: "key_sha256"},
		{name: "time without milliseconds", doc: strings.Replace(seedComplete, "06.123Z", "06Z", 1), want: "completed_at"},
		{name: "bad state", doc: strings.Replace(seedComplete, `"complete"`, `"done"`, 1), want: "state"},
		{name: "schema 2", doc: strings.Replace(seedComplete, `"schema_version":1`, `"schema_version":2`, 1), want: "schema_version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeAnswerRecord([]byte(tc.doc))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errAnswerCorrupt)):
				t.Errorf("got %v, want an errAnswerCorrupt naming %q", err, tc.want)
			}
		})
	}
}

// FuzzAnswerRecord: no panic, every refusal is errAnswerCorrupt, and an
// accepted record re-encodes to a record that decodes to the same value.
func FuzzAnswerRecord(f *testing.F) {
	f.Add([]byte(seedInProgress))
	f.Add([]byte(seedComplete))
	f.Add([]byte(`{"schema_version":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := decodeAnswerRecord(data)
		if err != nil {
			if !errors.Is(err, errAnswerCorrupt) {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		b, err := marshalState(rec)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeAnswerRecord(b)
		if err != nil {
			t.Fatalf("re-encoded record refused: %v\n%s", err, b)
		}
		if diff := cmp.Diff(rec, again, cmp.AllowUnexported(answerRecord{})); diff != "" {
			t.Fatalf("round trip changed the record (-first +again):\n%s", diff)
		}
		if rec.State == answerComplete {
			if _, err := json.Marshal(rec.Body); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestSignedAnswerEmptyBodyKept: an answer with no body bytes is kept as
// body_base64 "" (not null), so the record stays readable and replayable.
func TestSignedAnswerEmptyBodyKept(t *testing.T) {
	a := newAnswerStore(state{dir: t.TempDir()}, slog.New(slog.DiscardHandler), time.Now)
	tk, err := a.reserve(signedOf("k", "{}", "r"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.keep(tk, answered(204, ""), new(int)); err != nil {
		t.Fatal(err)
	}
	if rec, err := readAnswerFile(tk.path); err != nil || rec.Body == nil || len(rec.Body) != 0 {
		t.Fatalf("kept empty answer: %+v, %v", rec, err)
	}
}

// answered is a recorded answer of status and body, as dispatch would leave it for keep.
func answered(status int, body string) *httptest.ResponseRecorder {
	return &httptest.ResponseRecorder{Code: status, HeaderMap: http.Header{}, Body: bytes.NewBufferString(body)}
}

// signedOf is the signed call the handler builds for client "local"'s buffered request with key and body, planned on route.
func signedOf(key, body, route string) signedCall {
	return signedCall{client: "local", keys: []string{key}, t: &tally{route: route},
		req: &callerRequest{body: rawObject{src: []byte(body)}}}
}
