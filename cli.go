package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
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

// wrote tells, on stderr, which file a command changed, and warns when no
// serve holds the state directory: nothing serves the change until one starts.
func (e cliEnv) wrote(path string) {
	fmt.Fprintf(e.stderr, "brama: wrote %s\n", path)
	if st := resolveState(e.getenv); st.dir != "" && !serveHolds(st) {
		fmt.Fprintf(e.stderr, "brama: warning: no brama serve holds %s; the change serves once one starts: brama serve\n",
			filepath.Join(st.dir, "serve.lock"))
	}
}

// table prints rows aligned under header (tab-separated cells).
func (e cliEnv) table(header string, rows []string) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, r)
	}
	tw.Flush()
}

// serveHolds says whether a brama serve holds s's serve.lock; it creates no
// file, and its shared try-lock ends as it returns.
func serveHolds(s state) bool {
	f, err := os.OpenFile(filepath.Join(s.dir, "serve.lock"), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	return errors.Is(syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB), syscall.EWOULDBLOCK)
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
	rows := []string{}
	for _, a := range t.Aliases {
		route := "-"
		if a.Route != nil {
			route = *a.Route
		}
		rows = append(rows, strings.Join([]string{a.Alias, a.State, route, a.Reason}, "\t"))
	}
	e.table("ALIAS\tSTATE\tROUTE\tREASON", rows)
	fmt.Fprintf(e.stdout, "%d alias(es), %d cannot serve\n", len(t.Aliases), t.Unserviceable)
	return nil
}

func (e cliEnv) routesSet(pos []string) error {
	d := openDeps(e.getenv, e.sys())
	if _, err := d.reg.set(pos[0], pos[1], "cli"); err != nil {
		return err
	}
	e.wrote(d.reg.path)
	fmt.Fprintf(e.stdout, "set %s -> %s\n", pos[0], pos[1])
	return e.printAliases(d, false)
}

func (e cliEnv) routesRm(pos []string) error {
	d := openDeps(e.getenv, e.sys())
	if _, err := d.reg.remove(pos[0], "cli"); err != nil {
		return err
	}
	e.wrote(d.reg.path)
	fmt.Fprintf(e.stdout, "removed %s\n", pos[0])
	return e.printAliases(d, false)
}

// deploymentsAdd declares a local OpenAI-compatible server (SPEC §4.1)
// through the registry's one writer.
func (e cliEnv) deploymentsAdd(args []string) error {
	fs := e.newFlags("deployments add")
	var d deployment
	fs.StringVar(&d.Endpoint.Host, "host", "127.0.0.1", "the server's IPv4 loopback or 100.64.0.0/10 `address`")
	fs.IntVar(&d.Endpoint.Port, "port", 0, "the server's `port` (required)")
	fs.StringVar(&d.Model, "model", "", "the upstream `model` name (default: NAME)")
	pos, err := parseFlags(fs, args, 1, "deployments add NAME -port PORT [-host H] [-model M]")
	if err != nil {
		return err
	}
	d.Name = pos[0]
	reg := openDeps(e.getenv, e.sys()).reg
	if _, err := reg.setDeployment(d, false); err != nil {
		return err
	}
	e.wrote(reg.path)
	return e.said(nil, "added deployment %s at %s; route to it: brama routes set ALIAS %s\n", d.Name, d.baseURL(), d.Name)
}

func (e cliEnv) deploymentsRm(pos []string) error {
	reg := openDeps(e.getenv, e.sys()).reg
	if _, err := reg.setDeployment(deployment{Name: pos[0]}, true); err != nil {
		return err
	}
	e.wrote(reg.path)
	return e.said(nil, "removed deployment %s\n", pos[0])
}

func (e cliEnv) deploymentsList(pos []string) error {
	doc, err := openDeps(e.getenv, e.sys()).reg.current()
	if err != nil {
		return err
	}
	rows := []string{}
	for _, d := range doc.Deployments {
		names := []string{}
		for _, a := range d.Adapters {
			names = append(names, a.Name)
		}
		rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s", d.Name, d.baseURL(), cmp.Or(d.Model, d.Name), cmp.Or(strings.Join(names, ","), "-")))
	}
	e.table("NAME\tENDPOINT\tMODEL\tADAPTERS", rows)
	return nil
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
	e.wrote(path)
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
	e.wrote(path)
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
	if err == nil {
		e.wrote(path)
	}
	return e.said(err, "removed client %s\n", pos[0])
}

// clientsList prints each client's id, role, agent and allowlist; never a
// token or its digest.
func (e cliEnv) clientsList(pos []string) error {
	doc, err := openDeps(e.getenv, e.sys()).clients.load()
	if errors.Is(err, errFileAbsent) {
		doc, err = &clientsDoc{}, nil
	}
	if err != nil {
		return err
	}
	rows := []string{}
	for _, c := range doc.Clients {
		allow := "(any model)"
		if c.AllowedModels != nil {
			allow = strings.Join(c.AllowedModels, ",")
		}
		rows = append(rows, strings.Join([]string{c.ID, c.Role, cmp.Or(c.AgentID, "-"), allow}, "\t"))
	}
	e.table("ID\tROLE\tAGENT\tALLOWED", rows)
	return nil
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
	v := openDeps(e.getenv, e.sys()).vault
	err = v.update(func(d *vaultDoc) error {
		d.Direct[p.id] = vaultKey{APIKey: key}
		return nil
	})
	if err == nil {
		e.wrote(v.path)
	}
	return e.said(err, "stored the direct credential for %s in the vault\n", p.id)
}

func (e cliEnv) credentialsRm(pos []string) error {
	v := openDeps(e.getenv, e.sys()).vault
	err := v.update(func(d *vaultDoc) error {
		if _, ok := d.Direct[pos[0]]; !ok {
			return fmt.Errorf("the vault holds no direct credential for %q", pos[0])
		}
		delete(d.Direct, pos[0])
		return nil
	})
	if err == nil {
		e.wrote(v.path)
	}
	return e.said(err, "removed the direct credential for %s\n", pos[0])
}

// credentialsList prints the providers the vault holds a direct key for:
// names only, never a key.
func (e cliEnv) credentialsList(pos []string) error {
	doc, err := openDeps(e.getenv, e.sys()).vault.load()
	if err != nil {
		return err
	}
	for _, p := range slices.Sorted(maps.Keys(doc.Direct)) {
		fmt.Fprintln(e.stdout, p)
	}
	return nil
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
