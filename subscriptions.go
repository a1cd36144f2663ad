package main

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The subscription inventory (SPEC §10.1): the donated-subscription overlay
// says which subscriptions exist and who owns them, the vault holds their
// credentials under the same ids, and the journal alone says which are
// retired. The serving process is the only writer of the overlay and of the
// vault's subscriptions section (SPEC §2.3); every CLI goes through the
// admin API.

// inventory is the subscription inventory of one serving process. It reads
// the overlay whenever the file's identity changes and writes it (and the
// vault's subscriptions section) under wmu, since this process is the only
// writer (SPEC §2.3).
type inventory struct {
	path    string // the overlay file
	pathErr error  // why there is no overlay (no state directory), else nil
	vault   *vault
	j       *journal
	l       *ledger
	log     *slog.Logger
	now     func() time.Time
	ttl     time.Duration // listing cache lifetime; 0 disables the cache

	wmu sync.Mutex // serializes donate, retire, reinstate and replaceCredential

	mu    sync.Mutex // guards doc, id, cache, gen
	doc   *overlayDoc
	id    fileIdentity
	cache map[string]listing // by agent id
	gen   uint64             // bumped by every invalidation, so a listing computed across one is not kept
}

// listing is one agent's cached rows and when they were computed.
type listing struct {
	rows []subscriptionRow
	at   time.Time
}

// newInventory places the overlay in st and reads the listing cache's TTL
// from BRAMA_SUBSCRIPTION_CACHE_TTL_SECS (SPEC §10.2). Nothing is read yet.
func newInventory(st state, v *vault, j *journal, l *ledger, getenv func(string) string, log *slog.Logger, now func() time.Time) *inventory {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	inv := &inventory{vault: v, j: j, l: l, log: log, now: now, cache: map[string]listing{}}
	inv.path, inv.pathErr = st.path(overlayRole, overlayFile)
	ttl, err := subscriptionCacheTTL(getenv("BRAMA_SUBSCRIPTION_CACHE_TTL_SECS"))
	if err != nil {
		log.Warn("subscription_cache_ttl_invalid", "cause", err.Error(), "using_secs", 60)
	}
	inv.ttl = ttl
	return inv
}

// subscriptionCacheTTL parses BRAMA_SUBSCRIPTION_CACHE_TTL_SECS: unset is
// 60 s, 0 turns the cache off; anything else unreadable is 60 s and an error.
func subscriptionCacheTTL(v string) (time.Duration, error) {
	const def = 60 * time.Second
	v = strings.TrimSpace(v)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 {
		return def, fmt.Errorf("BRAMA_SUBSCRIPTION_CACHE_TTL_SECS=%q is not a whole number of seconds ≥ 0", v)
	}
	return time.Duration(n) * time.Second, nil
}

