package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// What an *endpointError or another failure of this file wraps.
var (
	errNoSignIn          = errors.New("provider has no sign-in; donate its grant or replace it with PUT …/credential")
	errTokenMalformed    = errors.New("token endpoint answer is not a usable token answer")
	errTokenRefused      = errors.New("token endpoint answered with an error")
	errNoRefreshToken    = errors.New("the stored grant has no refresh token")
	errRefreshSuperseded = errors.New("the vault's grant changed during the refresh; its result was discarded")
	errStateMismatch     = errors.New("the pasted code belongs to another sign-in (state differs)")
	// definitiveErrors say the grant or client is no good (RFC 6749 §5.2, RFC 6750 §3.1; OpenAI's codes, final to the Codex CLI).
	definitiveErrors = map[string]bool{
		"invalid_grant": true, "invalid_token": true, "invalid_client": true, "unauthorized_client": true,
		"refresh_token_reused": true, "refresh_token_expired": true, "refresh_token_invalidated": true,
	}
	// oauthErrorCode is a code worth quoting (RFC 6749 §5.2's short words); prose could carry a secret.
	oauthErrorCode = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)
)

// oauthClient refreshes and exchanges grants, one refresh per subscription shared by all who ask (B8): a 401 burst spends one.
type oauthClient struct {
	getenv func(string) string
	client *http.Client // the provider client: no redirects, no proxy, no timeout
	vault  *vault
	ledger *ledger
	sys

	mu       sync.Mutex              // guards inflight
	inflight map[string]*refreshCall // nil once shutdown began: no new flight starts
	wg       sync.WaitGroup          // counts flights, which run detached from their callers
	flights  context.Context         // every flight's context: cancelled at serve's second stop signal only
	cut      context.CancelFunc      // cancels flights

	testingOnlyJoined func(id string) // runs once a caller joined id's flight (nil in production)
}

// refreshCall is one flight; grant and err are set before done closes.
type refreshCall struct {
	done  chan struct{}
	grant oauthGrant
	err   error
}

func newOAuth(getenv func(string) string, client *http.Client, v *vault, l *ledger, log *slog.Logger, now func() time.Time) *oauthClient {
	flights, cut := context.WithCancel(context.Background())
	return &oauthClient{getenv: getenv, client: client, vault: v, ledger: l, sys: sys{log, now},
		inflight: map[string]*refreshCall{}, flights: flights, cut: cut}
}

// shutdown waits for every flight, so a token the provider rotated is kept (SPEC §11.1: no time limit); cut cancels those left.
func (o *oauthClient) shutdown(cut <-chan struct{}) {
	o.mu.Lock()
	if n := len(o.inflight); n > 0 {
		o.log.Info("serve_waiting_for_refreshes", "flights", n)
	}
	o.inflight = nil
	o.mu.Unlock()
	go func() {
		select {
		case <-cut:
		case <-o.flights.Done():
		}
		o.cut()
	}()
	o.wg.Wait()
	o.cut() // ends the goroutine above
}

// refresh returns id's refreshed grant (the vault's if refusedAccessToken is no longer it) from one flight shared by concurrent
// calls, which a caller's hang-up does not end (STYLE B8).
func (o *oauthClient) refresh(ctx context.Context, id, provider, refusedAccessToken string) (oauthGrant, error) {
	o.mu.Lock()
	c, ok := o.inflight[id]
	if !ok && o.inflight != nil {
		c = &refreshCall{done: make(chan struct{})}
		o.inflight[id] = c
		o.wg.Go(func() { // exits when the token call ends or shutdown cuts it; callers wait on c.done
			c.grant, c.err = o.refreshOnce(o.flights, id, provider, refusedAccessToken)
			o.mu.Lock()
			delete(o.inflight, id)
			o.mu.Unlock()
			close(c.done)
		})
	}
	o.mu.Unlock()
	if c == nil {
		return oauthGrant{}, errors.New("brama is shutting down")
	} else if o.testingOnlyJoined != nil {
		o.testingOnlyJoined(id)
	}
	select {
	case <-c.done:
		return c.grant, c.err
	case <-ctx.Done():
		return oauthGrant{}, fmt.Errorf("waiting for the grant refresh of %s: %w", id, ctx.Err())
	}
}

