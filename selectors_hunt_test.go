package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
// every combination of outcomes (and four first outcomes as streams): the calls the providers saw equal
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
	for i, o1 := range append(twoProviderOutcomes, "401", "429", "400", "500") { // then four as streams
		stream := i >= len(twoProviderOutcomes)
		for _, o2 := range twoProviderOutcomes {
			t.Run(fmt.Sprintf("%s/%s/stream=%v", o1, o2, stream), func(t *testing.T) {
				n++
				agent := fmt.Sprintf("tp%d", n)
				tok, _ := agentWithSubs(t, d, agent, "kimi", agent+"-k1", agent+"-k2")
				donate(t, d, agent, "openai", agent+"-o1")
				donate(t, d, agent, "openai", agent+"-o2")
				put("c1", "kimi/m-"+o1) // kimi before openai: ties go by provider id
				put("c2", "openai/m-"+o2)
				w := twoProviderWant(o1, o2)
				if _, on := selectorCandidateWant(o1); stream && on && o2 == "malformed" {
					w = matrixWant{200, "", w.calls, ""} // committed, then failed in-band (SPEC §7.5)
				}
				before := calls.Load()
				var status int
				var hdr http.Header
				var body []byte
				if stream {
					resp := d.openStream("/v1/chat/completions", tok, chatBody(dialectChat, "any", true, ""))
					status, hdr = resp.StatusCode, resp.Header
					body, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				} else {
					status, hdr, body = d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, ""))
				}
				w.check(t, int(calls.Load()-before), status, hdr, body)
				if w.code == "" {
					return
				}
				e := envelopeOf(t, body)
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
	logs := logsBesidesFirstStart(d.stderr.String())
	for i := 1; i <= n; i++ { // the donated keys only in the vault
		for _, k := range []string{"-k1", "-k2", "-o1", "-o2"} {
			assertNoSecret(t, fmt.Sprintf("tp%d%s", i, k), logs, env["BRAMA_STATE_DIR"])
		}
	}
}

// TestSelectorCandidateOrder: the models any, any-vision-capable, best and
// an alias to best walk, in SPEC §7.3's order, seen by the providers.
func TestSelectorCandidateOrder(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req struct {
			Model string `json:"model"`
		}
		json.Unmarshal(body, &req)
		mu.Lock()
		seen = append(seen, req.Model)
		mu.Unlock()
		http.Error(w, `{"error":{"type":"invalid_request_error","message":"no such model"}}`, 404)
	})
	model := func(id, date, in, out string) string {
		return fmt.Sprintf(`%q:{"id":%q,"release_date":%q,"modalities":{"input":[%s],"output":[%s]}}`, id, id, date, in, out)
	}
	catalogue := filepath.Join(t.TempDir(), "models.json")
	os.WriteFile(catalogue, []byte(`{"moonshotai":{"models":{`+strings.Join([]string{
		model("k-old", "2024-01-01", `"text"`, `"text"`), // the fourth newest text model
		model("k-b", "2025-05-01", `"text"`, `"text"`),
		model("k-a", "2025-05-01", `"text","image"`, `"text"`), // ties go by id
		model("k-emb", "2025-12-01", `"text"`, `"embedding"`),  // no text output
		model("k-new", "2026-01-01", `"text"`, `"text"`),
	}, ",")+`}},"openai":{"models":{`+strings.Join([]string{
		model("o-2", "2025-01-01", `"image"`, `"text"`),
		model("o-1", "2025-02-01", `"text"`, `"text"`),
	}, ",")+`}}}`), 0o600)
	env := stateEnv(t)
	env["BRAMA_MODEL_CATALOG_PATH"] = catalogue
	env["BRAMA_REPLAY_GUARD_SECS"] = "0"
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL + "/openai"
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL + "/kimi"
	d := startDaemon(t, env, "")
	for alias, route := range map[string]string{"zeta": "kimi/k-z", "alpha": "kimi/k-b", "mid": "openai/o-1", "best": "openai/o-9", "smart": "best"} {
		if s, _, b := d.call("PUT", "/v1/admin/routes", d.token, fmt.Sprintf(`{"alias":%q,"route":%q}`, alias, route)); s != 200 {
			t.Fatalf("PUT %s: %d %s", alias, s, b)
		}
	}
	tok, _ := agentWithSubs(t, d, "order", "openai", "order-o")
	donate(t, d, "order", "kimi", "order-k")
	anyOrder := []string{"k-b", "k-z", "k-new", "k-a", "o-9", "o-1", "o-2"} // the alias best is an alias too
	bestOrder := []string{"o-9", "k-b", "k-z", "k-new", "k-a", "o-1", "o-2"}
	for _, c := range []struct {
		model string
		want  []string
	}{
		{"any", anyOrder},
		{"any-vision-capable", []string{"k-a", "o-2"}},
		{"best", bestOrder},
		{"smart", bestOrder},
	} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		status, hdr, body := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, c.model, false, ""))
		mu.Lock()
		got := slices.Clone(seen)
		mu.Unlock()
		if status != 404 || !slices.Equal(got, c.want) || hdr.Get("Brama-Attempts") != fmt.Sprint(len(c.want)) {
			t.Errorf("%s: %d, the providers saw %v (Brama-Attempts %s), want %v: %s", c.model, status, got, hdr.Get("Brama-Attempts"), c.want, body)
		}
	}
}

