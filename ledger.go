package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	ledgerFile = "ledger.json"
	// Credential states (SPEC §10.3); credDisabled is shown for retired rows, never stored.
	credActive, credNeedsReauth, credDisabled = "active", "needs_reauthorization", "disabled"
	// Where a plan window's reading came from: an answer's headers (SPEC §6.3) or a usage report (§11.2).
	windowSourceTraffic, windowSourceReport = "traffic", "usage_report"
	planMaxResetSeconds                     = 1e11 // bounds a reset delay, a window, a JWT's exp (year 5138): ms cannot overflow
	// A block's length when nothing states one, and the bound of any (SPEC §7.2.4: no reset months away parks a subscription).
	defaultBlock, maxRetryAfter = 15 * time.Minute, 7 * 24 * time.Hour
)

type (
	// planWindow is one plan window's latest reading; traffic and reports share an id, so either replaces the other.
	planWindow struct {
		ID           string  `json:"id"` // anthropic:5h, anthropic:7d, codex:primary, codex:secondary, kimi:usage, kimi:limit-<i>
		Label        string  `json:"label"`
		UsedFraction float64 `json:"used_fraction"` // clamped to [0,1]
		ResetsAtMs   int64   `json:"resets_at_ms"`  // 0 unknown
		RecordedAtMs int64   `json:"recorded_at_ms"`
		Source       string  `json:"source"` // windowSourceTraffic or windowSourceReport
	}
	// ledgerEntry is one subscription's record (SPEC §10.3); a time 0 is unknown, none or never.
	ledgerEntry struct {
		Provider   string           `json:"provider"`
		Windows    []planWindow     `json:"windows"`
		Block      ledgerBlock      `json:"block"` // the block a 429 or quota refusal left
		Credential ledgerCredential `json:"credential"`
		Measured   ledgerMeasured   `json:"measured"` // what Brama itself saw of the subscription's use
		UsageRead  ledgerCheck      `json:"usage_read"`
		Probe      ledgerCheck      `json:"probe"`
	}
	ledgerBlock struct {
		UntilMs      int64  `json:"until_ms"`
		Reason       string `json:"reason"`
		RecordedAtMs int64  `json:"recorded_at_ms"`
	}
	ledgerCredential struct {
		State         string `json:"state"`
		Cause         string `json:"cause"`
		RecordedAtMs  int64  `json:"recorded_at_ms"`
		ExpiresAtMs   int64  `json:"expires_at_ms"`   // the grant's
		RefreshedAtMs int64  `json:"refreshed_at_ms"` // the grant's
	}
	ledgerMeasured struct {
		Requests     int64 `json:"requests"`
		Failures     int64 `json:"failures"`
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
		LastUsedMs   int64 `json:"last_used_ms"`
	}
	// ledgerCheck is the last usage read's or probe's outcome.
	ledgerCheck struct {
		AtMs   int64  `json:"at_ms"`
		OK     bool   `json:"ok"`
		Detail string `json:"detail"`
	}
	// ledgerDoc is ledger.json (SPEC §2.2).
	ledgerDoc struct {
		SchemaVersion int                    `json:"schema_version"`
		Subscriptions map[string]ledgerEntry `json:"subscriptions"`
	}
)

// isSubscriptionID: sub_ and 16 lower-case hex digits (SPEC §2.2).
var isSubscriptionID = regexp.MustCompile(`^sub_[0-9a-f]{16}$`).MatchString

// ledgerStopper is a timer: a persisted map's write-behind, maintenance's due timer; tests fake afterFunc.
type ledgerStopper interface{ Stop() bool }

func afterFunc(d time.Duration, f func()) ledgerStopper { return time.AfterFunc(d, f) }

func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// persisted is a map kept in memory and written whole to its state file (ledger.json, SPEC §10.3; perf.json, §13).
type persisted[V any] struct {
	unplacedLog, failedLog string // the log messages of pathErr and of a failed write
	sys
	name      string // the file; "" when there is none (pathErr, or an unreadable file kept for repair)
	pathErr   error  // no state directory: the entries live in memory only, said once at the first change
	unplaced  sync.Once
	every     time.Duration
	afterFunc func(d time.Duration, f func()) ledgerStopper
	doc       func(entries map[string]V, now time.Time) any // the file's document around the entries, encoded under mu

	mu        sync.Mutex // guards entries, lastWrite, timer
	entries   map[string]V
	lastWrite time.Time     // clock moment of the last snapshot taken for the file
	timer     ledgerStopper // the armed write-behind, nil when none: no change waits for it
	writeMu   sync.Mutex    // held from snapshot to rename: racing writes never leave older state
}

