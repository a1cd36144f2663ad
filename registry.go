package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
)

// The route registry (SPEC §4): document, guards, cached read, writes, migrate, alias states, resolution (§5).

const (
	registryRole        = "route registry" // names the file in guard errors
	maxRegistryBytes    = 1 << 20
	maxDestinationBytes = 512 // a destination, and the model of a canonical route (§4.1, §5.1)
)

var (
	aliasPattern    = regexp.MustCompile(`^([a-z0-9._/-]{1,128}|[a-z0-9._-]{1,128}\*)$`) // exact, or a prefix alias
	namePattern     = regexp.MustCompile(`^[a-z0-9._-]{1,128}$`)                         // deployments and adapters
	providerPattern = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)
	cgnatPrefix     = netip.MustParsePrefix("100.64.0.0/10")
)

// Routing modes (SPEC §5.3) and alias states (SPEC §4.3).
const (
	modeAny, modeAnyVision, modeBest, modeSubscription, modeAlias, modeDirect = "any", "any-vision-capable", "best", "subscription", "alias", "direct"
	stateServing, stateNoRoute, stateCapabilityAbsent, stateRoutesInvalid     = "serving", "no_route", "capability_absent", "routes_file_invalid"
)

// routesDoc is one schema-1 registry document; a parsed one has non-nil Deployments and Routes, and is shared: read only.
type routesDoc struct {
	SchemaVersion int               `json:"schema_version"`
	Deployments   []deployment      `json:"deployments"`
	Routes        map[string]string `json:"routes"`
}

// deployment is a local OpenAI-compatible server; a bare destination naming it or an adapter routes there.
type (
	deployment struct {
		Name     string             `json:"name"`
		Endpoint deploymentEndpoint `json:"endpoint"`
		Model    string             `json:"model,omitempty"`    // upstream model name; "" means Name
		Adapters []adapter          `json:"adapters,omitempty"` // never empty-but-non-nil after parseRegistry
	}
	deploymentEndpoint struct {
		Host string `json:"host"`
		Port int    `json:"port"`
	}
	adapter struct {
		Name string `json:"name"`
	}
)

func emptyRoutesDoc() *routesDoc {
	return &routesDoc{SchemaVersion: 1, Deployments: []deployment{}, Routes: map[string]string{}}
}

// encodeRegistry is the one canonical encoding every writer commits (sorted routes, [] and {} when empty): migrate is idempotent.
func encodeRegistry(d *routesDoc) []byte {
	out := emptyRoutesDoc()
	out.Deployments = append(out.Deployments, d.Deployments...)
	maps.Copy(out.Routes, d.Routes)
	b, _ := marshalState(out) // strings and ints always marshal
	return b
}

// routesInvalidError says why a registry document is refused; safe to show an operator.
type routesInvalidError struct{ error }

func invalidf(format string, args ...any) error {
	return &routesInvalidError{fmt.Errorf(format, args...)}
}

// parseRegistry reads a document under SPEC §4.1's guards; an unknown provider passes (capability_absent): only writers refuse it.
func parseRegistry(b []byte) (*routesDoc, error) {
	doc, _, err := readRegistry(b, false)
	return doc, err
}

