package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// candidates lists the routes a selector or best walks, in order (SPEC
// §7.3): best's, then the models of each provider where the agent has an
// eligible subscription, freest first (ties by id); vision: those taking images.
func (e *engine) candidates(res resolution, agent string) ([]resolution, error) {
	doc, err := e.reg.current()
	if err != nil {
		doc = nil // an invalid registry offers no alias candidates
	}
	items, err := e.inv.agentItems(agent)
	if err != nil {
		return nil, err
	}
	var provs []string
	free, now := map[string][]float64{}, e.now() // a provider's freest eligible subscription's
	for _, it := range items {
		if _, seen := free[it.Provider]; seen {
			continue
		}
		subs, _, err := e.eligible(agent, it.Provider)
		if err != nil {
			return nil, err
		}
		if len(subs) > 0 {
			free[it.Provider] = e.freedomOf(e.order(agent, it.Provider, subs)[0].ID, now)
			provs = append(provs, it.Provider)
		}
	}
	slices.SortFunc(provs, func(a, b string) int { return cmp.Or(slices.Compare(free[a], free[b]), strings.Compare(a, b)) })
	var out []resolution
	if res.Mode == modeBest && doc != nil {
		if c, ok := canonicalCandidate(doc.Routes["best"]); ok {
			out = append(out, c)
		}
	}
	for _, p := range provs {
		for _, m := range e.candidateModels(p, doc) {
			if c, ok := canonicalCandidate(p + "/" + m); ok && (res.Mode != modeAnyVision || e.takesImages(p, m)) {
				out = append(out, c)
			}
		}
	}
	return dedupeBy(out, func(r resolution) string { return r.Route }), nil
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

// candidateModels of provider P: every alias's P/… destination (alias-name
// order), then the catalogue's three newest text models of P's vendor.
func (e *engine) candidateModels(provider string, doc *routesDoc) []string {
	var out []string
	if doc != nil {
		for _, alias := range slices.Sorted(maps.Keys(doc.Routes)) {
			if m, ok := strings.CutPrefix(doc.Routes[alias], provider+"/"); ok && m != "" {
				out = append(out, m)
			}
		}
	}
	n := 0
	for _, m := range e.catalog.models(provider) {
		if n < 3 && slices.Contains(m.Modalities.Output, "text") {
			out = append(out, m.ID)
			n++
		}
	}
	return dedupeBy(out, func(m string) string { return m })
}

// takesImages: the catalogue lists image input for the model.
func (e *engine) takesImages(provider, model string) bool {
	info, ok, _ := e.catalog.lookup(provider, model)
	return ok && slices.Contains(info.Modalities.Input, "image")
}

// dedupeBy keeps the first of each key, in order.
func dedupeBy[T any, K comparable](xs []T, key func(T) K) []T {
	var out []T
	seen := map[K]bool{}
	for _, x := range xs {
		if k := key(x); !seen[k] {
			seen[k] = true
			out = append(out, x)
		}
	}
	return out
}

// walkSelector serves any, any-vision-capable and best (SPEC §7.3), each
// candidate with its own output limit, skipping a provider whose pool refused.
func (e *engine) walkSelector(ctx context.Context, j *job, req *callerRequest, cands []resolution) *apiError {
	wk := &e.wk
	poolRefused := map[string]bool{}
	hadEligible := false
	var unfit error // set when a candidate was skipped: no max_tokens known, or a request its format cannot express
	for _, cand := range cands {
		p := cand.Provider.id
		wk.route = cand.Route
		if poolRefused[p] {
			wk.note(cand.Route, "skipped: every "+p+" subscription already refused")
			continue
		}
		subs, _, err := e.eligible(e.agent, p)
		if err != nil {
			return asAPIError(err).withAttempts(e.t.attempts)
		}
		if len(subs) == 0 {
			wk.note(cand.Route, fmt.Sprintf("no usable %q subscription", p))
			continue
		}
		head := req.head
		if err := e.applyMaxTokens(&head, cand); err != nil {
			unfit = err
			wk.note(cand.Route, "skipped: "+asAPIError(err).Message)
			continue
		}
		c := &candidate{res: cand, pool: e.order(e.agent, p, subs), req: req.withLimit(head.MaxTokens), model: cand.Route}
		switch out, ae := e.attemptCandidate(ctx, j, c); out {
		case routeAnswered:
			return ae
		case routeRefused:
			poolRefused[p] = true
		case routeUnfit:
			unfit = ae
			wk.note(cand.Route, "skipped: "+ae.Message)
			continue
		}
		hadEligible = true
	}
	switch {
	case hadEligible:
		return e.exhausted()
	case unfit != nil: // every usable candidate needs a max_tokens nobody knows (SPEC §6.4) or another format
		return asAPIError(unfit)
	case e.allNeedSignIn(e.agent):
		return refuse("subscription_reauthorization_required", "agent %q has subscriptions but none has an active credential; sign in again", e.agent).withAttempts(0)
	}
	return refuse("credential_unauthorized", "no subscription model can serve agent %q", e.agent).withAttempts(0)
}
