// Brama is a small LLM gateway daemon. Callers send OpenAI Chat Completions, Anthropic Messages or OpenAI Responses
// requests to one endpoint; Brama resolves the model name, decides which account pays, makes a strictly bounded
// number of provider calls and answers with the result or exactly one classified refusal. It is not a load balancer,
// a cache of answers, or a retry engine. README's "Reading the code" gives the reading order.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

const version = "0.1.0-dev" // reported by /health and `brama version`

// main: a CLI command keeps the signals' default effect: one SIGINT ends it wherever it waits (SPEC §17). For serve the
// first SIGINT, SIGTERM or SIGHUP (unless ignored at start: nohup) ends ctx (no new requests, the running ones end),
// the second closes cut (serve cuts what still runs).
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
	if err == nil {
		return 0
	} else if ue, ok := errors.AsType[*usageError](err); ok {
		fmt.Fprintln(stderr, ue)
		return 2
	} else if !errors.Is(err, errRefused) {
		fmt.Fprintf(stderr, "brama: %v\n", err)
	}
	return 1
}

var testingOnlyNow func() time.Time // tests replace the serving process's clock

// serve runs the daemon until ctx ends, then drains until its requests end or e.cut closes.
func serve(e *cliEnv, o opts, _ []string) error {
	sy := e.sys()
	if testingOnlyNow != nil {
		sy.now = testingOnlyNow
	}
	log, now := sy.log, sy.now
	maxBody, bodyErr := envWhole(e.getenv, "BRAMA_MAX_REQUEST_BYTES", "bytes", 1, defaultMaxRequestBytes, 64)
	guard, guardErr := newTransportGuard(e.getenv("BRAMA_TRUSTED_PROXY_IPS"))
	addr := o.s("addr")
	_, port, err := net.SplitHostPort(addr) // net.Listen would take no port for a random one
	if _, perr := net.LookupPort("tcp", port); err != nil || port == "" || perr != nil {
		err = cmp.Or(err, perr, errors.New("no port"))
		return &usageError{msg: fmt.Sprintf("-addr %q is not HOST:PORT to listen on (e.g. 127.0.0.1:8080): %v", addr, err)}
	} else if err := cmp.Or(bodyErr, guardErr); err != nil {
		return err
	}
	var localCreds map[string]string // {"provider":"api key",…} from stdin, keys trimmed; nil: the vault's are read
	if o.b("local-credentials-stdin") {
		if b, err := io.ReadAll(e.in); err != nil {
			return err
		} else if err := decodeStrict("-local-credentials-stdin", b, &localCreds); err != nil || localCreds == nil {
			return cmp.Or(err, errors.New("-local-credentials-stdin: not a JSON object")) // null: no map
		}
		for p, key := range localCreds {
			if info, ok := lookupProvider(p); !ok || info.cred != credDirect {
				return fmt.Errorf("-local-credentials-stdin: %q is not a provider that takes a direct API key", p)
			} else if localCreds[p] = strings.TrimSpace(key); localCreds[p] == "" || !printable(localCreds[p]) {
				return fmt.Errorf("-local-credentials-stdin: the API key for %q is empty or not one line of printable text", p)
			}
		}
	}
	signal.Ignore(syscall.SIGPIPE) // a log reader gone (`serve 2>&1 | logger`) ends no generation: its lines are lost
	d := e.deps(sy)
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
	client, ledger := newProviderClient(), newLedger(d.st, log, now)
	defer ledger.flush(false) // pending changes
	inv := newInventory(d.st, d.vault, d.journal, ledger, e.getenv, sy)
	if ids, _ := inv.orphans(); len(ids) > 0 { // kept: /readyz names them (SPEC §17)
		log.Warn("vault_orphans_unremoved", "count", len(ids), "remove_with", "brama subscription prune-orphans")
	}
	oauth := newOAuth(e.getenv, client, d.vault, ledger, log, now)
	defer oauth.shutdown(e.cut)
	s := &server{guard: guard, maxBody: maxBody, answers: newAnswerStore(d.st, log, now), replay: newReplayGuard(e.getenv, log, now),
		core: core{deps: d, sys: sy, getenv: e.getenv, client: client, catalog: newCatalog(d.st, e.getenv, client, log, now),
			perf: newPerfRegistry(d.st, sy), ledger: ledger, inv: inv, oauth: oauth, maint: newMaintainer(inv, oauth), localCreds: localCreds}}
	ln, err := net.Listen("tcp", addr) // before the first client: its token is shown once, not to a start that fails
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
	next := "ready: brama routes list shows what each alias serves"
	if v, _ := s.vault.load(); !s.anyDirectPayer() && (v == nil || len(v.Subscriptions) == 0) {
		next = "next: brama credentials set anthropic (the API key on stdin), then brama routes set 'claude-*' 'anthropic/*'" +
			"; or a local model: brama deployments add NAME -port 11434"
	}
	fmt.Fprintf(e.stdout, "listening on http://%s\nstate: %s\n%s\n", ln.Addr(), cmp.Or(d.st.dir, fmt.Sprintf("none (%v): nothing is kept", d.st.cause)), next)
	log.Info("serve_started", "addr", ln.Addr().String(), "version", version, "state_dir", d.st.dir != "")

	var wg sync.WaitGroup
	defer wg.Wait()
	bg, stopBackground := context.WithCancel(e.ctx)
	defer stopBackground()
	s.catalog.start(bg, &wg)
	s.maint.run(bg, &wg) // the listener is up: the start pass may begin
	defer s.perf.flush(false)
	// No grace period of Brama's own (SPEC §7.4): requests end when their providers do, or at the second signal.
	drained := make(chan error, 1)
	defer context.AfterFunc(e.ctx, func() {
		log.Info("serve_draining")
		drained <- srv.Shutdown(context.WithoutCancel(e.ctx))
	})()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
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

// cliEnv is what every command reads and writes besides its arguments.
type cliEnv struct {
	ctx            context.Context // serve's first stop signal; a CLI command ends on a signal (main)
	cut            <-chan struct{} // closed on the second signal: serve cuts its running requests
	getenv         func(string) string
	in             *bufio.Reader // stdin: the bearer, then an API key or a pasted code, by lines
	stdout, stderr io.Writer
	gateway, auth  string // a gateway command's daemon URL, and its bearer once read
}

// deps resolves every state file path (SPEC §2.1, §2.2), nothing read yet, with sy's clock and logger: a command's
// e.sys(), to stderr at BRAMA_LOG_LEVEL (info, with a warning, when slog cannot read it); serve's test clock.
func (e *cliEnv) deps(sy sys) deps {
	st := resolveState(e.getenv)
	clients := &clientStore{stateFile: stateFile[*clientsDoc]{role: "clients file", parse: parseClients}}
	clients.path, clients.pathErr = st.fileOrState(e.getenv, "BRAMA_CLIENTS_FILE", "clients file", "clients.json")
	vpath, verr := st.fileOrState(e.getenv, "BRAMA_VAULT_FILE", "vault", "vault.json")
	rpath, rerr := st.fileOrState(e.getenv, "BRAMA_ROUTES_FILE", registryRole, "routes.json")
	j := newJournal(st, sy)
	return deps{st, newVault(vpath, verr), j, newRegistry(rpath, rerr, j), clients}
}

func (e *cliEnv) sys() sys {
	lv, level := new(slog.Level), strings.TrimSpace(e.getenv("BRAMA_LOG_LEVEL"))
	log := slog.New(slog.NewJSONHandler(e.stderr, &slog.HandlerOptions{Level: lv}))
	if lv.UnmarshalText([]byte(level)) != nil && level != "" {
		log.Warn("log_level_invalid", "value", level, "using", "info")
	}
	return sys{log: log, now: time.Now}
}

// say prints a command's success line, unless err.
func (e *cliEnv) say(err error, format string, args ...any) error {
	if err == nil {
		fmt.Fprintf(e.stdout, format, args...)
	}
	return err
}

// wrote reports a write, unless err: on stderr the file, and a warning when no serve holds the state directory to serve it.
func (e *cliEnv) wrote(path string, err error, format string, args ...any) error {
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "brama: wrote %s\n", path)
	if st := resolveState(e.getenv); st.dir != "" {
		name := filepath.Join(st.dir, "serve.lock")
		lock, err := flockFile(name, os.O_RDONLY, syscall.LOCK_SH|syscall.LOCK_NB) // a probe: creates no file
		lock.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) { // EWOULDBLOCK: a serve holds it
			fmt.Fprintf(e.stderr, "brama: warning: no brama serve holds %s; the change serves once one starts: brama serve\n", name)
		}
	}
	return e.say(nil, format, args...)
}

