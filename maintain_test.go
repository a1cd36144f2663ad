package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// maintT0 is where every maintenance test's clock starts.
var maintT0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// maintWait bounds how long a test waits for the scheduler before failing;
// it is a failure deadline, never a synchronization sleep.
const maintWait = 10 * time.Second

// maintProviderFake is one real HTTP server standing in for every endpoint a
// pass could touch: the three usage reports, the three token endpoints and
// the completion routes (which a pass must never call). It counts requests
// by path and bearer, and each path's answer can be replaced.
type maintProviderFake struct {
	*httptest.Server
	clock *testClock

	mu       sync.Mutex // guards calls, handlers, headers
	calls    map[string]int
	handlers map[string]http.HandlerFunc
	headers  map[string]http.Header // last request headers by path
}

// Paths of maintProviderFake (the env below points each provider there).
const (
	fakeClaudeUsage = "/api/oauth/usage"
	fakeCodexUsage  = "/codex/usage"
	fakeKimiUsage   = "/kimi/usages"
)

// completionPaths are the chat endpoints of the three providers.
var completionPaths = []string{"/v1/messages", "/codex/responses", "/kimi/chat/completions"}

func newMaintProviderFake(t *testing.T, clock *testClock) *maintProviderFake {
	f := &maintProviderFake{clock: clock, calls: map[string]int{}, handlers: map[string]http.HandlerFunc{}, headers: map[string]http.Header{}}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bearer := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		f.mu.Lock()
		f.calls[r.URL.Path]++
		f.calls[r.URL.Path+" "+bearer]++
		f.headers[r.URL.Path] = r.Header.Clone()
		h := f.handlers[r.URL.Path]
		f.mu.Unlock()
		if h == nil {
			h = f.defaultAnswer
		}
		h(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

// defaultAnswer is a healthy provider: usage reports whose windows reset
// 5 hours and 7 days from the fake's clock, and token answers good for 30
// days. Anything else (a completion) is answered 500 so it shows.
func (f *maintProviderFake) defaultAnswer(w http.ResponseWriter, r *http.Request) {
	now := f.clock.now()
	h5, d7 := now.Add(5*time.Hour), now.Add(7*24*time.Hour)
	switch {
	case r.URL.Path == fakeClaudeUsage:
		fmt.Fprintf(w, `{"five_hour":{"utilization":40,"resets_at":%q},"seven_day":{"utilization":10,"resets_at":%q},"extra_usage":{"utilization":null}}`,
			h5.Format(time.RFC3339Nano), d7.Format(time.RFC3339Nano))
	case r.URL.Path == fakeCodexUsage:
		fmt.Fprintf(w, `{"rate_limit":{"primary_window":{"used_percent":25,"limit_window_seconds":18000,"reset_at":%d},"secondary_window":{"used_percent":5,"limit_window_seconds":604800,"reset_after_seconds":604800}}}`,
			h5.Unix())
	case r.URL.Path == fakeKimiUsage:
		fmt.Fprintf(w, `{"usage":{"limit":"100","used":"4","resetTime":%q},"limits":[{"window":{"duration":300,"timeUnit":"TIME_UNIT_MINUTE"},"detail":{"limit":"100","remaining":"82","resetTime":%q}}]}`,
			d7.Format(time.RFC3339), h5.Format(time.RFC3339))
	case strings.HasPrefix(r.URL.Path, "/token/"):
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, `{"access_token":"renewedAccess%d","refresh_token":"renewedRefresh%d","expires_in":%d}`, now.UnixNano(), now.UnixNano(), 30*24*3600)
	default:
		http.Error(w, `{"error":"not a maintenance endpoint"}`, http.StatusInternalServerError)
	}
}

// handle replaces path's answer.
func (f *maintProviderFake) handle(path string, h http.HandlerFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handlers[path] = h
}

// count is how many requests reached path (with bearer, when given).
func (f *maintProviderFake) count(path string, bearer ...string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(bearer) > 0 {
		return f.calls[path+" "+bearer[0]]
	}
	return f.calls[path]
}

// header is the last request's header at path.
func (f *maintProviderFake) header(path string) http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.headers[path]
}