// change applies fn to the entries, then writes them now (immediate, or the last write every ago) or arms the write-behind.
func (p *persisted[V]) change(immediate bool, fn func(entries map[string]V, now time.Time)) {
	now := p.now()
	p.mu.Lock()
	fn(p.entries, now)
	due := immediate || now.Sub(p.lastWrite) >= p.every // a zero lastWrite is long ago
	if !due && p.timer == nil && p.name != "" {
		p.timer = p.afterFunc(p.every-now.Sub(p.lastWrite), func() { p.flush(true) })
	}
	p.mu.Unlock()
	if p.pathErr != nil {
		p.unplaced.Do(func() { p.log.Warn(p.unplacedLog, "cause", p.pathErr.Error()) })
	} else if due {
		p.flush(false)
	}
}

// flush writes a snapshot now (at shutdown too) and disarms the write-behind; pendingOnly (the write-behind firing) writes
// only while one is armed, so one stopped while it fired writes nothing.
func (p *persisted[V]) flush(pendingOnly bool) {
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	p.mu.Lock()
	if p.name == "" || pendingOnly && p.timer == nil {
		p.mu.Unlock()
		return
	}
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.lastWrite = p.now()
	data, err := marshalState(p.doc(p.entries, p.lastWrite)) // under mu: the document is encoded, never kept
	p.mu.Unlock()
	if err == nil { // a document that cannot be encoded never replaces the file
		err = writeFileAtomic(p.name, data)
	}
	if err != nil {
		p.log.Warn(p.failedLog, "cause", err.Error())
	}
}

// ledger is what dispatch orders by (SPEC §10.3); credential, block and probe changes are written at once, others once a second.
type ledger struct {
	persisted[ledgerEntry]
	unreadable error         // why ledger.json could not be read: it is then never written
	changed    chan struct{} // nudged after every change: maintenance re-arms
	statusSeq  atomic.Uint64 // immediate mutations (a subscription's status) so far: a listing's cache key
}

// newLedger loads ledger.json; an unreadable one is served empty, logged without its bytes and never overwritten (to repair).
func newLedger(st state, log *slog.Logger, now func() time.Time) *ledger {
	l := &ledger{changed: make(chan struct{}, 1), persisted: persisted[ledgerEntry]{sys: sys{log, now}, every: time.Second,
		afterFunc: afterFunc, unplacedLog: "ledger_unplaced", failedLog: "ledger_write_failed",
		doc: func(m map[string]ledgerEntry, _ time.Time) any { return ledgerDoc{1, m} }, entries: map[string]ledgerEntry{}}}
	l.name, l.pathErr = st.path("ledger", ledgerFile)
	f := stateFile[map[string]ledgerEntry]{role: "ledger", parse: parseLedger, path: l.name, pathErr: l.pathErr}
	entries, _, err := f.read()
	maps.Copy(l.entries, entries)       // none when err; "subscriptions" null or absent: none
	if err != nil && f.pathErr == nil { // else err is pathErr
		l.unreadable, l.name = err, "" // never written
		log.Error("ledger_unreadable", "file", f.path, "cause", err.Error())
	}
	return l
}

// parseLedger strictly parses ledger.json (SPEC §2.2), naming the member refused; empty bytes are empty.
func parseLedger(b []byte) (map[string]ledgerEntry, error) {
	doc := ledgerDoc{SchemaVersion: 1}
	if err := decodeStrict(ledgerFile, b, &doc); err != nil && len(b) > 0 {
		return nil, err
	}
	for id, e := range doc.Subscriptions { // null is the zero entry: refused as a missing credential state
		bad := slices.IndexFunc(e.Windows, func(w planWindow) bool { return !(w.UsedFraction >= 0 && w.UsedFraction <= 1) })
		if err := firstBroken([]rule{{!isSubscriptionID(id), fmt.Sprintf("subscriptions member %q is not sub_<16 hex>", id)},
			{e.Credential.State != credActive && e.Credential.State != credNeedsReauth,
				fmt.Sprintf("subscriptions.%s.credential.state %q is not %q or %q", id, e.Credential.State, credActive, credNeedsReauth)},
			{bad >= 0, fmt.Sprintf("subscriptions.%s.windows[%d].used_fraction is outside [0,1]", id, bad)}}); err != nil {
			return nil, fmt.Errorf("%s: %w", ledgerFile, err)
		}
	}
	return doc.Subscriptions, nil
}

