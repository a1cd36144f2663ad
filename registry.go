package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"unicode/utf8"
)

// The route registry file (SPEC §4.2, §4.4): cached reads, the only
// writers, and migration. The document and its guards are in routesdoc.go;
// alias states and model resolution (SPEC §4.3, §5) are in resolve.go.

// registryRole names the registry file in guard errors.
const registryRole = "route registry"

// registryPath is BRAMA_ROUTES_FILE when set, else $STATE/routes.json. With
// neither, the error is the *noStateError: the registry is then empty and
// every write refuses with it (SPEC §2.1).
func registryPath(st state, getenv func(string) string) (string, error) {
	return st.fileOrState(getenv, "BRAMA_ROUTES_FILE", registryRole, "routes.json")
}

// readRegistryFile reads the registry file through the reader guards of
// SPEC §2.2 without reading more than 1 MiB's worth of a file that claims
// to be larger. An absent file is errFileAbsent.
func readRegistryFile(path string) ([]byte, fileIdentity, error) {
	id, err := guardFile(registryRole, path)
	if err != nil {
		return nil, id, err
	}
	if id.size > maxRegistryBytes {
		return nil, id, invalidf("registry is %d bytes; the limit is 1 MiB (%d bytes)", id.size, maxRegistryBytes)
	}
	return readGuarded(registryRole, path)
}

// sameFile says whether two identities name the same unchanged file.
func sameFile(a, b fileIdentity) bool {
	return a.dev == b.dev && a.ino == b.ino && a.size == b.size && a.mtime.Equal(b.mtime)
}

// registry is the route registry file as the daemon and the CLIs see it:
// reads are cached by file identity (SPEC §4.2) and the only writers,
// set, remove and migrateRegistry, replace it atomically under its lock
// (SPEC §4.4).
type registry struct {
	path    string // "" when pathErr is set
	pathErr error  // the *noStateError when no file can be named
	j       *journal
	log     *slog.Logger

	writeMu sync.Mutex // serializes set and remove within this process

	mu         sync.Mutex // guards the fields below
	cached     bool       // id, doc and err hold the last parse of the file
	id         fileIdentity
	doc        *routesDoc
	err        error
	parses     int    // files parsed so far; lets tests prove an unchanged file costs none
	lastLogged string // the failure last logged as inference_routes_invalid
}

// newRegistry serves the registry at path. When path could not be named
// (pathErr, a *noStateError) the registry is empty and writes refuse with
// pathErr.
func newRegistry(path string, pathErr error, j *journal, log *slog.Logger) *registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &registry{path: path, pathErr: pathErr, j: j, log: log}
}

// current returns the registry document, parsing the file only when its
// identity (device, inode, size, mtime) changed since the last parse. An
// absent file is the empty registry. A file failing the guards or the
// parse returns why, logged once per distinct failure. The document is
// shared: callers must not modify it.
func (r *registry) current() (*routesDoc, error) {
	if r.pathErr != nil {
		return emptyRoutesDoc(), nil
	}
	id, err := guardFile(registryRole, r.path) // one Lstat, outside the lock
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case errors.Is(err, errFileAbsent):
		r.cached, r.lastLogged = false, ""
		return emptyRoutesDoc(), nil
	case err != nil:
		r.cached = false
		return nil, r.invalid(err)
	case r.cached && sameFile(id, r.id):
		return r.doc, r.err
	}
	b, id, err := readRegistryFile(r.path)
	if errors.Is(err, errFileAbsent) { // removed since the guard
		r.cached, r.lastLogged = false, ""
		return emptyRoutesDoc(), nil
	}
	var doc *routesDoc
	if err == nil {
		r.parses++
		doc, err = parseRegistry(b)
	}
	r.cached, r.id, r.doc, r.err = true, id, doc, err
	if err != nil {
		return nil, r.invalid(err)
	}
	r.lastLogged = ""
	return doc, nil
}

// invalid logs inference_routes_invalid unless this same failure was the
// last one logged, and returns err. Callers hold mu.
func (r *registry) invalid(err error) error {
	if reason := err.Error(); reason != r.lastLogged {
		r.log.Warn("inference_routes_invalid", "reason", reason)
		r.lastLogged = reason
	}
	return err
}

// set points alias at destination (SPEC §4.4) and returns the committed
// document. by is the client id, or "cli" (also what an empty by records).
func (r *registry) set(alias, destination, by string) (*routesDoc, error) {
	dest := strings.TrimSpace(destination)
	if err := checkAlias(alias); err != nil {
		return nil, refuse("invalid_request", "%v", err)
	}
	return r.write(func(doc *routesDoc) (journalRecord, error) {
		if err := checkRoute(doc, alias, dest); err != nil {
			return journalRecord{}, refuse("invalid_request", "%v", err)
		}
		if st, reason := aliasState(doc, dest, nil); st == stateCapabilityAbsent && !needsDirectCredential(dest) {
			// Unknown provider, or local-openai/<name> naming no deployment:
			// a reader would accept it, but no writer creates it.
			return journalRecord{}, refuse("invalid_request", "registry route %q: %s", alias, reason)
		}
		rec := journalRecord{Kind: "route_change", Alias: alias, To: &dest, By: by}
		if old, ok := doc.Routes[alias]; ok {
			rec.From = &old
		}
		doc.Routes[alias] = dest
		return rec, nil
	})
}