// completions counts requests to any completion endpoint.
func (f *maintProviderFake) completions() int {
	n := 0
	for _, p := range completionPaths {
		n += f.count(p)
	}
	return n
}

// env points every provider, usage report and token endpoint at the fake.
func (f *maintProviderFake) env(env map[string]string) map[string]string {
	env["BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL"] = f.URL
	env["BRAMA_PROVIDER_CODEX_BASE_URL"] = f.URL + "/codex"
	env["BRAMA_PROVIDER_CODEX_USAGE_URL"] = f.URL + fakeCodexUsage
	env["BRAMA_PROVIDER_KIMI_BASE_URL"] = f.URL + "/kimi"
	for _, p := range []string{"claude-code", "codex", "kimi"} {
		env["BRAMA_OAUTH_"+strings.ToUpper(strings.ReplaceAll(p, "-", "_"))+"_TOKEN_URL"] = f.URL + "/token/" + p
	}
	return env
}

// fakeTimers stands in for time.AfterFunc: it records each armed timer's
// deadline on the injected clock, and the test fires them by hand.
type fakeTimers struct {
	clock *testClock
	armed chan time.Time // every deadline, in arming order

	mu     sync.Mutex // guards timers
	timers []*fakeTimer
}

// fakeTimer is one armed fake timer.
type fakeTimer struct {
	at      time.Time
	f       func()
	mu      sync.Mutex // guards stopped
	stopped bool
}

func (ft *fakeTimer) Stop() bool {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	was := !ft.stopped
	ft.stopped = true
	return was
}

func (fts *fakeTimers) after(d time.Duration, f func()) ledgerStopper {
	ft := &fakeTimer{at: fts.clock.now().Add(d), f: f}
	fts.mu.Lock()
	fts.timers = append(fts.timers, ft)
	fts.mu.Unlock()
	fts.armed <- ft.at
	return ft
}

// fire runs the timer armed for at (stopped or not: a stale timer firing
// late must do nothing), as the runtime would.
func (fts *fakeTimers) fire(t *testing.T, at time.Time) {
	t.Helper()
	fts.mu.Lock()
	var hit *fakeTimer
	for _, ft := range fts.timers {
		if ft.at.Equal(at) {
			hit = ft
		}
	}
	fts.mu.Unlock()
	if hit == nil {
		t.Fatalf("no timer was armed for %s", at)
	}
	hit.f()
}

// nextArmed waits for the next timer to be armed and returns its deadline.
func (fts *fakeTimers) nextArmed(t *testing.T) time.Time {
	t.Helper()
	select {
	case at := <-fts.armed:
		return at
	case <-time.After(maintWait):
		t.Fatal("no timer was armed")
	}
	return time.Time{}
}

// passEvent is one finished pass as testingOnlyPassDone saw it.
type passEvent struct {
	reason  string
	started time.Time
	rep     passReport
}

// maintFixture is a maintainer over a fresh state directory and one fake
// provider, with an injected clock and timer.
type maintFixture struct {
	clock  *testClock
	fake   *maintProviderFake
	env    map[string]string
	inv    *inventory
	j      *journal
	l      *ledger
	o      *oauthClient
	m      *maintainer
	timers *fakeTimers
	passes chan passEvent
	logs   *syncBuffer
}

