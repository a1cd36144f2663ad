package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// The CLI (SPEC §16.1) is one table, commands(). State edits run in-process under each file's lock
// (SPEC §2.3); `subscription …` and `maintain` call the daemon's admin API, the overlay's only writer.

// command is one row of the CLI: `brama help` prints its name and purpose;
// `brama NAME -h` its usage line, purpose, flags and example.
type command struct {
	name    string // one or two words: "routes set"
	args    string // the usage line after the name
	purpose string // one line
	example string
	pos     int      // positionals it takes
	need    []string // flags that must be given, not blank
	gateway bool     // calls the daemon: -gateway, then the bearer
	flags   func(fs *flag.FlagSet, o *opts)
	check   func(o *opts) error // before the bearer is read
	run     func(e *cliEnv, o *opts, pos []string) error
}

// opts is every flag value of one command line; each row declares its own.
type opts struct {
	json, admin, cost, localCreds              bool
	addr, agent, provider, label, reason, file string
	from, id, model, host, sig, gateway        string
	port                                       int
	allow                                      []string
	olderThan                                  time.Duration
	grant                                      oauthGrant // import's -from, read by its check
}

func jsonFlag(help string) func(*flag.FlagSet, *opts) {
	return func(fs *flag.FlagSet, o *opts) { fs.BoolVar(&o.json, "json", false, help) }
}

func agentFlag(help string) func(*flag.FlagSet, *opts) {
	return func(fs *flag.FlagSet, o *opts) { fs.StringVar(&o.agent, "agent", "", help) }
}

