package main

import (
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
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

const (
	overlayFile = "donated-subscriptions.json"
	maxPoolSize = 64        // non-retired subscriptions of one agent and provider (SPEC §17)
	signInVia   = "sign-in" // the query by which a donation is journaled as a sign-in (SPEC §11.1)
)

var idPattern = regexp.MustCompile(`^[a-z0-9-]{1,64}$`) // client and agent ids

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

// validate refuses what no donation writes: every item is held to a donation's rules.
func (d *overlayDoc) validate() error {
	d.Items = append([]overlayItem{}, d.Items...) // "items": null too is a list
	for i, it := range d.Items {
		if err := checkItem(it, d.Items[:i]); err != nil {
			return fmt.Errorf("items[%d]: %w", i, err)
		}
	}
	return nil
}

// checkItem is the rule table of an overlay item, the same for a donation and for the file, where it follows before.
func checkItem(it overlayItem, before []overlayItem) error {
	p, known := lookupProvider(it.Provider)
	_, timeErr := time.Parse(time.RFC3339Nano, it.CreatedAt)
	return firstBroken([]rule{
		{!isSubscriptionID(it.ID), fmt.Sprintf("id %q is not sub_ followed by 16 lower-case hex digits", it.ID)},
		{!known || p.cred == credNone, fmt.Sprintf("provider %q takes no subscription", it.Provider)},
		{!idPattern.MatchString(it.AgentID), fmt.Sprintf("agent_id %q must match [a-z0-9-]{1,64}", it.AgentID)},
		{len(it.Label) > 128 || !printable(it.Label), "label must be printable UTF-8 text on one line, at most 128 bytes"},
		{timeErr != nil, fmt.Sprintf("created_at %q is not an RFC 3339 time", it.CreatedAt)},
		{slices.ContainsFunc(before, func(o overlayItem) bool { return o.ID == it.ID }), fmt.Sprintf("id %q appears twice", it.ID)}})
}

// printable: valid UTF-8 of printable runes, so no control character reaches a terminal or a log line.
func printable(s string) bool {
	return utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
}

// checkCredential applies SPEC §6.1 and §10.1 to a credential of a provider that takes subscriptions, never quoting
// it, and completes its grant (on a copy).
func checkCredential(provider string, cred vaultCredential) (vaultCredential, error) {
	p, _ := lookupProvider(provider)
	k, g, isKey := cred.APIKey, valueOr(cred.OAuth, oauthGrant{}), cred.APIKey != "" // no oauth: g's tokens are ""
	if err := firstBroken([]rule{
		{isKey == (cred.OAuth != nil), "give exactly one of api_key or oauth"},
		{isKey && (strings.TrimSpace(k) != k || !printable(k) || len(k) > 8192), "api_key must be one line of printable text (at most 8192 bytes) without surrounding spaces"},
		{!isKey && p.cred != credSubscription, fmt.Sprintf("provider %q takes an api_key, not an oauth grant (oauth is for claude-code, codex and kimi)", provider)},
		{!isKey && (g.AccessToken == "" || g.RefreshToken == ""), "oauth needs access_token and refresh_token"},
		{!printable(g.AccessToken) || !printable(g.RefreshToken), "oauth tokens must be printable text (no newline or other control character)"},
		{g.ExpiresAtMs < 0, "oauth expires_at_ms must not be negative"}}); err != nil {
		return cred, refuse("invalid_request", "%s", err)
	} else if !isKey {
		cred.OAuth = new(fillGrant(provider, g))
	}
	return cred, nil
}

// inventory is the subscriptions (SPEC §10.1): the overlay says which exist and whose, the vault holds their
// credentials, the journal which are retired. It is the only writer of the overlay and of the vault's
// subscriptions (SPEC §2.3).
type inventory struct {
	sys
	overlay     stateFile[*overlayDoc]
	vault       *vault
	j           *journal
	l           *ledger
	ttl         time.Duration                // the listing cache's lifetime; 0 turns it off
	mu          sync.Mutex                   // serializes the inventory's writes and guards the cache
	cache       map[string][]subscriptionRow // agents' rows, made since cachedAt at ledger status cacheStatus
	cachedAt    time.Time
	cacheStatus uint64 // a block or a credential change shows at once
}

// newInventory places the overlay (parsed strictly) in st and reads the listing cache's TTL (SPEC §10.2).
func newInventory(st state, v *vault, j *journal, l *ledger, getenv func(string) string, sy sys) *inventory {
	ttl := envSeconds(getenv, "BRAMA_SUBSCRIPTION_CACHE_TTL_SECS", "subscription_cache_ttl_invalid", 0, 60, sy.log)
	inv := &inventory{sys: sy, vault: v, j: j, l: l, ttl: ttl, cache: map[string][]subscriptionRow{}}
	inv.overlay = stateFile[*overlayDoc]{role: "donated-subscription overlay", parse: func(b []byte) (*overlayDoc, error) {
		doc := &overlayDoc{SchemaVersion: 1, Items: []overlayItem{}} // an empty file is an empty overlay
		if err := decodeStrict(overlayFile, b, doc); len(b) > 0 && err != nil {
			return nil, fmt.Errorf("donated-subscription overlay is invalid: %w", err) // a bad file, not an I/O failure
		}
		return doc, nil
	}}
	inv.overlay.path, inv.overlay.pathErr = st.path(inv.overlay.role, overlayFile)
	return inv
}

// view is every overlay item (the caller's own slice, in overlay order) and the journal's retired set (SPEC §9).
func (inv *inventory) view() ([]overlayItem, map[string]bool, error) {
	doc, err := inv.overlay.load()
	fold, jerr := inv.j.folded()
	if err = unusable(cmp.Or(err, jerr)); err != nil { // each names its file
		return nil, nil, err
	}
	return slices.Clone(doc.Items), fold.retire, nil
}

// pool is agent's non-retired items of provider ("": all) from the journal, never the cache (SPEC §7.2, §2.3).
func (inv *inventory) pool(agent, provider string) ([]overlayItem, error) {
	items, retired, err := inv.view()
	return slices.DeleteFunc(items, func(it overlayItem) bool {
		return retired[it.ID] || it.AgentID != agent || (provider != "" && it.Provider != provider)
	}), err
}

// owned is agent's subscription id and whether it is retired, else 404; when ifRetired says why, a retired one is 409.
func (inv *inventory) owned(agent, id, ifRetired string) (overlayItem, bool, error) {
	items, retired, err := inv.view()
	i := slices.IndexFunc(items, func(it overlayItem) bool { return it.ID == id && it.AgentID == agent })
	if err != nil {
		return overlayItem{}, false, err
	} else if i < 0 {
		return overlayItem{}, false, refuse("not_found", "agent %q has no subscription %q", agent, id)
	} else if ifRetired != "" && retired[id] {
		return items[i], true, refuse("state_conflict", "subscription %s is retired; %s", id, ifRetired)
	}
	return items[i], retired[id], nil
}

// credential is a copy of id's credential; an unreadable vault or none is 503 (SPEC §2.2).
func (inv *inventory) credential(id string) (vaultCredential, error) {
	doc, err := inv.vault.load()
	if err != nil {
		return vaultCredential{}, refuse("credential_unauthorized", "the vault is unreadable").because(err)
	}
	c := doc.Subscriptions[id]
	if c.APIKey == "" && c.OAuth == nil {
		return c, refuse("credential_unauthorized", "the vault holds no credential for subscription %q", id)
	} else if c.OAuth != nil {
		c.OAuth = new(*c.OAuth) // doc is the vault's shared cache
	}
	return c, nil
}

// write runs one change under mu, then drops the cached listings: they show it at once (SPEC §10.2).
func (inv *inventory) write(change func() error) error {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	defer clear(inv.cache)
	return change()
}

// unusable is a state file's failure as a caller sees it: a guard's refusal as itself, else 503 naming the file.
func unusable(err error) error {
	if _, guard := err.(*apiError); err == nil || guard {
		return err
	}
	return refuse("dependency_unavailable", "%v", err).because(err)
}

// invalidate drops every cached listing: a pass changed the rows (the overlay is re-read on change).
func (inv *inventory) invalidate() { inv.write(func() error { return nil }) }

// donation is the strict body (and the CLI's request) of POST …/subscriptions/{agent_id}.
type donation struct {
	Provider string      `json:"provider"`
	Label    string      `json:"label"`
	APIKey   string      `json:"api_key"`
	OAuth    *oauthGrant `json:"oauth"`
}

// donatedSubscription is the 201 answer: the item's metadata, never the secret; the empty CreatedAt hides the item's.
type donatedSubscription struct {
	overlayItem
	CreatedAt string `json:"created_at,omitempty"`
	Status    string `json:"status"`
}

// store is the one credential write (SPEC §10.1): an item without an ID is a donation under a fresh id, one with
// an ID replaces the credential of the agent's non-retired subscription; by, when set, is the client that signed in.
// Every file is read before either is touched. A donation writes the vault, then the overlay, and takes the secret
// back if the overlay write fails: the vault never keeps a secret no subscription names. A sign-in is refused
// first when the journal cannot record it, and journaled (SPEC §11.1), logged at Warn unless stored and journaled.
func (inv *inventory) store(it overlayItem, cred vaultCredential, by string) (overlayItem, error) {
	fresh := it.ID == ""
	if rnd := [8]byte{}; fresh {
		rand.Read(rnd[:])
		it.ID, it.CreatedAt = fmt.Sprintf("sub_%x", rnd), inv.now().UTC().Format(journalTimeFormat)
	}
	if err := checkItem(it, nil); fresh && err != nil {
		return overlayItem{}, refuse("invalid_request", "%s", err)
	} else if err := inv.j.ready(); by != "" && err != nil {
		return overlayItem{}, refuse("dependency_unavailable", "the journal cannot record a sign-in: %v", err).because(err)
	}
	err := inv.write(func() (err error) {
		pool, err := inv.pool(it.AgentID, it.Provider)
		if err == nil && !fresh {
			it, _, err = inv.owned(it.AgentID, it.ID, "reinstate it before replacing its credential")
		}
		if err == nil {
			cred, err = checkCredential(it.Provider, cred)
		}
		if err != nil || fresh && len(pool) >= maxPoolSize {
			return cmp.Or[error](err, refuse("invalid_request",
				"agent %q holds %d non-retired %s subscriptions, the limit; retire one first", it.AgentID, len(pool), it.Provider))
		}
		err = unusable(inv.vault.update(func(doc *vaultDoc) error { // the guards see the document written
			for other, c := range doc.Subscriptions { // two holders of one grant would spend each other's refresh token
				if cred.OAuth != nil && c.OAuth != nil && c.OAuth.RefreshToken == cred.OAuth.RefreshToken && other != it.ID {
					return refuse("state_conflict", "this OAuth grant is held by another subscription (a retired one too); sign in anew")
				}
			}
			doc.Subscriptions[it.ID] = cred // refused, nothing is written (a replacement's item was just read: never lost)
			return inv.overlayLost(len(doc.Subscriptions) - 1)
		}))
		if err != nil || !fresh {
			return err
		}
		if err = inv.overlay.update(func(d *overlayDoc) error { d.Items = append(d.Items, it); return nil }); err == nil {
			inv.log.Info("subscription_donated", "subscription_id", it.ID, "provider", it.Provider, "agent_id", it.AgentID)
			return nil
		}
		verr := inv.vault.update(func(d *vaultDoc) error { delete(d.Subscriptions, it.ID); return nil })
		inv.log.Error("subscription_overlay_write_failed", "subscription_id", it.ID, "cause", err.Error(),
			"vault_rollback_error", verr) // null: taken back; else kept until brama subscription prune-orphans
		return refuse("internal_error", "the overlay was not written: %v", err).because(err)
	})
	if err == nil && (!fresh || cred.OAuth != nil) {
		inv.l.activate(it.ID, it.Provider, valueOr(cred.OAuth, oauthGrant{}).ExpiresAtMs, 0) // an API key: none
	}
	if by != "" && (err == nil || asAPIError(err).Status() >= 500 && !fresh && it.Provider != "") {
		rec := journalRecord{Kind: "subscription_sign_in", SubscriptionID: it.ID, Provider: it.Provider, Result: "signed_in",
			Detail: pick(fresh, "donated", "credential replaced") + " by sign-in of client " + by}
		if err != nil { // a known subscription's replacement that failed on Brama's side
			rec.Result, rec.Detail = "failed", ledgerSentence("credential not replaced (client "+by+"): "+asAPIError(err).Message)
		}
		jerr := inv.j.append(rec)
		logAt := pick(err == nil && jerr == nil, inv.log.Info, inv.log.Warn)
		logAt("subscription_sign_in", "subscription_id", it.ID, "agent_id", it.AgentID,
			"provider", it.Provider, "result", rec.Result, "detail", rec.Detail, "journal_error", jerr)
		if jerr != nil && err == nil {
			return it, refuse("dependency_unavailable", "%s was stored, but the journal refused the sign-in: %v", it.ID, jerr).because(jerr)
		}
	}
	return pick(err == nil, it, overlayItem{}), err
}

// setRetired journals agent's id out of ("retire") or back into ("reinstate") service (SPEC §9), unless the fold
// already says so; nothing is claimed that the journal cannot record.
func (inv *inventory) setRetired(kind, agent, id, reason string) error {
	if strings.TrimSpace(reason) == "" || len(reason) > 512 || !printable(reason) {
		return refuse("invalid_request", "a reason is required: printable text on one line, at most 512 bytes")
	}
	return inv.write(func() error {
		if _, retired, err := inv.owned(agent, id, ""); err != nil || retired == (kind == "retire") {
			return err
		} else if err := inv.j.append(journalRecord{Kind: kind, SubscriptionID: id, Reason: reason}); err != nil {
			return refuse("dependency_unavailable", "subscription not changed: the journal refused the %s: %v", kind, err).because(err)
		}
		inv.log.Info("subscription_"+kind, "subscription_id", id, "agent_id", agent)
		nudge(inv.l.changed) // its ledger moments count again, or no longer (SPEC §11.2)
		return nil
	})
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

// list is agent's rows (SPEC §10.4), retired ones included, cached for at most the TTL.
func (inv *inventory) list(agent string) ([]subscriptionRow, error) {
	now := inv.now()
	inv.mu.Lock() // held while computing: a write or an invalidation waits, so no listing outlives one
	defer inv.mu.Unlock()
	status, age := inv.l.statusSeq.Load(), now.Sub(inv.cachedAt)
	if status != inv.cacheStatus || age < 0 || age >= inv.ttl {
		clear(inv.cache)
		inv.cachedAt, inv.cacheStatus = now, status
	} else if rows, hit := inv.cache[agent]; hit {
		return slices.Clone(rows), nil
	}
	items, retired, err := inv.view()
	rows := []subscriptionRow{}
	for _, it := range items {
		if it.AgentID == agent {
			rows = append(rows, inv.row(it, retired[it.ID], now))
		}
	}
	if inv.ttl > 0 && len(rows) > 0 { // an unknown id an admin reads leaves no entry
		inv.cache[agent] = rows
	}
	return slices.Clone(rows), err
}

// row builds item's row from its ledger record (SPEC §10.4): null what is not in force or never happened.
func (inv *inventory) row(item overlayItem, retired bool, now time.Time) subscriptionRow {
	e, ms := inv.l.entry(item.ID), now.UnixMilli()
	r := subscriptionRow{ID: item.ID, Provider: item.Provider, Label: item.Label, Status: "active",
		Windows: append([]planWindow{}, e.Windows...), Measured: e.Measured, Credential: &e.Credential,
		Block: pick(e.Block.UntilMs > ms, &e.Block, nil), UsageRead: pick(e.UsageRead.AtMs != 0, &e.UsageRead, nil),
		Probe: pick(e.Probe.AtMs != 0, &e.Probe, nil)}
	if retired {
		r.Status, r.Credential.State = "retired", credDisabled
	}
	r.Stale = (r.UsageRead != nil && !e.UsageRead.OK) ||
		slices.ContainsFunc(e.Windows, func(w planWindow) bool { return w.ResetsAtMs != 0 && w.ResetsAtMs <= ms })
	return r
}

// orphans lists, sorted, the vault's subscription ids no overlay item names (SPEC §17).
func (inv *inventory) orphans() ([]string, error) {
	overlay, err := inv.overlay.load()
	doc, verr := inv.vault.load()
	if err = unusable(cmp.Or(err, verr)); err != nil {
		return nil, err
	}
	orphans := maps.Clone(doc.Subscriptions) // linear in the subscriptions: /readyz calls it (SPEC §17)
	for _, it := range overlay.Items {
		delete(orphans, it.ID)
	}
	return slices.Sorted(maps.Keys(orphans)), nil
}

// overlayLost refuses a write while the overlay is missing or empty (0 bytes: a restore cut short; Brama never
// writes one) but the vault holds credentials: every one would look orphaned (SPEC §17).
func (inv *inventory) overlayLost(held int) error {
	_, id, err := guardFile(inv.overlay.role, inv.overlay.path, false)
	if lost := errors.Is(err, errFileAbsent) || err == nil && id.size == 0; held == 0 || !lost {
		return nil
	}
	return refuse("dependency_unavailable", "the vault holds %d subscription credential(s) but %s is missing or empty: "+
		"restore donated-subscriptions.json from a backup", held, overlayFile)
}

// pruneOrphans deletes the orphans from the vault (brama subscription prune-orphans, SPEC §17), never while the
// overlay is lost, nor from a vault outside the state directory: it may hold another one's subscriptions.
func (inv *inventory) pruneOrphans() ([]string, error) {
	var orphans []string
	err := inv.write(func() (err error) {
		if orphans, err = inv.orphans(); err != nil || len(orphans) == 0 {
			return err
		} else if err = inv.overlayLost(len(orphans)); err != nil { // the overlay lost, every credential is an orphan
			return err
		} else if filepath.Dir(inv.vault.path) != filepath.Dir(inv.overlay.path) {
			return refuse("state_conflict", "BRAMA_VAULT_FILE lies outside the state directory, maybe shared: nothing removed")
		}
		return unusable(inv.vault.update(func(d *vaultDoc) error {
			for _, id := range orphans {
				delete(d.Subscriptions, id)
			}
			return nil
		}))
	})
	if err != nil || len(orphans) == 0 {
		return []string{}, err
	}
	inv.log.Info("vault_orphans_removed", "count", len(orphans), "subscription_ids", strings.Join(orphans, ","))
	return orphans, nil
}

// readiness is the inventory's part of /readyz (SPEC §13): orphans and reauthorizations are warnings; payer: some
// credential is active. An unusable overlay or journal is a reason the server names.
func (inv *inventory) readiness() (warnings []string, payer bool) {
	items, retired, err := inv.view()
	if orphans, _ := inv.orphans(); err == nil && len(orphans) > 0 {
		fix := pick(inv.overlayLost(len(orphans)) != nil,
			overlayFile+" is missing or empty: restore it from a backup (donations are refused until then)",
			"brama subscription prune-orphans removes them")
		warnings = append(warnings, fmt.Sprintf("the vault holds %d subscription credential(s) with no overlay entry, unused: %s; %s",
			len(orphans), strings.Join(orphans, ", "), fix))
	}
	active := func(it overlayItem) bool { return inv.l.entry(it.ID).Credential.State == credActive }
	live := slices.DeleteFunc(items, func(it overlayItem) bool { return retired[it.ID] })
	payer = slices.ContainsFunc(live, active)
	if reauth := len(slices.DeleteFunc(live, active)); reauth > 0 {
		warnings = append(warnings, fmt.Sprintf("%d subscription(s) need reauthorization (brama subscription sign-in)", reauth))
	}
	return warnings, payer
}
