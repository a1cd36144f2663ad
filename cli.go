package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// CLI commands: those that read or edit state in-process (SPEC §2.3 allows
// a CLI to edit the registry, the clients file and the vault's direct and
// agents sections while serve runs, each under its file lock), and those
// that ask the daemon (maintain, subscription sign-in).

// deps opens the state for a CLI command; its logs go to stderr.
func (e cliEnv) deps() deps {
	return openDeps(e.getenv, newLogger(e.stderr, e.getenv("BRAMA_LOG_LEVEL")), time.Now)
}

// hasDirectFromVault is the CLI's view of direct credentials.
func hasDirectFromVault(v *vault) func(string) bool {
	return func(p string) bool { return v.directKey(p) != "" }
}

func (e cliEnv) routesList(args []string) error {
	fs := e.newFlags("routes list")
	asJSON := fs.Bool("json", false, "print the body of GET /v1/aliases")
	if _, err := parseFlags(fs, args, 0, "routes list [-json]"); err != nil {
		return err
	}
	d := e.deps()
	t, err := d.reg.aliases(hasDirectFromVault(d.vault))
	if err != nil {
		return err
	}
	if *asJSON {
		b, _ := json.Marshal(t)
		fmt.Fprintf(e.stdout, "%s\n", b)
		return nil
	}
	e.printAliases(t)
	return nil
}

// printAliases prints one aligned row per alias and the unserviceable count.
func (e cliEnv) printAliases(t aliasTable) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ALIAS\tSTATE\tROUTE\tREASON")
	for _, a := range t.Aliases {
		route := "-"
		if a.Route != nil {
			route = *a.Route
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Alias, a.State, route, a.Reason)
	}
	tw.Flush()
	fmt.Fprintf(e.stdout, "%d alias(es), %d cannot serve\n", len(t.Aliases), t.Unserviceable)
}

func (e cliEnv) routesSet(args []string) error {
	fs := e.newFlags("routes set")
	pos, err := parseFlags(fs, args, 2, "routes set ALIAS DESTINATION")
	if err != nil {
		return err
	}
	d := e.deps()
	if _, err := d.reg.set(pos[0], pos[1], "cli"); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "set %s -> %s\n", pos[0], pos[1])
	return e.printAfterWrite(d)
}

func (e cliEnv) routesRm(args []string) error {
	fs := e.newFlags("routes rm")
	pos, err := parseFlags(fs, args, 1, "routes rm ALIAS")
	if err != nil {
		return err
	}
	d := e.deps()
	if _, err := d.reg.remove(pos[0], "cli"); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "removed %s\n", pos[0])
	return e.printAfterWrite(d)
}

func (e cliEnv) printAfterWrite(d deps) error {
	t, err := d.reg.aliases(hasDirectFromVault(d.vault))
	if err != nil {
		return err
	}
	e.printAliases(t)
	return nil
}

func (e cliEnv) routesMigrate(args []string) error {
	fs := e.newFlags("routes migrate")
	file := fs.String("file", "", "registry `file` to migrate (default: the registry Brama reads)")
	asJSON := fs.Bool("json", false, `print {"ok":true,"file":F,"dropped":[…],"document":{…}}`)
	if _, err := parseFlags(fs, args, 0, "routes migrate [-file F] [-json]"); err != nil {
		return err
	}
	path := *file
	if path == "" {
		var err error
		if path, err = registryPath(resolveState(e.getenv), e.getenv); err != nil {
			fmt.Fprintf(e.stderr, "route migration error: %v\n", err)
			return errRefused
		}
	}
	committed, dropped, _, err := migrateRegistry(path)
	if err != nil {
		fmt.Fprintf(e.stderr, "route migration error: %v\n", err)
		return errRefused
	}
	if !*asJSON {
		e.stdout.Write(committed)
		return nil
	}
	if dropped == nil {
		dropped = []string{}
	}
	b, _ := json.Marshal(struct {
		OK       bool            `json:"ok"`
		File     string          `json:"file"`
		Dropped  []string        `json:"dropped"`
		Document json.RawMessage `json:"document"`
	}{true, path, dropped, committed})
	fmt.Fprintf(e.stdout, "%s\n", b)
	return nil
}

