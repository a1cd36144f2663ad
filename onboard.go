package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
)

// `brama onboard` (SPEC §14) walks the first-use journey in this process:
// state directory usable → a client exists → a route or credential can
// serve → one real model answer received. It reads the state directly and
// makes its one model call itself through the dispatcher's own pieces
// (plan, callProvider), with no daemon and no bearer. The billable step
// runs only when the operator names a model and allows the cost.

// Onboarding steps, in journey order, as printed ("done <step>") and kept.
const (
	stepStateDir = "state-directory"
	stepClient   = "client"
	stepRoute    = "route"
	stepAnswer   = "answer"
)

// onboardFile is the progress file in the state directory (SPEC §2.2).
const (
	onboardFile = "onboarding.json"
	onboardRole = "onboarding progress"
)

// onboardProgress is onboarding.json: which steps were done and when (the
// first time), and the route that answered.
type onboardProgress struct {
	SchemaVersion int                    `json:"schema_version"`
	Steps         map[string]onboardStep `json:"steps"`
}

// onboardStep is one step done.
type onboardStep struct {
	DoneAt string `json:"done_at"`         // RFC 3339 UTC, milliseconds
	Model  string `json:"model,omitempty"` // route and answer: the model named
}

// onboard walks the journey for `brama onboard` (cli.go parses its flags):
// model is the route of the one real call, allowCost allows it, and say
// prints one line ("done <step>", "next: <command>"). It returns nil when
// the journey is complete or stopped on purpose before the billable step,
// errRefused after a "next:" that says what to do. The one provider call
// has no time limit (SPEC §7.4); ctx (SIGINT, SIGTERM) cancels it.
func onboard(ctx context.Context, getenv func(string) string, sy sys, model string, allowCost bool, say func(string)) error {
	d := openDeps(getenv, sy)

	// 1. The state directory: progress can be read and written there.
	path, err := d.st.path(onboardRole, onboardFile)
	if err != nil {
		return err
	}
	prog, err := loadOnboarding(path)
	if err != nil {
		return err
	}
	mark := func(step, model string) error {
		if _, done := prog.Steps[step]; !done {
			prog.Steps[step] = onboardStep{DoneAt: sy.now().UTC().Format(journalTimeFormat), Model: model}
		}
		b, err := marshalState(prog)
		if err == nil {
			err = writeFileAtomic(path, b)
		}
		if err != nil {
			return fmt.Errorf("the state directory is not usable: %s cannot be written: %w", onboardRole, err)
		}
		say("done " + step)
		return nil
	}
	if err := mark(stepStateDir, ""); err != nil {
		return err
	}

	// 2. A client exists (serve makes the first admin client).
	doc, err := d.clients.load()
	switch {
	case errors.Is(err, errFileAbsent) || (err == nil && len(doc.Clients) == 0):
		say("next: brama clients add <id> -admin")
		return errRefused
	case err != nil:
		return fmt.Errorf("the clients file is unusable: %w", err)
	}
	if err := mark(stepClient, ""); err != nil {
		return err
	}

	// 3. A route or credential can serve.
	s := &server{log: sy.log, getenv: getenv, st: d.st, now: sy.now, clients: d.clients, vault: d.vault, journal: d.journal, reg: d.reg}
	s.client = newProviderClient()
	s.catalog = newCatalog(d.st, getenv, s.client, sy.log, sy.now)
	var c call
	var req chatRequest
	if model == "" {
		if !s.anyDirectPayer() {
			say("next: brama credentials set <provider>")
			return errRefused
		}
	} else {
		var next string
		if c, req, next, err = s.onboardPlan(model); err != nil {
			if next != "" {
				say("next: " + next)
			}
			return err
		}
	}
	if err := mark(stepRoute, c.res.Route); err != nil {
		return err
	}

	// 4. One real model answer: billable, so only when asked for.
	if model == "" || !allowCost {
		if _, done := prog.Steps[stepAnswer]; done && model == "" {
			say("done " + stepAnswer) // done on an earlier run
			return nil
		}
		say("next: brama onboard -model " + cmp.Or(model, "<route>") + " -allow-provider-cost")
		return nil
	}
	a := s.callProvider(ctx, req, c)
	if ae := a.failure(); ae != nil {
		return fmt.Errorf("no model answer: %s", ae.Message)
	}
	if _, err := readProviderAnswer(c.res.Provider, req, a.resp); err != nil {
		return fmt.Errorf("no model answer: %s", asAPIError(err).Message)
	}
	return mark(stepAnswer, c.res.Route)
}

