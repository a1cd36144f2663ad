package main

import (
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
)

var (
	aliasPattern    = regexp.MustCompile(`^([a-z0-9._/-]{1,128}|[a-z0-9._-]{1,128}\*)$`) // exact, or a prefix alias
	namePattern     = regexp.MustCompile(`^[a-z0-9._-]{1,128}$`)                         // deployments and adapters
	providerPattern = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)
	cgnatPrefix     = netip.MustParsePrefix("100.64.0.0/10") // with loopback, where a deployment may listen
)

// The registry's limits (SPEC §4.1: a destination's, and a canonical route's model's, is 512 bytes), routing modes (§5.3),
// alias states (§4.3), a client's roles (§3.1) and the 401 of a token no client holds; registryRole names the file in errors.
const (
	registryRole, maxRegistryBytes, maxDestinationBytes                       = "route registry", 1 << 20, 512
	modeAny, modeAnyVision, modeBest, modeSubscription, modeAlias, modeDirect = "any", "any-vision-capable", "best", "subscription", "alias", "direct"
	stateServing, stateNoRoute, stateCapabilityAbsent, stateRoutesInvalid     = "serving", "no_route", "capability_absent", "routes_file_invalid"
	roleAdmin, roleCaller, notAClient                                         = "admin", "caller", "this token is not one of this gateway's clients"
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

// client is one bearer-token holder (SPEC §3.1), kept in clients.json (clientsDoc); only the token's SHA-256 is kept.
type (
	client struct {
		ID            string   `json:"id"`
		TokenSHA256   string   `json:"token_sha256"`
		Role          string   `json:"role"`
		AgentID       string   `json:"agent_id,omitempty"`
		AllowedModels []string `json:"allowed_models,omitzero"` // [] allows no model, nil any (absent, or null)
	}
	clientsDoc struct {
		Clients []client `json:"clients"` // nil: there is no clients file
	}
)

func emptyRoutesDoc() *routesDoc {
	return &routesDoc{SchemaVersion: 1, Deployments: []deployment{}, Routes: map[string]string{}}
}

// encodeRegistry is the one canonical encoding every writer commits (of a parsed document: sorted routes, [] and {} when
// empty): migrate is idempotent.
func encodeRegistry(d *routesDoc) []byte { return must(marshalState(d)) }

func parseRegistry(b []byte) (*routesDoc, error) { return readRegistry(b, nil) }
func clipName(s string) string                   { return truncateUTF8(s, 128) } // a quoted name is logged and may reach a client

// readRegistry applies SPEC §4.1's guards (writers refuse an unknown provider) with decodeStrict's texts, cut (they may quote
// a key); migrating, it drops the fields schema 1 lacks into dropped. A member null (or a model "") is refused: the typed
// decode takes it for absent. Every refusal is safe to show an operator.
func readRegistry(b []byte, dropped *[]string) (*routesDoc, error) {
	var top map[string]json.RawMessage
	if blank := strings.Trim(string(b), " \t\r\n") == ""; len(b) > maxRegistryBytes { // JSON's whitespace, not Unicode's
		return nil, fmt.Errorf("registry is %d bytes; the limit is 1 MiB (%d bytes)", len(b), maxRegistryBytes) // SPEC §4.1
	} else if blank && dropped == nil {
		return emptyRoutesDoc(), nil
	} else if blank {
		return nil, errors.New("registry is empty; there is no document to migrate")
	}
	if err := decodeStrict("registry", b, &top); err != nil {
		return nil, errors.New(truncateUTF8(err.Error(), maxMessageBytes))
	} else if top == nil {
		return nil, errors.New("registry must be one JSON object, not null")
	}
	known := func(k string) bool { return k == "schema_version" || k == "deployments" || k == "routes" }
	unknown := slices.DeleteFunc(slices.Sorted(maps.Keys(top)), known)
	if len(unknown) > 0 && dropped == nil {
		return nil, fmt.Errorf("registry field %q is not part of schema 1; run brama routes migrate", clipName(unknown[0]))
	} else if dropped != nil {
		*dropped = unknown
	}
	maps.DeleteFunc(top, func(k string, _ json.RawMessage) bool { return !known(k) })
	doc := emptyRoutesDoc()
	if err := decodeStrict("registry", must(json.Marshal(top)), doc); err != nil { // and validate
		return nil, errors.New(truncateUTF8(err.Error(), maxMessageBytes))
	}
	var deps []map[string]json.RawMessage
	json.Unmarshal(top["deployments"], &deps) // decodeStrict took these bytes: their members are known
	for _, members := range append(deps, top) {
		for _, k := range slices.Sorted(maps.Keys(members)) {
			if v := string(members[k]); v == "null" || k == "model" && v == `""` {
				return nil, fmt.Errorf("registry member %q cannot be %s", k, v)
			}
		}
	}
	return doc, nil
}

// validate applies SPEC §4.1's guards to a decoded document, refusing with the first broken one: a deployment's endpoint
// must never point unauthenticated calls at the internet, and no alias may shadow a selector.
func (doc *routesDoc) validate() error {
	var errs []error
	for i := range doc.Deployments {
		d := &doc.Deployments[i]
		d.Adapters = append([]adapter(nil), d.Adapters...) // [] and absent are one document: nil
		for _, a := range d.Adapters {
			errs = append(errs, firstBroken([]rule{{!namePattern.MatchString(a.Name),
				"registry deployment %q adapter %q: an adapter name must match [a-z0-9._-]{1,128}"}}, clipName(d.Name), clipName(a.Name)))
		}
		addr, err := netip.ParseAddr(d.Endpoint.Host)
		errs = append(errs, firstBroken([]rule{ // arguments: name, host, port, model
			{!namePattern.MatchString(d.Name), "registry deployment %[1]q: a deployment name must match [a-z0-9._-]{1,128}"},
			{slices.ContainsFunc(doc.Deployments[:i], func(o deployment) bool { return o.Name == d.Name }), "registry deployment %[1]q is declared twice; deployment names must be unique"},
			{err != nil || !addr.Is4() || !(addr.IsLoopback() || cgnatPrefix.Contains(addr)), "registry deployment %[1]q: endpoint host %[2]q is not an IPv4 loopback or 100.64.0.0/10 literal"},
			{d.Endpoint.Port < 1 || d.Endpoint.Port > 65535, "registry deployment %[1]q: endpoint port %[3]d is not a port (1-65535)"},
			{d.Model != "" && !validModel(d.Model), "registry deployment %[1]q: model %[4]q is not 1-512 bytes without control characters"},
		}, clipName(d.Name), clipName(d.Endpoint.Host), d.Endpoint.Port, clipName(d.Model)))
	}
	for _, alias := range slices.Sorted(maps.Keys(doc.Routes)) {
		dest := doc.Routes[alias]
		provider, model, canonical := strings.Cut(dest, "/")
		local := !canonical && dest != modeBest // a deployment or adapter
		_, _, n := doc.lookupLocal(dest)
		errs = append(errs, firstBroken([]rule{ // arguments: alias, destination (no longer than a valid one), n
			{!aliasPattern.MatchString(alias), "registry alias %[1]q must match [a-z0-9._/-]{1,128}, or [a-z0-9._-]{1,128} then * for a prefix alias"},
			{alias == modeAny || alias == modeAnyVision, "registry alias %[1]q is a selector name and cannot be declared"},
			{!validModel(dest) || !utf8.ValidString(dest) || dest != strings.TrimSpace(dest),
				"registry route %[1]q: destination %[2]q is not 1-512 bytes of UTF-8 without control characters or surrounding space"},
			{strings.Contains(dest, "*") && !(strings.HasSuffix(alias, "*") && canonical && model == "*"),
				`registry route %[1]q: destination %[2]q contains "*"; only a prefix alias (ending in *) may route to <provider>/*`},
			{canonical && (!providerPattern.MatchString(provider) || model == ""), "registry route %[1]q: destination %[2]q is not a canonical route: the provider must match [a-z0-9._-]{1,64} and the model be non-empty"},
			{alias == modeBest && (dest == modeBest || local || provider == "local-openai"), // best is paid by subscriptions
				"registry route %[1]q must name a canonical route of a subscription-capable provider, not %[2]q"},
			{local && n != 1, "registry route %[1]q: destination %[2]q names %[3]d deployments or adapters; a bare name must name exactly one"},
		}, clipName(alias), truncateUTF8(dest, maxDestinationBytes), n))
	}
	return cmp.Or(errs...)
}

// validate applies SPEC §3.1's rules, naming the first one a client breaks (decodeStrict and every write call it).
func (doc *clientsDoc) validate() error {
	for i, c := range doc.Clients {
		if err := firstBroken([]rule{
			{!idPattern.MatchString(c.ID), "id must match [a-z0-9-]{1,64}"},
			{slices.ContainsFunc(doc.Clients[:i], func(o client) bool { return o.ID == c.ID }), "duplicate client id"},
			{!isHexDigest(c.TokenSHA256), "token_sha256 must be 64 lower-case hex characters"},
			{slices.ContainsFunc(doc.Clients[:i], func(o client) bool { return o.TokenSHA256 == c.TokenSHA256 }), "duplicate token digest"},
			{c.Role != roleAdmin && c.Role != roleCaller, "role must be admin or caller"},
			{c.AgentID != "" && !idPattern.MatchString(c.AgentID), "agent_id must match [a-z0-9-]{1,64}"},
			{slices.ContainsFunc(c.AllowedModels, func(m string) bool { return strings.TrimSpace(m) == "" || strings.Contains(m, "*") }),
				"allowed_models entries must be exact names (no empty or wildcard entry)"},
		}); err != nil {
			return fmt.Errorf("clients file: client %d (%q): %v", i, c.ID, err)
		}
	}
	return nil
}

// rule is one guard of a table: when bad, why (a format over the table's arguments) refuses the document.
type rule struct {
	bad bool
	why string
}

// firstBroken is the refusal of the first broken rule, its why formatted with args; with none, why is the text as it
// stands (it may quote a name holding a %).
func firstBroken(rules []rule, args ...any) error {
	if i := slices.IndexFunc(rules, func(r rule) bool { return r.bad }); i >= 0 && len(args) == 0 {
		return errors.New(rules[i].why)
	} else if i >= 0 {
		return fmt.Errorf(rules[i].why, args...)
	}
	return nil
}

// validModel is §5.1's rule for a canonical route's model, and a deployment's.
func validModel(m string) bool {
	return m != "" && len(m) <= maxDestinationBytes && strings.IndexFunc(m, unicode.IsControl) < 0
}

// match is name's exact alias's destination, else the longest prefix alias's, <provider>/* as <provider>/name (SPEC §5.1);
// a name with "/" or "*" matches no prefix alias: "o*" must not take over openai/…, and is itself no model.
func (doc *routesDoc) match(name string) (dest string, ok bool) {
	if dest, ok = doc.Routes[name]; ok || strings.ContainsAny(name, "/*") || !validModel(name) {
		return dest, ok && !strings.Contains(name, "*") // "claude-*" names a prefix alias, never a model
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
		if slices.Contains(d.Adapters, adapter{name}) { // one deployment's adapters name one route
			dep, upstream, n = d, name, n+1
		}
	}
	return dep, upstream, n
}

// baseURL is the deployment's OpenAI-compatible endpoint (SPEC §4.1); the host is an IPv4 literal, needing no brackets.
func (d deployment) baseURL() string {
	return fmt.Sprintf("http://%s:%d/v1", d.Endpoint.Host, d.Endpoint.Port)
}

// registry is the registry file, read cached by file identity (SPEC §4.2), written under its lock (§4.4).
type registry struct {
	stateFile[*routesDoc]              // with pathErr set (no state directory) path is ""; a parse failure is kept
	j                     *journal     // journals route changes; its logger logs the registry's failures
	lastLogged            atomic.Value // string: the failure last logged as inference_routes_invalid
}

func newRegistry(path string, pathErr error, j *journal) *registry {
	return &registry{j: j, stateFile: stateFile[*routesDoc]{role: registryRole, path: path, pathErr: pathErr,
		parse: parseRegistry, memory: new(emptyRoutesDoc())}} // no state directory: an empty registry
}

// current returns the shared document; each distinct failure is logged once.
func (r *registry) current() (*routesDoc, error) {
	doc, err := r.load()
	if err == nil {
		r.lastLogged.Store("") // the same failure after a repair is logged again
	} else if reason := err.Error(); r.lastLogged.Swap(reason) != reason {
		r.j.log.Warn("inference_routes_invalid", "reason", reason)
	}
	return doc, err
}

// set points alias at *to, or removes it (nil), journaled (SPEC §4.4); with every credential assumed the route must serve.
func (r *registry) set(alias string, to *string, by string) (*routesDoc, error) {
	return r.commit(func(doc *routesDoc) (*journalRecord, error) {
		old, ok := doc.Routes[alias]
		if to == nil && !ok {
			return nil, withAlias(refuse("alias_unknown", "alias %q is not declared in the route registry", alias), alias, stateNoRoute, nil)
		} else if to == nil {
			delete(doc.Routes, alias)
		} else {
			*to = strings.TrimSpace(*to)
			doc.Routes[alias] = *to // commit refuses an invalid document first: its refusal names the guard
			if _, st, reason := doc.destination(*to, func(string) bool { return true }); st != stateServing && doc.validate() == nil {
				return nil, refuse("invalid_request", "registry route %q: %s", alias, reason)
			}
		}
		return &journalRecord{Kind: "route_change", Alias: alias, By: by, routeChange: &routeChange{pick(ok, &old, nil), to}}, nil
	})
}

// setDeployment declares d or removes d.Name (refused while an alias routes to it: commit validates). Nothing is journaled.
func (r *registry) setDeployment(d deployment, remove bool) (*routesDoc, error) {
	return r.commit(func(doc *routesDoc) (*journalRecord, error) {
		n := len(doc.Deployments)
		doc.Deployments = slices.DeleteFunc(doc.Deployments, func(o deployment) bool { return o.Name == d.Name })
		if declared := len(doc.Deployments) < n; declared && !remove {
			return nil, refuse("invalid_request", "deployment %q is already declared; rm it first", d.Name)
		} else if !declared && remove {
			return nil, refuse("invalid_request", "no deployment %q is declared", d.Name)
		} else if !remove {
			doc.Deployments = append(doc.Deployments, d)
		}
		return nil, nil
	})
}

// commit is SPEC §4.4's read-modify-rename under the flock, journaling change's record after it (a failed append is logged).
func (r *registry) commit(change func(doc *routesDoc) (*journalRecord, error)) (doc *routesDoc, err error) {
	if err := r.pathErr; err != nil {
		return nil, refuse("dependency_unavailable", "the route registry cannot be written: %v", err).because(err)
	}
	err = withFileLock(r.path, func() error {
		if doc, _, err = r.read(); err != nil { // parsed just now; nobody else holds it
			return refuse("state_conflict", "the route registry on disk is invalid (repair it or run brama routes migrate): %v", err).because(err)
		}
		rec, err := change(doc)
		staged := encodeRegistry(doc)
		if err != nil {
			return err
		} else if journalErr := r.j.ready(); rec != nil && journalErr != nil {
			return refuse("dependency_unavailable", "route registry not changed: the journal cannot record it: %v", journalErr).because(journalErr)
		} else if len(staged) > maxRegistryBytes {
			return refuse("state_conflict", "the route registry would be %d bytes, over the 1 MiB limit", len(staged))
		} else if invalid := doc.validate(); invalid != nil {
			return refuse("invalid_request", "route registry not changed: %v", invalid).because(invalid)
		}
		if err := writeFileAtomic(r.path, staged); err != nil || rec == nil {
			return err
		}
		if err := r.j.append(*rec); err != nil { // under the flock, so records follow the renames
			r.j.log.Error("journal_append_failed", "kind", rec.Kind, "alias", rec.Alias, "cause", err.Error())
		}
		return nil
	})
	if err != nil && !errors.As(err, new(*apiError)) { // a failed lock or rename; change's refusals come back as they are
		err = refuse("internal_error", "route registry not changed: %v", err).because(err)
	}
	return doc, err // callers read err first
}

// migrateRegistry is `brama routes migrate` (SPEC §4.4): drop what schema 1 lacks, commit the rest under the lock.
func migrateRegistry(path string) (committed []byte, dropped []string, err error) {
	if _, _, err := guardFile(registryRole, path, false); err != nil {
		return nil, nil, err // before the lock: an absent file gets no lock file either
	}
	f := stateFile[*routesDoc]{role: registryRole, path: path, absentErr: true,
		parse: func(b []byte) (*routesDoc, error) { return readRegistry(b, &dropped) }}
	err = f.update(func(doc *routesDoc) error {
		committed = encodeRegistry(doc) // what update writes: marshalState of a parsed document
		return nil
	})
	return committed, dropped, err
}

// aliasRow is one line of GET /v1/aliases and `brama routes list`: an alias refusal's details and a one-sentence reason.
type aliasRow struct {
	aliasDetails
	Reason string `json:"reason"`
}

// aliasTable is the body of GET /v1/aliases (SPEC §4.3).
type aliasTable struct {
	Aliases       []aliasRow `json:"aliases"`
	Unserviceable int        `json:"unserviceable"`
}

// aliases lists the declared aliases mayUse allows (nil: all; SPEC §3.1) with their states; an unreadable registry is an error.
func (r *registry) aliases(hasDirect, mayUse func(string) bool) (aliasTable, error) {
	doc, err := r.current()
	t := aliasTable{Aliases: []aliasRow{}}
	if err != nil {
		return t, err
	}
	for _, alias := range slices.Sorted(maps.Keys(doc.Routes)) {
		dest := doc.Routes[alias]
		_, st, reason := doc.destination(dest, hasDirect)
		if prefix, ok := strings.CutSuffix(alias, "*"); ok {
			reason = fmt.Sprintf("Every name starting with %q that no exact alias declares. %s", prefix, reason)
		}
		if mayUse == nil || mayUse(alias) {
			t.Aliases = append(t.Aliases, aliasRow{aliasDetails{alias, st, &dest}, reason})
			t.Unserviceable += boolCount(st != stateServing)
		}
	}
	return t, nil
}

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

// destination is where dest (best, a canonical route, or a bare local name) leads, with its SPEC §4.3 state and reason:
// the one reading of a destination that alias states, writers and resolution share.
func (doc *routesDoc) destination(dest string, hasDirect func(provider string) bool) (res resolution, st, reason string) {
	if dest == modeBest {
		return resolution{Mode: modeBest}, stateServing, "Routes to best: the operator's preferred subscription route, then the agent's other subscription models."
	}
	provider, model, canonical := strings.Cut(dest, "/")
	if !canonical {
		provider, model = "local-openai", dest
	}
	p, known := lookupProvider(provider)
	res = resolution{Mode: modeDirect, Route: provider + "/" + model, Provider: p, Model: model}
	if d, upstream, n := doc.lookupLocal(model); !known {
		return res, stateCapabilityAbsent, fmt.Sprintf("Provider %q is not one Brama knows.", provider)
	} else if p.cred == credNone && n != 1 {
		return res, stateCapabilityAbsent, fmt.Sprintf("No single deployment or adapter named %q is declared.", model)
	} else if p.cred == credNone {
		res.Model, res.BaseURL = upstream, d.baseURL()
		return res, stateServing, fmt.Sprintf("Served by local deployment %q at %s.", d.Name, res.BaseURL)
	} else if p.cred == credSubscription {
		res.Mode = modeSubscription
		return res, stateServing, fmt.Sprintf("Paid by the calling agent's %s subscriptions.", p.id)
	} else if hasDirect != nil && hasDirect(p.id) {
		return res, stateServing, fmt.Sprintf("Paid by the deployment's direct %s credential.", p.id)
	}
	return res, stateCapabilityAbsent, fmt.Sprintf("No direct %s credential is configured.", p.id)
}

// resolveModel applies SPEC §5.1 and picks the §5.3 mode; with docErr, only selectors, best and known canonical routes resolve.
func resolveModel(name string, doc *routesDoc, docErr error, hasDirect func(string) bool) (resolution, error) {
	if name == "" {
		return resolution{}, refuse("invalid_request", "model is required")
	} else if strings.EqualFold(name, modeAny) || strings.EqualFold(name, modeAnyVision) || name == modeBest {
		return resolution{Mode: strings.ToLower(name)}, nil
	}
	provider, model, _ := strings.Cut(name, "/")
	p, known := lookupProvider(provider)
	known = known && validModel(model) // §5.1 rule 4: a known provider before the first "/"; else rule 5: never declared
	doc = cmp.Or(doc, emptyRoutesDoc())
	dest, declared := doc.match(name)
	switch quoted := truncateUTF8(name, 200); {
	case docErr != nil && (!known || p.cred == credNone): // local-openai needs the registry's deployments
		e := refuse("alias_unserviceable", "model %q cannot be resolved: the route registry is invalid: %v", quoted, docErr)
		return resolution{}, withAlias(e.because(docErr), name, stateRoutesInvalid, nil)
	case docErr != nil || !declared && known: // a known provider's canonical route, not read through the registry
		dest, declared = name, false
	case !declared:
		fix := pick(aliasPattern.MatchString(name), name, "NAME")
		e := refuse("alias_unknown", "model %q is not a declared alias, a selector, best or a canonical route of a known provider; "+
			"declare it: brama routes set %s ROUTE, or a prefix alias for a family: brama routes set 'claude-*' 'anthropic/*'", quoted, fix)
		return resolution{}, withAlias(e, name, stateNoRoute, nil)
	}
	res, st, reason := doc.destination(dest, hasDirect)
	switch {
	case declared && st != stateServing:
		return resolution{}, withAlias(refuse("alias_unserviceable", "alias %q cannot serve: %s", name, reason), name, st, new(dest))
	case res.Provider.cred == credNone && res.BaseURL == "": // undeclared: local-openai needs the deployment, for its endpoint
		return resolution{}, refuse("invalid_request", "model %q names no single deployment or adapter in the route registry", truncateUTF8(res.Route, 200))
	case declared && res.Mode == modeDirect:
		res.Mode, res.Alias = modeAlias, name
	case declared:
		res.Alias = name
	}
	return res, nil
}

// mayUse applies allowed_models (SPEC §3.1): none listed, any model.
func (c client) mayUse(model string) bool {
	return c.AllowedModels == nil || slices.Contains(c.AllowedModels, model)
}

// parseClients strictly parses clients.json (decodeStrict validates); nil, no file, is a nil list: serve makes the first.
func parseClients(b []byte) (*clientsDoc, error) {
	if b == nil {
		return &clientsDoc{}, nil
	}
	doc := &clientsDoc{Clients: []client{}}
	if err := decodeStrict("clients file", b, doc); err != nil || doc.Clients != nil {
		return doc, err
	}
	return nil, errors.New(`clients file: member "clients" cannot be null`) // nil means no file: serve would make one
}

// newToken makes a bearer token: "brama_" and 43 base64url characters.
func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return "brama_" + base64.RawURLEncoding.EncodeToString(b)
}

