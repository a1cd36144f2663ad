package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLedgerRow(t *testing.T) {
	ms := ledgerT0.UnixMilli()
	item := overlayItem{ID: ledgerIDA, Provider: "claude-code", AgentID: "jeden", Label: "work", CreatedAt: "2025-10-01T00:00:00Z"}
	cases := []struct {
		name    string
		set     func(l *ledger)
		retired bool
		want    string
	}{
		{name: "never recorded", set: func(*ledger) {}, want: `{"id":"` + ledgerIDA + `","provider":"claude-code","label":"work","status":"active","windows":[],"block":null,
			"credential":{"state":"active","cause":"","recorded_at_ms":0,"expires_at_ms":0,"refreshed_at_ms":0},
			"measured":{"requests":0,"failures":0,"input_tokens":0,"output_tokens":0,"last_used_ms":0},"usage_read":null,"probe":null,"stale":false}`},
		{name: "blocked, probed, fresh window", set: func(l *ledger) {
			l.recordWindows(ledgerIDA, "claude-code", []planWindow{{ID: "anthropic:5h", Label: "5 hours", UsedFraction: 0.5, ResetsAtMs: ms + 1000, RecordedAtMs: ms, Source: "traffic"}})
			l.block(ledgerIDA, "claude-code", time.Minute, "429 rate limited")
			l.recordCheck(ledgerIDA, "claude-code", true, true, "ok")
			l.recordCheck(ledgerIDA, "claude-code", false, true, "")
		}, want: `{"id":"` + ledgerIDA + `","provider":"claude-code","label":"work","status":"active",
			"windows":[{"id":"anthropic:5h","label":"5 hours","used_fraction":0.5,"resets_at_ms":1759320001000,"recorded_at_ms":1759320000000,"source":"traffic"}],
			"block":{"until_ms":1759320060000,"reason":"429 rate limited","recorded_at_ms":1759320000000},
			"credential":{"state":"active","cause":"","recorded_at_ms":0,"expires_at_ms":0,"refreshed_at_ms":0},
			"measured":{"requests":0,"failures":0,"input_tokens":0,"output_tokens":0,"last_used_ms":0},
			"usage_read":{"at_ms":1759320000000,"ok":true,"detail":""},"probe":{"at_ms":1759320000000,"ok":true,"detail":"ok"},"stale":false}`},
		{name: "ended block is null, passed reset is stale", set: func(l *ledger) {
			l.recordWindows(ledgerIDA, "claude-code", []planWindow{{ID: "anthropic:5h", Label: "5 hours", UsedFraction: 0.9, ResetsAtMs: ms, RecordedAtMs: ms - 1000, Source: "traffic"}})
			l.now = func() time.Time { return ledgerT0.Add(-time.Hour) } // a minute's block an hour ago
			l.block(ledgerIDA, "claude-code", time.Minute, "429")
		}, want: `{"id":"` + ledgerIDA + `","provider":"claude-code","label":"work","status":"active",
			"windows":[{"id":"anthropic:5h","label":"5 hours","used_fraction":0.9,"resets_at_ms":1759320000000,"recorded_at_ms":1759319999000,"source":"traffic"}],
			"block":null,"credential":{"state":"active","cause":"","recorded_at_ms":0,"expires_at_ms":0,"refreshed_at_ms":0},
			"measured":{"requests":0,"failures":0,"input_tokens":0,"output_tokens":0,"last_used_ms":0},"usage_read":null,"probe":null,"stale":true}`},
		{name: "failed usage read is stale", set: func(l *ledger) {
			l.recordCheck(ledgerIDA, "claude-code", false, false, "usage report answered 503")
			l.recordUse(ledgerIDA, "claude-code", true, 3, 4)
		}, want: `{"id":"` + ledgerIDA + `","provider":"claude-code","label":"work","status":"active","windows":[],"block":null,
			"credential":{"state":"active","cause":"","recorded_at_ms":0,"expires_at_ms":0,"refreshed_at_ms":0},
			"measured":{"requests":1,"failures":0,"input_tokens":3,"output_tokens":4,"last_used_ms":1759320000000},
			"usage_read":{"at_ms":1759320000000,"ok":false,"detail":"usage report answered 503"},"probe":null,"stale":true}`},
		{name: "retired shows disabled", retired: true, set: func(l *ledger) {
			l.disown(ledgerIDA, "claude-code", "invalid_grant")
		}, want: `{"id":"` + ledgerIDA + `","provider":"claude-code","label":"work","status":"retired","windows":[],"block":null,
			"credential":{"state":"disabled","cause":"invalid_grant","recorded_at_ms":1759320000000,"expires_at_ms":0,"refreshed_at_ms":0},
			"measured":{"requests":0,"failures":0,"input_tokens":0,"output_tokens":0,"last_used_ms":0},"usage_read":null,"probe":null,"stale":false}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, _, _, _ := newTestLedger(state{dir: t.TempDir()})
			c.set(l)
			b, err := json.Marshal((&inventory{l: l}).row(item, c.retired, ledgerT0))
			if err != nil {
				t.Fatal(err)
			}
			var got, want any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(c.want), &want); err != nil {
				t.Fatalf("want: %v", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("row mismatch (-want +got):\n%s", diff)
			}
			if c.retired && l.entry(ledgerIDA).Credential.State == credDisabled {
				t.Error("disabled was stored")
			}
		})
	}
}
