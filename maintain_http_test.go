package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
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
	if _, errOut, code := runCLI(t, env, "not-a-token\n", "maintain", "-gateway", d.url); code != 1 || !strings.Contains(errOut, "unauthenticated") {
		t.Errorf("bad token: exit %d %s", code, errOut)
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
