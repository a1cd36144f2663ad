// Brama is a small LLM gateway daemon. Callers send OpenAI Chat
// Completions, Anthropic Messages or OpenAI Responses requests to one
// endpoint; Brama resolves the model name, decides which account pays, makes
// a strictly bounded number of provider calls and answers with the result or
// exactly one classified refusal. It is not a load balancer, a cache of
// answers, or a retry engine.
//
// Run it, and test it:
//
//	go run . serve    # listens on 127.0.0.1:8080; brama help lists the commands
//	go test ./...
//
// State lives in BRAMA_STATE_DIR, else ~/.brama (0700, files 0600). With
// neither, Brama still serves and every state reader and writer refuses
// naming the cause.
//
// Reading order, as a request meets the files: main.go (run, parsing, help,
// exit codes, serve) and cli.go (the command table); server.go (routes, who
// may call, handlers); answers.go, replay.go (signed answers); dispatch.go,
// pool.go (plan, the attempt engine, who pays); providers.go, passthrough.go,
// formats.go and one file per wire format, relay.go, sse.go; errors.go;
// subscriptions.go, ledger.go, oauth.go; maintain.go; catalog.go, perf.go,
// onboard.go; journal.go, state.go at the ground.
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

// version is reported by /health and `brama version`.
const version = "0.1.0-dev"

// main: a CLI command keeps the signals' default effect, so one SIGINT ends
// it wherever it waits, reading stdin included (SPEC §17). For serve the first
// SIGINT, SIGTERM or SIGHUP (a closed terminal) ends ctx (serve stops taking
// requests and lets the running ones end), the second closes cut (serve cuts
// what still runs). A SIGHUP ignored at start (nohup) stays ignored.
func main() {
	ctx, drain := context.WithCancel(context.Background())
	cut := make(chan struct{})
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		sig := make(chan os.Signal, 2) // the second is never dropped, however quick
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		if !signal.Ignored(syscall.SIGHUP) {
			signal.Notify(sig, syscall.SIGHUP)
		}
		go func() {
			<-sig
			drain()
			<-sig
			close(cut)
			signal.Stop(sig) // a third signal has its default effect
		}()
	}
	os.Exit(exitCode(run(ctx, cut, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr), os.Stderr))
}

// run is the whole program: it runs one command of the table and returns
// only after every goroutine it started has exited (cut: see cliEnv).
func run(ctx context.Context, cut <-chan struct{}, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	e := &cliEnv{ctx: ctx, cut: cut, getenv: getenv, in: bufio.NewReader(stdin), stdout: stdout, stderr: stderr}
	switch {
	case len(args) == 0:
		help(stderr)
		return &usageError{msg: "want a command"}
	case slices.Contains([]string{"help", "-h", "-help", "--help"}, args[0]):
		help(stdout)
		return nil
	case args[0] == "-version" || args[0] == "--version":
		args = append([]string{"version"}, args[1:]...)
	}
	return e.runCommand(lookup(args))
}

// command is one row of the CLI: `brama help` prints its name and purpose;
// `brama NAME -h` its usage line, purpose, flags and example.
type command struct {
	name, args, purpose, example string             // name: one or two words; args: the usage line after it
	pos                          int                // positionals it takes
	need                         []string           // flags that must be given, not blank
	gateway                      bool               // calls the daemon: -gateway, then the bearer
	flags                        []flagSpec         // declared in this order
	check                        func(o opts) error // before the bearer is read
	run                          func(e *cliEnv, o opts, pos []string) error
}

// flagSpec is one flag; its default's type picks the kind: string, bool,
// int, time.Duration, or []string for a repeatable one.
type flagSpec struct {
	name string
	def  any
	help string
}

// opts is a command line's flag values by name, each a pointer of its kind.
type opts map[string]any

func (o opts) s(name string) string { return *o[name].(*string) }
func (o opts) b(name string) bool   { return *o[name].(*bool) }

