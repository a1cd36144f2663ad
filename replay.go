package main

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// The replay guard (SPEC §8.1, §17): the same request after a refusal that followed a provider call is refused again,
// without a call, until the window ends or the operator's fix.

const maxReplayMessage = 256 // message bytes a replay entry keeps: 10,000 entries stay a few MB

var errReplayRefused = errors.New("replay guard: the same request was refused after a provider call") // the log's cause

// replayGuard remembers refusals after a provider call, in memory (SPEC §8.1: the Codex CLI and the official SDKs re-send a
// refused request, each maybe billed again). Every entry lives one window, so queue is in expiry order.
type replayGuard struct {
	window  time.Duration // 0: off
	now     func() time.Time
	mu      sync.Mutex                         // guards refused, held and queue
	refused map[[sha256.Size]byte]*replayEntry // digest (its client's own) → refusal
	held    map[string]int                     // client id → its entries in refused: a client with none takes no digest
	queue   []*replayEntry                     // a forgotten entry stays queued until its time passes
}

// replayEntry is one remembered refusal (status 0: its code's); a fix of its alias or providers forgets it (SPEC §17).
type replayEntry struct {
	status        int
	code, message string
	alias, client string
	providers     []string
	until         time.Time // refused at until - window
	key           [sha256.Size]byte
}

// newReplayGuard reads BRAMA_REPLAY_GUARD_SECS: unset is 120 s, 0 turns the guard off; anything unreadable is logged and 120 s.
func newReplayGuard(getenv func(string) string, log *slog.Logger, now func() time.Time) *replayGuard {
	const name, def = "BRAMA_REPLAY_GUARD_SECS", 120 * time.Second
	window, err := envSeconds(getenv, name, 0, def)
	if err != nil {
		log.Warn("replay_guard_secs_invalid", "value", strings.TrimSpace(getenv(name)), "using_secs", int(def/time.Second))
	}
	return &replayGuard{window: window, now: now, refused: map[[sha256.Size]byte]*replayEntry{}, held: map[string]int{}}
}

// replayLeftOut is what a digest leaves out, strict and loose: stream members (SPEC §17: a buffered fallback from a failed
// stream asks the same request), client_metadata (digested apart in key order: the Codex CLI re-sends it from a hash map),
// and for the loose key the output limit (Claude Code's fallback asks 64000 of 128000).
var replayLeftOut = map[bool][]memberEdit{
	false: {{key: "stream"}, {key: "stream_options"}, {key: "client_metadata"}},
	true: {{key: "stream"}, {key: "stream_options"}, {key: "client_metadata"},
		{key: "max_tokens"}, {key: "max_completion_tokens"}, {key: "max_output_tokens"}},
}

// replayKeyOf digests client, scope and the body's bytes but replayLeftOut: no generic decode, so the cost is the body's.
func replayKeyOf(clientID, scope string, body rawObject, loose bool) [sha256.Size]byte {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s%d:%s%t:", len(clientID), clientID, len(scope), scope, loose)
	meta := body.value("client_metadata")
	if o, ok := splitRaw(meta, '{', nil); ok {
		slices.SortFunc(o.members, func(a, b jsonMember) int { return bytes.Compare(a.key, b.key) })
		for _, m := range o.members {
			fmt.Fprintf(h, "%d:%s", len(m.key), m.key)
			h.Write(o.src[m.val:m.end])
		}
	} else {
		h.Write(meta) // not an object: its bytes as they are
	}
	body.writeEdited(h, replayLeftOut[loose]...)
	return [sha256.Size]byte(h.Sum(nil))
}

// replayScope is what reaches a provider beside the body: route, key fingerprint (SPEC §17), agent, version headers (§6.2).
func replayScope(agent string, h http.Header, c call) string {
	return fmt.Sprintf("%q", []string{agent, c.res.Route, c.res.BaseURL, fmt.Sprintf("%x", sha256.Sum256([]byte(c.cred.APIKey))),
		strings.Join(h.Values("anthropic-version"), ","), strings.Join(h.Values("anthropic-beta"), ","), strings.Join(h.Values("openai-beta"), ",")})
}

