package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Plan windows say how much of a plan is spent, from answers' headers (SPEC
// §6.3) and usage reports (SPEC §11.2), under one id so either replaces the other.

// Where a plan window's reading came from.
const (
	windowSourceTraffic = "traffic"      // a subscription answer's headers (SPEC §6.3)
	windowSourceReport  = "usage_report" // a usage report read (SPEC §11.2)
)

// planWindow is one plan window's latest reading.
type planWindow struct {
	ID           string  `json:"id"` // anthropic:5h, anthropic:7d, codex:primary, codex:secondary, kimi:usage, kimi:limit-<i>
	Label        string  `json:"label"`
	UsedFraction float64 `json:"used_fraction"` // clamped to [0,1]
	ResetsAtMs   int64   `json:"resets_at_ms"`  // 0 unknown
	RecordedAtMs int64   `json:"recorded_at_ms"`
	Source       string  `json:"source"` // windowSourceTraffic or windowSourceReport
}

func newWindow(id, label string, fraction float64, resetMs int64, now time.Time, source string) planWindow {
	return planWindow{ID: id, Label: label, UsedFraction: planFraction(fraction), ResetsAtMs: resetMs,
		RecordedAtMs: now.UnixMilli(), Source: source}
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

// planMaxResetSeconds bounds a reset instant or delay (about year 5138), so ms cannot overflow.
const planMaxResetSeconds = 1e11

// anthropicWindow is a claude-code window that traffic headers (by header
// key) and the usage report (by member) both state, under one id.
type anthropicWindow struct{ header, member, id, label string }

var anthropicWindows = []anthropicWindow{
	{"5h", "five_hour", "anthropic:5h", "5 hours"},
	{"7d", "seven_day", "anthropic:7d", "7 days"},
}

// parsePlanWindows reads the plan windows an answer's headers state (SPEC
// §6.3); a value that does not parse is skipped, never guessed.
func parsePlanWindows(provider string, h http.Header, now time.Time) []planWindow {
	var ws []planWindow
	num := func(key string) (float64, bool) { return parseNumber(h.Get(key)) }
	switch provider {
	case "claude-code":
		for _, k := range anthropicWindows {
			key := "anthropic-ratelimit-unified-" + k.header
			if util, ok := num(key + "-utilization"); ok {
				reset, _ := num(key + "-reset") // epoch seconds
				if !(reset > 0 && reset < planMaxResetSeconds) {
					reset = 0
				}
				ws = append(ws, newWindow(k.id, k.label, util, int64(reset*1000), now, windowSourceTraffic))
			}
		}
	case "codex":
		for _, which := range []string{"primary", "secondary"} {
			key := "x-codex-" + which + "-"
			if pct, ok := num(key + "used-percent"); ok {
				mins, hasMins := num(key + "window-minutes")
				w := newWindow("codex:"+which, windowLabel(mins, which+" window"), pct/100, 0, now, windowSourceTraffic)
				switch after, ok := num(key + "reset-after-seconds"); {
				case hasMins && mins == 0: // a window the plan lacks states no reset
				case ok && after >= 0 && after < planMaxResetSeconds:
					w.ResetsAtMs = now.UnixMilli() + int64(after*1000)
				default:
					if at, _ := num(key + "reset-at"); at > 0 && at < planMaxResetSeconds { // epoch seconds, without the countdown
						w.ResetsAtMs = int64(at * 1000)
					}
				}
				ws = append(ws, w)
			}
		}
	}
	return ws
}

func parseNumber(s string) (float64, bool) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// windowLabel names a window of mins minutes in whole days, hours or
// minutes ("5 hours"), or is fallback when mins is no whole number in range.
func windowLabel(mins float64, fallback string) string {
	if !(mins >= 1) || mins >= planMaxResetSeconds || mins != math.Trunc(mins) {
		return fallback
	}
	n, unit := int64(mins), "minute"
	switch {
	case n%(24*60) == 0:
		n, unit = n/(24*60), "day"
	case n%60 == 0:
		n, unit = n/60, "hour"
	}
	if n == 1 {
		return "1 " + unit
	}
	return strconv.FormatInt(n, 10) + " " + unit + "s"
}

// usageReports is SPEC §11.2's reports: the path below the base URL (codex's lives elsewhere), the
// reader, what a report naming no window lacks, whether an API key reads it, the chat route's headers.
var usageReports = map[string]struct {
	path    string
	read    func(report, time.Time) []planWindow
	none    string
	apiKey  bool
	headers [][2]string
}{
	"claude-code": {path: "/api/oauth/usage", read: claudeCodeUsage,
		none:    "no member with utilization and resets_at",
		headers: [][2]string{{"anthropic-version", "2023-06-01"}, {"anthropic-beta", "oauth-2025-04-20"}}},
	"codex": {read: codexUsage,
		none:    "no rate_limit with a primary_window or secondary_window with used_percent",
		headers: [][2]string{{"OpenAI-Beta", "responses=experimental"}, {"originator", "codex_cli_rs"}}},
	"kimi": {path: "/usages", read: kimiUsage, apiKey: true,
		none: "no usage or limits entry with a limit above 0"},
}

// codexUsageURL is overridden by BRAMA_PROVIDER_CODEX_USAGE_URL alone.
const codexUsageURL = "https://chatgpt.com/backend-api/wham/usage"

// usageReportable says whether provider publishes a report cred can read.
func usageReportable(provider string, cred vaultCredential) bool {
	r, ok := usageReports[provider]
	return ok && (cred.OAuth != nil || (r.apiKey && cred.APIKey != ""))
}

// errUsageReport classifies every refused report body: the readers take what
// they recognize of the providers' undocumented shapes, never a guessed number.
var errUsageReport = errors.New("the usage report is not usable")

// usageMaxResetMs bounds a reset instant, so arithmetic cannot overflow.
const usageMaxResetMs = planMaxResetSeconds * 1000

// report is one JSON object of a provider report, read leniently.
type report map[string]json.RawMessage

// parseUsage reads the report of provider (one in usageReports): a JSON object
// naming a window, else errUsageReport saying why without quoting the body.
func parseUsage(provider string, body []byte, now time.Time) ([]planWindow, error) {
	var r report
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%w: the body is not a JSON object (%s)", errUsageReport, jsonErrorKind(err))
	}
	if r == nil {
		return nil, fmt.Errorf("%w: the body is not a JSON object (null)", errUsageReport)
	}
	u := usageReports[provider]
	if ws := u.read(r, now); len(ws) > 0 {
		return ws, nil
	}
	return nil, fmt.Errorf("%w: it names no plan window (%s)", errUsageReport, u.none)
}