// needsDirectCredential says whether dest is a canonical route of a known
// provider paid by a direct credential: the one kind of capability_absent
// destination a writer may still declare (the key may come later).
func needsDirectCredential(dest string) bool {
	provider, _, ok := strings.Cut(dest, "/")
	p, known := lookupProvider(provider)
	return ok && known && p.cred == credDirect
}

// remove deletes alias (SPEC §4.4) and returns the committed document.
func (r *registry) remove(alias, by string) (*routesDoc, error) {
	return r.write(func(doc *routesDoc) (journalRecord, error) {
		old, ok := doc.Routes[alias]
		if !ok {
			e := refuse("alias_unknown", "alias %q is not declared in the route registry", alias)
			e.Details = &aliasDetails{Alias: alias, State: stateNoRoute}
			return journalRecord{}, e
		}
		delete(doc.Routes, alias)
		return journalRecord{Kind: "route_change", Alias: alias, From: &old, By: by}, nil
	})
}

// write is the one read-modify-rename of SPEC §4.4. Under the process mutex
// and the file's flock it re-reads the file (a CLI may have changed it),
// lets change edit that fresh document and name its journal record, checks
// the journal can take the record before anything is staged, re-validates
// the staged bytes, renames them into place and journals the change. A
// journal failure after the rename cannot undo it: the change stands and
// journal_append_failed is logged.
func (r *registry) write(change func(doc *routesDoc) (journalRecord, error)) (*routesDoc, error) {
	if r.pathErr != nil {
		return nil, refuse("dependency_unavailable", "the route registry cannot be written: %v", r.pathErr).because(r.pathErr)
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	var committed *routesDoc
	err := withFileLock(r.path, func() error {
		doc := emptyRoutesDoc()
		b, _, err := readRegistryFile(r.path)
		if err == nil {
			doc, err = parseRegistry(b)
		}
		if err != nil && !errors.Is(err, errFileAbsent) {
			return refuse("state_conflict", "the route registry on disk is invalid (repair it or run brama routes migrate): %v", err).because(err)
		}
		rec, err := change(doc) // doc was parsed just now; nobody else holds it
		if err != nil {
			return err
		}
		rec.By = cmp.Or(rec.By, "cli")
		if r.j == nil {
			return refuse("dependency_unavailable", "route registry not changed: there is no journal to record it")
		}
		if err := r.j.ready(); err != nil {
			return refuse("dependency_unavailable", "route registry not changed: the journal cannot record it: %v", err).because(err)
		}
		staged := encodeRegistry(doc)
		if len(staged) > maxRegistryBytes {
			return refuse("state_conflict", "the route registry would be %d bytes; the limit is 1 MiB (%d bytes)", len(staged), maxRegistryBytes)
		}
		if committed, err = parseRegistry(staged); err != nil {
			return refuse("internal_error", "route registry not changed: the staged document is invalid: %v", err).because(err)
		}
		if err := writeFileAtomic(r.path, staged); err != nil {
			return refuse("internal_error", "route registry not changed: %v", err).because(err)
		}
		// Journaled under the flock, so records follow the order of renames
		// even when a CLI and the daemon write at once.
		if err := r.j.append(rec); err != nil {
			r.log.Error("journal_append_failed", "kind", rec.Kind, "alias", rec.Alias, "cause", err.Error())
		}
		return nil
	})
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return nil, ae
		}
		return nil, refuse("internal_error", "route registry lock: %v", err).because(err)
	}
	return committed, nil
}

// migrateRegistry is `brama routes migrate` (SPEC §4.4): it keeps
// schema_version, deployments and routes of the file's JSON object, drops
// every other top-level member (returned sorted), validates the result and
// commits it in the canonical encoding, so a second run commits the same
// bytes. A file failing the reader guards or validation is left untouched.
// It journals nothing and contacts nothing: no alias changes.
func migrateRegistry(path string) (committed []byte, dropped []string, doc *routesDoc, err error) {
	if _, err := guardFile(registryRole, path); err != nil {
		return nil, nil, nil, err // before the lock: an absent file gets no lock file either
	}
	err = withFileLock(path, func() error {
		b, _, err := readRegistryFile(path)
		if err != nil {
			return err
		}
		if !utf8.Valid(b) {
			return invalidf("registry is not valid UTF-8")
		}
		if len(trimJSONSpace(b)) == 0 {
			return invalidf("registry %s is empty; there is no document to migrate", path)
		}
		members, err := jsonObject(b, "registry")
		if err != nil {
			return err
		}
		dropped = []string{}
		for _, k := range sortedKeys(members) {
			if k != "schema_version" && k != "deployments" && k != "routes" {
				dropped = append(dropped, k)
				delete(members, k)
			}
		}
		kept, err := json.Marshal(members)
		if err != nil {
			return err
		}
		if doc, err = parseRegistry(kept); err != nil {
			return err
		}
		committed = encodeRegistry(doc)
		return writeFileAtomic(path, committed)
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return committed, dropped, doc, nil
}