// refreshOnce is one flight from the vault's grant, committed only while the vault holds its refresh token; a definitive
// refusal marks the credential for a sign-in unless one replaced the grant meanwhile.
func (o *oauthClient) refreshOnce(ctx context.Context, id, provider, refused string) (g oauthGrant, err error) {
	log := o.log.With("subscription_id", id, "provider", provider)
	defer func() {
		if errors.Is(err, errRefreshSuperseded) {
			log.Info("credential_refresh_superseded")
		} else if re, ok := errors.AsType[*endpointError](err); ok && re.Definitive {
			o.ledger.disown(id, provider, re.Sentence)
			log.Warn("credential_refresh_refused", "endpoint", re.Endpoint, "status", re.Status, "cause", re.Sentence)
		} else if err != nil {
			log.Warn("credential_refresh_failed", "error", err.Error())
		}
	}()
	doc, err := o.vault.load()
	if err != nil {
		return oauthGrant{}, fmt.Errorf("refresh %s: vault: %w", id, err)
	} else if doc.Subscriptions[id].OAuth == nil {
		return oauthGrant{}, fmt.Errorf("refresh %s: the vault holds no OAuth grant for it", id)
	}
	old := *doc.Subscriptions[id].OAuth // doc is the vault's shared cache: copy, never write into it
	if refused != "" && old.AccessToken != refused && !expiredForRequest(old, o.now()) {
		return old, nil // another token is current: the caller retries with it, unless it lapsed too
	}
	p, _ := lookupProvider(provider)
	fields := map[string]string{"grant_type": "refresh_token", "refresh_token": old.RefreshToken, "client_id": p.clientID}
	g, err = o.tokenCall(ctx, p, old, fields, old.RefreshToken, old.AccessToken)
	werr := o.vault.update(func(d *vaultDoc) error { // a failure writes nothing
		if c := d.Subscriptions[id].OAuth; c == nil || c.RefreshToken != old.RefreshToken {
			return errRefreshSuperseded // a sign-in meanwhile makes the grant, or the refusal, moot
		} else if err == nil {
			d.Subscriptions[id] = vaultCredential{OAuth: &g}
		}
		return err
	})
	if errors.Is(werr, errRefreshSuperseded) {
		return oauthGrant{}, werr
	} else if err != nil {
		return oauthGrant{}, err
	} else if werr != nil { // the provider may have retired the vault's refresh token: keep the new grant (SPEC §17)
		o.vault.keepUnwritten(id, old, g)
		log.Error("credential_refresh_unwritten", "error", redact(werr.Error()))
	}
	o.ledger.activate(id, provider, g.ExpiresAtMs, o.now().UnixMilli())
	log.Info("credential_refresh_ok", "expires_at_ms", g.ExpiresAtMs)
	return g, nil
}

// endpointError is a failed token call or usage read, naming endpoint, status and bytes, never quoting a body (SPEC §11.1).
type endpointError struct {
	Op, Endpoint     string // Op "": a token call; checkBaseURL holds Endpoint to scheme, host and path
	Status, Received int    // Status 0: none was received
	Definitive       bool   // the grant was disowned; Sentence (redacted, ≤200 bytes) is the provider's word
	Sentence         string
	Err              error // nil for a plain non-2xx usage answer
}

func (e *endpointError) Error() string {
	got := pick(e.Status == 0, "no status", fmt.Sprintf("HTTP %d", e.Status))
	msg := fmt.Sprintf("%s %s: %s, %d bytes received", cmp.Or(e.Op, "OAuth token POST"), e.Endpoint, got, e.Received)
	if e.Err != nil { // a definitive refusal states the provider's sentence instead
		return msg + ": " + cmp.Or(e.Sentence, e.Err.Error())
	}
	return msg
}

func (e *endpointError) Unwrap() error { return e.Err }

