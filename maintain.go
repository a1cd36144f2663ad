package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Maintenance (SPEC §11.2): the usage report pass reads the providers' own
// account of each subscription's plan windows, then the credential refresh
// pass refreshes the grants that fell due. Neither spends plan quota: no
// completion is ever made on a schedule (the probe, §11.3, is an operator's
// request only). A pass starts only at start, at a moment the ledger states
// (one timer), once after a refusal for want of a signed-in subscription, or
// when an operator asks; never on a period of Brama's own. The shape is
// gitmirror's: loop around a testable loopOnce.

// errMaintenanceStopped refuses a pass asked for while no loop runs.
var errMaintenanceStopped = errors.New("the maintenance scheduler is not running")

// maintainer owns the maintenance passes of one serving process. Passes run
// one at a time on loop's goroutine; a pass asked for while one runs becomes
// exactly one more pass after it.
type maintainer struct {
	inv    *inventory
	l      *ledger
	o      *oauthClient
	j      *journal
	client *http.Client // the provider client: no timeout, no redirects, no proxy
	getenv func(string) string
	log    *slog.Logger
	clock  func() time.Time
	kick   chan struct{} // buffered 1: wakes loop after pending or the timer changed

	// testingOnlyAfterFunc replaces time.AfterFunc for the due timer and
	// testingOnlyPassDone sees every finished pass (both nil in production).
	testingOnlyAfterFunc func(d time.Duration, f func()) ledgerStopper
	testingOnlyPassDone  func(reason string, started time.Time, rep passReport)

	mu        sync.Mutex    // guards the fields below
	looping   bool          // loop runs, so passNow can be answered
	pending   string        // reason of the pass asked for and not yet started; "" none
	waiting   *passTicket   // what passNow callers wait for: the next pass to start
	running   bool          // a pass is running
	changes   uint64        // inventory and credential changes seen (changed)
	startedAt uint64        // changes when the last pass started
	passes    int64         // passes started
	dropped   int64         // requests dropped by the SPEC §11.2 rule
	last      passRecord    // the last finished pass
	timer     ledgerStopper // the armed due timer; nil when none or it fired
	timerAt   time.Time     // the moment it is armed for; zero none
	timerGen  uint64        // identifies the armed timer, so a stale one does nothing
}

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

// passReport is the body of POST /v1/admin/maintain (SPEC §11.2).
type passReport struct {
	OK          bool              `json:"ok"`
	Usage       usageSummary      `json:"usage"`
	Credentials credentialSummary `json:"credentials"`
	NextDueAt   *string           `json:"next_due_at"` // RFC 3339, or null when nothing is due

	err error // the pass could not list the subscriptions at all; never sent
}

// usageSummary counts the subscriptions whose provider publishes a report
// for their credential (read or not this pass) and the successful reads.
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

// credentialSummary counts non-retired OAuth subscriptions with an active
// credential at the start of the pass, refreshes that produced a grant, and
// every attempt that did not (refusal or transport failure alike; the
// credential_refresh_* log line says which).
type credentialSummary struct {
	Subscriptions int `json:"subscriptions"`
	Refreshed     int `json:"refreshed"`
	Refused       int `json:"refused"`
}

// newMaintainer builds the maintainer; nothing runs until run.
func newMaintainer(inv *inventory, l *ledger, o *oauthClient, j *journal, client *http.Client, getenv func(string) string, log *slog.Logger, now func() time.Time) *maintainer {
	return &maintainer{inv: inv, l: l, o: o, j: j, client: client, getenv: getenv, log: log, clock: now,
		kick: make(chan struct{}, 1)}
}

// run starts loop with the start pass pending (the listener is up). The
// goroutine is counted in wg and exits when ctx is done, after the pass in
// progress (whose provider calls end with ctx).
func (m *maintainer) run(ctx context.Context, wg *sync.WaitGroup) {
	m.mu.Lock()
	m.looping = true
	m.pending = cmp.Or(m.pending, "start")
	m.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.loop(ctx)
	}()
}