func (e *cliEnv) line() string {
	s, _ := e.in.ReadString('\n')
	return strings.TrimSpace(s)
}

// bearer reads the daemon's bearer once: BRAMA_TOKEN, else stdin's first line.
func (e *cliEnv) bearer() error {
	if e.auth = cmp.Or(e.auth, strings.TrimSpace(e.getenv("BRAMA_TOKEN"))); e.auth == "" {
		if e.auth = e.line(); e.auth == "" {
			return errors.New("no bearer token: set BRAMA_TOKEN or give the token as stdin's first line")
		}
	}
	return nil
}

// call sends one admin request (body nil: none) and returns the success body, decoded into out unless nil; any other
// answer is an error quoting the envelope. No time limit of Brama's own: one SIGINT ends the command (SPEC §17).
func (e *cliEnv) call(method, path string, body, out any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(must(json.Marshal(body))) // a donation, vaultCredential or map of strings
	}
	req, _ := http.NewRequestWithContext(e.ctx, method, e.gateway+path, rd) // the gateway is checked, the path escaped
	if err := e.bearer(); err != nil {
		return nil, err
	}
	req.Header = http.Header{"Authorization": {"Bearer " + e.auth}, "Content-Type": {"application/json"}}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the gateway at %s: %w", e.gateway, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	var env envelope
	if err != nil {
		return nil, fmt.Errorf("reading the gateway's answer: %w", err)
	} else if resp.StatusCode/100 == 2 && (out == nil || json.Unmarshal(b, out) == nil) {
		return b, nil
	} else if resp.StatusCode/100 == 2 || json.Unmarshal(b, &env) != nil || env.Error.Code == "" {
		env.Error.Code, env.Error.Message = "unknown", "not what Brama's "+method+" "+path+" answers"
	}
	return nil, fmt.Errorf("the gateway answered %d %s: %s", resp.StatusCode, env.Error.Code, env.Error.Message)
}