// entry is a copy of id's record; a missing one reads as an active credential.
func (l *ledger) entry(id string) ledgerEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[id]
	e.Credential.State = cmp.Or(e.Credential.State, credActive) // a stored record always states one
	e.Windows = slices.Clone(e.Windows)
	return e
}

// ledgerSentence is how a cause, reason or detail is kept (SPEC §10.3).
func ledgerSentence(s string) string { return cleanQuoted(s, "", maxSentenceChars) }

// recordWindows replaces the windows with the same ids and appends new ones. A usage report is a whole reading: a window it
// no longer names is gone (kept, it would make the subscription due forever).
func (l *ledger) recordWindows(id, provider string, ws []planWindow) {
	l.mutate(id, provider, false, func(e *ledgerEntry, _ time.Time) {
		if len(ws) > 0 && ws[0].Source == windowSourceReport {
			e.Windows = slices.DeleteFunc(e.Windows, func(old planWindow) bool {
				return old.Source == windowSourceReport && !slices.ContainsFunc(ws, func(w planWindow) bool { return w.ID == old.ID })
			})
		}
		for _, w := range ws {
			w.UsedFraction = planFraction(w.UsedFraction)
			if i := slices.IndexFunc(e.Windows, func(old planWindow) bool { return old.ID == w.ID }); i >= 0 {
				e.Windows[i] = w
			} else {
				e.Windows = append(e.Windows, w)
			}
		}
	})
}

// block blocks id after a rate or quota refusal (SPEC §7.2.4) for the stated wait, else to the last reset of a used-up window,
// else defaultBlock, at most maxRetryAfter. It returns this block's end; of two racing refusals the later end is recorded.
func (l *ledger) block(id, provider string, stated time.Duration, reason string) (until time.Time) {
	l.mutate(id, provider, true, func(e *ledgerEntry, now time.Time) {
		used := time.Duration(0)
		for _, w := range e.Windows {
			if at := time.UnixMilli(w.ResetsAtMs); w.UsedFraction >= 1 && at.After(now) {
				used = max(used, at.Sub(now))
			}
		}
		until = now.Add(min(cmp.Or(max(stated, 0), used, defaultBlock), maxRetryAfter))
		if until.UnixMilli() >= e.Block.UntilMs {
			e.Block = ledgerBlock{UntilMs: until.UnixMilli(), Reason: ledgerSentence(reason), RecordedAtMs: now.UnixMilli()}
		}
	})
	return until
}

func (l *ledger) blockedUntil(id string) time.Time {
	e := l.entry(id)
	return pick(e.Block.UntilMs > l.now().UnixMilli(), time.UnixMilli(e.Block.UntilMs), time.Time{})
}

// disown records a credential only a sign-in can replace (refused, or unsendable): needs_reauthorization, for cause.
func (l *ledger) disown(id, provider, cause string) {
	l.mutate(id, provider, true, func(e *ledgerEntry, now time.Time) {
		e.Credential.State, e.Credential.Cause, e.Credential.RecordedAtMs = credNeedsReauth, ledgerSentence(cause), now.UnixMilli()
	})
}

// activate records a working grant in one write: the credential active, its expiry and last refresh (0 unknown or never).
func (l *ledger) activate(id, provider string, expiresAtMs, refreshedAtMs int64) {
	l.mutate(id, provider, true, func(e *ledgerEntry, now time.Time) {
		e.Credential = ledgerCredential{credActive, "", now.UnixMilli(), expiresAtMs, refreshedAtMs}
	})
}

