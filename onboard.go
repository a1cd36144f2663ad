package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Onboarding (SPEC §14) walks the first-use journey in-process, no daemon or
// bearer, in the steps' order; onboarding.json keeps the steps done.
const (
	stepStateDir = "state-directory"
	stepClient   = "client"
	stepRoute    = "route"
	stepAnswer   = "answer"
	onboardFile  = "onboarding.json"
	onboardRole  = "onboarding progress"
)

// onboardProgress is onboarding.json: each step done, when first done, and
// (route, answer) the model named.
type onboardProgress struct {
	SchemaVersion int                    `json:"schema_version"`
	Steps         map[string]onboardStep `json:"steps"`
}

type onboardStep struct {
	DoneAt string `json:"done_at"` // RFC 3339 UTC, milliseconds
	Model  string `json:"model,omitempty"`
}

// errOnboardingInvalid wraps every refusal of parseOnboarding.
var errOnboardingInvalid = errors.New("onboarding progress is invalid")

// parseOnboarding is decodeStrict on onboarding.json; empty is no progress.
func parseOnboarding(b []byte) (*onboardProgress, error) {
	prog := &onboardProgress{SchemaVersion: 1, Steps: map[string]onboardStep{}}
	if len(b) > 0 {
		if err := decodeStrict(onboardFile, b, prog); err != nil {
			return nil, fmt.Errorf("%w: %w (remove the file to start the journey again)", errOnboardingInvalid, err)
		}
	}
	return prog, nil
}

// validate refuses another schema, unknown steps and unreadable times.
func (prog *onboardProgress) validate() error {
	if prog.SchemaVersion != 1 {
		return fmt.Errorf("schema_version %d is not 1", prog.SchemaVersion)
	}
	if prog.Steps == nil {
		prog.Steps = map[string]onboardStep{}
	}
	for name, st := range prog.Steps {
		if !slices.Contains([]string{stepStateDir, stepClient, stepRoute, stepAnswer}, name) {
			return fmt.Errorf("unknown step %q", truncateUTF8(name, 64))
		}
		if _, err := time.Parse(time.RFC3339Nano, st.DoneAt); err != nil {
			return fmt.Errorf("step %s: done_at is not an RFC 3339 time", name)
		}
	}
	return nil
}

// onboard runs the steps in order. A step returns the model it names, or the
// command to run next ("next: …", and the step is not done; err says whether
// that is a refusal). The one billable call is made only with
// -allow-provider-cost, and only ctx cancels it (SPEC §7.4).
func onboard(e *cliEnv, o opts, _ []string) error {
	model, sy := o.s("model"), e.sys()
	d := openDeps(e.getenv, sy)
	path, err := d.st.path(onboardRole, onboardFile)
	if err != nil {
		return err
	}
	f := stateFile[*onboardProgress]{role: onboardRole, path: path, parse: parseOnboarding}
	prog, err := f.fresh() // a file failing the guards is refused, never overwritten
	if err != nil {
		return fmt.Errorf("the state directory is not usable: %w", err)
	}
	s := &server{core: core{stores: d.stores, sys: sy, getenv: e.getenv, client: newProviderClient()}}
	s.catalog = newCatalog(d.st, e.getenv, s.client, sy.log, sy.now)
	var c call
	var req chatRequest
	steps := []struct {
		name string
		do   func() (model, next string, err error)
	}{
		{stepStateDir, func() (string, string, error) { return "", "", nil }},
		{stepClient, func() (string, string, error) { // serve makes the first admin client
			doc, err := d.clients.load()
			if errors.Is(err, errFileAbsent) || err == nil && len(doc.Clients) == 0 {
				return "", "brama clients add <id> -admin", errRefused
			} else if err != nil {
				return "", "", fmt.Errorf("the clients file is unusable: %w", err)
			}
			return "", "", nil
		}},
		{stepRoute, func() (_, next string, err error) {
			c, req, next, err = s.onboardPlan(model)
			return c.res.Route, next, err
		}},
		{stepAnswer, func() (string, string, error) {
			if _, done := prog.Steps[stepAnswer]; done && model == "" {
				return "", "", nil // done on an earlier run
			} else if model == "" || !o.b("allow-provider-cost") {
				return "", "brama onboard -model " + cmp.Or(model, "<route>") + " -allow-provider-cost", nil
			}
			j := &job{kind: kindProbe, // one ping, as the probe's (SPEC §11.3)
				build: func(ctx context.Context, _ *candidate, c call) (*http.Request, error) {
					return buildUpstreamRequest(ctx, c.res.Provider, c.baseURL, c.cred, req, c.res.Model)
				},
				commit: func(_ context.Context, _ *candidate, c call, resp *http.Response) (usage, *apiError, bool) {
					a, err := readProviderAnswer(c.res.Provider, req, resp)
					if err != nil {
						return usage{}, asAPIError(err), false
					}
					return a.Usage, nil, false
				}}
			if ae := s.engine(&requestInfo{}).attemptRoute(e.ctx, j, c, nil, nil); ae != nil {
				return "", "", fmt.Errorf("no model answer: %s", ae.Message)
			}
			return c.res.Route, "", nil
		}},
	}
	for _, st := range steps {
		m, next, err := st.do()
		if next != "" {
			fmt.Fprintf(e.stdout, "next: %s\n", next)
		}
		if err != nil || next != "" {
			return err
		}
		if _, done := prog.Steps[st.name]; !done {
			prog.Steps[st.name] = onboardStep{DoneAt: sy.now().UTC().Format(journalTimeFormat), Model: m}
		}
		if err := writeState(path, prog); err != nil {
			return fmt.Errorf("the state directory is not usable: %s cannot be written: %w", onboardRole, err)
		}
		fmt.Fprintf(e.stdout, "done %s\n", st.name)
	}
	return nil
}

// onboardPlan plans model's call as the daemon would (a bare deployment as local-openai/<name>),
// refusing subscription routes and selectors: their ledger is the daemon's (SPEC §2.3, §14).
// With no model it only asks that some direct credential or deployment can pay.
func (s *server) onboardPlan(model string) (c call, req chatRequest, next string, err error) {
	switch {
	case model == "" && !s.anyDirectPayer():
		return c, req, "brama credentials set <provider>", errRefused
	case model == "":
		return c, req, "", nil
	}
	if doc, err := s.reg.current(); err == nil {
		if _, isAlias := doc.Routes[model]; !isAlias {
			if _, _, n := doc.lookupLocal(model); n == 1 {
				model = "local-openai/" + model
			}
		}
	}
	req = pingRequest(model, providerInfo{})
	c, err = s.engine(&requestInfo{}).plan(client{}, "", &req)
	switch ae := asAPIError(err); {
	case err == nil && (c.res.Mode == modeDirect || c.res.Mode == modeAlias):
		return c, req, "", nil
	case err == nil || ae.Code == "forbidden": // plan wants an agent: subscription, selector or best
		return call{}, req, "", fmt.Errorf("-model %q is paid by an agent's subscription; onboarding calls a direct route, a deployment or an alias to one", model)
	case ae.Code == "credential_unauthorized":
		doc, docErr := s.reg.current()
		res, _ := resolveModel(model, doc, docErr, s.hasDirect)
		next = "brama credentials set " + cmp.Or(res.Provider.id, "<provider>")
	}
	return call{}, req, next, fmt.Errorf("-model %q cannot serve: %s", model, asAPIError(err).Message)
}