// jsonErrorKind says what was wrong with a JSON document without quoting a fragment of it.
func jsonErrorKind(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return "syntax error at byte " + strconv.FormatInt(se.Offset, 10)
	}
	return "unexpected shape"
}

// asReport is raw as an object, or nil when it is absent, null or not one.
func asReport(raw json.RawMessage) report {
	var r report
	if json.Unmarshal(raw, &r) != nil {
		return nil
	}
	return r
}

func (r report) obj(key string) report { return asReport(r[key]) }

func (r report) str(key string) string {
	s, _ := jsonString(r[key])
	return s
}

// num is the first of keys holding a finite number, or a string holding one (Kimi's counters).
func (r report) num(keys ...string) (float64, bool) {
	for _, k := range keys {
		s, ok := jsonString(r[k])
		if !ok {
			s = string(r[k])
		}
		if f, ok := parseNumber(s); ok {
			return f, true
		}
	}
	return 0, false
}

// instant is the first of keys holding an instant (SPEC §11.2), in epoch ms; 0 none.
func (r report) instant(keys ...string) int64 {
	for _, k := range keys {
		f, ok := r.num(k)
		if t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(r.str(k))); err == nil {
			f, ok = float64(t.UnixMilli()), true
		} else if f < 1e12 { // ≥ 1e12 ⇒ ms (1e12 s would be year 33658)
			f *= 1000
		}
		if ms, inRange := usageMs(f); ok && inRange {
			return ms
		}
	}
	return 0
}

// usageMs keeps epoch milliseconds after the epoch and within usageMaxResetMs.
func usageMs(f float64) (int64, bool) {
	if !(f > 0 && f <= usageMaxResetMs) {
		return 0, false
	}
	return int64(f), true
}

