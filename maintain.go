package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"
)

var errMaintenanceStopped = errors.New("the maintenance scheduler is not running")

// maintainer runs one daemon's passes (SPEC §11.2: read the usage reports, then refresh the grants that fell due, never on a
// period of Brama's own) one at a time on loop's goroutine.
type maintainer struct {
	inv                 *inventory
	o                   *oauthClient // also holds the ledger, the log, the clock, the provider client and getenv
	afterFunc           func(d time.Duration, f func()) ledgerStopper
	testingOnlyPassDone func(reason string, started time.Time, rep passReport) // nil in production; sees every finished pass

	mu               sync.Mutex             // guards the fields below
	looping, running bool                   // loop runs (so passNow can be answered); a pass runs
	asked            map[string]*passTicket // agent ("": everyone) → the pass asked over its subscriptions, not yet started (§17)
	fresh            map[string]bool        // agents ("": everyone) a pass covered since the last inventory or credential change
	passes, dropped  int64                  // passes started; requests dropped by the SPEC §11.2 rule
	lastOK           bool                   // the last pass ended ok
	started, ended   time.Time              // when the last pass started and ended; zero before the first ends
	timer            ledgerStopper          // the armed due timer; nil when none
	timerAt          time.Time              // the moment it is armed for; zero when none or it fired
}

type (
	// passReport is the body of POST /v1/admin/maintain (SPEC §11.2); err (never sent): why it did not run whole.
	passReport struct {
		OK    bool `json:"ok"`
		Usage struct {
			Subscriptions int            `json:"subscriptions"` // with a report their credential reads, due or not
			Read          int            `json:"read"`
			Failed        []usageFailure `json:"failed"`
		} `json:"usage"`
		Credentials credentialSummary `json:"credentials"`
		NextDueAt   *string           `json:"next_due_at"` // RFC 3339, or null when nothing is due
		err         error
	}
	// passTicket is one asked pass: why, and its answer for its waiters (rep.err the refusal), set before done closes.
	passTicket struct {
		reason string
		done   chan struct{}
		rep    passReport
	}
	usageFailure struct { // one failed read, its error redacted
		SubscriptionID string `json:"subscription_id"`
		Provider       string `json:"provider"`
		Error          string `json:"error"`
	}
	credentialSummary struct {
		Subscriptions int `json:"subscriptions"` // active OAuth ones
		Refreshed     int `json:"refreshed"`
		Refused       int `json:"refused"` // attempts that gave no grant (the credential_refresh_* line says why)
	}
)

func newMaintainer(inv *inventory, o *oauthClient) *maintainer {
	return &maintainer{inv: inv, o: o, afterFunc: afterFunc, asked: map[string]*passTicket{}, fresh: map[string]bool{}}
}

