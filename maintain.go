package main

import (
	"bytes"
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

var errMaintenanceStopped = errors.New("the maintenance scheduler is not running")

// maintainer runs one daemon's passes (SPEC §11.2: read the usage reports, then refresh the grants
// that fell due, never on a period of Brama's own) one at a time on loop's goroutine.
type maintainer struct {
	inv    *inventory
	l      *ledger
	o      *oauthClient
	client *http.Client // the provider client: no timeout, no redirects, no proxy
	getenv func(string) string
	log    *slog.Logger
	clock  func() time.Time

	// Test hooks (nil in production): the due timer's AfterFunc, and every finished pass.
	testingOnlyAfterFunc func(d time.Duration, f func()) ledgerStopper
	testingOnlyPassDone  func(reason string, started time.Time, rep passReport)

	mu      sync.Mutex        // guards the fields below
	looping bool              // loop runs, so passNow can be answered
	asked   map[string]string // agent ("": everyone) → reason of a pass over its subscriptions asked for, not yet started (SPEC §17)
	waiting *passTicket       // what passNow callers wait for: the next pass over everyone to start
	running bool              // a pass is running
	fresh   map[string]bool   // agents ("": everyone) a pass covered since the last inventory or credential change
	passes  int64             // passes started
	dropped int64             // requests dropped by the SPEC §11.2 rule
	lastOK  bool              // the last pass ended ok
	lastAt  [2]time.Time      // when the last pass started and ended; zero before the first ends
	timer   ledgerStopper     // the armed due timer; nil when none or it fired
	timerAt time.Time         // the moment it is armed for; zero none
}

// passTicket is one pass's answer for its waiters (rep.err the refusal), set before done closes.
type passTicket struct {
	done chan struct{}
	rep  passReport
}

// passReport is the body of POST /v1/admin/maintain (SPEC §11.2).
type passReport struct {
	OK    bool `json:"ok"`
	Usage struct {
		Subscriptions int            `json:"subscriptions"` // with a report their credential reads, due or not
		Read          int            `json:"read"`
		Failed        []usageFailure `json:"failed"`
	} `json:"usage"`
	Credentials credentialSummary `json:"credentials"`
	NextDueAt   *string           `json:"next_due_at"` // RFC 3339, or null when nothing is due

	err error // the pass could not list the subscriptions at all; never sent
}

type usageFailure struct { // one failed read, its error redacted
	SubscriptionID string `json:"subscription_id"`
	Provider       string `json:"provider"`
	Error          string `json:"error"`
}

type credentialSummary struct {
	Subscriptions int `json:"subscriptions"` // active OAuth ones
	Refreshed     int `json:"refreshed"`
	Refused       int `json:"refused"` // attempts that gave no grant (the credential_refresh_* line says why)
}

// newMaintainer builds the maintainer; nothing runs until run.
func newMaintainer(inv *inventory, l *ledger, o *oauthClient, client *http.Client, getenv func(string) string, log *slog.Logger, now func() time.Time) *maintainer {
	return &maintainer{inv: inv, l: l, o: o, client: client, getenv: getenv, log: log, clock: now, asked: map[string]string{}, fresh: map[string]bool{}}
}

// run starts loop, counted in wg, with the start pass pending (the listener is up).
func (m *maintainer) run(ctx context.Context, wg *sync.WaitGroup) {
	m.mu.Lock()
	m.looping = true
	m.asked[""] = cmp.Or(m.asked[""], "start")
	m.mu.Unlock()
	wg.Add(1)
	go func() { defer wg.Done(); m.loop(ctx) }()
}

// loop runs loopOnce until ctx ends, waiting between turns for a nudge of
// m.l.changed (a requested pass, the due timer or a ledger change).
func (m *maintainer) loop(ctx context.Context) {
	defer m.stop()
	for ctx.Err() == nil {
		if m.loopOnce(ctx, m.clock()) {
			continue // a pass asked for meanwhile runs next
		}
		select {
		case <-ctx.Done():
		case <-m.l.changed:
		}
	}
}

// loopOnce, at now, runs the pending pass (true): over everyone, else over
// one agent's subscriptions, or else arms the one timer at the ledger's next
// due moment (false); a moment passed before its timer fired is due now.
func (m *maintainer) loopOnce(ctx context.Context, now time.Time) bool {
	m.mu.Lock()                     // first: the journal read must not come between now and the pending check
	retired, _ := m.inv.j.retired() // unreadable: no moment is skipped
	due := m.l.nextDue(now, retired)
	if m.asked[""] == "" && m.timer != nil && !m.timerAt.After(now) {
		m.disarmLocked()
		m.asked[""] = "due"
	}
	agent, t := "", m.waiting
	for a := range m.asked {
		if agent = a; a == "" {
			break
		}
	}
	reason := m.asked[agent]
	if reason == "" {
		if m.timer == nil || !due.Equal(m.timerAt) {
			m.armLocked(due, now)
		}
		m.mu.Unlock()
		return false
	}
	if agent == "" {
		clear(m.asked) // a pass over everyone covers the agents' refusals
		m.waiting = nil
	} else {
		delete(m.asked, agent)
		t = nil
	}
	m.running, m.fresh[agent] = true, true
	m.passes++
	m.mu.Unlock()

	m.log.Info("maintenance_pass_started", "reason", reason, "agent_id", agent)
	rep := m.passOnce(ctx, agent)
	m.mu.Lock()
	m.running = false
	if missed := m.l.nextDue(now, retired); !missed.IsZero() && !missed.After(m.clock()) {
		m.asked[""] = cmp.Or(m.asked[""], "due") // it passed during the pass
	}
	m.lastOK, m.lastAt = rep.OK, [2]time.Time{now, m.clock()}
	m.mu.Unlock()
	if m.testingOnlyPassDone != nil {
		m.testingOnlyPassDone(reason, now, rep)
	}
	if t != nil {
		t.rep = rep
		close(t.done)
	}
	return true
}

// armLocked replaces the due timer with one for due (none when zero); a
// timer firing after it was replaced or stopped does nothing. m.mu is held.
func (m *maintainer) armLocked(due, now time.Time) {
	m.disarmLocked()
	if due.IsZero() {
		return
	}
	var t ledgerStopper
	t = afterFunc(m.testingOnlyAfterFunc, due.Sub(now), func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.timer == t { // fired: the next turn arms afresh
			m.timer, m.asked[""] = nil, cmp.Or(m.asked[""], "due")
			nudge(m.l.changed)
		}
	})
	m.timer, m.timerAt = t, due
}

