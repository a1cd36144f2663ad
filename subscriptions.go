package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// The subscription inventory (SPEC §10.1): the overlay says which exist and whose, the vault holds their credentials.

// idPattern is the rule for client and agent ids.
var idPattern = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// overlayItem is one donated subscription: metadata only, no secret, no status.
type overlayItem struct {
	ID        string `json:"id"`
	Provider  string `json:"provider"`
	AgentID   string `json:"agent_id"`
	Label     string `json:"label"`
	CreatedAt string `json:"created_at"`
}

// overlayDoc is donated-subscriptions.json (SPEC §2.2), schema 1.
type overlayDoc struct {
	SchemaVersion int           `json:"schema_version"`
	Items         []overlayItem `json:"items"`
}

const (
	overlayFile = "donated-subscriptions.json"
	overlayRole = "donated-subscription overlay"
	maxPoolSize = 64 // non-retired subscriptions of one agent and provider (SPEC §17)
)

// errOverlayInvalid wraps every refusal of parseOverlay: a bad file, not an I/O failure.
var errOverlayInvalid = errors.New("donated-subscription overlay is invalid")

// parseOverlay strictly parses the overlay and refuses what no writer produces; an empty file is an empty overlay.
func parseOverlay(b []byte) (*overlayDoc, error) {
	doc := &overlayDoc{SchemaVersion: 1, Items: []overlayItem{}}
	if err := decodeStrict(overlayFile, b, doc); len(b) > 0 && err != nil {
		return nil, fmt.Errorf("%w: %w", errOverlayInvalid, err)
	}
	if doc.SchemaVersion != 1 {
		return nil, fmt.Errorf("%w: schema_version %d is not 1", errOverlayInvalid, doc.SchemaVersion)
	}
	if doc.Items == nil {
		doc.Items = []overlayItem{}
	}
	seen := map[string]bool{}
	for i, it := range doc.Items { // the rules a donation enforces
		p, known := lookupProvider(it.Provider)
		_, timeErr := time.Parse(time.RFC3339Nano, it.CreatedAt)
		if err := firstBroken([]rule{
			{!isSubscriptionID(it.ID), fmt.Sprintf("id %q is not sub_ followed by 16 lower-case hex digits", it.ID)},
			{!known || p.cred == credNone, fmt.Sprintf("provider %q takes no subscription", it.Provider)},
			{!idPattern.MatchString(it.AgentID), fmt.Sprintf("agent_id %q must match [a-z0-9-]{1,64}", it.AgentID)},
			{checkLabel(it.Label) != nil, fmt.Sprint(checkLabel(it.Label))},
			{timeErr != nil, fmt.Sprintf("created_at %q is not an RFC 3339 time", it.CreatedAt)},
			{seen[it.ID], fmt.Sprintf("id %q appears twice", it.ID)}}); err != nil {
			return nil, fmt.Errorf("%w: items[%d]: %s", errOverlayInvalid, i, err)
		}
		seen[it.ID] = true
	}
	return doc, nil
}

// printable: valid UTF-8 of printable runes, so no control character reaches a terminal or a log line.
func printable(s string) bool {
	return utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
}

// checkText bounds a label or a retire or reinstate reason: printable, at most limit bytes.
func checkText(what, s string, limit int) error {
	if len(s) > limit {
		return fmt.Errorf("%s is %d bytes; the limit is %d", what, len(s), limit)
	} else if !printable(s) {
		return fmt.Errorf("%s must be printable UTF-8 text on one line", what)
	}
	return nil
}

func checkLabel(label string) error { return checkText("label", label, 128) }

func checkReason(reason string) error {
	if strings.TrimSpace(reason) == "" {
		return errors.New("a reason is required")
	}
	return checkText("the reason", reason, 512)
}