// run starts the loop (in wg) with the start pass pending; at its end it stops the timer and answers anyone waiting.
func (m *maintainer) run(ctx context.Context, wg *sync.WaitGroup) {
	m.mu.Lock()
	m.looping = true
	m.want("", "start")
	m.mu.Unlock()
	wg.Go(func() {
		for ctx.Err() == nil {
			if !m.loopOnce(ctx, m.o.now()) { // true: a pass asked for meanwhile runs next
				select { // a requested pass, the due timer or a ledger change nudges m.o.ledger.changed
				case <-ctx.Done():
				case <-m.o.ledger.changed:
				}
			}
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.looping = false
		m.arm(time.Time{}, time.Time{})
		if t := m.asked[""]; t != nil {
			delete(m.asked, "")
			t.rep.err = errMaintenanceStopped
			close(t.done)
		}
	})
}

// loopOnce, at now, runs the pending pass (true): over everyone, else over one agent's subscriptions, or else arms the one timer
// at the ledger's next due moment (false); a moment passed before its timer fired is due now.
func (m *maintainer) loopOnce(ctx context.Context, now time.Time) bool {
	m.mu.Lock()                 // first: the journal read must not come between now and the pending check
	fold, _ := m.inv.j.folded() // unreadable: no moment is skipped
	due := m.o.ledger.nextDue(now, fold.retire)
	if m.timer != nil && !m.timerAt.After(now) { // its moment passed, or it fired (timerAt zero) whatever the clock says
		m.arm(time.Time{}, now)
		m.want("", "due")
	}
	if len(m.asked) == 0 {
		if m.timer == nil || !due.Equal(m.timerAt) {
			m.arm(due, now)
		}
		m.mu.Unlock()
		return false
	}
	agent := slices.Min(slices.Collect(maps.Keys(m.asked))) // "" sorts first: a pass over everyone
	t := m.asked[agent]
	maps.DeleteFunc(m.asked, func(a string, _ *passTicket) bool { return a == agent || agent == "" }) // the asks it covers
	m.fresh[agent] = true
	m.running = true
	m.passes++
	m.mu.Unlock()
	m.o.log.Info("maintenance_pass_started", "reason", t.reason, "agent_id", agent)
	rep := m.passOnce(ctx, agent)
	m.mu.Lock()
	m.running, m.lastOK, m.started, m.ended = false, rep.OK, now, m.o.now()
	if missed := m.o.ledger.nextDue(now, fold.retire); !missed.IsZero() && !missed.After(m.o.now()) {
		m.want("", "due") // it passed during the pass
	}
	m.mu.Unlock()
	if m.testingOnlyPassDone != nil {
		m.testingOnlyPassDone(t.reason, now, rep)
	}
	t.rep = rep
	close(t.done)
	return true
}

// want asks for a pass over agent's subscriptions ("": everyone's) once and returns the ticket it will answer; m.mu is held.
func (m *maintainer) want(agent, reason string) *passTicket {
	m.asked[agent] = cmp.Or(m.asked[agent], &passTicket{reason: reason, done: make(chan struct{})})
	return m.asked[agent]
}

// arm replaces the due timer with one for due (none when zero); a replaced or stopped one firing does nothing. m.mu is held.
func (m *maintainer) arm(due, now time.Time) {
	if m.timer != nil {
		m.timer.Stop()
	}
	m.timer, m.timerAt = nil, due
	if !due.IsZero() {
		var t ledgerStopper
		t = m.afterFunc(due.Sub(now), func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.timer == t { // fired: the loop's next turn runs a pass
				m.timerAt = time.Time{}
				nudge(m.o.ledger.changed)
			}
		})
		m.timer = t
	}
}

// request asks for a pass over agent's subscriptions after its refusal for want of a signed-in subscription, dropped when one
// covering agent started since the last change (SPEC §11.2, §17).
func (m *maintainer) request(reason, agent string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fresh[""] || m.fresh[agent] {
		m.dropped++
		m.o.log.Debug("maintenance_request_dropped", "reason", reason, "agent_id", agent)
		return
	}
	m.want(agent, reason)
	m.o.log.Info("maintenance_requested", "reason", reason, "agent_id", agent)
	nudge(m.o.ledger.changed)
}

// changed records an inventory or credential change (donation, sign-in, reinstate, replacement), so the next request counts again.
func (m *maintainer) changed() {
	m.mu.Lock()
	clear(m.fresh)
	m.mu.Unlock()
}

// passNow answers POST /v1/admin/maintain from the next pass over everyone started after it (not one predating a change).
func (m *maintainer) passNow(ctx context.Context) (passReport, error) {
	m.mu.Lock()
	if !m.looping {
		m.mu.Unlock()
		return passReport{}, errMaintenanceStopped
	}
	t := m.want("", "maintain")
	nudge(m.o.ledger.changed)
	m.mu.Unlock()
	select {
	case <-t.done:
		return t.rep, t.rep.err
	case <-ctx.Done():
		return passReport{}, ctx.Err()
	}
}

