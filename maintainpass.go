package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// One maintenance pass (SPEC §11.2): the usage report pass, then the
// credential refresh pass. The scheduler and the routes that ask for
// passes are in maintain.go; the report parsers and reads in usage.go.

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

// usageResult is one subscription's usage read in a pass.
type usageResult struct {
	read bool  // a read was due and attempted
	err  error // why it failed; nil when it succeeded
}

// passOnce runs one pass now and reports it. Each subscription gets at most
// one usage read and at most one refresh attempt, and nothing is retried:
// a failure waits for a later pass. Reads and refreshes of different
// subscriptions run side by side and the pass waits for all of them, so a
// subscription is never read or refreshed by two passes at once (passes
// never overlap). Brama sets these calls no time limit (SPEC §7.4): a
// provider that never answers holds the pass until it does or ctx ends.
func (m *maintainer) passOnce(ctx context.Context) passReport {
	start := m.clock()
	rep := passReport{Usage: usageSummary{Failed: []usageFailure{}}}
	subs, err := m.live()
	if err != nil {
		rep.err = err
		m.log.Warn("maintenance_pass_failed", "cause", redact(err.Error()))
		rep.NextDueAt = m.nextDue()
		return rep
	}
	refreshes := make([]grantAttempt, len(subs))
	m.usagePass(ctx, subs, refreshes, &rep)
	m.refreshPass(ctx, subs, refreshes, &rep)
	failedRefresh := false
	for _, r := range refreshes {
		switch r {
		case attemptRefreshed:
			rep.Credentials.Refreshed++
		case attemptFailed:
			rep.Credentials.Refused++
			failedRefresh = true
		}
	}
	rep.OK = len(rep.Usage.Failed) == 0 && !failedRefresh
	rep.NextDueAt = m.nextDue()
	m.log.Info("maintenance_pass_done", "ok", rep.OK, "usage_read", rep.Usage.Read, "usage_failed", len(rep.Usage.Failed),
		"refreshed", rep.Credentials.Refreshed, "refused", rep.Credentials.Refused,
		"next_due_at", deref(rep.NextDueAt), "dur_ms", m.clock().Sub(start).Milliseconds())
	return rep
}

// deref is *s, or "" for nil (for log lines).
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// nextDue is the ledger's next due moment as the report states it.
func (m *maintainer) nextDue() *string {
	due, ok := m.l.nextDue(m.clock())
	if !ok {
		return nil
	}
	return rfc3339OrNil(due)
}

// live lists the non-retired subscriptions (overlay, then the journal's
// retirements) with their credentials and ledger entries.
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
		if retired[it.ID] {
			continue
		}
		s := passSub{it: it}
		s.cred, s.credErr = m.inv.credential(it.ID)
		s.entry, _ = m.l.entry(it.ID)
		subs = append(subs, s)
	}
	return subs, nil
}

// usageReportable says whether provider publishes a usage report Brama can
// read with cred. claude-code's report (/api/oauth/usage) and codex's (the
// ChatGPT account's wham/usage) answer only the OAuth sign-in, so an API-key
// subscription of theirs has no report; Kimi Code's /usages answers the
// same bearer its chat route takes, an API key as well as a grant.
func usageReportable(provider string, cred vaultCredential) bool {
	switch provider {
	case "claude-code", "codex":
		return cred.OAuth != nil
	case "kimi":
		return cred.OAuth != nil || cred.APIKey != ""
	}
	return false
}

// usageProvider says whether provider publishes a usage report at all.
func usageProvider(provider string) bool {
	return provider == "claude-code" || provider == "codex" || provider == "kimi"
}

// usageDue applies SPEC §11.2's "read once when": no reading yet, a failed
// last read, a window whose reset has passed, or a reading naming no reset.
func usageDue(e ledgerEntry, now time.Time) bool {
	if e.UsageRead.AtMs == 0 || !e.UsageRead.OK || len(e.Windows) == 0 {
		return true
	}
	ms := now.UnixMilli()
	for _, w := range e.Windows {
		if w.ResetsAtMs == 0 || w.ResetsAtMs <= ms {
			return true
		}
	}
	return false
}

