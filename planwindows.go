package main

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Plan windows are the provider's own account of how much of a
// subscription's plan is spent (SPEC §6.3, §11.2). The ledger keeps the
// latest reading of each; dispatch orders subscriptions by them.

// planWindow is one plan window's latest reading.
// Where a plan window's reading came from.
const (
	windowSourceTraffic = "traffic"      // a subscription answer's headers (SPEC §6.3)
	windowSourceReport  = "usage_report" // a usage report read (SPEC §11.2)
)

type planWindow struct {
	ID           string  `json:"id"` // anthropic:5h, anthropic:7d, codex:primary, codex:secondary, kimi:usage, kimi:limit-<i>
	Label        string  `json:"label"`
	UsedFraction float64 `json:"used_fraction"` // clamped to [0,1]
	ResetsAtMs   int64   `json:"resets_at_ms"`  // 0 unknown
	RecordedAtMs int64   `json:"recorded_at_ms"`
	Source       string  `json:"source"` // windowSourceTraffic or windowSourceReport
}

// planFraction keeps a fraction in [0,1]; NaN reads as 0.
func planFraction(f float64) float64 {
	switch {
	case !(f >= 0): // also NaN
		return 0
	case f > 1:
		return 1
	}
	return f
}

// planMaxResetSeconds bounds a reset instant or delay read from a header
// (about year 5138), so converting it to milliseconds cannot overflow.
const planMaxResetSeconds = 1e11

// parsePlanWindows reads the plan windows a subscription answer's headers
// state (SPEC §6.3): claude-code's unified 5h/7d utilization (a fraction)
// and reset (unix seconds), codex's primary/secondary used percent, window
// length and reset delay. A value that does not parse is skipped, never
// guessed; fractions are clamped to [0,1] and negative resets ignored.
// Other providers state none.
func parsePlanWindows(provider string, h http.Header, now time.Time) []planWindow {
	nowMs := now.UnixMilli()
	var ws []planWindow
	switch provider {
	case "claude-code":
		for _, k := range []struct{ key, id, label string }{
			{"5h", "anthropic:5h", "5 hours"},
			{"7d", "anthropic:7d", "7 days"},
		} {
			util, ok := planHeaderNumber(h, "anthropic-ratelimit-unified-"+k.key+"-utilization")
			if !ok {
				continue
			}
			w := planWindow{ID: k.id, Label: k.label, UsedFraction: planFraction(util), RecordedAtMs: nowMs, Source: windowSourceTraffic}
			if reset, ok := planHeaderNumber(h, "anthropic-ratelimit-unified-"+k.key+"-reset"); ok && reset > 0 && reset < planMaxResetSeconds {
				w.ResetsAtMs = int64(reset * 1000)
			}
			ws = append(ws, w)
		}
	case "codex":
		for _, which := range []string{"primary", "secondary"} {
			prefix := "x-codex-" + which + "-"
			pct, ok := planHeaderNumber(h, prefix+"used-percent")
			if !ok {
				continue
			}
			w := planWindow{ID: "codex:" + which, Label: which + " window", UsedFraction: planFraction(pct / 100), RecordedAtMs: nowMs, Source: windowSourceTraffic}
			if mins, ok := planHeaderNumber(h, prefix+"window-minutes"); ok && mins >= 1 && mins < planMaxResetSeconds && mins == math.Trunc(mins) {
				w.Label = planWindowLabel(int64(mins))
			}
			if after, ok := planHeaderNumber(h, prefix+"reset-after-seconds"); ok && after >= 0 && after < planMaxResetSeconds {
				w.ResetsAtMs = nowMs + int64(after*1000)
			}
			ws = append(ws, w)
		}
	}
	return ws
}

// planHeaderNumber parses header key as a finite number.
func planHeaderNumber(h http.Header, key string) (float64, bool) {
	v := strings.TrimSpace(h.Get(key))
	if v == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// planWindowLabel names a window length in whole days, hours or minutes.
func planWindowLabel(mins int64) string {
	n, unit := mins, "minute"
	switch {
	case mins%(24*60) == 0:
		n, unit = mins/(24*60), "day"
	case mins%60 == 0:
		n, unit = mins/60, "hour"
	}
	if n == 1 {
		return "1 " + unit
	}
	return strconv.FormatInt(n, 10) + " " + unit + "s"
}
