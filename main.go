// Brama is a small LLM gateway daemon. Callers send OpenAI Chat Completions, Anthropic Messages or OpenAI Responses
// requests to one endpoint; Brama resolves the model name, decides which account pays, makes a strictly bounded
// number of provider calls and answers with the result or exactly one classified refusal. It is not a load balancer,
// a cache of answers, or a retry engine. README's "Reading the code" gives the reading order.
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
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// version is reported by /health and `brama version`.
const version = "0.1.0-dev"

// main: a CLI command keeps the signals' default effect, so one SIGINT ends it wherever it waits, reading stdin
// included (SPEC §17). For serve the first SIGINT, SIGTERM or SIGHUP (a closed terminal) ends ctx (serve stops taking
// requests and lets the running ones end), the second closes cut (serve cuts what still runs). A SIGHUP ignored at
// start (nohup) stays ignored.
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

// run is the whole program: one command of the table, returning once every goroutine it started has.
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
	return e.runCommand(args)
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

// deps are the state files every command and the server share.
type deps struct {
	stores
	clients *clientStore
}

// openDeps resolves every state file path (SPEC §2.1, §2.2); nothing is read yet.
func openDeps(getenv func(string) string, sy sys) deps {
	st := resolveState(getenv)
	cpath, cerr := st.fileOrState(getenv, "BRAMA_CLIENTS_FILE", "clients file", "clients.json")
	vpath, verr := st.fileOrState(getenv, "BRAMA_VAULT_FILE", "vault", "vault.json")
	rpath, rerr := registryPath(st, getenv)
	j := newJournal(st, sy)
	return deps{stores{st, newVault(vpath, verr), j, newRegistry(rpath, rerr, j, sy.log)}, newClientStore(cpath, cerr)}
}

// newLogger makes the JSON slog logger at BRAMA_LOG_LEVEL (info unless level names another).
func newLogger(w io.Writer, level string) *slog.Logger {
	var lv slog.Level
	level = strings.TrimSpace(level)
	err := lv.UnmarshalText([]byte(level))
	log := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lv}))
	if err != nil && level != "" {
		log.Warn("log_level_invalid", "value", level, "using", "info")
	}
	return log
}

// Tests replace the serving process's clock and shorten the stream keep-alive interval.
var (
	testingOnlyNow       func() time.Time
	testingOnlyKeepAlive time.Duration
)