// readRegistry is parseRegistry; to migrate, it drops the top-level members schema 1 lacks, and refuses an empty document.
func readRegistry(b []byte, migrate bool) (doc *routesDoc, dropped []string, err error) {
	blank := len(bytes.Trim(b, " \t\r\n")) == 0 // JSON's whitespace, not Unicode's
	var top map[string]json.RawMessage
	if len(b) > maxRegistryBytes { // SPEC §4.1
		return emptyRoutesDoc(), nil, invalidf("registry is %d bytes; the limit is 1 MiB (%d bytes)", len(b), maxRegistryBytes)
	} else if blank && !migrate {
		return emptyRoutesDoc(), nil, nil
	}
	var te *json.UnmarshalTypeError
	switch err := decodeStrict("registry", b, &top); {
	case blank:
		return nil, nil, invalidf("registry is empty; there is no document to migrate")
	case utf8.Valid(b) && !json.Valid(b):
		return nil, nil, invalidf("registry is not valid JSON: %v", json.Unmarshal(b, new(any)))
	case err == nil && top == nil || errors.As(err, &te):
		return nil, nil, invalidf("registry must be one JSON object")
	case err != nil:
		return nil, nil, invalidf("%s", clipName(err.Error()))
	}
	known := func(k string) bool { return k == "schema_version" || k == "deployments" || k == "routes" }
	dropped = slices.DeleteFunc(append([]string{}, slices.Sorted(maps.Keys(top))...), known)
	if len(dropped) > 0 && !migrate {
		return nil, nil, invalidf("registry field %s is not part of schema 1; run brama routes migrate", strconv.Quote(clipName(dropped[0])))
	}
	maps.DeleteFunc(top, func(k string, _ json.RawMessage) bool { return !known(k) })
	b, _ = json.Marshal(top) // raw members always marshal
	doc = emptyRoutesDoc()
	switch err := decodeStrict("registry", b, doc); {
	case errors.As(err, &te):
		return nil, nil, invalidf("registry field %q cannot be %s (see SPEC §4.1; a destination is one string)", te.Field, clipName(te.Value))
	case errors.As(err, new(*routesInvalidError)):
		return nil, nil, err
	case err != nil:
		return nil, nil, invalidf("%s", clipName(err.Error()))
	}
	// The typed decode takes null, and a model's "", for absent; schema 1 refuses them.
	var deps []struct{ Name, Model, Adapters json.RawMessage }
	json.Unmarshal(top["deployments"], &deps) // decodeStrict took these bytes
	if string(top["schema_version"]) == "null" {
		return nil, nil, invalidf(`registry field "schema_version" must be 1, not null`)
	}
	for _, d := range deps {
		if m := string(d.Model); m == "null" || m == `""` || string(d.Adapters) == "null" {
			return nil, nil, invalidf(`registry deployment %s member "model" must be a non-empty string, and "adapters" an array, when present`, clipName(string(d.Name)))
		}
	}
	return doc, dropped, nil
}

// validate applies SPEC §4.1's guards to a decoded document; decodeStrict calls it.
func (doc *routesDoc) validate() error {
	switch {
	case doc.SchemaVersion != 1:
		return invalidf(`registry field "schema_version" must be 1, not %d`, doc.SchemaVersion)
	case doc.Deployments == nil:
		return invalidf(`registry field "deployments" must be an array of deployments, not null`)
	case doc.Routes == nil:
		return invalidf(`registry field "routes" must be an object mapping each alias to one destination, not null`)
	}
	for i := range doc.Deployments {
		if err := checkDeployment(&doc.Deployments[i], doc.Deployments[:i]); err != nil {
			return err
		}
	}
	for _, alias := range slices.Sorted(maps.Keys(doc.Routes)) {
		if err := checkRoute(doc, alias, doc.Routes[alias]); err != nil {
			return err
		}
	}
	return nil
}

// rule is one guard of a table: when bad, why (a format over the table's arguments) refuses the document.
type rule struct {
	bad bool
	why string
}

// firstBroken is the refusal of the first broken rule, formatted with args, or nil.
func firstBroken(rules []rule, args ...any) error {
	if i := slices.IndexFunc(rules, func(r rule) bool { return r.bad }); i >= 0 && len(args) > 0 {
		return invalidf(rules[i].why, args...)
	} else if i >= 0 {
		return invalidf("%s", rules[i].why) // already formatted
	}
	return nil
}

// checkDeployment guards d, declared after before; its endpoint must never point unauthenticated calls at the internet.
func checkDeployment(d *deployment, before []deployment) error {
	if len(d.Adapters) == 0 {
		d.Adapters = nil // [] and absent are one document
	}
	for _, a := range d.Adapters {
		if !namePattern.MatchString(a.Name) {
			return invalidf("registry deployment %q adapter %q: an adapter name must match [a-z0-9._-]{1,128}", clipName(d.Name), clipName(a.Name))
		}
	}
	addr, err := netip.ParseAddr(d.Endpoint.Host)
	return firstBroken([]rule{ // arguments: name, host, port, model
		{!namePattern.MatchString(d.Name), "registry deployment %[1]q: a deployment name must match [a-z0-9._-]{1,128}"},
		{slices.ContainsFunc(before, func(o deployment) bool { return o.Name == d.Name }), "registry deployment %[1]q is declared twice; deployment names must be unique"},
		{err != nil || !addr.Is4() || !(addr.IsLoopback() || cgnatPrefix.Contains(addr)), "registry deployment %[1]q: endpoint host %[2]q is not an IPv4 loopback or 100.64.0.0/10 literal"},
		{d.Endpoint.Port < 1 || d.Endpoint.Port > 65535, "registry deployment %[1]q: endpoint port %[3]d is not a port (1-65535)"},
		{d.Model != "" && !validModel(d.Model), "registry deployment %[1]q: model %[4]q is not 1-512 bytes without control characters"},
	}, clipName(d.Name), clipName(d.Endpoint.Host), d.Endpoint.Port, clipName(d.Model))
}