func newMaintFixture(t *testing.T) *maintFixture {
	t.Helper()
	clock := &testClock{t: maintT0}
	fx := &maintFixture{clock: clock, logs: &syncBuffer{}, passes: make(chan passEvent, 64)}
	fx.fake = newMaintProviderFake(t, clock)
	fx.env = fx.fake.env(map[string]string{"BRAMA_STATE_DIR": filepath.Join(t.TempDir(), "state")})
	getenv := testEnv(fx.env)
	log := slog.New(slog.NewJSONHandler(io.MultiWriter(fx.logs, oauthLogWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	st := resolveState(getenv)
	vpath, verr := st.fileOrState(getenv, "BRAMA_VAULT_FILE", "vault", "vault.json")
	v := newVault(vpath, verr)
	fx.j = newJournal(st, sys{log: log, now: clock.now})
	fx.l = newLedger(st, log, clock.now)
	t.Cleanup(func() { fx.l.flush(false) }) // stop the write-behind before the directory goes
	fx.inv = newInventory(st, v, fx.j, fx.l, getenv, sys{log: log, now: clock.now})
	client := newProviderClient()
	fx.o = newOAuth(getenv, client, v, fx.l, log, clock.now)
	t.Cleanup(fx.o.wg.Wait)
	fx.m = newMaintainer(fx.inv, fx.o)
	fx.timers = &fakeTimers{clock: clock, armed: make(chan time.Time, 64)}
	fx.m.afterFunc = fx.timers.after
	fx.m.testingOnlyPassDone = func(reason string, started time.Time, rep passReport) {
		fx.passes <- passEvent{reason, started, rep}
	}
	return fx
}

// start runs the scheduler until the test ends.
func (fx *maintFixture) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	fx.m.run(ctx, &wg)
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// donate adds a subscription of provider for agent a1.
func (fx *maintFixture) donate(t *testing.T, provider string, cred vaultCredential) string {
	t.Helper()
	it, err := fx.inv.store(overlayItem{AgentID: "a1", Provider: provider}, cred, "")
	if err != nil {
		t.Fatalf("donate %s: %v", provider, err)
	}
	return it.ID
}

// grant is an OAuth grant with distinct, unmistakable (and not
// secret-shaped, so redaction cannot hide a leak) tokens.
func grant(name string, expires time.Time) vaultCredential {
	g := &oauthGrant{AccessToken: "plantedAccess" + name, RefreshToken: "plantedRefresh" + name}
	if !expires.IsZero() {
		g.ExpiresAtMs = expires.UnixMilli()
	}
	return vaultCredential{OAuth: g}
}

// nextPass waits for the next finished pass.
func (fx *maintFixture) nextPass(t *testing.T) passEvent {
	t.Helper()
	select {
	case ev := <-fx.passes:
		return ev
	case <-time.After(maintWait):
		t.Fatal("no pass finished")
	}
	return passEvent{}
}

// sentinel asks for one operator pass and returns every pass that finished
// since the last look, ending with the one that answered it. Passes run one
// at a time and an operator call joins the next pass to start, so a pass
// that should not have happened shows up here: as an extra entry, or as the
// answering pass with another reason than "maintain".
func (fx *maintFixture) sentinel(t *testing.T) []passEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), maintWait)
	defer cancel()
	if _, err := fx.m.passNow(ctx); err != nil {
		t.Fatalf("passNow: %v", err)
	}
	var evs []passEvent // testingOnlyPassDone ran before the answer came
	for {
		select {
		case ev := <-fx.passes:
			evs = append(evs, ev)
		default:
			return evs
		}
	}
}

// reasonsAt renders passes as "reason@offset from maintT0".
func reasonsAt(evs []passEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.reason+"@"+ev.started.Sub(maintT0).String())
	}
	return out
}