// commands is the CLI, in the order `brama help` lists it.
func commands() []command {
	return []command{
		{name: "serve", args: "[-addr ADDR] [-local-credentials-stdin]", purpose: "run the daemon", example: "brama serve -addr 127.0.0.1:8080",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "`address` to listen on")
				fs.BoolVar(&o.localCreds, "local-credentials-stdin", false, "read a JSON object provider → API key from stdin and keep it in memory only; it becomes the only source of direct credentials")
			}, run: serve},
		{name: "version", purpose: "print the version /health reports", example: "brama version",
			run: func(e *cliEnv, _ *opts, _ []string) error { return e.say(nil, "brama %s\n", version) }},
		{name: "routes list", args: "[-json]", purpose: "one aligned row per alias, then the count that cannot serve", example: "brama routes list",
			flags: jsonFlag("print the body of GET /v1/aliases"),
			run:   func(e *cliEnv, o *opts, _ []string) error { return e.printAliases(e.deps(), o.json) }},
		{name: "routes set", args: "ALIAS DESTINATION", pos: 2, purpose: "set an alias (journaled route_change, by cli)", example: "brama routes set chat openai/gpt-4o",
			run: func(e *cliEnv, _ *opts, p []string) error {
				d := e.deps()
				_, err := d.reg.set(p[0], p[1], "cli")
				if err = e.wrote(d.reg.path, err, "set %s -> %s\n", p[0], p[1]); err != nil {
					return err
				}
				return e.printAliases(d, false)
			}},
		{name: "routes rm", args: "ALIAS", pos: 1, purpose: "remove an alias", example: "brama routes rm chat",
			run: func(e *cliEnv, _ *opts, p []string) error {
				d := e.deps()
				_, err := d.reg.remove(p[0], "cli")
				if err = e.wrote(d.reg.path, err, "removed %s\n", p[0]); err != nil {
					return err
				}
				return e.printAliases(d, false)
			}},
		{name: "routes migrate", args: "[-file F] [-json]", purpose: "drop retired top-level fields, commit, print the committed document (idempotent)", example: "brama routes migrate",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.file, "file", "", "registry `file` to migrate (default: the registry Brama reads)")
				jsonFlag(`print {"ok":true,"file":F,"dropped":[…],"document":{…}}`)(fs, o)
			}, run: routesMigrate},
		{name: "clients add", args: "ID [-admin] [-agent A] [-allow NAME]...", pos: 1, purpose: "make a client; its token is printed once on stdout", example: "brama clients add app -allow chat",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.BoolVar(&o.admin, "admin", false, "give the client the admin role (reaches /v1/admin/*)")
				agentFlag("bind the client's bearer to `agent`")(fs, o)
				fs.Func("allow", "allow only this model `name` (repeatable; exact names)", func(v string) error { o.allow = append(o.allow, v); return nil })
			}, run: clientsAdd},
		{name: "clients rm", args: "ID", pos: 1, purpose: "remove a client", example: "brama clients rm app",
			run: func(e *cliEnv, _ *opts, p []string) error {
				c := e.deps().clients
				if c.pathErr != nil {
					return c.pathErr
				}
				err := updateClients(c.path, func(d *clientsDoc) error {
					n := len(d.Clients)
					if d.Clients = slices.DeleteFunc(d.Clients, func(x client) bool { return x.ID == p[0] }); len(d.Clients) == n {
						return fmt.Errorf("no client %q", p[0])
					}
					return nil
				})
				return e.wrote(c.path, err, "removed client %s\n", p[0])
			}},
		{name: "clients list", purpose: "each client's id, role, agent and allowlist (never a token or digest)", example: "brama clients list", run: clientsList},
		{name: "deployments add", args: "NAME -port PORT [-host H] [-model M]", pos: 1, purpose: "declare a local OpenAI-compatible server", example: "brama deployments add ollama -port 11434 -model llama3.2",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.host, "host", "127.0.0.1", "the server's IPv4 loopback or 100.64.0.0/10 `address`")
				fs.IntVar(&o.port, "port", 0, "the server's `port` (required)")
				fs.StringVar(&o.model, "model", "", "the upstream `model` name (default: NAME)")
			},
			run: func(e *cliEnv, o *opts, p []string) error {
				d := deployment{Name: p[0], Model: o.model, Endpoint: deploymentEndpoint{Host: o.host, Port: o.port}}
				reg := e.deps().reg
				_, err := reg.setDeployment(d, false)
				return e.wrote(reg.path, err, "added deployment %s at %s; route to it: brama routes set ALIAS %s\n", d.Name, d.baseURL(), d.Name)
			}},
		{name: "deployments rm", args: "NAME", pos: 1, purpose: "remove a deployment (refused while an alias routes to it)", example: "brama deployments rm ollama",
			run: func(e *cliEnv, _ *opts, p []string) error {
				reg := e.deps().reg
				_, err := reg.setDeployment(deployment{Name: p[0]}, true)
				return e.wrote(reg.path, err, "removed deployment %s\n", p[0])
			}},
		{name: "deployments list", purpose: "one row per deployment: name, endpoint, model, adapters", example: "brama deployments list", run: deploymentsList},
		{name: "credentials set", args: "PROVIDER", pos: 1, purpose: "store a direct API key read from stdin's first line in the vault", example: `printf '%s\n' "$KEY" | brama credentials set openai`,
			run: credentialsSet},
		{name: "credentials rm", args: "PROVIDER", pos: 1, purpose: "remove a direct key from the vault", example: "brama credentials rm openai",
			run: func(e *cliEnv, _ *opts, p []string) error {
				v := e.deps().vault
				err := v.update(func(d *vaultDoc) error {
					if _, ok := d.Direct[p[0]]; !ok {
						return fmt.Errorf("the vault holds no direct credential for %q", p[0])
					}
					delete(d.Direct, p[0])
					return nil
				})
				return e.wrote(v.path, err, "removed the direct credential for %s\n", p[0])
			}},
		{name: "credentials list", purpose: "the providers the vault holds a direct key for (names only, never a key)", example: "brama credentials list",
			run: func(e *cliEnv, _ *opts, _ []string) error {
				doc, err := e.deps().vault.load()
				if err == nil {
					e.say(nil, "%s", strings.Join(append(slices.Sorted(maps.Keys(doc.Direct)), ""), "\n"))
				}
				return err
			}},
		{name: "subscription add", args: "-provider P -agent A [-label L] [-oauth-file F]", need: []string{"provider", "agent"}, gateway: true,
			purpose: "donate a subscription through the daemon (the API key on stdin after the bearer line, or a grant file); prints the new id",
			example: `printf '%s\n' "$KEY" | BRAMA_TOKEN=$T brama subscription add -provider kimi -agent a1`,
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.provider, "provider", "", "the `provider` of the subscription (claude-code, codex, kimi, openai, …)")
				agentFlag("the `agent` that receives it")(fs, o)
				fs.StringVar(&o.label, "label", "", "an optional `label` (printable, at most 128 bytes)")
				fs.StringVar(&o.file, "oauth-file", "", "read an OAuth grant {\"access_token\",\"refresh_token\",\"expires_at_ms\",…} from `file` instead of an API key on stdin")
			}, run: subscriptionAdd},
		{name: "subscription list", args: "-agent A [-json]", need: []string{"agent"}, gateway: true, purpose: "one aligned row per subscription", example: "BRAMA_TOKEN=$T brama subscription list -agent a1",
			flags: func(fs *flag.FlagSet, o *opts) {
				agentFlag("the `agent` whose subscriptions to list")(fs, o)
				jsonFlag("print the body of GET /v1/subscriptions/{agent_id}")(fs, o)
			}, run: subscriptionList},
		{name: "subscription retire", args: "-agent A [-reason R] ID", pos: 1, need: []string{"agent"}, gateway: true, purpose: "retire a subscription (journaled)", example: "brama subscription retire -agent a1 sub_0123456789abcdef",
			flags: statusFlags(`why (journaled; default "retired by <client id>")`),
			run: func(e *cliEnv, o *opts, p []string) error {
				path := subscriptionPath(o.agent, p[0])
				if o.reason != "" {
					path += "?reason=" + url.QueryEscape(o.reason)
				}
				_, err := e.call("DELETE", path, nil)
				return e.say(err, "retired %s\n", p[0])
			}},
		{name: "subscription reinstate", args: "-agent A -reason R ID", pos: 1, need: []string{"agent", "reason"}, gateway: true, purpose: "put a retired subscription back", example: `brama subscription reinstate -agent a1 -reason "back" sub_0123456789abcdef`,
			flags: statusFlags("why (required; journaled)"),
			run: func(e *cliEnv, o *opts, p []string) error {
				_, err := e.call("POST", subscriptionPath(o.agent, p[0], "reinstate"), map[string]string{"reason": o.reason})
				return e.say(err, "reinstated %s\n", p[0])
			}},
		{name: "subscription import", args: "-provider claude-code|codex -from FILE -agent A [-label L]", need: []string{"provider", "from", "agent"}, gateway: true,
			purpose: "hand a Claude Code or Codex CLI grant over to Brama", example: "brama subscription import -provider claude-code -from ~/.claude/.credentials.json -agent a1",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.provider, "provider", "", "claude-code or codex")
				fs.StringVar(&o.from, "from", "", "the tool's credential `file` (~/.claude/.credentials.json, ~/.codex/auth.json)")
				agentFlag("the `agent` that receives the grant")(fs, o)
				fs.StringVar(&o.label, "label", "", "an optional `label`")
			}, check: checkImport, run: subscriptionImport},
		{name: "subscription sign-in", args: "-provider claude-code|codex -agent A [-id ID | -label L]", need: []string{"provider", "agent"}, gateway: true,
			purpose: "sign in with the provider (PKCE): the URL on stderr, the pasted code from stdin; replaces -id's grant or donates a new subscription",
			example: "BRAMA_TOKEN=$T brama subscription sign-in -provider claude-code -agent a1",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.provider, "provider", "", "claude-code or codex")
				agentFlag("the `agent` that owns (or receives) the subscription")(fs, o)
				fs.StringVar(&o.id, "id", "", "replace the credential of this subscription `id` instead of donating a new one")
				fs.StringVar(&o.label, "label", "", "a `label` for a new subscription")
			}, check: checkSignIn, run: subscriptionSignIn},
		{name: "subscription prune-orphans", args: "[-gateway URL]", gateway: true, purpose: "remove the vault's subscription credentials no subscription names", example: "BRAMA_TOKEN=$T brama subscription prune-orphans",
			run: func(e *cliEnv, _ *opts, _ []string) error {
				var body struct{ Removed []string }
				b, err := e.call("POST", "/v1/admin/vault/prune-orphans", nil)
				if err == nil && json.Unmarshal(b, &body) != nil {
					err = errors.New("the gateway's answer is not a prune report")
				}
				return e.say(err, "removed %d orphaned credential(s) from the vault: %s\n", len(body.Removed), strings.Join(body.Removed, " "))
			}},
		{name: "maintain", args: "[-gateway URL] [-json]", gateway: true, purpose: "run one maintenance pass now; exit 0 only when it was ok", example: "BRAMA_TOKEN=$T brama maintain",
			flags: jsonFlag("print the body of POST /v1/admin/maintain"), run: maintain},
		{name: "onboard", args: "[-model ROUTE] [-allow-provider-cost]", purpose: "walk the first-use journey in-process: state directory, client, a route that can serve, one real answer",
			example: "brama onboard -model openai/gpt-4o-mini -allow-provider-cost",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.model, "model", "", "the `route` of the one real call: a direct route, a deployment, or an alias to one")
				fs.BoolVar(&o.cost, "allow-provider-cost", false, "make the one real (billable) model call")
			},
			run: func(e *cliEnv, o *opts, _ []string) error {
				return onboard(e.ctx, e.getenv, e.sys(), o.model, o.cost, func(line string) { fmt.Fprintln(e.stdout, line) })
			}},
		{name: "answers verify", args: "[-signature v1=HEX] FILE", pos: 1, purpose: "check a kept answer's signature (or a raw body against -signature); prints ok", example: "brama answers verify ~/.brama/answers/local/3f….json",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.sig, "signature", "", "check `v1=HEX` (a Brama-Answer-Signature) over FILE's raw bytes instead of reading FILE as a kept answer")
			},
			run: func(e *cliEnv, o *opts, p []string) error {
				if sig := strings.ToLower(o.sig); sig != "" && !isAnswerSignature(sig) {
					return &usageError{msg: "-signature must be v1= followed by 64 hex digits"}
				}
				return e.say(verifyAnswerFile(resolveState(e.getenv), p[0], strings.ToLower(o.sig)), "ok\n")
			}},
		{name: "answers prune", args: "-older-than DURATION", need: []string{"older-than"}, purpose: "remove complete kept answers older than that (never one in progress)", example: "brama answers prune -older-than 720h",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.DurationVar(&o.olderThan, "older-than", 0, "remove complete answers kept longer ago than this `duration` (e.g. 720h)")
			}, run: answersPrune},
		{name: "journal check", purpose: "print each unreadable journal line; exit 1 when a non-final line is unreadable", example: "brama journal check",
			run: func(e *cliEnv, _ *opts, _ []string) error {
				ok, err := checkJournal(newJournal(resolveState(e.getenv), e.sys()), e.stdout)
				if err == nil && !ok {
					err = errRefused
				}
				return err
			}},
	}
}

