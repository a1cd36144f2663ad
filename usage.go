package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The providers' usage reports (SPEC §11.2): what a subscription's plan
// windows stand at, read without spending plan quota. Each parser turns one
// report body into plan windows (source "usage_report") the ledger keeps
// beside those read from traffic headers (SPEC §6.3); the maintenance pass
// (maintain.go) fetches the bodies. The shapes are the providers' own and
// undocumented, so every parser reads what it recognizes, skips what it
// does not, and never guesses a number.

// errUsageReport classifies every refusal of a usage report body: the body
// is not a JSON object, or it names no plan window. Parsers wrap it.
var errUsageReport = errors.New("the usage report is not usable")

// usageMaxResetMs bounds a reset instant (about year 5138, planMaxResetSeconds),
// so arithmetic on it cannot overflow and a nonsense value is not kept.
const usageMaxResetMs = planMaxResetSeconds * 1000

// usageEpochMsFrom is where an epoch number stops being seconds and starts
// being milliseconds (SPEC §11.2: ≥ 1e12 ⇒ ms; 1e12 s would be year 33658).
const usageEpochMsFrom = 1e12

// usageObject decodes body as a JSON object of raw members. A body that is
// not one is errUsageReport, described without quoting it (a report body
// could hold account details).
func usageObject(body []byte) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, fmt.Errorf("%w: the body is not a JSON object (%s)", errUsageReport, jsonErrorKind(err))
	}
	if obj == nil {
		return nil, fmt.Errorf("%w: the body is not a JSON object (null)", errUsageReport)
	}
	return obj, nil
}

// usageMember returns the object under key of obj, or nil when it is absent,
// null or not an object.
func usageMember(obj map[string]json.RawMessage, key string) map[string]json.RawMessage {
	raw, ok := obj[key]
	if !ok {
		return nil
	}
	var sub map[string]json.RawMessage
	if json.Unmarshal(raw, &sub) != nil {
		return nil
	}
	return sub
}

// usageNumber reads raw as a finite number: a JSON number, or a string
// holding one (Kimi sends counters as strings). Anything else is not one.
func usageNumber(raw json.RawMessage) (float64, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, false
	}
	var s string
	if raw[0] == '"' {
		if json.Unmarshal(raw, &s) != nil {
			return 0, false
		}
		s = strings.TrimSpace(s)
	} else {
		s = string(raw)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// usageField is the first of keys present in obj with a number.
func usageField(obj map[string]json.RawMessage, keys ...string) (float64, bool) {
	for _, k := range keys {
		if raw, ok := obj[k]; ok {
			if f, ok := usageNumber(raw); ok {
				return f, true
			}
		}
	}
	return 0, false
}

// usageInstant reads raw as an instant in epoch milliseconds (SPEC §11.2):
// an RFC 3339 string, or epoch seconds or milliseconds as a number or a
// numeric string (≥ 1e12 ⇒ milliseconds). It reports false for anything
// else, for a moment at or before the epoch and for one past
// usageMaxResetMs: an unreadable reset is unknown, never guessed.
func usageInstant(raw json.RawMessage) (int64, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, false
		}
		if t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(s)); err == nil {
			return usageMs(float64(t.UnixMilli()))
		}
	}
	f, ok := usageNumber(raw)
	if !ok {
		return 0, false
	}
	if f < usageEpochMsFrom {
		f *= 1000
	}
	return usageMs(f)
}

// usageMs keeps an epoch-milliseconds value that is after the epoch and
// before usageMaxResetMs.
func usageMs(f float64) (int64, bool) {
	if !(f > 0 && f <= usageMaxResetMs) {
		return 0, false
	}
	return int64(f), true
}

// usageInstantField is the first of keys in obj holding a readable instant.
func usageInstantField(obj map[string]json.RawMessage, keys ...string) int64 {
	for _, k := range keys {
		if raw, ok := obj[k]; ok {
			if ms, ok := usageInstant(raw); ok {
				return ms
			}
		}
	}
	return 0
}

