package main

import (
	"fmt"
	"strings"
)

// Alias states (SPEC §4.3) and what a request's `model` names (SPEC §5).

// Alias states of SPEC §4.3.
const (
	stateServing          = "serving"
	stateNoRoute          = "no_route"
	stateCapabilityAbsent = "capability_absent"
	stateRoutesInvalid    = "routes_file_invalid"
)

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

// aliasState is the SPEC §4.3 state of a declared alias whose destination
// is dest, with a one-sentence reason. hasDirect reports whether a direct
// credential exists for a provider (nil: none does).
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
	default:
		return stateCapabilityAbsent, fmt.Sprintf("No direct %s credential is configured.", p.id)
	}
}

// aliases lists every declared alias with its state, route and reason, and
// counts those that cannot serve. A registry that cannot be read is an
// error: the caller reports it rather than an empty table.
func (r *registry) aliases(hasDirect func(provider string) bool) (aliasTable, error) {
	doc, err := r.current()
	if err != nil {
		return aliasTable{Aliases: []aliasRow{}}, err
	}
	t := aliasTable{Aliases: make([]aliasRow, 0, len(doc.Routes))}
	for _, alias := range sortedKeys(doc.Routes) {
		dest := doc.Routes[alias]
		st, reason := aliasState(doc, dest, hasDirect)
		t.Aliases = append(t.Aliases, aliasRow{Alias: alias, State: st, Route: &dest, Reason: reason})
		if st != stateServing {
			t.Unserviceable++
		}
	}
	return t, nil
}

// Routing modes (SPEC §5.3): what a request's model resolved to decides who
// pays and how many attempts it may make.
const (
	modeAny          = "any"
	modeAnyVision    = "any-vision-capable"
	modeBest         = "best"
	modeSubscription = "subscription"
	modeAlias        = "alias"
	modeDirect       = "direct"
)

// resolution is what a request's model names (SPEC §5.1) and the path it
// takes (SPEC §5.3).
type resolution struct {
	Mode     string
	Alias    string       // set when reached through an alias
	Route    string       // canonical "provider/model"; "" for selectors and best
	Provider providerInfo // zero for selectors and best
	Model    string       // upstream model name (local-openai: the deployment's model or the adapter's name)
	BaseURL  string       // local-openai only: "http://host:port/v1"
}

// resolveModel applies SPEC §5.1 (first match) to name and picks the §5.3
// routing mode. doc is the registry; docErr says it is invalid, and then
// every name that could be an alias is refused with state
// routes_file_invalid, while selectors, best and canonical routes of known
// providers still resolve. A body with billingTarget (hasBillingTarget)
// makes a route a subscription route. Refusals are made before dispatch
// and so carry no attempts.
func resolveModel(name string, doc *routesDoc, docErr error, hasDirect func(string) bool, hasBillingTarget bool) (resolution, error) {
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
	if docErr != nil {
		if p, model, ok := knownCanonical(name); ok && checkModelName(model) == nil && p.cred != credNone {
			return canonicalResolution(doc, p, model, hasBillingTarget, false)
		}
		e := refuse("alias_unserviceable", "model %q cannot be resolved: the route registry is invalid: %v", truncateUTF8(name, 200), docErr)
		e.Details = &aliasDetails{Alias: name, State: stateRoutesInvalid}
		return resolution{}, e.because(docErr)
	}
	if dest, ok := doc.Routes[name]; ok {
		if st, reason := aliasState(doc, dest, hasDirect); st != stateServing {
			e := refuse("alias_unserviceable", "alias %q cannot serve: %s", name, reason)
			e.Details = &aliasDetails{Alias: name, State: st, Route: &dest}
			return resolution{}, e
		}
		if dest == modeBest {
			return resolution{Mode: modeBest, Alias: name}, nil
		}
		p, model, ok := knownCanonical(dest)
		if !ok { // a bare name: serving means it names one deployment or adapter
			p, _ = lookupProvider("local-openai")
			model = dest
		}
		res, err := canonicalResolution(doc, p, model, hasBillingTarget, true)
		res.Alias = name
		return res, err
	}
	if p, model, ok := knownCanonical(name); ok {
		if err := checkModelName(model); err != nil {
			return resolution{}, refuse("invalid_request", "model %q is not a canonical route: the model %v", truncateUTF8(name, 200), err)
		}
		return canonicalResolution(doc, p, model, hasBillingTarget, false)
	}
	e := refuse("alias_unknown", "model %q is not a declared alias, a selector, best or a canonical route of a known provider", truncateUTF8(name, 200))
	e.Details = &aliasDetails{Alias: name, State: stateNoRoute}
	return resolution{}, e
}

// knownCanonical splits name at its first "/" when the part before it is a
// provider Brama knows (SPEC §5.1 rule 4); the model part is not checked.
func knownCanonical(name string) (providerInfo, string, bool) {
	provider, model, ok := strings.Cut(name, "/")
	if !ok || !providerPattern.MatchString(provider) {
		return providerInfo{}, "", false
	}
	p, known := lookupProvider(provider)
	return p, model, known
}

// canonicalResolution resolves provider p and model (SPEC §5.3 rows 3-5);
// viaAlias marks a route reached through an alias. local-openai needs the
// deployment the model names, for its endpoint.
func canonicalResolution(doc *routesDoc, p providerInfo, model string, hasBillingTarget, viaAlias bool) (resolution, error) {
	res := resolution{Mode: modeDirect, Route: p.id + "/" + model, Provider: p, Model: model}
	switch {
	case p.cred == credSubscription || hasBillingTarget:
		res.Mode = modeSubscription
	case viaAlias:
		res.Mode = modeAlias
	}
	if p.cred == credNone {
		d, upstream, n := doc.lookupLocal(model)
		if n != 1 {
			return resolution{}, refuse("invalid_request", "model %q names no single deployment or adapter in the route registry", truncateUTF8(res.Route, 200))
		}
		res.Model, res.BaseURL = upstream, d.baseURL()
	}
	return res, nil
}
