package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Maintenance passes (SPEC §11.2): the usage report pass reads the
// providers' own account of each subscription's plan windows, then the
// credential refresh pass refreshes the grants that fell due. Neither
// spends plan quota: no completion is ever made on a schedule (the probe,
// §11.3, is an operator's request only). A pass starts only at start, at a
// moment the ledger says something falls due (one timer), once after a
// refusal for want of a signed-in subscription, or when an operator asks;
// never on a period of Brama's own.

// errMaintenanceStopped refuses a pass asked for while no scheduler runs
// (before run, or after its context ended).
var errMaintenanceStopped = errors.New("the maintenance scheduler is not running")

// maintainer owns the maintenance passes of one serving process and their
// scheduler. Passes run one at a time on the scheduler's goroutine; a pass
// asked for while one runs becomes exactly one more pass after it.
type maintainer struct {
	inv    *inventory
	l      *ledger
	o      *oauthClient
	j      *journal
	client *http.Client // the provider client: no timeout, no redirects, no proxy
	getenv func(string) string
	log    *slog.Logger
	clock  func() time.Time

	kick chan struct{} // buffered 1: wakes the scheduler after pending or the timer changed

	// testingOnlyAfterFunc replaces time.AfterFunc for the due timer (nil in
	// production), so tests fire it by hand after moving their clock.
	testingOnlyAfterFunc func(d time.Duration, f func()) ledgerStopper
	// testingOnlyPassDone runs on the scheduler after each pass (nil in
	// production), so tests see every pass, its reason and its start.
	testingOnlyPassDone func(reason string, started time.Time, rep passReport)

	mu         sync.Mutex  // guards the fields below
	loop       loopState   // whether the scheduler runs
	pending    string      // reason of the pass asked for and not yet started; "" none
	waiting    *passTicket // what passNow callers wait for: the next pass to start; nil none
	running    bool        // a pass is running
	changes    uint64      // inventory and credential changes seen (changed)
	startedAt  uint64      // changes when the last pass started
	anyStarted bool        // a pass has started
	passes     int64       // passes started
	dropped    int64       // requests dropped by the SPEC §11.2 rule
	last       passRecord  // the last finished pass
	timerAt    time.Time   // the moment the due timer is armed for; zero none
	timerGen   uint64      // identifies the armed timer, so a stale one does nothing
	timerFired bool        // the armed timer has fired
}

// loopState is where the scheduler is in its life.
type loopState int

const (
	loopNotStarted loopState = iota
	loopRunning
	loopStopped
)

// passTicket is one pass's answer for those waiting on it; rep and err are
// set before done is closed and never after.
type passTicket struct {
	done chan struct{}
	rep  passReport
	err  error
}

// passRecord is what /stats says about the last finished pass.
type passRecord struct {
	reason            string
	started, finished time.Time
	ok                bool
}

// passReport is one pass's outcome: the body of POST /v1/admin/maintain
// (SPEC §11.2).
type passReport struct {
	OK          bool              `json:"ok"`
	Usage       usageSummary      `json:"usage"`
	Credentials credentialSummary `json:"credentials"`
	NextDueAt   *string           `json:"next_due_at"` // RFC 3339, or null when nothing is due

	err error // the pass could not list the subscriptions at all; never sent
}

// usageSummary is the usage report pass's part of a passReport.
// Subscriptions counts those whose provider publishes a report for their
// credential (read or not this pass); Read counts successful reads.
type usageSummary struct {
	Subscriptions int            `json:"subscriptions"`
	Read          int            `json:"read"`
	Failed        []usageFailure `json:"failed"`
}

// usageFailure is one failed read, its error redacted.
type usageFailure struct {
	SubscriptionID string `json:"subscription_id"`
	Provider       string `json:"provider"`
	Error          string `json:"error"`
}

// credentialSummary is the refresh side of a passReport. Subscriptions
// counts non-retired OAuth subscriptions with an active credential at the
// start of the pass; Refreshed the refreshes that produced a grant; Refused
// every refresh attempt that did not (a definitive refusal or a transport
// failure alike; the credential_refresh_* log line says which).
type credentialSummary struct {
	Subscriptions int `json:"subscriptions"`
	Refreshed     int `json:"refreshed"`
	Refused       int `json:"refused"`
}

// newMaintainer builds the maintainer; nothing runs until run.
func newMaintainer(inv *inventory, l *ledger, o *oauthClient, j *journal, client *http.Client, getenv func(string) string, log *slog.Logger, now func() time.Time) *maintainer {
	if client == nil {
		client = newProviderClient()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	return &maintainer{inv: inv, l: l, o: o, j: j, client: client, getenv: getenv, log: log, clock: now,
		kick: make(chan struct{}, 1)}
}

// run starts the scheduler: one pass at once (the listener is up), then a
// pass when the due timer fires or one is asked for. It returns at once;
// the goroutine it starts is counted in wg and exits when ctx is done,
// after the pass in progress (whose provider calls end with ctx).
func (m *maintainer) run(ctx context.Context, wg *sync.WaitGroup) {
	m.mu.Lock()
	m.loop = loopRunning
	m.pending = cmp.Or(m.pending, "start")
	m.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.schedule(ctx)
	}()
}