// tokenCall POSTs fields to p's token endpoint in p's body format and returns g renewed by the answer, quoting no secret; a
// refresh without a refresh token is refused unsent: only a sign-in helps.
func (o *oauthClient) tokenCall(ctx context.Context, p providerInfo, g oauthGrant, fields map[string]string,
	secrets ...string) (oauthGrant, error) {
	endpoint, err := envURL(o.getenv, "OAUTH", p.id, "TOKEN_URL", p.tokenURL)
	if err != nil {
		return oauthGrant{}, err
	} else if v, ok := fields["refresh_token"]; ok && v == "" {
		return oauthGrant{}, &endpointError{Definitive: true, Endpoint: endpoint,
			Sentence: errNoRefreshToken.Error(), Err: errNoRefreshToken}
	}
	body, ctype := must(json.Marshal(fields)), "application/json"
	if p.form {
		vals := url.Values{}
		for k, v := range fields {
			vals.Set(k, v)
		}
		body, ctype = []byte(vals.Encode()), "application/x-www-form-urlencoded"
	}
	status, b, err := callEndpoint(ctx, o.client, http.MethodPost, endpoint, body, http.Header{"Content-Type": {ctype}})
	ans, err := readTokenAnswer(endpoint, status, b, err, secrets...)
	if err != nil {
		return oauthGrant{}, err
	}
	// A refresh or id token not sent again is kept (SPEC §11.1).
	g.AccessToken, g.ExpiresAtMs = ans.AccessToken, pick(ans.ExpiresIn > 0, o.now().UnixMilli()+ans.ExpiresIn*1000, 0)
	g.RefreshToken, g.IDToken = cmp.Or(ans.RefreshToken, g.RefreshToken), cmp.Or(ans.IDToken, g.IDToken)
	return fillGrant(p.id, g), nil
}

// tokenAnswer is what Brama reads of a token answer; ExpiresIn is seconds, 0 when absent or unusable.
type tokenAnswer struct {
	AccessToken  string `json:"access_token,omitempty"`
	RefreshToken string `json:"refresh_token,omitempty"`
	IDToken      string `json:"id_token,omitempty"`
	ExpiresIn    int64  `json:"expires_in,omitempty"`
	Error        string `json:"error,omitempty"`
	Description  string `json:"error_description,omitempty"`
}

// readTokenAnswer reads a token answer leniently (a member of another type is absent) and sorts it (SPEC §11.1): a 2xx with a
// usable access token is used; a complete invalid_grant-class refusal or 401/403 is definitive; all else is a transport
// failure, even a 401 whose body ended early (readErr): no evidence the grant was disowned (seed, "Cancellation and retry").
func readTokenAnswer(endpoint string, status int, body []byte, readErr error, secrets ...string) (tokenAnswer, error) {
	re := &endpointError{Endpoint: endpoint, Status: status, Received: len(body), Err: readErr}
	var raw struct {
		tokenAnswer
		Expires number          `json:"expires_in"` // a number, or a string holding one
		Err     json.RawMessage `json:"error"`      // a string, or {"type","code","message"}
	}
	json.Unmarshal(body, &raw) // anything but a JSON object fills nothing; a member of another type is absent
	ans := raw.tokenAnswer
	if f := raw.Expires.v; f >= 1 && f <= 100*365*24*3600 { // more is unusable, not an overflow
		ans.ExpiresIn = int64(f)
	}
	e, isObject := errorObject(raw.Err) // a string is its msg
	if ans.Error = e.msg; isObject {
		ans.Error = pick(definitiveErrors[e.code], e.code, cmp.Or(e.typ, e.code, "error"))
		ans.Description = cmp.Or(ans.Description, e.msg)
	}
	// No real token is shorter than 8 bytes; replacing a shorter one would garble the sentence.
	secrets = slices.DeleteFunc(slices.Clone(secrets), func(s string) bool { return len(s) < 8 })
	quote := func(s string) string { return cleanQuoted(redact(s, secrets...), "", maxSentenceChars) }
	switch {
	case readErr != nil:
		return tokenAnswer{}, re
	case definitiveErrors[ans.Error] || status == http.StatusUnauthorized || status == http.StatusForbidden:
		re.Definitive, re.Err = true, errTokenRefused
		re.Sentence = cmp.Or(quote(ans.Description), quote(ans.Error),
			fmt.Sprintf("the token endpoint answered %d %s", status, http.StatusText(status)))
	case oauthErrorCode.MatchString(ans.Error): // not empty
		re.Err = fmt.Errorf("%w: %s", errTokenRefused, quote(ans.Error))
	case ans.Error != "":
		re.Err = errTokenRefused
	case status/100 != 2 || ans.AccessToken == "" || controlAt(ans.AccessToken) >= 0: // no header carries it (SPEC §17)
		re.Err = fmt.Errorf("%w: no 2xx JSON object with an access_token free of control characters", errTokenMalformed)
	default:
		return ans, nil
	}
	return ans, re
}

