package main

import (
	"net/http"
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
	entered, release := make(chan struct{}), make(chan struct{})
	first := true
	fx.fake.handle(fakeKimiUsage, func(w http.ResponseWriter, r *http.Request) {
		if first {
			first = false
			close(entered)
			<-release
		}
		fx.fake.defaultAnswer(w, r)
	})
	id := fx.donate(t, "kimi", vaultCredential{APIKey: "plantedKimiKey"})
	fx.start(t)
	select {
	case <-entered:
	case <-time.After(maintWait):
		t.Fatal("the start pass never read the report")
	}
	// While the start pass holds its read, a 429 blocks the subscription for
	// a minute, and two minutes go by before the pass ends.
	fx.l.block(id, "kimi", maintT0.Add(time.Minute), "HTTP 429")
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