// lock takes mu and forgets every entry whose time has passed, so refused holds only live ones.
func (g *replayGuard) lock() time.Time {
	now := g.now()
	g.mu.Lock()
	for len(g.queue) > 0 && !now.Before(g.queue[0].until) {
		if q := g.queue[0]; g.refused[q.key] == q {
			g.drop(q)
		}
		g.queue = g.queue[1:]
	}
	if len(g.queue) == 0 {
		g.queue = nil // let the backing array go
	}
	return now
}

// drop forgets e, and its client with its last entry: a client pays for a digest only while it holds one.
func (g *replayGuard) drop(e *replayEntry) {
	delete(g.refused, e.key)
	if g.held[e.client]--; g.held[e.client] == 0 {
		delete(g.held, e.client)
	}
}

// forget drops every refusal of a request through alias or provider ("" names none): the operator's fix (SPEC §17).
func (g *replayGuard) forget(alias, provider string) {
	g.lock()
	defer g.mu.Unlock()
	for _, e := range g.refused {
		if alias != "" && e.alias == alias || provider != "" && slices.Contains(e.providers, provider) {
			g.drop(e)
		}
	}
}

// refusalFor is the refusal a request of client repeats, nil for none: the status and code of the one remembered under its
// strict or its loose key, not retryable, no call made. A client with none remembered takes no digest.
func (g *replayGuard) refusalFor(client string, scope func() string, body rawObject) *apiError {
	g.lock() // off: nothing is remembered
	held := g.held[client] > 0
	g.mu.Unlock()
	if !held {
		return nil
	}
	s := scope()
	strict, loose := replayKeyOf(client, s, body, false), replayKeyOf(client, s, body, true)
	g.lock()
	e := cmp.Or(g.refused[strict], g.refused[loose])
	g.mu.Unlock()
	if e == nil {
		return nil
	}
	at := e.until.Add(-g.window) // when it was refused
	ae := refuse(e.code, "this request repeats one refused at %s after a provider call (%s); the same request is refused without a provider call until %s (BRAMA_REPLAY_GUARD_SECS)",
		at.UTC().Format(time.RFC3339), strings.TrimSuffix(e.code+": "+e.message, ": "), e.until.UTC().Format(time.RFC3339))
	ae.Retryable = false
	return ae.withStatus(e.status).because(errReplayRefused).withAttempts(0)
}

// rememberer is tally.remember (nil: off): a non-retryable refusal after a call, not a reauthorization (signing in must
// pass), is kept for client's request until the window ends. A refusal that may have generated is kept under the loose
// key, which the same request also has: a caller that fixes its output limit after provider_rejected asks a new request.
func (g *replayGuard) rememberer(client string, scope func() string, body rawObject, c call, cands []resolution) func(ae *apiError, attempts int, hungUp, streamed bool) {
	if g.window <= 0 {
		return nil
	}
	return func(ae *apiError, attempts int, hungUp, streamed bool) {
		if attempts == 0 || hungUp || ae.Code == "client_cancelled" || ae.Code == "subscription_reauthorization_required" || ae.Retryable {
			return
		}
		loose := ae.Code == "provider_incomplete" || ae.Code == "provider_failure"
		e := &replayEntry{status: ae.Status(), code: ae.Code, message: truncateUTF8(ae.Message, maxReplayMessage),
			alias: c.res.Alias, client: client, key: replayKeyOf(client, scope(), body, loose)}
		if streamed { // met in-band under a 200: its code's status, no message
			e.status, e.message = 0, ""
		}
		for _, cand := range append([]resolution{c.res}, cands...) { // a provider twice does no harm
			e.providers = append(e.providers, cand.Provider.id)
		}
		now := g.lock()
		defer g.mu.Unlock()
		if e.until = now.Add(g.window); g.refused[e.key] == nil {
			g.held[client]++
		}
		g.refused[e.key] = e
		g.queue = append(g.queue, e)
	}
}
