package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// cli_gateway.go is the half of the CLI that calls the daemon (SPEC §2.3,
// §16.1): subGateway, the admin API client, and the commands that use it,
// `brama subscription …` and `brama maintain`. Each takes -gateway URL and
// the bearer from BRAMA_TOKEN, else stdin's first line. cli.go holds the
// commands that work on the state directory in-process; the two are one
// CLI split only to keep each file under 650 lines.

// subGateway is one command's connection to the daemon's admin API.
type subGateway struct {
	ctx   context.Context // the CLI's: ends on SIGINT/SIGTERM
	base  string          // e.g. http://127.0.0.1:8080, no trailing slash
	token string
	hc    *http.Client
}

// gatewayFlag declares -gateway on fs.
func gatewayFlag(fs *flag.FlagSet) *string {
	return fs.String("gateway", "http://127.0.0.1:8080", "the brama serve `URL` to call")
}

// subscriptionGateway checks the gateway URL and takes the bearer from
// BRAMA_TOKEN, else the first line of in; in is left at the next line.
func (e cliEnv) subscriptionGateway(raw string, in *bufio.Reader) (*subGateway, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return nil, &usageError{fmt.Sprintf("-gateway %q is not an http:// or https:// URL", raw)}
	}
	tok := strings.TrimSpace(e.getenv("BRAMA_TOKEN"))
	if tok == "" {
		line, _ := in.ReadString('\n')
		tok = strings.TrimSpace(line)
	}
	if tok == "" {
		return nil, errors.New("no bearer token: set BRAMA_TOKEN or give the token as stdin's first line")
	}
	// No time limit of Brama's own (a maintenance pass may wait on token
	// endpoints); SIGINT or SIGTERM cancels the call through e.ctx.
	return &subGateway{ctx: e.ctx, base: strings.TrimRight(u.String(), "/"), token: tok, hc: &http.Client{}}, nil
}

// gatewayError is a refusal from the daemon: its envelope's code and message.
type gatewayError struct {
	Status  int
	Code    string
	Message string
}

func (e *gatewayError) Error() string {
	return fmt.Sprintf("the gateway refused (%d %s): %s", e.Status, e.Code, e.Message)
}

// call sends one admin request with body (nil for none) and returns the raw
// success body; a non-2xx answer is a *gatewayError.
func (g *subGateway) call(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(g.ctx, method, g.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+g.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the gateway at %s: %w", g.base, errors.Unwrap(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the gateway's answer: %w", err)
	}
	if resp.StatusCode/100 == 2 {
		return b, nil
	}
	var env envelope
	if json.Unmarshal(b, &env) != nil || env.Error.Code == "" {
		return nil, &gatewayError{Status: resp.StatusCode, Code: "unknown", Message: "the answer is not a Brama error envelope"}
	}
	return nil, &gatewayError{Status: resp.StatusCode, Code: env.Error.Code, Message: env.Error.Message}
}