// schedule is the scheduler's loop: run the pending pass if any, else arm
// the one timer at the ledger's next due moment and wait for ctx, a kick or
// a ledger change (which may move that moment).
func (m *maintainer) schedule(ctx context.Context) {
	changed := m.l.subscribe()
	var timer ledgerStopper
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		m.stop()
	}()
	for ctx.Err() == nil {
		if reason, ticket, ok := m.take(); ok {
			m.pass(ctx, reason, ticket)
			continue // a pass asked for meanwhile runs next
		}
		timer = m.arm(timer)
		select {
		case <-ctx.Done():
		case <-m.kick:
		case <-changed:
		}
	}
}

// take starts the pending pass's bookkeeping: it clears pending, hands over
// the waiters' ticket and records the start for the request rule.
func (m *maintainer) take() (string, *passTicket, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending == "" {
		return "", nil, false
	}
	reason, t := m.pending, m.waiting
	m.pending, m.waiting = "", nil
	m.running, m.anyStarted, m.startedAt = true, true, m.changes
	m.passes++
	return reason, t, true
}

// pass runs one pass, answers its waiters and logs it.
func (m *maintainer) pass(ctx context.Context, reason string, t *passTicket) {
	started := m.clock()
	m.log.Info("maintenance_pass_started", "reason", reason)
	rep := m.passOnce(ctx)
	m.mu.Lock()
	m.running = false
	m.last = passRecord{reason: reason, started: started, finished: m.clock(), ok: rep.OK}
	m.mu.Unlock()
	if m.testingOnlyPassDone != nil {
		m.testingOnlyPassDone(reason, started, rep)
	}
	if t != nil {
		t.rep, t.err = rep, rep.err
		close(t.done)
	}
}

// arm sets the one due timer to the ledger's next due moment (SPEC §11.2),
// keeping timer when that moment is unchanged and it has not fired. It
// returns the timer now armed (nil when nothing is due). It arms nothing
// while a pass is pending (the loop runs it first, then arms), and an armed
// moment that has come before its timer fired is due now: it becomes the
// pending pass rather than being skipped for a later moment.
func (m *maintainer) arm(timer ledgerStopper) ledgerStopper {
	now := m.clock()
	due, ok := m.l.nextDue(now)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.pending != "":
		return timer
	case timer != nil && !m.timerFired && !m.timerAt.After(now):
		timer.Stop()
		m.timerGen++
		m.timerAt = time.Time{}
		m.pending = "due"
		m.wake()
		return nil
	case timer != nil && ok && due.Equal(m.timerAt) && !m.timerFired:
		return timer
	}
	if timer != nil {
		timer.Stop()
	}
	m.timerGen++
	m.timerAt, m.timerFired = time.Time{}, false
	if !ok {
		return nil
	}
	after := m.testingOnlyAfterFunc
	if after == nil {
		after = func(d time.Duration, f func()) ledgerStopper { return time.AfterFunc(d, f) }
	}
	gen := m.timerGen
	m.timerAt = due
	return after(due.Sub(now), func() {
		m.mu.Lock()
		current := gen == m.timerGen
		if current {
			m.timerFired = true
			m.pending = cmp.Or(m.pending, "due")
		}
		m.mu.Unlock()
		if current {
			m.wake()
		}
	})
}

// wake nudges the scheduler without ever blocking.
func (m *maintainer) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// stop marks the scheduler gone and answers anyone still waiting.
func (m *maintainer) stop() {
	m.mu.Lock()
	m.loop = loopStopped
	t := m.waiting
	m.waiting, m.pending = nil, ""
	m.mu.Unlock()
	if t != nil {
		t.err = errMaintenanceStopped
		close(t.done)
	}
}

// request asks for one pass after a refusal for want of a signed-in
// subscription (SPEC §11.2). It is dropped when a pass has started since
// the last inventory or credential change (changed), so a burst of such
// refusals causes at most one pass until something changes. Nil-safe.
func (m *maintainer) request(reason string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	drop := m.anyStarted && m.startedAt == m.changes
	if drop {
		m.dropped++
	} else {
		m.pending = cmp.Or(m.pending, reason)
	}
	m.mu.Unlock()
	if drop {
		m.log.Debug("maintenance_request_dropped", "reason", reason)
		return
	}
	m.log.Info("maintenance_requested", "reason", reason)
	m.wake()
}

// changed records a change to the inventory or a credential (donation,
// sign-in, reinstate, credential replacement): the next request is honoured
// again. It starts no pass. Nil-safe.
func (m *maintainer) changed() {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.changes++
	m.mu.Unlock()
}

