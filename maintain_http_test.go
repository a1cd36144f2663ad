package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// These tests drive POST /v1/admin/maintain and `brama maintain` through a
// real daemon: they need the maintenance wiring (route, serve, run case).

// maintDaemon starts a real daemon whose providers are the fake.
func maintDaemon(t *testing.T, fake *maintProviderFake) (*daemon, map[string]string) {
	t.Helper()
	env := fake.env(stateEnv(t))
	return startDaemon(t, env, ""), env
}

func TestMaintainOverHTTP(t *testing.T) {
	fake := newMaintProviderFake(t, &testClock{t: time.Now()})
	d, env := maintDaemon(t, fake)
	adminPath := "/v1/admin/subscriptions/a1"
	donate := func(provider, cred string) string {
		status, _, b := d.call("POST", adminPath, d.token, `{"provider":"`+provider+`",`+cred+`}`)
		return donatedID(t, status, b, "a1", provider)
	}
	kimiID := donate("kimi", `"api_key":"plantedKimiKey"`)
	donate("claude-code", `"oauth":{"access_token":"plantedAccessCC","refresh_token":"plantedRefreshCC","expires_at_ms":1}`)
	const refusal = `{"error":"plantedKimiKey is not welcome"}`
	fake.handle(fakeKimiUsage, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, refusal, http.StatusUnauthorized) // adds a newline
	})

	status, _, b := d.call("POST", "/v1/admin/maintain", d.token, "")
	if status != http.StatusOK {
		t.Fatalf("POST /v1/admin/maintain = %d %s", status, b)
	}
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"ok": false,
		"usage": map[string]any{"subscriptions": 2.0, "read": 1.0, "failed": []any{map[string]any{
			"subscription_id": kimiID,
			"provider":        "kimi",
			"error":           "usage report GET " + fake.URL + "/kimi/usages: HTTP 401, " + fmt.Sprint(len(refusal)+1) + " bytes received",
		}}},
		"credentials": map[string]any{"subscriptions": 1.0, "refreshed": 1.0, "refused": 0.0},
		"next_due_at": body["next_due_at"],
	}
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("maintain body (-want +got):\n%s", diff)
	}
	if s, ok := body["next_due_at"].(string); !ok || s == "" {
		t.Errorf("next_due_at = %v, want the next window reset", body["next_due_at"])
	}
	if fake.count("/token/claude-code") != 1 || fake.count(fakeClaudeUsage, "plantedAccessCC") != 0 {
		t.Errorf("the expired grant was not refreshed before its read (token calls %d)", fake.count("/token/claude-code"))
	}
	if fake.completions() != 0 {
		t.Errorf("a maintenance pass made %d completion calls", fake.completions())
	}

	// A strict body, admin only.
	if status, _, b := d.call("POST", "/v1/admin/maintain", d.token, `{"now":true}`); status != http.StatusBadRequest {
		t.Errorf("unknown member: %d %s", status, b)
	}
	if status, _, b := d.call("POST", "/v1/admin/maintain", d.token, `{}`); status != http.StatusOK {
		t.Errorf("empty object: %d %s", status, b)
	}
	callerTok := addClient(t, env, "app")
	if status, _, _ := d.call("POST", "/v1/admin/maintain", callerTok, ""); status != http.StatusForbidden {
		t.Errorf("a caller client ran a pass: %d", status)
	}
	// /metrics shows the scheduler and the last pass.
	if m := d.scrape(t); m["brama_maintenance_passes_total"] < 3 || m["brama_maintenance_last_pass_finished_timestamp_seconds"] == 0 {
		t.Errorf("/metrics maintenance = %v", m)
	}
	// The failed read shows on the row as stale.
	_, _, lb := d.call("GET", adminPath, d.token, "")
	var listing struct {
		Subscriptions []subscriptionRow `json:"subscriptions"`
	}
	if err := json.Unmarshal(lb, &listing); err != nil {
		t.Fatal(err)
	}
	for _, row := range listing.Subscriptions {
		failed := row.ID == kimiID
		if row.UsageRead == nil || row.UsageRead.OK == failed || row.Stale != failed {
			t.Errorf("row %s: usage_read %+v stale %v", row.ID, row.UsageRead, row.Stale)
		}
	}

	// brama maintain: a summary, -json, and exit codes.
	env["BRAMA_TOKEN"] = d.token
	out, errOut, code := runCLI(t, env, "", "maintain", "-gateway", d.url)
	if code != 1 || !strings.Contains(out, "maintenance pass: not ok") || !strings.Contains(out, "failed "+kimiID+" (kimi)") || !strings.Contains(out, "HTTP 401") {
		t.Errorf("maintain with a failed read: exit %d\n%s%s", code, out, errOut)
	}
	fake.handle(fakeKimiUsage, nil)
	out, errOut, code = runCLI(t, env, "", "maintain", "-json", "-gateway", d.url)
	var rep passReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || !rep.OK || rep.Usage.Read != 1 {
		t.Errorf("maintain -json after the fix: exit %d\n%s%s", code, out, errOut)
	}
	out, _, code = runCLI(t, env, "", "maintain", "-gateway", d.url)
	if code != 0 || !strings.Contains(out, "maintenance pass: ok") || !strings.Contains(out, "next due: ") {
		t.Errorf("maintain summary: exit %d\n%s", code, out)
	}
	if _, _, code := runCLI(t, env, "", "maintain", "-bogus"); code != 2 {
		t.Errorf("bad flag: exit %d, want 2", code)
	}
	if _, _, code := runCLI(t, env, "", "maintain", "extra"); code != 2 {
		t.Errorf("positional: exit %d, want 2", code)
	}
	delete(env, "BRAMA_TOKEN")
	if _, errOut, code := runCLI(t, env, "", "maintain", "-gateway", d.url); code != 1 || !strings.Contains(errOut, "no bearer token") {
		t.Errorf("no token: exit %d %s", code, errOut)
	}
	for _, args := range [][]string{{"maintain"}, {"maintain", "-json"}} {
		if out, errOut, code := runCLI(t, env, "not-a-token\n", append(args, "-gateway", d.url)...); code != 1 || out != "" || !strings.Contains(errOut, "unauthenticated") {
			t.Errorf("bad token, %v: exit %d %q %s", args, code, out, errOut)
		}
	}
	logs := logsBesidesFirstStart(d.stderr.String())
	for _, secret := range []string{"plantedKimiKey", "plantedAccessCC", "plantedRefreshCC", "renewedAccess", "renewedRefresh"} {
		assertNoSecret(t, secret, logs, env["BRAMA_STATE_DIR"])
	}
	for _, line := range []string{"maintenance_pass_started", "maintenance_pass_done", "usage_read_ok", "usage_read_failed", "credential_refresh_ok"} {
		if !strings.Contains(logs, `"msg":"`+line+`"`) {
			t.Errorf("no %s log line", line)
		}
	}
}