func statusFlags(why string) func(*flag.FlagSet, *opts) {
	return func(fs *flag.FlagSet, o *opts) {
		agentFlag("the `agent` that owns the subscription")(fs, o)
		fs.StringVar(&o.reason, "reason", "", why)
	}
}

// printAliases prints the alias table (GET /v1/aliases): one aligned row
// per alias and the unserviceable count, or with asJSON the body.
func (e *cliEnv) printAliases(d deps, asJSON bool) error {
	t, err := d.reg.aliases(func(p string) bool { return d.vault.directKey(p) != "" })
	if err != nil || asJSON {
		b, _ := json.Marshal(t)
		return e.say(err, "%s\n", b)
	}
	var rows []string
	for _, a := range t.Aliases {
		route := "-"
		if a.Route != nil {
			route = *a.Route
		}
		rows = append(rows, strings.Join([]string{a.Alias, a.State, route, a.Reason}, "\t"))
	}
	e.table("ALIAS\tSTATE\tROUTE\tREASON", rows)
	return e.say(nil, "%d alias(es), %d cannot serve\n", len(t.Aliases), t.Unserviceable)
}

func routesMigrate(e *cliEnv, o *opts, _ []string) error {
	path, err := o.file, error(nil)
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
	if !o.json {
		return e.wrote(path, nil, "%s", committed)
	}
	b, _ := json.Marshal(struct {
		OK       bool            `json:"ok"`
		File     string          `json:"file"`
		Dropped  []string        `json:"dropped"`
		Document json.RawMessage `json:"document"`
	}{true, path, append([]string{}, dropped...), committed})
	return e.wrote(path, nil, "%s\n", b)
}