// usagePass reads the report of every due subscription with an active
// credential once, side by side, and records each outcome in the ledger.
func (m *maintainer) usagePass(ctx context.Context, subs []passSub, refreshes []grantAttempt, rep *passReport) {
	now := m.clock()
	results := make([]usageResult, len(subs))
	var wg sync.WaitGroup
	for i, s := range subs {
		if s.entry.Credential.State != credActive || !usageProvider(s.it.Provider) {
			continue
		}
		if s.credErr == nil && !usageReportable(s.it.Provider, s.cred) {
			continue
		}
		rep.Usage.Subscriptions++
		if !usageDue(s.entry, now) {
			continue
		}
		wg.Add(1)
		go func() { // exits when this one read (and a refresh before it) ends; ctx ends both
			defer wg.Done()
			results[i] = m.readOnce(ctx, s, &refreshes[i])
		}()
	}
	wg.Wait()
	for i, r := range results {
		switch {
		case !r.read:
		case r.err == nil:
			rep.Usage.Read++
		default:
			rep.Usage.Failed = append(rep.Usage.Failed, usageFailure{SubscriptionID: subs[i].it.ID,
				Provider: subs[i].it.Provider, Error: r.err.Error()})
		}
	}
}

// readOnce reads s's usage report and records the outcome: windows and an
// ok read, or a failed read that keeps the earlier windows. A grant expired
// by the request path's rule is refreshed first, as any call would (this is
// s's one refresh attempt of the pass); if that fails nothing is read.
// Nothing is recorded when ctx ended (the daemon is stopping; the provider
// said nothing).
func (m *maintainer) readOnce(ctx context.Context, s passSub, refreshed *grantAttempt) usageResult {
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
	if ctx.Err() != nil {
		return usageResult{}
	}
	if err != nil {
		msg := ledgerSentence(redact(err.Error(), presentedSecrets(cred)...))
		m.l.recordUsageRead(id, provider, false, msg)
		m.log.Warn("usage_read_failed", "subscription_id", id, "provider", provider, "error", msg)
		return usageResult{read: true, err: errors.New(msg)}
	}
	m.l.recordWindows(id, provider, ws)
	m.l.recordUsageRead(id, provider, true, strconv.Itoa(len(ws))+" window(s) read")
	m.log.Info("usage_read_ok", "subscription_id", id, "provider", provider, "windows", len(ws))
	return usageResult{read: true}
}

// presentedSecrets is every secret cred holds, for redaction.
func presentedSecrets(cred vaultCredential) []string {
	out := []string{cred.APIKey}
	if g := cred.OAuth; g != nil {
		out = append(out, g.AccessToken, g.RefreshToken, g.IDToken)
	}
	return out
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

// refreshDue applies SPEC §11.2's refresh rule to grant g of a subscription
// whose ledger says it was last refreshed at refreshedAtMs: expired
// (now ≥ expires_at_ms, not the request path's minute early), or expiry
// unknown and never refreshed by Brama.
func refreshDue(g oauthGrant, refreshedAtMs int64, now time.Time) bool {
	if g.ExpiresAtMs == 0 {
		return refreshedAtMs == 0
	}
	return now.UnixMilli() >= g.ExpiresAtMs
}

// refreshPass makes one refresh attempt for each non-retired OAuth
// subscription whose credential is active and whose grant is due, unless
// the usage pass already spent its attempt. needs_reauthorization
// credentials are left alone until a sign-in replaces them.
func (m *maintainer) refreshPass(ctx context.Context, subs []passSub, refreshes []grantAttempt, rep *passReport) {
	now := m.clock()
	var wg sync.WaitGroup
	for i, s := range subs {
		if s.credErr != nil || s.cred.OAuth == nil || s.entry.Credential.State != credActive {
			continue
		}
		if _, err := lookupOAuth(s.it.Provider); err != nil {
			continue
		}
		rep.Credentials.Subscriptions++
		if refreshes[i] != attemptNone || m.l.credentialState(s.it.ID) != credActive {
			continue
		}
		cur, err := m.inv.credential(s.it.ID) // the usage pass or a request may have refreshed it
		if err != nil || cur.OAuth == nil {
			continue
		}
		e, _ := m.l.entry(s.it.ID)
		if !refreshDue(*cur.OAuth, e.Credential.RefreshedAtMs, now) {
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