// expiredForRequest is SPEC §11.1's request-path rule: now ≥ expires_at_ms − 60 s, never when unknown.
func expiredForRequest(g oauthGrant, now time.Time) bool {
	return g.ExpiresAtMs != 0 && now.UnixMilli() >= g.ExpiresAtMs-60_000
}

// fillGrant completes g: expiry from the access token's JWT exp, codex's account id from the id_token (SPEC §6.2).
func fillGrant(provider string, g oauthGrant) oauthGrant {
	if exp := jwtClaims(g.AccessToken).Exp; g.ExpiresAtMs == 0 && exp >= 1 && exp <= planMaxResetSeconds {
		g.ExpiresAtMs = int64(exp) * 1000
	}
	if p, _ := lookupProvider(provider); p.codex && g.AccountID == "" {
		g.AccountID = jwtClaims(g.IDToken).Auth.AccountID
	}
	return g
}

// jwtClaims decodes what Brama reads of a JWT's payload (RFC 7519 §3) unchecked: the provider checks its own token.
func jwtClaims(token string) (c struct {
	Exp  float64 `json:"exp"`
	Auth struct {
		AccountID string `json:"chatgpt_account_id"`
	} `json:"https://api.openai.com/auth"`
}) {
	if parts := strings.Split(token, "."); len(parts) == 3 {
		b, _ := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
		json.Unmarshal(b, &c) // a member of another type stays zero
	}
	return c
}

// signIn is one sign-in under way (SPEC §11.1; RFC 6749 §4.1, RFC 7636): the URL to open, the verifier and state to exchange.
type signIn struct{ provider, url, verifier, state string }

// newSignIn starts provider's sign-in: a fresh verifier (32 random bytes, RFC 7636 §4.1), its S256 challenge, a fresh state.
func newSignIn(provider string) (signIn, error) {
	p, _ := lookupProvider(provider)
	if p.authorizeURL == "" {
		return signIn{}, fmt.Errorf("provider %q: %w", provider, errNoSignIn)
	}
	b, encode := make([]byte, 64), base64.RawURLEncoding.EncodeToString
	rand.Read(b) // never fails (crypto/rand, Go 1.24)
	s := signIn{provider: provider, verifier: encode(b[:32]), state: encode(b[32:])}
	challenge := sha256.Sum256([]byte(s.verifier))
	q := url.Values{"response_type": {"code"}, "client_id": {p.clientID}, "redirect_uri": {p.redirectURI}, "scope": {p.scope},
		"code_challenge": {encode(challenge[:])}, "code_challenge_method": {"S256"}, "state": {s.state}}
	maps.Copy(q, p.extra)
	s.url = p.authorizeURL + "?" + q.Encode()
	return s, nil
}

// exchangeCode trades what was pasted (a redirect URL, "code#state" or a code) for a grant (SPEC §11.1, RFC 7636).
func (o *oauthClient) exchangeCode(ctx context.Context, s signIn, code string) (oauthGrant, error) {
	p, _ := lookupProvider(s.provider)
	code, pastedState, _ := strings.Cut(strings.TrimSpace(code), "#")
	if u, err := url.Parse(code); err == nil && u.Scheme != "" && u.Host != "" {
		code, pastedState = u.Query().Get("code"), u.Query().Get("state")
	}
	if pastedState != "" && pastedState != s.state {
		return oauthGrant{}, errStateMismatch
	} else if code == "" {
		return oauthGrant{}, fmt.Errorf("%w: no authorization code in what was pasted", errTokenMalformed)
	}
	fields := map[string]string{"grant_type": "authorization_code", "code": code, "redirect_uri": p.redirectURI,
		"client_id": p.clientID, "code_verifier": s.verifier}
	if p.echoState {
		fields["state"] = s.state
	}
	return o.tokenCall(ctx, p, oauthGrant{}, fields, code, s.verifier)
}