func (m *maintainer) disarmLocked() {
	if m.timer != nil {
		m.timer.Stop()
	}
	m.timer, m.timerAt = nil, time.Time{}
}

// stop marks the loop gone, stops its timer and answers anyone waiting.
func (m *maintainer) stop() {
	m.mu.Lock()
	m.looping = false
	m.disarmLocked()
	t := m.waiting
	m.waiting = nil
	delete(m.asked, "")
	m.mu.Unlock()
	if t != nil {
		t.rep.err = errMaintenanceStopped
		close(t.done)
	}
}

// request asks for a pass over agent's subscriptions after its refusal for want of a signed-in
// subscription, dropped when one covering agent started since the last change (SPEC §11.2, §17). Nil-safe.
func (m *maintainer) request(reason, agent string) {
	if m == nil || agent == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fresh[""] || m.fresh[agent] {
		m.dropped++
		m.log.Debug("maintenance_request_dropped", "reason", reason, "agent_id", agent)
		return
	}
	m.asked[agent] = cmp.Or(m.asked[agent], reason)
	m.log.Info("maintenance_requested", "reason", reason, "agent_id", agent)
	nudge(m.l.changed)
}

// changed records an inventory or credential change (donation, sign-in, reinstate, replacement), so the next request counts again.
func (m *maintainer) changed() {
	if m != nil {
		m.mu.Lock()
		clear(m.fresh)
		m.mu.Unlock()
	}
}