const onboardFile, onboardRole = "onboarding.json", "onboarding progress"

// onboardProgress is onboarding.json: the first-use journey's steps (SPEC §14) in order, each done when first done
// (RFC 3339 UTC) and (route, answer) with the model it named; the strict decoder refuses an unknown step.
type onboardProgress struct {
	SchemaVersion int `json:"schema_version"`
	Steps         struct {
		StateDirectory *onboardStep `json:"state-directory,omitempty"`
		Client         *onboardStep `json:"client,omitempty"`
		Route          *onboardStep `json:"route,omitempty"`
		Answer         *onboardStep `json:"answer,omitempty"`
	} `json:"steps"`
}

type onboardStep struct {
	DoneAt time.Time `json:"done_at"`
	Model  string    `json:"model,omitempty"`
}

// errOnboardingInvalid wraps every refusal of parseOnboarding.
var errOnboardingInvalid = errors.New("onboarding progress is invalid")

// parseOnboarding is decodeStrict on onboarding.json, schema 1; empty is no progress.
func parseOnboarding(b []byte) (*onboardProgress, error) {
	prog := &onboardProgress{SchemaVersion: 1}
	if err := decodeStrict(onboardFile, b, prog); len(b) > 0 && err != nil {
		return nil, fmt.Errorf("%w: %w (remove the file to start the journey again)", errOnboardingInvalid, err)
	}
	return prog, nil
}