func clientsAdd(e *cliEnv, o *opts, p []string) error {
	role := roleCaller
	if o.admin {
		role = roleAdmin
	}
	tok := newToken()
	c, store := client{ID: p[0], TokenSHA256: tokenDigest(tok), Role: role, AgentID: o.agent, AllowedModels: o.allow}, e.deps().clients
	if store.pathErr != nil {
		return store.pathErr
	}
	err := updateClients(store.path, func(d *clientsDoc) error {
		if slices.ContainsFunc(d.Clients, func(x client) bool { return x.ID == c.ID }) {
			return fmt.Errorf("client %q already exists; rm it first", c.ID)
		}
		d.Clients = append(d.Clients, c)
		return nil
	})
	if err == nil {
		fmt.Fprintf(e.stderr, "brama: created %s client %q; bearer token (shown once) on stdout\n", role, c.ID)
	}
	return e.wrote(store.path, err, "%s\n", tok)
}

// clientsList prints each client's id, role, agent and allowlist; never a
// token or its digest.
func clientsList(e *cliEnv, _ *opts, _ []string) error {
	doc, err := e.deps().clients.load()
	if errors.Is(err, errFileAbsent) {
		doc, err = &clientsDoc{}, nil
	}
	if err != nil {
		return err
	}
	var rows []string
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

func deploymentsList(e *cliEnv, _ *opts, _ []string) error {
	doc, err := e.deps().reg.current()
	if err != nil {
		return err
	}
	var rows []string
	for _, d := range doc.Deployments {
		var names []string
		for _, a := range d.Adapters {
			names = append(names, a.Name)
		}
		rows = append(rows, strings.Join([]string{d.Name, d.baseURL(), cmp.Or(d.Model, d.Name), cmp.Or(strings.Join(names, ","), "-")}, "\t"))
	}
	e.table("NAME\tENDPOINT\tMODEL\tADAPTERS", rows)
	return nil
}

// credentialsSet stores a direct API key read from stdin's first line; it
// never takes the key as a flag (flags show up in ps).
func credentialsSet(e *cliEnv, _ *opts, p []string) error {
	info, ok := lookupProvider(p[0])
	if !ok || info.cred != credDirect {
		return fmt.Errorf("%q is not a provider that takes a direct API key", p[0])
	}
	line, err := e.in.ReadString('\n')
	key := strings.TrimSpace(line)
	if key == "" {
		return fmt.Errorf("no API key on stdin (%v)", errors.Join(err, errors.New("empty line")))
	}
	v := e.deps().vault
	err = v.update(func(d *vaultDoc) error {
		d.Direct[info.id] = vaultKey{APIKey: key}
		return nil
	})
	return e.wrote(v.path, err, "stored the direct credential for %s in the vault\n", info.id)
}

// answersPrune removes complete kept answers older than -older-than.
func answersPrune(e *cliEnv, o *opts, _ []string) error {
	if o.olderThan < 0 {
		return &usageError{msg: "want a -older-than of zero or more"}
	}
	dir, err := resolveState(e.getenv).path("signed answers", "answers")
	if err != nil {
		return err
	}
	removed, err := pruneAnswers(dir, time.Now().Add(-o.olderThan), func(name string, err error) {
		fmt.Fprintf(e.stderr, "brama: skipped %s: %v\n", name, err)
	})
	fmt.Fprintf(e.stdout, "removed %d complete answers older than %s\n", removed, o.olderThan)
	return err
}

// subscriptionAdd donates an API key from stdin (after the bearer) or an
// OAuth grant from -oauth-file to -agent.
func subscriptionAdd(e *cliEnv, o *opts, _ []string) error {
	body := donation{Provider: o.provider, Label: o.label}
	if o.file != "" {
		b, err := os.ReadFile(o.file)
		if err != nil {
			return err
		}
		body.OAuth = &oauthGrant{}
		if err := decodeStrict("-oauth-file", b, body.OAuth); err != nil {
			return err
		}
	} else if body.APIKey = e.line(); body.APIKey == "" {
		return errors.New("no API key on stdin (the line after the bearer token, or the first line when BRAMA_TOKEN is set); use -oauth-file for a grant")
	}
	return e.donate(o.agent, "", body)
}

// donate posts body for agent (query "?via=sign-in" marks a sign-in's) and
// prints the new id alone on stdout, for scripts.
func (e *cliEnv) donate(agent, query string, body donation) error {
	b, err := e.call("POST", subscriptionPath(agent)+query, body)
	if err != nil {
		return err
	}
	var ans struct{ Subscription donatedSubscription }
	if err := json.Unmarshal(b, &ans); err != nil || ans.Subscription.ID == "" {
		return fmt.Errorf("the gateway's answer names no subscription: %s", truncateUTF8(string(b), 200))
	}
	how := "donated"
	if query != "" {
		how = "signed in; donated"
	}
	fmt.Fprintf(e.stderr, "brama: %s %s subscription %s to agent %s\n", how, ans.Subscription.Provider, ans.Subscription.ID, agent)
	return e.say(nil, "%s\n", ans.Subscription.ID)
}

// subscriptionList prints one aligned row per subscription and a count
// (SPEC §16.1; USED is the fullest window's share), or with -json the body.
func subscriptionList(e *cliEnv, o *opts, _ []string) error {
	b, err := e.call("GET", subscriptionPath(o.agent), nil)
	if err != nil || o.json {
		return e.say(err, "%s", b)
	}
	subs, err := parseListing(b)
	if err != nil {
		return err
	}
	var rows []string
	retired := 0
	for _, r := range subs {
		cred, used, top := "-", "-", 0.0
		if r.Credential != nil {
			cred = r.Credential.State
		}
		for _, w := range r.Windows {
			top = max(top, w.UsedFraction)
			used = fmt.Sprintf("%.0f%%", top*100)
		}
		if r.Stale && len(r.Windows) > 0 {
			used += " (stale)"
		}
		if r.Status == "retired" {
			retired++
		}
		rows = append(rows, strings.Join([]string{r.ID, r.Provider, r.Status, cred, used, cmp.Or(r.Label, "-")}, "\t"))
	}
	e.table("ID\tPROVIDER\tSTATUS\tCREDENTIAL\tUSED\tLABEL", rows)
	return e.say(nil, "%d subscription(s), %d retired\n", len(subs), retired)
}

func parseListing(b []byte) ([]subscriptionRow, error) {
	var body struct{ Subscriptions []subscriptionRow }
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("the gateway's listing is not JSON: %w", err)
	}
	return body.Subscriptions, nil
}

