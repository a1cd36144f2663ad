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
//	brama clients add ID [-admin] [-agent A] [-allow NAME]... | rm ID
//	brama agents add ID | rm ID
//	brama credentials set PROVIDER   (API key on stdin)
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// usageError is a command line Brama could not understand (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// errRefused marks a refusal already explained on stdout or stderr (exit 1,
// nothing more printed).
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
		fmt.Fprintf(stderr, "brama: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "brama: %v\n", err)
		return 1
	}
}

// run is the whole program: it dispatches one subcommand and returns only
// after every goroutine it started has exited.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return &usageError{"usage: brama serve|version|routes|clients|agents|credentials|subscription|onboard|journal|maintain|answers ... (-h on each)"}
	}
	env := cliEnv{ctx: ctx, getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(ctx, rest, env)
	case "version":
		fmt.Fprintf(stdout, "brama %s\n", version)
		return nil
	case "routes":
		return env.sub("routes", rest, map[string]func([]string) error{
			"list": env.routesList, "set": env.routesSet, "rm": env.routesRm, "migrate": env.routesMigrate,
		})
	case "clients":
		return env.sub("clients", rest, map[string]func([]string) error{"add": env.clientsAdd, "rm": env.clientsRm})
	case "agents":
		return env.sub("agents", rest, map[string]func([]string) error{"add": env.agentsAdd, "rm": env.agentsRm})
	case "credentials":
		return env.sub("credentials", rest, map[string]func([]string) error{"set": env.credentialsSet})
	case "subscription":
		return env.subscriptionCmd(rest)
	case "onboard":
		return env.onboardCmd(rest)
	case "journal":
		return env.sub("journal", rest, map[string]func([]string) error{"check": env.journalCheck})
	case "maintain":
		return env.maintainCmd(rest)
	case "answers":
		return env.answersCmd(rest)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, "usage: brama serve|version|routes|clients|agents|credentials|subscription|onboard|journal|maintain|answers ... (-h on each)")
		return nil
	}
	return &usageError{fmt.Sprintf("unknown command %q", cmd)}
}

// cliEnv is what every command reads and writes besides its arguments.
type cliEnv struct {
	ctx    context.Context // ends on SIGINT/SIGTERM: the only cancel of a CLI's calls
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// sub runs one of a command's subcommands.
func (e cliEnv) sub(cmd string, args []string, subs map[string]func([]string) error) error {
	if len(args) == 0 || subs[args[0]] == nil {
		names := strings.Join(slices.Sorted(maps.Keys(subs)), "|")
		return &usageError{fmt.Sprintf("usage: brama %s %s ... (-h on each)", cmd, names)}
	}
	return subs[args[0]](args[1:])
}

// newFlags makes a flag set that prints to stderr and returns errors.
func (e cliEnv) newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("brama "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}

// parseFlags parses args allowing flags and positionals in any order
// (SPEC §16.1) and checks the positional count.
func parseFlags(fs *flag.FlagSet, args []string, positionals int, usage string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) != positionals {
		return nil, &usageError{"usage: brama " + usage}
	}
	return pos, nil
}

// testingOnlyNow replaces the serving process's clock in tests (nil in
// production: time.Now).
var testingOnlyNow func() time.Time

// testingOnlyKeepAlive shortens the stream keep-alive interval in tests
// (zero in production: keepAliveEvery).
var testingOnlyKeepAlive time.Duration

// deps are the state-backed parts every command and the server share.
type deps struct {
	st      state
	clients *clientStore
	vault   *vault
	journal *journal
	reg     *registry
}

// openDeps resolves every state file path (SPEC §2.1, §2.2). Nothing is
// read yet; a missing state directory shows up as each consumer's refusal.
func openDeps(getenv func(string) string, sy sys) deps {
	st := resolveState(getenv)
	d := deps{st: st}
	cpath, cerr := st.fileOrState(getenv, "BRAMA_CLIENTS_FILE", "clients file", "clients.json")
	d.clients = newClientStore(cpath, cerr)
	vpath, verr := st.fileOrState(getenv, "BRAMA_VAULT_FILE", "vault", "vault.json")
	d.vault = newVault(vpath, verr)
	d.journal = newJournal(st, sy)
	rpath, rerr := registryPath(st, getenv)
	d.reg = newRegistry(rpath, rerr, d.journal, sy.log)
	return d
}

// newLogger makes the JSON slog logger at BRAMA_LOG_LEVEL.
func newLogger(w io.Writer, level string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(strings.TrimSpace(level))); err != nil || level == "" {
		lv = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lv}))
}

