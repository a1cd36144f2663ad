package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTokenURLOverride(t *testing.T) {
	tests := []struct {
		name, provider, value, want string
		ok                          bool
	}{
		{"built in", "claude-code", "", "https://platform.claude.com/v1/oauth/token", true},
		{"built in codex", "codex", "", "https://auth.openai.com/oauth/token", true},
		{"built in kimi", "kimi", "", "https://auth.kimi.com/api/oauth/token", true},
		{"https override", "kimi", " https://proxy.example/token ", "https://proxy.example/token", true},
		{"http loopback", "claude-code", "http://127.0.0.1:9/t", "http://127.0.0.1:9/t", true},
		{"http remote refused", "codex", "http://auth.example/token", "", false},
		{"query refused", "codex", "https://auth.example/token?x=1", "", false},
		{"empty query refused", "codex", "https://auth.example/token?", "", false},
		{"fragment refused", "codex", "https://auth.example/token#f", "", false},
		{"user info refused", "codex", "https://u:p@auth.example/token", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"BRAMA_OAUTH_" + strings.ToUpper(strings.ReplaceAll(tc.provider, "-", "_")) + "_TOKEN_URL": tc.value}
			p, _ := lookupProvider(tc.provider)
			got, err := envURL(testEnv(env), "OAUTH", p.id, "TOKEN_URL", p.tokenURL)
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("tokenURL = %q, %v; want %q, ok %v", got, err, tc.want, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "BRAMA_OAUTH_") {
				t.Errorf("error %v does not name the variable", err)
			}
		})
	}
}

