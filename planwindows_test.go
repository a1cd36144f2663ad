package main

import (
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParsePlanWindows(t *testing.T) {
	now := ledgerT0
	ms := now.UnixMilli()
	cases := []struct {
		name     string
		provider string
		headers  map[string]string
		want     []planWindow
	}{
		{name: "claude-code 5h and 7d", provider: "claude-code", headers: map[string]string{
			"anthropic-ratelimit-unified-5h-utilization": "0.42",
			"anthropic-ratelimit-unified-5h-reset":       "1790000000",
			"anthropic-ratelimit-unified-7d-utilization": "0.1",
			"anthropic-ratelimit-unified-7d-reset":       "1790500000",
		}, want: []planWindow{
			{ID: "anthropic:5h", Label: "5 hours", UsedFraction: 0.42, ResetsAtMs: 1790000000000, RecordedAtMs: ms, Source: "traffic"},
			{ID: "anthropic:7d", Label: "7 days", UsedFraction: 0.1, ResetsAtMs: 1790500000000, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "claude-code clamps and ignores bad resets", provider: "claude-code", headers: map[string]string{
			"anthropic-ratelimit-unified-5h-utilization": "1.7",
			"anthropic-ratelimit-unified-5h-reset":       "-5",
			"anthropic-ratelimit-unified-7d-utilization": " -0.2 ",
			"anthropic-ratelimit-unified-7d-reset":       "soon",
		}, want: []planWindow{
			{ID: "anthropic:5h", Label: "5 hours", UsedFraction: 1, RecordedAtMs: ms, Source: "traffic"},
			{ID: "anthropic:7d", Label: "7 days", UsedFraction: 0, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "claude-code bad utilization skips the window", provider: "claude-code", headers: map[string]string{
			"anthropic-ratelimit-unified-5h-utilization": "NaN",
			"anthropic-ratelimit-unified-5h-reset":       "1790000000",
			"anthropic-ratelimit-unified-7d-utilization": "half",
			"anthropic-ratelimit-unified-7d-reset":       "1e400",
		}},
		{name: "codex primary and secondary", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":          "25",
			"x-codex-primary-window-minutes":        "300",
			"x-codex-primary-reset-after-seconds":   "600",
			"x-codex-secondary-used-percent":        "80.5",
			"x-codex-secondary-window-minutes":      "10080",
			"x-codex-secondary-reset-after-seconds": "86400",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "5 hours", UsedFraction: 0.25, ResetsAtMs: ms + 600_000, RecordedAtMs: ms, Source: "traffic"},
			{ID: "codex:secondary", Label: "7 days", UsedFraction: 0.805, ResetsAtMs: ms + 86400_000, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex odd minutes, clamped percent, bad reset", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":          "250",
			"x-codex-primary-window-minutes":        "45",
			"x-codex-primary-reset-after-seconds":   "-1",
			"x-codex-secondary-used-percent":        "-3",
			"x-codex-secondary-window-minutes":      "1.5",
			"x-codex-secondary-reset-after-seconds": "Inf",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "45 minutes", UsedFraction: 1, RecordedAtMs: ms, Source: "traffic"},
			{ID: "codex:secondary", Label: "secondary window", UsedFraction: 0, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex reset-at (epoch seconds) without the countdown", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":     "7",
			"x-codex-primary-window-minutes":   "300",
			"x-codex-primary-reset-at":         "1790000000",
			"x-codex-secondary-used-percent":   "100",
			"x-codex-secondary-reset-at":       "1790500000",
			"x-codex-secondary-window-minutes": "10080",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "5 hours", UsedFraction: 0.07, ResetsAtMs: 1790000000000, RecordedAtMs: ms, Source: "traffic"},
			{ID: "codex:secondary", Label: "7 days", UsedFraction: 1, ResetsAtMs: 1790500000000, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex countdown wins over reset-at", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":        "7",
			"x-codex-primary-reset-at":            "1790000000",
			"x-codex-primary-reset-after-seconds": "600",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "primary window", UsedFraction: 0.07, ResetsAtMs: ms + 600_000, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex zero-length window states no reset", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":   "0",
			"x-codex-primary-window-minutes": "0",
			"x-codex-primary-reset-at":       "1790000000",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "primary window", UsedFraction: 0, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex one hour, missing secondary", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":   "0",
			"x-codex-primary-window-minutes": "60",
		}, want: []planWindow{
			{ID: "codex:primary", Label: "1 hour", UsedFraction: 0, RecordedAtMs: ms, Source: "traffic"},
		}},
		{name: "codex bad percent skips the window", provider: "codex", headers: map[string]string{
			"x-codex-primary-used-percent":        "25%",
			"x-codex-primary-reset-after-seconds": "60",
		}},
		{name: "other providers state none", provider: "anthropic", headers: map[string]string{
			"anthropic-ratelimit-unified-5h-utilization": "0.5",
			"x-codex-primary-used-percent":               "25",
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range c.headers {
				h.Set(k, v)
			}
			if diff := cmp.Diff(c.want, parsePlanWindows(c.provider, h, now)); diff != "" {
				t.Errorf("windows mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzPlanWindows(f *testing.F) {
	f.Add("0.42", "1790000000", "1.5", "-1", "25", "300", "600")
	f.Add("NaN", "1e400", "-0", "9e18", "Inf", "0x10", "-0.0001")
	f.Fuzz(func(t *testing.T, util5, reset5, util7, pct, mins, after, reset7 string) {
		now := ledgerT0
		h := http.Header{}
		h.Set("anthropic-ratelimit-unified-5h-utilization", util5)
		h.Set("anthropic-ratelimit-unified-5h-reset", reset5)
		h.Set("anthropic-ratelimit-unified-7d-utilization", util7)
		h.Set("anthropic-ratelimit-unified-7d-reset", reset7)
		for _, w := range []string{"primary", "secondary"} {
			h.Set("x-codex-"+w+"-used-percent", pct)
			h.Set("x-codex-"+w+"-window-minutes", mins)
			h.Set("x-codex-"+w+"-reset-after-seconds", after)
		}
		for _, p := range []string{"claude-code", "codex", "kimi"} {
			for _, w := range parsePlanWindows(p, h, now) {
				if !(w.UsedFraction >= 0 && w.UsedFraction <= 1) || math.IsNaN(w.UsedFraction) {
					t.Fatalf("%s %s: used_fraction %v outside [0,1]", p, w.ID, w.UsedFraction)
				}
				if w.ResetsAtMs < 0 {
					t.Fatalf("%s %s: negative reset %d", p, w.ID, w.ResetsAtMs)
				}
				if w.Label == "" || w.Source != "traffic" || w.RecordedAtMs != now.UnixMilli() {
					t.Fatalf("%s: malformed window %+v", p, w)
				}
			}
		}
	})
}

// usageT0 is the injected "now" of the parser tests.
var usageT0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// uw is a usage_report window recorded at usageT0.
func uw(id, label string, frac float64, resetMs int64) planWindow {
	return planWindow{ID: id, Label: label, UsedFraction: frac, ResetsAtMs: resetMs, RecordedAtMs: usageT0.UnixMilli(), Source: "usage_report"}
}

func TestParseUsageReports(t *testing.T) {
	ms := usageT0.UnixMilli()
	const resetISO, resetMs = "2030-01-02T08:00:00.5+00:00", int64(1893571200500)
	cases := []struct {
		name     string
		provider string
		body     string
		want     []planWindow
		wantErr  string // substring; "" means accepted
	}{
		{name: "claude-code published shape", provider: "claude-code", body: `{
			"five_hour":{"utilization":24.0,"resets_at":"` + resetISO + `"},
			"seven_day":{"utilization":36,"resets_at":1893900000},
			"seven_day_sonnet":{"utilization":1.0,"resets_at":null},
			"seven_day_opus":null,
			"seven_day_oauth_apps":{"utilization":null,"resets_at":null},
			"extra_usage":{"is_enabled":true,"monthly_limit":100,"used_credits":5,"utilization":5.0}}`,
			want: []planWindow{
				uw("anthropic:5h", "5 hours", 0.24, resetMs),
				uw("anthropic:7d", "7 days", 0.36, 1893900000000),
				uw("anthropic:seven_day_sonnet", "seven day sonnet", 0.01, 0),
			}},
		{name: "claude-code clamps and reads epoch ms", provider: "claude-code",
			body: `{"five_hour":{"utilization":180,"resets_at":1893571200500},"seven_day":{"utilization":-4,"resets_at":"soon"}}`,
			want: []planWindow{uw("anthropic:5h", "5 hours", 1, resetMs), uw("anthropic:7d", "7 days", 0, 0)}},
		{name: "claude-code odd member names are not ids", provider: "claude-code",
			body: `{"Five Hour":{"utilization":10,"resets_at":null},"five_hour":{"utilization":"10","resets_at":null}}`,
			want: []planWindow{uw("anthropic:5h", "5 hours", 0.1, 0)}},
		{name: "claude-code no window", provider: "claude-code", body: `{"extra_usage":{"utilization":3}}`, wantErr: "names no plan window"},
		{name: "claude-code not an object", provider: "claude-code", body: `[1,2]`, wantErr: "not a JSON object"},
		{name: "claude-code null", provider: "claude-code", body: `null`, wantErr: "not a JSON object"},
		{name: "claude-code not JSON", provider: "claude-code", body: `<html>sk-ant-oat01-secret</html>`, wantErr: "syntax error"},

		{name: "codex published shape", provider: "codex", body: `{"plan_type":"pro","rate_limit":{"allowed":true,
			"primary_window":{"used_percent":3,"limit_window_seconds":18000,"reset_after_seconds":15858,"reset_at":1893571200},
			"secondary_window":{"used_percent":9.5,"limit_window_seconds":604800,"reset_after_seconds":489450}}}`,
			want: []planWindow{
				uw("codex:primary", "5 hours", 0.03, 1893571200000),
				uw("codex:secondary", "7 days", 0.095, ms+489450_000),
			}},
		{name: "codex secondary null, odd window, clamped", provider: "codex",
			body: `{"rate_limit":{"primary_window":{"used_percent":"250","limit_window_seconds":90,"reset_at":"2030-01-02T08:00:00.5Z"},"secondary_window":null}}`,
			want: []planWindow{uw("codex:primary", "primary window", 1, resetMs)}},
		{name: "codex bad resets are unknown", provider: "codex",
			body: `{"rate_limit":{"primary_window":{"used_percent":50,"reset_at":-5,"reset_after_seconds":-1}}}`,
			want: []planWindow{uw("codex:primary", "primary window", 0.5, 0)}},
		{name: "codex no rate_limit", provider: "codex", body: `{"detail":"Unauthorized"}`, wantErr: "no rate_limit"},
		{name: "codex windows without used_percent", provider: "codex", body: `{"rate_limit":{"primary_window":{"limit_window_seconds":18000}}}`, wantErr: "names no plan window"},

		{name: "kimi published shape", provider: "kimi", body: `{
			"user":{"userId":"u1"},
			"usage":{"limit":"100","used":"4","remaining":"96","resetTime":"` + resetISO + `"},
			"limits":[
				{"window":{"duration":300,"timeUnit":"TIME_UNIT_MINUTE"},"detail":{"limit":"100","used":"18","remaining":"82","resetTime":"2030-01-02T04:00:00Z"}},
				{"window":{"duration":7,"timeUnit":"TIME_UNIT_DAY"},"detail":{"limit":"1000","remaining":"750"}}]}`,
			want: []planWindow{
				uw("kimi:usage", "plan usage", 0.04, resetMs),
				uw("kimi:limit-0", "5 hours", 0.18, 1893556800000),
				uw("kimi:limit-1", "7 days", 0.25, 0),
			}},
		{name: "kimi SPEC names, counters at top level", provider: "kimi", body: `{
			"usage":{"limit":500,"remaining":400,"reset_time":1893571200},
			"limits":[
				{"limit":100,"used":150,"reset_time":"1893571200500","window":{"duration":5,"timeUnit":"TIME_UNIT_HOUR"}},
				{"limit":0,"used":1},
				"junk",
				{"detail":{"limit":10,"used":1},"resetTime":1893571200,"window":{"duration":1,"timeUnit":"TIME_UNIT_FORTNIGHT"}}]}`,
			want: []planWindow{
				uw("kimi:usage", "plan usage", 0.2, 1893571200000),
				uw("kimi:limit-0", "5 hours", 1, resetMs),
				uw("kimi:limit-3", "limit 3", 0.1, 1893571200000),
			}},
		{name: "kimi limit 0 names nothing", provider: "kimi", body: `{"usage":{"limit":"0","used":"0"},"limits":{}}`, wantErr: "names no plan window"},
		{name: "kimi empty", provider: "kimi", body: `{}`, wantErr: "names no plan window"},
		{name: "kimi not JSON", provider: "kimi", body: ``, wantErr: "not a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseUsage(tc.provider, []byte(tc.body), usageT0)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if !errors.Is(err, errUsageReport) {
					t.Errorf("err %v is not errUsageReport", err)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Errorf("the error quotes the body: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("windows (-want +got):\n%s", diff)
			}
		})
	}
}

func TestUsageInstant(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		want int64 // 0: unknown
	}{
		{name: "rfc3339", raw: `"2030-01-02T03:04:05Z"`, want: 1893553445000},
		{name: "rfc3339 offset and fraction", raw: `"2030-01-02T04:04:05.25+01:00"`, want: 1893553445250},
		{name: "epoch seconds", raw: `1893553445`, want: 1893553445000},
		{name: "epoch seconds fraction", raw: `1893553445.5`, want: 1893553445500},
		{name: "epoch ms", raw: `1893553445123`, want: 1893553445123},
		{name: "just below the ms threshold is seconds", raw: `999999999999`, want: 0}, // year 33658: past the bound
		{name: "numeric string", raw: `" 1893553445 "`, want: 1893553445000},
		{name: "zero", raw: `0`},
		{name: "negative", raw: `-1893553445`},
		{name: "before the epoch", raw: `"1969-12-31T23:59:59Z"`},
		{name: "too far", raw: `1e15`},
		{name: "null", raw: `null`},
		{name: "bool", raw: `true`},
		{name: "words", raw: `"tomorrow"`},
		{name: "NaN string", raw: `"NaN"`},
		{name: "Inf string", raw: `"+Inf"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := (report{"t": json.RawMessage(tc.raw)}).instant("t"); got != tc.want {
				t.Errorf("instant(%s) = %d; want %d", tc.raw, got, tc.want)
			}
		})
	}
}

// checkUsageParse is the fuzz invariant shared by the three reports: no
// panic, every error classified, every accepted window well-formed and
// re-encodable.
func checkUsageParse(t *testing.T, provider, prefix string, data []byte) {
	ws, err := parseUsage(provider, data, usageT0)
	if err != nil {
		if !errors.Is(err, errUsageReport) {
			t.Fatalf("unclassified error: %v", err)
		}
		if ws != nil {
			t.Fatalf("windows returned with an error")
		}
		return
	}
	if len(ws) == 0 {
		t.Fatal("accepted a report naming no window")
	}
	seen := map[string]bool{}
	for _, w := range ws {
		switch {
		case !(w.UsedFraction >= 0 && w.UsedFraction <= 1):
			t.Fatalf("window %s fraction %v outside [0,1]", w.ID, w.UsedFraction)
		case w.ResetsAtMs < 0 || w.ResetsAtMs > usageMaxResetMs:
			t.Fatalf("window %s reset %d out of range", w.ID, w.ResetsAtMs)
		case !strings.HasPrefix(w.ID, prefix) || seen[w.ID]:
			t.Fatalf("window id %q is not a fresh %s… id", w.ID, prefix)
		case w.Source != "usage_report" || w.RecordedAtMs != usageT0.UnixMilli():
			t.Fatalf("window %s has source %q recorded %d", w.ID, w.Source, w.RecordedAtMs)
		}
		seen[w.ID] = true
	}
	b, err := json.Marshal(ws)
	if err != nil {
		t.Fatalf("accepted windows do not encode: %v", err)
	}
	var back []planWindow
	if err := json.Unmarshal(b, &back); err != nil || !cmp.Equal(back, ws) {
		t.Fatalf("windows do not round-trip: %v", err)
	}
}

func FuzzUsageClaudeCode(f *testing.F) {
	f.Add([]byte(`{"five_hour":{"utilization":24.0,"resets_at":"2026-01-02T19:59:59.600956+00:00"},"seven_day":{"utilization":36.0,"resets_at":null}}`))
	f.Add([]byte(`{"five_hour":{"utilization":1e309,"resets_at":1e300},"x":{"utilization":-1,"resets_at":"1893553445123"}}`))
	f.Add([]byte(`{"seven_day_opus":null,"extra_usage":{"utilization":null}}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkUsageParse(t, "claude-code", "anthropic:", data) })
}

func FuzzUsageCodex(f *testing.F) {
	f.Add([]byte(`{"rate_limit":{"primary_window":{"used_percent":3,"limit_window_seconds":18000,"reset_at":1767385852},"secondary_window":{"used_percent":9,"limit_window_seconds":604800,"reset_after_seconds":489450}}}`))
	f.Add([]byte(`{"rate_limit":{"primary_window":{"used_percent":"NaN","reset_after_seconds":1e308},"secondary_window":{"used_percent":-1e308,"limit_window_seconds":-60}}}`))
	f.Add([]byte(`{"rate_limit":null}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkUsageParse(t, "codex", "codex:", data) })
}

func FuzzUsageKimi(f *testing.F) {
	f.Add([]byte(`{"usage":{"limit":"100","used":"4","remaining":"96","resetTime":"2026-02-11T17:32:50.757941Z"},"limits":[{"window":{"duration":300,"timeUnit":"TIME_UNIT_MINUTE"},"detail":{"limit":"100","remaining":"85","resetTime":"2026-02-07T12:32:50Z"}}]}`))
	f.Add([]byte(`{"usage":{"limit":1e-320,"used":1e308},"limits":[{"limit":"1","remaining":"-1e308","window":{"duration":1e308,"timeUnit":"TIME_UNIT_DAY"}},null,[]]}`))
	f.Add([]byte(`{"limits":"none","usage":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkUsageParse(t, "kimi", "kimi:", data) })
}

// TestRefusalHeadersUpdatePlanWindows proves SPEC §6.3's "every
// subscription answer's headers update the ledger" for a refusal too: the
// 429 that says the 7-day window is spent shows in the listing as a full
// window with its reset, not the earlier answer's reading.
func TestRefusalHeadersUpdatePlanWindows(t *testing.T) {
	reset := time.Now().Add(72 * time.Hour).Unix()
	var refuse atomic.Bool
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("anthropic-ratelimit-unified-7d-reset", strconv.FormatInt(reset, 10))
		if refuse.Load() {
			w.Header().Set("anthropic-ratelimit-unified-7d-utilization", "1.0")
			w.Header().Set("anthropic-ratelimit-unified-7d-status", "rejected")
			http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"weekly limit reached"}}`, http.StatusTooManyRequests)
			return
		}
		w.Header().Set("anthropic-ratelimit-unified-7d-utilization", "0.5")
		io.WriteString(w, protocolFixtures[1].buffered)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, "no refresh expected", http.StatusInternalServerError)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	id := donateGrant(t, d, "acc-one", "ref-one", time.Now().Add(time.Hour).UnixMilli())
	chat := chatBody(dialectMessages, "claude-code/claude-test", false, "")
	if status, _, b := d.call("POST", "/v1/messages", tok, chat); status != http.StatusOK {
		t.Fatalf("first call: %d %s", status, b)
	}
	refuse.Store(true)
	if status, _, b := d.call("POST", "/v1/messages", tok, chat); status != http.StatusTooManyRequests {
		t.Fatalf("second call: %d %s, want 429", status, b)
	}
	_, _, b := d.call("GET", "/v1/admin/subscriptions/a1", d.token, "")
	var body struct {
		Subscriptions []struct {
			ID      string       `json:"id"`
			Windows []planWindow `json:"windows"`
		} `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &body); err != nil || len(body.Subscriptions) != 1 || body.Subscriptions[0].ID != id {
		t.Fatalf("listing: %v %s", err, b)
	}
	ws := body.Subscriptions[0].Windows
	if len(ws) != 1 || ws[0].ID != "anthropic:7d" || ws[0].UsedFraction != 1 || ws[0].ResetsAtMs != reset*1000 {
		t.Errorf("windows after the 429 = %+v, want anthropic:7d full, resetting at %d", ws, reset*1000)
	}
}

// TestBlockKeepsTheStatedResetWhenRetryAfterHasPassed: a Retry-After date
// already past on Brama's clock (the provider's clock is behind) states no
// wait, so the block ends at the reset the plan-window headers state (SPEC
// §7.2.4), not 15 minutes from now, which would spend a refused call every
// 15 minutes until the weekly window resets.
func TestBlockKeepsTheStatedResetWhenRetryAfterHasPassed(t *testing.T) {
	reset := time.Now().Add(72 * time.Hour).Unix()
	provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Retry-After", time.Now().Add(-30*time.Second).UTC().Format(http.TimeFormat))
		w.Header().Set("anthropic-ratelimit-unified-7d-utilization", "1.0")
		w.Header().Set("anthropic-ratelimit-unified-7d-reset", strconv.FormatInt(reset, 10))
		w.Header().Set("anthropic-ratelimit-unified-7d-status", "rejected")
		http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"weekly limit reached"}}`, http.StatusTooManyRequests)
	})
	tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		http.Error(w, "no refresh expected", http.StatusInternalServerError)
	})
	d, tok := oauthSetup(t, provider, tokenEndpoint)
	donateGrant(t, d, "acc-one", "ref-one", time.Now().Add(time.Hour).UnixMilli())
	if status, _, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, "")); status != http.StatusTooManyRequests {
		t.Fatalf("call: %d %s, want 429", status, b)
	}
	_, _, b := d.call("GET", "/v1/admin/subscriptions/a1", d.token, "")
	var body struct {
		Subscriptions []struct {
			Block *ledgerBlock `json:"block"`
		} `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &body); err != nil || len(body.Subscriptions) != 1 || body.Subscriptions[0].Block == nil {
		t.Fatalf("listing: %v %s", err, b)
	}
	if got := body.Subscriptions[0].Block.UntilMs; got < reset*1000 || got >= (reset+1)*1000 { // the reset's second
		t.Errorf("block until %s, want the stated weekly reset %s", time.UnixMilli(got).UTC(), time.Unix(reset, 0).UTC())
	}
}

// TestBareRefusalBlocksUntilTheUsedUpWindowResets: a 429 stating no reset
// blocks until the reset of a window the ledger holds as used up (SPEC
// §7.2.4: "retry-after, reset headers, or the window reset"), not 15 min
// (a call refused every 15 min for hours); a window not used up says nothing.
func TestBareRefusalBlocksUntilTheUsedUpWindowResets(t *testing.T) {
	for _, tc := range []struct {
		name     string
		used     string
		wantHour bool
	}{
		{"a used-up 5h window", "1.0", true},
		{"a window half used", "0.5", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reset := time.Now().Add(3 * time.Hour).Unix()
			var calls atomic.Int64
			provider := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if calls.Add(1) == 1 { // an answer whose headers state the window
					w.Header().Set("anthropic-ratelimit-unified-5h-utilization", tc.used)
					w.Header().Set("anthropic-ratelimit-unified-5h-reset", strconv.FormatInt(reset, 10))
					w.Header().Set("Content-Type", "application/json")
					io.WriteString(w, protocolFixtures[1].buffered)
					return
				}
				http.Error(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, http.StatusTooManyRequests)
			})
			tokenEndpoint := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				http.Error(w, "no refresh expected", http.StatusInternalServerError)
			})
			d, tok := oauthSetup(t, provider, tokenEndpoint)
			donateGrant(t, d, "acc-one", "ref-one", time.Now().Add(time.Hour).UnixMilli())
			if status, _, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, "")); status != 200 {
				t.Fatalf("first call: %d %s", status, b)
			}
			status, h, b := d.call("POST", "/v1/messages", tok, chatBody(dialectMessages, "claude-code/claude-test", false, ""))
			wait, _ := strconv.Atoi(h.Get("Retry-After"))
			if status != http.StatusTooManyRequests {
				t.Fatalf("second call: %d %s, want 429", status, b)
			}
			if hours := wait > 2*3600; hours != tc.wantHour || !tc.wantHour && wait > 900 {
				t.Errorf("Retry-After %d s, want the window's reset (%v) or at most 15 min", wait, tc.wantHour)
			}
		})
	}
}