// multiFlag collects a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func (e cliEnv) clientsAdd(args []string) error {
	fs := e.newFlags("clients add")
	admin := fs.Bool("admin", false, "give the client the admin role (reaches /v1/admin/*)")
	agent := fs.String("agent", "", "bind the client's bearer to `agent`")
	var allow multiFlag
	fs.Var(&allow, "allow", "allow only this model `name` (repeatable; exact names)")
	pos, err := parseFlags(fs, args, 1, "clients add ID [-admin] [-agent A] [-allow NAME]...")
	if err != nil {
		return err
	}
	path, err := resolveState(e.getenv).fileOrState(e.getenv, "BRAMA_CLIENTS_FILE", "clients file", "clients.json")
	if err != nil {
		return err
	}
	role := roleCaller
	if *admin {
		role = roleAdmin
	}
	tok := newToken()
	c := client{ID: pos[0], TokenSHA256: tokenDigest(tok), Role: role, AgentID: *agent, AllowedModels: allow}
	err = updateClients(path, func(d *clientsDoc) error {
		if slices.ContainsFunc(d.Clients, func(x client) bool { return x.ID == c.ID }) {
			return fmt.Errorf("client %q already exists; rm it first", c.ID)
		}
		d.Clients = append(d.Clients, c)
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "brama: created %s client %q; bearer token (shown once) on stdout\n", role, c.ID)
	fmt.Fprintln(e.stdout, tok)
	return nil
}