// TestMaintainWithoutStateDir proves a pass without a state directory is
// answered 503 naming the cause, not a report of nothing.
func TestMaintainWithoutStateDir(t *testing.T) {
	env := map[string]string{"BRAMA_MODEL_CATALOG_URL": "off"} // no BRAMA_STATE_DIR, no HOME
	d := startDaemon(t, env, "")
	status, _, b := d.call("POST", "/v1/admin/maintain", d.token, "")
	if e := envelopeOf(t, b); status != http.StatusServiceUnavailable || e["code"] != "dependency_unavailable" || !strings.Contains(e["message"].(string), "no state directory") {
		t.Errorf("maintain without a state directory: %d %s", status, b)
	}
}

// tokenCounter answers a token endpoint 500 (a transport failure, SPEC
// §11.1) and counts the calls by the refresh token presented.
type tokenCounter struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *tokenCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		RefreshToken string `json:"refresh_token"`
	}
	json.NewDecoder(r.Body).Decode(&body)
	c.mu.Lock()
	c.calls[body.RefreshToken]++
	c.mu.Unlock()
	http.Error(w, "down", http.StatusInternalServerError)
}

func (c *tokenCounter) count(refresh string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[refresh]
}

// agentRefusalScene is a daemon whose agents a and b each hold an expired
// claude-code grant whose refresh always fails in transit and a kimi key
// whose usage read always fails: every pass covering an agent reads its
// kimi report and tries its grant again. It returns a's bound bearer.
func agentRefusalScene(t *testing.T) (*daemon, *maintProviderFake, *tokenCounter, string) {
	t.Helper()
	fake := newMaintProviderFake(t, &testClock{t: time.Now()})
	tokens := &tokenCounter{calls: map[string]int{}}
	fake.handle("/token/claude-code", tokens.ServeHTTP)
	fake.handle(fakeKimiUsage, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusBadGateway) })
	env := fake.env(stateEnv(t))
	d := startDaemon(t, env, "")
	bearerA := addClient(t, env, "appa", "-agent", "a")
	for _, agent := range []string{"a", "b"} {
		status, _, b := d.call("POST", "/v1/admin/subscriptions/"+agent, d.token, `{"provider":"claude-code","oauth":{"access_token":"access-`+agent+`","refresh_token":"refresh-`+agent+`","expires_at_ms":1}}`)
		donatedID(t, status, b, agent, "claude-code")
		status, _, b = d.call("POST", "/v1/admin/subscriptions/"+agent, d.token, `{"provider":"kimi","api_key":"key-`+agent+`"}`)
		donatedID(t, status, b, agent, "kimi")
	}
	if status, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); status != http.StatusOK {
		t.Fatalf("maintain: %d %s", status, b)
	}
	// A change (a's own donation), so a's next refusal asks for a pass (SPEC §11.2).
	status, _, b := d.call("POST", "/v1/subscriptions/a", bearerA, `{"provider":"openai","api_key":"key-openai-a"}`)
	donatedID(t, status, b, "a", "openai")
	return d, fake, tokens, bearerA
}

