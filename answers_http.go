package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// The HTTP face of signed answers (SPEC §12): the wrapper handleChat's
// dispatch runs inside, the replay, and GET /v1/answers/{key}. answers.go
// holds the records themselves and knows nothing of HTTP. These handlers
// belong in server.go with the others; they wait here only while server.go
// is being reshaped.

// answerCapture holds a buffered dispatch's response until it is kept. Only
// buffered requests reach it, so nothing needs flushing.
type answerCapture struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *answerCapture) Header() http.Header { return c.header }

func (c *answerCapture) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
}

func (c *answerCapture) Write(b []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return c.body.Write(b)
}

// signedAnswer answers a chat request that carries an Idempotency-Key
// (SPEC §12). handleChat calls it once plan() has passed every check, so
// reserving is the last step before dispatch runs the provider calls;
// dispatch writes a buffered answer or one refusal to the writer it is given.
func (a *answerStore) signedAnswer(w http.ResponseWriter, r *http.Request, req chatRequest, key string, dispatch func(w http.ResponseWriter, r *http.Request)) {
	ri := infoFrom(r.Context())
	err := checkIdempotencyKey(key)
	switch {
	case len(r.Header.Values("Idempotency-Key")) > 1:
		err = refuse("invalid_request", "send one Idempotency-Key header")
	case err == nil && req.Stream:
		err = refuse("invalid_request", "Idempotency-Key keeps one buffered answer; it cannot be used with stream: true")
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	t, kept, err := a.reserve(ri.client.ID, key, ri.body, ri.route)
	switch {
	case err != nil:
		a.fail(w, r, err)
		return
	case kept != nil:
		a.replayAnswer(w, r, kept)
		return
	}
	c := &answerCapture{header: http.Header{}}
	func() {
		defer func() {
			if p := recover(); p != nil {
				a.settleAnswer(r, t, c, true) // keep or release; the connection is lost anyway
				panic(p)
			}
		}()
		dispatch(c, r)
	}()
	c, sig := a.settleAnswer(r, t, c, false)
	copyCaptured(w, c, sig)
}

// settleAnswer keeps or releases the reservation after dispatch (SPEC §12
// item 3, §7.4) and returns what the caller gets, with its signature when
// kept. A success is kept. A caller that hung up (or a dispatch that
// panicked) after a provider call started is kept as 499 client_cancelled
// (500 internal_error), so the key never spends twice; before any call the
// key is released. A retryable refusal is released so a retry dispatches
// again; any other refusal is kept.
func (a *answerStore) settleAnswer(r *http.Request, t *answerTicket, c *answerCapture, panicked bool) (*answerCapture, string) {
	ri := infoFrom(r.Context())
	calls := 0
	if ri.attempts != nil {
		calls = *ri.attempts
	}
	attempts := ri.attempts
	if n, err := strconv.Atoi(c.header.Get("Brama-Attempts")); err == nil {
		attempts = &n
	}
	var cut *apiError
	switch {
	case c.status >= 200 && c.status <= 299 && !panicked:
	case panicked && calls > 0:
		cut = refuse("internal_error", "the answer failed inside Brama after a provider call started").withAttempts(calls)
	case r.Context().Err() != nil && calls > 0:
		cut = refuse("client_cancelled", "the caller hung up after a provider call started").withAttempts(calls)
	case panicked, r.Context().Err() != nil, envelopeRetryable(c.body.Bytes()),
		// A refusal without an attempts count was made before any dispatch
		// (SPEC §8.1): it belongs before the reservation and is never kept.
		calls == 0 && c.header.Get("Brama-Attempts") == "":
		if err := a.release(t); err != nil {
			a.log.Error("answer_release_failed", "request_id", ri.id, "err", err)
		}
		return c, ""
	}
	if cut != nil {
		c = &answerCapture{header: http.Header{}}
		writeAPIError(c, r, cut)
		attempts = &calls
		ri.outcome, ri.retryable = cut.Code, false
	}
	rec, err := a.complete(t, c.status, c.body.Bytes(), attempts, ri.route)
	if err != nil {
		// The answer exists and was paid for: give it unsigned rather than
		// lose it. The record stays in progress, so the key never spends
		// twice; after a restart it reads as abandoned.
		a.log.Error("answer_unkept", "request_id", ri.id, "err", err)
		return c, ""
	}
	return c, *rec.Signature
}

// copyCaptured writes a captured response to w, signed when sig is set.
func copyCaptured(w http.ResponseWriter, c *answerCapture, sig string) {
	for k, v := range c.header {
		w.Header()[k] = v
	}
	if sig != "" {
		w.Header().Set("Brama-Answer-Signature", sig)
	}
	if c.status == 0 {
		c.status = http.StatusOK
	}
	w.WriteHeader(c.status)
	w.Write(c.body.Bytes())
}

// envelopeCode is the code and retryable flag of body when it is an error
// envelope (SPEC §8.1); code is "" otherwise.
func envelopeCode(body []byte) (code string, retryable bool) {
	var env struct {
		Error struct {
			Code      string `json:"code"`
			Retryable bool   `json:"retryable"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &env) != nil {
		return "", false
	}
	return env.Error.Code, env.Error.Retryable
}

func envelopeRetryable(body []byte) bool { _, retryable := envelopeCode(body); return retryable }

// replayAnswer answers from a complete record: the kept status and body
// bytes, the signature, Brama-Answer-Replayed and no provider call.
func (a *answerStore) replayAnswer(w http.ResponseWriter, r *http.Request, rec *answerRecord) {
	ri := infoFrom(r.Context())
	zero := 0
	ri.attempts = &zero
	body := rec.body()
	h := w.Header()
	if code, retryable := envelopeCode(body); code != "" {
		ri.outcome, ri.retryable = code, retryable
		h.Set("X-Should-Retry", strconv.FormatBool(retryable)) // SPEC §8.1
	}
	h.Set("Content-Type", "application/json")
	h.Set("Brama-Answer-Signature", *rec.Signature)
	h.Set("Brama-Answer-Replayed", "true")
	h.Set("Brama-Attempts", "0")
	w.WriteHeader(*rec.Status)
	w.Write(body)
}

// handleGet serves GET /v1/answers/{key} for the calling client.
func (a *answerStore) handleGet(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if err := checkIdempotencyKey(key); err != nil {
		a.fail(w, r, err)
		return
	}
	rec, err := a.lookup(infoFrom(r.Context()).client.ID, key)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.replayAnswer(w, r, rec)
}

// fail answers err as server.fail does.
func (a *answerStore) fail(w http.ResponseWriter, r *http.Request, err error) {
	failRequest(a.log, w, r, err)
}