// TestMaintainPassesAtLedgerMoments proves SPEC §11.2's schedule: a grant
// expiring at T and a window resetting at T2 cause passes at T and T2 and at
// no other time besides start, however often the ledger changes between.
func TestMaintainPassesAtLedgerMoments(t *testing.T) {
	fx := newMaintFixture(t)
	T, T2 := maintT0.Add(time.Hour), maintT0.Add(5*time.Hour) // the report's five_hour resets at T0+5h
	cred := grant("CC", T)
	id := fx.donate(t, "claude-code", cred)
	fx.start(t)

	ev := fx.nextPass(t)
	if ev.reason != "start" || !ev.started.Equal(maintT0) || ev.rep.Usage.Read != 1 || ev.rep.Credentials.Refreshed != 0 {
		t.Fatalf("start pass = %+v", ev)
	}
	if at := fx.timers.nextArmed(t); !at.Equal(T) {
		t.Fatalf("timer armed for %s, want the grant's expiry %s", at, T)
	}
	// Ledger changes that move nothing re-arm nothing and start no pass.
	fx.l.recordUse(id, "claude-code", true, 1, 1)
	fx.l.recordCheck(id, "claude-code", false, true, "")

	fx.clock.advance(T.Sub(fx.clock.now()))
	fx.timers.fire(t, T)
	ev = fx.nextPass(t)
	if ev.reason != "due" || !ev.started.Equal(T) || ev.rep.Credentials.Refreshed != 1 || ev.rep.Usage.Read != 0 {
		t.Fatalf("pass at T = %+v", ev)
	}
	if at := fx.timers.nextArmed(t); !at.Equal(T2) {
		t.Fatalf("timer armed for %s, want the window's reset %s", at, T2)
	}
	fx.timers.fire(t, T) // the stale timer firing late does nothing

	fx.clock.advance(T2.Sub(fx.clock.now()))
	fx.timers.fire(t, T2)
	ev = fx.nextPass(t)
	if ev.reason != "due" || !ev.started.Equal(T2) || ev.rep.Usage.Read != 1 || ev.rep.Credentials.Refreshed != 0 {
		t.Fatalf("pass at T2 = %+v", ev)
	}
	if at := fx.timers.nextArmed(t); !at.Equal(T2.Add(5 * time.Hour)) {
		t.Fatalf("timer armed for %s, want the new reading's reset", at)
	}
	got := reasonsAt(fx.sentinel(t))
	if diff := cmp.Diff([]string{"maintain@" + (5 * time.Hour).String()}, got); diff != "" {
		t.Errorf("passes after T2 (-want +got):\n%s", diff)
	}
	if n := fx.fake.count(fakeClaudeUsage); n != 2 {
		t.Errorf("usage reads = %d, want 2 (start, T2)", n)
	}
	if n := fx.fake.count("/token/claude-code"); n != 1 {
		t.Errorf("token calls = %d, want 1 (T)", n)
	}
	select {
	case at := <-fx.timers.armed:
		t.Errorf("an extra timer was armed for %s", at)
	default:
	}
	if st := fx.m.metrics(); st["brama_maintenance_passes_total"] != 4 || st["brama_maintenance_next_due_timestamp_seconds"] != float64(T2.Add(5*time.Hour).Unix()) {
		t.Errorf("state = %v", st)
	}
}

