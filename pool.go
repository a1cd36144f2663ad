package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Who pays (SPEC §7.2, §7.3, §11.3): pools, refresh, blocks, selectors' candidates, the probe; the daemon's parts.

// Block lengths (SPEC §7.2.4) and the probe's output limit (§11.3).
const (
	defaultBlock   = 15 * time.Minute
	maxBlock       = 7 * 24 * time.Hour
	maxPin         = 24 * time.Hour
	probeMaxTokens = 16
)

// pin is the subscription that last served an agent's provider, until its earliest window reset (at most 24 h); memory only.
type pin struct {
	id    string
	until time.Time
}

// candidates lists the routes a selector or best walks, in order (SPEC §7.3): best's, then for each provider P where the
// agent has an eligible subscription, freest first (ties by id), every alias's P/… destination (alias-name order), then
// the catalogue's three newest text models of P; any-vision-capable keeps those taking images.
func (e *engine) candidates(res resolution) ([]resolution, error) {
	var aliases map[string]string // an invalid registry offers none
	if doc, err := e.reg.current(); err == nil && doc != nil {
		aliases = doc.Routes
	}
	var provs []string
	free := map[string][]float64{} // each provider with an eligible subscription: its freest one's
	for _, p := range providerTable {
		if subs, err := e.eligible(p.id); err != nil {
			return nil, err
		} else if len(subs) > 0 {
			free[p.id], provs = e.freedomOf(subs[0].ID, e.now()), append(provs, p.id)
		}
	}
	slices.SortFunc(provs, func(a, b string) int { return cmp.Or(slices.Compare(free[a], free[b]), strings.Compare(a, b)) })
	var out []resolution
	add := func(route string) {
		pid, model, _ := strings.Cut(route, "/")
		p, known := lookupProvider(pid)
		info, _, _ := e.catalog.lookup(pid, model)
		seen := slices.ContainsFunc(out, func(r resolution) bool { return r.Route == route })
		sees := res.Mode != modeAnyVision || slices.Contains(info.Modalities.Input, "image")
		if known && model != "" && p.cred != credNone && !seen && sees {
			out = append(out, resolution{Mode: modeSubscription, Route: route, Provider: p, Model: model})
		}
	}
	if res.Mode == modeBest {
		add(aliases["best"])
	}
	for _, p := range provs {
		for _, alias := range slices.Sorted(maps.Keys(aliases)) {
			if strings.HasPrefix(aliases[alias], p+"/") {
				add(aliases[alias])
			}
		}
		texts := slices.DeleteFunc(e.catalog.models(p), func(m modelInfo) bool { return !slices.Contains(m.Modalities.Output, "text") })
		for _, m := range texts[:min(3, len(texts))] {
			add(p + "/" + m.ID)
		}
	}
	return out, nil
}

// eligible is the agent's non-retired subscriptions of provider with an active credential, in order: blocked last, then
// freest first, the pinned one first among equals, ties in overlay order (SPEC §2.3, §7.2.2).
func (e *engine) eligible(provider string) ([]overlayItem, error) {
	pool, err := e.inv.pool(e.agent, provider)
	now, free := e.now(), map[string][]float64{}
	pool = slices.DeleteFunc(pool, func(it overlayItem) bool { return e.ledger.entry(it.ID).Credential.State != credActive })
	for _, it := range pool {
		free[it.ID] = append(e.freedomOf(it.ID, now), 1)
	}
	if pn, ok := e.pins.Load(e.agent + "\x00" + provider); ok && now.Before(pn.(pin).until) && free[pn.(pin).id] != nil {
		free[pn.(pin).id][2] = 0 // first among equals
	}
	slices.SortStableFunc(pool, func(a, b overlayItem) int { return slices.Compare(free[a.ID], free[b.ID]) })
	return pool, err
}

// freedomOf is how free a subscription is, compared in order (SPEC §7.2.2): unblocked first, then the least full.
func (e *engine) freedomOf(id string, now time.Time) []float64 {
	return []float64{map[bool]float64{true: 0, false: 1}[e.ledger.blockedUntil(id).IsZero()], e.ledger.fullness(id, now)}
}

// errSkipSubscription: no call on this subscription; the walk noted why.
var errSkipSubscription = errors.New("subscription skipped")

