package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"text/template"
	"time"
)

// command is one row of the CLI: `brama help` prints its name and purpose; -h all of it.
type command struct {
	name, args, purpose, example string     // name: one or two words; args: the usage line after it
	pos                          int        // positionals it takes
	need                         []string   // flags that must be given, not blank
	flags                        []flagSpec // declared in this order
	run                          func(e *cliEnv, o opts, pos []string) error
}

// flagSpec is one flag; its default's type picks the kind (a []string is repeatable).
type flagSpec struct {
	name string
	def  any
	help string
}

// opts is a command line's flag values by name, each a pointer of its kind.
type opts map[string]any

func (o opts) s(name string) string { return *o[name].(*string) }
func (o opts) b(name string) bool   { return *o[name].(*bool) }

// commands is the CLI (SPEC §16.1), in the order `brama help` lists it. State edits run in-process under each file's
// lock (SPEC §2.3); `subscription …` and `maintain` call the daemon's admin API, the overlay's only writer.
func commands() []command {
	agent := func(help string) flagSpec { return flagSpec{"agent", "", help} }
	label := flagSpec{"label", "", "an optional `label` (printable, at most 128 bytes)"}
	gateway := flagSpec{"gateway", "http://127.0.0.1:8080", "the brama serve `URL` to call"} // the daemon's admin API
	return []command{
		{name: "serve", args: "[-addr ADDR] [-local-credentials-stdin]", purpose: "run the daemon", example: "brama serve -addr 127.0.0.1:8080", run: serve, flags: []flagSpec{{"addr", "127.0.0.1:8080", "`address` to listen on"}, {"local-credentials-stdin", false, "read a JSON object provider → API key from stdin and keep it in memory only; it becomes the only source of direct credentials"}}},
		{name: "version", purpose: "print the version /health reports", example: "brama version",
			run: func(e *cliEnv, _ opts, _ []string) error { return e.say(nil, "brama %s\n", version) }},
		{name: "routes list", args: "[-json]", purpose: "one aligned row per alias, then the count that cannot serve", example: "brama routes list", flags: []flagSpec{{"json", false, "print the body of GET /v1/aliases"}},
			run: routesCommand},
		{name: "routes set", args: "ALIAS DESTINATION", pos: 2, purpose: "set an alias (journaled route_change, by cli)", example: "brama routes set chat openai/gpt-4o", run: routesCommand},
		{name: "routes rm", args: "ALIAS", pos: 1, purpose: "remove an alias", example: "brama routes rm chat", run: routesCommand},
		{name: "routes migrate", args: "[-file F] [-json]", purpose: "drop retired top-level fields, commit, print the committed document (idempotent)", example: "brama routes migrate", flags: []flagSpec{{"file", "", "registry `file` to migrate (default: the registry Brama reads)"}, {"json", false, `print {"ok":true,"file":F,"dropped":[…],"document":{…}}`}},
			run: func(e *cliEnv, o opts, _ []string) error { // drop retired fields (SPEC §5), print what was committed
				reg := e.deps(e.sys()).reg
				path, out, dropped, err := cmp.Or(o.s("file"), reg.path), []byte(nil), []string(nil), reg.pathErr
				if o.s("file") != "" || err == nil { // -file needs no state directory
					out, dropped, err = migrateRegistry(path)
				}
				if err != nil {
					fmt.Fprintf(e.stderr, "route migration error: %v\n", err)
					return errRefused
				} else if o.b("json") { // dropped: [] when none
					out = append(must(json.Marshal(map[string]any{"ok": true, "file": path,
						"dropped": append([]string{}, dropped...), "document": json.RawMessage(out)})), '\n')
				}
				return e.wrote(path, nil, "%s", out)
			}},
		{name: "clients add", args: "ID [-admin] [-agent A] [-allow NAME]...", pos: 1, purpose: "make a client; its token is printed once on stdout", example: "brama clients add app -allow chat", flags: []flagSpec{{"admin", false, "give the client the admin role (reaches /v1/admin/*)"}, agent("bind the client's bearer to `agent`"), {"allow", []string(nil), "allow only this model `name` (repeatable; exact names)"}},
			run: func(e *cliEnv, o opts, p []string) error {
				tok, role := newToken(), pick(o.b("admin"), roleAdmin, roleCaller)
				c := client{ID: p[0], TokenSHA256: hexSHA256([]byte(tok)), Role: role, AgentID: o.s("agent"), AllowedModels: *o["allow"].(*[]string)}
				cs := e.deps(e.sys()).clients
				err := e.wrote(cs.path, cs.update(func(d *clientsDoc) error { // validate refuses a second client of that id
					d.Clients = append(d.Clients, c)
					return nil
				}), "%s\n", tok)
				if err == nil {
					fmt.Fprintf(e.stderr, "brama: created %s client %q; bearer token (shown once) on stdout\n", role, c.ID)
				}
				return err
			}},
		{name: "clients rm", args: "ID", pos: 1, purpose: "remove a client", example: "brama clients rm app",
			run: func(e *cliEnv, _ opts, p []string) error {
				cs := e.deps(e.sys()).clients
				return e.wrote(cs.path, cs.update(func(d *clientsDoc) error {
					n := len(d.Clients)
					if d.Clients = slices.DeleteFunc(d.Clients, func(x client) bool { return x.ID == p[0] }); len(d.Clients) == n {
						return fmt.Errorf("no client %q", p[0])
					}
					return nil
				}), "removed client %s\n", p[0])
			}},
		{name: "clients list", purpose: "each client's id, role, agent and allowlist (never a token or digest)", example: "brama clients list",
			run: func(e *cliEnv, _ opts, _ []string) error {
				doc, err := e.deps(e.sys()).clients.load() // absent: no clients
				return table(e.stdout, err, "ID\tROLE\tAGENT\tALLOWED\n", valueOr(doc, clientsDoc{}).Clients,
					func(c client) []string {
						allow := cmp.Or(strings.Join(c.AllowedModels, ","), pick(c.AllowedModels == nil, "(any model)", "(no model)"))
						return []string{c.ID, c.Role, cmp.Or(c.AgentID, "-"), allow}
					})
			}},
		{name: "deployments add", args: "NAME -port PORT [-host H] [-model M]", pos: 1, purpose: "declare a local OpenAI-compatible server", example: "brama deployments add ollama -port 11434 -model llama3.2", flags: []flagSpec{{"host", "127.0.0.1", "the server's IPv4 loopback or 100.64.0.0/10 `address`"}, {"port", 0, "the server's `port` (required)"}, {"model", "", "the upstream `model` name (default: NAME)"}},
			run: func(e *cliEnv, o opts, p []string) error {
				d, reg := deployment{Name: p[0], Model: o.s("model"), Endpoint: deploymentEndpoint{Host: o.s("host"), Port: *o["port"].(*int)}}, e.deps(e.sys()).reg
				_, err := reg.setDeployment(d, false)
				return e.wrote(reg.path, err, "added deployment %s at %s; route to it: brama routes set ALIAS %s\n", d.Name, d.baseURL(), d.Name)
			}},
		{name: "deployments rm", args: "NAME", pos: 1, purpose: "remove a deployment (refused while an alias routes to it)", example: "brama deployments rm ollama",
			run: func(e *cliEnv, _ opts, p []string) error {
				reg := e.deps(e.sys()).reg
				_, err := reg.setDeployment(deployment{Name: p[0]}, true)
				return e.wrote(reg.path, err, "removed deployment %s\n", p[0])
			}},
		{name: "deployments list", purpose: "one row per deployment: name, endpoint, model, adapters", example: "brama deployments list",
			run: func(e *cliEnv, _ opts, _ []string) error {
				doc, err := e.deps(e.sys()).reg.current()
				return table(e.stdout, err, "NAME\tENDPOINT\tMODEL\tADAPTERS\n", valueOr(doc, routesDoc{}).Deployments,
					func(d deployment) []string {
						var names []string
						for _, a := range d.Adapters {
							names = append(names, a.Name)
						}
						return []string{d.Name, d.baseURL(), cmp.Or(d.Model, d.Name), cmp.Or(strings.Join(names, ","), "-")}
					})
			}},
		{name: "credentials set", args: "PROVIDER", pos: 1, purpose: "store a direct API key read from stdin's first line in the vault", example: `printf '%s\n' "$KEY" | brama credentials set openai`,
			run: func(e *cliEnv, _ opts, p []string) error { // never the key as a flag: flags show up in ps
				info, ok := lookupProvider(p[0])
				if !ok || info.cred != credDirect {
					return fmt.Errorf("%q is not a provider that takes a direct API key", p[0])
				} else if key := e.line(); key != "" && printable(key) {
					v := e.deps(e.sys()).vault
					return e.wrote(v.path, v.update(func(d *vaultDoc) error {
						d.Direct[info.id] = vaultCredential{APIKey: key}
						return nil
					}), "stored the direct credential for %s in the vault\n", info.id)
				}
				return errors.New("no API key on stdin: the first line is empty or not printable text")
			}},
		{name: "credentials rm", args: "PROVIDER", pos: 1, purpose: "remove a direct key from the vault", example: "brama credentials rm openai",
			run: func(e *cliEnv, _ opts, p []string) error {
				v := e.deps(e.sys()).vault
				return e.wrote(v.path, v.update(func(d *vaultDoc) error {
					if _, ok := d.Direct[p[0]]; !ok {
						return fmt.Errorf("the vault holds no direct credential for %q", p[0])
					}
					delete(d.Direct, p[0])
					return nil
				}), "removed the direct credential for %s\n", p[0])
			}},
		{name: "credentials list", purpose: "the providers the vault holds a direct key for (names only, never a key)", example: "brama credentials list",
			run: func(e *cliEnv, _ opts, _ []string) error {
				doc, err := e.deps(e.sys()).vault.load()
				return table(e.stdout, err, "", slices.Sorted(maps.Keys(valueOr(doc, vaultDoc{}).Direct)),
					func(p string) []string { return []string{p} })
			}},
		{name: "subscription add", args: "-provider P -agent A [-label L] [-oauth-file F]", need: []string{"provider", "agent"}, purpose: "donate a subscription through the daemon (the API key on stdin after the bearer line, or a grant file); prints the new id", example: `printf '%s\n' "$KEY" | BRAMA_TOKEN=$T brama subscription add -provider kimi -agent a1`, flags: []flagSpec{gateway, {"provider", "", "the `provider` of the subscription (claude-code, codex, kimi, openai, …)"}, agent("the `agent` that receives it"), label, {"oauth-file", "", "read an OAuth grant {\"access_token\",\"refresh_token\",\"expires_at_ms\",…} from `file` instead of an API key on stdin"}},
			run: func(e *cliEnv, o opts, _ []string) error {
				body := donation{Provider: o.s("provider"), Label: o.s("label")}
				if err := e.bearer(); err != nil { // the bearer line comes first
					return err
				} else if file := o.s("oauth-file"); file != "" {
					body.OAuth = &oauthGrant{}
					if b, err := os.ReadFile(file); err != nil {
						return err
					} else if err := decodeStrict("-oauth-file", b, body.OAuth); err != nil {
						return err
					}
				} else if body.APIKey = e.line(); body.APIKey == "" {
					return errors.New("no API key on stdin (the line after the bearer token, or the first line when BRAMA_TOKEN is set); use -oauth-file for a grant")
				}
				return e.donate(o.s("agent"), "", body)
			}},
		{name: "subscription list", args: "-agent A [-json]", need: []string{"agent"}, purpose: "one aligned row per subscription", example: "BRAMA_TOKEN=$T brama subscription list -agent a1", flags: []flagSpec{gateway, agent("the `agent` whose subscriptions to list"), {"json", false, "print the body of GET /v1/subscriptions/{agent_id}"}},
			run: func(e *cliEnv, o opts, _ []string) error { // USED: the fullest window's
				var l struct{ Subscriptions []subscriptionRow }
				b, err := e.call("GET", subscriptionPath(o.s("agent")), nil, &l)
				if err != nil || o.b("json") {
					return e.say(err, "%s", b)
				}
				retired := 0
				table(e.stdout, nil, "ID\tPROVIDER\tSTATUS\tCREDENTIAL\tUSED\tLABEL\n", l.Subscriptions,
					func(r subscriptionRow) []string {
						cred, used, top := valueOr(r.Credential, ledgerCredential{State: "-"}).State, "-", 0.0
						for _, w := range r.Windows {
							top = max(top, w.UsedFraction)
							used = fmt.Sprintf("%.0f%%", top*100) + pick(r.Stale, " (stale)", "")
						}
						retired += boolCount(r.Status == "retired")
						return []string{r.ID, r.Provider, r.Status, cred, used, cmp.Or(r.Label, "-")}
					})
				return e.say(nil, "%d subscription(s), %d retired\n", len(l.Subscriptions), retired)
			}},
		{name: "subscription retire", args: "-agent A [-reason R] ID", pos: 1, need: []string{"agent"}, purpose: "retire a subscription (journaled)", example: "brama subscription retire -agent a1 sub_0123456789abcdef", flags: []flagSpec{gateway, agent("the `agent` that owns the subscription"), {"reason", "", `why (journaled; default "retired by <client id>")`}},
			run: func(e *cliEnv, o opts, p []string) error { // an empty reason is the daemon's default
				_, err := e.call("DELETE", subscriptionPath(o.s("agent"), p[0])+"?reason="+url.QueryEscape(o.s("reason")), nil, nil)
				return e.say(err, "retired %s\n", p[0])
			}},
		{name: "subscription reinstate", args: "-agent A -reason R ID", pos: 1, need: []string{"agent", "reason"}, purpose: "put a retired subscription back", example: `brama subscription reinstate -agent a1 -reason "back" sub_0123456789abcdef`, flags: []flagSpec{gateway, agent("the `agent` that owns the subscription"), {"reason", "", "why (required; journaled)"}},
			run: func(e *cliEnv, o opts, p []string) error {
				_, err := e.call("POST", subscriptionPath(o.s("agent"), p[0], "reinstate"), map[string]string{"reason": o.s("reason")}, nil)
				return e.say(err, "reinstated %s\n", p[0])
			}},
		{name: "subscription import", args: "-provider claude-code|codex -from FILE -agent A [-label L]", need: []string{"provider", "from", "agent"}, purpose: "hand a Claude Code or Codex CLI grant over to Brama", example: "brama subscription import -provider claude-code -from ~/.claude/.credentials.json -agent a1", flags: []flagSpec{gateway, {"provider", "", "claude-code or codex"}, {"from", "", "the tool's credential `file` (~/.claude/.credentials.json, ~/.codex/auth.json)"}, agent("the `agent` that receives the grant"), label},
			run: func(e *cliEnv, o opts, _ []string) error { // the credential file is read before the bearer
				provider := o.s("provider")
				tool := map[string]string{"claude-code": "Claude Code", "codex": "the Codex CLI"}[provider]
				if tool == "" {
					return &usageError{msg: fmt.Sprintf("-provider %q: import reads claude-code or codex credential files", provider)}
				} else if b, err := os.ReadFile(o.s("from")); err != nil {
					return err
				} else if g, err := parseImportFile(provider, b); err != nil {
					return fmt.Errorf("%s: %w", o.s("from"), err)
				} else if err := e.donate(o.s("agent"), "", donation{Provider: provider, Label: o.s("label"), OAuth: &g}); err != nil {
					return err
				}
				fmt.Fprintf(e.stderr, "brama: %s and Brama now share one grant: after Brama's first refresh, %[1]s will need to sign in again; "+
					"and if %[1]s refreshes first, Brama's copy stops working until `brama subscription sign-in` replaces it.\n", tool)
				return nil
			}},
		{name: "subscription sign-in", args: "-provider claude-code|codex -agent A [-id ID | -label L]", need: []string{"provider", "agent"}, purpose: "sign in with the provider (PKCE): the URL on stderr, the pasted code from stdin; replaces -id's grant or donates a new subscription", example: "BRAMA_TOKEN=$T brama subscription sign-in -provider claude-code -agent a1", flags: []flagSpec{gateway, {"provider", "", "claude-code or codex"}, agent("the `agent` that owns (or receives) the subscription"), {"id", "", "replace the credential of this subscription `id` instead of donating a new one"}, {"label", "", "a `label` for a new subscription"}},
			// The code is exchanged here, the grant handed to the daemon; the verifier, code and tokens are never printed.
			// The command line, gateway, bearer and -id are checked first: a code is good once and for minutes only.
			run: func(e *cliEnv, o opts, _ []string) error {
				provider, agent, id := o.s("provider"), o.s("agent"), o.s("id")
				pending, err := newSignIn(provider)
				if err != nil {
					return &usageError{msg: fmt.Sprintf("-provider %q has no sign-in (claude-code or codex); donate its grant or replace it with PUT …/credential", provider)}
				} else if id != "" && o.s("label") != "" {
					return &usageError{msg: "-label names a new subscription; with -id the subscription keeps its label"}
				}
				var l struct{ Subscriptions []subscriptionRow }
				if _, err := e.call("GET", subscriptionPath(agent), nil, &l); err != nil {
					return err
				} else if id != "" && !slices.ContainsFunc(l.Subscriptions, func(r subscriptionRow) bool {
					return r.ID == id && r.Provider == provider && r.Status != "retired"
				}) {
					return fmt.Errorf("agent %q has no subscription %q that is %s and not retired; nothing to sign in", agent, id, provider)
				}
				fmt.Fprintf(e.stderr, "brama: open this URL, sign in, then paste the code (or the whole redirect URL) as the next line:\n%s\n", pending.url)
				if code := e.line(); code == "" {
					return errors.New("sign-in stopped: no authorization code on stdin")
				} else if grant, err := newOAuth(e.getenv, newProviderClient(), nil, nil, slog.New(slog.DiscardHandler), time.Now).exchangeCode(e.ctx, pending, code); err != nil {
					return fmt.Errorf("sign-in failed, nothing was stored: %w", err)
				} else if id == "" {
					return e.donate(agent, "?via="+signInVia, donation{Provider: provider, Label: o.s("label"), OAuth: &grant})
				} else if _, err = e.call("PUT", subscriptionPath(agent, id, "credential"), vaultCredential{OAuth: &grant}, nil); err != nil {
					return err
				}
				fmt.Fprintf(e.stderr, "brama: signed in; subscription %s of agent %s has a new %s grant\n", id, agent, provider)
				return e.say(nil, "%s\n", id)
			}},
		{name: "subscription prune-orphans", args: "[-gateway URL]", flags: []flagSpec{gateway}, purpose: "remove the vault's subscription credentials no subscription names", example: "BRAMA_TOKEN=$T brama subscription prune-orphans",
			run: func(e *cliEnv, _ opts, _ []string) error {
				var body struct{ Removed []string }
				_, err := e.call("POST", "/v1/admin/vault/prune-orphans", nil, &body)
				return e.say(err, "removed %d orphaned credential(s) from the vault: %s\n", len(body.Removed), strings.Join(body.Removed, " "))
			}},
		{name: "maintain", args: "[-gateway URL] [-json]", purpose: "run one maintenance pass now; exit 0 only when it was ok", example: "BRAMA_TOKEN=$T brama maintain", flags: []flagSpec{gateway, {"json", false, "print the body of POST /v1/admin/maintain"}},
			run: func(e *cliEnv, o opts, _ []string) error {
				var rep passReport
				b, err := e.call("POST", "/v1/admin/maintain", nil, &rep)
				if err == nil && o.b("json") {
					_, err = e.stdout.Write(b)
				} else if err == nil { // the pass's verdict, usage reads and refreshes (SPEC §11.2)
					err = template.Must(template.New("maintain").Parse(`maintenance pass: {{if .OK}}ok{{else}}not ok{{end}}
usage reports: {{.Usage.Subscriptions}} subscription(s), {{.Usage.Read}} read, {{len .Usage.Failed}} failed
{{range .Usage.Failed}}  failed {{.SubscriptionID}} ({{.Provider}}): {{.Error}}
{{end}}credentials: {{.Credentials.Subscriptions}} subscription(s), {{.Credentials.Refreshed}} refreshed, {{.Credentials.Refused}} refused or failed
next due: {{with .NextDueAt}}{{.}}{{else}}nothing due{{end}}
`)).Execute(e.stdout, rep)
				}
				return cmp.Or(err, pick(rep.OK, nil, errRefused))
			}},
		{name: "onboard", args: "[-model ROUTE] [-allow-provider-cost]", purpose: "walk the first-use journey in-process: state directory, client, a route that can serve, one real answer", example: "brama onboard -model openai/gpt-4o-mini -allow-provider-cost", run: onboard, flags: []flagSpec{{"model", "", "the `route` of the one real call: a direct route, a deployment, or an alias to one"}, {"allow-provider-cost", false, "make the one real (billable) model call"}}},
		{name: "answers verify", args: "[-signature v1=HEX] FILE", pos: 1, purpose: "check a kept answer's signature (or a raw body against -signature); prints ok", example: "brama answers verify ~/.brama/answers/local/3f….json", flags: []flagSpec{{"signature", "", "check `v1=HEX` (a Brama-Answer-Signature) over FILE's raw bytes instead of reading FILE as a kept answer"}},
			run: func(e *cliEnv, o opts, p []string) error { // SPEC §12 item 6: sig over FILE, or a kept answer's own signature
				sig := strings.ToLower(o.s("signature"))
				if sig != "" && !isAnswerSignature(sig) {
					return &usageError{msg: "-signature must be v1= followed by 64 hex digits"}
				}
				key, err := readAnswerKey(resolveState(e.getenv), false)
				body, rerr := os.ReadFile(p[0])
				rec := &answerRecord{Body: body, Signature: &sig} // with -signature: FILE's bytes against it
				if err = cmp.Or(err, rerr); err == nil && sig == "" {
					if rec, err = decodeAnswerRecord(body); err != nil {
						err = fmt.Errorf("%s: %w", p[0], err)
					} else if rec.State != answerComplete {
						err = fmt.Errorf("%s: the answer is still in progress; there is no signature to check", p[0])
					}
				}
				if err == nil && signAnswer(key, rec.Body) != *rec.Signature { // no timing to hide: the caller reads the key
					err = errSignatureMismatch
				}
				return e.say(err, "ok\n")
			}},
		{name: "answers prune", args: "-older-than DURATION", need: []string{"older-than"}, purpose: "remove complete kept answers older than that (never one in progress)", example: "brama answers prune -older-than 720h", flags: []flagSpec{{"older-than", "", "remove complete answers kept longer ago than this `duration` (e.g. 720h)"}},
			run: func(e *cliEnv, o opts, _ []string) error { // SPEC §12 item 7; serve may run
				age, err := time.ParseDuration(o.s("older-than"))
				if err != nil || age < 0 {
					return &usageError{msg: "want a -older-than of zero or more (a duration such as 720h)"}
				}
				dir, err := resolveState(e.getenv).path("signed answers", "answers")
				if err != nil {
					return err
				}
				names, _ := fs.Glob(os.DirFS(dir), "*/*.json") // <client>/<key>.json; dir's path is no pattern
				before, removed := time.Now().Add(-age).UTC().Format(journalTimeFormat), 0
				for i := 0; i < len(names) && err == nil; i++ { // the first failed removal ends the pass
					name := filepath.Join(dir, names[i])
					if rec, rerr := readAnswerFile(name); rerr != nil {
						fmt.Fprintf(e.stderr, "brama: skipped %s: %v\n", name, rerr)
					} else if rec.State == answerComplete && *rec.CompletedAt < before { // state times sort as text
						err = errors.Join(os.Remove(name), syncDir(filepath.Dir(name)))
						removed += boolCount(err == nil)
					}
				}
				fmt.Fprintf(e.stdout, "removed %d complete answers older than %s\n", removed, age)
				return err
			}},
		{name: "journal check", purpose: "print each unreadable journal line; exit 1 when a non-final line is unreadable", example: "brama journal check",
			run: func(e *cliEnv, _ opts, _ []string) error {
				ok, err := checkJournal(newJournal(resolveState(e.getenv), e.sys()), e.stdout)
				return cmp.Or(err, pick(ok, nil, errRefused))
			}},
	}
}