// claudeWindowKey is the shape of a member kept as a window id.
var claudeWindowKey = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// claudeCodeUsage reads {base}/api/oauth/usage: a member with "utilization" percent and "resets_at"
// is a window, anthropicWindows first under their traffic ids, then anthropic:<member> by name.
func claudeCodeUsage(r report, now time.Time) []planWindow {
	var ws []planWindow
	add := func(k, id, label string) {
		m := r.obj(k)
		_, hasReset := m["resets_at"]
		if util, ok := m.num("utilization"); ok && hasReset && claudeWindowKey.MatchString(k) {
			ws = append(ws, newWindow(id, label, util/100, m.instant("resets_at"), now, windowSourceReport))
		}
	}
	for _, w := range anthropicWindows {
		add(w.member, w.id, w.label)
	}
	for _, k := range slices.Sorted(maps.Keys(r)) {
		if !slices.ContainsFunc(anthropicWindows, func(w anthropicWindow) bool { return w.member == k }) {
			add(k, "anthropic:"+k, strings.ReplaceAll(k, "_", " "))
		}
	}
	return ws
}

// codexUsage reads rate_limit's windows (SPEC §11.2); reset_at wins over reset_after_seconds,
// whose 0 is an untouched window's: no moment, or every pass would fall due inside itself.
func codexUsage(r report, now time.Time) []planWindow {
	rl := r.obj("rate_limit")
	var ws []planWindow
	for _, which := range []string{"primary", "secondary"} {
		m := rl.obj(which + "_window")
		pct, ok := m.num("used_percent")
		if !ok {
			continue
		}
		label := which + " window"
		secs, hasLength := m.num("limit_window_seconds")
		if hasLength && secs < planMaxResetSeconds {
			label = windowLabel(secs/60, label)
		}
		reset := m.instant("reset_at")
		if after, ok := m.num("reset_after_seconds"); reset == 0 && ok && after > 0 && after < planMaxResetSeconds {
			reset, _ = usageMs(float64(now.UnixMilli()) + after*1000)
		}
		if hasLength && secs == 0 { // a window the plan lacks: its reset_at is the read's moment, no reset
			reset = 0
		}
		ws = append(ws, newWindow("codex:"+which, label, pct/100, reset, now, windowSourceReport))
	}
	return ws
}

// kimiTimeUnits is minutes per window.timeUnit of a Kimi limit.
var kimiTimeUnits = map[string]float64{
	"TIME_UNIT_SECOND": 1.0 / 60, "TIME_UNIT_MINUTE": 1, "TIME_UNIT_HOUR": 60, "TIME_UNIT_DAY": 24 * 60,
}

// kimiUsage reads {base}/usages (SPEC §11.2); detail's counters win over the top level's.
func kimiUsage(r report, now time.Time) []planWindow {
	var ws []planWindow
	u := r.obj("usage") // nil when absent: it has no fraction
	if f, ok := kimiFraction(u); ok {
		ws = append(ws, newWindow("kimi:usage", "plan usage", f, u.instant("reset_time", "resetTime"), now, windowSourceReport))
	}
	var limits []json.RawMessage
	json.Unmarshal(r["limits"], &limits) // not an array: no limits
	for i, raw := range limits {
		top := asReport(raw)
		counters := top
		if d := top.obj("detail"); d != nil {
			counters = d
		}
		f, ok := kimiFraction(counters)
		if !ok {
			continue
		}
		w := top.obj("window")
		d, _ := w.num("duration")
		label := windowLabel(d*kimiTimeUnits[w.str("timeUnit")], "limit "+strconv.Itoa(i))
		reset := cmp.Or(counters.instant("resetTime", "reset_time"), top.instant("resetTime", "reset_time"))
		ws = append(ws, newWindow("kimi:limit-"+strconv.Itoa(i), label, f, reset, now, windowSourceReport))
	}
	return ws
}

// kimiFraction is used/limit (limit > 0), or else 1 − remaining/limit.
func kimiFraction(m report) (float64, bool) {
	limit, ok := m.num("limit")
	if !ok || limit <= 0 {
		return 0, false
	}
	if used, ok := m.num("used"); ok {
		return used / limit, true
	}
	if rem, ok := m.num("remaining"); ok {
		return (limit - rem) / limit, true
	}
	return 0, false
}