func hexSHA256(b []byte) string { return fmt.Sprintf("%x", sha256.Sum256(b)) }
func isHexDigest(s string) bool { return len(s) == 64 && strings.Trim(s, "0123456789abcdef") == "" }

// clientStore is the clients file (SPEC §2.3), or without a state directory the process's memory.
type clientStore struct{ stateFile[*clientsDoc] }

// authenticate finds token's client, comparing every digest in constant time; a refusal never says whose a token is (SPEC §3.1).
func (c *clientStore) authenticate(token string) (found client, err error) {
	doc, err := c.load()
	if err != nil {
		return found, refuse("unauthenticated", "the clients file is unusable, so no token can be checked (GET /readyz says why)").because(err)
	}
	want := []byte(hexSHA256([]byte(token)))
	for _, cl := range doc.Clients {
		if subtle.ConstantTimeCompare(want, []byte(cl.TokenSHA256)) == 1 {
			found = cl
		}
	}
	if found.ID == "" { // every client has an id
		err = refuse("unauthenticated", notAClient)
	}
	return found, err
}

// ensureFirstClient creates the admin client "local" when no clients file exists (SPEC §3.1; in memory with no state, §2.1).
func ensureFirstClient(c *clientStore, stderr io.Writer) error {
	tok := newToken()
	local, kept, created := client{ID: "local", TokenSHA256: hexSHA256([]byte(tok)), Role: roleAdmin}, "", c.pathErr != nil
	if created {
		c.memory = new(&clientsDoc{Clients: []client{local}})
		kept = fmt.Sprintf(" for this process only (not kept: %v)", c.pathErr)
	} else if doc, err := c.load(); err != nil || doc.Clients != nil {
		return err // a clients file, or one that must be repaired before serving
	} else if err := c.update(func(d *clientsDoc) error {
		if created = d.Clients == nil; created { // still no file under the lock
			d.Clients = []client{local}
		}
		return nil
	}); err != nil || !created {
		return err // a file made meanwhile keeps its clients
	}
	fmt.Fprintf(stderr, "brama: created admin client \"local\"%s; bearer token (shown once): %s\n", kept, tok)
	return nil
}