// loop runs loopOnce until ctx ends, waiting between turns for a kick or a
// ledger change (which may move the next due moment).
func (m *maintainer) loop(ctx context.Context) {
	changed := m.l.subscribe()
	defer m.stop()
	for ctx.Err() == nil {
		if m.loopOnce(ctx) {
			continue // a pass asked for meanwhile runs next
		}
		select {
		case <-ctx.Done():
		case <-m.kick:
		case <-changed:
		}
	}
}

// loopOnce runs the pending pass and reports true, or else arms the one due
// timer at the ledger's next due moment (SPEC §11.2) and reports false. The
// timer is kept while that moment is unchanged; an armed moment that has
// come before its timer fired is due now, never skipped for a later one.
func (m *maintainer) loopOnce(ctx context.Context) bool {
	now := m.clock()
	due, ok := m.l.nextDue(now)
	m.mu.Lock()
	if m.pending == "" && m.timer != nil && !m.timerAt.After(now) {
		m.disarmLocked()
		m.pending = "due"
	}
	if m.pending == "" {
		if m.timer == nil || !ok || !due.Equal(m.timerAt) {
			m.armLocked(due, ok, now)
		}
		m.mu.Unlock()
		return false
	}
	reason, t := m.pending, m.waiting
	m.pending, m.waiting = "", nil
	m.running, m.startedAt = true, m.changes
	m.passes++
	m.mu.Unlock()

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
	return true
}

// armLocked replaces the due timer with one for due (none when !ok). m.mu is held.
func (m *maintainer) armLocked(due time.Time, ok bool, now time.Time) {
	m.disarmLocked()
	if !ok {
		return
	}
	gen := m.timerGen
	m.timerAt = due
	m.timer = afterFunc(m.testingOnlyAfterFunc, due.Sub(now), func() {
		m.mu.Lock()
		current := gen == m.timerGen
		if current {
			m.timer = nil // fired: the next turn arms afresh
			m.pending = cmp.Or(m.pending, "due")
		}
		m.mu.Unlock()
		if current {
			m.wake()
		}
	})
}

// disarmLocked stops the due timer; one firing late finds its generation
// gone. m.mu is held.
func (m *maintainer) disarmLocked() {
	if m.timer != nil {
		m.timer.Stop()
	}
	m.timer, m.timerAt = nil, time.Time{}
	m.timerGen++
}