// validModel is §5.1's rule for a canonical route's model, and a deployment's.
func validModel(m string) bool {
	return m != "" && len(m) <= maxDestinationBytes && strings.IndexFunc(m, unicode.IsControl) < 0
}

// checkAlias is the alias guard of SPEC §4.1; no alias may shadow a selector.
func checkAlias(alias string) error {
	return firstBroken([]rule{
		{!aliasPattern.MatchString(alias), "registry alias %q must match [a-z0-9._/-]{1,128}, or [a-z0-9._-]{1,128} then * for a prefix alias"},
		{alias == modeAny || alias == modeAnyVision, "registry alias %q is a selector name and cannot be declared"},
	}, clipName(alias))
}

// checkRoute applies §4.1's guards to one route; an unknown provider passes.
func checkRoute(doc *routesDoc, alias, dest string) error {
	if err := checkAlias(alias); err != nil {
		return err
	}
	provider, model, canonical := strings.Cut(dest, "/")
	local := !canonical && dest != modeBest // a deployment or adapter
	_, _, n := doc.lookupLocal(dest)
	return firstBroken([]rule{ // arguments: alias, destination, its length, n
		{dest == "", "registry route %[1]q: the destination is empty"},
		{!utf8.ValidString(dest), "registry route %[1]q: the destination is not valid UTF-8"},
		{len(dest) > maxDestinationBytes, "registry route %[1]q: the destination is %[3]d bytes; the limit is 512"},
		{dest != strings.TrimSpace(dest), "registry route %[1]q: destination %[2]q has leading or trailing space"},
		{strings.Contains(dest, "*") && !(strings.HasSuffix(alias, "*") && canonical && model == "*"),
			`registry route %[1]q: destination %[2]q contains "*"; only a prefix alias (ending in *) may route to <provider>/*`},
		{strings.IndexFunc(dest, unicode.IsControl) >= 0, "registry route %[1]q: destination %[2]q contains a control character"},
		{dest == modeBest && alias == modeBest, "registry route %[1]q must name a canonical route (provider/model), not best"},
		{canonical && !providerPattern.MatchString(provider), "registry route %[1]q: destination %[2]q is not a canonical route: the provider must match [a-z0-9._-]{1,64}"},
		{canonical && model == "", "registry route %[1]q: destination %[2]q is not a canonical route: the model is empty"},
		{canonical && alias == modeBest && provider == "local-openai", // best is paid by subscriptions
			"registry route %[1]q must name a canonical route of a subscription-capable provider, not deployment %[2]q"},
		{local && alias == modeBest, "registry route %[1]q must name a canonical route (provider/model), not deployment %[2]q"},
		{local && n == 0, "registry route %[1]q: destination %[2]q names no deployment or adapter"},
		{local && n > 1, "registry route %[1]q: destination %[2]q names %[4]d deployments or adapters; a bare name must name exactly one"},
	}, clipName(alias), dest, len(dest), n)
}

// match is name's exact alias's destination, else the longest prefix alias's, <provider>/* as <provider>/name (SPEC §5.1);
// a name with "/" or "*" matches no prefix alias: "o*" must not take over openai/….
func (doc *routesDoc) match(name string) (dest string, ok bool) {
	if dest, ok = doc.Routes[name]; ok && !strings.HasSuffix(name, "*") {
		return dest, true
	}
	if strings.ContainsAny(name, "/*") || !validModel(name) {
		return "", false
	}
	longest := ""
	for alias, d := range doc.Routes {
		if prefix, ok := strings.CutSuffix(alias, "*"); ok && len(alias) > len(longest) && strings.HasPrefix(name, prefix) {
			longest, dest = alias, d
		}
	}
	if provider, ok := strings.CutSuffix(dest, "/*"); ok {
		dest = provider + "/" + name
	}
	return dest, longest != ""
}