// TestPerfCountsAnExhaustedWalk: a subscription route that served, then
// refused because its whole pool refused, counts one request and one
// failure, as a direct route's refusal does (SPEC §13); a walk that made no
// call counts nothing.
func TestPerfCountsAnExhaustedWalk(t *testing.T) {
	fake := newKeyedFake(t, map[string]string{"pk-1": "200", "pk-2": "200"})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
	env["BRAMA_REPLAY_GUARD_SECS"] = "0"
	d := startDaemon(t, env, "")
	tok, _ := agentWithSubs(t, d, "perf", "kimi", "pk-1", "pk-2")
	stats := func() perfEntry {
		m := d.scrape(t)
		return perfEntry{Count: int64(m[`brama_route_requests_total{route="kimi/m"}`]), Failures: int64(m[`brama_route_failures_total{route="kimi/m"}`])}
	}
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/m", false, "")); s != 200 {
		t.Fatalf("first request: %d %s", s, b)
	}
	fake.mu.Lock()
	fake.behavior["pk-1"], fake.behavior["pk-2"] = "429", "429"
	fake.mu.Unlock()
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/m", false, "")); s != 429 {
		t.Fatalf("second request: %d %s", s, b)
	}
	if e := stats(); e.Count != 2 || e.Failures != 1 {
		t.Errorf("kimi/m: count %d failures %d after a success and an exhausted walk, want 2 and 1", e.Count, e.Failures)
	}
	// A walk that made no call (every subscription blocked, skipped) counts nothing.
	if s, _, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/m", false, "")); s != 429 || envelopeOf(t, b)["attempts"] != float64(0) {
		t.Fatalf("third request: %d %s, want 429 after no call", s, b)
	}
	if e := stats(); e.Count != 2 || e.Failures != 1 {
		t.Errorf("kimi/m: count %d failures %d after a walk without a call, want 2 and 1 still", e.Count, e.Failures)
	}
	// A selector's candidate refused (400) counts on its route too.
	fake.mu.Lock()
	fake.behavior["pk-3"] = "400"
	fake.mu.Unlock()
	tok2, _ := agentWithSubs(t, d, "perf2", "kimi", "pk-3")
	d.call("PUT", "/v1/admin/routes", d.token, `{"alias":"c","route":"kimi/m"}`)
	if s, _, b := d.call("POST", "/v1/chat/completions", tok2, chatBody(dialectChat, "any", false, "")); s != 400 {
		t.Fatalf("any: %d %s", s, b)
	}
	if e := stats(); e.Count != 3 || e.Failures != 2 {
		t.Errorf("kimi/m: count %d failures %d after a selector's refused candidate, want 3 and 2", e.Count, e.Failures)
	}
}