// cliEnv is what every command reads and writes besides its arguments.
type cliEnv struct {
	ctx            context.Context // serve's first stop signal; a CLI command ends on a signal (main)
	cut            <-chan struct{} // closed on the second signal: serve cuts its running requests
	getenv         func(string) string
	in             *bufio.Reader // stdin: the bearer, then an API key or a pasted code, by lines
	stdout, stderr io.Writer
	gateway, auth  string // a gateway command's daemon URL and bearer
}

// usageError is a command line Brama could not understand (exit 2).
type usageError struct{ cmd, msg string }

func (e *usageError) Error() string {
	if e.cmd == "" {
		return "brama: " + e.msg
	}
	return fmt.Sprintf("brama %s: %s; see brama %s -h", e.cmd, e.msg, e.cmd)
}

// errRefused marks a refusal already explained (exit 1, nothing printed).
var errRefused = errors.New("refused")

// exitCode prints err and maps it to SPEC §16.1's exit codes.
func exitCode(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errRefused):
		return 1
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, ue)
		return 2
	}
	fmt.Fprintf(stderr, "brama: %v\n", err)
	return 1
}

// lookup finds args' command: two words, else one; else a usage error
// naming the group's commands.
func lookup(args []string) (command, []string, error) {
	cmds := commands()
	for n := min(2, len(args)); n > 0; n-- {
		if i := slices.IndexFunc(cmds, func(c command) bool { return c.name == strings.Join(args[:n], " ") }); i >= 0 {
			return cmds[i], args[n:], nil
		}
	}
	var subs []string
	for _, c := range cmds {
		if group, sub, ok := strings.Cut(c.name, " "); ok && group == args[0] {
			subs = append(subs, sub)
		}
	}
	msg := fmt.Sprintf("unknown command %q; see brama help", args[0])
	if len(subs) > 0 {
		msg = fmt.Sprintf("%s wants one of %s; see brama help", args[0], strings.Join(subs, ", "))
		if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
			msg = fmt.Sprintf("unknown command %q: %s", args[0]+" "+args[1], msg)
		}
	}
	return command{}, nil, &usageError{msg: msg}
}

// help lists every command with its purpose.
func help(w io.Writer) {
	fmt.Fprint(w, "usage: brama COMMAND [flags] [arguments]; brama COMMAND -h prints its flags and an example\n\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.purpose)
	}
	tw.Flush()
}