// checkCredential applies SPEC §6.1 and §10.1 to a credential, never quoting it, and completes its grant (on a copy).
func checkCredential(provider string, cred vaultCredential) (vaultCredential, error) {
	p, ok := lookupProvider(provider)
	k, g, isKey := cred.APIKey, cmp.Or(cred.OAuth, &oauthGrant{}), cred.APIKey != ""
	if err := firstBroken([]rule{
		{!ok, fmt.Sprintf("unknown provider %q", provider)},
		{p.cred == credNone, fmt.Sprintf("provider %q takes no subscription: its deployments need no credential", provider)},
		{isKey == (cred.OAuth != nil), "give exactly one of api_key or oauth"},
		{isKey && (strings.TrimSpace(k) != k || !printable(k) || len(k) > 8192), "api_key must be one line of printable text (at most 8192 bytes) without surrounding spaces"},
		{!isKey && p.cred != credSubscription, fmt.Sprintf("provider %q takes an api_key, not an oauth grant (oauth is for claude-code, codex and kimi)", provider)},
		{!isKey && (g.AccessToken == "" || g.RefreshToken == ""), "oauth needs access_token and refresh_token"},
		{!printable(g.AccessToken) || !printable(g.RefreshToken), "oauth access_token and refresh_token must be printable text (no newline or other control character)"},
		{g.ExpiresAtMs < 0, "oauth expires_at_ms must not be negative"}}); err != nil {
		return cred, refuse("invalid_request", "%s", err)
	}
	if !isKey {
		filled := fillGrant(provider, *g)
		cred.OAuth = &filled
	}
	return cred, nil
}

// inventory is the only writer of the overlay and the vault's subscriptions (SPEC §2.3), under wmu.
type inventory struct {
	sys
	overlay stateFile[*overlayDoc]
	vault   *vault
	j       *journal
	l       *ledger
	ttl     time.Duration      // listing cache lifetime; 0 disables the cache
	wmu     sync.Mutex         // serializes the inventory's writes
	mu      sync.Mutex         // guards cache
	cache   map[string]listing // by agent id
}

// listing is one agent's cached rows, when and from which ledger status (a block change shows at once).
type listing struct {
	rows   []subscriptionRow
	at     time.Time
	status uint64
}

// newInventory places the overlay in st and reads the listing cache's TTL (SPEC §10.2).
func newInventory(st state, v *vault, j *journal, l *ledger, getenv func(string) string, sy sys) *inventory {
	inv := &inventory{sys: sy, vault: v, j: j, l: l, cache: map[string]listing{}}
	inv.overlay = stateFile[*overlayDoc]{role: overlayRole, parse: parseOverlay}
	inv.overlay.path, inv.overlay.pathErr = st.path(overlayRole, overlayFile)
	var err error // unset or unreadable (logged) is 60 s; 0 turns the cache off
	if inv.ttl, err = envSeconds(getenv, "BRAMA_SUBSCRIPTION_CACHE_TTL_SECS", 0, 60*time.Second); err != nil {
		sy.log.Warn("subscription_cache_ttl_invalid", "cause", err.Error(), "using_secs", 60)
	}
	return inv
}

// unavailable is a state file's read failure as a 503; a missing state directory keeps its own cause.
func unavailable(format string, err error) *apiError {
	if errors.As(err, new(*noStateError)) {
		return asAPIError(err)
	}
	return refuse("dependency_unavailable", format, err).because(err)
}

// items returns every overlay item (retired ones too), in overlay order, as the caller's slice.
func (inv *inventory) items() ([]overlayItem, error) {
	doc, err := inv.overlay.load()
	if err != nil {
		return nil, unavailable("%v", err)
	}
	return slices.Clone(doc.Items), nil
}

// view is every overlay item and the journal's retired set (SPEC §9).
func (inv *inventory) view() ([]overlayItem, map[string]bool, error) {
	items, err := inv.items()
	if err != nil {
		return nil, nil, err
	}
	retired, err := inv.j.retired()
	if err != nil {
		return nil, nil, unavailable("the journal cannot be read: %v", err)
	}
	return items, retired, nil
}

// pool is agent's non-retired items of provider ("": all) from the journal, never the cache (SPEC §7.2, §2.3).
func (inv *inventory) pool(agent, provider string) ([]overlayItem, error) {
	items, retired, err := inv.view()
	return slices.DeleteFunc(items, func(it overlayItem) bool {
		return retired[it.ID] || it.AgentID != agent || (provider != "" && it.Provider != provider)
	}), err
}

// agentItems is agent's non-retired items, all providers (SPEC §7.3).
func (inv *inventory) agentItems(agent string) ([]overlayItem, error) { return inv.pool(agent, "") }