// load returns the current overlay, re-reading only when the file changed.
// An absent file is an empty overlay. Errors are classified for the client:
// 503 dependency_unavailable naming the cause.
func (inv *inventory) load() (*overlayDoc, error) {
	if inv.pathErr != nil {
		return nil, asAPIError(inv.pathErr)
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	id, err := guardFile(overlayRole, inv.path)
	if errors.Is(err, errFileAbsent) {
		inv.doc, inv.id = &overlayDoc{SchemaVersion: 1, Items: []overlayItem{}}, fileIdentity{}
		return inv.doc, nil
	}
	if err == nil && inv.doc != nil && id == inv.id {
		return inv.doc, nil
	}
	var b []byte
	if err == nil {
		b, id, err = readGuarded(overlayRole, inv.path)
	}
	var doc *overlayDoc
	if err == nil {
		doc, err = parseOverlay(b)
	}
	if err != nil {
		inv.doc = nil
		return nil, refuse("dependency_unavailable", "%v", err).because(err) // err names the overlay and the rule
	}
	inv.doc, inv.id = doc, id
	return doc, nil
}

// items returns every overlay item (retired ones too), in overlay order.
// The caller owns the slice.
func (inv *inventory) items() ([]overlayItem, error) {
	doc, err := inv.load()
	if err != nil {
		return nil, err
	}
	return slices.Clone(doc.Items), nil
}

// retiredSet folds the journal (SPEC §9), classified for the client.
func (inv *inventory) retiredSet() (map[string]bool, error) {
	r, err := inv.j.retired()
	if err != nil {
		return nil, refuse("dependency_unavailable", "the journal cannot be read: %v", err).because(err)
	}
	return r, nil
}

// pool is the non-retired items of agent for provider, in overlay order:
// the candidates of SPEC §7.2. Retirement comes from the journal on every
// call, never from the listing cache (SPEC §2.3).
func (inv *inventory) pool(agent, provider string) ([]overlayItem, error) {
	return inv.live(func(it overlayItem) bool { return it.AgentID == agent && it.Provider == provider })
}

// agentItems is the non-retired items of agent, all providers, in overlay
// order (selectors and best, SPEC §7.3).
func (inv *inventory) agentItems(agent string) ([]overlayItem, error) {
	return inv.live(func(it overlayItem) bool { return it.AgentID == agent })
}

// live filters the overlay to non-retired items that keep says to keep.
func (inv *inventory) live(keep func(overlayItem) bool) ([]overlayItem, error) {
	items, err := inv.items()
	if err != nil {
		return nil, err
	}
	retired, err := inv.retiredSet()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(items, func(it overlayItem) bool { return retired[it.ID] || !keep(it) }), nil
}

// get finds id among agent's items, retired or not. Another agent's id is
// reported as absent: an agent learns nothing about others' subscriptions.
func (inv *inventory) get(agent, id string) (overlayItem, bool, error) {
	items, err := inv.items()
	if err != nil {
		return overlayItem{}, false, err
	}
	i := slices.IndexFunc(items, func(it overlayItem) bool { return it.ID == id && it.AgentID == agent })
	if i < 0 {
		return overlayItem{}, false, nil
	}
	return items[i], true, nil
}

// isRetired reports whether the journal's last word on id is retire.
func (inv *inventory) isRetired(id string) (bool, error) {
	r, err := inv.retiredSet()
	if err != nil {
		return false, err
	}
	return r[id], nil
}

// owned is get as a refusal: 404 not_found when agent has no such id.
func (inv *inventory) owned(agent, id string) (overlayItem, error) {
	it, ok, err := inv.get(agent, id)
	if err != nil {
		return overlayItem{}, err
	}
	if !ok {
		return overlayItem{}, refuse("not_found", "agent %q has no subscription %q", agent, id)
	}
	return it, nil
}

// donate stores a new subscription of provider for agent (SPEC §10.1). The
// vault is written first and the overlay second, so a failure in between
// leaves no overlay entry: the vault entry is then unused (orphans reports
// it) rather than a listed subscription without a credential.
func (inv *inventory) donate(agent, provider, label string, cred vaultCredential) (overlayItem, error) {
	if !idPattern.MatchString(agent) {
		return overlayItem{}, refuse("invalid_request", "agent id %q must match [a-z0-9-]{1,64}", agent)
	}
	if err := checkLabel(label); err != nil {
		return overlayItem{}, refuse("invalid_request", "%v", err)
	}
	if err := checkCredential(provider, cred); err != nil {
		return overlayItem{}, err
	}
	cred = filledCredential(provider, cred)
	// Both files must be placeable before either is touched.
	if inv.pathErr != nil {
		return overlayItem{}, asAPIError(inv.pathErr)
	}
	if err := inv.vaultUsable(); err != nil {
		return overlayItem{}, err
	}
	inv.wmu.Lock()
	defer inv.wmu.Unlock()
	doc, err := inv.load()
	if err != nil {
		return overlayItem{}, err
	}
	it := overlayItem{ID: newSubscriptionID(), Provider: provider, AgentID: agent, Label: label,
		CreatedAt: inv.now().UTC().Format(journalTimeFormat)}
	if slices.ContainsFunc(doc.Items, func(x overlayItem) bool { return x.ID == it.ID }) {
		return overlayItem{}, refuse("internal_error", "subscription id %s is taken; donate again", it.ID)
	}
	err = inv.vault.update(func(d *vaultDoc) error {
		if _, taken := d.Subscriptions[it.ID]; taken {
			return fmt.Errorf("subscription id %s is taken in the vault; donate again", it.ID)
		}
		d.Subscriptions[it.ID] = cred
		return nil
	})
	if err != nil {
		return overlayItem{}, refuse("internal_error", "subscription not donated: the vault was not written: %v", err).because(err)
	}
	next := &overlayDoc{SchemaVersion: 1, Items: append(slices.Clone(doc.Items), it)}
	if err := inv.writeOverlay(next); err != nil {
		// The secret is stored but no subscription names it: take it back, so
		// the vault never keeps a secret without a subscription.
		note := "its credential was removed from the vault"
		if verr := inv.vault.update(func(d *vaultDoc) error {
			delete(d.Subscriptions, it.ID)
			return nil
		}); verr != nil {
			note = "its credential stays in the vault until serve next starts: " + verr.Error()
		}
		inv.log.Error("subscription_overlay_write_failed", "subscription_id", it.ID, "agent_id", agent, "cause", err.Error(), "note", note)
		return overlayItem{}, refuse("internal_error", "subscription not donated: the overlay was not written: %v", err).because(err)
	}
	if cred.OAuth != nil {
		inv.l.setGrantTimes(it.ID, provider, cred.OAuth.ExpiresAtMs, 0)
	}
	inv.log.Info("subscription_donated", "subscription_id", it.ID, "provider", provider, "agent_id", agent)
	return it, nil
}

// vaultUsable refuses before a vault write that could not succeed: no vault
// at all (SPEC §2.1) or one that cannot be read.
func (inv *inventory) vaultUsable() error {
	if _, err := inv.vault.load(); err != nil {
		return vaultRefusal(err)
	}
	return nil
}

// vaultRefusal classifies a vault load failure before a vault write: 503
// dependency_unavailable naming the cause (no state directory, or the file
// failing its guards or parse).
func vaultRefusal(err error) *apiError {
	var ns *noStateError
	if errors.As(err, &ns) {
		return asAPIError(err)
	}
	return refuse("dependency_unavailable", "the vault is unreadable: %v", err).because(err)
}

// writeOverlay replaces the overlay with doc and forgets the cached copy and
// every listing. Callers hold wmu.
func (inv *inventory) writeOverlay(doc *overlayDoc) error {
	b, err := marshalState(doc)
	if err != nil {
		return err
	}
	err = writeFileAtomic(inv.path, b)
	inv.invalidate(err == nil)
	return err
}

// invalidate drops every cached listing (SPEC §10.2: every local mutation
// invalidates at once) and, when overlayChanged, the parsed overlay.
func (inv *inventory) invalidate(overlayChanged bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if overlayChanged {
		inv.doc = nil
	}
	clear(inv.cache)
	inv.gen++
}

// retire journals the retirement of agent's subscription id (SPEC §9). It
// asks the journal first, so nothing is claimed that cannot be recorded; a
// subscription already retired is answered as done without a second line.
func (inv *inventory) retire(agent, id, reason string) error {
	return inv.journalStatus("retire", agent, id, reason)
}

// reinstate journals the end of a retirement; the reason is required.
func (inv *inventory) reinstate(agent, id, reason string) error {
	return inv.journalStatus("reinstate", agent, id, reason)
}

// journalStatus appends kind ("retire" or "reinstate") for id unless the
// journal's fold already says so.
func (inv *inventory) journalStatus(kind, agent, id, reason string) error {
	if err := checkReason(reason); err != nil {
		return err
	}
	if err := inv.j.ready(); err != nil {
		return refuse("dependency_unavailable", "subscription not changed: the journal cannot record a %s: %v", kind, err).because(err)
	}
	inv.wmu.Lock()
	defer inv.wmu.Unlock()
	if _, err := inv.owned(agent, id); err != nil {
		return err
	}
	retired, err := inv.isRetired(id)
	if err != nil {
		return err
	}
	if retired == (kind == "retire") {
		return nil
	}
	defer inv.invalidate(false)
	if err := inv.j.append(journalRecord{Kind: kind, SubscriptionID: id, Reason: reason}); err != nil {
		return refuse("dependency_unavailable", "subscription not changed: the journal refused the %s: %v", kind, err).because(err)
	}
	inv.log.Info("subscription_"+kind, "subscription_id", id, "agent_id", agent)
	return nil
}

// replaceCredential swaps the vault credential of agent's subscription id
// (PUT …/credential, sign-in) and marks the ledger credential active with the
// grant's expiry. The caller journals subscription_sign_in.
func (inv *inventory) replaceCredential(agent, id string, cred vaultCredential) error {
	if err := inv.vaultUsable(); err != nil {
		return err
	}
	inv.wmu.Lock()
	defer inv.wmu.Unlock()
	it, err := inv.owned(agent, id)
	if err != nil {
		return err
	}
	if err := checkCredential(it.Provider, cred); err != nil {
		return err
	}
	cred = filledCredential(it.Provider, cred)
	defer inv.invalidate(false)
	err = inv.vault.update(func(d *vaultDoc) error {
		d.Subscriptions[id] = cred
		return nil
	})
	if err != nil {
		return refuse("internal_error", "credential not replaced: the vault was not written: %v", err).because(err)
	}
	inv.l.setCredential(id, it.Provider, credActive, "")
	var exp int64
	if cred.OAuth != nil {
		exp = cred.OAuth.ExpiresAtMs
	}
	inv.l.setGrantTimes(id, it.Provider, exp, 0)
	return nil
}

// filledCredential completes a grant handed to Brama (fillGrant: expiry and
// codex account from the tokens' claims) on a copy; an API key is as given.
func filledCredential(provider string, cred vaultCredential) vaultCredential {
	if cred.OAuth != nil {
		g := fillGrant(provider, *cred.OAuth)
		cred.OAuth = &g
	}
	return cred
}

// credential is id's credential from the vault. An unreadable vault or a
// missing entry is 503 credential_unauthorized (SPEC §2.2).
func (inv *inventory) credential(id string) (vaultCredential, error) {
	doc, err := inv.vault.load()
	if err != nil {
		return vaultCredential{}, refuse("credential_unauthorized", "the vault is unreadable: %v", err).because(err)
	}
	c, ok := doc.Subscriptions[id]
	if !ok || (c.APIKey == "" && c.OAuth == nil) {
		return vaultCredential{}, refuse("credential_unauthorized", "the vault holds no credential for subscription %q", id)
	}
	if c.OAuth != nil {
		g := *c.OAuth // the caller may patch its copy; the vault's stays as read
		c.OAuth = &g
	}
	return c, nil
}

// list is agent's rows (SPEC §10.4), retired ones included, in overlay
// order. Rows are cached per agent for the TTL on the injected clock;
// eligibility never reads this cache (it calls pool).
func (inv *inventory) list(agent string) ([]subscriptionRow, error) {
	now := inv.now()
	inv.mu.Lock()
	c, hit := inv.cache[agent]
	gen := inv.gen
	inv.mu.Unlock()
	if age := now.Sub(c.at); hit && age >= 0 && age < inv.ttl {
		return slices.Clone(c.rows), nil
	}
	items, err := inv.items()
	if err != nil {
		return nil, err
	}
	retired, err := inv.retiredSet()
	if err != nil {
		return nil, err
	}
	rows := []subscriptionRow{}
	for _, it := range items {
		if it.AgentID == agent {
			rows = append(rows, inv.l.row(it, retired[it.ID], now))
		}
	}
	inv.mu.Lock()
	if inv.gen == gen && inv.ttl > 0 {
		inv.cache[agent] = listing{rows: rows, at: now}
	}
	inv.mu.Unlock()
	return slices.Clone(rows), nil
}

// orphans lists vault subscription ids with no overlay item, sorted: left
// by a donation that failed between its two writes (SPEC §10.1), for
// /readyz.
func (inv *inventory) orphans() ([]string, error) {
	items, err := inv.items()
	if err != nil {
		return nil, err
	}
	doc, err := inv.vault.load()
	if err != nil {
		return nil, err
	}
	var out []string
	for id := range doc.Subscriptions {
		if !slices.ContainsFunc(items, func(it overlayItem) bool { return it.ID == id }) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// removeOrphans deletes the vault's subscription credentials that no overlay
// item names: left by a donation that crashed between its two writes. serve
// calls it at start, so the vault holds no secret without a subscription
// (SPEC §10.1 only asks /readyz to report them; issue 10 asks that they go).
// Nothing is removed unless the overlay and the vault both read cleanly.
func (inv *inventory) removeOrphans() ([]string, error) {
	if inv.pathErr != nil || inv.vault.pathErr != nil {
		return nil, nil
	}
	inv.wmu.Lock()
	defer inv.wmu.Unlock()
	orphans, err := inv.orphans()
	if err != nil || len(orphans) == 0 {
		return nil, err
	}
	err = inv.vault.update(func(d *vaultDoc) error {
		for _, id := range orphans {
			delete(d.Subscriptions, id)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return orphans, nil
}

// readiness is the inventory's part of /readyz (SPEC §13): an unreadable
// overlay is a reason; orphan vault entries and credentials needing
// reauthorization are warnings; payer says a non-retired subscription has an
// active credential. Without a state directory it says nothing (the
// server already warns about that).
func (inv *inventory) readiness() (reasons, warnings []string, payer bool) {
	items, err := inv.items()
	if err != nil {
		if inv.pathErr == nil {
			reasons = append(reasons, asAPIError(err).Message) // names the overlay and the rule
		}
		return reasons, nil, false
	}
	if orphans, err := inv.orphans(); err == nil && len(orphans) > 0 {
		warnings = append(warnings, fmt.Sprintf("the vault holds %d subscription credential(s) with no overlay entry, unused: %s", len(orphans), strings.Join(orphans, ", ")))
	}
	retired, err := inv.j.retired()
	if err != nil {
		return reasons, warnings, false // the journal's own trouble is reported by the server
	}
	reauth := 0
	for _, it := range items {
		switch {
		case retired[it.ID]:
		case inv.l.credentialState(it.ID) == credActive:
			payer = true
		default:
			reauth++
		}
	}
	if reauth > 0 {
		warnings = append(warnings, fmt.Sprintf("%d subscription(s) need reauthorization (brama subscription sign-in)", reauth))
	}
	return reasons, warnings, payer
}
