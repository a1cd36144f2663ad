package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
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

// onboardCmd is `brama onboard [-model ROUTE] [-allow-provider-cost]`. It
// exits 0 when the journey is complete or stopped on purpose before the
// billable step, 1 on a refusal (a step that cannot be done now prints
// the command that does it). cliEnv carries no context, and main's
// signal.NotifyContext swallows SIGINT, so the one provider call (which has
// no time limit, SPEC §7.4) listens for the signals itself.
func (e cliEnv) onboardCmd(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return e.onboard(ctx, args)
}

// onboard is onboardCmd under ctx.
func (e cliEnv) onboard(ctx context.Context, args []string) error {
	fs := e.newFlags("onboard")
	model := fs.String("model", "", "the `route` of the one real call: a direct route, a deployment, or an alias to one")
	allowCost := fs.Bool("allow-provider-cost", false, "make the one real (billable) model call")
	if _, err := parseFlags(fs, args, 0, "onboard [-model ROUTE] [-allow-provider-cost]"); err != nil {
		return err
	}
	log := newLogger(e.stderr, e.getenv("BRAMA_LOG_LEVEL"))
	now := time.Now
	d := openDeps(e.getenv, sys{log: log, now: now})

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
			prog.Steps[step] = onboardStep{DoneAt: now().UTC().Format(journalTimeFormat), Model: model}
		}
		b, err := marshalState(prog)
		if err == nil {
			err = writeFileAtomic(path, b)
		}
		if err != nil {
			return fmt.Errorf("the state directory is not usable: %s cannot be written: %w", onboardRole, err)
		}
		fmt.Fprintf(e.stdout, "done %s\n", step)
		return nil
	}
	if err := mark(stepStateDir, ""); err != nil {
		return err
	}

	// 2. A client exists (serve makes the first admin client).
	doc, err := d.clients.load()
	switch {
	case errors.Is(err, errFileAbsent) || (err == nil && len(doc.Clients) == 0):
		fmt.Fprintln(e.stdout, "next: brama clients add <id> -admin")
		return errRefused
	case err != nil:
		return fmt.Errorf("the clients file is unusable: %w", err)
	}
	if err := mark(stepClient, ""); err != nil {
		return err
	}

	// 3. A route or credential can serve.
	s := &server{log: log, getenv: e.getenv, st: d.st, now: now, clients: d.clients, vault: d.vault, journal: d.journal, reg: d.reg}
	s.client = newProviderClient()
	s.catalog = newCatalog(d.st, e.getenv, s.client, log, now)
	var c call
	var req chatRequest
	if *model == "" {
		if !s.anyDirectPayer() {
			fmt.Fprintln(e.stdout, "next: brama credentials set <provider>")
			return errRefused
		}
	} else {
		var next string
		if c, req, next, err = s.onboardPlan(*model); err != nil {
			if next != "" {
				fmt.Fprintf(e.stdout, "next: %s\n", next)
			}
			return err
		}
	}
	if err := mark(stepRoute, c.res.Route); err != nil {
		return err
	}

	// 4. One real model answer: billable, so only when asked for.
	if *model == "" || !*allowCost {
		if _, done := prog.Steps[stepAnswer]; done && *model == "" {
			fmt.Fprintf(e.stdout, "done %s\n", stepAnswer) // done on an earlier run
			return nil
		}
		route := "<route>"
		if *model != "" {
			route = *model
		}
		fmt.Fprintf(e.stdout, "next: brama onboard -model %s -allow-provider-cost\n", route)
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
	b, _, err := readGuarded(onboardRole, path)
	switch {
	case errors.Is(err, errFileAbsent):
		return parseOnboarding(nil)
	case err != nil:
		return nil, fmt.Errorf("the state directory is not usable: %w", err)
	}
	prog, err := parseOnboarding(b)
	if err != nil {
		return nil, fmt.Errorf("the state directory is not usable: %w (remove the file to start the journey again)", err)
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

// anyDirectPayer reports whether something could serve without an agent:
// a direct credential in the vault or a declared deployment.
func (s *server) anyDirectPayer() bool {
	if doc, err := s.reg.current(); err == nil && len(doc.Deployments) > 0 {
		return true
	}
	vd, err := s.vault.load()
	if err != nil {
		return false
	}
	for _, k := range vd.Direct {
		if k.APIKey != "" {
			return true
		}
	}
	return false
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