// owned is agent's subscription id, else 404; when ifRetired says why, a retired one is 409.
func (inv *inventory) owned(agent, id, ifRetired string) (overlayItem, error) {
	items, retired, err := inv.view()
	i := slices.IndexFunc(items, func(it overlayItem) bool { return it.ID == id && it.AgentID == agent })
	switch {
	case err != nil:
		return overlayItem{}, err
	case i < 0:
		return overlayItem{}, refuse("not_found", "agent %q has no subscription %q", agent, id)
	case ifRetired != "" && retired[id]:
		return items[i], refuse("state_conflict", "subscription %s is retired; %s", id, ifRetired)
	}
	return items[i], nil
}

// write runs one change of the overlay, the vault or the journal under wmu, given the vault read before
// any file is touched (unreadable: nothing is written), then drops the caches (SPEC §10.2).
func (inv *inventory) write(change func(*vaultDoc) error) error {
	inv.wmu.Lock()
	defer inv.wmu.Unlock()
	defer inv.invalidate(true)
	doc, err := inv.vault.load()
	if err != nil {
		return unavailable("the vault is unreadable: %v", err)
	}
	return change(doc)
}

// writeVault is one vault write of a change named by what; a failure is 500 naming it.
func (inv *inventory) writeVault(what string, change func(*vaultDoc)) error {
	if err := inv.vault.update(func(d *vaultDoc) error { change(d); return nil }); err != nil {
		return refuse("internal_error", "%s: the vault was not written: %v", what, err).because(err)
	}
	return nil
}

// donate stores a new subscription (SPEC §10.1) under a fresh id.
func (inv *inventory) donate(agent, provider, label string, cred vaultCredential) (overlayItem, error) {
	if err := firstBroken([]rule{{!idPattern.MatchString(agent), fmt.Sprintf("agent id %q must match [a-z0-9-]{1,64}", agent)},
		{checkLabel(label) != nil, fmt.Sprint(checkLabel(label))}}); err != nil {
		return overlayItem{}, refuse("invalid_request", "%s", err)
	}
	rnd := make([]byte, 8)
	rand.Read(rnd)
	it := overlayItem{ID: fmt.Sprintf("sub_%x", rnd), Provider: provider, AgentID: agent, Label: label,
		CreatedAt: inv.now().UTC().Format(journalTimeFormat)}
	return inv.store(agent, it.ID, &it, cred)
}

// replaceCredential swaps the credential of agent's non-retired id.
func (inv *inventory) replaceCredential(agent, id string, cred vaultCredential) (overlayItem, error) {
	return inv.store(agent, id, nil, cred)
}

// store is the one credential write (SPEC §10.1), every file read before either is touched. A donation (fresh,
// the new item) writes the vault, then the overlay, and takes the secret back if the overlay write fails: the
// vault never keeps a secret no subscription names. A replacement comes back with the item once it is known.
func (inv *inventory) store(agent, id string, fresh *overlayItem, cred vaultCredential) (it overlayItem, err error) {
	what := map[bool]string{false: "credential not replaced", true: "subscription not donated"}[fresh != nil]
	err = inv.write(func(doc *vaultDoc) error {
		items, retired, err := inv.view()
		if fresh != nil {
			it = *fresh
		} else if err == nil {
			it, err = inv.owned(agent, id, "reinstate it before replacing its credential")
		}
		if err != nil {
			return err
		}
		if cred, err = checkCredential(it.Provider, cred); err != nil {
			return err
		}
		pool := slices.DeleteFunc(slices.Clone(items), func(x overlayItem) bool {
			return retired[x.ID] || x.AgentID != agent || x.Provider != it.Provider
		})
		_, taken := doc.Subscriptions[id]
		switch lost := inv.overlayLost(doc); {
		case fresh == nil:
		case len(pool) >= maxPoolSize:
			return refuse("invalid_request", "agent %q holds %d non-retired %s subscriptions, the limit; retire one first",
				agent, len(pool), it.Provider)
		case taken || slices.ContainsFunc(items, func(x overlayItem) bool { return x.ID == id }):
			return refuse("internal_error", "subscription id %s is taken; donate again", id)
		case lost != nil:
			return lost
		}
		if err := grantHeld(doc, cred, id); err != nil {
			return err
		}
		if err := inv.writeVault(what, func(d *vaultDoc) { d.Subscriptions[id] = cred }); err != nil || fresh == nil {
			return err
		}
		if err = writeState(inv.overlay.path, &overlayDoc{SchemaVersion: 1, Items: append(items, it)}); err == nil {
			return nil
		}
		note := "its credential was removed from the vault"
		if verr := inv.vault.update(func(d *vaultDoc) error { delete(d.Subscriptions, id); return nil }); verr != nil {
			note = "its credential stays in the vault until brama subscription prune-orphans: " + verr.Error()
		}
		inv.log.Error("subscription_overlay_write_failed", "subscription_id", id, "agent_id", agent, "cause", err.Error(), "note", note)
		return refuse("internal_error", "%s: the overlay was not written: %v", what, err).because(err)
	})
	switch {
	case err != nil && fresh != nil:
		return overlayItem{}, err
	case err != nil:
		return it, err // signedIn journals a failed replacement of a known item
	case fresh != nil:
		inv.log.Info("subscription_donated", "subscription_id", id, "provider", it.Provider, "agent_id", agent)
	default:
		inv.l.setCredential(id, it.Provider, credActive, "")
	}
	if fresh == nil || cred.OAuth != nil {
		inv.l.setGrantTimes(id, it.Provider, cmp.Or(cred.OAuth, &oauthGrant{}).ExpiresAtMs, 0) // an API key: none
	}
	return it, nil
}