func TestExpiredForRequest(t *testing.T) {
	ms := oauthNow.UnixMilli()
	tests := []struct {
		name    string
		expires int64
		want    bool
	}{
		{"unknown expiry", 0, false},
		{"well ahead", ms + 61_000, false},
		{"exactly 60 s ahead", ms + 60_000, true},
		{"inside the minute", ms + 1, true},
		{"past", ms - 1, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := expiredForRequest(oauthGrant{ExpiresAtMs: tc.expires}, oauthNow); got != tc.want {
				t.Errorf("expiredForRequest = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFillGrant(t *testing.T) {
	exp := int64(1_900_000_000)
	access := testJWT(map[string]any{"exp": exp})
	idToken := testJWT(map[string]any{"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "acct-9"}})
	tests := []struct {
		name, provider string
		in, want       oauthGrant
	}{
		{"codex fills both", "codex", oauthGrant{AccessToken: access, IDToken: idToken},
			oauthGrant{AccessToken: access, IDToken: idToken, ExpiresAtMs: exp * 1000, AccountID: "acct-9"}},
		{"codex keeps what is given", "codex", oauthGrant{AccessToken: access, IDToken: idToken, ExpiresAtMs: 5, AccountID: "a"},
			oauthGrant{AccessToken: access, IDToken: idToken, ExpiresAtMs: 5, AccountID: "a"}},
		{"claude-code takes no account id", "claude-code", oauthGrant{AccessToken: "opaque", IDToken: idToken},
			oauthGrant{AccessToken: "opaque", IDToken: idToken}},
		{"not a JWT", "codex", oauthGrant{AccessToken: "a.b.c", IDToken: "x"}, oauthGrant{AccessToken: "a.b.c", IDToken: "x"}},
		{"an exp past year 5138 is unknown", "claude-code", oauthGrant{AccessToken: testJWT(map[string]any{"exp": 1e11 + 1})},
			oauthGrant{AccessToken: testJWT(map[string]any{"exp": 1e11 + 1})}},
		{"an exp before 1970 is unknown", "claude-code", oauthGrant{AccessToken: testJWT(map[string]any{"exp": -5})},
			oauthGrant{AccessToken: testJWT(map[string]any{"exp": -5})}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, fillGrant(tc.provider, tc.in)); diff != "" {
				t.Errorf("fillGrant (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReadTokenAnswer sorts token answers: an expires_in outside 1 s to 100 years is unknown (0), a grant needs a 2xx,
// and an error is quoted only when it is a code (RFC 6749 §5.2's short words): prose might carry a secret.
func TestReadTokenAnswer(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		expires int64  // the answer's ExpiresIn, when accepted
		err     error  // the class of the refusal; nil: accepted
		msg     string // the refusal's text ends so
	}{
		{"an hour", 200, `{"access_token":"a","expires_in":3600}`, 3600, nil, ""},
		{"a hundred years", 200, `{"access_token":"a","expires_in":3153600000}`, 3153600000, nil, ""},
		{"an error member of null is none", 200, `{"access_token":"a","expires_in":60,"error":null}`, 60, nil, ""},
		{"zero is unknown", 200, `{"access_token":"a","expires_in":0}`, 0, nil, ""},
		{"negative is unknown", 200, `{"access_token":"a","expires_in":-60}`, 0, nil, ""},
		{"past a hundred years is unknown", 200, `{"access_token":"a","expires_in":3153600001}`, 0, nil, ""},
		{"a token in a 5xx is no grant", 500, `{"access_token":"a","expires_in":3600}`, 0, errTokenMalformed,
			"no 2xx JSON object with an access_token free of control characters"},
		{"a token in a 400 is no grant", 400, `{"access_token":"a"}`, 0, errTokenMalformed,
			"no 2xx JSON object with an access_token free of control characters"},
		{"an error code is quoted", 400, `{"error":"slow_down"}`, 0, errTokenRefused, "answered with an error: slow_down"},
		{"prose is not", 400, `{"error":"the token sk-prose-secret was refused"}`, 0, errTokenRefused, "answered with an error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ans, err := readTokenAnswer("https://e/t", tc.status, []byte(tc.body), nil)
			if !errors.Is(err, tc.err) || tc.err == nil && err != nil || err != nil && !strings.HasSuffix(err.Error(), tc.msg) {
				t.Fatalf("error %v, want %v ending %q", err, tc.err, tc.msg)
			}
			if tc.err == nil && ans.ExpiresIn != tc.expires {
				t.Errorf("expires_in read as %d, want %d", ans.ExpiresIn, tc.expires)
			}
		})
	}
}

func FuzzTokenAnswer(f *testing.F) {
	for _, s := range []string{
		`{"access_token":"a","refresh_token":"r","expires_in":3600,"id_token":"x.y.z"}`,
		`{"access_token":"a","expires_in":"60"}`,
		`{"error":"invalid_grant","error_description":"revoked"}`,
		`{"type":"error","error":{"type":"permission_error","message":"no"}}`,
		`{"access_token":""}`,
		`<html>`,
		`{"access_token":"a",`,
		`{"expires_in":1e400,"access_token":"a"}`,
		`eyJhbGciOiJub25lIn0.eyJleHAiOjE5MDAwMDAwMDB9.c2ln`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var re *endpointError
		// A body that ended early is never a refusal, whatever it held (SPEC §11.1).
		for _, status := range []int{200, 401, 403} {
			_, err := readTokenAnswer("https://e/t", status, data, io.ErrUnexpectedEOF)
			if !errors.As(err, &re) || re.Definitive || !errors.Is(re, io.ErrUnexpectedEOF) {
				t.Fatalf("a partial %d answer classified as %+v", status, re)
			}
		}
		jwtClaims(string(data)) // must not panic on anything
		ans, err := readTokenAnswer("https://e/t", 200, data, nil)
		if err != nil {
			if !errors.As(err, &re) {
				t.Fatalf("not an endpointError: %v", err)
			}
			if !errors.Is(re, errTokenMalformed) && !errors.Is(re, errTokenRefused) {
				t.Fatalf("unclassified error: %v", re)
			}
			if errors.Is(re, errTokenRefused) && ans.Error == "" {
				t.Fatalf("refusal without an error code: %v", re)
			}
			for _, status := range []int{200, 400, 401, 503} {
				_, err := readTokenAnswer("https://e/t", status, data, nil, "secret-refresh-token")
				if !errors.As(err, &re) || (re.Definitive && re.Sentence == "") || strings.Contains(re.Error(), "secret-refresh-token") {
					t.Fatalf("classify of a refused answer with status %d = %+v", status, re)
				}
			}
			return
		}
		if ans.AccessToken == "" || ans.Error != "" || ans.ExpiresIn < 0 {
			t.Fatalf("accepted %+v", ans)
		}
		b, err := json.Marshal(ans)
		if err != nil {
			t.Fatal(err)
		}
		again, err := readTokenAnswer("https://e/t", 200, b, nil)
		if err != nil || again != ans {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, ans)
		}
	})
}

// TestTokenRefusalSentenceRedacts: a refusal's sentence has the presented secrets redacted, but not one shorter than
// 8 bytes, which no real token is: replacing it would garble the provider's words.
func TestTokenRefusalSentenceRedacts(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		secrets []string
		want    string
	}{
		{"token rt-9f8e7d6c is revoked", []string{"rt-9f8e7d6c"}, "token [redacted] is revoked"},
		{"the grant is revoked", []string{"an", "", "rt-9f8e7d6c"}, "the grant is revoked"},
	} {
		body := fmt.Sprintf(`{"error":"invalid_grant","error_description":%q}`, tc.desc)
		_, err := readTokenAnswer("https://e/t", 400, []byte(body), nil, tc.secrets...)
		var re *endpointError
		if !errors.As(err, &re) || !re.Definitive || re.Sentence != tc.want {
			t.Errorf("%q with secrets %q: sentence %q (%v), want %q", tc.desc, tc.secrets, valueOr(re, endpointError{}).Sentence, err, tc.want)
		}
	}
}