// importHandover is what `subscription import` prints (README repeats it):
// a refresh rotates the shared grant, locking out whichever refreshes second.
const importHandover = "%s and Brama now share one grant: after Brama's first refresh, %s will need to sign in again; and if %s refreshes first, Brama's copy stops working until `brama subscription sign-in` replaces it.\n"

// importTool names the tool whose credential file import reads.
var importTool = map[string]string{"claude-code": "Claude Code", "codex": "the Codex CLI"}

// checkImport reads -from's grant before the bearer is read.
func checkImport(o *opts) error {
	if importTool[o.provider] == "" {
		return &usageError{msg: fmt.Sprintf("-provider %q: import reads claude-code or codex credential files", o.provider)}
	}
	b, err := os.ReadFile(o.from)
	if err == nil {
		if o.grant, err = parseImportFile(o.provider, b); err != nil {
			err = fmt.Errorf("%s: %w", o.from, err)
		}
	}
	return err
}

// subscriptionImport donates the grant another tool keeps to -agent, and
// prints the handover sentence.
func subscriptionImport(e *cliEnv, o *opts, _ []string) error {
	err := e.donate(o.agent, "", donation{Provider: o.provider, Label: o.label, OAuth: &o.grant})
	if tool := importTool[o.provider]; err == nil {
		fmt.Fprintf(e.stderr, "brama: "+importHandover, tool, tool, tool)
	}
	return err
}

