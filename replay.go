package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

const maxReplayMessage = 256 // message bytes kept per entry: 10,000 entries stay a few MB

// errReplayRefused is the logged cause of a replay guard refusal.
var errReplayRefused = errors.New("replay guard: the same request was refused after a provider call")

// replayGuard remembers refusals after a provider call (SPEC §8.1: the Codex CLI and the official SDKs re-send a refused request,
// each re-send maybe billed again), in memory only. Every entry lives the same window, so queue is in expiry order and forgetting
// walks its front.
type replayGuard struct {
	window time.Duration // 0: off
	now    func() time.Time

	mu       sync.Mutex // guards refused, queue, byClient
	refused  map[replayKey]*replayEntry
	queue    []*replayEntry // a forgotten entry stays queued until its time passes
	byClient map[string]int // queued entries per client id: none, no digest to take
}

type replayKey [sha256.Size]byte

// replayEntry is one remembered refusal: its status (a stream's: its code's), code and message (cut; "" for a stream), the alias
// the request named and the providers its route could call (SPEC §17: a fix forgets it).
type replayEntry struct {
	status        int
	code, message string
	alias         string
	providers     []string
	at, until     time.Time
	key           replayKey
	client        string
}

// newReplayGuard reads BRAMA_REPLAY_GUARD_SECS: unset is 120 s, 0 turns the guard off; anything unreadable is logged and 120 s.
func newReplayGuard(getenv func(string) string, log *slog.Logger, now func() time.Time) *replayGuard {
	const name, def = "BRAMA_REPLAY_GUARD_SECS", 120 * time.Second
	window, err := envSeconds(getenv, name, 0, def)
	if err != nil {
		log.Warn("replay_guard_secs_invalid", "value", strings.TrimSpace(getenv(name)), "using_secs", int(def/time.Second))
	}
	return &replayGuard{window: window, now: now, refused: map[replayKey]*replayEntry{}, byClient: map[string]int{}}
}

// The top-level members a digest leaves out: the stream members (SPEC §17: a buffered fallback from a failed stream asks the same
// request), and for the loose key the output limit too (Claude Code's fallback asks 64000 of 128000).
var (
	streamMembers = []memberEdit{{key: "stream"}, {key: "stream_options"}}
	looseMembers  = append(streamMembers[:2:2], memberEdit{key: "max_tokens"}, memberEdit{key: "max_completion_tokens"}, memberEdit{key: "max_output_tokens"})
)