// passNow runs one pass for POST /v1/admin/maintain and returns its report.
// The answer always comes from a pass that starts after the call: when a
// pass is already running (it may have started before the change the
// operator wants seen) the call joins the one more pass coalesced after it,
// and calls arriving together share one pass. It returns ctx's error when
// the caller stops waiting (the pass still runs) and errMaintenanceStopped
// when no scheduler runs.
func (m *maintainer) passNow(ctx context.Context) (passReport, error) {
	t, err := m.ask("maintain")
	if err != nil {
		return passReport{}, err
	}
	select {
	case <-t.done:
		return t.rep, t.err
	case <-ctx.Done():
		return passReport{}, ctx.Err()
	}
}

// ask asks for the next pass to start and returns the ticket it will
// answer (shared by everyone who asks before it starts).
func (m *maintainer) ask(reason string) (*passTicket, error) {
	if m == nil {
		return nil, errMaintenanceStopped
	}
	m.mu.Lock()
	if m.loop != loopRunning {
		m.mu.Unlock()
		return nil, errMaintenanceStopped
	}
	if m.waiting == nil {
		m.waiting = &passTicket{done: make(chan struct{})}
	}
	t := m.waiting
	m.pending = cmp.Or(m.pending, reason)
	m.mu.Unlock()
	m.wake()
	return t, nil
}

// state is /stats' maintenance member. Nil-safe.
func (m *maintainer) state() map[string]any {
	if m == nil {
		return map[string]any{"passes": 0}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	st := map[string]any{
		"passes":           m.passes,
		"running":          m.running,
		"pending":          m.pending != "",
		"requests_dropped": m.dropped,
		"next_due_at":      rfc3339OrNil(m.timerAt),
		"last_pass":        nil,
	}
	if !m.last.started.IsZero() {
		st["last_pass"] = map[string]any{
			"reason":      m.last.reason,
			"started_at":  m.last.started.UTC().Format(time.RFC3339Nano),
			"finished_at": m.last.finished.UTC().Format(time.RFC3339Nano),
			"ok":          m.last.ok,
		}
	}
	return st
}

// rfc3339OrNil is t in RFC 3339 UTC, or nil for the zero time.
func rfc3339OrNil(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339)
	return &s
}

// handleMaintain serves POST /v1/admin/maintain with m: one pass now
// (passNow), answered with its report (SPEC §11.2). The body may be empty
// or {}. A pass that could not list the subscriptions is answered with its
// refusal (503 naming the cause) rather than a report of nothing.
func (s *server) handleMaintain(m *maintainer) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if len(strings.TrimSpace(string(infoFrom(r.Context()).body))) > 0 {
			var none struct{}
			if err := decodeBody(r, &none); err != nil {
				s.fail(w, r, err)
				return
			}
		}
		rep, err := m.passNow(r.Context())
		switch {
		case errors.Is(err, errMaintenanceStopped):
			s.fail(w, r, refuse("dependency_unavailable", "no pass can run: %v", err).because(err))
			return
		case err != nil:
			s.fail(w, r, asAPIError(err))
			return
		}
		writeJSON(w, http.StatusOK, rep)
	}
}

// maintainCmd is `brama maintain [-gateway URL] [-json]`: it asks the daemon
// for one pass (SPEC §11.2, §16.1), prints a summary (or the body with
// -json), and exits 0 only when the pass was ok.
func (e cliEnv) maintainCmd(args []string) error {
	const usage = "maintain [-gateway URL] [-json]  (bearer from BRAMA_TOKEN, else stdin's first line)"
	fs := e.newFlags("maintain")
	gw := gatewayFlag(fs)
	asJSON := fs.Bool("json", false, "print the body of POST /v1/admin/maintain")
	if _, err := parseFlags(fs, args, 0, usage); err != nil {
		return err
	}
	g, err := e.subscriptionGateway(*gw, bufio.NewReader(e.stdin))
	if err != nil {
		return err
	}
	b, err := g.call("POST", "/v1/admin/maintain", nil)
	if err != nil {
		return err
	}
	var rep passReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("the gateway's answer is not a maintenance report (%s)", jsonErrorKind(err))
	}
	if *asJSON {
		e.stdout.Write(b)
	} else {
		e.printPassReport(rep)
	}
	if !rep.OK {
		return errRefused
	}
	return nil
}

// printPassReport prints a pass's report as a few lines of text.
func (e cliEnv) printPassReport(rep passReport) {
	verdict := "ok"
	if !rep.OK {
		verdict = "not ok"
	}
	fmt.Fprintf(e.stdout, "maintenance pass: %s\n", verdict)
	fmt.Fprintf(e.stdout, "usage reports: %d subscription(s), %d read, %d failed\n",
		rep.Usage.Subscriptions, rep.Usage.Read, len(rep.Usage.Failed))
	for _, f := range rep.Usage.Failed {
		fmt.Fprintf(e.stdout, "  failed %s (%s): %s\n", f.SubscriptionID, f.Provider, f.Error)
	}
	fmt.Fprintf(e.stdout, "credentials: %d subscription(s), %d refreshed, %d refused or failed\n",
		rep.Credentials.Subscriptions, rep.Credentials.Refreshed, rep.Credentials.Refused)
	next := "nothing due"
	if rep.NextDueAt != nil {
		next = *rep.NextDueAt
	}
	fmt.Fprintf(e.stdout, "next due: %s\n", next)
}
