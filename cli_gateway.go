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

// The CLI commands that call the daemon, the only writer of the overlay and
// the vault's subscriptions (SPEC §2.3, §16.1): subscription … and maintain.

// subGateway is one command's connection to the daemon's admin API.
type subGateway struct {
	ctx   context.Context // the CLI's (a signal ends the whole command)
	base  string          // e.g. http://127.0.0.1:8080, no trailing slash
	token string
	in    *bufio.Reader // stdin, at the line after the bearer when it came from there
}

// gateway declares -gateway on fs and parses args; it refuses a line that
// left a required flag empty (naming every one) or that check (nil: none)
// refuses, then takes the bearer from BRAMA_TOKEN, else stdin's first line.
func (e cliEnv) gateway(fs *flag.FlagSet, args []string, positionals int, usage string, check func() error, required ...string) ([]string, *subGateway, error) {
	raw := fs.String("gateway", "http://127.0.0.1:8080", "the brama serve `URL` to call")
	pos, err := parseFlags(fs, args, positionals, usage)
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	for _, name := range required {
		if strings.TrimSpace(fs.Lookup(name).Value.String()) == "" {
			errs = append(errs, fmt.Errorf("-%s is required; usage: brama %s", name, usage))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, &usageError{err.Error()}
	}
	if check != nil {
		if err := check(); err != nil {
			return nil, nil, err
		}
	}
	u, err := url.Parse(strings.TrimSpace(*raw))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return nil, nil, &usageError{fmt.Sprintf("-gateway %q is not an http:// or https:// URL", *raw)}
	}
	if u.Scheme == "http" && !isLoopbackHost(u.Hostname()) { // the bearer and credentials would cross in clear text
		return nil, nil, &usageError{fmt.Sprintf("-gateway %q: http:// is allowed only to a loopback host; use https://", *raw)}
	}
	in := bufio.NewReader(e.stdin)
	tok := strings.TrimSpace(e.getenv("BRAMA_TOKEN"))
	if tok == "" {
		line, _ := in.ReadString('\n')
		tok = strings.TrimSpace(line)
	}
	if tok == "" {
		return nil, nil, errors.New("no bearer token: set BRAMA_TOKEN or give the token as stdin's first line")
	}
	// No time limit of Brama's own (a maintenance pass may wait on token
	// endpoints); one SIGINT ends the command (SPEC §17).
	return pos, &subGateway{ctx: e.ctx, base: strings.TrimRight(u.String(), "/"), token: tok, in: in}, nil
}

// call sends one admin request with body (nil for none) and returns the raw
// success body; a non-2xx answer is an error quoting the envelope.
func (g *subGateway) call(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body) // a donation, credentialBody or map of strings cannot fail
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
	resp, err := http.DefaultClient.Do(req)
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
		env.Error.Code, env.Error.Message = "unknown", "the answer is not a Brama error envelope"
	}
	return nil, fmt.Errorf("the gateway refused (%d %s): %s", resp.StatusCode, env.Error.Code, env.Error.Message)
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

// subscriptionAdd is `brama subscription add`: an API key from stdin (after
// the bearer) or an OAuth grant from -oauth-file, donated to -agent.
func (e cliEnv) subscriptionAdd(args []string) error {
	const usage = "subscription add -provider P -agent A [-label L] [-oauth-file F] [-gateway URL]  (bearer unless BRAMA_TOKEN, then the API key, on stdin)"
	fs := e.newFlags("subscription add")
	provider := fs.String("provider", "", "the `provider` of the subscription (claude-code, codex, kimi, openai, …)")
	agent := fs.String("agent", "", "the `agent` that receives it")
	label := fs.String("label", "", "an optional `label` (printable, at most 128 bytes)")
	oauthFile := fs.String("oauth-file", "", "read an OAuth grant {\"access_token\",\"refresh_token\",\"expires_at_ms\",…} from `file` instead of an API key on stdin")
	_, g, err := e.gateway(fs, args, 0, usage, nil, "provider", "agent")
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
		line, _ := g.in.ReadString('\n')
		if body.APIKey = strings.TrimSpace(line); body.APIKey == "" {
			return errors.New("no API key on stdin (the line after the bearer token, or the first line when BRAMA_TOKEN is set); use -oauth-file for a grant")
		}
	}
	return e.subscriptionDonate(g, *agent, "", body)
}

// subscriptionDonate posts body for agent (query "?via=sign-in" marks a
// sign-in's) and prints the new id alone on stdout, for scripts.
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