// grantHeld refuses cred when another subscription holds its refresh token: one would spend the other's.
func grantHeld(doc *vaultDoc, cred vaultCredential, except string) error {
	for id, c := range doc.Subscriptions {
		if cred.OAuth != nil && c.OAuth != nil && c.OAuth.RefreshToken == cred.OAuth.RefreshToken && id != except {
			return refuse("state_conflict", "this OAuth grant is already held by another subscription (a retired one keeps it too); sign in for a new grant")
		}
	}
	return nil
}

// invalidate drops every cached listing and, when overlayChanged, the parsed overlay.
func (inv *inventory) invalidate(overlayChanged bool) {
	if overlayChanged {
		inv.overlay.forget()
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	clear(inv.cache)
}

// retire and reinstate journal agent's id out of and back into service (SPEC §9), unless the fold already
// says so; nothing is claimed that cannot be recorded.
func (inv *inventory) retire(agent, id, why string) error {
	return inv.setRetired("retire", agent, id, why)
}
func (inv *inventory) reinstate(agent, id, why string) error {
	return inv.setRetired("reinstate", agent, id, why)
}

func (inv *inventory) setRetired(kind, agent, id, reason string) error {
	if err := checkReason(reason); err != nil {
		return refuse("invalid_request", "%v", err)
	}
	if err := inv.j.ready(); err != nil {
		return refuse("dependency_unavailable", "subscription not changed: the journal cannot record a %s: %v", kind, err).because(err)
	}
	inv.wmu.Lock()
	defer inv.wmu.Unlock()
	defer inv.invalidate(true)
	_, retired, err := inv.view()
	if _, oerr := inv.owned(agent, id, ""); oerr != nil || err != nil || retired[id] == (kind == "retire") {
		return cmp.Or(oerr, err)
	}
	if err := inv.j.append(journalRecord{Kind: kind, SubscriptionID: id, Reason: reason}); err != nil {
		return refuse("dependency_unavailable", "subscription not changed: the journal refused the %s: %v", kind, err).because(err)
	}
	inv.log.Info("subscription_"+kind, "subscription_id", id, "agent_id", agent)
	nudge(inv.l.changed) // its ledger moments count again, or no longer (SPEC §11.2)
	return nil
}

// credential is a copy of id's credential; an unreadable vault or none is 503 (SPEC §2.2).
func (inv *inventory) credential(id string) (vaultCredential, error) {
	doc, err := inv.vault.load()
	if err != nil {
		return vaultCredential{}, vaultUnreadable(err)
	}
	c, ok := doc.Subscriptions[id]
	if !ok || (c.APIKey == "" && c.OAuth == nil) {
		return vaultCredential{}, refuse("credential_unauthorized", "the vault holds no credential for subscription %q", id)
	}
	if c.OAuth != nil {
		g := *c.OAuth
		c.OAuth = &g
	}
	return c, nil
}

// subscriptionRow is one subscription in a listing (SPEC §10.4).
type subscriptionRow struct {
	ID         string            `json:"id"`
	Provider   string            `json:"provider"`
	Label      string            `json:"label"`
	Status     string            `json:"status"` // "active" or "retired"
	Windows    []planWindow      `json:"windows"`
	Block      *ledgerBlock      `json:"block"`
	Credential *ledgerCredential `json:"credential"`
	Measured   ledgerMeasured    `json:"measured"`
	UsageRead  *ledgerCheck      `json:"usage_read"`
	Probe      *ledgerCheck      `json:"probe"`
	Stale      bool              `json:"stale"`
}

// list is agent's rows (SPEC §10.4), retired ones included, cached per agent for the TTL.
func (inv *inventory) list(agent string) ([]subscriptionRow, error) {
	now := inv.now()
	inv.mu.Lock() // held while computing: an invalidation waits, so no listing outlives one
	defer inv.mu.Unlock()
	status := inv.l.statusVersion()
	if c, hit := inv.cache[agent]; hit && now.Sub(c.at) >= 0 && now.Sub(c.at) < inv.ttl && c.status == status {
		return slices.Clone(c.rows), nil
	}
	items, retired, err := inv.view()
	if err != nil {
		return nil, err
	}
	rows := []subscriptionRow{}
	for _, it := range items {
		if it.AgentID == agent {
			rows = append(rows, inv.row(it, retired[it.ID], now))
		}
	}
	if inv.ttl > 0 && len(rows) > 0 { // an unknown id an admin reads leaves no entry
		inv.cache[agent] = listing{rows: rows, at: now, status: status}
	}
	return slices.Clone(rows), nil
}

// row builds item's row from its ledger record (SPEC §10.4): null what is not in force or never happened.
func (inv *inventory) row(item overlayItem, retired bool, now time.Time) subscriptionRow {
	e, _ := inv.l.entry(item.ID)
	ms := now.UnixMilli()
	r := subscriptionRow{ID: item.ID, Provider: item.Provider, Label: item.Label, Status: "active",
		Windows: append([]planWindow{}, e.Windows...), Measured: e.Measured, Credential: &e.Credential}
	if retired {
		r.Status, r.Credential.State = "retired", credDisabled
	}
	if e.Block.UntilMs > ms {
		r.Block = &e.Block
	}
	if e.UsageRead.AtMs != 0 {
		r.UsageRead = &e.UsageRead
	}
	if e.Probe.AtMs != 0 {
		r.Probe = &e.Probe
	}
	r.Stale = (r.UsageRead != nil && !e.UsageRead.OK) ||
		slices.ContainsFunc(e.Windows, func(w planWindow) bool { return w.ResetsAtMs != 0 && w.ResetsAtMs <= ms })
	return r
}

// orphans lists, sorted, the vault's subscription ids no overlay item names.
func (inv *inventory) orphans() ([]string, error) {
	items, err := inv.items()
	doc, verr := inv.vault.load()
	if err = cmp.Or(err, verr); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(slices.Sorted(maps.Keys(doc.Subscriptions)), func(id string) bool {
		return slices.ContainsFunc(items, func(it overlayItem) bool { return it.ID == id })
	}), nil
}

// overlayLost refuses a write while the overlay is missing or empty (0 bytes: a restore cut short; Brama
// never writes one) but vault doc holds subscription credentials: every one would look orphaned (SPEC §17).
func (inv *inventory) overlayLost(doc *vaultDoc) error {
	if id, err := guardFile(overlayRole, inv.overlay.path); len(doc.Subscriptions) > 0 && (errors.Is(err, errFileAbsent) || err == nil && id.size == 0) {
		return refuse("dependency_unavailable", "the vault holds %d subscription credential(s) but %s is missing or empty: restore donated-subscriptions.json from a backup", len(doc.Subscriptions), overlayFile)
	}
	return nil
}

// pruneOrphans deletes the orphans from the vault (brama subscription prune-orphans, SPEC §17), never while the
// overlay is lost, nor from a vault outside the state directory: it may hold another one's subscriptions.
func (inv *inventory) pruneOrphans() (orphans []string, err error) {
	err = inv.write(func(doc *vaultDoc) (err error) {
		if orphans, err = inv.orphans(); err == nil {
			err = inv.overlayLost(doc)
		}
		if err == nil && filepath.Dir(inv.vault.path) != filepath.Dir(inv.overlay.path) {
			err = refuse("state_conflict", "BRAMA_VAULT_FILE lies outside the state directory and may hold another one's subscriptions: nothing removed")
		}
		if err != nil || len(orphans) == 0 {
			return err
		}
		return inv.writeVault("no orphan removed", func(d *vaultDoc) {
			for _, id := range orphans {
				delete(d.Subscriptions, id)
			}
		})
	})
	if err != nil || len(orphans) == 0 {
		return []string{}, err
	}
	inv.log.Info("vault_orphans_removed", "count", len(orphans), "subscription_ids", strings.Join(orphans, ","))
	return orphans, nil
}

// readiness is the inventory's part of /readyz (SPEC §13): an unreadable overlay is a reason, orphans and
// reauthorizations warnings; payer: some credential is active.
func (inv *inventory) readiness() (reasons, warnings []string, payer bool) {
	items, err := inv.items()
	if err != nil && inv.overlay.pathErr == nil {
		return []string{asAPIError(err).Message}, nil, false // names the overlay and the rule
	} else if err != nil {
		return nil, nil, false
	}
	if orphans, err := inv.orphans(); err == nil && len(orphans) > 0 {
		fix := "brama subscription prune-orphans removes them"
		if doc, err := inv.vault.load(); err == nil && inv.overlayLost(doc) != nil {
			fix = overlayFile + " is missing or empty: restore it from a backup (donations are refused until then)"
		}
		warnings = append(warnings, fmt.Sprintf("the vault holds %d subscription credential(s) with no overlay entry, unused: %s; %s", len(orphans), strings.Join(orphans, ", "), fix))
	}
	retired, err := inv.j.retired()
	if err != nil {
		return nil, warnings, false // the journal's own trouble is reported by the server
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
	return nil, warnings, payer
}

// signInVia is the query by which a sign-in's donation is journaled as a sign-in.
const signInVia = "sign-in"

// donateSignedIn and replaceSignedIn store a signed-in credential, a new subscription or agent's id's,
// through signedIn (SPEC §11.1).
func (inv *inventory) donateSignedIn(agent, provider, label string, cred vaultCredential, by string) (overlayItem, error) {
	return inv.signedIn("subscription not donated", "new subscription donated by sign-in from client "+by, by, func() (overlayItem, error) {
		return inv.donate(agent, provider, label, cred)
	})
}
func (inv *inventory) replaceSignedIn(agent, id string, cred vaultCredential, by string) (overlayItem, error) {
	kind := map[bool]string{false: "api key", true: "oauth grant"}[cred.OAuth != nil]
	return inv.signedIn("credential not replaced", kind+" replaced by client "+by, by, func() (overlayItem, error) {
		return inv.replaceCredential(agent, id, cred)
	})
}

// signedIn runs store and journals subscription_sign_in (logged at Warn unless signed in and journaled),
// refused first when the journal cannot record one; a known item whose store failed (5xx) is journaled failed.
func (inv *inventory) signedIn(what, done, by string, store func() (overlayItem, error)) (overlayItem, error) {
	if err := inv.j.ready(); err != nil {
		return overlayItem{}, refuse("dependency_unavailable", "%s: the journal cannot record a sign-in: %v", what, err).because(err)
	}
	it, err := store()
	result, detail := "signed_in", ledgerSentence(done)
	if ae := asAPIError(err); err != nil {
		if ae.Status() < 500 || it.ID == "" {
			return overlayItem{}, err
		}
		result, detail = "failed", ledgerSentence(fmt.Sprintf("%s (client %s): %s", what, by, ae.Message))
	}
	jerr := inv.j.append(journalRecord{Kind: "subscription_sign_in", SubscriptionID: it.ID, Provider: it.Provider, Result: result, Detail: detail})
	level, args := slog.LevelWarn, []any{"subscription_id", it.ID, "agent_id", it.AgentID, "provider", it.Provider, "result", result, "detail", detail}
	if jerr != nil {
		args = append(args, "journal_error", jerr.Error())
	} else if err == nil {
		level = slog.LevelInfo
	}
	inv.log.Log(context.Background(), level, "subscription_sign_in", args...)
	switch {
	case err != nil:
		return overlayItem{}, err
	case jerr != nil:
		return it, refuse("dependency_unavailable", "%s was stored, but the journal refused the sign-in record: %v", it.ID, jerr).because(jerr)
	}
	return it, nil
}