// passNow answers POST /v1/admin/maintain from a pass that starts after the
// call (a running one may predate the change the operator wants seen).
func (m *maintainer) passNow(ctx context.Context) (passReport, error) {
	t, err := m.ask("maintain")
	if err != nil {
		return passReport{}, err
	}
	select {
	case <-t.done:
		return t.rep, t.rep.err
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
	defer nudge(m.l.changed)
	defer m.mu.Unlock()
	if !m.looping {
		return nil, errMaintenanceStopped
	}
	if m.waiting == nil {
		m.waiting = &passTicket{done: make(chan struct{})}
	}
	m.asked[""] = cmp.Or(m.asked[""], reason)
	return m.waiting, nil
}

// metrics is the maintenance state as /metrics numbers (SPEC §13). Nil-safe.
func (m *maintainer) metrics() map[string]float64 {
	if m == nil {
		return map[string]float64{"brama_maintenance_passes_total": 0}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	flag := map[bool]float64{true: 1}
	out := map[string]float64{"brama_maintenance_passes_total": float64(m.passes), "brama_maintenance_requests_dropped_total": float64(m.dropped),
		"brama_maintenance_running": flag[m.running], "brama_maintenance_pending": flag[len(m.asked) > 0]}
	for name, t := range map[string]time.Time{"next_due": m.timerAt, "last_pass_started": m.lastAt[0], "last_pass_finished": m.lastAt[1]} {
		if !t.IsZero() {
			out["brama_maintenance_"+name+"_timestamp_seconds"] = float64(t.UnixMilli()) / 1000
		}
	}
	if !m.lastAt[1].IsZero() {
		out["brama_maintenance_last_pass_ok"] = flag[m.lastOK]
	}
	return out
}

// pass is one pass's run: its subscriptions and the report its steps fill in.
type pass struct {
	m    *maintainer
	ctx  context.Context
	subs []*passSub
	mu   sync.Mutex // guards rep
	rep  passReport
}

// passSub is one non-retired subscription as a pass found it.
type passSub struct {
	it         overlayItem
	cred       vaultCredential
	credErr    error // the vault holds no usable credential for it
	entry      ledgerEntry
	reportable bool // active, of a provider whose report its credential reads
	oauth      bool // active, with a grant of an OAuth provider
	tried      bool // its one refresh attempt of the pass was made
}

// passOnce runs one pass over agent's subscriptions ("": everyone's): the
// usage report pass, then the refresh pass (SPEC §11.2); per subscription at
// most one read and one refresh attempt, none retried; ctx alone ends it (§7.4).
func (m *maintainer) passOnce(ctx context.Context, agent string) passReport {
	start := m.clock()
	m.o.vault.writeUnwritten(m.o.log)
	p := &pass{m: m, ctx: ctx}
	p.rep.Usage.Failed = []usageFailure{}
	items, retired, err := m.inv.view() // none when err: the counts stay 0 and OK false
	for _, it := range items {
		if !retired[it.ID] && (agent == "" || it.AgentID == agent) {
			s := &passSub{it: it}
			s.cred, s.credErr = m.inv.credential(it.ID)
			s.entry, _ = m.l.entry(it.ID)
			_, published := usageReports[it.Provider]
			row, _ := lookupProvider(it.Provider)
			active := s.entry.Credential.State == credActive
			s.reportable = active && published && (s.credErr != nil || usageReportable(it.Provider, s.cred))
			s.oauth = active && row.tokenURL != "" && s.credErr == nil && s.cred.OAuth != nil
			if s.reportable {
				p.rep.Usage.Subscriptions++
			}
			if s.oauth {
				p.rep.Credentials.Subscriptions++
			}
			p.subs = append(p.subs, s)
		}
	}
	// Reads run one at a time per provider, providers side by side (SPEC §17); refreshes side by side.
	p.sideBySide(func(s *passSub) string { return s.it.Provider }, p.readUsage)
	p.sideBySide(func(s *passSub) string { return s.it.ID }, p.refreshIfDue)
	if err == nil && ctx.Err() != nil { // what it skipped is neither read nor failed: not ok
		err = fmt.Errorf("%w: the server is stopping, so this pass ended before its reads and refreshes", errMaintenanceStopped)
	}
	m.inv.invalidate(false) // the listing shows the pass at once (SPEC §10.2)
	rep := p.rep
	rep.OK = err == nil && len(rep.Usage.Failed) == 0 && rep.Credentials.Refused == 0
	if due := m.l.nextDue(m.clock(), retired); !due.IsZero() {
		rep.NextDueAt = new(string)
		*rep.NextDueAt = due.UTC().Format(time.RFC3339)
	}
	if err != nil {
		rep.err = err
		m.log.Warn("maintenance_pass_failed", "cause", redact(err.Error()))
		return rep
	}
	m.log.Info("maintenance_pass_done", "agent_id", agent, "ok", rep.OK, "usage_read", rep.Usage.Read, "usage_failed", len(rep.Usage.Failed),
		"refreshed", rep.Credentials.Refreshed, "refused", rep.Credentials.Refused,
		"next_due_at", *cmp.Or(rep.NextDueAt, new(string)), "dur_ms", m.clock().Sub(start).Milliseconds())
	return rep
}

// sideBySide runs step on each subscription, one at a time per key, keys
// side by side, and returns when all have ended (each ends at ctx's end).
func (p *pass) sideBySide(key func(*passSub) string, step func(*passSub)) {
	groups := map[string][]*passSub{}
	for _, s := range p.subs {
		groups[key(s)] = append(groups[key(s)], s)
	}
	var wg sync.WaitGroup
	for _, ss := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, s := range ss {
				step(s)
			}
		}()
	}
	wg.Wait()
}

// count records an outcome in the report, none once ctx ended: what a stopped pass skipped is not counted.
func (p *pass) count(f func(*passReport)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() == nil {
		f(&p.rep)
	}
}

