// Brama is a small LLM gateway daemon. Callers send OpenAI Chat
// Completions, Anthropic Messages or OpenAI Responses requests to one
// endpoint; Brama resolves the model name, decides which account pays, makes
// a strictly bounded number of provider calls and answers with the result or
// exactly one classified refusal. It is not a load balancer, a cache of
// answers, or a retry engine.
//
// Run it:
//
//	go run . serve            # listens on 127.0.0.1:8080
//	go build && ./brama serve # or copy the one static binary anywhere
//
// Commands (each prints its flags with -h):
//
//	brama serve [-addr ADDR] [-local-credentials-stdin]
//	brama version
//	brama routes list [-json] | set ALIAS DEST | rm ALIAS | migrate [-file F] [-json]
//	brama clients add ID [-admin] [-agent A] [-allow NAME]... | rm ID | list
//	brama deployments add NAME -port PORT [-host H] [-model M] | rm NAME | list
//	brama credentials set PROVIDER (API key on stdin) | rm PROVIDER | list
//	brama subscription add -provider P -agent A [-label L] [-oauth-file F] | list -agent A [-json]
//	        | retire -agent A [-reason R] ID | reinstate -agent A -reason R ID
//	        | import -provider claude-code|codex -from FILE -agent A [-label L]
//	        | sign-in -provider claude-code|codex -agent A [-id ID | -label L]
//	        (each takes -gateway URL; bearer from BRAMA_TOKEN, else stdin's first line)
//	brama onboard [-model ROUTE] [-allow-provider-cost]
//	brama journal check
//	brama maintain [-gateway URL] [-json]
//	brama answers verify [-signature v1=HEX] FILE | prune -older-than DURATION
//
// State lives in BRAMA_STATE_DIR, else ~/.brama (0700, files 0600). With
// neither, Brama still serves and every state reader and writer refuses
// naming the cause. README.md is the full manual.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
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

// usageError is a command line Brama could not understand (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// errRefused marks a refusal already explained (exit 1, nothing printed).
var errRefused = errors.New("refused")

// exitCode prints err and maps it to SPEC §16.1's exit codes.
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errRefused):
		return 1
	}
	fmt.Fprintf(stderr, "brama: %v\n", err)
	if errors.As(err, new(*usageError)) {
		return 2
	}
	return 1
}

// runUsage is run's usage line.
const runUsage = "usage: brama serve|version|routes|clients|deployments|credentials|subscription|onboard|journal|maintain|answers ... (-h on each)"

// run is the whole program: it dispatches one subcommand and returns only
// after every goroutine it started has exited (cut: see cliEnv).
func run(ctx context.Context, cut <-chan struct{}, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return &usageError{runUsage}
	}
	e := cliEnv{ctx: ctx, cut: cut, getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	cmd, rest := args[0], args[1:]
	subs := map[string]map[string]func([]string) error{
		"routes": {
			"list": e.routesList, "migrate": e.routesMigrate,
			"set": e.positional("routes set ALIAS DESTINATION", 2, e.routesSet),
			"rm":  e.positional("routes rm ALIAS", 1, e.routesRm),
		},
		"clients": {
			"add": e.clientsAdd, "rm": e.positional("clients rm ID", 1, e.clientsRm),
			"list": e.positional("clients list", 0, e.clientsList),
		},
		"deployments": {
			"add": e.deploymentsAdd, "rm": e.positional("deployments rm NAME", 1, e.deploymentsRm),
			"list": e.positional("deployments list", 0, e.deploymentsList),
		},
		"credentials": {
			"set":  e.positional("credentials set PROVIDER  (the API key on stdin)", 1, e.credentialsSet),
			"rm":   e.positional("credentials rm PROVIDER", 1, e.credentialsRm),
			"list": e.positional("credentials list", 0, e.credentialsList),
		},
		"journal": {"check": e.positional("journal check", 0, e.journalCheck)},
		"answers": {"verify": e.answersVerify, "prune": e.answersPrune},
		"subscription": {
			"add": e.subscriptionAdd, "list": e.subscriptionList, "import": e.subscriptionImport,
			"retire":        func(args []string) error { return e.subscriptionStatus("retire", args) },
			"reinstate":     func(args []string) error { return e.subscriptionStatus("reinstate", args) },
			"sign-in":       e.subscriptionSignIn,
			"prune-orphans": e.subscriptionPruneOrphans,
		},
	}
	switch cmd {
	case "serve":
		return serve(ctx, rest, e)
	case "version":
		if _, err := parseFlags(e.newFlags("version"), rest, 0, "version"); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "brama %s\n", version)
		return nil
	case "onboard":
		return e.onboardCmd(rest)
	case "maintain":
		return e.maintainCmd(rest)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, runUsage)
		return nil
	}
	sub := subs[cmd]
	if sub == nil {
		return &usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
	if len(rest) == 0 || sub[rest[0]] == nil {
		names := strings.Join(slices.Sorted(maps.Keys(sub)), "|")
		return &usageError{fmt.Sprintf("usage: brama %s %s ... (-h on each)", cmd, names)}
	}
	return sub[rest[0]](rest[1:])
}