// lookupLocal finds the deployment or adapter a bare name means, its upstream model, and how many carry it.
func (doc *routesDoc) lookupLocal(name string) (dep deployment, upstream string, n int) {
	for _, d := range doc.Deployments {
		if d.Name == name {
			dep, upstream, n = d, cmp.Or(d.Model, d.Name), n+1
		}
		for _, a := range d.Adapters {
			if a.Name == name {
				dep, upstream, n = d, a.Name, n+1
			}
		}
	}
	return dep, upstream, n
}

// baseURL is the deployment's OpenAI-compatible endpoint (SPEC §4.1).
func (d deployment) baseURL() string {
	return "http://" + net.JoinHostPort(d.Endpoint.Host, strconv.Itoa(d.Endpoint.Port)) + "/v1"
}

// clipName shortens a name before an error quotes it: the reason is logged and may reach a client.
func clipName(s string) string {
	if len(s) <= 128 {
		return s
	}
	return truncateUTF8(s, 128) + "…"
}

// registryPath is BRAMA_ROUTES_FILE, else $STATE/routes.json, else the *noStateError (SPEC §2.1).
func registryPath(st state, getenv func(string) string) (string, error) {
	return st.fileOrState(getenv, "BRAMA_ROUTES_FILE", registryRole, "routes.json")
}

// registry is the registry file, read cached by file identity (SPEC §4.2), written under its lock (§4.4).
type registry struct {
	stateFile[*routesDoc] // path "" when pathErr is set; keeps a parse failure
	j                     *journal
	log                   *slog.Logger
	writeMu               sync.Mutex   // serializes writes within this process
	logMu                 sync.Mutex   // held by current, guards lastLogged
	lastLogged            string       // the failure last logged as inference_routes_invalid
	parses                atomic.Int32 // files parsed so far; lets tests prove an unchanged file costs none
}

func newRegistry(path string, pathErr error, j *journal, log *slog.Logger) *registry {
	r := &registry{j: j, log: log}
	r.stateFile = stateFile[*routesDoc]{role: registryRole, path: path, pathErr: pathErr,
		keepErr: true, parse: func(b []byte) (*routesDoc, error) {
			if b != nil { // nil: the file is absent
				r.parses.Add(1)
			}
			return parseRegistry(b)
		}}
	return r
}

// current returns the shared document; each distinct failure is logged once.
func (r *registry) current() (*routesDoc, error) {
	if r.pathErr != nil {
		return emptyRoutesDoc(), nil
	}
	r.logMu.Lock()
	defer r.logMu.Unlock()
	doc, err := r.load()
	if err == nil {
		r.lastLogged = ""
		return doc, nil
	} else if reason := err.Error(); reason != r.lastLogged {
		r.log.Warn("inference_routes_invalid", "reason", reason)
		r.lastLogged = reason
	}
	return nil, err
}

// set points alias at destination (SPEC §4.4); by is the client id or "cli".
func (r *registry) set(alias, destination, by string) (*routesDoc, error) {
	if err := checkAlias(alias); err != nil {
		return nil, refuse("invalid_request", "%v", err)
	}
	dest := strings.TrimSpace(destination)
	return r.write(alias, &dest, by)
}

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
			return nil, withAlias(refuse("alias_unknown", "alias %q is not declared in the route registry", alias), alias, stateNoRoute, nil)
		case to == nil:
			delete(doc.Routes, alias)
			return &rec, nil
		}
		err := checkRoute(doc, alias, *to)
		// Every credential assumed, capability_absent is an unknown provider or deployment: writers refuse it.
		if st, reason := aliasState(doc, *to, func(string) bool { return true }); err == nil && st != stateServing {
			err = fmt.Errorf("registry route %q: %s", alias, reason)
		}
		if err != nil {
			return nil, refuse("invalid_request", "%v", err)
		}
		doc.Routes[alias] = *to
		return &rec, nil
	})
}