// replayKeyOf digests client, scope and the body's bytes without the members above. The Codex CLI re-sends client_metadata from a
// hash map: its members go in key order.
func replayKeyOf(clientID, scope string, body rawObject, loose bool) replayKey {
	leftOut := streamMembers
	if loose {
		leftOut = looseMembers
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s%d:%s%t:", len(clientID), clientID, len(scope), scope, loose)
	if meta, ok := splitRaw(body.value("client_metadata"), '{', nil); ok {
		slices.SortFunc(meta.members, func(a, b jsonMember) int { return bytes.Compare(a.key, b.key) })
		for _, m := range meta.members {
			fmt.Fprintf(h, "%d:%s", len(m.key), m.key)
			h.Write(meta.src[m.val:m.end])
		}
		leftOut = append(leftOut[:len(leftOut):len(leftOut)], memberEdit{key: "client_metadata"})
	}
	body.writeEdited(h, leftOut...)
	return replayKey(h.Sum(nil))
}

// replayScope is what reaches a provider beside the body: the route c resolved to and its direct key's fingerprint (SPEC §17: a
// registry or key change is a new request, whichever process wrote it), the caller's agent and the version and beta headers it
// sets (SPEC §6.2).
func replayScope(agent string, h http.Header, c call) string {
	return fmt.Sprintf("%q", []string{agent, c.res.Route, c.res.BaseURL, fmt.Sprintf("%x", sha256.Sum256([]byte(c.cred.APIKey))),
		strings.Join(h.Values("anthropic-version"), ","), strings.Join(h.Values("anthropic-beta"), ","), strings.Join(h.Values("openai-beta"), ",")})
}

// mayHaveGenerated: such a refusal is also kept under the loose key, as a caller that fixes its output limit after
// provider_rejected asks a new request.
func mayHaveGenerated(code string) bool {
	return code == "provider_incomplete" || code == "provider_failure"
}

// lock takes mu and forgets every entry whose time has passed.
func (g *replayGuard) lock() time.Time {
	now := g.now()
	g.mu.Lock()
	for len(g.queue) > 0 && !now.Before(g.queue[0].until) {
		q := g.queue[0]
		g.queue = g.queue[1:]
		if g.byClient[q.client]--; g.byClient[q.client] <= 0 {
			delete(g.byClient, q.client)
		}
		if g.refused[q.key] == q {
			delete(g.refused, q.key)
		}
	}
	if len(g.queue) == 0 {
		g.queue = nil // let the backing array go
	}
	return now
}

// lookup is the refusal remembered for a request under its key, or under its loose key for one that may have generated.
func (g *replayGuard) lookup(client, scope string, body rawObject) (replayEntry, bool) {
	for _, loose := range []bool{false, true} {
		k := replayKeyOf(client, scope, body, loose)
		now := g.lock()
		e, ok := g.refused[k]
		g.mu.Unlock()
		if ok && now.Before(e.until) && (!loose || mayHaveGenerated(e.code)) {
			return *e, true
		}
	}
	return replayEntry{}, false
}

// holds reports whether any refusal of client is remembered: else no digest is taken.
func (g *replayGuard) holds(client string) bool {
	g.lock()
	defer g.mu.Unlock()
	return g.byClient[client] > 0
}

// remember keeps e for client's request until the window ends, under both keys when it may have generated.
func (g *replayGuard) remember(client, scope string, body rawObject, e replayEntry) {
	keys := []replayKey{replayKeyOf(client, scope, body, false)}
	if mayHaveGenerated(e.code) {
		keys = append(keys, replayKeyOf(client, scope, body, true))
	}
	now := g.lock()
	defer g.mu.Unlock()
	e.at, e.until, e.client = now, now.Add(g.window), client
	for _, k := range keys {
		q := e // one entry per key: each leaves with its own queue item
		q.key = k
		g.refused[k] = &q
		g.queue = append(g.queue, &q)
		g.byClient[client]++
	}
}

// forget drops every refusal remembered for a request through alias or provider ("" names none): the operator's fix is dispatched
// (SPEC §17). Their queue entries stay until their time passes.
func (g *replayGuard) forget(alias, provider string) {
	if g == nil {
		return
	}
	g.lock()
	defer g.mu.Unlock()
	maps.DeleteFunc(g.refused, func(_ replayKey, e *replayEntry) bool {
		return alias != "" && e.alias == alias || provider != "" && slices.Contains(e.providers, provider)
	})
}

// refusalFor is the refusal a request of client repeats, nil for none: its status and code, not retryable, with no call made. The
// digest is taken only when it can match.
func (g *replayGuard) refusalFor(client string, scope func() string, body rawObject) *apiError {
	if g == nil || g.window <= 0 || !g.holds(client) {
		return nil
	}
	e, ok := g.lookup(client, scope(), body)
	if !ok {
		return nil
	}
	why := e.code
	if e.message != "" {
		why += ": " + e.message
	}
	ae := refuse(e.code, "this request repeats one refused at %s after a provider call (%s); the same request is refused without a provider call until %s (BRAMA_REPLAY_GUARD_SECS)",
		e.at.UTC().Format(time.RFC3339), why, e.until.UTC().Format(time.RFC3339))
	if e.code == "provider_rejected" {
		ae.withStatus(e.status)
	}
	ae.Retryable = false
	return ae.because(errReplayRefused).withAttempts(0)
}

// rememberer is tally.remember for a request of client planned as c over cands; nil when the guard is off. Remembered is a
// non-retryable refusal after a call, not subscription_reauthorization_required (signing in must pass); a stream's was met
// in-band, under a 200.
func (g *replayGuard) rememberer(client string, scope func() string, body rawObject, c call, cands []resolution) func(ae *apiError, attempts int, hungUp, streamed bool) {
	if g == nil || g.window <= 0 {
		return nil
	}
	return func(ae *apiError, attempts int, hungUp, streamed bool) {
		if attempts == 0 || hungUp || ae.Code == "client_cancelled" || ae.Code == "subscription_reauthorization_required" || ae.Retryable {
			return
		}
		e := replayEntry{status: ae.Status(), code: ae.Code, message: truncateUTF8(ae.Message, maxReplayMessage), alias: c.res.Alias}
		if streamed {
			e.status, e.message = codes[ae.Code].status, ""
		}
		for _, cand := range append([]resolution{c.res}, cands...) {
			if !slices.Contains(e.providers, cand.Provider.id) {
				e.providers = append(e.providers, cand.Provider.id)
			}
		}
		g.remember(client, scope(), body, e)
	}
}