func (e cliEnv) clientsRm(args []string) error {
	fs := e.newFlags("clients rm")
	pos, err := parseFlags(fs, args, 1, "clients rm ID")
	if err != nil {
		return err
	}
	path, err := resolveState(e.getenv).fileOrState(e.getenv, "BRAMA_CLIENTS_FILE", "clients file", "clients.json")
	if err != nil {
		return err
	}
	err = updateClients(path, func(d *clientsDoc) error {
		n := len(d.Clients)
		d.Clients = slices.DeleteFunc(d.Clients, func(x client) bool { return x.ID == pos[0] })
		if len(d.Clients) == n {
			return fmt.Errorf("no client %q", pos[0])
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "removed client %s\n", pos[0])
	return nil
}

func (e cliEnv) agentsAdd(args []string) error {
	fs := e.newFlags("agents add")
	pos, err := parseFlags(fs, args, 1, "agents add ID")
	if err != nil {
		return err
	}
	if !idPattern.MatchString(pos[0]) {
		return fmt.Errorf("agent id %q must match [a-z0-9-]{1,64}", pos[0])
	}
	b := make([]byte, 32)
	rand.Read(b)
	secret := hex.EncodeToString(b)
	err = e.deps().vault.update(func(d *vaultDoc) error {
		if _, ok := d.Agents[pos[0]]; ok {
			return fmt.Errorf("agent %q already exists; rm it first", pos[0])
		}
		d.Agents[pos[0]] = vaultAgent{SigningSecret: secret}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "created agent %s; its signing secret (shown once) is the next line\n%s\n", pos[0], secret)
	return nil
}

func (e cliEnv) agentsRm(args []string) error {
	fs := e.newFlags("agents rm")
	pos, err := parseFlags(fs, args, 1, "agents rm ID")
	if err != nil {
		return err
	}
	err = e.deps().vault.update(func(d *vaultDoc) error {
		if _, ok := d.Agents[pos[0]]; !ok {
			return fmt.Errorf("no agent %q", pos[0])
		}
		delete(d.Agents, pos[0])
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "removed agent %s\n", pos[0])
	return nil
}

// credentialsSet stores a direct API key read from stdin's first line; it
// never takes the key as a flag (flags show up in ps).
func (e cliEnv) credentialsSet(args []string) error {
	fs := e.newFlags("credentials set")
	pos, err := parseFlags(fs, args, 1, "credentials set PROVIDER  (the API key on stdin)")
	if err != nil {
		return err
	}
	p, ok := lookupProvider(pos[0])
	if !ok || p.cred != credDirect {
		return fmt.Errorf("%q is not a provider that takes a direct API key", pos[0])
	}
	line, err := bufio.NewReader(e.stdin).ReadString('\n')
	key := strings.TrimSpace(line)
	if key == "" {
		return fmt.Errorf("no API key on stdin (%v)", errors.Join(err, errors.New("empty line")))
	}
	err = e.deps().vault.update(func(d *vaultDoc) error {
		d.Direct[p.id] = vaultKey{APIKey: key}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "stored the direct credential for %s in the vault\n", p.id)
	return nil
}

func (e cliEnv) journalCheck(args []string) error {
	fs := e.newFlags("journal check")
	if _, err := parseFlags(fs, args, 0, "journal check"); err != nil {
		return err
	}
	j := newJournal(resolveState(e.getenv), slog.New(slog.DiscardHandler), time.Now)
	ok, err := checkJournal(j, e.stdout)
	if err != nil {
		return err
	}
	if !ok {
		return errRefused
	}
	return nil
}

// maintainCmd is `brama maintain [-gateway URL] [-json]`: it asks the daemon
// for one pass (SPEC §11.2, §16.1), prints a summary (or the body with
// -json), and exits 0 only when the pass was ok.
func (e cliEnv) maintainCmd(args []string) error {
	const usage = "maintain [-gateway URL] [-json]  (bearer from BRAMA_TOKEN, else stdin's first line)"
	fs := e.newFlags("maintain")
	gw := gatewayFlag(fs)
	asJSON := fs.Bool("json", false, "print the body of POST /v1/admin/maintain")
	if _, err := parseFlags(fs, args, 0, usage); err != nil {
		return err
	}
	g, err := e.subscriptionGateway(*gw, bufio.NewReader(e.stdin))
	if err != nil {
		return err
	}
	b, err := g.call("POST", "/v1/admin/maintain", nil)
	if err != nil {
		return err
	}
	var rep passReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("the gateway's answer is not a maintenance report (%s)", jsonErrorKind(err))
	}
	if *asJSON {
		e.stdout.Write(b)
	} else {
		e.printPassReport(rep)
	}
	if !rep.OK {
		return errRefused
	}
	return nil
}

// printPassReport prints a pass's report as a few lines of text.
func (e cliEnv) printPassReport(rep passReport) {
	verdict := "ok"
	if !rep.OK {
		verdict = "not ok"
	}
	fmt.Fprintf(e.stdout, "maintenance pass: %s\n", verdict)
	fmt.Fprintf(e.stdout, "usage reports: %d subscription(s), %d read, %d failed\n",
		rep.Usage.Subscriptions, rep.Usage.Read, len(rep.Usage.Failed))
	for _, f := range rep.Usage.Failed {
		fmt.Fprintf(e.stdout, "  failed %s (%s): %s\n", f.SubscriptionID, f.Provider, f.Error)
	}
	fmt.Fprintf(e.stdout, "credentials: %d subscription(s), %d refreshed, %d refused or failed\n",
		rep.Credentials.Subscriptions, rep.Credentials.Refreshed, rep.Credentials.Refused)
	next := "nothing due"
	if rep.NextDueAt != nil {
		next = *rep.NextDueAt
	}
	fmt.Fprintf(e.stdout, "next due: %s\n", next)
}

// subscriptionSignIn is `brama subscription sign-in`. It prints the
// authorize URL on stderr (stdout carries only the subscription id, for
// scripts), reads the pasted code or redirect URL from stdin (the line
// after the bearer when BRAMA_TOKEN is unset), exchanges it locally, then
// hands the grant to the daemon: PUT …/credential with -id, else a new
// donation. The verifier, the code and the tokens are never printed.
func (e cliEnv) subscriptionSignIn(args []string) error {
	const usage = "subscription sign-in -provider claude-code|codex -agent A [-id ID | -label L] [-gateway URL]  (bearer unless BRAMA_TOKEN, then the pasted code, on stdin)"
	fs := e.newFlags("subscription sign-in")
	gw := gatewayFlag(fs)
	provider := fs.String("provider", "", "claude-code or codex")
	agent := fs.String("agent", "", "the `agent` that owns (or receives) the subscription")
	id := fs.String("id", "", "replace the credential of this subscription `id` instead of donating a new one")
	label := fs.String("label", "", "a `label` for a new subscription")
	if _, err := parseFlags(fs, args, 0, usage); err != nil {
		return err
	}
	if err := errors.Join(requireFlag("provider", *provider, usage), requireFlag("agent", *agent, usage)); err != nil {
		return &usageError{err.Error()}
	}
	if *id != "" && *label != "" {
		return &usageError{"-label names a new subscription; with -id the subscription keeps its label; usage: brama " + usage}
	}
	if _, err := signInProvider(*provider); err != nil {
		return &usageError{fmt.Sprintf("-provider %q has no sign-in (claude-code or codex); donate its grant or replace it with PUT …/credential", *provider)}
	}
	in := bufio.NewReader(e.stdin)
	g, err := e.subscriptionGateway(*gw, in)
	if err != nil {
		return err
	}
	// Check the gateway, the bearer and -id before the person signs in: a
	// code is good once and for minutes only.
	if err := g.checkSignInTarget(*agent, *id, *provider); err != nil {
		return err
	}
	verifier, challenge := newPKCE()
	state := signInState()
	authURL, err := authorizeURL(*provider, state, challenge)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "brama: open this URL, sign in, then paste the code (or the whole redirect URL) as the next line:\n%s\n", authURL)
	line, _ := in.ReadString('\n')
	code := strings.TrimSpace(line)
	if code == "" {
		return errors.New("sign-in stopped: no authorization code on stdin")
	}
	o := newOAuth(e.getenv, newProviderClient(), nil, nil, slog.New(slog.DiscardHandler), time.Now)
	grant, err := o.exchangeCode(e.ctx, *provider, code, verifier, state)
	if err != nil {
		return fmt.Errorf("sign-in failed, nothing was stored: %w", err)
	}
	if *id != "" {
		if _, err := g.call("PUT", subscriptionPath(*agent, *id, "credential"), credentialBody{OAuth: &grant}); err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "brama: signed in; subscription %s of agent %s has a new %s grant\n", *id, *agent, *provider)
		fmt.Fprintln(e.stdout, *id)
		return nil
	}
	b, err := g.call("POST", subscriptionPath(*agent)+"?via="+signInVia, donation{Provider: *provider, Label: *label, OAuth: &grant})
	if err != nil {
		return err
	}
	var ans struct {
		Subscription donatedSubscription `json:"subscription"`
	}
	if err := json.Unmarshal(b, &ans); err != nil || ans.Subscription.ID == "" {
		return fmt.Errorf("the gateway's answer names no subscription: %s", truncateUTF8(string(b), 200))
	}
	fmt.Fprintf(e.stderr, "brama: signed in; donated %s subscription %s to agent %s\n", *provider, ans.Subscription.ID, *agent)
	fmt.Fprintln(e.stdout, ans.Subscription.ID)
	return nil
}

// checkSignInTarget lists agent's subscriptions: it proves the gateway is
// reachable and the bearer is an admin's, and with id that agent owns a
// subscription id of provider that is not retired.
func (g *subGateway) checkSignInTarget(agent, id, provider string) error {
	b, err := g.call("GET", subscriptionPath(agent), nil)
	if err != nil || id == "" {
		return err
	}
	var body struct {
		Subscriptions []subscriptionRow `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return fmt.Errorf("the gateway's listing is not JSON: %w", err)
	}
	i := slices.IndexFunc(body.Subscriptions, func(r subscriptionRow) bool { return r.ID == id })
	switch {
	case i < 0:
		return fmt.Errorf("agent %q has no subscription %q; nothing to sign in", agent, id)
	case body.Subscriptions[i].Provider != provider:
		return fmt.Errorf("subscription %s is a %s subscription, not %s", id, body.Subscriptions[i].Provider, provider)
	case body.Subscriptions[i].Status == "retired":
		return fmt.Errorf("subscription %s is retired; reinstate it before signing in", id)
	}
	return nil
}

// answersCmd runs `brama answers verify|prune` (SPEC §12 items 6 and 7).
func (e cliEnv) answersCmd(args []string) error {
	return e.sub("answers", args, map[string]func([]string) error{"verify": e.answersVerify, "prune": e.answersPrune})
}

// answersVerify prints ok when a kept answer file (or, with -signature, a
// file of raw body bytes) carries a good signature; a mismatch exits 1.
func (e cliEnv) answersVerify(args []string) error {
	fs := e.newFlags("answers verify")
	sig := fs.String("signature", "", "check `v1=HEX` (a Brama-Answer-Signature) over FILE's raw bytes instead of reading FILE as a kept answer")
	pos, err := parseFlags(fs, args, 1, "answers verify [-signature v1=HEX] FILE")
	if err != nil {
		return err
	}
	if *sig != "" && !isAnswerSignature(strings.ToLower(*sig)) {
		return &usageError{"-signature must be v1= followed by 64 hex digits"}
	}
	if err := verifyAnswerFile(resolveState(e.getenv), pos[0], strings.ToLower(*sig)); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "ok")
	return nil
}

// answersPrune removes complete kept answers older than -older-than.
func (e cliEnv) answersPrune(args []string) error {
	fs := e.newFlags("answers prune")
	olderThan := fs.Duration("older-than", -1, "remove complete answers kept longer ago than this `duration` (e.g. 720h)")
	if _, err := parseFlags(fs, args, 0, "answers prune -older-than DURATION"); err != nil {
		return err
	}
	if *olderThan < 0 {
		return &usageError{"usage: brama answers prune -older-than DURATION (a duration of zero or more)"}
	}
	dir, err := resolveState(e.getenv).path("signed answers", "answers")
	if err != nil {
		return err
	}
	removed, err := pruneAnswers(dir, time.Now().Add(-*olderThan), func(name string, err error) {
		fmt.Fprintf(e.stderr, "brama: skipped %s: %v\n", name, err)
	})
	fmt.Fprintf(e.stdout, "removed %d complete answers older than %s\n", removed, *olderThan)
	return err
}