// errImportFile marks a credential file import cannot use.
var errImportFile = errors.New("not a usable credential file")

// parseImportFile reads the grant from the file claude-code or codex keeps
// (SPEC §10.1), ignoring their tools' other members; fillGrant adds what the
// JWT claims say (SPEC §6.2). Errors wrap errImportFile, never quote a token.
func parseImportFile(provider string, b []byte) (oauthGrant, error) {
	var f struct {
		C *struct {
			AccessToken  string `json:"accessToken"`
			RefreshToken string `json:"refreshToken"`
			ExpiresAt    int64  `json:"expiresAt"`
		} `json:"claudeAiOauth"`
		T *oauthGrant `json:"tokens"` // access_token, refresh_token, id_token, account_id
	}
	object := map[string]string{"claude-code": "claudeAiOauth", "codex": "tokens"}[provider]
	err := json.Unmarshal(b, &f)
	var g *oauthGrant
	var te *json.UnmarshalTypeError
	if f.C != nil && provider == "claude-code" {
		g = &oauthGrant{AccessToken: f.C.AccessToken, RefreshToken: f.C.RefreshToken, ExpiresAtMs: f.C.ExpiresAt}
	} else if f.T != nil && provider == "codex" {
		g = &oauthGrant{AccessToken: f.T.AccessToken, RefreshToken: f.T.RefreshToken, IDToken: f.T.IDToken, AccountID: f.T.AccountID}
	}
	switch {
	case object == "":
		err = fmt.Errorf("import reads claude-code or codex files, not %q", provider)
	case errors.As(err, &te): // a syntax error's text can quote bytes of the file, which may be a token
		err = fmt.Errorf("member %s is not a %s", te.Field, te.Type)
	case err != nil:
		err = errors.New("not JSON (" + jsonErrorKind(err) + ")")
	case g == nil:
		err = fmt.Errorf("no %s object", object)
	case g.AccessToken == "" || g.RefreshToken == "":
		err = fmt.Errorf("the %s grant lacks its access or refresh token", provider)
	case g.ExpiresAtMs < 0:
		err = fmt.Errorf("the %s grant's expiry is negative", provider)
	default:
		return fillGrant(provider, *g), nil
	}
	return oauthGrant{}, fmt.Errorf("%w: %w", errImportFile, err)
}

