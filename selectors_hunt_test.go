package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// twoProviderOutcomes are the provider answers of TestSelectorTwoProviders.
var twoProviderOutcomes = []string{"ok", "401", "429ra", "429", "quota402", "400", "422", "500", "cut", "malformed"}

// selectorCandidateWant is how one candidate on a pool of two ends: its
// calls, and whether the walk moves on (SPEC §7.3).
func selectorCandidateWant(o string) (calls int, moveOn bool) {
	switch o {
	case "401", "403", "429ra", "429", "quota402", "quota429":
		return 2, true // the whole pool refused
	case "400", "404", "413", "422":
		return 1, true // a request the provider would not run
	}
	return 1, false // a success, or answered at once: potentially billable
}

// twoProviderWant is the answer of any over kimi/m-<o1> then openai/m-<o2>.
func twoProviderWant(o1, o2 string) matrixWant {
	c1, on := selectorCandidateWant(o1)
	if !on {
		w := oneCallWant(o1)
		return matrixWant{w.status, w.code, c1, w.retryAfter}
	}
	c2, on2 := selectorCandidateWant(o2)
	if !on2 {
		w := oneCallWant(o2)
		return matrixWant{w.status, w.code, c1 + c2, w.retryAfter}
	}
	both := []string{o1, o2}
	has := func(os ...string) bool { return slices.Contains(os, o1) || slices.Contains(os, o2) }
	ra := ""
	for _, o := range both { // the earliest block's end (SPEC §7.2.5)
		switch {
		case o == "429ra":
			ra = "30"
		case ra == "" && (o == "429" || o == "quota402"):
			ra = "900"
		}
	}
	switch {
	case has("429ra", "429"):
		return matrixWant{429, "provider_rate_limited", c1 + c2, ra}
	case has("quota402"):
		return matrixWant{502, "provider_quota_exhausted", c1 + c2, ""}
	case has("401"):
		return matrixWant{503, "subscription_reauthorization_required", c1 + c2, ""}
	}
	var status int
	fmt.Sscan(o2, &status)
	return matrixWant{status, "provider_rejected", c1 + c2, ""}
}

// TestSelectorTwoProviders: any over two providers, each a pool of two, in
// every combination of outcomes: the calls the providers saw equal
// Brama-Attempts and the envelope's attempts, the answer is SPEC §7.3's,
// and an exhausted walk's message names every candidate route it tried.
func TestSelectorTwoProviders(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	testingOnlyNow = clock.now
	defer func() { testingOnlyNow = nil }()
	fake, calls := matrixProvider(t)
	env := stateEnv(t)
	env["BRAMA_REPLAY_GUARD_SECS"] = "0"
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	d := startDaemon(t, env, "")
	put := func(alias, route string) {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, fmt.Sprintf(`{"alias":%q,"route":%q}`, alias, route)); s != 200 {
			t.Fatalf("PUT %s: %d %s", alias, s, b)
		}
	}
	n := 0
	for _, o1 := range twoProviderOutcomes {
		for _, o2 := range twoProviderOutcomes {
			t.Run(o1+"/"+o2, func(t *testing.T) {
				n++
				agent := fmt.Sprintf("tp%d", n)
				tok, _ := agentWithSubs(t, d, agent, "kimi", agent+"-k1", agent+"-k2")
				donate(t, d, agent, "openai", agent+"-o1")
				donate(t, d, agent, "openai", agent+"-o2")
				put("c1", "kimi/m-"+o1) // kimi before openai: ties go by provider id
				put("c2", "openai/m-"+o2)
				w := twoProviderWant(o1, o2)
				before := calls.Load()
				status, hdr, body := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, ""))
				got := int(calls.Load() - before)
				if status != w.status || got != w.calls {
					t.Fatalf("%d after %d calls, want %d after %d: %s", status, got, w.status, w.calls, body)
				}
				if a := hdr.Get("Brama-Attempts"); a != fmt.Sprint(got) {
					t.Errorf("Brama-Attempts %q, the providers saw %d calls", a, got)
				}
				if ra := hdr.Get("Retry-After"); ra != w.retryAfter {
					t.Errorf("Retry-After %q, want %q", ra, w.retryAfter)
				}
				if w.code == "" {
					return
				}
				e := envelopeOf(t, body)
				if e["code"] != w.code || e["attempts"] != float64(got) {
					t.Errorf("code %v attempts %v, want %s with %d", e["code"], e["attempts"], w.code, got)
				}
				if _, on := selectorCandidateWant(o2); on && w.calls > 1 { // exhausted: every candidate named
					for _, route := range []string{"kimi/m-" + o1, "openai/m-" + o2} {
						if msg, _ := e["message"].(string); !strings.Contains(msg, route+": ") {
							t.Errorf("the exhausted message does not name candidate %s: %s", route, msg)
						}
					}
				}
			})
		}
	}
}