// TestPinEndsAtTheLedgersEarliestReset: the pin of a subscription whose
// windows came from a usage report (kimi's) ends at its earliest window
// reset still to come, and at most 24 h on (SPEC §7.2.2).
func TestPinEndsAtTheLedgersEarliestReset(t *testing.T) {
	for _, tc := range []struct {
		name         string
		reset, after time.Duration // the report's reset, and the wait before the second request, from the first
		want         string        // the subscription the second request calls first: pin-2 while pinned
	}{
		{"a reset within the day ends it", time.Hour, 2 * time.Hour, "pin-1"},
		{"a reset days away: 24 h end it", 7 * 24 * time.Hour, 25 * time.Hour, "pin-1"},
		{"a reset passed ends nothing", -time.Hour, 2 * time.Hour, "pin-2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &testClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
			testingOnlyNow = clock.now
			defer func() { testingOnlyNow = nil }()
			reset := clock.now().Add(tc.reset).Format(time.RFC3339)
			var mu sync.Mutex
			behavior, seen := map[string]string{"pin-1": "429", "pin-2": "200"}, []string{}
			fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
				if r.Method == http.MethodGet { // both equally full until the same reset
					fmt.Fprintf(w, `{"usage":{"limit":100,"used":10,"reset_time":%q}}`, reset)
					return
				}
				mu.Lock()
				seen = append(seen, key)
				b := behavior[key]
				mu.Unlock()
				if b == "429" {
					w.Header().Set("Retry-After", "60")
					http.Error(w, `{"error":{"type":"rate_limit_error","message":"slow down"}}`, 429)
					return
				}
				io.WriteString(w, protocolFixtures[0].buffered)
			})
			env := stateEnv(t)
			env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL
			env["BRAMA_REPLAY_GUARD_SECS"] = "0"
			d := startDaemon(t, env, "")
			tok, _ := agentWithSubs(t, d, "pinner", "kimi", "pin-1", "pin-2")
			if s, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); s != 200 {
				t.Fatalf("maintain: %d %s", s, b)
			}
			if s, _, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/m", false, "")); s != 200 {
				t.Fatalf("first request: %d %s", s, b) // pin-1 refused 429, pin-2 served and is pinned
			}
			clock.advance(tc.after) // pin-1's block is over: both are equals again but for the pin
			mu.Lock()
			behavior["pin-1"], seen = "200", nil
			mu.Unlock()
			if s, _, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "kimi/m", false, "")); s != 200 {
				t.Fatalf("second request: %d %s", s, b)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(seen, []string{tc.want}) {
				t.Errorf("the provider saw %v, want [%s] (pin-1: overlay order, the pin ended)", seen, tc.want)
			}
		})
	}
}

// TestSelectorProvidersFreestFirst: any walks the provider whose freest
// eligible subscription is freer first, whatever the provider ids say
// (SPEC §7.3), and a full provider's candidates after it.
func TestSelectorProvidersFreestFirst(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	fake := newFakeProvider(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Method == http.MethodGet { // kimi's usage report: 90 % used, no reset stated
			io.WriteString(w, `{"usage":{"limit":100,"used":90}}`)
			return
		}
		mu.Lock()
		seen = append(seen, r.URL.Path)
		mu.Unlock()
		io.WriteString(w, protocolFixtures[0].buffered)
	})
	env := stateEnv(t)
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = fake.URL + "/kimi"
	env["BRAMA_PROVIDER_OPENAI_BASE_URL"] = fake.URL + "/openai"
	d := startDaemon(t, env, "")
	tok, _ := agentWithSubs(t, d, "freest", "kimi", "fr-k")
	donate(t, d, "freest", "openai", "fr-o")
	for alias, route := range map[string]string{"c1": "kimi/m", "c2": "openai/m"} {
		d.call("PUT", "/v1/admin/routes", d.token, fmt.Sprintf(`{"alias":%q,"route":%q}`, alias, route))
	}
	if s, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); s != 200 {
		t.Fatalf("maintain: %d %s", s, b)
	}
	s, hdr, b := d.call("POST", "/v1/chat/completions", tok, chatBody(dialectChat, "any", false, ""))
	mu.Lock()
	defer mu.Unlock()
	if s != 200 || hdr.Get("Brama-Route") != "openai/m" || !slices.Equal(seen, []string{"/openai/chat/completions"}) {
		t.Errorf("%d from %q after calls %v, want openai (its subscription is freer than kimi's) in one call: %s", s, hdr.Get("Brama-Route"), seen, b)
	}
}