// subscriptionPath is the admin path for agent, and for a subscription id
// when given, each segment escaped.
func subscriptionPath(agent string, rest ...string) string {
	p := "/v1/admin/subscriptions/" + url.PathEscape(agent)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// ---- `brama subscription …` (SPEC §2.3, §10.1, §16.1): every command is an
// HTTP client of the admin API, since the serving process is the only
// writer of the overlay and the vault's subscriptions section. Each takes
// -gateway and the bearer from BRAMA_TOKEN, else stdin's first line.

// subscriptionCmd dispatches `brama subscription SUBCOMMAND`.
func (e cliEnv) subscriptionCmd(args []string) error {
	return e.sub("subscription", args, map[string]func([]string) error{
		"add": e.subscriptionAdd, "list": e.subscriptionList, "retire": e.subscriptionRetire,
		"reinstate": e.subscriptionReinstate, "import": e.subscriptionImport,
		"sign-in": e.subscriptionSignIn,
	})
}

// requireFlag refuses a command line that left a required flag empty.
func requireFlag(name, v, usage string) error {
	if strings.TrimSpace(v) == "" {
		return &usageError{fmt.Sprintf("-%s is required; usage: brama %s", name, usage)}
	}
	return nil
}

// requireFlags is requireFlag over name, value pairs, every miss reported.
func requireFlags(usage string, nameValues ...string) error {
	var errs []error
	for i := 0; i+1 < len(nameValues); i += 2 {
		errs = append(errs, requireFlag(nameValues[i], nameValues[i+1], usage))
	}
	if err := errors.Join(errs...); err != nil {
		return &usageError{err.Error()}
	}
	return nil
}

// subscriptionAdd is `brama subscription add`: an API key from stdin (after
// the bearer) or an OAuth grant from -oauth-file, donated to -agent.
func (e cliEnv) subscriptionAdd(args []string) error {
	const usage = "subscription add -provider P -agent A [-label L] [-oauth-file F] [-gateway URL]  (bearer unless BRAMA_TOKEN, then the API key, on stdin)"
	fs := e.newFlags("subscription add")
	gw := gatewayFlag(fs)
	provider := fs.String("provider", "", "the `provider` of the subscription (claude-code, codex, kimi, openai, …)")
	agent := fs.String("agent", "", "the `agent` that receives it")
	label := fs.String("label", "", "an optional `label` (printable, at most 128 bytes)")
	oauthFile := fs.String("oauth-file", "", "read an OAuth grant {\"access_token\",\"refresh_token\",\"expires_at_ms\",…} from `file` instead of an API key on stdin")
	if _, err := parseFlags(fs, args, 0, usage); err != nil {
		return err
	}
	if err := requireFlags(usage, "provider", *provider, "agent", *agent); err != nil {
		return err
	}
	in := bufio.NewReader(e.stdin)
	g, err := e.subscriptionGateway(*gw, in)
	if err != nil {
		return err
	}
	body := donation{Provider: *provider, Label: *label}
	if *oauthFile != "" {
		b, err := os.ReadFile(*oauthFile)
		if err != nil {
			return err
		}
		body.OAuth = &oauthGrant{}
		if err := decodeStrict("-oauth-file", b, body.OAuth); err != nil {
			return err
		}
	} else {
		line, _ := in.ReadString('\n')
		if body.APIKey = strings.TrimSpace(line); body.APIKey == "" {
			return errors.New("no API key on stdin (the line after the bearer token, or the first line when BRAMA_TOKEN is set); use -oauth-file for a grant")
		}
	}
	return e.subscriptionDonate(g, *agent, "", body)
}

// subscriptionDonate posts body for agent (query "?via=sign-in" marks a
// sign-in's donation) and reports the new id: a sentence on stderr and the
// id alone on stdout, for scripts.
func (e cliEnv) subscriptionDonate(g *subGateway, agent, query string, body donation) error {
	b, err := g.call("POST", subscriptionPath(agent)+query, body)
	if err != nil {
		return err
	}
	var ans struct {
		Subscription donatedSubscription `json:"subscription"`
	}
	if err := json.Unmarshal(b, &ans); err != nil || ans.Subscription.ID == "" {
		return fmt.Errorf("the gateway's answer names no subscription: %s", truncateUTF8(string(b), 200))
	}
	how := "donated"
	if query != "" {
		how = "signed in; donated"
	}
	fmt.Fprintf(e.stderr, "brama: %s %s subscription %s to agent %s\n", how, ans.Subscription.Provider, ans.Subscription.ID, agent)
	fmt.Fprintln(e.stdout, ans.Subscription.ID)
	return nil
}

// subscriptionList is `brama subscription list`: aligned rows, or the
// listing's JSON body with -json.
func (e cliEnv) subscriptionList(args []string) error {
	const usage = "subscription list -agent A [-json] [-gateway URL]"
	fs := e.newFlags("subscription list")
	gw := gatewayFlag(fs)
	agent := fs.String("agent", "", "the `agent` whose subscriptions to list")
	asJSON := fs.Bool("json", false, "print the body of GET /v1/subscriptions/{agent_id}")
	if _, err := parseFlags(fs, args, 0, usage); err != nil {
		return err
	}
	if err := requireFlag("agent", *agent, usage); err != nil {
		return err
	}
	g, err := e.subscriptionGateway(*gw, bufio.NewReader(e.stdin))
	if err != nil {
		return err
	}
	b, err := g.call("GET", subscriptionPath(*agent), nil)
	if err != nil {
		return err
	}
	if *asJSON {
		e.stdout.Write(b)
		return nil
	}
	var body struct {
		Subscriptions []subscriptionRow `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return fmt.Errorf("the gateway's listing is not JSON: %w", err)
	}
	e.printSubscriptions(body.Subscriptions)
	return nil
}

// printSubscriptions prints one aligned row per subscription (SPEC §16.1)
// and a count. USED is the fullest window's share; CREDENTIAL the ledger's
// state (disabled for a retired one).
func (e cliEnv) printSubscriptions(rows []subscriptionRow) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROVIDER\tSTATUS\tCREDENTIAL\tUSED\tLABEL")
	retired := 0
	for _, r := range rows {
		cred, used := "-", "-"
		if r.Credential != nil {
			cred = r.Credential.State
		}
		if len(r.Windows) > 0 {
			top := 0.0
			for _, w := range r.Windows {
				top = max(top, w.UsedFraction)
			}
			used = fmt.Sprintf("%.0f%%", top*100)
		}
		if used != "-" && r.Stale {
			used += " (stale)"
		}
		if r.Status == "retired" {
			retired++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Provider, r.Status, cred, used, cmp.Or(r.Label, "-"))
	}
	tw.Flush()
	fmt.Fprintf(e.stdout, "%d subscription(s), %d retired\n", len(rows), retired)
}

// subscriptionRetire and subscriptionReinstate journal a subscription out of
// or back into service through the daemon; reinstate needs a reason.
func (e cliEnv) subscriptionRetire(args []string) error {
	return e.subscriptionStatus("retire", args)
}
func (e cliEnv) subscriptionReinstate(args []string) error {
	return e.subscriptionStatus("reinstate", args)
}

// subscriptionStatus is `brama subscription retire|reinstate … ID`: DELETE
// …/{id}[?reason=R], or POST …/{id}/reinstate {"reason":R}.
func (e cliEnv) subscriptionStatus(kind string, args []string) error {
	usage := "subscription retire -agent A [-reason R] [-gateway URL] ID"
	why := "why (journaled; default \"retired by <client id>\")"
	if kind == "reinstate" {
		usage, why = "subscription reinstate -agent A -reason R [-gateway URL] ID", "why (required; journaled)"
	}
	fs := e.newFlags("subscription " + kind)
	gw := gatewayFlag(fs)
	agent := fs.String("agent", "", "the `agent` that owns the subscription")
	reason := fs.String("reason", "", why)
	pos, err := parseFlags(fs, args, 1, usage)
	if err != nil {
		return err
	}
	if kind == "reinstate" {
		err = requireFlags(usage, "agent", *agent, "reason", *reason)
	} else {
		err = requireFlag("agent", *agent, usage)
	}
	if err != nil {
		return err
	}
	g, err := e.subscriptionGateway(*gw, bufio.NewReader(e.stdin))
	if err != nil {
		return err
	}
	if kind == "reinstate" {
		_, err = g.call("POST", subscriptionPath(*agent, pos[0], "reinstate"), map[string]string{"reason": *reason})
	} else if path := subscriptionPath(*agent, pos[0]); *reason != "" {
		_, err = g.call("DELETE", path+"?reason="+url.QueryEscape(*reason), nil)
	} else {
		_, err = g.call("DELETE", path, nil)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%sd %s\n", kind, pos[0])
	return nil
}

// importHandover is what `subscription import` prints (and README repeats):
// the source tool and Brama now share one grant, and OAuth refresh rotates
// the refresh token, so whichever refreshes second is locked out.
const importHandover = "%s and Brama now share one grant: after Brama's first refresh, %s will need to sign in again; and if %s refreshes first, Brama's copy stops working until `brama subscription sign-in` replaces it.\n"

// importTool names the tool whose credential file import reads.
var importTool = map[string]string{"claude-code": "Claude Code", "codex": "the Codex CLI"}

// subscriptionImport is `brama subscription import`: the grant another tool
// keeps, donated to -agent, and the handover sentence.
func (e cliEnv) subscriptionImport(args []string) error {
	const usage = "subscription import -provider claude-code|codex -from FILE -agent A [-label L] [-gateway URL]"
	fs := e.newFlags("subscription import")
	gw := gatewayFlag(fs)
	provider := fs.String("provider", "", "claude-code or codex")
	from := fs.String("from", "", "the tool's credential `file` (~/.claude/.credentials.json, ~/.codex/auth.json)")
	agent := fs.String("agent", "", "the `agent` that receives the grant")
	label := fs.String("label", "", "an optional `label`")
	if _, err := parseFlags(fs, args, 0, usage); err != nil {
		return err
	}
	if err := requireFlags(usage, "provider", *provider, "from", *from, "agent", *agent); err != nil {
		return err
	}
	tool, ok := importTool[*provider]
	if !ok {
		return &usageError{fmt.Sprintf("-provider %q: import reads claude-code or codex credential files", *provider)}
	}
	b, err := os.ReadFile(*from)
	if err != nil {
		return err
	}
	grant, err := parseImportFile(*provider, b)
	if err != nil {
		return fmt.Errorf("%s: %w", *from, err)
	}
	g, err := e.subscriptionGateway(*gw, bufio.NewReader(e.stdin))
	if err != nil {
		return err
	}
	if err := e.subscriptionDonate(g, *agent, "", donation{Provider: *provider, Label: *label, OAuth: &grant}); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "brama: "+importHandover, tool, tool, tool)
	return nil
}

// errImportFile marks a credential file import cannot use.
var errImportFile = errors.New("not a usable credential file")

// parseImportFile reads the grant from the file claude-code or codex keeps
// (SPEC §10.1): claudeAiOauth.{accessToken,refreshToken,expiresAt} or
// tokens.{access_token,refresh_token,id_token,account_id}. The files hold
// other members of their tools' own, so unknown members are ignored.
// fillGrant supplies what the file lacks from the tokens' JWT claims (SPEC
// §6.2). Errors wrap errImportFile and never quote a token.
func parseImportFile(provider string, b []byte) (oauthGrant, error) {
	var g oauthGrant
	var err error
	object, found := "", false
	switch provider {
	case "claude-code":
		var f struct {
			C *struct {
				AccessToken  string `json:"accessToken"`
				RefreshToken string `json:"refreshToken"`
				ExpiresAt    int64  `json:"expiresAt"`
			} `json:"claudeAiOauth"`
		}
		err, object = json.Unmarshal(b, &f), "claudeAiOauth"
		if found = f.C != nil; found {
			g = oauthGrant{AccessToken: f.C.AccessToken, RefreshToken: f.C.RefreshToken, ExpiresAtMs: f.C.ExpiresAt}
		}
	case "codex":
		var f struct {
			T *struct {
				AccessToken  string `json:"access_token"`
				RefreshToken string `json:"refresh_token"`
				IDToken      string `json:"id_token"`
				AccountID    string `json:"account_id"`
			} `json:"tokens"`
		}
		err, object = json.Unmarshal(b, &f), "tokens"
		if found = f.T != nil; found {
			g = oauthGrant{AccessToken: f.T.AccessToken, RefreshToken: f.T.RefreshToken, IDToken: f.T.IDToken, AccountID: f.T.AccountID}
		}
	default:
		return g, fmt.Errorf("%w: import reads claude-code or codex files, not %q", errImportFile, provider)
	}
	switch {
	case err != nil:
		return oauthGrant{}, fmt.Errorf("%w: %s", errImportFile, jsonProblem(err))
	case !found:
		return oauthGrant{}, fmt.Errorf("%w: no %s object", errImportFile, object)
	case g.AccessToken == "" || g.RefreshToken == "":
		return oauthGrant{}, fmt.Errorf("%w: the %s grant lacks its access or refresh token", errImportFile, provider)
	case g.ExpiresAtMs < 0:
		return oauthGrant{}, fmt.Errorf("%w: the %s grant's expiry is negative", errImportFile, provider)
	}
	return fillGrant(provider, g), nil
}

// jsonProblem describes a decoding error by its kind and offset only: a
// syntax error's text can quote bytes of the file, which may be a token.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("not JSON (syntax error at byte %d)", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("member %s is not a %s", te.Field, te.Type)
	}
	return "not JSON"
}

// ---- end of `brama subscription …`

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
	if err := requireFlags(usage, "provider", *provider, "agent", *agent); err != nil {
		return err
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
	state := randomToken()
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
	return e.subscriptionDonate(g, *agent, "?via="+signInVia, donation{Provider: *provider, Label: *label, OAuth: &grant})
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