// metrics is the maintenance state as /metrics numbers (SPEC §13).
func (m *maintainer) metrics() map[string]float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	flag := func(b bool) float64 { return float64(boolCount(b)) }
	out := map[string]float64{"brama_maintenance_passes_total": float64(m.passes), "brama_maintenance_requests_dropped_total": float64(m.dropped),
		"brama_maintenance_running": flag(m.running), "brama_maintenance_pending": flag(len(m.asked) > 0)}
	for name, t := range map[string]time.Time{"next_due": m.timerAt, "last_pass_started": m.started, "last_pass_finished": m.ended} {
		if !t.IsZero() {
			out["brama_maintenance_"+name+"_timestamp_seconds"] = float64(t.UnixMilli()) / 1000
		}
	}
	if !m.ended.IsZero() {
		out["brama_maintenance_last_pass_ok"] = flag(m.lastOK)
	}
	return out
}

// passSub is one non-retired subscription of a pass and its outcomes, which the report counts at the end. reportable: active,
// its credential reads its provider's report; oauth: active, with a grant; tried: its one refresh attempt was made. Outcomes
// stay unset once ctx ended (skipped: neither).
type passSub struct {
	it                       overlayItem
	reportable, oauth, tried bool
	read, refreshed, refused bool   // refused: the attempt gave no grant (one a sign-in superseded failed nothing)
	failed                   string // why its due read failed, redacted
}

// passOnce runs one pass over agent's subscriptions ("": everyone's): the usage report pass, then the refresh pass (SPEC §11.2);
// per subscription at most one read and one refresh attempt, none retried; ctx alone ends it (§7.4).
func (m *maintainer) passOnce(ctx context.Context, agent string) (rep passReport) {
	start := m.o.now()
	m.o.vault.writeUnwritten(m.o.log)
	var subs []*passSub
	items, retired, err := m.inv.view() // none when err: the counts stay 0 and OK false
	for _, it := range items {
		if retired[it.ID] || agent != "" && it.AgentID != agent {
			continue
		}
		cred, credErr := m.inv.credential(it.ID) // an error fails its due read
		row, _ := lookupProvider(it.Provider)
		active := m.o.ledger.entry(it.ID).Credential.State == credActive
		subs = append(subs, &passSub{it: it, reportable: active && row.usage != "" && (credErr != nil || row.usageReadable(cred)),
			oauth: active && row.tokenURL != "" && credErr == nil && cred.OAuth != nil})
	}
	sideBySide(ctx, subs, func(s *passSub) string { return s.it.Provider }, m.readUsage) // one at a time per provider (SPEC §17)
	sideBySide(ctx, subs, func(s *passSub) string { return s.it.ID }, func(ctx context.Context, s *passSub) {
		if e := m.o.ledger.entry(s.it.ID); s.oauth && e.Credential.State == credActive { // else refused until a sign-in
			m.refresh(ctx, s, func(g oauthGrant) bool { return refreshDue(g, e.Credential.RefreshedAtMs, m.o.now()) })
		}
	})
	if err == nil && ctx.Err() != nil { // what it skipped is neither read nor failed: not ok
		err = fmt.Errorf("%w: the server is stopping, so this pass ended before its reads and refreshes", errMaintenanceStopped)
	}
	m.inv.invalidate() // the listing shows the pass at once (SPEC §10.2)
	rep.Usage.Failed = []usageFailure{}
	for _, s := range subs {
		rep.Usage.Subscriptions += boolCount(s.reportable)
		rep.Usage.Read += boolCount(s.read)
		if s.failed != "" {
			rep.Usage.Failed = append(rep.Usage.Failed, usageFailure{s.it.ID, s.it.Provider, s.failed})
		}
		rep.Credentials.Subscriptions += boolCount(s.oauth)
		rep.Credentials.Refreshed += boolCount(s.refreshed)
		rep.Credentials.Refused += boolCount(s.refused)
	}
	rep.OK = err == nil && len(rep.Usage.Failed) == 0 && rep.Credentials.Refused == 0
	if due := m.o.ledger.nextDue(m.o.now(), retired); !due.IsZero() {
		rep.NextDueAt = new(due.UTC().Format(time.RFC3339))
	}
	rep.err = err
	if err != nil {
		m.o.log.Warn("maintenance_pass_failed", "agent_id", agent, "cause", redact(err.Error()))
		return rep
	}
	m.o.log.Info("maintenance_pass_done", "agent_id", agent, "ok", rep.OK, "usage_read", rep.Usage.Read, "usage_failed", len(rep.Usage.Failed),
		"refreshed", rep.Credentials.Refreshed, "refused", rep.Credentials.Refused,
		"next_due_at", valueOr(rep.NextDueAt, ""), "dur_ms", m.o.now().Sub(start).Milliseconds())
	return rep
}