// setDeployment declares d or removes d.Name; an alias still routed to it keeps it. Nothing is journaled.
func (r *registry) setDeployment(d deployment, remove bool) (*routesDoc, error) {
	return r.commit(func(doc *routesDoc) (*journalRecord, error) {
		n := len(doc.Deployments)
		doc.Deployments = slices.DeleteFunc(doc.Deployments, func(o deployment) bool { return o.Name == d.Name })
		switch {
		case remove && len(doc.Deployments) == n:
			return nil, refuse("invalid_request", "no deployment %q is declared", d.Name)
		case !remove && len(doc.Deployments) != n:
			return nil, refuse("invalid_request", "deployment %q is already declared; rm it first", d.Name)
		case !remove:
			doc.Deployments = append(doc.Deployments, d) // commit re-parses: the reader's own guards
		}
		return nil, nil
	})
}

// commit is SPEC §4.4's read-modify-rename under mutex and flock, journaling change's record after: a failed append is only logged.
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
		staged := encodeRegistry(doc)
		if err := r.j.ready(); rec != nil && err != nil {
			return refuse("dependency_unavailable", "route registry not changed: the journal cannot record it: %v", err).because(err)
		} else if len(staged) > maxRegistryBytes {
			return refuse("state_conflict", "the route registry would be %d bytes; the limit is 1 MiB (%d bytes)", len(staged), maxRegistryBytes)
		}
		if committed, err = parseRegistry(staged); err != nil {
			return refuse("invalid_request", "route registry not changed: %v", err).because(err)
		}
		if err := writeFileAtomic(r.path, staged); err != nil {
			return refuse("internal_error", "route registry not changed: %v", err).because(err)
		}
		if rec != nil { // journaled under the flock, so records follow the renames
			if err := r.j.append(*rec); err != nil {
				r.log.Error("journal_append_failed", "kind", rec.Kind, "alias", rec.Alias, "cause", err.Error())
			}
		}
		return nil
	})
	if err != nil && !errors.As(err, new(*apiError)) { // change's refusals come back as they are
		err = refuse("internal_error", "route registry lock: %v", err).because(err)
	}
	return committed, err // callers read err first
}

