package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The replay guard (SPEC §8.1): clients such as the Codex CLI and the
// official SDKs re-send a refused request whatever its body says, and after
// a provider call each re-send may be billed again. So for
// BRAMA_REPLAY_GUARD_SECS the same request from the same client gets that
// refusal again without a call. Memory only; a request with an
// Idempotency-Key is SPEC §12's and never reaches the guard.

const (
	defaultReplayGuard = 60 * time.Second // the window when BRAMA_REPLAY_GUARD_SECS is unset
	maxReplayMessage   = 256              // message bytes kept per entry: 10,000 entries stay a few MB
)

// errReplayRefused is the logged cause of a replay guard refusal.
var errReplayRefused = errors.New("replay guard: the same request was refused after a provider call")

// replayGuard remembers the refusals that came after a provider call. Every
// entry lives the same window, so queue is in expiry order and forgetting
// walks its front.
type replayGuard struct {
	window time.Duration
	now    func() time.Time

	mu       sync.Mutex // guards refused, queue, byClient
	refused  map[replayKey]replayEntry
	queue    []replayQueued
	byClient map[string]int // queued entries per client id: none, no digest to take
}

// replayKey is sha256 over the client, the agent and the request body
// without stream and stream_options.
type replayKey [sha256.Size]byte

// replayEntry is one remembered refusal.
type replayEntry struct {
	status    int    // the HTTP status it had (a stream's: its code's)
	code      string // its code
	message   string // its message, cut to maxReplayMessage ("" for a stream)
	at, until time.Time
}

type replayQueued struct {
	key    replayKey
	client string
	until  time.Time
}

// newReplayGuard reads BRAMA_REPLAY_GUARD_SECS: unset is 60 s, 0 turns the
// guard off; anything unreadable is logged and 60 s.
func newReplayGuard(getenv func(string) string, log *slog.Logger, now func() time.Time) *replayGuard {
	window := defaultReplayGuard
	if v := strings.TrimSpace(getenv("BRAMA_REPLAY_GUARD_SECS")); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			log.Warn("replay_guard_secs_invalid", "value", v, "using_secs", int(defaultReplayGuard/time.Second))
		} else {
			window = time.Duration(n) * time.Second
		}
	}
	return &replayGuard{window: window, now: now, refused: map[replayKey]replayEntry{}, byClient: map[string]int{}}
}

// replayKeyOf digests the client, the agent and the body in canonical form
// (members sorted: the Codex CLI writes client_metadata from a hash map)
// without stream and stream_options, so a fallback from a failed stream to
// a buffered call asks the same request. The loose key also leaves out the
// output limit: Claude Code's buffered fallback asks for fewer tokens
// (128000 streamed, 64000 buffered). ok is false for anything but one
// JSON object (refused before dispatch anyway).
func replayKeyOf(clientID, agentID string, body []byte, loose bool) (replayKey, bool) {
	leftOut := streamMembers
	if loose {
		leftOut = looseMembers
	}
	canonical, ok := canonicalRequest(body, leftOut)
	if !ok {
		return replayKey{}, false
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s%d:%s%t:", len(clientID), clientID, len(agentID), agentID, loose)
	h.Write(canonical)
	return replayKey(h.Sum(nil)), true
}

// The top-level members a digest leaves out: the stream's, and for the
// loose key also every format's output limit.
var (
	streamMembers = []string{"stream", "stream_options"}
	looseMembers  = []string{"stream", "stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens"}
)

// mayHaveGenerated is the codes of a refusal after the provider may have
// generated, which the loose key remembers; a caller that fixes its output
// limit after provider_rejected asks a new request.
func mayHaveGenerated(code string) bool {
	return code == "provider_incomplete" || code == "provider_failure"
}

// canonicalRequest is body's one JSON object without the top-level members
// leftOut, as encoding/json writes a map: members sorted at every level, no
// white space, numbers as sent; false for anything but one JSON object.
func canonicalRequest(body []byte, leftOut []string) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil || v == nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF { // one object and nothing after it
		return nil, false
	}
	for _, m := range leftOut {
		delete(v, m)
	}
	out, err := json.Marshal(v)
	return out, err == nil
}

// rememberRequest keeps e for the request body of client and agent under
// its key, and its loose key too when the provider may have generated.
func (g *replayGuard) rememberRequest(client, agent string, body []byte, e replayEntry) {
	for _, loose := range []bool{false, true} {
		if loose && !mayHaveGenerated(e.code) {
			break
		}
		if k, ok := replayKeyOf(client, agent, body, loose); ok {
			g.remember(client, k, e)
		}
	}
}