// readUsage reads s's due report into the ledger, nothing when ctx ended; a
// grant expired by the request path's rule is first refreshed: s's one attempt.
func (p *pass) readUsage(s *passSub) {
	m, id, provider := p.m, s.it.ID, s.it.Provider
	if !s.reportable || !usageDue(s.entry, m.clock()) {
		return
	}
	cred, err := s.cred, s.credErr
	if err == nil && cred.OAuth != nil && expiredForRequest(*cred.OAuth, m.clock()) {
		var g oauthGrant
		g, err = p.refresh(s)
		if errors.Is(err, errRefreshSuperseded) { // a sign-in replaced it meanwhile: read with that (SPEC §11.1)
			cred, err = m.inv.credential(id)
		} else if err != nil {
			err = fmt.Errorf("not read: the expired grant could not be refreshed: %w", err)
		} else {
			cred.OAuth = &g
		}
	}
	var ws []planWindow
	if err == nil {
		ws, err = m.fetchUsage(p.ctx, provider, cred)
	}
	switch {
	case p.ctx.Err() != nil:
	case err != nil:
		secrets := []string{cred.APIKey}
		if g := cred.OAuth; g != nil {
			secrets = append(secrets, g.AccessToken, g.RefreshToken, g.IDToken)
		}
		msg := ledgerSentence(redact(err.Error(), secrets...))
		m.l.recordUsageRead(id, provider, false, msg)
		m.log.Warn("usage_read_failed", "subscription_id", id, "provider", provider, "error", msg)
		p.count(func(r *passReport) { r.Usage.Failed = append(r.Usage.Failed, usageFailure{id, provider, msg}) })
	default:
		m.l.recordWindows(id, provider, ws)
		m.l.recordUsageRead(id, provider, true, strconv.Itoa(len(ws))+" window(s) read")
		m.log.Info("usage_read_ok", "subscription_id", id, "provider", provider, "windows", len(ws))
		p.count(func(r *passReport) { r.Usage.Read++ })
	}
}

// refreshIfDue makes s's one attempt when its grant is due, unless its read
// spent it; needs_reauthorization (set meanwhile too) waits for sign-in.
func (p *pass) refreshIfDue(s *passSub) {
	if !s.oauth || s.tried {
		return
	}
	e, _ := p.m.l.entry(s.it.ID)
	cur, err := p.m.inv.credential(s.it.ID) // the usage pass or a request may have refreshed it
	if e.Credential.State == credActive && err == nil && cur.OAuth != nil && refreshDue(*cur.OAuth, e.Credential.RefreshedAtMs, p.m.clock()) {
		p.refresh(s)
	}
}

// refresh is s's one refresh attempt of the pass; one a sign-in superseded failed nothing.
func (p *pass) refresh(s *passSub) (oauthGrant, error) {
	s.tried = true
	g, err := p.m.o.refresh(p.ctx, s.it.ID, s.it.Provider, "")
	p.count(func(r *passReport) {
		switch {
		case err == nil:
			r.Credentials.Refreshed++
		case !errors.Is(err, errRefreshSuperseded):
			r.Credentials.Refused++
		}
	})
	return g, err
}

// usageReport is one provider's report (SPEC §11.2): where it is read (below the base URL, or at
// codex's own address that env alone overrides), its reader, whether an API key reads it, whether
// the grant's account goes in chatgpt-account-id, the GET's headers.
type usageReport struct {
	path, url, env  string
	read            func(body []byte, now time.Time) ([]planWindow, error)
	apiKey, account bool
	headers         [][2]string
}

var usageReports = map[string]usageReport{
	"claude-code": {path: "/api/oauth/usage", read: reportReader(claudeCodeUsage),
		headers: [][2]string{{"anthropic-version", "2023-06-01"}, {"anthropic-beta", "oauth-2025-04-20"}}},
	"codex": {url: "https://chatgpt.com/backend-api/wham/usage", env: "BRAMA_PROVIDER_CODEX_USAGE_URL", read: reportReader(codexUsage), account: true,
		headers: [][2]string{{"OpenAI-Beta", "responses=experimental"}, {"originator", "codex_cli_rs"}}},
	"kimi": {path: "/usages", read: reportReader(kimiUsage), apiKey: true},
}

func usageReportable(provider string, cred vaultCredential) bool {
	r, ok := usageReports[provider]
	return ok && (cred.OAuth != nil || (r.apiKey && cred.APIKey != ""))
}