// runCommand parses args for c, flags and positionals in either order (SPEC
// §16.1): -h prints c's help on stdout; a usage error names c's help.
func (e *cliEnv) runCommand(c command, args []string, err error) error {
	if err != nil {
		return err
	}
	fs, o := flag.NewFlagSet("brama "+c.name, flag.ContinueOnError), opts{}
	fs.SetOutput(io.Discard)
	if c.gateway {
		c.flags = append(c.flags, flagSpec{"gateway", "http://127.0.0.1:8080", "the brama serve `URL` to call"})
	}
	for _, f := range c.flags {
		switch d := f.def.(type) {
		case string:
			o[f.name] = fs.String(f.name, d, f.help)
		case bool:
			o[f.name] = fs.Bool(f.name, d, f.help)
		case int:
			o[f.name] = fs.Int(f.name, d, f.help)
		case time.Duration:
			o[f.name] = fs.Duration(f.name, d, f.help)
		case []string:
			p := new([]string)
			o[f.name] = p
			fs.Func(f.name, f.help, func(v string) error { *p = append(*p, v); return nil })
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(e.stdout, "usage: brama %s %s\n\n%s.\n", c.name, c.args, c.purpose)
			if len(c.flags) > 0 {
				fmt.Fprintln(e.stdout, "\nflags:")
				fs.SetOutput(e.stdout)
				fs.PrintDefaults()
			}
			fmt.Fprintf(e.stdout, "\nexample:\n  %s\n", c.example)
			return err
		} else if err != nil {
			return &usageError{c.name, err.Error()}
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(pos) != c.pos {
		return &usageError{c.name, "want " + cmp.Or(c.args, "no arguments")}
	}
	var missing []string
	for _, name := range c.need {
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
		if !set || strings.TrimSpace(fs.Lookup(name).Value.String()) == "" {
			missing = append(missing, "-"+name)
		}
	}
	if len(missing) > 0 {
		return &usageError{c.name, "want " + strings.Join(missing, " and ")}
	}
	if c.check != nil {
		err = c.check(o)
	}
	if err == nil && c.gateway {
		err = e.dial(o.s("gateway"))
	}
	if err == nil {
		err = c.run(e, o, pos)
	}
	if ue := (*usageError)(nil); errors.As(err, &ue) && ue.cmd == "" {
		ue.cmd = c.name
	}
	return err
}

// deps opens the state files, with the command's logger and clock.
func (e *cliEnv) deps() deps { return openDeps(e.getenv, e.sys()) }

// sys is a command's logger (to stderr, at BRAMA_LOG_LEVEL) and clock.
func (e *cliEnv) sys() sys {
	return sys{log: newLogger(e.stderr, e.getenv("BRAMA_LOG_LEVEL")), now: time.Now}
}

// say prints a command's success line, unless err.
func (e *cliEnv) say(err error, format string, args ...any) error {
	if err == nil {
		fmt.Fprintf(e.stdout, format, args...)
	}
	return err
}

// wrote reports a write, unless err: which file changed, and a warning when
// no serve holds the state directory (nothing serves the change until one
// starts), on stderr; the success line on stdout.
func (e *cliEnv) wrote(path string, err error, format string, args ...any) error {
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "brama: wrote %s\n", path)
	if st := resolveState(e.getenv); st.dir != "" && !serveHolds(st) {
		fmt.Fprintf(e.stderr, "brama: warning: no brama serve holds %s; the change serves once one starts: brama serve\n",
			filepath.Join(st.dir, "serve.lock"))
	}
	return e.say(nil, format, args...)
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

// line is stdin's next line, trimmed.
func (e *cliEnv) line() string {
	s, _ := e.in.ReadString('\n')
	return strings.TrimSpace(s)
}

// testingOnlyNow replaces the serving process's clock in tests.
var testingOnlyNow func() time.Time

// testingOnlyKeepAlive shortens the stream keep-alive interval in tests.
var testingOnlyKeepAlive time.Duration

// openDeps resolves every state file path (SPEC §2.1, §2.2); nothing is
// read yet.
func openDeps(getenv func(string) string, sy sys) deps {
	st := resolveState(getenv)
	cpath, cerr := st.fileOrState(getenv, "BRAMA_CLIENTS_FILE", "clients file", "clients.json")
	vpath, verr := st.fileOrState(getenv, "BRAMA_VAULT_FILE", "vault", "vault.json")
	rpath, rerr := registryPath(st, getenv)
	j := newJournal(st, sy)
	return deps{stores{st, newVault(vpath, verr), j, newRegistry(rpath, rerr, j, sy.log)}, newClientStore(cpath, cerr)}
}

// deps are the state files every command and the server share.
type deps struct {
	stores
	clients *clientStore
}

// newLogger makes the JSON slog logger at BRAMA_LOG_LEVEL.
func newLogger(w io.Writer, level string) *slog.Logger {
	var lv slog.Level
	level = strings.TrimSpace(level)
	err := lv.UnmarshalText([]byte(level))
	if err != nil {
		lv = slog.LevelInfo
	}
	log := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lv}))
	if err != nil && level != "" {
		log.Warn("log_level_invalid", "value", level, "using", "info")
	}
	return log
}