// serve runs the daemon until ctx ends, then drains until its requests end or e.cut closes.
func serve(e *cliEnv, o opts, _ []string) error {
	sy := e.sys()
	if testingOnlyNow != nil {
		sy.now = testingOnlyNow
	}
	log, now := sy.log, sy.now
	maxBody, bodyErr := envWhole(e.getenv, "BRAMA_MAX_REQUEST_BYTES", "bytes", 1, defaultMaxRequestBytes, 64)
	guard, guardErr := newTransportGuard(e.getenv("BRAMA_TRUSTED_PROXY_IPS"))
	localCreds, credsErr := readLocalCredentials(o.b("local-credentials-stdin"), e.in)
	if err := cmp.Or(checkListenAddr(o.s("addr")), bodyErr, guardErr, credsErr); err != nil {
		return err
	}
	signal.Ignore(syscall.SIGPIPE) // a log reader gone (`serve 2>&1 | logger`) ends no generation: its lines are lost
	d := openDeps(e.getenv, sy)
	lock, err := lockServe(d.st)
	if err != nil {
		return err
	} else if lock != nil {
		defer lock.Close()
		n, err := removeStaleTemps(d.st.dir, d.vault.path, d.reg.path, d.clients.path)
		if err != nil {
			log.Warn("state_temp_files_unremoved", "removed", n, "cause", err.Error())
		} else if n > 0 {
			log.Info("state_temp_files_removed", "count", n)
		}
	}
	client, ledger := newProviderClient(), newLedger(d.st, log, now)
	defer ledger.flush()
	inv := newInventory(d.st, d.vault, d.journal, ledger, e.getenv, sy)
	if ids, _ := inv.orphans(); len(ids) > 0 { // kept: /readyz names them (SPEC §17)
		log.Warn("vault_orphans_unremoved", "count", len(ids), "remove_with", "brama subscription prune-orphans")
	}
	oauth := newOAuth(e.getenv, client, d.vault, ledger, log, now)
	defer oauth.shutdown(e.cut)
	s := &server{clients: d.clients, guard: guard, maxBody: maxBody, answers: newAnswerStore(d.st, log, now),
		replay: newReplayGuard(e.getenv, log, now), core: core{stores: d.stores, sys: sy, getenv: e.getenv, client: client,
			keepAlive: testingOnlyKeepAlive, catalog: newCatalog(d.st, e.getenv, client, log, now), perf: newPerfRegistry(d.st, sy),
			ledger: ledger, inv: inv, oauth: oauth, maint: newMaintainer(inv, ledger, oauth, client, e.getenv, log, now),
			localCreds: localCreds}}
	ln, err := net.Listen("tcp", o.s("addr")) // before the first client: its token is shown once, not to a start that fails
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := ensureFirstClient(s.clients, e.stderr); err != nil {
		return err
	}
	s.routes()
	// Requests still running at the second signal are cancelled through base with errServerShutdown.
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
	// No grace period of Brama's own (SPEC §7.4): requests end when their providers do, or at the second signal.
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

// serveNotes is what serve prints under its address: the state directory, and the one step to run next while nothing
// can pay for a call yet.
func serveNotes(s *server) string {
	where := "state: " + s.st.dir
	if s.st.dir == "" {
		where = fmt.Sprintf("state: none (%v): nothing is kept", s.st.cause)
	}
	if v, _ := s.vault.load(); s.anyDirectPayer() || v != nil && len(v.Subscriptions) > 0 {
		return where + "\nready: brama routes list shows what each alias serves"
	}
	return where + "\nnext: brama credentials set anthropic (the API key on stdin), then brama routes set 'claude-*' 'anthropic/*'" +
		"; or a local model: brama deployments add NAME -port 11434"
}

// checkListenAddr refuses an -addr net.Listen would misread: empty (every interface), no port or an empty one (a
// random port), or a bad port.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil && port == "" {
		err = errors.New("no port")
	} else if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return &usageError{msg: fmt.Sprintf("-addr %q is not HOST:PORT to listen on (e.g. 127.0.0.1:8080): %v", addr, err)}
	}
	return nil
}

// readLocalCredentials reads `{"provider":"api key",…}` from stdin when asked, keys trimmed as credentials set trims
// them; nil when not asked (the vault's keys are read).
func readLocalCredentials(asked bool, r io.Reader) (map[string]string, error) {
	if !asked {
		return nil, nil
	}
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

// ensureFirstClient creates the admin client "local", its token printed once, when no clients file exists (SPEC
// §3.1); in memory with no state (§2.1).
func ensureFirstClient(c *clientStore, stderr io.Writer) error {
	tok := newToken()
	local, kept, created := client{ID: "local", TokenSHA256: tokenDigest(tok), Role: roleAdmin}, "", c.pathErr != nil
	if created {
		c.memory, kept = &clientsDoc{Clients: []client{local}}, fmt.Sprintf(" for this process only (not kept: %v)", c.pathErr)
	} else if _, err := c.load(); !errors.Is(err, errFileAbsent) {
		return err // nil, or a clients file that must be repaired before serving
	} else if err := updateClients(c.path, func(d *clientsDoc) error {
		if created = len(d.Clients) == 0; created {
			d.Clients = append(d.Clients, local)
		}
		return nil
	}); err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stderr, "brama: created admin client \"local\"%s; bearer token (shown once): %s\n", kept, tok)
	}
	return nil
}