// sideBySide runs step on each subscription, one at a time per key, keys side by side, until all have ended (at ctx's end too).
func sideBySide(ctx context.Context, subs []*passSub, key func(*passSub) string, step func(context.Context, *passSub)) {
	groups := map[string][]*passSub{}
	for _, s := range subs {
		groups[key(s)] = append(groups[key(s)], s)
	}
	var wg sync.WaitGroup
	for _, ss := range groups {
		wg.Go(func() {
			for _, s := range ss {
				step(ctx, s)
			}
		})
	}
	wg.Wait()
}

// readUsage reads s's due report into the ledger (not once ctx ended), first refreshing a grant expired by the request
// path's rule: s's one attempt.
func (m *maintainer) readUsage(ctx context.Context, s *passSub) {
	id, provider := s.it.ID, s.it.Provider
	if !s.reportable || !usageDue(m.o.ledger.entry(id), m.o.now()) {
		return
	}
	cred, err := m.refresh(ctx, s, func(g oauthGrant) bool { return expiredForRequest(g, m.o.now()) })
	p, _ := lookupProvider(provider)
	g, ws := valueOr(cred.OAuth, oauthGrant{}), []planWindow(nil) // the grant (none for an API key); the windows read
	endpoint, uerr := p.usageEndpoint(m.o.getenv)
	if err = cmp.Or(err, uerr); err == nil { // the refresh's failure first, else the endpoint's
		h := http.Header{}
		setProviderHeaders(h, p, upstreamCredential{cred.APIKey, g.AccessToken, g.AccountID}, nil, false)
		h.Del("Content-Type") // a GET has no body
		status, body, cerr := callEndpoint(ctx, m.o.client, http.MethodGet, endpoint, nil, h)
		if cerr == nil && status/100 == 2 {
			ws, cerr = p.readUsage(body, m.o.now())
		} else if cerr != nil && status != 0 {
			cerr = fmt.Errorf("the body ended early: %w", cerr)
		}
		if cerr != nil || status/100 != 2 {
			err = &endpointError{Op: "usage report GET", Endpoint: endpoint, Status: status, Received: len(body), Err: cerr}
		}
	}
	switch {
	case ctx.Err() != nil:
	case err != nil:
		s.failed = ledgerSentence(redact(err.Error(), cred.APIKey, g.AccessToken, g.RefreshToken, g.IDToken))
		m.o.ledger.recordCheck(id, provider, false, false, s.failed)
		m.o.log.Warn("usage_read_failed", "subscription_id", id, "provider", provider, "error", s.failed)
	default:
		s.read = true
		m.o.ledger.recordWindows(id, provider, ws)
		m.o.ledger.recordCheck(id, provider, false, true, fmt.Sprintf("%d window(s) read", len(ws)))
		m.o.log.Info("usage_read_ok", "subscription_id", id, "provider", provider, "windows", len(ws))
	}
}