func (l *ledger) recordUse(id, provider string, ok bool, in, out int) {
	l.mutate(id, provider, false, func(e *ledgerEntry, now time.Time) {
		m := &e.Measured
		m.Requests, m.Failures = m.Requests+1, m.Failures+int64(boolCount(!ok))
		m.InputTokens, m.OutputTokens = m.InputTokens+int64(max(in, 0)), m.OutputTokens+int64(max(out, 0))
		m.LastUsedMs = now.UnixMilli()
	})
}

// recordCheck records a usage read's or (at once) a probe's outcome; a refused usage read keeps the windows, a probe
// answered reactivates the credential (SPEC §10.3).
func (l *ledger) recordCheck(id, provider string, probe, ok bool, detail string) {
	l.mutate(id, provider, probe, func(e *ledgerEntry, now time.Time) {
		*pick(probe, &e.Probe, &e.UsageRead) = ledgerCheck{now.UnixMilli(), ok, ledgerSentence(detail)}
		if c := &e.Credential; probe && ok && c.State != credActive {
			c.State, c.Cause, c.RecordedAtMs = credActive, "", now.UnixMilli()
		}
	})
}

// freedom ranks id at now, lowest first (SPEC §7.2.2): blocked or not, then its highest used_fraction not yet reset.
func (l *ledger) freedom(id string, now time.Time) []float64 {
	e, full := l.entry(id), 0.0
	for _, w := range e.Windows {
		if w.ResetsAtMs == 0 || w.ResetsAtMs > now.UnixMilli() {
			full = max(full, w.UsedFraction)
		}
	}
	return []float64{float64(boolCount(e.Block.UntilMs > now.UnixMilli())), full}
}

// usageDue is SPEC §11.2's "read once when": no reading, a failed one, a reset passed or unnamed.
func usageDue(e ledgerEntry, now time.Time) bool {
	return e.UsageRead.AtMs == 0 || !e.UsageRead.OK || len(e.Windows) == 0 ||
		slices.ContainsFunc(e.Windows, func(w planWindow) bool { return w.ResetsAtMs == 0 || w.ResetsAtMs <= now.UnixMilli() })
}

// refreshDue is SPEC §11.2's: expired (not the request path's minute early), or unknown and never refreshed.
func refreshDue(g oauthGrant, refreshedAtMs int64, now time.Time) bool {
	return g.ExpiresAtMs == 0 && refreshedAtMs == 0 || g.ExpiresAtMs != 0 && now.UnixMilli() >= g.ExpiresAtMs
}

// nextDue is the earliest moment after now the ledger states something falls due (SPEC §11.2), zero if none: a grant's
// expiry, a window's reset, a block's end, unless retired (§9) or refused until a sign-in replaces the credential.
func (l *ledger) nextDue(now time.Time, retired map[string]bool) (best time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	due := func(ms int64) {
		if at := time.UnixMilli(ms); at.After(now) && (best.IsZero() || at.Before(best)) {
			best = at
		}
	}
	for id, e := range l.entries {
		if e.Credential.State != credNeedsReauth && !retired[id] {
			due(e.Credential.ExpiresAtMs)
			due(e.Block.UntilMs)
			for _, w := range e.Windows {
				due(w.ResetsAtMs)
			}
		}
	}
	return best
}

// mutate applies fn to id's record (created active) and writes it: immediate ones at once.
func (l *ledger) mutate(id, provider string, immediate bool, fn func(e *ledgerEntry, now time.Time)) {
	defer nudge(l.changed)
	l.change(immediate, func(entries map[string]ledgerEntry, now time.Time) {
		e := entries[id]
		e.Credential.State = cmp.Or(e.Credential.State, credActive)
		e.Provider = cmp.Or(provider, e.Provider)
		fn(&e, now)
		entries[id] = e
		l.statusSeq.Add(uint64(boolCount(immediate)))
	})
}

// planFraction clamps f to [0,1]; NaN reads as 0.
func planFraction(f float64) float64 { return pick(f >= 0, min(f, 1), 0) }

func newWindow(id, label string, fraction float64, resetMs int64, now time.Time, source string) planWindow {
	return planWindow{id, label, planFraction(fraction), resetMs, now.UnixMilli(), source}
}