// subscriptionList is `brama subscription list`: one aligned row per
// subscription and a count (SPEC §16.1; USED is the fullest window's share),
// or the listing's JSON body with -json.
func (e cliEnv) subscriptionList(args []string) error {
	const usage = "subscription list -agent A [-json] [-gateway URL]"
	fs := e.newFlags("subscription list")
	agent := fs.String("agent", "", "the `agent` whose subscriptions to list")
	asJSON := fs.Bool("json", false, "print the body of GET /v1/subscriptions/{agent_id}")
	_, g, err := e.gateway(fs, args, 0, usage, nil, "agent")
	if err != nil {
		return err
	}
	b, err := g.call("GET", subscriptionPath(*agent), nil)
	if err != nil || *asJSON {
		e.stdout.Write(b)
		return err
	}
	rows, err := parseListing(b)
	if err != nil {
		return err
	}
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
			if r.Stale {
				used += " (stale)"
			}
		}
		if r.Status == "retired" {
			retired++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Provider, r.Status, cred, used, cmp.Or(r.Label, "-"))
	}
	tw.Flush()
	fmt.Fprintf(e.stdout, "%d subscription(s), %d retired\n", len(rows), retired)
	return nil
}

// parseListing reads the rows of GET …/subscriptions/{agent_id}.
func parseListing(b []byte) ([]subscriptionRow, error) {
	var body struct {
		Subscriptions []subscriptionRow `json:"subscriptions"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("the gateway's listing is not JSON: %w", err)
	}
	return body.Subscriptions, nil
}

// subscriptionStatus is `brama subscription retire|reinstate … ID`: DELETE
// …/{id}[?reason=R], or POST …/{id}/reinstate {"reason":R}.
func (e cliEnv) subscriptionStatus(kind string, args []string) error {
	usage := "subscription retire -agent A [-reason R] [-gateway URL] ID"
	why, required := "why (journaled; default \"retired by <client id>\")", []string{"agent"}
	if kind == "reinstate" {
		usage = "subscription reinstate -agent A -reason R [-gateway URL] ID"
		why, required = "why (required; journaled)", []string{"agent", "reason"}
	}
	fs := e.newFlags("subscription " + kind)
	agent := fs.String("agent", "", "the `agent` that owns the subscription")
	reason := fs.String("reason", "", why)
	pos, g, err := e.gateway(fs, args, 1, usage, nil, required...)
	if err != nil {
		return err
	}
	if path := subscriptionPath(*agent, pos[0]); kind == "reinstate" {
		_, err = g.call("POST", path+"/reinstate", map[string]string{"reason": *reason})
	} else if *reason != "" {
		_, err = g.call("DELETE", path+"?reason="+url.QueryEscape(*reason), nil)
	} else {
		_, err = g.call("DELETE", path, nil)
	}
	return e.said(err, "%sd %s\n", kind, pos[0])
}

// subscriptionPruneOrphans is `brama subscription prune-orphans`: the daemon
// removes the vault's credentials no subscription names (SPEC §17).
func (e cliEnv) subscriptionPruneOrphans(args []string) error {
	_, g, err := e.gateway(e.newFlags("subscription prune-orphans"), args, 0, "subscription prune-orphans [-gateway URL]", nil)
	if err != nil {
		return err
	}
	b, err := g.call("POST", "/v1/admin/vault/prune-orphans", nil)
	var body struct {
		Removed []string `json:"removed"`
	}
	if err == nil && json.Unmarshal(b, &body) != nil {
		err = errors.New("the gateway's answer is not a prune report")
	}
	return e.said(err, "removed %d orphaned credential(s) from the vault: %s\n", len(body.Removed), strings.Join(body.Removed, " "))
}

// importHandover is what `subscription import` prints (README repeats it):
// a refresh rotates the shared grant, locking out whichever refreshes second.
const importHandover = "%s and Brama now share one grant: after Brama's first refresh, %s will need to sign in again; and if %s refreshes first, Brama's copy stops working until `brama subscription sign-in` replaces it.\n"

// importTool names the tool whose credential file import reads.
var importTool = map[string]string{"claude-code": "Claude Code", "codex": "the Codex CLI"}

// subscriptionImport is `brama subscription import`: the grant another tool
// keeps, donated to -agent, and the handover sentence.
func (e cliEnv) subscriptionImport(args []string) error {
	const usage = "subscription import -provider claude-code|codex -from FILE -agent A [-label L] [-gateway URL]"
	fs := e.newFlags("subscription import")
	provider := fs.String("provider", "", "claude-code or codex")
	from := fs.String("from", "", "the tool's credential `file` (~/.claude/.credentials.json, ~/.codex/auth.json)")
	agent := fs.String("agent", "", "the `agent` that receives the grant")
	label := fs.String("label", "", "an optional `label`")
	var tool string
	var grant oauthGrant
	_, g, err := e.gateway(fs, args, 0, usage, func() error {
		if tool = importTool[*provider]; tool == "" {
			return &usageError{fmt.Sprintf("-provider %q: import reads claude-code or codex credential files", *provider)}
		}
		b, err := os.ReadFile(*from)
		if err == nil {
			if grant, err = parseImportFile(*provider, b); err != nil {
				err = fmt.Errorf("%s: %w", *from, err)
			}
		}
		return err
	}, "provider", "from", "agent")
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
// (SPEC §10.1), ignoring their tools' other members; fillGrant adds what the
// JWT claims say (SPEC §6.2). Errors wrap errImportFile, never quote a token.
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
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("member %s is not a %s", te.Field, te.Type)
	}
	return "not JSON (" + jsonErrorKind(err) + ")"
}

// maintainCmd is `brama maintain`: one pass by the daemon (SPEC §11.2),
// its report as text or JSON; it exits 0 only when the pass was ok.
func (e cliEnv) maintainCmd(args []string) error {
	const usage = "maintain [-gateway URL] [-json]  (bearer from BRAMA_TOKEN, else stdin's first line)"
	fs := e.newFlags("maintain")
	asJSON := fs.Bool("json", false, "print the body of POST /v1/admin/maintain")
	_, g, err := e.gateway(fs, args, 0, usage, nil)
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
	verdict := "ok" // and err is nil
	if !rep.OK {
		verdict, err = "not ok", errRefused
	}
	if *asJSON {
		e.stdout.Write(b)
		return err
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
	return err
}

// subscriptionSignIn is `brama subscription sign-in`: the authorize URL on
// stderr, the pasted code from stdin, exchanged here, then the grant handed
// to the daemon; the verifier, the code and the tokens are never printed.
func (e cliEnv) subscriptionSignIn(args []string) error {
	const usage = "subscription sign-in -provider claude-code|codex -agent A [-id ID | -label L] [-gateway URL]  (bearer unless BRAMA_TOKEN, then the pasted code, on stdin)"
	fs := e.newFlags("subscription sign-in")
	provider := fs.String("provider", "", "claude-code or codex")
	agent := fs.String("agent", "", "the `agent` that owns (or receives) the subscription")
	id := fs.String("id", "", "replace the credential of this subscription `id` instead of donating a new one")
	label := fs.String("label", "", "a `label` for a new subscription")
	_, g, err := e.gateway(fs, args, 0, usage, func() error {
		if *id != "" && *label != "" {
			return &usageError{"-label names a new subscription; with -id the subscription keeps its label; usage: brama " + usage}
		}
		if _, err := signInProvider(*provider); err != nil {
			return &usageError{fmt.Sprintf("-provider %q has no sign-in (claude-code or codex); donate its grant or replace it with PUT …/credential", *provider)}
		}
		return nil
	}, "provider", "agent")
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
	line, _ := g.in.ReadString('\n')
	code := strings.TrimSpace(line)
	if code == "" {
		return errors.New("sign-in stopped: no authorization code on stdin")
	}
	o := newOAuth(e.getenv, newProviderClient(), nil, nil, slog.New(slog.DiscardHandler), time.Now)
	grant, err := o.exchangeCode(e.ctx, *provider, code, verifier, state)
	if err != nil {
		return fmt.Errorf("sign-in failed, nothing was stored: %w", err)
	}
	if *id == "" {
		return e.subscriptionDonate(g, *agent, "?via="+signInVia, donation{Provider: *provider, Label: *label, OAuth: &grant})
	}
	if _, err = g.call("PUT", subscriptionPath(*agent, *id, "credential"), credentialBody{OAuth: &grant}); err == nil {
		fmt.Fprintf(e.stderr, "brama: signed in; subscription %s of agent %s has a new %s grant\n", *id, *agent, *provider)
	}
	return e.said(err, "%s\n", *id)
}

// checkSignInTarget proves the gateway and an admin bearer work, and that
// agent owns id (when set), a live subscription of provider.
func (g *subGateway) checkSignInTarget(agent, id, provider string) error {
	b, err := g.call("GET", subscriptionPath(agent), nil)
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
