package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestMaintainServesAMomentThatPassedDuringAPass proves SPEC §11.2's "a
// pass starts at each moment the ledger states": a block recorded while a
// pass runs, ending before that pass ends, is a pass right after it, not a
// moment the timer skipped because it was already past when it was armed.
func TestMaintainServesAMomentThatPassedDuringAPass(t *testing.T) {
	fx := newMaintFixture(t)
	entered, release := fx.holdFirstUsageRead()
	id := fx.donate(t, "kimi", vaultCredential{APIKey: "plantedKimiKey"})
	fx.start(t)
	select {
	case <-entered:
	case <-time.After(maintWait):
		t.Fatal("the start pass never read the report")
	}
	// While the start pass holds its read, a 429 blocks the subscription for
	// a minute, and two minutes go by before the pass ends.
	fx.l.block(id, "kimi", time.Minute, "HTTP 429")
	fx.clock.advance(2 * time.Minute)
	close(release)
	if ev := fx.nextPass(t); ev.reason != "start" {
		t.Fatalf("first pass = %s", ev.reason)
	}
	if ev := fx.nextPass(t); ev.reason != "due" || !ev.started.Equal(maintT0.Add(2*time.Minute)) {
		t.Fatalf("pass after the start pass = %s at %s, want due at the block's passed end", ev.reason, ev.started)
	}
	if got := reasonsAt(fx.sentinel(t)); !cmp.Equal(got, []string{"maintain@2m0s"}) {
		t.Errorf("passes after the due one = %v, want only the sentinel", got)
	}
}