// refuseA makes a's request that its grant's failed refresh refuses.
func refuseA(t *testing.T, d *daemon, bearerA string) {
	status, _, b := d.call("POST", "/v1/messages", bearerA, chatBody(dialectMessages, "claude-code/claude-sonnet-4-5", false, ""))
	if status != http.StatusServiceUnavailable {
		t.Errorf("a's request = %d %s, want a 503 refusal", status, b)
	}
}

// TestRefusalPassCoversOnlyTheRefusingAgent proves SPEC §17: the pass a's
// refusal asks for reads and refreshes a's subscriptions and never b's.
func TestRefusalPassCoversOnlyTheRefusingAgent(t *testing.T) {
	d, fake, tokens, bearerA := agentRefusalScene(t)
	readsA, readsB := fake.count(fakeKimiUsage, "key-a"), fake.count(fakeKimiUsage, "key-b")
	refreshA, refreshB := tokens.count("refresh-a"), tokens.count("refresh-b")
	refuseA(t, d, bearerA)
	d.stderr.waitFor(t, `"msg":"maintenance_pass_done","agent_id":"a"`)
	if n := fake.count(fakeKimiUsage, "key-a"); n != readsA+1 {
		t.Errorf("a's usage reads %d → %d, want one more: the pass covers a", readsA, n)
	}
	if n := tokens.count("refresh-a"); n != refreshA+2 {
		t.Errorf("a's token calls %d → %d, want the request's and the pass's", refreshA, n)
	}
	if n := fake.count(fakeKimiUsage, "key-b"); n != readsB {
		t.Errorf("b's usage reads %d → %d: a's refusal read b's report", readsB, n)
	}
	if n := tokens.count("refresh-b"); n != refreshB {
		t.Errorf("b's token calls %d → %d: a's refusal refreshed b's grant", refreshB, n)
	}
}