// wake nudges loop without ever blocking.
func (m *maintainer) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// stop marks the loop gone, stops its timer and answers anyone waiting.
func (m *maintainer) stop() {
	m.mu.Lock()
	m.looping = false
	if m.timer != nil {
		m.timer.Stop()
	}
	m.timerGen++
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
// the last inventory or credential change, so a burst of such refusals
// causes at most one pass until something changes. Nil-safe.
func (m *maintainer) request(reason string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	drop := m.passes > 0 && m.startedAt == m.changes
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
// sign-in, reinstate, credential replacement): the next request counts
// again. It starts no pass. Nil-safe.
func (m *maintainer) changed() {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.changes++
	m.mu.Unlock()
}

// passNow runs one pass for POST /v1/admin/maintain. The answer comes from
// a pass that starts after the call (a running pass may predate the change
// the operator wants seen), shared by calls arriving together. It returns
// ctx's error when the caller stops waiting (the pass still runs).
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

// ask asks for the next pass and returns the ticket it will answer.
func (m *maintainer) ask(reason string) (*passTicket, error) {
	if m == nil {
		return nil, errMaintenanceStopped
	}
	m.mu.Lock()
	if !m.looping {
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
	st := map[string]any{"passes": m.passes, "running": m.running, "pending": m.pending != "",
		"requests_dropped": m.dropped, "next_due_at": rfc3339OrNil(m.timerAt), "last_pass": nil}
	if !m.last.started.IsZero() {
		st["last_pass"] = map[string]any{"reason": m.last.reason, "ok": m.last.ok,
			"started_at":  m.last.started.UTC().Format(time.RFC3339Nano),
			"finished_at": m.last.finished.UTC().Format(time.RFC3339Nano)}
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

// handleMaintain serves POST /v1/admin/maintain (an empty body or {}) with
// one pass now. A pass that could not list the subscriptions is refused 503
// naming the cause rather than reported as a pass over nothing.
func (s *server) handleMaintain(m *maintainer) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var none struct{}
		if err := decodeOptionalBody(r, &none); err != nil {
			s.fail(w, r, err)
			return
		}
		rep, err := m.passNow(r.Context())
		switch {
		case errors.Is(err, errMaintenanceStopped):
			s.fail(w, r, refuse("dependency_unavailable", "no pass can run: %v", err).because(err))
		case err != nil:
			s.fail(w, r, asAPIError(err))
		default:
			writeJSON(w, http.StatusOK, rep)
		}
	}
}

// decodeOptionalBody is decodeBody for a route whose body may be empty.
func decodeOptionalBody(r *http.Request, v any) error {
	if len(strings.TrimSpace(string(infoFrom(r.Context()).body))) == 0 {
		return nil
	}
	return decodeBody(r, v)
}

// passSub is one non-retired subscription as a pass found it.
type passSub struct {
	it      overlayItem
	cred    vaultCredential
	credErr error // the vault holds no usable credential for it
	entry   ledgerEntry
}

// grantAttempt is how a subscription's one refresh attempt of a pass went.
type grantAttempt int

const (
	attemptNone       grantAttempt = iota // no attempt this pass
	attemptRefreshed                      // a new grant was stored
	attemptFailed                         // refused, or a transport failure
	attemptSuperseded                     // a sign-in replaced the grant meanwhile; nothing failed
)

// passOnce runs one pass now. Each subscription gets at most one usage read
// and one refresh attempt, nothing is retried (a failure waits for a later
// pass), and different subscriptions run side by side while the pass waits
// for all, so passes never overlap. Brama sets these calls no time limit
// (SPEC §7.4): a provider that never answers holds the pass until ctx ends.
func (m *maintainer) passOnce(ctx context.Context) passReport {
	start := m.clock()
	rep := passReport{Usage: usageSummary{Failed: []usageFailure{}}}
	subs, err := m.live()
	if err == nil {
		refreshes := make([]grantAttempt, len(subs))
		m.usagePass(ctx, subs, refreshes, &rep)
		m.refreshPass(ctx, subs, refreshes, &rep)
		for _, r := range refreshes {
			rep.Credentials.Refreshed += b2i(r == attemptRefreshed)
			rep.Credentials.Refused += b2i(r == attemptFailed)
		}
		rep.OK = len(rep.Usage.Failed) == 0 && rep.Credentials.Refused == 0
	}
	due, _ := m.l.nextDue(m.clock())
	rep.NextDueAt = rfc3339OrNil(due)
	if err != nil {
		rep.err = err
		m.log.Warn("maintenance_pass_failed", "cause", redact(err.Error()))
		return rep
	}
	m.log.Info("maintenance_pass_done", "ok", rep.OK, "usage_read", rep.Usage.Read, "usage_failed", len(rep.Usage.Failed),
		"refreshed", rep.Credentials.Refreshed, "refused", rep.Credentials.Refused,
		"next_due_at", *cmp.Or(rep.NextDueAt, new(string)), "dur_ms", m.clock().Sub(start).Milliseconds())
	return rep
}

// b2i is 1 for true.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// live lists the non-retired subscriptions with their credentials and
// ledger entries.
func (m *maintainer) live() ([]passSub, error) {
	items, err := m.inv.items()
	if err != nil {
		return nil, err
	}
	retired, err := m.j.retired()
	if err != nil {
		return nil, refuse("dependency_unavailable", "the journal cannot be read: %v", err).because(err)
	}
	var subs []passSub
	for _, it := range items {
		if !retired[it.ID] {
			s := passSub{it: it}
			s.cred, s.credErr = m.inv.credential(it.ID)
			s.entry, _ = m.l.entry(it.ID)
			subs = append(subs, s)
		}
	}
	return subs, nil
}

// usagePass reads the report of every due subscription with an active
// credential once, side by side, and records each outcome in the ledger.
func (m *maintainer) usagePass(ctx context.Context, subs []passSub, refreshes []grantAttempt, rep *passReport) {
	now := m.clock()
	errs := make([]error, len(subs))
	read := make([]bool, len(subs))
	var wg sync.WaitGroup
	for i, s := range subs {
		_, published := usageReports[s.it.Provider]
		if s.entry.Credential.State != credActive || !published || (s.credErr == nil && !usageReportable(s.it.Provider, s.cred)) {
			continue
		}
		rep.Usage.Subscriptions++
		if !usageDue(s.entry, now) {
			continue
		}
		wg.Add(1)
		go func() { // exits when this one read (and a refresh before it) ends; ctx ends both
			defer wg.Done()
			read[i], errs[i] = m.readOnce(ctx, s, &refreshes[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		switch {
		case !read[i]:
		case err == nil:
			rep.Usage.Read++
		default:
			rep.Usage.Failed = append(rep.Usage.Failed, usageFailure{SubscriptionID: subs[i].it.ID, Provider: subs[i].it.Provider, Error: err.Error()})
		}
	}
}

// usageDue applies SPEC §11.2's "read once when": no reading yet, a failed
// last read, a window whose reset has passed, or a reading naming no reset.
func usageDue(e ledgerEntry, now time.Time) bool {
	return e.UsageRead.AtMs == 0 || !e.UsageRead.OK || len(e.Windows) == 0 ||
		slices.ContainsFunc(e.Windows, func(w planWindow) bool { return w.ResetsAtMs == 0 || w.ResetsAtMs <= now.UnixMilli() })
}

// readOnce reads s's usage report and records the outcome: windows and an
// ok read, or a failed read that keeps the earlier windows. A grant expired
// by the request path's rule is refreshed first, as any call would (s's one
// refresh attempt of the pass); if that fails nothing is read. Nothing is
// recorded when ctx ended (the daemon is stopping; the provider said nothing).
func (m *maintainer) readOnce(ctx context.Context, s passSub, refreshed *grantAttempt) (bool, error) {
	id, provider := s.it.ID, s.it.Provider
	cred, err := s.cred, s.credErr
	if err == nil && cred.OAuth != nil && expiredForRequest(*cred.OAuth, m.clock()) {
		var g oauthGrant
		g, err = m.o.refresh(ctx, id, provider, "")
		*refreshed = attemptOf(err)
		if err != nil {
			err = fmt.Errorf("not read: the expired grant could not be refreshed: %w", err)
		} else {
			cred.OAuth = &g
		}
	}
	var ws []planWindow
	if err == nil {
		ws, err = m.fetchUsage(ctx, provider, cred)
	}
	switch {
	case ctx.Err() != nil:
		return false, nil
	case err != nil:
		secrets := []string{cred.APIKey}
		if g := cred.OAuth; g != nil {
			secrets = append(secrets, g.AccessToken, g.RefreshToken, g.IDToken)
		}
		msg := ledgerSentence(redact(err.Error(), secrets...))
		m.l.recordUsageRead(id, provider, false, msg)
		m.log.Warn("usage_read_failed", "subscription_id", id, "provider", provider, "error", msg)
		return true, errors.New(msg)
	}
	m.l.recordWindows(id, provider, ws)
	m.l.recordUsageRead(id, provider, true, strconv.Itoa(len(ws))+" window(s) read")
	m.log.Info("usage_read_ok", "subscription_id", id, "provider", provider, "windows", len(ws))
	return true, nil
}

// attemptOf classifies a refresh's result for the report.
func attemptOf(err error) grantAttempt {
	switch {
	case err == nil:
		return attemptRefreshed
	case errors.Is(err, errRefreshSuperseded):
		return attemptSuperseded
	}
	return attemptFailed
}

// refreshDue applies SPEC §11.2's refresh rule to grant g last refreshed at
// refreshedAtMs: expired (now ≥ expires_at_ms, not the request path's minute
// early), or expiry unknown and never refreshed by Brama.
func refreshDue(g oauthGrant, refreshedAtMs int64, now time.Time) bool {
	if g.ExpiresAtMs == 0 {
		return refreshedAtMs == 0
	}
	return now.UnixMilli() >= g.ExpiresAtMs
}

// refreshPass makes one refresh attempt for each OAuth subscription whose
// credential is active and whose grant is due, unless the usage pass spent
// its attempt. needs_reauthorization credentials wait for a sign-in.
func (m *maintainer) refreshPass(ctx context.Context, subs []passSub, refreshes []grantAttempt, rep *passReport) {
	now := m.clock()
	var wg sync.WaitGroup
	for i, s := range subs {
		if _, err := lookupOAuth(s.it.Provider); err != nil || s.credErr != nil || s.cred.OAuth == nil || s.entry.Credential.State != credActive {
			continue
		}
		rep.Credentials.Subscriptions++
		e, _ := m.l.entry(s.it.ID)
		if refreshes[i] != attemptNone || e.Credential.State != credActive {
			continue
		}
		cur, err := m.inv.credential(s.it.ID) // the usage pass or a request may have refreshed it
		if err != nil || cur.OAuth == nil || !refreshDue(*cur.OAuth, e.Credential.RefreshedAtMs, now) {
			continue
		}
		wg.Add(1)
		go func() { // exits when this one refresh ends (oauth.refresh returns at ctx's end)
			defer wg.Done()
			_, err := m.o.refresh(ctx, s.it.ID, s.it.Provider, "")
			if ctx.Err() == nil {
				refreshes[i] = attemptOf(err)
			}
		}()
	}
	wg.Wait()
}

// usageReports is every provider that publishes a usage report (SPEC
// §11.2): where it is read below the provider's base URL (codex's lives
// elsewhere) and how its body reads. claude-code's and codex's answer only
// the OAuth sign-in; Kimi Code's answers its chat route's bearer, a key too.
var usageReports = map[string]struct {
	path   string
	parse  func([]byte, time.Time) ([]planWindow, error)
	apiKey bool
}{
	"claude-code": {path: "/api/oauth/usage", parse: parseClaudeCodeUsage},
	"codex":       {parse: parseCodexUsage},
	"kimi":        {path: "/usages", parse: parseKimiUsage, apiKey: true},
}

// codexUsageURL is codex's usage report; BRAMA_PROVIDER_CODEX_USAGE_URL
// overrides it on its own, apart from the codex base URL.
const codexUsageURL = "https://chatgpt.com/backend-api/wham/usage"

// usageReportable says whether provider publishes a report cred can read.
func usageReportable(provider string, cred vaultCredential) bool {
	r, ok := usageReports[provider]
	return ok && (cred.OAuth != nil || (r.apiKey && cred.APIKey != ""))
}

// usageEndpoint is where provider's report is read and how its body parses.
func (m *maintainer) usageEndpoint(provider string) (string, func([]byte, time.Time) ([]planWindow, error), error) {
	r, ok := usageReports[provider]
	info, known := lookupProvider(provider)
	switch {
	case !ok || !known:
		return "", nil, fmt.Errorf("provider %q publishes no usage report", provider)
	case provider == "codex":
		raw := cmp.Or(strings.TrimSpace(m.getenv("BRAMA_PROVIDER_CODEX_USAGE_URL")), codexUsageURL)
		if err := checkBaseURL(raw); err != nil {
			return "", nil, fmt.Errorf("BRAMA_PROVIDER_CODEX_USAGE_URL: %w: %v", errBaseURL, err)
		}
		return raw, r.parse, nil
	}
	base, err := providerBaseURL(info, m.getenv)
	if err != nil {
		return "", nil, err
	}
	return base + r.path, r.parse, nil
}

// fetchUsage makes one GET of provider's usage report with cred, sending the
// chat route's headers (SPEC §11.2), reads it whole and parses it. ctx is
// the only cancel. Every failure is a *usageReadError (or names a
// configuration problem), quoting neither the body nor a credential.
func (m *maintainer) fetchUsage(ctx context.Context, provider string, cred vaultCredential) ([]planWindow, error) {
	endpoint, parse, err := m.usageEndpoint(provider)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return nil, &usageReadError{Endpoint: endpointName(endpoint), Err: err}
	}
	token := cred.APIKey
	if cred.OAuth != nil {
		token = cred.OAuth.AccessToken
	}
	h := req.Header
	h.Set("Authorization", "Bearer "+token)
	h.Set("Accept", "application/json")
	switch provider {
	case "claude-code":
		h.Set("anthropic-version", "2023-06-01")
		h.Set("anthropic-beta", "oauth-2025-04-20")
	case "codex":
		if cred.OAuth != nil && cred.OAuth.AccountID != "" {
			h.Set("chatgpt-account-id", cred.OAuth.AccountID)
		}
		h.Set("OpenAI-Beta", "responses=experimental")
		h.Set("originator", "codex_cli_rs")
	}
	status, body, err := callEndpoint(m.client, req)
	re := &usageReadError{Endpoint: endpointName(endpoint), Status: status, Received: len(body), Err: err}
	switch {
	case err != nil && status != 0:
		re.Err = fmt.Errorf("the body ended early: %w", err)
	case err == nil && status/100 == 2:
		var ws []planWindow
		if ws, re.Err = parse(body, m.clock()); re.Err == nil {
			return ws, nil
		}
	}
	return nil, re
}

// usageReadError is a failed usage report read: the endpoint, the HTTP
// status (or "no status") and the bytes received, never the body.
type usageReadError struct {
	Endpoint string // scheme, host and path
	Status   int    // 0: no HTTP status was received
	Received int    // body bytes received
	Err      error  // the cause; nil for a plain non-2xx answer
}

func (e *usageReadError) Error() string {
	return withCause(fmt.Sprintf("usage report GET %s: %s, %d bytes received", e.Endpoint, statusText(e.Status), e.Received), e.Err)
}

func (e *usageReadError) Unwrap() error { return e.Err }

// The usage report readers turn one report body into plan windows (source
// usage_report) that the ledger keeps beside those read from traffic. The
// shapes are the providers' own and undocumented, so each reads, through the
// one lenient reader below, what it recognizes, skips what it does not, and
// never guesses a number. Fractions are clamped to [0,1]; instants are RFC
// 3339, epoch seconds or epoch milliseconds (≥ 1e12 ⇒ ms).

// errUsageReport classifies every refusal of a report body: not a JSON
// object, or naming no plan window.
var errUsageReport = errors.New("the usage report is not usable")

// usageMaxResetMs bounds a reset instant (planMaxResetSeconds), so
// arithmetic on it cannot overflow and a nonsense value is not kept.
const usageMaxResetMs = planMaxResetSeconds * 1000

// report is one JSON object of a provider report, read leniently.
type report map[string]json.RawMessage

// readReport decodes body as a JSON object; anything else is errUsageReport,
// described without quoting it (a report can hold account details).
func readReport(body []byte) (report, error) {
	var r report
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%w: the body is not a JSON object (%s)", errUsageReport, jsonErrorKind(err))
	}
	if r == nil {
		return nil, fmt.Errorf("%w: the body is not a JSON object (null)", errUsageReport)
	}
	return r, nil
}

// asReport is raw as an object, or nil when it is absent, null or not one.
func asReport(raw json.RawMessage) report {
	var r report
	if json.Unmarshal(raw, &r) != nil {
		return nil
	}
	return r
}

// obj is the object under key, or nil.
func (r report) obj(key string) report { return asReport(r[key]) }

// num is the first of keys holding a number (a JSON number, or a string
// holding one: Kimi sends counters as strings).
func (r report) num(keys ...string) (float64, bool) {
	for _, k := range keys {
		if f, ok := usageNumber(r[k]); ok {
			return f, true
		}
	}
	return 0, false
}

// instant is the first of keys holding a readable instant, in epoch ms; 0 none.
func (r report) instant(keys ...string) int64 {
	for _, k := range keys {
		if ms, ok := usageInstant(r[k]); ok {
			return ms
		}
	}
	return 0
}

// usageNumber reads raw as a finite number, or a string holding one.
func usageNumber(raw json.RawMessage) (float64, bool) {
	if s, ok := jsonString(raw); ok {
		return parseNumber(s)
	}
	return parseNumber(string(raw))
}

// usageInstant reads raw as an instant in epoch milliseconds: an RFC 3339
// string, or epoch seconds or milliseconds as a number or numeric string. A
// moment at or before the epoch or past usageMaxResetMs is unknown (false).
func usageInstant(raw json.RawMessage) (int64, bool) {
	if s, ok := jsonString(raw); ok {
		if t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(s)); err == nil {
			return usageMs(float64(t.UnixMilli()))
		}
	}
	f, ok := usageNumber(raw)
	if !ok {
		return 0, false
	}
	if f < 1e12 { // SPEC §11.2: ≥ 1e12 ⇒ ms (1e12 s would be year 33658)
		f *= 1000
	}
	return usageMs(f)
}

// usageMs keeps epoch milliseconds after the epoch and within usageMaxResetMs.
func usageMs(f float64) (int64, bool) {
	if !(f > 0 && f <= usageMaxResetMs) {
		return 0, false
	}
	return int64(f), true
}

// usageNoWindows is the refusal of a report that parsed but named no window.
func usageNoWindows(what string) error {
	return fmt.Errorf("%w: it names no plan window (%s)", errUsageReport, what)
}

// claudeWindowKey is the shape of a claude-code report member Brama keeps
// as a window, so odd keys never become ids.
var claudeWindowKey = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// parseClaudeCodeUsage reads GET {base}/api/oauth/usage: members such as
// five_hour or seven_day_opus holding {"utilization": percent, "resets_at":
// instant|null}. Only an object with both keys and a numeric utilization is
// a window, so a null member, a disabled model window and extra_usage
// (credits, no resets_at) are skipped. Members traffic headers also state
// keep their ids (anthropicWindows) and come first; the rest follow by name
// as anthropic:<name>.
func parseClaudeCodeUsage(body []byte, now time.Time) ([]planWindow, error) {
	r, err := readReport(body)
	if err != nil {
		return nil, err
	}
	rank := func(k string) int {
		i := slices.IndexFunc(anthropicWindows, func(w anthropicWindow) bool { return w.member == k })
		return cmp.Or(i+1, len(anthropicWindows)+1)
	}
	keys := slices.Sorted(maps.Keys(r))
	slices.SortStableFunc(keys, func(a, b string) int { return rank(a) - rank(b) })
	var ws []planWindow
	for _, k := range keys {
		m := r.obj(k)
		_, hasReset := m["resets_at"]
		util, ok := m.num("utilization")
		if !claudeWindowKey.MatchString(k) || !ok || !hasReset {
			continue
		}
		id, label := "anthropic:"+k, strings.ReplaceAll(k, "_", " ")
		if i := rank(k) - 1; i < len(anthropicWindows) {
			id, label = anthropicWindows[i].id, anthropicWindows[i].label
		}
		ws = append(ws, newWindow(id, label, util/100, m.instant("resets_at"), now, windowSourceReport))
	}
	if len(ws) == 0 {
		return nil, usageNoWindows("no member with utilization and resets_at")
	}
	return ws, nil
}

// parseCodexUsage reads the codex report (GET …/backend-api/wham/usage):
// rate_limit.primary_window and secondary_window, each {"used_percent",
// "limit_window_seconds", "reset_at" | "reset_after_seconds"}, become
// codex:primary and codex:secondary, the ids traffic headers use. reset_at
// (an instant) wins over reset_after_seconds (from now).
func parseCodexUsage(body []byte, now time.Time) ([]planWindow, error) {
	r, err := readReport(body)
	if err != nil {
		return nil, err
	}
	rl := r.obj("rate_limit")
	if rl == nil {
		return nil, usageNoWindows("no rate_limit object")
	}
	var ws []planWindow
	for _, which := range []string{"primary", "secondary"} {
		m := rl.obj(which + "_window")
		pct, ok := m.num("used_percent")
		if !ok {
			continue
		}
		label := which + " window"
		if secs, ok := m.num("limit_window_seconds"); ok && secs < planMaxResetSeconds {
			label = windowLabel(secs/60, label)
		}
		reset := m.instant("reset_at")
		if after, ok := m.num("reset_after_seconds"); reset == 0 && ok && after >= 0 && after < planMaxResetSeconds {
			reset, _ = usageMs(float64(now.UnixMilli()) + after*1000)
		}
		ws = append(ws, newWindow("codex:"+which, label, pct/100, reset, now, windowSourceReport))
	}
	if len(ws) == 0 {
		return nil, usageNoWindows("rate_limit has no primary_window or secondary_window with used_percent")
	}
	return ws, nil
}

// kimiTimeUnits is minutes per window.timeUnit of a Kimi limit.
var kimiTimeUnits = map[string]float64{
	"TIME_UNIT_SECOND": 1.0 / 60, "TIME_UNIT_MINUTE": 1, "TIME_UNIT_HOUR": 60, "TIME_UNIT_DAY": 24 * 60,
}

// parseKimiUsage reads GET {base}/usages. The usage object (limit > 0 with
// used, or remaining; reset_time or resetTime) becomes kimi:usage; each
// limits[i] becomes kimi:limit-<i>, its counters and reset at its top level
// or under detail (detail wins), labelled by window.duration and timeUnit.
func parseKimiUsage(body []byte, now time.Time) ([]planWindow, error) {
	r, err := readReport(body)
	if err != nil {
		return nil, err
	}
	var ws []planWindow
	if u := r.obj("usage"); u != nil {
		if f, ok := kimiFraction(u); ok {
			ws = append(ws, newWindow("kimi:usage", "plan usage", f, u.instant("reset_time", "resetTime"), now, windowSourceReport))
		}
	}
	var limits []json.RawMessage
	if json.Unmarshal(r["limits"], &limits) != nil {
		limits = nil // not an array: no limits
	}
	for i, raw := range limits {
		top := asReport(raw)
		counters := top
		if d := top.obj("detail"); d != nil {
			counters = d
		}
		f, ok := kimiFraction(counters)
		if !ok {
			continue
		}
		w := top.obj("window")
		d, _ := w.num("duration")
		unit, _ := jsonString(w["timeUnit"])
		label := windowLabel(d*kimiTimeUnits[unit], "limit "+strconv.Itoa(i))
		reset := cmp.Or(counters.instant("resetTime", "reset_time"), top.instant("resetTime", "reset_time"))
		ws = append(ws, newWindow("kimi:limit-"+strconv.Itoa(i), label, f, reset, now, windowSourceReport))
	}
	if len(ws) == 0 {
		return nil, usageNoWindows("no usage or limits entry with a limit above 0")
	}
	return ws, nil
}

// kimiFraction is used/limit of a Kimi counter object: limit > 0, and used,
// or else limit − remaining.
func kimiFraction(m report) (float64, bool) {
	limit, ok := m.num("limit")
	if !ok || limit <= 0 {
		return 0, false
	}
	if used, ok := m.num("used"); ok {
		return used / limit, true
	}
	if rem, ok := m.num("remaining"); ok {
		return (limit - rem) / limit, true
	}
	return 0, false
}