// usageNoWindows is the refusal of a report that parsed but named no window.
func usageNoWindows(what string) error {
	return fmt.Errorf("%w: it names no plan window (%s)", errUsageReport, what)
}

// claudeWindowKey is the shape of a claude-code report member Brama keeps
// as a window; other members are ignored, so odd keys never become ids.
var claudeWindowKey = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// claudeWindowIDs maps the report's names of the windows traffic headers
// also state (SPEC §6.3) to the same ids, so each reading replaces the
// other's.
var claudeWindowIDs = map[string]struct{ id, label string }{
	"five_hour": {"anthropic:5h", "5 hours"},
	"seven_day": {"anthropic:7d", "7 days"},
}

// parseClaudeCodeUsage reads GET {base}/api/oauth/usage: members such as
// five_hour, seven_day or seven_day_opus holding {"utilization": percent,
// "resets_at": instant|null}. A member is a window only when it is an object
// with both keys and a numeric utilization; so a null member, a disabled
// model window (utilization null) and extra_usage (no resets_at: credits,
// not a plan window) are skipped. five_hour and seven_day become
// anthropic:5h and anthropic:7d; any other member anthropic:<name>.
func parseClaudeCodeUsage(body []byte, now time.Time) ([]planWindow, error) {
	obj, err := usageObject(body)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	// five_hour, then seven_day, then the rest by name: a stable order.
	slices.SortFunc(keys, func(a, b string) int {
		rank := func(k string) int {
			switch k {
			case "five_hour":
				return 0
			case "seven_day":
				return 1
			}
			return 2
		}
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	var ws []planWindow
	for _, k := range keys {
		if !claudeWindowKey.MatchString(k) {
			continue
		}
		m := usageMember(obj, k)
		if m == nil {
			continue
		}
		rawReset, hasReset := m["resets_at"]
		util, ok := usageField(m, "utilization")
		if !ok || !hasReset {
			continue
		}
		id, label := "anthropic:"+k, strings.ReplaceAll(k, "_", " ")
		if known, ok := claudeWindowIDs[k]; ok {
			id, label = known.id, known.label
		}
		reset, _ := usageInstant(rawReset)
		ws = append(ws, usageWindow(id, label, util/100, reset, now))
	}
	if len(ws) == 0 {
		return nil, usageNoWindows("no member with utilization and resets_at")
	}
	return ws, nil
}

// parseCodexUsage reads the codex report (GET …/backend-api/wham/usage):
// rate_limit.primary_window and secondary_window, each {"used_percent",
// "limit_window_seconds", "reset_at" | "reset_after_seconds"}, become
// codex:primary and codex:secondary, the ids traffic headers use (SPEC §6.3).
// reset_at (an instant) wins over reset_after_seconds (from now).
func parseCodexUsage(body []byte, now time.Time) ([]planWindow, error) {
	obj, err := usageObject(body)
	if err != nil {
		return nil, err
	}
	rl := usageMember(obj, "rate_limit")
	if rl == nil {
		return nil, usageNoWindows("no rate_limit object")
	}
	var ws []planWindow
	for _, which := range []string{"primary", "secondary"} {
		m := usageMember(rl, which+"_window")
		if m == nil {
			continue
		}
		pct, ok := usageField(m, "used_percent")
		if !ok {
			continue
		}
		label := which + " window"
		if secs, ok := usageField(m, "limit_window_seconds"); ok && secs >= 60 && secs < planMaxResetSeconds && math.Mod(secs, 60) == 0 {
			label = planWindowLabel(int64(secs / 60))
		}
		reset := usageInstantField(m, "reset_at")
		if after, ok := usageField(m, "reset_after_seconds"); reset == 0 && ok && after >= 0 && after < planMaxResetSeconds {
			reset, _ = usageMs(float64(now.UnixMilli()) + after*1000)
		}
		ws = append(ws, usageWindow("codex:"+which, label, pct/100, reset, now))
	}
	if len(ws) == 0 {
		return nil, usageNoWindows("rate_limit has no primary_window or secondary_window with used_percent")
	}
	return ws, nil
}

// kimiTimeUnits is minutes per window.timeUnit of a Kimi limit.
var kimiTimeUnits = map[string]float64{
	"TIME_UNIT_SECOND": 1.0 / 60, "TIME_UNIT_MINUTE": 1, "TIME_UNIT_HOUR": 60, "TIME_UNIT_DAY": 24 * 60,
}

// parseKimiUsage reads GET {base}/usages. The usage object (limit > 0 with
// used, or remaining; reset_time or resetTime) becomes kimi:usage; each
// limits[i] becomes kimi:limit-<i>, its counters and reset at its top level
// or under detail (detail wins), labelled by window.duration and timeUnit.
// Counters may be numbers or numeric strings.
func parseKimiUsage(body []byte, now time.Time) ([]planWindow, error) {
	obj, err := usageObject(body)
	if err != nil {
		return nil, err
	}
	var ws []planWindow
	if u := usageMember(obj, "usage"); u != nil {
		if f, ok := kimiFraction(u); ok {
			ws = append(ws, usageWindow("kimi:usage", "plan usage", f, usageInstantField(u, "reset_time", "resetTime"), now))
		}
	}
	var limits []json.RawMessage
	if raw, ok := obj["limits"]; ok && json.Unmarshal(raw, &limits) != nil {
		limits = nil // not an array: no limits
	}
	for i, raw := range limits {
		var top map[string]json.RawMessage
		if json.Unmarshal(raw, &top) != nil || top == nil {
			continue
		}
		counters := top
		if d := usageMember(top, "detail"); d != nil {
			counters = d
		}
		f, ok := kimiFraction(counters)
		if !ok {
			continue
		}
		reset := usageInstantField(counters, "resetTime", "reset_time")
		if reset == 0 {
			reset = usageInstantField(top, "resetTime", "reset_time")
		}
		id := "kimi:limit-" + strconv.Itoa(i)
		ws = append(ws, usageWindow(id, kimiWindowLabel(usageMember(top, "window"), i), f, reset, now))
	}
	if len(ws) == 0 {
		return nil, usageNoWindows("no usage or limits entry with a limit above 0")
	}
	return ws, nil
}

// kimiFraction is used/limit from a Kimi counter object: limit > 0, and
// used, or else limit − remaining.
func kimiFraction(m map[string]json.RawMessage) (float64, bool) {
	limit, ok := usageField(m, "limit")
	if !ok || limit <= 0 {
		return 0, false
	}
	if used, ok := usageField(m, "used"); ok {
		return used / limit, true
	}
	if rem, ok := usageField(m, "remaining"); ok {
		return (limit - rem) / limit, true
	}
	return 0, false
}

// kimiWindowLabel names a limit's window ("5 hours") from duration and
// timeUnit, or "limit <i>" when they do not say.
func kimiWindowLabel(w map[string]json.RawMessage, i int) string {
	fallback := "limit " + strconv.Itoa(i)
	if w == nil {
		return fallback
	}
	d, ok := usageField(w, "duration")
	var unit string
	if raw, has := w["timeUnit"]; !ok || !has || json.Unmarshal(raw, &unit) != nil {
		return fallback
	}
	perUnit, known := kimiTimeUnits[unit]
	mins := d * perUnit
	if !known || !(mins >= 1) || mins >= planMaxResetSeconds || mins != math.Trunc(mins) {
		return fallback
	}
	return planWindowLabel(int64(mins))
}

// usageWindow is one reading from a usage report, its fraction clamped.
func usageWindow(id, label string, fraction float64, resetMs int64, now time.Time) planWindow {
	return planWindow{ID: id, Label: label, UsedFraction: planFraction(fraction), ResetsAtMs: resetMs,
		RecordedAtMs: now.UnixMilli(), Source: windowSourceReport}
}

// codexUsageURL is codex's usage report (SPEC §11.2); it lives outside the
// codex base URL, so BRAMA_PROVIDER_CODEX_USAGE_URL overrides it on its own.
const codexUsageURL = "https://chatgpt.com/backend-api/wham/usage"

// usageReadError is a failed usage report read. Its text names the endpoint,
// the HTTP status (or "no status") and the bytes received, and never quotes
// the body or a credential.
type usageReadError struct {
	Endpoint string // scheme, host and path
	Status   int    // 0: no HTTP status was received
	Received int    // body bytes received
	Err      error  // the cause; nil for a plain non-2xx answer
}

func (e *usageReadError) Error() string {
	status := "no status"
	if e.Status != 0 {
		status = "HTTP " + strconv.Itoa(e.Status)
	}
	msg := fmt.Sprintf("usage report GET %s: %s, %d bytes received", e.Endpoint, status, e.Received)
	var ue *url.Error
	switch {
	case e.Err == nil:
		return msg
	case errors.As(e.Err, &ue):
		return msg + ": " + ue.Err.Error() // the URL is already named
	}
	return msg + ": " + e.Err.Error()
}

func (e *usageReadError) Unwrap() error { return e.Err }

// usageEndpoint is where provider's report is read and how its body parses.
func (m *maintainer) usageEndpoint(provider string) (string, func([]byte, time.Time) ([]planWindow, error), error) {
	if provider == "codex" {
		raw := strings.TrimSpace(m.getenv("BRAMA_PROVIDER_CODEX_USAGE_URL"))
		if raw == "" {
			raw = codexUsageURL
		}
		if err := checkBaseURL(raw); err != nil {
			return "", nil, fmt.Errorf("BRAMA_PROVIDER_CODEX_USAGE_URL: %w: %v", errBaseURL, err)
		}
		return raw, parseCodexUsage, nil
	}
	info, ok := lookupProvider(provider)
	if !ok {
		return "", nil, fmt.Errorf("provider %q publishes no usage report", provider)
	}
	base, err := providerBaseURL(info, m.getenv)
	if err != nil {
		return "", nil, err
	}
	switch provider {
	case "claude-code":
		return base + "/api/oauth/usage", parseClaudeCodeUsage, nil
	case "kimi":
		return base + "/usages", parseKimiUsage, nil
	}
	return "", nil, fmt.Errorf("provider %q publishes no usage report", provider)
}

// fetchUsage makes one GET of provider's usage report with cred, sending
// the chat route's headers (SPEC §11.2), reads the body whole and parses
// it. There is no time limit of Brama's own: ctx is the only cancel. Every
// failure is a *usageReadError (or names a configuration problem).
func (m *maintainer) fetchUsage(ctx context.Context, provider string, cred vaultCredential) ([]planWindow, error) {
	endpoint, parse, err := m.usageEndpoint(provider)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return nil, &usageReadError{Endpoint: endpointName(endpoint), Err: err}
	}
	token := cred.APIKey
	if cred.OAuth != nil {
		token = cred.OAuth.AccessToken
	}
	h := req.Header
	h.Set("Authorization", "Bearer "+token)
	h.Set("Accept", "application/json")
	switch provider {
	case "claude-code":
		h.Set("anthropic-version", "2023-06-01")
		h.Set("anthropic-beta", "oauth-2025-04-20")
	case "codex":
		if cred.OAuth != nil && cred.OAuth.AccountID != "" {
			h.Set("chatgpt-account-id", cred.OAuth.AccountID)
		}
		h.Set("OpenAI-Beta", "responses=experimental")
		h.Set("originator", "codex_cli_rs")
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, &usageReadError{Endpoint: endpointName(endpoint), Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	re := &usageReadError{Endpoint: endpointName(endpoint), Status: resp.StatusCode, Received: len(body)}
	switch {
	case err != nil:
		re.Err = fmt.Errorf("the body ended early: %w", err)
		return nil, re
	case resp.StatusCode/100 != 2:
		return nil, re
	}
	ws, err := parse(body, m.clock())
	if err != nil {
		re.Err = err
		return nil, re
	}
	return ws, nil
}