// loadOnboarding reads the progress file under the state file guards; an
// absent file is no progress. A file that fails its guards or does not
// parse is refused, never overwritten.
func loadOnboarding(path string) (*onboardProgress, error) {
	f := stateFile[*onboardProgress]{role: onboardRole, path: path, parse: parseOnboarding}
	prog, err := f.fresh()
	switch {
	case errors.Is(err, errOnboardingInvalid):
		return nil, fmt.Errorf("the state directory is not usable: %w (remove the file to start the journey again)", err)
	case err != nil:
		return nil, fmt.Errorf("the state directory is not usable: %w", err)
	}
	return prog, nil
}

// errOnboardingInvalid wraps every refusal of parseOnboarding.
var errOnboardingInvalid = errors.New("onboarding progress is invalid")

// onboardSteps are the step names a progress file may hold.
var onboardSteps = map[string]bool{stepStateDir: true, stepClient: true, stepRoute: true, stepAnswer: true}

// parseOnboarding strictly parses onboarding.json (unknown members,
// duplicate keys, unknown steps and unreadable times are refused); empty
// input is no progress.
func parseOnboarding(b []byte) (*onboardProgress, error) {
	prog := &onboardProgress{SchemaVersion: 1, Steps: map[string]onboardStep{}}
	if len(b) == 0 {
		return prog, nil
	}
	if err := decodeStrict(onboardFile, b, prog); err != nil {
		return nil, fmt.Errorf("%w: %w", errOnboardingInvalid, err)
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
		if !onboardSteps[name] {
			return fmt.Errorf("unknown step %q", truncateUTF8(name, 64))
		}
		if _, err := time.Parse(time.RFC3339Nano, st.DoneAt); err != nil {
			return fmt.Errorf("step %s: done_at is not an RFC 3339 time", name)
		}
	}
	return nil
}

// onboardPlan plans the one call for model exactly as the daemon would
// (plan: resolution, credential, base URL). A bare deployment name is
// taken as local-openai/<name>. A subscription route or selector is
// refused: its ledger belongs to the daemon (SPEC §2.3, §14). next is the
// command that would fix a missing direct credential.
func (s *server) onboardPlan(model string) (c call, req chatRequest, next string, err error) {
	if doc, err := s.reg.current(); err == nil {
		if _, isAlias := doc.Routes[model]; !isAlias {
			if _, _, n := doc.lookupLocal(model); n == 1 {
				model = "local-openai/" + model
			}
		}
	}
	req = pingRequest(model, providerInfo{})
	c, err = s.plan(&requestInfo{}, &req)
	subscription := fmt.Errorf("-model %q is paid by an agent's subscription; onboarding calls a direct route, a deployment or an alias to one", model)
	switch ae := asAPIError(err); {
	case err == nil && c.res.Mode != modeDirect && c.res.Mode != modeAlias:
		return call{}, req, "", subscription
	case err == nil:
		return c, req, "", nil
	case ae.Code == "unauthenticated": // plan asks for an agent: a subscription route, selector or best
		return call{}, req, "", subscription
	case ae.Code == "credential_unauthorized":
		doc, docErr := s.reg.current()
		res, _ := resolveModel(model, doc, docErr, s.hasDirect, false)
		return call{}, req, "brama credentials set " + cmp.Or(res.Provider.id, "<provider>"), fmt.Errorf("-model %q cannot serve: %s", model, ae.Message)
	default:
		return call{}, req, "", fmt.Errorf("-model %q cannot serve: %s", model, ae.Message)
	}
}