// serve runs the daemon until ctx ends.
func serve(ctx context.Context, args []string, e cliEnv) error {
	fs := e.newFlags("serve")
	addr := fs.String("addr", "127.0.0.1:8080", "`address` to listen on")
	localCreds := fs.Bool("local-credentials-stdin", false, "read a JSON object provider → API key from stdin and keep it in memory only; it becomes the only source of direct credentials")
	if _, err := parseFlags(fs, args, 0, "serve [-addr ADDR] [-local-credentials-stdin]"); err != nil {
		return err
	}
	log := newLogger(e.stderr, e.getenv("BRAMA_LOG_LEVEL"))
	now := time.Now
	if testingOnlyNow != nil {
		now = testingOnlyNow
	}
	maxBody, err := maxRequestBytes(e.getenv("BRAMA_MAX_REQUEST_BYTES"))
	if err != nil {
		return err
	}
	sy := sys{log: log, now: now}
	d := openDeps(e.getenv, sy)
	lock, err := lockServe(d.st)
	if err != nil {
		return err
	}
	if lock != nil {
		defer lock.Close()
		n, err := removeStaleTemps(d.st.dir)
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
	s := &server{
		log: log, getenv: e.getenv, st: d.st, now: now,
		clients: d.clients, vault: d.vault, journal: d.journal, reg: d.reg, guard: guard,
	}
	s.agents = newAgentVerifier(s.vault.agentSecret, s.now)
	s.maxBody = maxBody
	s.client = newProviderClient()
	s.catalog = newCatalog(d.st, e.getenv, s.client, log, s.now)
	s.perf = newPerfRegistry(d.st, sy)
	s.answers = newAnswerStore(d.st, log, s.now)
	s.replay = newReplayGuard(e.getenv, log, s.now)
	s.ledger = newLedger(d.st, log, s.now)
	defer s.ledger.flush()
	s.inv = newInventory(d.st, s.vault, s.journal, s.ledger, e.getenv, sy)
	if ids, err := s.inv.removeOrphans(); err != nil {
		log.Warn("vault_orphans_unremoved", "cause", err.Error())
	} else if len(ids) > 0 {
		log.Info("vault_orphans_removed", "count", len(ids), "subscription_ids", strings.Join(ids, ","))
	}
	s.oauth = newOAuth(e.getenv, s.client, s.vault, s.ledger, log, s.now)
	defer s.oauth.shutdown()
	s.maint = newMaintainer(s.inv, s.ledger, s.oauth, s.client, e.getenv, log, s.now)
	s.keepAlive = testingOnlyKeepAlive
	if *localCreds {
		if s.localCreds, err = readLocalCredentials(e.stdin); err != nil {
			return err
		}
	}
	if err := ensureFirstClient(d.clients, e.stderr); err != nil {
		return err
	}
	s.routes()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	// Every request context descends from base, so requests still running
	// when the shutdown grace ends are cancelled with errServerShutdown.
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
	grace := shutdownGrace
	if testingOnlyShutdownGrace != 0 {
		grace = testingOnlyShutdownGrace
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		stopRequests(errServerShutdown) // their log lines say server_shutdown
		srv.Close()
	}
	s.inflight.wait()
	return nil
}

// shutdownGrace is how long in-flight requests may run after SIGTERM.
const shutdownGrace = 20 * time.Second

// testingOnlyShutdownGrace shortens shutdownGrace in tests (zero in
// production).
var testingOnlyShutdownGrace time.Duration

// readLocalCredentials reads `{"provider":"api key",…}` from stdin.
func readLocalCredentials(r io.Reader) (map[string]string, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	creds := map[string]string{}
	if err := decodeStrict("-local-credentials-stdin", b, &creds); err != nil {
		return nil, err
	}
	for p := range creds {
		if info, ok := lookupProvider(p); !ok || info.cred != credDirect {
			return nil, fmt.Errorf("-local-credentials-stdin: %q is not a provider that takes a direct API key", p)
		}
	}
	return creds, nil
}

// ensureFirstClient creates the admin client "local" when no clients file
// exists and prints its token once (SPEC §3.1); without a state directory
// the client lives in this process only (SPEC §2.1).
func ensureFirstClient(c *clientStore, stderr io.Writer) error {
	if c.pathErr != nil {
		tok := newToken()
		c.memory = &clientsDoc{Clients: []client{{ID: "local", TokenSHA256: tokenDigest(tok), Role: roleAdmin}}}
		fmt.Fprintf(stderr, "brama: created admin client \"local\" for this process only (not kept: %v); bearer token (shown once): %s\n", c.pathErr, tok)
		return nil
	}
	_, err := c.load()
	if !errors.Is(err, errFileAbsent) {
		return err // nil, or a clients file that must be repaired before serving
	}
	tok := newToken()
	created := false
	err = updateClients(c.path, func(d *clientsDoc) error {
		if len(d.Clients) > 0 {
			return nil
		}
		d.Clients = append(d.Clients, client{ID: "local", TokenSHA256: tokenDigest(tok), Role: roleAdmin})
		created = true
		return nil
	})
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stderr, "brama: created admin client \"local\"; bearer token (shown once): %s\n", tok)
	}
	return nil
}