// run is the whole program, returning once every goroutine it started has: args' command (one word, or a group's two),
// flags and positionals in either order (SPEC §16.1); -h prints its help on stdout; help (or nothing) lists the table.
func run(ctx context.Context, cut <-chan struct{}, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	e := &cliEnv{ctx: ctx, cut: cut, getenv: getenv, in: bufio.NewReader(stdin), stdout: stdout, stderr: stderr}
	if len(args) == 0 || slices.Contains([]string{"help", "-h", "-help", "--help"}, args[0]) {
		err := pick[error](len(args) == 0, &usageError{msg: "want a command"}, nil)
		w := pick(err == nil, stdout, stderr)
		fmt.Fprint(w, "usage: brama COMMAND [flags] [arguments]; brama COMMAND -h prints its flags and an example\n\n")
		table(w, nil, "", commands(), func(c command) []string { return []string{"  " + c.name, c.purpose} })
		return err
	} else if args[0] == "-version" || args[0] == "--version" {
		args = append([]string{"version"}, args[1:]...)
	}
	c, subs, pos, err := command{}, []string(nil), []string(nil), error(nil)
	for _, row := range commands() {
		if words := strings.Fields(row.name); len(args) >= len(words) && slices.Equal(words, args[:len(words)]) {
			c, args = row, args[len(words):]
			break
		} else if len(words) == 2 && words[0] == args[0] {
			subs = append(subs, words[1])
		}
	}
	if c.run == nil && len(subs) == 0 {
		return &usageError{msg: fmt.Sprintf("unknown command %q; see brama help", args[0])}
	} else if c.run == nil {
		msg := fmt.Sprintf("%s wants one of %s; see brama help", args[0], strings.Join(subs, ", "))
		if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
			msg = fmt.Sprintf("unknown command %q: %s", args[0]+" "+args[1], msg)
		}
		return &usageError{msg: msg}
	}
	fs, o := flag.NewFlagSet("brama "+c.name, flag.ContinueOnError), opts{}
	fs.SetOutput(io.Discard)
	for _, f := range c.flags {
		switch d := f.def.(type) {
		case string:
			o[f.name] = fs.String(f.name, d, f.help)
		case bool:
			o[f.name] = fs.Bool(f.name, d, f.help)
		case int:
			o[f.name] = fs.Int(f.name, d, f.help)
		case []string: // repeatable
			o[f.name] = &d
			fs.Func(f.name, f.help, func(v string) error {
				d = append(d, v)
				return nil
			})
		}
	}
	for err = fs.Parse(args); err == nil && fs.NArg() > 0; err = fs.Parse(fs.Args()[1:]) {
		pos = append(pos, fs.Arg(0))
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(e.stdout, "usage: brama %s %s\n\n%s.\n", c.name, c.args, c.purpose)
		if len(c.flags) > 0 {
			fmt.Fprintln(e.stdout, "\nflags:")
			fs.SetOutput(e.stdout)
			fs.PrintDefaults()
		}
		return e.say(nil, "\nexample:\n  %s\n", c.example)
	}
	missing := slices.DeleteFunc(slices.Clone(c.need), func(name string) bool { return strings.TrimSpace(o.s(name)) != "" })
	if err != nil {
		return &usageError{c.name, err.Error()}
	} else if len(pos) != c.pos {
		return &usageError{c.name, "want " + cmp.Or(c.args, "no arguments")}
	} else if len(missing) > 0 {
		return &usageError{c.name, "want -" + strings.Join(missing, " and -")}
	} else if o["gateway"] != nil { // the bearer and credentials never cross in clear text but to a loopback host
		e.gateway = strings.TrimRight(strings.TrimSpace(o.s("gateway")), "/")
		if err = checkBaseURL(e.gateway); err != nil {
			return &usageError{c.name, fmt.Sprintf("-gateway %q: %v", o.s("gateway"), err)}
		}
	}
	err = c.run(e, o, pos)
	if ue, ok := errors.AsType[*usageError](err); ok && ue.cmd == "" {
		ue.cmd = c.name
	}
	return err
}