// TestMaintainCoalescesAndDropsRequests proves that passes asked for while
// one runs become exactly one more pass (operator calls share its report),
// and that a refusal's request is dropped until something changes.
func TestMaintainCoalescesAndDropsRequests(t *testing.T) {
	fx := newMaintFixture(t)
	entered, release := fx.holdFirstUsageRead()
	fx.donate(t, "kimi", vaultCredential{APIKey: "plantedKimiKey"})
	fx.start(t)
	select {
	case <-entered:
	case <-time.After(maintWait):
		t.Fatal("the start pass never read the report")
	}
	// The start pass is running and holds the read.
	fx.m.changed()
	fx.m.request("subscription_reauthorization_required", "a1")
	fx.m.request("credential_refresh_transport_failure", "a1")
	fx.m.mu.Lock() // the operator asks twice, as passNow does
	t1, t2 := fx.m.want("", "maintain"), fx.m.want("", "maintain")
	fx.m.mu.Unlock()
	if t1 != t2 {
		t.Fatal("operator asks while a pass runs: no shared ticket")
	}
	close(release)
	if ev := fx.nextPass(t); ev.reason != "start" {
		t.Fatalf("first pass = %s", ev.reason)
	}
	ev := fx.nextPass(t)
	if ev.reason != "maintain" {
		t.Fatalf("second pass reason = %s, want the operator's: a pass over everyone covers the agent's requests", ev.reason)
	}
	select {
	case <-t1.done:
		if !cmp.Equal(t1.rep, ev.rep, cmp.AllowUnexported(passReport{})) {
			t.Errorf("the operator got %+v, not the coalesced pass's %+v", t1.rep, ev.rep)
		}
	case <-time.After(maintWait):
		t.Fatal("the operator's ticket was not answered by the coalesced pass")
	}
	if got := reasonsAt(fx.sentinel(t)); !cmp.Equal(got, []string{"maintain@0s"}) {
		t.Errorf("passes after the coalesced one = %v, want only the sentinel", got)
	}

	// No change since the last pass started: the request is dropped.
	fx.m.request("subscription_reauthorization_required", "a1")
	if got := reasonsAt(fx.sentinel(t)); !cmp.Equal(got, []string{"maintain@0s"}) {
		t.Errorf("a dropped request ran a pass: %v", got)
	}
	if st := fx.m.metrics(); st["brama_maintenance_requests_dropped_total"] != 1 {
		t.Errorf("requests dropped = %v, want 1", st["brama_maintenance_requests_dropped_total"])
	}
	if !logEvent(fx.logs.String(), "maintenance_request_dropped", map[string]string{"agent_id": "a1", "reason": "subscription_reauthorization_required"}) {
		t.Errorf("the dropped request has no debug line naming its agent and reason")
	}
	// A change makes the next request count again, once.
	fx.m.changed()
	fx.m.request("again", "a1")
	fx.m.request("again twice", "a1")
	if ev := fx.nextPass(t); ev.reason != "again" {
		t.Errorf("after a change the pass = %s, want the first request's", ev.reason)
	}
	if got := reasonsAt(fx.sentinel(t)); !cmp.Equal(got, []string{"maintain@0s"}) {
		t.Errorf("passes after the requested one = %v, want only the sentinel", got)
	}
	if n := fx.fake.count(fakeKimiUsage); n != 1 {
		t.Errorf("usage reads = %d, want 1: the reading stayed fresh", n)
	}
}

