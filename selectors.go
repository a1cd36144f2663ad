package main

import (
	"cmp"
	"maps"
	"slices"
	"strings"
)

// candidates lists the routes a selector or best walks, in order (SPEC
// §7.3). Each is a canonical route of a subscription-capable provider.
func (s *server) candidates(res resolution, agent string) ([]resolution, error) {
	doc, err := s.reg.current()
	if err != nil {
		doc = nil // an invalid registry offers no alias candidates
	}
	switch res.Mode {
	case modeBest:
		var out []resolution
		if doc != nil {
			if dest, ok := doc.Routes["best"]; ok {
				if c, ok := canonicalCandidate(dest); ok {
					out = append(out, c)
				}
			}
		}
		more, err := s.anyCandidates(agent, doc, false)
		return dedupeRoutes(append(out, more...)), err
	default:
		return s.anyCandidates(agent, doc, res.Mode == modeAnyVision)
	}
}

// canonicalCandidate turns "provider/model" into a subscription route.
func canonicalCandidate(route string) (resolution, bool) {
	pid, model, ok := strings.Cut(route, "/")
	p, known := lookupProvider(pid)
	if !ok || !known || model == "" || p.cred == credNone {
		return resolution{}, false
	}
	return resolution{Mode: modeSubscription, Route: route, Provider: p, Model: model}, true
}

// anyCandidates: the providers in which the agent has an eligible
// subscription, freest first (ties by provider id), each with its candidate
// models; vision keeps only models the catalogue says take images.
func (s *server) anyCandidates(agent string, doc *routesDoc, vision bool) ([]resolution, error) {
	items, err := s.inv.agentItems(agent)
	if err != nil {
		return nil, err
	}
	type prov struct {
		id      string
		blocked bool
		full    float64
	}
	var provs []prov
	now := s.now()
	for _, it := range items {
		if slices.ContainsFunc(provs, func(p prov) bool { return p.id == it.Provider }) {
			continue
		}
		subs, _, err := s.eligible(agent, it.Provider)
		if err != nil {
			return nil, err
		}
		if len(subs) == 0 {
			continue
		}
		best := s.order(agent, it.Provider, subs)[0]
		provs = append(provs, prov{it.Provider, !s.ledger.blockedUntil(best.ID).IsZero(), s.ledger.fullness(best.ID, now)})
	}
	slices.SortFunc(provs, func(a, b prov) int {
		if a.blocked != b.blocked {
			return boolOrder(a.blocked, b.blocked)
		}
		if c := cmp.Compare(a.full, b.full); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	var out []resolution
	for _, p := range provs {
		for _, m := range s.candidateModels(p.id, doc) {
			if vision && !s.takesImages(p.id, m) {
				continue
			}
			if c, ok := canonicalCandidate(p.id + "/" + m); ok {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// candidateModels of provider P: the model part of every declared alias
// whose destination is a P/… route (alias-name order), then the three
// newest text models of the vendor P serves, per the catalogue.
func (s *server) candidateModels(provider string, doc *routesDoc) []string {
	var out []string
	if doc != nil {
		for _, alias := range slices.Sorted(maps.Keys(doc.Routes)) {
			if m, ok := strings.CutPrefix(doc.Routes[alias], provider+"/"); ok && m != "" {
				out = append(out, m)
			}
		}
	}
	n := 0
	for _, m := range s.catalog.models(provider) {
		if n == 3 {
			break
		}
		if slices.Contains(m.Output, "text") {
			out = append(out, m.ID)
			n++
		}
	}
	return dedupe(out)
}

// takesImages reports whether the catalogue lists image input for a model;
// a model the catalogue does not know is left out.
func (s *server) takesImages(provider, model string) bool {
	info, ok, _ := s.catalog.lookup(provider, model)
	return ok && slices.Contains(info.Input, "image")
}

func dedupe(s []string) []string {
	var out []string
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

func dedupeRoutes(rs []resolution) []resolution {
	var out []resolution
	for _, r := range rs {
		if !slices.ContainsFunc(out, func(o resolution) bool { return o.Route == r.Route }) {
			out = append(out, r)
		}
	}
	return out
}