// refresh reads s's credential after s's one refresh attempt of the pass, made when due finds its grant due (a failure errs).
func (m *maintainer) refresh(ctx context.Context, s *passSub, due func(oauthGrant) bool) (vaultCredential, error) {
	cred, err := m.inv.credential(s.it.ID)
	if err != nil || cred.OAuth == nil || s.tried || !due(*cred.OAuth) {
		return cred, err
	}
	s.tried = true
	_, err = m.o.refresh(ctx, s.it.ID, s.it.Provider, "")
	if ctx.Err() == nil {
		s.refreshed, s.refused = err == nil, err != nil && !errors.Is(err, errRefreshSuperseded)
	}
	if err != nil && !errors.Is(err, errRefreshSuperseded) { // else its grant, or a sign-in's (SPEC §11.1)
		return cred, fmt.Errorf("not read: the expired grant could not be refreshed: %w", err)
	}
	return m.inv.credential(s.it.ID)
}

// probe runs one completion probe on the live subscription it with model ("": the built-in one), as a request would meet
// it (SPEC §11.3); 409 before any call when blocked or model-less. Its answer: the probe and the row after it.
func (e *engine) probe(ctx context.Context, it overlayItem, model string) (any, error) {
	if until := e.ledger.blockedUntil(it.ID); !until.IsZero() {
		return nil, refuse("state_conflict", "subscription %s is blocked until %s; a probe is not sent inside a recorded block",
			it.ID, until.UTC().Format(time.RFC3339))
	}
	p, _ := lookupProvider(it.Provider)
	if model = cmp.Or(model, p.probe); model == "" {
		return nil, refuse("state_conflict", "name a model for this probe: provider %q has no built-in probe model", it.Provider)
	}
	res, err := resolveModel(it.Provider+"/"+model, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	res.Mode = modeSubscription // paid by the probed subscription, whatever its provider
	u, ae := e.ping(ctx, call{res: res}, []overlayItem{it})
	log, outcome, detail := e.log.Info, "ok", fmt.Sprintf("%s answered (%d output tokens)", res.Route, u.OutputTokens)
	if ae != nil && e.t.attempts == 0 && len(e.reasons) == 0 { // refused before any call, as a probe's own refusal
		ae.Attempts = nil
		return nil, ae
	} else if ae != nil { // the provider refused, its answer could not be read, or the grant could not be refreshed
		log, outcome, detail = e.log.Warn, "failed", ae.Message
	}
	e.ledger.recordCheck(it.ID, res.Provider.id, true, ae == nil, detail) // the listing shows it at once (SPEC §10.2)
	log("usage_probe_"+outcome, "request_id", e.t.requestID,
		"subscription_id", it.ID, "agent_id", e.agent, "provider", it.Provider, "route", res.Route, "detail", ledgerSentence(detail))
	row := e.inv.row(it, false, e.now())
	return map[string]any{"ok": true, "probe": cmp.Or(row.Probe, &ledgerCheck{}), "subscription": row}, nil
}

// ping makes the probe's and onboarding's one completion on c (SPEC §11.3: 16 output tokens), paid by pool when given;
// codex's encoder drops the output limit (§6.2).
func (e *engine) ping(ctx context.Context, c call, pool []overlayItem) (u usage, ae *apiError) {
	req := chatRequest{Model: c.res.Route, MaxTokens: 16, Messages: []message{{Role: "user", Parts: []part{{Type: partText, Text: "ping"}}}}}
	ae = e.attemptRoute(ctx, &job{budget: budgets.oneCall, pool: pool,
		build: func(ctx context.Context, c call, _ *callerRequest) (*http.Request, error) {
			return buildUpstreamRequest(ctx, c, &req)
		},
		commit: func(_ context.Context, c call, _ *callerRequest, resp *http.Response) (usage, *apiError, bool) {
			u, ae = relayBuffered(nil, c, resp, e.t.attempts, &callerStream{frames: formatOf(dialectChat).frames, req: req})
			return u, ae, false // an in-band limit blocks, as a request's
		}}, c, nil, nil)
	return u, ae
}