// cliEnv is what every command reads and writes besides its arguments.
type cliEnv struct {
	ctx    context.Context // serve's first stop signal; a CLI command ends on a signal (main)
	cut    <-chan struct{} // closed on the second signal: serve cuts its running requests
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// newFlags makes a flag set that prints to stderr and returns errors.
func (e cliEnv) newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("brama "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}

// positional makes run a subcommand with no flags and n positionals; usage
// (after "brama ") starts with the subcommand's two words.
func (e cliEnv) positional(usage string, n int, run func(pos []string) error) func([]string) error {
	return func(args []string) error {
		pos, err := parseFlags(e.newFlags(strings.Join(strings.Fields(usage)[:2], " ")), args, n, usage)
		if err != nil {
			return err
		}
		return run(pos)
	}
}

// parseFlags parses args allowing flags and positionals in any order
// (SPEC §16.1) and checks the positional count.
func parseFlags(fs *flag.FlagSet, args []string, positionals int, usage string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
			return nil, err
		} else if err != nil {
			return nil, &usageError{err.Error()}
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(pos) != positionals {
		return nil, &usageError{"usage: brama " + usage}
	}
	return pos, nil
}

// testingOnlyNow replaces the serving process's clock in tests.
var testingOnlyNow func() time.Time

// testingOnlyKeepAlive shortens the stream keep-alive interval in tests.
var testingOnlyKeepAlive time.Duration

// deps are the state-backed parts every command and the server share.
type deps struct {
	st      state
	clients *clientStore
	vault   *vault
	journal *journal
	reg     *registry
}

// openDeps resolves every state file path (SPEC §2.1, §2.2); nothing is
// read yet.
func openDeps(getenv func(string) string, sy sys) deps {
	st := resolveState(getenv)
	cpath, cerr := st.fileOrState(getenv, "BRAMA_CLIENTS_FILE", "clients file", "clients.json")
	vpath, verr := st.fileOrState(getenv, "BRAMA_VAULT_FILE", "vault", "vault.json")
	rpath, rerr := registryPath(st, getenv)
	j := newJournal(st, sy)
	return deps{st, newClientStore(cpath, cerr), newVault(vpath, verr), j, newRegistry(rpath, rerr, j, sy.log)}
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
func serve(ctx context.Context, args []string, e cliEnv) error {
	fs := e.newFlags("serve")
	addr := fs.String("addr", "127.0.0.1:8080", "`address` to listen on")
	localCreds := fs.Bool("local-credentials-stdin", false, "read a JSON object provider → API key from stdin and keep it in memory only; it becomes the only source of direct credentials")
	if _, err := parseFlags(fs, args, 0, "serve [-addr ADDR] [-local-credentials-stdin]"); err != nil {
		return err
	}
	if err := checkListenAddr(*addr); err != nil {
		return err
	}
	signal.Ignore(syscall.SIGPIPE) // a log reader gone (`serve 2>&1 | logger`) ends no generation: its lines are lost
	sy := e.sys()
	if testingOnlyNow != nil {
		sy.now = testingOnlyNow
	}
	log, now := sy.log, sy.now
	maxBody, err := envWhole(e.getenv, "BRAMA_MAX_REQUEST_BYTES", "bytes", 1, defaultMaxRequestBytes, 64)
	if err != nil {
		return err
	}
	d := openDeps(e.getenv, sy)
	lock, err := lockServe(d.st)
	if err != nil {
		return err
	}
	if lock != nil {
		defer lock.Close()
		n, err := removeStaleTemps(d.st.dir, d.vault.path, d.reg.path, d.clients.path)
		if err != nil {
			log.Warn("state_temp_files_unremoved", "removed", n, "cause", err.Error())
		} else if n > 0 {
			log.Info("state_temp_files_removed", "count", n)
		}
	}
	guard, err := newTransportGuard(e.getenv("BRAMA_TRUSTED_PROXY_IPS"))
	if err != nil {
		return err
	}
	client := newProviderClient()
	s := &server{
		core: core{
			deps: d, sys: sy, getenv: e.getenv, client: client, keepAlive: testingOnlyKeepAlive,
			catalog: newCatalog(d.st, e.getenv, client, log, now),
			perf:    newPerfRegistry(d.st, sy),
			ledger:  newLedger(d.st, log, now),
		},
		guard: guard, maxBody: maxBody,
		answers: newAnswerStore(d.st, log, now),
		replay:  newReplayGuard(e.getenv, log, now),
	}
	defer s.ledger.flush()
	s.inv = newInventory(d.st, s.vault, s.journal, s.ledger, e.getenv, sy)
	if ids, _ := s.inv.orphans(); len(ids) > 0 { // kept: /readyz names them (SPEC §17)
		log.Warn("vault_orphans_unremoved", "count", len(ids), "remove_with", "brama subscription prune-orphans")
	}
	s.oauth = newOAuth(e.getenv, client, s.vault, s.ledger, log, now)
	defer s.oauth.shutdown(e.cut)
	s.maint = newMaintainer(s.inv, s.ledger, s.oauth, client, e.getenv, log, now)
	if *localCreds {
		if s.localCreds, err = readLocalCredentials(e.stdin); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", *addr) // before the first client: its token is shown once, not to a start that fails
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := ensureFirstClient(s.clients, e.stderr); err != nil {
		return err
	}
	s.routes()

	// Every request context descends from base, so requests still running
	// at the second signal are cancelled with errServerShutdown.
	base, stopRequests := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopRequests(nil)
	srv := &http.Server{
		Handler:     s,
		BaseContext: func(net.Listener) context.Context { return base },
		// OPTIONS * reaches ServeHTTP too, for its envelope and log line.
		DisableGeneralOptionsHandler: true,
		// Only how long a client takes to send headers is bounded; reads and
		// writes have no deadline, so a long generation is never cut (SPEC §7.4).
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	fmt.Fprintf(e.stdout, "listening on http://%s\n", ln.Addr())
	fmt.Fprintln(e.stdout, serveNotes(s))
	log.Info("serve_started", "addr", ln.Addr().String(), "version", version, "state_dir", d.st.dir != "")

	var wg sync.WaitGroup
	defer wg.Wait()
	bg, stopBackground := context.WithCancel(ctx)
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
	case <-ctx.Done():
	case err = <-serveErr:
		return err
	}
	// No grace period of Brama's own (SPEC §7.4): the running requests end
	// when their providers finish, or at the second signal.
	log.Info("serve_draining")
	drained := make(chan error, 1)
	go func() { drained <- srv.Shutdown(context.WithoutCancel(ctx)) }()
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
		return &usageError{fmt.Sprintf("-addr %q is not HOST:PORT to listen on (e.g. 127.0.0.1:8080): %v", addr, err)}
	}
	return nil
}

// readLocalCredentials reads `{"provider":"api key",…}` from stdin.
func readLocalCredentials(r io.Reader) (map[string]string, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	creds := map[string]string{}
	if err := decodeStrict("-local-credentials-stdin", b, &creds); err != nil {
		return nil, err
	} else if creds == nil { // null: no map, and the vault's keys would be read
		return nil, errors.New("-local-credentials-stdin: not a JSON object")
	}
	for p, key := range creds {
		if info, ok := lookupProvider(p); !ok || info.cred != credDirect {
			return nil, fmt.Errorf("-local-credentials-stdin: %q is not a provider that takes a direct API key", p)
		} else if key = strings.TrimSpace(key); key == "" { // a key file's newline goes, as credentials set trims it
			return nil, fmt.Errorf("-local-credentials-stdin: the API key for %q is empty", p)
		} else if !printable(key) {
			return nil, fmt.Errorf("-local-credentials-stdin: the API key for %q must be one line of printable text", p)
		}
		creds[p] = key
	}
	return creds, nil
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
