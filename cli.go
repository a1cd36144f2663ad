package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// The CLI commands that edit state in-process, each file under its lock
// (SPEC §2.3); cli_gateway.go holds those that ask the daemon.

// sys is a command's logger (to stderr, at BRAMA_LOG_LEVEL) and clock.
func (e cliEnv) sys() sys {
	return sys{log: newLogger(e.stderr, e.getenv("BRAMA_LOG_LEVEL")), now: time.Now}
}

// said prints a command's success line, unless err.
func (e cliEnv) said(err error, format string, args ...any) error {
	if err == nil {
		fmt.Fprintf(e.stdout, format, args...)
	}
	return err
}

func (e cliEnv) routesList(args []string) error {
	fs := e.newFlags("routes list")
	asJSON := fs.Bool("json", false, "print the body of GET /v1/aliases")
	if _, err := parseFlags(fs, args, 0, "routes list [-json]"); err != nil {
		return err
	}
	return e.printAliases(openDeps(e.getenv, e.sys()), *asJSON)
}

// printAliases prints the alias table (GET /v1/aliases): one aligned row
// per alias and the unserviceable count, or with asJSON the body.
func (e cliEnv) printAliases(d deps, asJSON bool) error {
	t, err := d.reg.aliases(func(p string) bool { return d.vault.directKey(p) != "" })
	if err != nil {
		return err
	}
	if asJSON {
		b, _ := json.Marshal(t)
		fmt.Fprintf(e.stdout, "%s\n", b)
		return nil
	}
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
	return nil
}

func (e cliEnv) routesSet(pos []string) error {
	d := openDeps(e.getenv, e.sys())
	if _, err := d.reg.set(pos[0], pos[1], "cli"); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "set %s -> %s\n", pos[0], pos[1])
	return e.printAliases(d, false)
}

func (e cliEnv) routesRm(pos []string) error {
	d := openDeps(e.getenv, e.sys())
	if _, err := d.reg.remove(pos[0], "cli"); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "removed %s\n", pos[0])
	return e.printAliases(d, false)
}

func (e cliEnv) routesMigrate(args []string) error {
	fs := e.newFlags("routes migrate")
	file := fs.String("file", "", "registry `file` to migrate (default: the registry Brama reads)")
	asJSON := fs.Bool("json", false, `print {"ok":true,"file":F,"dropped":[…],"document":{…}}`)
	if _, err := parseFlags(fs, args, 0, "routes migrate [-file F] [-json]"); err != nil {
		return err
	}
	path, err := *file, error(nil)
	if path == "" {
		path, err = registryPath(resolveState(e.getenv), e.getenv)
	}
	var committed []byte
	var dropped []string
	if err == nil {
		committed, dropped, _, err = migrateRegistry(path)
	}
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

func (e cliEnv) clientsAdd(args []string) error {
	fs := e.newFlags("clients add")
	admin := fs.Bool("admin", false, "give the client the admin role (reaches /v1/admin/*)")
	agent := fs.String("agent", "", "bind the client's bearer to `agent`")
	var allow []string
	fs.Func("allow", "allow only this model `name` (repeatable; exact names)", func(v string) error {
		allow = append(allow, v)
		return nil
	})
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

func (e cliEnv) clientsRm(pos []string) error {
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
	return e.said(err, "removed client %s\n", pos[0])
}

// onboardCmd is `brama onboard` (SPEC §14): exit 0 when the journey is
// complete or stopped on purpose before the billable step.
func (e cliEnv) onboardCmd(args []string) error {
	fs := e.newFlags("onboard")
	model := fs.String("model", "", "the `route` of the one real call: a direct route, a deployment, or an alias to one")
	allowCost := fs.Bool("allow-provider-cost", false, "make the one real (billable) model call")
	if _, err := parseFlags(fs, args, 0, "onboard [-model ROUTE] [-allow-provider-cost]"); err != nil {
		return err
	}
	return onboard(e.ctx, e.getenv, e.sys(), *model, *allowCost, func(line string) { fmt.Fprintln(e.stdout, line) })
}

// credentialsSet stores a direct API key read from stdin's first line; it
// never takes the key as a flag (flags show up in ps).
func (e cliEnv) credentialsSet(pos []string) error {
	p, ok := lookupProvider(pos[0])
	if !ok || p.cred != credDirect {
		return fmt.Errorf("%q is not a provider that takes a direct API key", pos[0])
	}
	line, err := bufio.NewReader(e.stdin).ReadString('\n')
	key := strings.TrimSpace(line)
	if key == "" {
		return fmt.Errorf("no API key on stdin (%v)", errors.Join(err, errors.New("empty line")))
	}
	err = openDeps(e.getenv, e.sys()).vault.update(func(d *vaultDoc) error {
		d.Direct[p.id] = vaultKey{APIKey: key}
		return nil
	})
	return e.said(err, "stored the direct credential for %s in the vault\n", p.id)
}

func (e cliEnv) journalCheck([]string) error {
	j := newJournal(resolveState(e.getenv), e.sys())
	ok, err := checkJournal(j, e.stdout)
	if err == nil && !ok {
		err = errRefused
	}
	return err
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
	return e.said(verifyAnswerFile(resolveState(e.getenv), pos[0], strings.ToLower(*sig)), "ok\n")
}

// answersPrune removes complete kept answers older than -older-than.
func (e cliEnv) answersPrune(args []string) error {
	fs := e.newFlags("answers prune")
	olderThan := fs.Duration("older-than", 0, "remove complete answers kept longer ago than this `duration` (e.g. 720h)")
	if _, err := parseFlags(fs, args, 0, "answers prune -older-than DURATION"); err != nil {
		return err
	}
	if fs.NFlag() == 0 || *olderThan < 0 { // required: no default to show in -h
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
