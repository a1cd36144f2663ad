package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
)

// This file holds the sign-in half of SPEC §11.1: the PKCE authorization-code
// flow `brama subscription sign-in` runs locally before it hands the grant
// to the daemon. The provider rows (authorize URL, redirect, scope) live in
// oauthProviders beside the token endpoints they pair with.

// newPKCE returns a fresh PKCE verifier and its S256 challenge (RFC 7636
// §4.1–4.2): 32 random bytes, base64url without padding (43 characters).
func newPKCE() (verifier, challenge string) {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand, Go 1.24)
	verifier = base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(verifier))
	return verifier, base64.RawURLEncoding.EncodeToString(sum[:])
}

// authorizeURL is where the user signs in to provider (SPEC §11.1's sign-in
// table), with the PKCE challenge and the state the pasted answer must carry.
func authorizeURL(provider, state, challenge string) (string, error) {
	p, err := lookupOAuth(provider)
	if err != nil {
		return "", err
	}
	if p.authorizeURL == "" {
		return "", fmt.Errorf("provider %q: %w", provider, errNoSignIn)
	}
	q := url.Values{}
	for _, kv := range p.extra {
		q.Set(kv[0], kv[1])
	}
	q.Set("response_type", "code")
	q.Set("client_id", p.clientID)
	q.Set("redirect_uri", p.redirectURI)
	q.Set("scope", p.scope)
	q.Set("code_challenge", challenge)
	q.Set("code_challenge_method", "S256")
	q.Set("state", state)
	return p.authorizeURL + "?" + q.Encode(), nil
}

// exchangeCode trades an authorization code for a grant (RFC 6749 §4.1.3
// with PKCE). code is what the user pasted: claude-code's page shows
// "code#state"; codex's is the redirect URL (or the bare code). A pasted
// state must equal state. The grant is completed by fillGrant; nothing is
// stored here: the CLI hands it to the daemon.
func (o *oauthClient) exchangeCode(ctx context.Context, provider, code, verifier, state string) (oauthGrant, error) {
	p, err := lookupOAuth(provider)
	if err != nil {
		return oauthGrant{}, err
	}
	if p.authorizeURL == "" {
		return oauthGrant{}, fmt.Errorf("provider %q: %w", provider, errNoSignIn)
	}
	code, pasted := splitPastedCode(code)
	if pasted != "" && pasted != state {
		return oauthGrant{}, errStateMismatch
	}
	if code == "" {
		return oauthGrant{}, fmt.Errorf("%w: no authorization code in what was pasted", errTokenMalformed)
	}
	endpoint, err := o.tokenURL(p)
	if err != nil {
		return oauthGrant{}, err
	}
	fields := [][2]string{{"grant_type", "authorization_code"}, {"code", code}, {"redirect_uri", p.redirectURI},
		{"client_id", p.clientID}, {"code_verifier", verifier}}
	if p.id == "claude-code" {
		fields = append(fields, [2]string{"state", state}) // its token endpoint asks for the state back
	}
	ans, re := o.tokenCall(ctx, p, endpoint, fields, code, verifier)
	if re != nil {
		return oauthGrant{}, re
	}
	g := oauthGrant{AccessToken: ans.AccessToken, RefreshToken: ans.RefreshToken, IDToken: ans.IDToken,
		ExpiresAtMs: answerExpiry(ans, o.now())}
	return fillGrant(p.id, g), nil
}

// splitPastedCode takes what a user pasted after signing in: a redirect URL
// with code and state parameters, "code#state", or a bare code.
func splitPastedCode(s string) (code, state string) {
	s = strings.TrimSpace(s)
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.Host != "" {
		q := u.Query()
		return q.Get("code"), q.Get("state")
	}
	code, state, _ = strings.Cut(s, "#")
	return code, state
}