// TestSubscriptionListingShowsAPassAtOnce proves SPEC §10.2's "every local
// mutation invalidates the cache at once" for a pass: right after `brama
// maintain` reports a refused refresh, the listing shows the credential
// needs_reauthorization and the failed read, not a row cached before it.
func TestSubscriptionListingShowsAPassAtOnce(t *testing.T) {
	fake := newMaintProviderFake(t, &testClock{t: time.Now()})
	fake.handle("/token/claude-code", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"invalid_grant","error_description":"revoked"}`, http.StatusBadRequest)
	})
	d, _ := maintDaemon(t, fake)
	if status, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); status != http.StatusOK {
		t.Fatalf("first pass: %d %s", status, b) // the start pass is over, too
	}
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token,
		`{"provider":"claude-code","oauth":{"access_token":"plantedAccessCC","refresh_token":"plantedRefreshCC","expires_at_ms":1}}`)
	id := donatedID(t, status, b, "a1", "claude-code")
	if got := credentialStateOf(t, d, "a1", id); got != credActive {
		t.Fatalf("before the pass: credential %s", got)
	}
	if status, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); status != http.StatusOK || !strings.Contains(string(b), `"refused":1`) {
		t.Fatalf("maintain: %d %s, want one refused refresh", status, b)
	}
	if got := credentialStateOf(t, d, "a1", id); got != credNeedsReauth {
		t.Errorf("listing right after the pass: credential %s, want %s", got, credNeedsReauth)
	}
}

// TestMaintainIgnoresMomentsOfRetiredSubscriptions proves a retired
// subscription states no moment (SPEC §9: it is never refreshed, probed or
// read, so nothing of it falls due): the one timer is armed for the live
// subscription's grant expiry, not the earlier one of the retired grant.
func TestMaintainIgnoresMomentsOfRetiredSubscriptions(t *testing.T) {
	fx := newMaintFixture(t)
	retiredAt, liveAt := maintT0.Add(time.Hour), maintT0.Add(2*time.Hour)
	gone := fx.donate(t, "claude-code", grant("GONE", retiredAt))
	if err := fx.inv.setRetired("retire", "a1", gone, "left the team"); err != nil {
		t.Fatal(err)
	}
	fx.donate(t, "claude-code", grant("LIVE", liveAt))
	ctx := context.Background()
	fx.m.request("asked", "a1")
	if !fx.m.loopOnce(ctx, fx.clock.now()) {
		t.Fatal("loopOnce with a pass pending ran none")
	}
	fx.nextPass(t)
	if fx.m.loopOnce(ctx, fx.clock.now()) {
		t.Fatal("loopOnce ran a pass with none pending")
	}
	if at := fx.timers.nextArmed(t); !at.Equal(liveAt) {
		t.Errorf("timer armed for %s, want the live grant's expiry %s (the retired one's is %s)", at, liveAt, retiredAt)
	}
	if due := fx.m.metrics()["brama_maintenance_next_due_timestamp_seconds"]; due != float64(liveAt.Unix()) {
		t.Errorf("/metrics next due = %v, want %d", due, liveAt.Unix())
	}
}

// TestMaintainRearmsWhenASubscriptionRetires: retiring the subscription
// whose moment the timer waits for re-arms it for the next live moment,
// stopping the timer it replaces.
func TestMaintainRearmsWhenASubscriptionRetires(t *testing.T) {
	fx := newMaintFixture(t)
	soonAt, laterAt := maintT0.Add(time.Hour), maintT0.Add(2*time.Hour)
	soon := fx.donate(t, "claude-code", grant("SOON", soonAt))
	fx.donate(t, "claude-code", grant("LATER", laterAt))
	fx.start(t)
	fx.nextPass(t)
	if at := fx.timers.nextArmed(t); !at.Equal(soonAt) {
		t.Fatalf("timer armed for %s, want %s", at, soonAt)
	}
	if err := fx.inv.setRetired("retire", "a1", soon, "left the team"); err != nil {
		t.Fatal(err)
	}
	if at := fx.timers.nextArmed(t); !at.Equal(laterAt) {
		t.Errorf("after the retirement the timer is armed for %s, want %s", at, laterAt)
	}
	fx.timers.mu.Lock()
	defer fx.timers.mu.Unlock()
	if ft := fx.timers.timers[0]; !ft.at.Equal(soonAt) || ft.Stop() { // Stop reports whether it was still armed
		t.Errorf("the timer for %s is still armed beside its replacement", ft.at)
	}
}

// TestSubscriptionListingShowsAFailedUsageReadAtOnce: a usage read is not a
// status change of the ledger's (it is written behind), so it is the pass
// itself that clears the listing cache (SPEC §10.2): the failed read shows
// in the next listing, not after the TTL.
func TestSubscriptionListingShowsAFailedUsageReadAtOnce(t *testing.T) {
	fake := newMaintProviderFake(t, &testClock{t: time.Now()})
	fake.handle(fakeKimiUsage, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"busy"}`, http.StatusInternalServerError)
	})
	d, _ := maintDaemon(t, fake)
	if status, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); status != http.StatusOK {
		t.Fatalf("first pass: %d %s", status, b)
	}
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"plantedKimiKey"}`)
	id := donatedID(t, status, b, "a1", "kimi")
	if _, _, b := d.call("GET", "/v1/admin/subscriptions/a1", d.token, ""); !strings.Contains(string(b), `"usage_read":null`) {
		t.Fatalf("before the pass (now cached): %s", b)
	}
	if status, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); status != http.StatusOK {
		t.Fatalf("maintain: %d %s", status, b)
	}
	_, _, b = d.call("GET", "/v1/admin/subscriptions/a1", d.token, "")
	if !strings.Contains(string(b), id) || !strings.Contains(string(b), `"usage_read":{`) || !strings.Contains(string(b), `"ok":false`) {
		t.Errorf("listing right after the pass does not show the failed read: %s", b)
	}
}

// TestMaintainUntouchedCodexWindowStatesNoMoment: codex reports a window
// nobody used yet as reset_after_seconds 0 with reset_at null, and a window
// the plan does not have as limit_window_seconds 0 with reset_at at the read.
// Neither states a reset moment; read as "resets now" it would be a moment
// inside the pass that read it, so every pass would be followed by another.
func TestMaintainUntouchedCodexWindowStatesNoMoment(t *testing.T) {
	for _, tc := range []struct{ name, window string }{
		{"untouched", `{"used_percent":0,"limit_window_seconds":18000,"reset_after_seconds":0,"reset_at":null}`},
		{"absent from the plan", `{"used_percent":0,"limit_window_seconds":0,"reset_after_seconds":0,"reset_at":%d}`},
		{"absent, the provider's clock 5 s ahead", `{"used_percent":0,"limit_window_seconds":0,"reset_at":%d}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newMaintFixture(t)
			fx.fake.handle(fakeCodexUsage, func(w http.ResponseWriter, r *http.Request) {
				window := tc.window
				if strings.Contains(window, "%d") {
					ahead := int64(0)
					if strings.Contains(tc.name, "ahead") {
						ahead = 5
					}
					window = fmt.Sprintf(window, fx.clock.now().Unix()+ahead)
				}
				fx.clock.advance(time.Second) // a read takes time
				w.Write([]byte(`{"rate_limit":{"primary_window":` + window + `}}`))
			})
			fx.donate(t, "codex", grant("CODEX", maintT0.Add(30*24*time.Hour)))
			ctx := context.Background()
			fx.m.request("asked", "a1")
			if !fx.m.loopOnce(ctx, fx.clock.now()) {
				t.Fatal("loopOnce with a pass pending ran none")
			}
			if ev := fx.nextPass(t); ev.rep.Usage.Read != 1 {
				t.Fatalf("pass read %d reports, want 1: %+v", ev.rep.Usage.Read, ev.rep)
			}
			for _, wait := range []time.Duration{0, 5 * time.Second} { // arms the timer, then meets it
				fx.clock.advance(wait)
				if fx.m.loopOnce(ctx, fx.clock.now()) {
					t.Fatalf("a second pass ran %v after the first (reason due); reads so far: %d", wait, fx.fake.count(fakeCodexUsage))
				}
			}
		})
	}
}
