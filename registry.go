package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// The route registry file (SPEC §4.2-§4.4: cached read, writers, migrate,
// alias states) and what a request's model names (§5). routesdoc.go: the document.

// registryPath is BRAMA_ROUTES_FILE, else $STATE/routes.json; with neither,
// the *noStateError: the registry is empty and every write refuses (SPEC §2.1).
func registryPath(st state, getenv func(string) string) (string, error) {
	return st.fileOrState(getenv, "BRAMA_ROUTES_FILE", registryRole, "routes.json")
}

// registry is the route registry file, read cached by file identity (SPEC
// §4.2); set, remove and migrateRegistry replace it under its lock (§4.4).
type registry struct {
	stateFile[*routesDoc] // path "" when pathErr is set; keeps a parse failure

	j       *journal
	log     *slog.Logger
	writeMu sync.Mutex // serializes set and remove within this process

	logMu      sync.Mutex   // held by current, guards lastLogged
	lastLogged string       // the failure last logged as inference_routes_invalid
	parses     atomic.Int32 // files parsed so far; lets tests prove an unchanged file costs none
}

func newRegistry(path string, pathErr error, j *journal, log *slog.Logger) *registry {
	r := &registry{j: j, log: log}
	r.stateFile = stateFile[*routesDoc]{role: registryRole, path: path, pathErr: pathErr,
		keepErr: true, tooBig: registryTooBig, parse: func(b []byte) (*routesDoc, error) {
			if b != nil { // nil: the file is absent
				r.parses.Add(1)
			}
			return parseRegistry(b)
		}}
	return r
}

// current returns the shared document, parsing only a changed file; absent
// is the empty registry, and each distinct failure is logged once.
func (r *registry) current() (*routesDoc, error) {
	if r.pathErr != nil {
		return emptyRoutesDoc(), nil
	}
	r.logMu.Lock()
	defer r.logMu.Unlock()
	doc, err := r.load()
	if err != nil {
		if reason := err.Error(); reason != r.lastLogged {
			r.log.Warn("inference_routes_invalid", "reason", reason)
			r.lastLogged = reason
		}
		return nil, err
	}
	r.lastLogged = ""
	return doc, nil
}

// set points alias at destination (SPEC §4.4); by is the client id or "cli".
func (r *registry) set(alias, destination, by string) (*routesDoc, error) {
	dest := strings.TrimSpace(destination)
	if err := checkAlias(alias); err != nil {
		return nil, refuse("invalid_request", "%v", err)
	}
	return r.write(alias, &dest, by)
}

// remove deletes alias (SPEC §4.4) and returns the committed document.
func (r *registry) remove(alias, by string) (*routesDoc, error) { return r.write(alias, nil, by) }

// write points alias at *to or, nil, removes it (SPEC §4.4), journaling the change.
func (r *registry) write(alias string, to *string, by string) (*routesDoc, error) {
	return r.commit(func(doc *routesDoc) (*journalRecord, error) {
		rec := journalRecord{Kind: "route_change", Alias: alias, To: to, By: cmp.Or(by, "cli")}
		if old, ok := doc.Routes[alias]; ok {
			rec.From = &old
		}
		switch {
		case to == nil && rec.From == nil:
			e := refuse("alias_unknown", "alias %q is not declared in the route registry", alias)
			e.Details = &aliasDetails{Alias: alias, State: stateNoRoute}
			return nil, e
		case to == nil:
			delete(doc.Routes, alias)
		default:
			if err := checkRoute(doc, alias, *to); err != nil {
				return nil, refuse("invalid_request", "%v", err)
			}
			// Every credential assumed, capability_absent is an unknown provider or a
			// missing deployment: readers accept it, writers never create it.
			if st, reason := aliasState(doc, *to, func(string) bool { return true }); st != stateServing {
				return nil, refuse("invalid_request", "registry route %q: %s", alias, reason)
			}
			doc.Routes[alias] = *to
		}
		return &rec, nil
	})
}

// setDeployment declares d, or with remove takes the deployment named d.Name out; an alias
// still routed to it keeps it (the staged document would be invalid). Nothing is journaled.
func (r *registry) setDeployment(d deployment, remove bool) (*routesDoc, error) {
	return r.commit(func(doc *routesDoc) (*journalRecord, error) {
		n := len(doc.Deployments)
		doc.Deployments = slices.DeleteFunc(doc.Deployments, func(o deployment) bool { return o.Name == d.Name })
		switch {
		case remove && len(doc.Deployments) == n:
			return nil, refuse("invalid_request", "no deployment %q is declared", d.Name)
		case remove:
			return nil, nil
		case len(doc.Deployments) != n:
			return nil, refuse("invalid_request", "deployment %q is already declared; rm it first", d.Name)
		}
		raw, _ := json.Marshal(d)
		if _, err := parseDeployment(n, raw, doc.Deployments); err != nil { // the reader's own guards
			return nil, refuse("invalid_request", "%v", err)
		}
		doc.Deployments = append(doc.Deployments, d)
		return nil, nil
	})
}