// TestConcurrentRefusalsOfOneAgentStartOnePass proves a burst of one
// agent's refusals asks for one pass over its subscriptions (SPEC §11.2, §17).
func TestConcurrentRefusalsOfOneAgentStartOnePass(t *testing.T) {
	d, fake, _, bearerA := agentRefusalScene(t)
	readsA := fake.count(fakeKimiUsage, "key-a")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			refuseA(t, d, bearerA)
		}()
	}
	wg.Wait()
	d.stderr.waitFor(t, `"msg":"maintenance_pass_done","agent_id":"a"`)
	if status, _, b := d.call("POST", "/v1/admin/maintain", d.token, ""); status != http.StatusOK { // passes run one at a time
		t.Fatalf("maintain: %d %s", status, b)
	}
	if n := strings.Count(d.stderr.String(), `"msg":"maintenance_pass_done","agent_id":"a"`); n != 1 {
		t.Errorf("%d passes over a's subscriptions, want 1", n)
	}
	if n := fake.count(fakeKimiUsage, "key-a"); n != readsA+2 {
		t.Errorf("a's usage reads %d → %d, want a's pass's and the operator's", readsA, n)
	}
}

// TestUsageReadsOneAtATimePerProvider proves SPEC §17: a pass over many
// subscriptions of one provider never has two usage reads in flight there.
// The first read waits for a second to arrive (or 200 ms), so reads that
// overlap always show.
func TestUsageReadsOneAtATimePerProvider(t *testing.T) {
	fake := newMaintProviderFake(t, &testClock{t: time.Now()})
	d, _ := maintDaemon(t, fake)
	var mu sync.Mutex
	inflight, most, reads, arrived := 0, 0, 0, make(chan struct{})
	fake.handle(fakeKimiUsage, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inflight++
		reads++
		most = max(most, inflight)
		first := reads == 1
		if inflight == 2 && most == 2 {
			close(arrived)
		}
		mu.Unlock()
		if first {
			select {
			case <-arrived:
			case <-time.After(200 * time.Millisecond):
			}
		}
		fake.defaultAnswer(w, r)
		mu.Lock()
		inflight--
		mu.Unlock()
	})
	for i := range 20 {
		status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, fmt.Sprintf(`{"provider":"kimi","api_key":"key-%d"}`, i))
		donatedID(t, status, b, "a1", "kimi")
	}
	status, _, b := d.call("POST", "/v1/admin/maintain", d.token, "")
	var rep passReport
	if status != http.StatusOK || json.Unmarshal(b, &rep) != nil || !rep.OK || fake.count(fakeKimiUsage) != 20 {
		t.Fatalf("maintain = %d %s; %d reads, want 20 (the start pass's and this one's)", status, b, fake.count(fakeKimiUsage))
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 1 {
		t.Errorf("%d usage reads in flight at once at one provider, want 1", most)
	}
}

// TestMaintainUsageReadWithoutAnAnswer: a usage read whose connection closes before any status fails naming no status,
// never as a body that ended early (there was none).
func TestMaintainUsageReadWithoutAnAnswer(t *testing.T) {
	fake := newMaintProviderFake(t, &testClock{t: time.Now()})
	d, _ := maintDaemon(t, fake)
	status, _, b := d.call("POST", "/v1/admin/subscriptions/a1", d.token, `{"provider":"kimi","api_key":"plantedKimiKey"}`)
	donatedID(t, status, b, "a1", "kimi")
	fake.handle(fakeKimiUsage, func(w http.ResponseWriter, r *http.Request) {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	})
	_, _, b = d.call("POST", "/v1/admin/maintain", d.token, "")
	var body struct {
		Usage struct {
			Failed []struct{ Error string } `json:"failed"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &body) != nil || len(body.Usage.Failed) != 1 || !strings.Contains(body.Usage.Failed[0].Error, "no status") ||
		strings.Contains(body.Usage.Failed[0].Error, "ended early") {
		t.Errorf("maintain: %s; want one failed read naming no status, not a body that ended early", b)
	}
}