// subscriptionCredential is what a call of kind on sub presents, an expired grant or a just refusedToken refreshed first
// (SPEC §7.2.3, §11.1). Skipped: a blocked sub when the kind rotates, one marked since the pool was read unless probed,
// one no header could carry (a vault edited by hand: marked for a sign-in, SPEC §17).
func (e *engine) subscriptionCredential(ctx context.Context, kind routeKind, sub overlayItem, refusedToken string) (upstreamCredential, error) {
	if until := e.ledger.blockedUntil(sub.ID); budgets[kind].rotate && !until.IsZero() {
		e.blocks = append(e.blocks, until)
		e.note(sub.ID, "blocked until "+until.UTC().Format(time.RFC3339))
		return upstreamCredential{}, errSkipSubscription
	} else if kind != kindProbe && e.ledger.entry(sub.ID).Credential.State != credActive { // the probe may revive it
		e.note(sub.ID, "credential refused meanwhile; sign in again")
		return upstreamCredential{}, errSkipSubscription
	}
	vc, err := e.inv.credential(sub.ID) // its refusal is SPEC §2.2's
	if err != nil {
		return upstreamCredential{}, err
	}
	cred := upstreamCredential{APIKey: vc.APIKey}
	if g := vc.OAuth; g != nil {
		if slices.Contains(e.skipped, sub.ID) { // a later candidate of the same provider walks this pool again
			return upstreamCredential{}, errSkipSubscription
		}
		if refusedToken != "" || (expiredForRequest(*g, e.now()) && !slices.Contains(e.refreshed, sub.ID)) {
			e.refreshed = append(e.refreshed, sub.ID)
			ng, err := e.oauth.refresh(ctx, sub.ID, sub.Provider, refusedToken)
			var re *endpointError
			switch {
			case errors.Is(err, errRefreshSuperseded): // a sign-in replaced the grant meanwhile: the call uses its (SPEC §11.1)
				return e.subscriptionCredential(ctx, kind, sub, "")
			case err != nil && ctx.Err() != nil: // the caller hung up while it waited: no skip, no call (SPEC §7.4)
				return upstreamCredential{}, refuse("client_cancelled", "the caller went away during a grant refresh").because(err)
			case errors.As(err, &re) && !re.Definitive:
				if e.refreshTransport == nil {
					e.refreshTransport = refuse("dependency_unavailable", "%s", redact(re.Error())).because(err)
				}
				e.maint.request("credential_refresh_transport_failure", e.agent)
			}
			if err != nil {
				e.note(sub.ID, "grant refresh failed: "+redact(err.Error()))
				e.skipped = append(e.skipped, sub.ID)
				return upstreamCredential{}, errSkipSubscription
			}
			if g = &ng; refusedToken != "" {
				e.note(sub.ID, "refused the access token; refreshed")
			}
		}
		cred = upstreamCredential{AccessToken: g.AccessToken, AccountID: g.AccountID}
	}
	if controlAt(cred.APIKey+cred.AccessToken+cred.AccountID) >= 0 {
		const why = "the vault's credential holds a control character and cannot be sent; sign in again"
		e.ledger.setCredential(sub.ID, sub.Provider, credNeedsReauth, why)
		e.note(sub.ID, why)
		return upstreamCredential{}, errSkipSubscription
	}
	return cred, nil
}

// credentialReplaced: the vault no longer holds what a call on sub presented (a sign-in or refresh landed meanwhile), so
// its 401 or 403 marks nothing and the current credential gets the next call (SPEC §10.3, §11.1).
func (e *engine) credentialReplaced(sub overlayItem, used upstreamCredential) bool {
	vc, err := e.inv.credential(sub.ID)
	if err != nil || vc.OAuth == nil {
		return err == nil && vc.APIKey != used.APIKey
	}
	return vc.OAuth.AccessToken != used.AccessToken
}

// block blocks sub until the stated wait, else the last reset of a window the ledger holds used up, else 15 min; at most
// 7 days (SPEC §7.2.4).
func (e *engine) block(sub overlayItem, stated time.Duration, why string) time.Time {
	now, wait := e.now(), time.Duration(0)
	led := e.ledger.entry(sub.ID)
	for _, w := range led.Windows {
		if at := time.UnixMilli(w.ResetsAtMs); w.UsedFraction >= 1 && w.ResetsAtMs > 0 && at.After(now) {
			wait = max(wait, at.Sub(now))
		}
	}
	until := now.Add(min(cmp.Or(max(stated, 0), wait, defaultBlock), maxBlock))
	e.ledger.block(sub.ID, sub.Provider, until, why)
	return until
}