// anthropicWindows are the claude-code windows traffic headers (by prefix) and the usage report (by member) state under one id.
var anthropicWindows = []struct{ header, member, id, label string }{
	{"anthropic-ratelimit-unified-5h", "five_hour", "anthropic:5h", "5 hours"},
	{"anthropic-ratelimit-unified-7d", "seven_day", "anthropic:7d", "7 days"},
}

// parsePlanWindows reads the plan windows an answer's headers state (SPEC §6.3); a value that does not parse is skipped.
func parsePlanWindows(provider string, h http.Header, now time.Time) (ws []planWindow) {
	get := func(key string) number { return numberOf(h.Get(key)) }
	for _, k := range anthropicWindows {
		if util := get(k.header + "-utilization"); provider == "claude-code" && util.ok {
			ws = append(ws, newWindow(k.id, k.label, util.v, get(k.header+"-reset").ms, now, windowSourceTraffic))
		}
	}
	for _, which := range []string{"primary", "secondary"} {
		codex := func(k string) number { return get("x-codex-" + which + "-" + k) }
		r := codexReading{codex("used-percent"), codex("window-minutes"), codex("reset-after-seconds"), codex("reset-at")}
		r.Seconds.v *= 60 // the header states minutes
		if w, ok := r.codexWindow(which, now, windowSourceTraffic); provider == "codex" && ok {
			ws = append(ws, w)
		}
	}
	return ws
}

// codexReading is one codex window as headers or the usage report's rate_limit member state it.
type codexReading struct {
	UsedPercent number `json:"used_percent"`
	Seconds     number `json:"limit_window_seconds"`
	After       number `json:"reset_after_seconds"`
	ResetAt     number `json:"reset_at"`
}

// codexWindow is r as window which, if it states a percent: headers' countdown wins over reset-at, a report's reset_at over
// its countdown, whose 0 there is an untouched window's (no moment, or every pass would fall due inside itself); a window
// the plan lacks (length 0) states no reset.
func (r codexReading) codexWindow(which string, now time.Time, source string) (planWindow, bool) {
	w := newWindow("codex:"+which, windowLabel(r.Seconds.v/60, which+" window"), r.UsedPercent.v/100, r.ResetAt.ms, now, source)
	traffic, after := source == windowSourceTraffic, r.After.v
	if r.Seconds.ok && r.Seconds.v == 0 {
		w.ResetsAtMs = 0
	} else if r.After.ok && after >= 0 && after < planMaxResetSeconds && (traffic || after > 0 && r.ResetAt.ms == 0) {
		w.ResetsAtMs = epochMs(float64(now.UnixMilli()) + after*1000)
	}
	return w, r.UsedPercent.ok
}

// number is a value headers or a usage report state: v is its finite number (JSON's, or a string holding one: Kimi's
// counters, headers), 0 unless ok; ms the moment it names (SPEC §11.2: RFC 3339, epoch seconds, or epoch ms from 1e12 on,
// as 1e12 s would be year 33658), 0 for none; set when a report states it at all, even as null.
type number struct {
	v       float64
	ms      int64
	ok, set bool
}

func (n *number) UnmarshalJSON(b []byte) error {
	*n = numberOf(strings.Trim(string(b), `"`)) // a JSON number, or a string holding one
	n.set = true
	return nil
}

func numberOf(s string) number {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
		return number{v: f, ok: true, ms: epochMs(pick(f < 1e12, f*1000, f))}
	}
	tm, _ := time.Parse(time.RFC3339Nano, strings.TrimSpace(s)) // unparsed, it is year 1: before the epoch, no moment
	return number{ms: epochMs(float64(tm.UnixMilli()))}
}

func epochMs(f float64) int64 { return pick(f > 0 && f <= planMaxResetSeconds*1000, int64(f), 0) }

// windowLabel names a window of mins minutes in whole days, hours or minutes ("5 hours"), else fallback.
func windowLabel(mins float64, fallback string) string {
	units := [...]string{"day", "hour", "minute"}
	for i, per := range [...]int64{24 * 60, 60, 1} {
		if n := int64(mins); mins >= 1 && mins < planMaxResetSeconds && mins == math.Trunc(mins) && n%per == 0 {
			return strconv.FormatInt(n/per, 10) + " " + units[i] + strings.Repeat("s", boolCount(n != per))
		}
	}
	return fallback
}