func (m *maintainer) usageEndpoint(provider string) (string, error) {
	r, ok := usageReports[provider]
	info, known := lookupProvider(provider)
	if !ok || !known {
		return "", fmt.Errorf("provider %q publishes no usage report", provider)
	}
	base, err := providerBaseURL(info, m.getenv)
	if r.url != "" {
		base = cmp.Or(strings.TrimSpace(m.getenv(r.env)), r.url)
		if err = checkBaseURL(base); err != nil {
			err = fmt.Errorf("%s: %w: %v", r.env, errBaseURL, err)
		}
	}
	if err != nil {
		return "", err
	}
	return base + r.path, nil
}

// fetchUsage GETs and reads provider's report; it sets the headers itself,
// as setProviderHeaders would add a Content-Type to this GET.
func (m *maintainer) fetchUsage(ctx context.Context, provider string, cred vaultCredential) ([]planWindow, error) {
	endpoint, err := m.usageEndpoint(provider)
	if err != nil {
		return nil, err
	}
	r := usageReports[provider]
	token, h := cred.APIKey, slices.Clone(r.headers)
	if g := cred.OAuth; g != nil {
		token = g.AccessToken
		if r.account && g.AccountID != "" {
			h = append(h, [2]string{"chatgpt-account-id", g.AccountID})
		}
	}
	status, body, err := callEndpoint(ctx, m.client, http.MethodGet, endpoint, nil, append(h, [2]string{"Authorization", "Bearer " + token})...)
	if err == nil && status/100 == 2 {
		var ws []planWindow
		if ws, err = r.read(body, m.clock()); err == nil {
			return ws, nil
		}
	} else if err != nil && status != 0 {
		err = fmt.Errorf("the body ended early: %w", err)
	}
	return nil, &endpointError{Op: "usage report GET", Endpoint: endpointName(endpoint), Status: status, Received: len(body), Err: err}
}

// errUsageReport classifies every refused report body: the readers take what
// they recognize of the providers' undocumented shapes, never a guessed number.
var errUsageReport = errors.New("the usage report is not usable")

// reportReader reads a report as T leniently (a member of another type than T says is absent;
// its number and instant members take any JSON value): a JSON object naming a window, else
// errUsageReport saying why without quoting the body.
func reportReader[T any](read func(T, time.Time) []planWindow) func([]byte, time.Time) ([]planWindow, error) {
	return func(body []byte, now time.Time) ([]planWindow, error) {
		var doc T
		err := json.Unmarshal(body, &doc)
		if errors.As(err, new(*json.UnmarshalTypeError)) {
			err = nil
		}
		if err != nil || !bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")) {
			return nil, fmt.Errorf("%w: the body is not a JSON object (%s)", errUsageReport, jsonErrorKind(err))
		}
		if ws := read(doc, now); len(ws) > 0 {
			return ws, nil
		}
		return nil, fmt.Errorf("%w: it names no plan window", errUsageReport)
	}
}

// claudeWindowKey is the shape of a member kept as a window id.
var claudeWindowKey = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)

// claudeCodeUsage reads {base}/api/oauth/usage: a member with "utilization" percent and "resets_at"
// is a window, anthropicWindows first under their traffic ids, then anthropic:<member> by name.
func claudeCodeUsage(r map[string]struct {
	Utilization number
	ResetsAt    instant `json:"resets_at"`
}, now time.Time) (ws []planWindow) {
	add := func(k, id, label string) {
		if m := r[k]; m.Utilization.ok && m.ResetsAt.set && claudeWindowKey.MatchString(k) {
			ws = append(ws, newWindow(id, label, m.Utilization.v/100, m.ResetsAt.ms, now, windowSourceReport))
		}
	}
	for _, w := range anthropicWindows {
		add(w.member, w.id, w.label)
		delete(r, w.member)
	}
	for _, k := range slices.Sorted(maps.Keys(r)) {
		add(k, "anthropic:"+k, strings.ReplaceAll(k, "_", " "))
	}
	return ws
}

// codexUsage reads rate_limit's primary_window and secondary_window (SPEC §11.2).
func codexUsage(r struct {
	RateLimit map[string]codexReading `json:"rate_limit"`
}, now time.Time) (ws []planWindow) {
	for _, which := range []string{"primary", "secondary"} {
		if w, ok := r.RateLimit[which+"_window"].window(which, now, windowSourceReport); ok {
			ws = append(ws, w)
		}
	}
	return ws
}

// jsonErrorKind says what was wrong with a JSON document without quoting a fragment of it.
func jsonErrorKind(err error) string {
	if se := (*json.SyntaxError)(nil); errors.As(err, &se) {
		return "syntax error at byte " + strconv.FormatInt(se.Offset, 10)
	}
	return "unexpected shape"
}