// serve runs the daemon until ctx ends, then drains until its requests end
// or e.cut closes.
func serve(e *cliEnv, o opts, _ []string) error {
	addr, sy := o.s("addr"), e.sys()
	if err := checkListenAddr(addr); err != nil {
		return err
	}
	signal.Ignore(syscall.SIGPIPE) // a log reader gone (`serve 2>&1 | logger`) ends no generation: its lines are lost
	if testingOnlyNow != nil {
		sy.now = testingOnlyNow
	}
	log, now := sy.log, sy.now
	maxBody, err := envWhole(e.getenv, "BRAMA_MAX_REQUEST_BYTES", "bytes", 1, defaultMaxRequestBytes, 64)
	if err != nil {
		return err
	}
	guard, err := newTransportGuard(e.getenv("BRAMA_TRUSTED_PROXY_IPS"))
	if err != nil {
		return err
	}
	d := openDeps(e.getenv, sy)
	lock, err := lockServe(d.st)
	if err != nil {
		return err
	} else if lock != nil {
		defer lock.Close()
		if n, err := removeStaleTemps(d.st.dir, d.vault.path, d.reg.path, d.clients.path); err != nil {
			log.Warn("state_temp_files_unremoved", "removed", n, "cause", err.Error())
		} else if n > 0 {
			log.Info("state_temp_files_removed", "count", n)
		}
	}
	client := newProviderClient()
	s := &server{clients: d.clients, core: core{stores: d.stores, sys: sy, getenv: e.getenv, client: client, keepAlive: testingOnlyKeepAlive,
		catalog: newCatalog(d.st, e.getenv, client, log, now), perf: newPerfRegistry(d.st, sy), ledger: newLedger(d.st, log, now)},
		guard: guard, maxBody: maxBody, answers: newAnswerStore(d.st, log, now), replay: newReplayGuard(e.getenv, log, now)}
	defer s.ledger.flush()
	s.inv = newInventory(d.st, s.vault, s.journal, s.ledger, e.getenv, sy)
	if ids, _ := s.inv.orphans(); len(ids) > 0 { // kept: /readyz names them (SPEC §17)
		log.Warn("vault_orphans_unremoved", "count", len(ids), "remove_with", "brama subscription prune-orphans")
	}
	s.oauth = newOAuth(e.getenv, client, s.vault, s.ledger, log, now)
	defer s.oauth.shutdown(e.cut)
	s.maint = newMaintainer(s.inv, s.ledger, s.oauth, client, e.getenv, log, now)
	if o.b("local-credentials-stdin") {
		if s.localCreds, err = readLocalCredentials(e.in); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", addr) // before the first client: its token is shown once, not to a start that fails
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := ensureFirstClient(s.clients, e.stderr); err != nil {
		return err
	}
	s.routes()
	// Every request context descends from base, so requests still running at
	// the second signal are cancelled with errServerShutdown.
	base, stopRequests := context.WithCancelCause(context.WithoutCancel(e.ctx))
	defer stopRequests(nil)
	srv := &http.Server{Handler: s, BaseContext: func(net.Listener) context.Context { return base },
		DisableGeneralOptionsHandler: true, // OPTIONS * reaches ServeHTTP too, for its envelope and log line
		// Only sending headers is bounded: a long generation is never cut (SPEC §7.4).
		ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	fmt.Fprintf(e.stdout, "listening on http://%s\n%s\n", ln.Addr(), serveNotes(s))
	log.Info("serve_started", "addr", ln.Addr().String(), "version", version, "state_dir", d.st.dir != "")

	var wg sync.WaitGroup
	defer wg.Wait()
	bg, stopBackground := context.WithCancel(e.ctx)
	defer stopBackground()
	s.catalog.start(bg, &wg)
	s.maint.run(bg, &wg) // the listener is up: the start pass may begin
	defer s.perf.flush()
	serveErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		serveErr <- srv.Serve(ln)
	}()
	select {
	case <-e.ctx.Done():
	case err = <-serveErr:
		return err
	}
	// No grace period of Brama's own (SPEC §7.4): the running requests end
	// when their providers finish, or at the second signal.
	log.Info("serve_draining")
	drained := make(chan error, 1)
	go func() { drained <- srv.Shutdown(context.WithoutCancel(e.ctx)) }()
	select {
	case <-drained:
	case <-e.cut:
		stopRequests(errServerShutdown) // their log lines say server_shutdown
		srv.Close()
		<-drained // Shutdown returns once Close has closed every connection
	}
	s.inflight.Lock() // every request still being served has written its log line
	s.inflight.Unlock()
	return nil
}

// serveNotes is what serve prints under its address: the state directory, and
// the one step to run next while nothing can pay for a call yet.
func serveNotes(s *server) string {
	where := "state: " + s.st.dir
	if s.st.dir == "" {
		where = fmt.Sprintf("state: none (%v): nothing is kept", s.st.cause)
	}
	v, _ := s.vault.load()
	doc, _ := s.reg.current()
	if len(s.localCreds) > 0 || v != nil && len(v.Direct)+len(v.Subscriptions) > 0 || doc != nil && len(doc.Deployments) > 0 {
		return where + "\nready: brama routes list shows what each alias serves"
	}
	return where + "\nnext: brama credentials set anthropic (the API key on stdin), then brama routes set 'claude-*' 'anthropic/*'" +
		"; or a local model: brama deployments add NAME -port 11434"
}

// checkListenAddr refuses an -addr net.Listen would misread: empty (every
// interface), no port or an empty one (a random port), or a bad port.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil && port == "" {
		err = errors.New("no port")
	}
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return &usageError{msg: fmt.Sprintf("-addr %q is not HOST:PORT to listen on (e.g. 127.0.0.1:8080): %v", addr, err)}
	}
	return nil
}

