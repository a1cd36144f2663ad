package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestNewSignIn: the authorize URL carries the provider's parameters, a fresh state and the S256 challenge
// of a fresh 43-character verifier (RFC 7636 §4.1–4.2).
func TestNewSignIn(t *testing.T) {
	tests := []struct {
		name, provider string
		wantBase       string
		want           url.Values
	}{
		{"claude-code", "claude-code", "https://claude.com/cai/oauth/authorize", url.Values{
			"code": {"true"}, "response_type": {"code"}, "client_id": {"9d1c250a-e61b-44d9-88ed-5944d1962f5e"},
			"redirect_uri":   {"https://platform.claude.com/oauth/code/callback"},
			"scope":          {"org:create_api_key user:profile user:inference"},
			"code_challenge": {"CH"}, "code_challenge_method": {"S256"}, "state": {"ST"},
		}},
		{"codex", "codex", "https://auth.openai.com/oauth/authorize", url.Values{
			"response_type": {"code"}, "client_id": {"app_EMoamEEZ73f0CkXaXp7hrann"},
			"redirect_uri":               {"http://localhost:1455/auth/callback"},
			"scope":                      {"openid profile email offline_access"},
			"id_token_add_organizations": {"true"}, "codex_cli_simplified_flow": {"true"},
			"code_challenge": {"CH"}, "code_challenge_method": {"S256"}, "state": {"ST"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := newSignIn(tc.provider)
			if err != nil {
				t.Fatal(err)
			}
			again, _ := newSignIn(tc.provider)
			u, err := url.Parse(s.url)
			if err != nil {
				t.Fatal(err)
			}
			if base := u.Scheme + "://" + u.Host + u.Path; base != tc.wantBase {
				t.Errorf("authorize URL base = %q, want %q", base, tc.wantBase)
			}
			q, sum := u.Query(), sha256.Sum256([]byte(s.verifier))
			if len(s.verifier) != 43 || len(s.state) != 43 || s.verifier == s.state || s.verifier == again.verifier ||
				s.state == again.state || q.Get("state") != s.state || q.Get("code_challenge") != base64.RawURLEncoding.EncodeToString(sum[:]) {
				t.Errorf("sign-in %+v (another: %+v): want fresh 43-character verifier and state, the state and the S256 challenge in the URL", s, again)
			}
			q.Set("state", "ST")
			q.Set("code_challenge", "CH")
			if diff := cmp.Diff(tc.want, q); diff != "" {
				t.Errorf("authorize parameters (-want +got):\n%s", diff)
			}
		})
	}
	for _, p := range []string{"kimi", "openai"} {
		if _, err := newSignIn(p); !errors.Is(err, errNoSignIn) {
			t.Errorf("newSignIn(%q) = %v, want %v", p, err, errNoSignIn)
		}
	}
}

func TestExchangeCode(t *testing.T) {
	idToken := testJWT(map[string]any{"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "acct-7"}})
	tests := []struct {
		name, provider, pasted string
		wantCtype              string
		wantFields             map[string]string
		answer                 map[string]any
		wantGrant              oauthGrant
		wantErr                error // nil: success
	}{
		{
			name: "claude-code pastes code#state", provider: "claude-code", pasted: " the-code#ST \n",
			wantCtype: "application/json",
			wantFields: map[string]string{"grant_type": "authorization_code", "code": "the-code", "state": "ST",
				"client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e", "redirect_uri": "https://platform.claude.com/oauth/code/callback", "code_verifier": "VER"},
			answer:    map[string]any{"access_token": "at", "refresh_token": "rt", "expires_in": 28800},
			wantGrant: oauthGrant{AccessToken: "at", RefreshToken: "rt", ExpiresAtMs: oauthNow.Add(8 * time.Hour).UnixMilli()},
		},
		{
			name: "codex pastes the redirect URL", provider: "codex", pasted: "http://localhost:1455/auth/callback?code=c0de&scope=x&state=ST",
			wantCtype: "application/x-www-form-urlencoded",
			wantFields: map[string]string{"grant_type": "authorization_code", "code": "c0de",
				"client_id": "app_EMoamEEZ73f0CkXaXp7hrann", "redirect_uri": "http://localhost:1455/auth/callback", "code_verifier": "VER"},
			answer:    map[string]any{"access_token": "at", "refresh_token": "rt", "id_token": idToken, "expires_in": 10},
			wantGrant: oauthGrant{AccessToken: "at", RefreshToken: "rt", IDToken: idToken, AccountID: "acct-7", ExpiresAtMs: oauthNow.Add(10 * time.Second).UnixMilli()},
		},
		{name: "a pasted state from another sign-in", provider: "claude-code", pasted: "c#OTHER", wantErr: errStateMismatch},
		{name: "refused code", provider: "codex", pasted: "c", answer: map[string]any{"error": "invalid_grant"}, wantErr: errTokenRefused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := fakeTokenEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				ctype, fields := tokenRequest(t, r)
				if tc.wantFields != nil {
					if ctype != tc.wantCtype {
						t.Errorf("Content-Type = %q, want %q", ctype, tc.wantCtype)
					}
					if diff := cmp.Diff(tc.wantFields, fields); diff != "" {
						t.Errorf("exchange fields (-want +got):\n%s", diff)
					}
				}
				status := 200
				if tc.wantErr != nil {
					status = 400
				}
				writeJSON(w, status, tc.answer)
			})
			f := newOAuthFixture(t, tc.provider, srv.URL)
			g, err := f.o.exchangeCode(context.Background(), signIn{provider: tc.provider, verifier: "VER", state: "ST"}, tc.pasted)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Errorf("exchangeCode error = %v, want %v", err, tc.wantErr)
				}
				if tc.answer == nil && calls.Load() != 0 {
					t.Errorf("token endpoint called for a refused paste")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantGrant, g); diff != "" {
				t.Errorf("grant (-want +got):\n%s", diff)
			}
		})
	}
}