// maintain runs one pass by the daemon (SPEC §11.2) and prints its report
// as text or JSON; it exits 0 only when the pass was ok.
func maintain(e *cliEnv, o *opts, _ []string) error {
	b, err := e.call("POST", "/v1/admin/maintain", nil)
	if err != nil {
		return err
	}
	var rep passReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("the gateway's answer is not a maintenance report (%s)", jsonErrorKind(err))
	}
	verdict := "ok" // and err is nil
	if !rep.OK {
		verdict, err = "not ok", errRefused
	}
	if o.json {
		e.stdout.Write(b)
		return err
	}
	fmt.Fprintf(e.stdout, "maintenance pass: %s\nusage reports: %d subscription(s), %d read, %d failed\n",
		verdict, rep.Usage.Subscriptions, rep.Usage.Read, len(rep.Usage.Failed))
	for _, f := range rep.Usage.Failed {
		fmt.Fprintf(e.stdout, "  failed %s (%s): %s\n", f.SubscriptionID, f.Provider, f.Error)
	}
	next := "nothing due"
	if rep.NextDueAt != nil {
		next = *rep.NextDueAt
	}
	fmt.Fprintf(e.stdout, "credentials: %d subscription(s), %d refreshed, %d refused or failed\nnext due: %s\n",
		rep.Credentials.Subscriptions, rep.Credentials.Refreshed, rep.Credentials.Refused, next)
	return err
}