// commit is SPEC §4.4's one read-modify-rename under the mutex and flock: change edits the
// freshly parsed document and returns the record to journal after the rename, if any; a
// journal failure then is logged: it cannot undo the rename.
func (r *registry) commit(change func(doc *routesDoc) (*journalRecord, error)) (*routesDoc, error) {
	if err := r.pathErr; err != nil {
		return nil, refuse("dependency_unavailable", "the route registry cannot be written: %v", err).because(err)
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	var committed *routesDoc
	err := withFileLock(r.path, func() error {
		doc, err := r.fresh() // parsed just now; nobody else holds it
		if err != nil {
			return refuse("state_conflict", "the route registry on disk is invalid (repair it or run brama routes migrate): %v", err).because(err)
		}
		rec, err := change(doc)
		if err != nil {
			return err
		}
		if err := r.j.ready(); rec != nil && err != nil {
			return refuse("dependency_unavailable", "route registry not changed: the journal cannot record it: %v", err).because(err)
		}
		staged := encodeRegistry(doc)
		if len(staged) > maxRegistryBytes {
			return refuse("state_conflict", "the route registry would be %d bytes; the limit is 1 MiB (%d bytes)", len(staged), maxRegistryBytes)
		}
		if committed, err = parseRegistry(staged); err != nil {
			return refuse("invalid_request", "route registry not changed: %v", err).because(err)
		}
		if err := writeFileAtomic(r.path, staged); err != nil {
			return refuse("internal_error", "route registry not changed: %v", err).because(err)
		}
		// Journaled under the flock, so records follow the order of renames.
		if rec != nil {
			if err := r.j.append(*rec); err != nil {
				r.log.Error("journal_append_failed", "kind", rec.Kind, "alias", rec.Alias, "cause", err.Error())
			}
		}
		return nil
	})
	if err == nil {
		return committed, nil
	}
	if !errors.As(err, new(*apiError)) { // change's refusals come back as they are
		err = refuse("internal_error", "route registry lock: %v", err).because(err)
	}
	return nil, err
}

// migrateRegistry is `brama routes migrate` (SPEC §4.4): it drops the members schema 1
// lacks (returned sorted), commits the rest canonical; an invalid file is left untouched.
func migrateRegistry(path string) (committed []byte, dropped []string, doc *routesDoc, err error) {
	if _, err := guardFile(registryRole, path); err != nil {
		return nil, nil, nil, err // before the lock: an absent file gets no lock file either
	}
	err = withFileLock(path, func() error {
		f := stateFile[map[string]json.RawMessage]{role: registryRole, path: path, absentErr: true,
			parse: registryMembers, tooBig: registryTooBig}
		members, err := f.fresh()
		if err == nil && members == nil {
			err = invalidf("registry %s is empty; there is no document to migrate", path)
		}
		if err != nil {
			return err
		}
		dropped = []string{}
		for _, k := range slices.Sorted(maps.Keys(members)) {
			if k != "schema_version" && k != "deployments" && k != "routes" {
				dropped = append(dropped, k)
				delete(members, k)
			}
		}
		if doc, err = validateRegistry(members); err != nil {
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

// aliasRow is one line of GET /v1/aliases and `brama routes list`.
type aliasRow struct {
	Alias  string  `json:"alias"`
	State  string  `json:"state"`
	Route  *string `json:"route"`
	Reason string  `json:"reason"` // one sentence
}

// aliasTable is the body of GET /v1/aliases (SPEC §4.3).
type aliasTable struct {
	Aliases       []aliasRow `json:"aliases"`
	Unserviceable int        `json:"unserviceable"`
}

// aliasState is the SPEC §4.3 state of an alias routed to dest and its
// reason; hasDirect says whether a provider has a direct credential.
func aliasState(doc *routesDoc, dest string, hasDirect func(provider string) bool) (st, reason string) {
	if dest == modeBest {
		return stateServing, "Routes to best: the operator's preferred subscription route, then the agent's other subscription models."
	}
	provider, model, canonical := strings.Cut(dest, "/")
	if !canonical {
		provider, model = "local-openai", dest // a bare name is a deployment or adapter (SPEC §4.1)
	}
	p, ok := lookupProvider(provider)
	switch {
	case !ok:
		return stateCapabilityAbsent, fmt.Sprintf("Provider %q is not one Brama knows.", provider)
	case p.cred == credNone:
		d, _, n := doc.lookupLocal(model)
		if n != 1 {
			return stateCapabilityAbsent, fmt.Sprintf("No single deployment or adapter named %q is declared.", model)
		}
		return stateServing, fmt.Sprintf("Served by local deployment %q at %s.", d.Name, d.baseURL())
	case p.cred == credSubscription:
		return stateServing, fmt.Sprintf("Paid by the calling agent's %s subscriptions.", p.id)
	case hasDirect != nil && hasDirect(p.id):
		return stateServing, fmt.Sprintf("Paid by the deployment's direct %s credential.", p.id)
	}
	return stateCapabilityAbsent, fmt.Sprintf("No direct %s credential is configured.", p.id)
}

// aliases lists every declared alias with its state and counts those that
// cannot serve; an unreadable registry is an error, not an empty table.
func (r *registry) aliases(hasDirect func(provider string) bool) (aliasTable, error) {
	doc, err := r.current()
	if err != nil {
		return aliasTable{Aliases: []aliasRow{}}, err
	}
	t := aliasTable{Aliases: make([]aliasRow, 0, len(doc.Routes))}
	for _, alias := range slices.Sorted(maps.Keys(doc.Routes)) {
		dest := doc.Routes[alias]
		st, reason := aliasState(doc, dest, hasDirect)
		if prefix, ok := strings.CutSuffix(alias, "*"); ok {
			reason = fmt.Sprintf("Every name starting with %q that no exact alias declares. %s", prefix, reason)
		}
		t.Aliases = append(t.Aliases, aliasRow{Alias: alias, State: st, Route: &dest, Reason: reason})
		if st != stateServing {
			t.Unserviceable++
		}
	}
	return t, nil
}

// resolution is what a request's model names (SPEC §5.1) and the path it
// takes (§5.3).
type resolution struct {
	Mode     string
	Alias    string       // set when reached through an alias
	Route    string       // canonical "provider/model"; "" for selectors and best
	Provider providerInfo // zero for selectors and best
	Model    string       // upstream model name (local-openai: the deployment's model or the adapter's name)
	BaseURL  string       // local-openai only: "http://host:port/v1"
}

// resolveModel applies SPEC §5.1 and picks the §5.3 mode. With docErr, a name that could
// be an alias is routes_file_invalid (selectors, best, known canonical routes resolve).
func resolveModel(name string, doc *routesDoc, docErr error, hasDirect func(string) bool) (resolution, error) {
	switch {
	case name == "":
		return resolution{}, refuse("invalid_request", "model is required")
	case strings.EqualFold(name, modeAny):
		return resolution{Mode: modeAny}, nil
	case strings.EqualFold(name, modeAnyVision):
		return resolution{Mode: modeAnyVision}, nil
	case name == modeBest:
		return resolution{Mode: modeBest}, nil
	}
	if doc == nil {
		doc = emptyRoutesDoc()
	}
	provider, model, slash := strings.Cut(name, "/") // §5.1 rule 4: a known provider before the first "/"
	p, known := lookupProvider(provider)
	known = known && slash && checkModelName(model) == nil // else §5.1 rule 5: never declared
	dest, declared := doc.match(name)
	alias := ""
	switch {
	case docErr != nil && known && p.cred != credNone: // needs no registry
	case docErr != nil:
		e := refuse("alias_unserviceable", "model %q cannot be resolved: the route registry is invalid: %v", truncateUTF8(name, 200), docErr)
		e.Details = &aliasDetails{Alias: name, State: stateRoutesInvalid}
		return resolution{}, e.because(docErr)
	case declared:
		if st, reason := aliasState(doc, dest, hasDirect); st != stateServing {
			e := refuse("alias_unserviceable", "alias %q cannot serve: %s", name, reason)
			e.Details = &aliasDetails{Alias: name, State: st, Route: &dest}
			return resolution{}, e
		}
		if dest == modeBest {
			return resolution{Mode: modeBest, Alias: name}, nil
		}
		alias = name
		if provider, model, slash = strings.Cut(dest, "/"); !slash { // a serving bare name names one deployment or adapter
			provider, model = "local-openai", dest
		}
		p, _ = lookupProvider(provider)
	case !known:
		fix := "NAME"
		if checkAlias(name) == nil {
			fix = name
		}
		e := refuse("alias_unknown", "model %q is not a declared alias, a selector, best or a canonical route of a known provider; "+
			"declare it: brama routes set %s ROUTE, or a prefix alias for a family: brama routes set 'claude-*' 'anthropic/*'", truncateUTF8(name, 200), fix)
		e.Details = &aliasDetails{Alias: name, State: stateNoRoute}
		return resolution{}, e
	}
	res := resolution{Mode: modeDirect, Alias: alias, Route: p.id + "/" + model, Provider: p, Model: model}
	switch {
	case p.cred == credSubscription:
		res.Mode = modeSubscription
	case alias != "":
		res.Mode = modeAlias
	}
	if p.cred == credNone { // local-openai needs the deployment the model names, for its endpoint
		d, upstream, n := doc.lookupLocal(model)
		if n != 1 {
			return resolution{}, refuse("invalid_request", "model %q names no single deployment or adapter in the route registry", truncateUTF8(res.Route, 200))
		}
		res.Model, res.BaseURL = upstream, d.baseURL()
	}
	return res, nil
}