// migrateRegistry is `brama routes migrate` (SPEC §4.4): drop what schema 1 lacks, commit the rest.
func migrateRegistry(path string) (committed []byte, dropped []string, doc *routesDoc, err error) {
	if _, err := guardFile(registryRole, path); err != nil {
		return nil, nil, nil, err // before the lock: an absent file gets no lock file either
	}
	err = withFileLock(path, func() error {
		f := stateFile[*routesDoc]{role: registryRole, path: path, absentErr: true,
			parse: func(b []byte) (d *routesDoc, err error) { d, dropped, err = readRegistry(b, true); return d, err }}
		if doc, err = f.fresh(); err != nil {
			return err
		}
		committed = encodeRegistry(doc)
		return writeFileAtomic(path, committed)
	})
	return committed, dropped, doc, err // callers read err first
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

// aliasState is the SPEC §4.3 state of an alias routed to dest, and its reason.
func aliasState(doc *routesDoc, dest string, hasDirect func(provider string) bool) (st, reason string) {
	if dest == modeBest {
		return stateServing, "Routes to best: the operator's preferred subscription route, then the agent's other subscription models."
	}
	p, model, ok := destProvider(dest)
	switch d, _, n := doc.lookupLocal(model); {
	case !ok:
		return stateCapabilityAbsent, fmt.Sprintf("Provider %q is not one Brama knows.", p.id)
	case p.cred == credNone && n != 1:
		return stateCapabilityAbsent, fmt.Sprintf("No single deployment or adapter named %q is declared.", model)
	case p.cred == credNone:
		return stateServing, fmt.Sprintf("Served by local deployment %q at %s.", d.Name, d.baseURL())
	case p.cred == credSubscription:
		return stateServing, fmt.Sprintf("Paid by the calling agent's %s subscriptions.", p.id)
	case hasDirect != nil && hasDirect(p.id):
		return stateServing, fmt.Sprintf("Paid by the deployment's direct %s credential.", p.id)
	}
	return stateCapabilityAbsent, fmt.Sprintf("No direct %s credential is configured.", p.id)
}

// destProvider is the provider and model dest names, a bare name a local one (SPEC §4.1); an unknown provider's row holds its id.
func destProvider(dest string) (p providerInfo, model string, ok bool) {
	provider, model, canonical := strings.Cut(dest, "/")
	if !canonical {
		provider, model = "local-openai", dest
	}
	if p, ok = lookupProvider(provider); !ok {
		p.id = provider
	}
	return p, model, ok
}

// aliases lists every declared alias with its state; an unreadable registry is an error.
func (r *registry) aliases(hasDirect func(provider string) bool) (aliasTable, error) {
	doc, err := r.current()
	t := aliasTable{Aliases: []aliasRow{}}
	if err != nil {
		return t, err
	}
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

// usableBy is t with only the aliases mayUse allows (SPEC §3.1), counted again.
func (t aliasTable) usableBy(mayUse func(string) bool) aliasTable {
	u := aliasTable{Aliases: []aliasRow{}}
	for _, a := range t.Aliases {
		if mayUse(a.Alias) {
			u.Aliases = append(u.Aliases, a)
			u.Unserviceable += map[bool]int{true: 1}[a.State != stateServing]
		}
	}
	return u
}

// withAlias gives e SPEC §5.2's alias details.
func withAlias(e *apiError, alias, state string, route *string) *apiError {
	e.Details = &aliasDetails{Alias: alias, State: state, Route: route}
	return e
}

// resolution is what a request's model names (SPEC §5.1) and the path it takes (§5.3).
type resolution struct {
	Mode     string
	Alias    string       // set when reached through an alias
	Route    string       // canonical "provider/model"; "" for selectors and best
	Provider providerInfo // zero for selectors and best
	Model    string       // upstream model name (local-openai: the deployment's model or the adapter's name)
	BaseURL  string       // local-openai only: "http://host:port/v1"
}

// resolveModel applies SPEC §5.1 and picks the §5.3 mode; with docErr, only selectors, best and known canonical routes resolve.
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
	doc = cmp.Or(doc, emptyRoutesDoc())
	p, model, known := destProvider(name)                             // §5.1 rule 4: a known provider before the first "/"
	known = known && strings.Contains(name, "/") && validModel(model) // else §5.1 rule 5: never declared
	dest, declared := doc.match(name)
	res, quoted := resolution{Mode: modeDirect}, truncateUTF8(name, 200)
	switch {
	case docErr != nil && known && p.cred != credNone: // needs no registry
		dest = name
	case docErr != nil:
		e := refuse("alias_unserviceable", "model %q cannot be resolved: the route registry is invalid: %v", quoted, docErr)
		return resolution{}, withAlias(e.because(docErr), name, stateRoutesInvalid, nil)
	case declared:
		if st, reason := aliasState(doc, dest, hasDirect); st != stateServing {
			return resolution{}, withAlias(refuse("alias_unserviceable", "alias %q cannot serve: %s", name, reason), name, st, &dest)
		} else if dest == modeBest {
			return resolution{Mode: modeBest, Alias: name}, nil
		}
		res.Mode, res.Alias = modeAlias, name
	case !known:
		fix := map[bool]string{true: name, false: "NAME"}[checkAlias(name) == nil]
		e := refuse("alias_unknown", "model %q is not a declared alias, a selector, best or a canonical route of a known provider; "+
			"declare it: brama routes set %s ROUTE, or a prefix alias for a family: brama routes set 'claude-*' 'anthropic/*'", quoted, fix)
		return resolution{}, withAlias(e, name, stateNoRoute, nil)
	default:
		dest = name
	}
	p, res.Model, _ = destProvider(dest) // a serving destination: a known provider
	res.Provider, res.Route = p, p.id+"/"+res.Model
	switch {
	case p.cred == credSubscription:
		res.Mode = modeSubscription
	case p.cred == credNone: // local-openai needs the deployment the model names, for its endpoint
		d, upstream, n := doc.lookupLocal(res.Model)
		if n != 1 {
			return resolution{}, refuse("invalid_request", "model %q names no single deployment or adapter in the route registry", truncateUTF8(res.Route, 200))
		}
		res.Model, res.BaseURL = upstream, d.baseURL()
	}
	return res, nil
}