// checkSignIn refuses a sign-in command line before the bearer is read.
func checkSignIn(o *opts) error {
	if o.id != "" && o.label != "" {
		return &usageError{msg: "-label names a new subscription; with -id the subscription keeps its label"}
	}
	if _, err := signInProvider(o.provider); err != nil {
		return &usageError{msg: fmt.Sprintf("-provider %q has no sign-in (claude-code or codex); donate its grant or replace it with PUT …/credential", o.provider)}
	}
	return nil
}

// subscriptionSignIn prints the authorize URL on stderr, reads the pasted
// code from stdin, exchanges it here, then hands the grant to the daemon;
// the verifier, the code and the tokens are never printed.
func subscriptionSignIn(e *cliEnv, o *opts, _ []string) error {
	// Check the gateway, the bearer and -id before the person signs in: a
	// code is good once and for minutes only.
	if err := e.checkSignInTarget(o.agent, o.id, o.provider); err != nil {
		return err
	}
	verifier, challenge := newPKCE()
	state := randomToken()
	authURL, err := authorizeURL(o.provider, state, challenge)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "brama: open this URL, sign in, then paste the code (or the whole redirect URL) as the next line:\n%s\n", authURL)
	code := e.line()
	if code == "" {
		return errors.New("sign-in stopped: no authorization code on stdin")
	}
	oa := newOAuth(e.getenv, newProviderClient(), nil, nil, slog.New(slog.DiscardHandler), time.Now)
	grant, err := oa.exchangeCode(e.ctx, o.provider, code, verifier, state)
	if err != nil {
		return fmt.Errorf("sign-in failed, nothing was stored: %w", err)
	}
	if o.id == "" {
		return e.donate(o.agent, "?via="+signInVia, donation{Provider: o.provider, Label: o.label, OAuth: &grant})
	}
	if _, err = e.call("PUT", subscriptionPath(o.agent, o.id, "credential"), credentialBody{OAuth: &grant}); err == nil {
		fmt.Fprintf(e.stderr, "brama: signed in; subscription %s of agent %s has a new %s grant\n", o.id, o.agent, o.provider)
	}
	return e.say(err, "%s\n", o.id)
}

// checkSignInTarget proves the gateway and an admin bearer work, and that
// agent owns id (when set), a live subscription of provider.
func (e *cliEnv) checkSignInTarget(agent, id, provider string) error {
	b, err := e.call("GET", subscriptionPath(agent), nil)
	if err != nil || id == "" {
		return err
	}
	rows, err := parseListing(b)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(rows, func(r subscriptionRow) bool { return r.ID == id })
	switch {
	case i < 0:
		return fmt.Errorf("agent %q has no subscription %q; nothing to sign in", agent, id)
	case rows[i].Provider != provider:
		return fmt.Errorf("subscription %s is a %s subscription, not %s", id, rows[i].Provider, provider)
	case rows[i].Status == "retired":
		return fmt.Errorf("subscription %s is retired; reinstate it before signing in", id)
	}
	return nil
}