// onboard walks the first-use journey in-process (SPEC §14): each step passed is recorded and printed ("done …"); the
// first that is not prints the command to run next ("next: …"). The one billable call needs -allow-provider-cost.
func onboard(e *cliEnv, o opts, _ []string) error {
	model, sy := o.s("model"), e.sys()
	// The call is planned as the daemon would, with the daemon's state files but no ledger.
	eng := &engine{core: &core{deps: e.deps(sy), sys: sy, getenv: e.getenv, client: newProviderClient()}, t: &tally{}}
	path, pathErr := eng.st.path(onboardRole, onboardFile)
	prog, _, err := (&stateFile[*onboardProgress]{role: onboardRole, path: path, pathErr: pathErr, parse: parseOnboarding}).read()
	if err != nil { // a file failing the guards is refused, never overwritten
		return fmt.Errorf("the state directory is not usable: %w", err)
	}
	done := func(step **onboardStep, name, model string) error {
		if *step == nil {
			*step = &onboardStep{DoneAt: sy.now().UTC().Truncate(time.Millisecond), Model: model}
		}
		if err := writeState(path, prog); err != nil {
			return fmt.Errorf("the state directory is not usable: %s cannot be written: %w", onboardRole, err)
		}
		return e.say(nil, "done %s\n", name)
	}
	next := func(cmd string, err error) error {
		fmt.Fprintf(e.stdout, "next: %s\n", cmd)
		return err
	}
	if err := done(&prog.Steps.StateDirectory, "state-directory", ""); err != nil {
		return err
	} else if doc, err := eng.clients.load(); err != nil {
		return fmt.Errorf("the clients file is unusable: %w", err)
	} else if len(doc.Clients) == 0 { // absent too; serve makes the first admin client
		return next("brama clients add <id> -admin", errRefused)
	} else if err := done(&prog.Steps.Client, "client", ""); err != nil {
		return err
	}
	// A bare deployment is called as local-openai/<name>; subscription routes and selectors are refused: their ledger
	// is the daemon's (SPEC §2.3, §14). No model: some payer must exist.
	c, req := call{}, chatRequest{Model: model}
	if model == "" && !eng.anyDirectPayer() {
		return next("brama credentials set <provider>", errRefused)
	} else if model != "" {
		if doc, err := eng.reg.current(); err == nil && doc.Routes[model] == "" {
			if _, _, n := doc.lookupLocal(model); n == 1 {
				req.Model = "local-openai/" + model
			}
		}
		c, err = eng.plan(client{}, &req)
		switch ae := asAPIError(err); {
		case err == nil:
		case ae.Code == "forbidden": // plan wants an agent: a subscription route, a selector or best
			return fmt.Errorf("-model %q is paid by an agent's subscription; onboarding calls a direct route, a deployment or an alias to one", req.Model)
		case ae.Code == "credential_unauthorized": // plan names the route's provider
			return next("brama credentials set "+c.res.Provider.id, fmt.Errorf("-model %q cannot serve: %s", req.Model, ae.Message))
		default:
			return fmt.Errorf("-model %q cannot serve: %s", req.Model, ae.Message)
		}
	}
	if err := done(&prog.Steps.Route, "route", c.res.Route); err != nil {
		return err
	} else if prog.Steps.Answer != nil && model == "" {
		return done(&prog.Steps.Answer, "answer", "") // done on an earlier run
	} else if model == "" || !o.b("allow-provider-cost") {
		return next("brama onboard -model "+cmp.Or(model, "<route>")+" -allow-provider-cost", nil)
	} else if _, ae := eng.ping(e.ctx, c, nil); ae != nil { // one ping, as the probe's (SPEC §11.3)
		return fmt.Errorf("no model answer: %s", ae.Message)
	}
	return done(&prog.Steps.Answer, "answer", c.res.Route)
}
