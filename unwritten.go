package main

import (
	"maps"
	"slices"
)

// A rotated grant the vault refuses to keep (disk full, EACCES) is not lost
// (SPEC §17): the daemon's vault holds it in memory, reads show it, and every
// vault write, a maintenance pass's included, writes it again.

// unwrittenGrant is a rotated grant the vault refused to keep (SPEC §17):
// it stands in for the vault's grant while that still holds the refresh token
// from, and goes with the vault's next write (a pass writes it again).
type unwrittenGrant struct {
	from  string
	grant oauthGrant
}

// keepUnwritten keeps g, the rotation of old, until a vault write takes it.
func (v *vault) keepUnwritten(id string, old, g oauthGrant) {
	v.umu.Lock()
	defer v.umu.Unlock()
	from := old.RefreshToken
	if u, ok := v.unwritten[id]; ok && u.grant.RefreshToken == old.RefreshToken {
		from = u.from // old was itself unwritten
	}
	if v.unwritten == nil {
		v.unwritten = map[string]unwrittenGrant{}
	}
	v.unwritten[id] = unwrittenGrant{from, g}
}

// unwrittenIDs names the subscriptions whose grant only memory holds.
func (v *vault) unwrittenIDs() []string {
	v.umu.Lock()
	defer v.umu.Unlock()
	return slices.Sorted(maps.Keys(v.unwritten))
}

// putUnwritten puts each unwritten grant into d where it still applies.
func putUnwritten(d *vaultDoc, unwritten map[string]unwrittenGrant) {
	for id, u := range unwritten {
		if c := d.Subscriptions[id].OAuth; c != nil && c.RefreshToken == u.from {
			g := u.grant
			d.Subscriptions[id] = vaultCredential{OAuth: &g}
		}
	}
}

// load is the vault's document with the unwritten grants in place.
func (v *vault) load() (*vaultDoc, error) {
	doc, err := v.stateFile.load()
	v.umu.Lock()
	defer v.umu.Unlock()
	if err != nil || len(v.unwritten) == 0 {
		return doc, err
	}
	out := *doc // the shared cache: changed only in a copy
	out.Subscriptions = maps.Clone(doc.Subscriptions)
	putUnwritten(&out, v.unwritten)
	return &out, nil
}

// update writes the unwritten grants with change; once written they are
// memory's no longer.
func (v *vault) update(change func(*vaultDoc) error) error {
	v.umu.Lock()
	unwritten := maps.Clone(v.unwritten)
	v.umu.Unlock()
	err := v.stateFile.update(func(d *vaultDoc) error {
		putUnwritten(d, unwritten)
		return change(d)
	})
	if err == nil {
		v.umu.Lock()
		for id, u := range unwritten {
			if v.unwritten[id] == u {
				delete(v.unwritten, id)
			}
		}
		v.umu.Unlock()
	}
	return err
}

// writeUnwritten writes the unwritten grants again (each pass, SPEC §17).
func (o *oauthClient) writeUnwritten() {
	if len(o.vault.unwrittenIDs()) > 0 {
		if err := o.vault.update(func(*vaultDoc) error { return nil }); err != nil {
			o.log.Error("credential_refresh_unwritten", "subscriptions", o.vault.unwrittenIDs(), "error", redact(err.Error()))
		}
	}
}
