package main

import (
	"math"
	"net/http"
	"testing"

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