// probe runs one completion probe on the live subscription it with model ("": the built-in one), as a request would meet
// it (SPEC §11.3); 409 before any call when blocked or model-less. Its answer: the probe and the row after it.
func (e *engine) probe(ctx context.Context, it overlayItem, model string) (any, error) {
	if until := e.ledger.blockedUntil(it.ID); !until.IsZero() {
		return nil, refuse("state_conflict", "subscription %s is blocked until %s; a probe is not sent inside a recorded block",
			it.ID, until.UTC().Format(time.RFC3339))
	}
	builtin, _ := lookupProvider(it.Provider)
	model = cmp.Or(strings.TrimPrefix(strings.TrimSpace(model), it.Provider+"/"), builtin.probe)
	if model == "" {
		return nil, refuse("state_conflict", "name a model for this probe: provider %q has no built-in probe model", it.Provider)
	}
	res, err := resolveModel(it.Provider+"/"+model, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	res.Mode = modeSubscription // paid by the probed subscription, whatever its provider
	u, ae := e.ping(ctx, call{res: res}, []overlayItem{it})
	ok, detail := ae == nil, fmt.Sprintf("%s answered (%d output tokens)", res.Route, u.OutputTokens)
	if !ok && e.t.attempts == 0 && len(e.reasons) == 0 { // refused before any call, as a probe's own refusal
		ae.Attempts = nil
		return nil, ae
	} else if !ok { // the provider refused, its answer could not be read, or the grant could not be refreshed
		detail = ae.Message
	}
	e.ledger.recordCheck(it.ID, res.Provider.id, true, ok, detail)
	if ok && e.ledger.entry(it.ID).Credential.State != credActive {
		e.ledger.setCredential(it.ID, res.Provider.id, credActive, "") // SPEC §10.3: a successful probe reactivates
	}
	e.inv.invalidate() // the listing shows the probe at once (SPEC §10.2)
	level := map[bool]slog.Level{true: slog.LevelInfo, false: slog.LevelWarn}[ok]
	e.log.Log(ctx, level, "usage_probe_"+map[bool]string{true: "ok", false: "failed"}[ok], "request_id", e.t.requestID,
		"subscription_id", it.ID, "agent_id", e.agent, "provider", it.Provider, "route", res.Route, "detail", ledgerSentence(detail))
	row := e.inv.row(it, false, e.now())
	return map[string]any{"ok": true, "probe": cmp.Or(row.Probe, &ledgerCheck{}), "subscription": row}, nil
}

// ping makes the probe's and onboarding's one completion on c (SPEC §11.3), paid by pool when given.
func (e *engine) ping(ctx context.Context, c call, pool []overlayItem) (u usage, ae *apiError) {
	req := pingRequest(c.res.Route, c.res.Provider)
	ae = e.attemptRoute(ctx, &job{kind: kindProbe, pool: pool,
		build: func(ctx context.Context, c call, _ *callerRequest) (*http.Request, error) {
			return buildUpstreamRequest(ctx, c, req)
		},
		commit: func(_ context.Context, c call, _ *callerRequest, resp *http.Response) (usage, *apiError, bool) {
			a, err := readProviderAnswer(c.res.Provider, resp)
			if u = a.Usage; err != nil { // an in-band limit blocks, as a request's
				return u, asAPIError(err), false
			}
			return u, nil, false
		},
	}, c, nil, nil)
	return u, ae
}

// pingRequest is the probe's and onboarding's completion (SPEC §6.2, §11.3).
func pingRequest(route string, p providerInfo) chatRequest {
	req := chatRequest{Model: route, Messages: []message{{Role: "user", Parts: []part{{Type: partText, Text: "ping"}}}}}
	if !p.codex {
		req.MaxTokens = probeMaxTokens
	}
	return req
}

// deps are the state files every command and the server share.
type deps struct {
	st      state
	vault   *vault
	journal *journal
	reg     *registry
	clients *clientStore
}

// core is the daemon's parts that the server and every request's engine share, built once by serve.
type core struct {
	deps       // the state files
	sys        // log, now
	getenv     func(string) string
	localCreds map[string]string // -local-credentials-stdin's keys; non-nil: the only direct ones (SPEC §16)
	client     *http.Client      // provider calls: no timeout, no redirects, no proxy
	catalog    *catalog
	perf       *perfRegistry
	keepAlive  time.Duration // 0: keepAliveEvery; tests shorten it
	attempts   atomic.Int64  // provider calls made since start, for /metrics
	ledger     *ledger
	inv        *inventory
	oauth      *oauthClient
	pins       sync.Map // agent "\x00" provider → the subscription that last served it (pin)
	maint      *maintainer
}

// directKey is provider's direct API key (SPEC §7.1): -local-credentials-stdin's when given (then the only source, §16),
// else the vault's, whose read may fail.
func (c *core) directKey(provider string) (string, error) {
	if c.localCreds != nil {
		return c.localCreds[provider], nil
	} else if doc, err := c.vault.load(); err == nil {
		return doc.Direct[provider].APIKey, nil
	} else if !errors.Is(err, errNoState) { // no state directory: no key
		return "", err
	}
	return "", nil
}

// hasDirect reports whether a direct credential exists for provider.
func (c *core) hasDirect(provider string) bool {
	key, _ := c.directKey(provider)
	return key != ""
}

// anyDirectPayer: a direct credential or a declared deployment could serve without an agent (SPEC §13, §14).
func (c *core) anyDirectPayer() bool {
	doc, err := c.reg.current()
	keyed := slices.ContainsFunc(providerTable, func(p providerInfo) bool { return c.hasDirect(p.id) })
	return keyed || err == nil && len(doc.Deployments) > 0
}