// table prints row's cells for each item aligned under header (its line, or ""), unless err (items may then be none).
func table[T any](w io.Writer, err error, header string, items []T, row func(T) []string) error {
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, header)
	for _, it := range items {
		fmt.Fprintln(tw, strings.Join(row(it), "\t"))
	}
	return tw.Flush()
}

// routesCommand is routes list, set and rm: after a write each prints GET /v1/aliases (-json), or a row per alias.
func routesCommand(e *cliEnv, o opts, p []string) error {
	d, dest, said := e.deps(e.sys()), (*string)(nil), "removed "
	if len(p) == 2 {
		dest, said = &p[1], "set "
	}
	if len(p) > 0 {
		_, err := d.reg.set(p[0], dest, "cli")
		if err = e.wrote(d.reg.path, err, "%s%s\n", said, strings.Join(p, " -> ")); err != nil {
			return err
		}
	}
	t, err := d.reg.aliases((&core{deps: d}).hasDirect, nil)
	if err != nil {
		return err
	} else if o["json"] != nil && o.b("json") { // the body of GET /v1/aliases
		return encodeJSON(e.stdout, t)
	}
	table(e.stdout, nil, "ALIAS\tSTATE\tROUTE\tREASON\n", t.Aliases, func(a aliasRow) []string {
		return []string{a.Alias, a.State, valueOr(a.Route, "-"), a.Reason}
	})
	return e.say(nil, "%d alias(es), %d cannot serve\n", len(t.Aliases), t.Unserviceable)
}