// TestMaintainStopped proves passNow refuses without a scheduler and that a
// stopping scheduler answers its waiters.
func TestMaintainStopped(t *testing.T) {
	fx := newMaintFixture(t)
	if _, err := fx.m.passNow(context.Background()); err != errMaintenanceStopped {
		t.Fatalf("before run: err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	fx.m.run(ctx, &wg)
	fx.nextPass(t)
	cancel()
	wg.Wait()
	if _, err := fx.m.passNow(context.Background()); err != errMaintenanceStopped {
		t.Errorf("after stop: err = %v", err)
	}
}

// TestMaintainNoCompletionOnAnySchedule proves the shipped configuration
// spends no plan quota on a schedule: passes at start, at due moments, on
// request and on demand, over every provider and credential kind, never
// reach a completion endpoint.
func TestMaintainNoCompletionOnAnySchedule(t *testing.T) {
	fx := newMaintFixture(t)
	soon := maintT0.Add(30 * time.Minute)
	fx.donate(t, "claude-code", grant("CC", soon))
	fx.donate(t, "codex", grant("CX", time.Time{}))
	fx.donate(t, "kimi", grant("KO", soon.Add(time.Minute)))
	fx.donate(t, "kimi", vaultCredential{APIKey: "plantedKimiKey"})
	fx.donate(t, "claude-code", vaultCredential{APIKey: "plantedClaudeKey"})
	fx.donate(t, "openai", vaultCredential{APIKey: "plantedOpenAIKey"})
	fx.start(t)
	fx.nextPass(t)
	for i := 0; i < 3; i++ {
		at := fx.timers.nextArmed(t)
		fx.clock.advance(at.Sub(fx.clock.now()))
		fx.timers.fire(t, at)
		fx.nextPass(t)
	}
	fx.m.changed()
	fx.m.request("subscription_reauthorization_required", "a1")
	fx.nextPass(t)
	fx.sentinel(t)
	if n := fx.fake.completions(); n != 0 {
		t.Errorf("%d completion calls on a schedule, want 0", n)
	}
	for _, p := range []string{fakeClaudeUsage, fakeCodexUsage, fakeKimiUsage} {
		if fx.fake.count(p) == 0 {
			t.Errorf("no usage read at %s: the passes did nothing", p)
		}
	}
	if fx.fake.count(fakeClaudeUsage, "plantedClaudeKey") != 0 {
		t.Error("a claude-code API key was sent to the OAuth usage report")
	}
	assertNoSecret(t, "plantedAccessCC", fx.logs.String())
	assertNoSecret(t, "plantedKimiKey", fx.logs.String())
	assertNoSecret(t, "plantedRefreshCX", fx.logs.String())
}

// TestMaintainLoopOnce drives loopOnce by hand, without the loop: a pending
// pass runs, then the one timer is armed at the ledger's next due moment
// and kept while that moment stands, and a moment the clock passed before
// its timer fired is a pass now, not skipped; its stale timer does nothing.
func TestMaintainLoopOnce(t *testing.T) {
	fx := newMaintFixture(t)
	T := maintT0.Add(time.Hour)
	fx.donate(t, "claude-code", grant("CC", T))
	ctx := context.Background()
	noTimer := func(step string) {
		t.Helper()
		select {
		case at := <-fx.timers.armed:
			t.Errorf("%s: a timer was armed for %s", step, at)
		default:
		}
	}

	fx.m.request("asked", "a1")
	if !fx.m.loopOnce(ctx, fx.clock.now()) {
		t.Fatal("loopOnce with a pass pending ran none")
	}
	if ev := fx.nextPass(t); ev.reason != "asked" || ev.rep.Usage.Read != 1 {
		t.Fatalf("first pass = %+v", ev)
	}
	if fx.m.loopOnce(ctx, fx.clock.now()) {
		t.Fatal("loopOnce ran a pass with none pending")
	}
	if at := fx.timers.nextArmed(t); !at.Equal(T) {
		t.Fatalf("timer armed for %s, want the grant's expiry %s", at, T)
	}
	if fx.m.loopOnce(ctx, fx.clock.now()) {
		t.Fatal("loopOnce ran a pass before the moment")
	}
	noTimer("moment unchanged")

	fx.clock.advance(T.Sub(maintT0)) // the moment comes; its timer has not fired
	if !fx.m.loopOnce(ctx, fx.clock.now()) {
		t.Fatal("loopOnce skipped a moment the clock passed before its timer fired")
	}
	if ev := fx.nextPass(t); ev.reason != "due" || !ev.started.Equal(T) || ev.rep.Credentials.Refreshed != 1 {
		t.Fatalf("pass at T = %+v", ev)
	}
	if fx.m.loopOnce(ctx, fx.clock.now()) {
		t.Fatal("loopOnce ran a second pass at T")
	}
	next := fx.timers.nextArmed(t)
	if !next.Equal(maintT0.Add(5 * time.Hour)) {
		t.Errorf("timer re-armed for %s, want the window's reset", next)
	}
	fx.timers.fire(t, T) // the disarmed timer firing late
	if fx.m.loopOnce(ctx, fx.clock.now()) {
		t.Error("a stale timer started a pass")
	}
	noTimer("after the stale timer")
	if st := fx.m.metrics(); st["brama_maintenance_passes_total"] != 2 || st["brama_maintenance_next_due_timestamp_seconds"] != float64(next.Unix()) {
		t.Errorf("state = %v", st)
	}
	// Its timer fires while the wall clock says the moment is still ahead (a clock stepped back): a pass, not a stall.
	fx.timers.fire(t, next)
	if !fx.m.loopOnce(ctx, fx.clock.now()) {
		t.Fatal("a fired timer ran no pass while the wall clock was behind its moment")
	}
	if ev := fx.nextPass(t); ev.reason != "due" {
		t.Errorf("pass after the fired timer = %+v, want due", ev)
	}
}

// holdFirstUsageRead makes the first kimi usage read of fx wait, once it
// has closed entered, until the test closes release.
func (fx *maintFixture) holdFirstUsageRead() (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	first := true
	fx.fake.handle(fakeKimiUsage, func(w http.ResponseWriter, r *http.Request) {
		if first {
			first = false
			close(entered)
			<-release
		}
		fx.fake.defaultAnswer(w, r)
	})
	return entered, release
}

// TestMaintainStopAnswersAWaiter: an operator pass asked for while another runs, with the loop stopping before it,
// is answered errMaintenanceStopped (503), never an empty report as if the pass had run.
func TestMaintainStopAnswersAWaiter(t *testing.T) {
	fx := newMaintFixture(t)
	entered, release := make(chan struct{}), make(chan struct{})
	fx.m.testingOnlyPassDone = func(string, time.Time, passReport) { // holds the start pass until the test says
		close(entered)
		<-release
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	fx.m.run(ctx, &wg)
	<-entered
	answered := make(chan error, 1)
	go func() {
		_, err := fx.m.passNow(context.Background())
		answered <- err
	}()
	for pending := false; !pending; runtime.Gosched() { // passNow's ask is queued
		fx.m.mu.Lock()
		pending = fx.m.asked[""] != nil
		fx.m.mu.Unlock()
	}
	cancel()
	close(release)
	wg.Wait()
	if err := <-answered; err != errMaintenanceStopped {
		t.Errorf("the waiter's answer = %v, want errMaintenanceStopped", err)
	}
	if n := fx.m.metrics()["brama_maintenance_pending"]; n != 0 {
		t.Errorf("brama_maintenance_pending = %v after the loop stopped, want 0", n)
	}
}

// TestMaintainStopDisarms: when the loop stops, the timer it armed for the ledger's next moment is stopped too.
func TestMaintainStopDisarms(t *testing.T) {
	fx := newMaintFixture(t)
	T := maintT0.Add(time.Hour)
	fx.donate(t, "claude-code", grant("CC", T))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	fx.m.run(ctx, &wg)
	fx.nextPass(t)
	if at := fx.timers.nextArmed(t); !at.Equal(T) {
		t.Fatalf("timer armed for %s, want the grant's expiry %s", at, T)
	}
	cancel()
	wg.Wait()
	fx.timers.mu.Lock()
	defer fx.timers.mu.Unlock()
	if ft := fx.timers.timers[len(fx.timers.timers)-1]; ft.Stop() || len(fx.timers.timers) != 1 { // Stop reports whether it was still armed
		t.Errorf("%d timers, the last for %s still armed after the loop stopped", len(fx.timers.timers), ft.at)
	}
}

// TestMaintenancePassFailedIsLogged: a pass that cannot read the inventory fails, not OK, and says so in
// maintenance_pass_failed with its agent_id (AUTHORIZATION.md: every maintenance_pass_* line carries it).
func TestMaintenancePassFailedIsLogged(t *testing.T) {
	fx := newMaintFixture(t)
	fx.donate(t, "kimi", vaultCredential{APIKey: "sk-kimi-0123456789"})
	os.WriteFile(filepath.Join(fx.env["BRAMA_STATE_DIR"], overlayFile), []byte("{"), 0o600)
	rep := fx.m.passOnce(context.Background(), "a1")
	if rep.err == nil || rep.OK {
		t.Fatalf("a pass over an unreadable overlay = %+v, want it failed", rep)
	}
	if !logEvent(fx.logs.String(), "maintenance_pass_failed", map[string]string{"agent_id": "a1", "cause": overlayFile}) {
		t.Errorf("no maintenance_pass_failed line with agent_id a1 naming the overlay:\n%s", fx.logs.String())
	}
}