// lookupRequest is the refusal remembered for a request under either key.
func (g *replayGuard) lookupRequest(client, agent string, body []byte) (replayEntry, bool) {
	for _, loose := range []bool{false, true} {
		if k, ok := replayKeyOf(client, agent, body, loose); ok {
			if e, ok := g.lookup(k); ok && (!loose || mayHaveGenerated(e.code)) {
				return e, true
			}
		}
	}
	return replayEntry{}, false
}

// forget drops every entry whose time has passed. mu must be held.
func (g *replayGuard) forget(now time.Time) {
	for len(g.queue) > 0 && !now.Before(g.queue[0].until) {
		q := g.queue[0]
		g.queue = g.queue[1:]
		if g.byClient[q.client]--; g.byClient[q.client] <= 0 {
			delete(g.byClient, q.client)
		}
		if e, ok := g.refused[q.key]; ok && e.until.Equal(q.until) {
			delete(g.refused, q.key)
		}
	}
	if len(g.queue) == 0 {
		g.queue = nil // let the backing array go
	}
}

// lookup returns the refusal remembered for k, if its time has not passed.
func (g *replayGuard) lookup(k replayKey) (replayEntry, bool) {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.forget(now)
	e, ok := g.refused[k]
	return e, ok && now.Before(e.until)
}

// holds reports whether any refusal of client is remembered now; when none
// is, a request needs no digest.
func (g *replayGuard) holds(client string) bool {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.forget(now)
	return g.byClient[client] > 0
}

// remember keeps e for client's request k until the window ends.
func (g *replayGuard) remember(client string, k replayKey, e replayEntry) {
	now := g.now()
	e.at, e.until = now, now.Add(g.window)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.forget(now)
	g.refused[k] = e
	g.queue = append(g.queue, replayQueued{k, client, e.until})
	g.byClient[client]++
}

// size is the number of refusals remembered now.
func (g *replayGuard) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.forget(g.now())
	return len(g.refused)
}

// refusal is the answer to a request that repeats e: the same status and
// code, not retryable, no provider call.
func (e replayEntry) refusal() *apiError {
	why := e.code
	if e.message != "" {
		why += ": " + e.message
	}
	ae := refuse(e.code, "this request repeats one refused at %s after a provider call (%s); the same request is refused without a provider call until %s (BRAMA_REPLAY_GUARD_SECS)",
		e.at.UTC().Format(time.RFC3339), why, e.until.UTC().Format(time.RFC3339))
	if e.code == "provider_rejected" {
		ae.withStatus(e.status)
	}
	no := false
	ae.Retryable = &no
	return ae.because(errReplayRefused).withAttempts(0)
}

// replayRefused answers r with the remembered refusal it repeats, if any.
func (s *server) replayRefused(w http.ResponseWriter, r *http.Request) bool {
	g, ri := s.replay, infoFrom(r.Context())
	if g == nil || g.window <= 0 || !g.holds(ri.client.ID) { // the digest is taken only when it can match
		return false
	}
	e, ok := g.lookupRequest(ri.client.ID, ri.agentID, ri.body)
	if ok {
		w.Header().Set("Brama-Replay-Refused", "true")
		s.fail(w, r, e.refusal())
	}
	return ok
}

// replayRememberer is how the engine tells the guard of ri's refusal after
// dispatch (tally.remember); nil when the guard is off.
func (s *server) replayRememberer(ri *requestInfo) func(ae *apiError, attempts int, hungUp, streamed bool) {
	g := s.replay
	if g == nil || g.window <= 0 {
		return nil
	}
	return func(ae *apiError, attempts int, hungUp, streamed bool) {
		if e, ok := replayEntryOf(ae, attempts, hungUp, streamed); ok {
			g.rememberRequest(ri.client.ID, ri.agentID, ri.body, e)
		}
	}
}

// replayEntryOf is what the guard remembers of a refusal after a provider
// call with retryable false (a failed stream's: its in-band code), but not
// for a caller who hung up first, nor subscription_reauthorization_required
// (nothing generated; signing in again must let the request through).
func replayEntryOf(ae *apiError, attempts int, hungUp, streamed bool) (replayEntry, bool) {
	if attempts == 0 || hungUp || ae.Code == "client_cancelled" || ae.Code == "subscription_reauthorization_required" || ae.retryable() {
		return replayEntry{}, false
	}
	if streamed { // the caller met it in-band, under a 200
		return replayEntry{status: codes[ae.Code].status, code: ae.Code}, true
	}
	return replayEntry{status: ae.Status(), code: ae.Code, message: truncateUTF8(ae.Message, maxReplayMessage)}, true
}