// subscriptionPath is the admin path of an agent's subscriptions, then the segments after it, each escaped.
func subscriptionPath(segments ...string) string {
	for i, s := range segments {
		segments[i] = url.PathEscape(s)
	}
	return "/v1/admin/subscriptions/" + strings.Join(segments, "/")
}

// donate posts body for agent (query "?via=sign-in" marks a sign-in's) and prints the new id alone on stdout.
func (e *cliEnv) donate(agent, query string, body donation) error {
	var ans struct{ Subscription donatedSubscription }
	if _, err := e.call("POST", subscriptionPath(agent)+query, body, &ans); err != nil || ans.Subscription.ID == "" {
		return cmp.Or(err, errors.New("the gateway's answer names no subscription"))
	}
	fmt.Fprintf(e.stderr, "brama: donated %s subscription %s to agent %s\n", ans.Subscription.Provider, ans.Subscription.ID, agent)
	return e.say(nil, "%s\n", ans.Subscription.ID)
}

// errImportFile marks a credential file import cannot use.
var errImportFile = errors.New("not a usable credential file")

// parseImportFile reads the grant from claude-code's or codex's file (SPEC §10.1); checkCredential refuses it as a
// donation would and adds what the JWT claims say (SPEC §6.2). Errors wrap errImportFile, never quote a token.
func parseImportFile(provider string, b []byte) (oauthGrant, error) {
	var f struct {
		C *struct { // an oauthGrant under Claude Code's names, converted to one
			AccessToken  string `json:"accessToken"`
			RefreshToken string `json:"refreshToken"`
			ExpiresAtMs  int64  `json:"expiresAt"`
			IDToken      string `json:"-"`
			AccountID    string `json:"-"`
		} `json:"claudeAiOauth"`
		T *oauthGrant `json:"tokens"` // access_token, refresh_token, id_token, account_id
	}
	err := json.Unmarshal(b, &f)
	cred := vaultCredential{OAuth: map[string]*oauthGrant{"claude-code": (*oauthGrant)(f.C), "codex": f.T}[provider]}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		err = fmt.Errorf("member %s is not a %s", te.Field, te.Type)
	} else if err != nil { // a syntax error's text can quote bytes of the file, which may be a token
		err = errors.New("not JSON (" + jsonErrorKind(err) + ")")
	} else if cred.OAuth == nil {
		err = fmt.Errorf("no %s object", map[string]string{"claude-code": "claudeAiOauth", "codex": "tokens"}[provider])
	} else if cred, err = checkCredential(provider, cred); err == nil {
		return *cred.OAuth, nil
	}
	return oauthGrant{}, fmt.Errorf("%w: %w", errImportFile, err)
}