// readLocalCredentials reads `{"provider":"api key",…}` from stdin; a key's
// surrounding space goes, as credentials set trims it.
func readLocalCredentials(r io.Reader) (map[string]string, error) {
	b, err := io.ReadAll(r)
	creds := map[string]string{}
	if err == nil {
		err = decodeStrict("-local-credentials-stdin", b, &creds)
	}
	if err == nil && creds == nil { // null: no map, and the vault's keys would be read
		err = errors.New("-local-credentials-stdin: not a JSON object")
	}
	for p, key := range creds {
		if info, ok := lookupProvider(p); err == nil && (!ok || info.cred != credDirect) {
			err = fmt.Errorf("-local-credentials-stdin: %q is not a provider that takes a direct API key", p)
		} else if creds[p] = strings.TrimSpace(key); err == nil && (creds[p] == "" || !printable(creds[p])) {
			err = fmt.Errorf("-local-credentials-stdin: the API key for %q is empty or not one line of printable text", p)
		}
	}
	return creds, err
}

// ensureFirstClient creates the admin client "local", its token printed
// once, when no clients file exists (SPEC §3.1); in memory with no state (§2.1).
func ensureFirstClient(c *clientStore, stderr io.Writer) error {
	tok := newToken()
	local := client{ID: "local", TokenSHA256: tokenDigest(tok), Role: roleAdmin}
	if c.pathErr != nil {
		c.memory = &clientsDoc{Clients: []client{local}}
		fmt.Fprintf(stderr, "brama: created admin client \"local\" for this process only (not kept: %v); bearer token (shown once): %s\n", c.pathErr, tok)
		return nil
	}
	if _, err := c.load(); !errors.Is(err, errFileAbsent) {
		return err // nil, or a clients file that must be repaired before serving
	}
	created := false
	err := updateClients(c.path, func(d *clientsDoc) error {
		if created = len(d.Clients) == 0; created {
			d.Clients = append(d.Clients, local)
		}
		return nil
	})
	if err == nil && created {
		fmt.Fprintf(stderr, "brama: created admin client \"local\"; bearer token (shown once): %s\n", tok)
	}
	return err
}
