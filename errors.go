package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// codes is the one table of SPEC §8.2: a code fixes the HTTP status, the type and whether a caller may retry.
var codes = map[string]struct {
	status    int
	typ       string
	retryable bool
}{
	"invalid_request":                       {400, "request_error", false},
	"unauthenticated":                       {401, "authentication_error", false},
	"forbidden":                             {403, "authorization_error", false},
	"alias_unknown":                         {404, "request_error", false},
	"not_found":                             {404, "request_error", false},
	"method_not_allowed":                    {405, "request_error", false},
	"state_conflict":                        {409, "state_error", false},
	"secure_transport_required":             {426, "transport_error", false},
	"provider_rate_limited":                 {429, "capacity_error", true},
	"subscription_unavailable":              {429, "capacity_error", true},
	"client_cancelled":                      {499, "request_error", false},
	"internal_error":                        {500, "internal_error", false},
	"provider_rejected":                     {400, "request_error", false}, // or the provider's 404, 413, 422
	"provider_failure":                      {502, "provider_error", false},
	"provider_incomplete":                   {502, "provider_error", false},
	"provider_quota_exhausted":              {502, "provider_error", false},
	"alias_unserviceable":                   {503, "dependency_error", false},
	"credential_unauthorized":               {503, "authorization_error", false},
	"subscription_reauthorization_required": {503, "authorization_error", false},
	"dependency_unavailable":                {503, "dependency_error", true},
	"dependency_timeout":                    {504, "dependency_error", true},
}

// Bounds on quoted text (SPEC §8.1): an envelope message, and the provider sentence kept for ledger causes and logs.
const (
	maxMessageBytes  = 2048
	maxSentenceBytes = 200
)

// apiError is the only error a client sees, and its envelope's "error" member: refuse fills type and retryable from
// the code; Attempts is set exactly when the request reached dispatch; Details only on alias refusals.
type apiError struct {
	Message    string        `json:"message"` // client-safe: no secrets, no prompts, no raw provider bodies
	Type       string        `json:"type"`
	Code       string        `json:"code"`
	Retryable  bool          `json:"retryable"`          // the code's, but for SPEC §12's in-progress 409
	Attempts   *int          `json:"attempts,omitempty"` // nil: refused before dispatch, so no "attempts" key
	Details    *aliasDetails `json:"details,omitempty"`
	RetryAfter time.Duration `json:"-"` // a retryable refusal's known wait, sent as Retry-After (SPEC §8.1)
	Err        error         `json:"-"` // cause: logged, never sent
	status     int           // 0: from the code table; set only by withStatus
}

// aliasDetails is the "details" member of alias refusals (SPEC §5.2).
type aliasDetails struct {
	Alias string  `json:"alias"`
	State string  `json:"state"`
	Route *string `json:"route"`
}

// refuse is how every refusal is made: code and a client-safe message.
func refuse(code, format string, args ...any) *apiError {
	c, ok := codes[code]
	if !ok {
		panic("brama: unknown error code " + code)
	}
	msg := truncateUTF8(fmt.Sprintf(format, args...), maxMessageBytes)
	return &apiError{Code: code, Message: msg, Type: c.typ, Retryable: c.retryable}
}

// vaultUnreadable is SPEC §2.2's refusal wherever a credential is needed.
func vaultUnreadable(err error) *apiError {
	return refuse("credential_unauthorized", "the vault is unreadable; no credential can be produced").because(err)
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }
func (e *apiError) Unwrap() error { return e.Err }

// Status is the HTTP status the code fixes, unless withStatus chose another.
func (e *apiError) Status() int { return cmp.Or(e.status, codes[e.Code].status) }

// withStatus answers e with status (0: the table's), for invalid_request's 413 and provider_rejected's 4xx (SPEC §8.2).
func (e *apiError) withStatus(status int) *apiError {
	e.status = status
	return e
}

// retryable is the envelope's retryable member, stated on every refusal.
func (e *apiError) retryable() bool { return e.Retryable }

// withAttempts marks e as a refusal made after dispatch began.
func (e *apiError) withAttempts(n int) *apiError {
	e.Attempts = &n
	return e
}

// because records the cause for the log; it never reaches the client.
func (e *apiError) because(err error) *apiError {
	e.Err = err
	return e
}

// redactedFor redacts the presented credential from an in-band stream error's code: its reader does not know it (SPEC §8.1).
func (e *apiError) redactedFor(presented string) *apiError {
	var se *upstreamStreamError
	if presented != "" && errors.As(e.Err, &se) {
		se.Code = redact(se.Code, presented)
		e.Message = truncateUTF8(fmt.Sprintf(inBandMessage, se.Code), maxMessageBytes)
	}
	return e
}

// envelope is SPEC §8.1's wire shape; Type is "error" on the messages dialect, whose clients expect it.
type envelope struct {
	Type  string   `json:"type,omitempty"`
	Error apiError `json:"error"`
}

// body is the envelope a client receives for e.
func (e *apiError) body() envelope { return envelope{Error: *e} }

// asAPIError classifies any error: an apiError as itself, no state directory as dependency_unavailable, else internal_error.
func asAPIError(err error) *apiError {
	var ae *apiError
	var ns *noStateError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &ns):
		return refuse("dependency_unavailable", "%s", ns.Error()).because(err)
	}
	return refuse("internal_error", "internal error").because(err)
}

// writeJSON writes v as the JSON body with status; `<` stays `<` (a 401 says `Bearer <token>`): no body is HTML.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) != nil {
		status = 500
		b.Reset()
		b.WriteString(`{"error":{"message":"internal error","type":"internal_error","code":"internal_error","retryable":false}}` + "\n")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// writeAPIError writes err's envelope for r, with x-should-retry, Retry-After (SPEC §8.1) and Brama-Attempts (SPEC §7.4).
func writeAPIError(w http.ResponseWriter, r *http.Request, err error) *apiError {
	ae := asAPIError(err)
	h := w.Header()
	if ae.Attempts != nil {
		h.Set("Brama-Attempts", strconv.Itoa(*ae.Attempts))
	}
	h.Set("X-Should-Retry", strconv.FormatBool(ae.retryable()))
	if ae.retryable() && ae.RetryAfter > 0 { // rounded up: never back early (RFC 9110 §10.2.3)
		h.Set("Retry-After", strconv.FormatInt(int64((ae.RetryAfter+time.Second-1)/time.Second), 10))
	}
	env := ae.body()
	if r != nil && (r.URL.Path == "/v1/messages" || strings.HasPrefix(r.URL.Path, "/v1/messages/")) {
		env.Type = "error"
	}
	writeJSON(w, ae.Status(), env)
	return ae
}

// truncateUTF8 cuts s to at most n bytes without splitting a rune.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// secretShaped matches API-key-shaped tokens (sk-…, sk-ant-…, brama_…), never quoted back (SPEC §8.1).
var secretShaped = regexp.MustCompile(`(sk-(ant-)?|brama_)[A-Za-z0-9_\-]{6,}`)

// redact replaces each presented secret, however its whitespace changed (SPEC §17), and each secret-shaped token.
func redact(s string, presented ...string) string {
	for _, p := range presented {
		var runes []string
		for _, r := range strings.Join(strings.Fields(p), "") {
			runes = append(runes, regexp.QuoteMeta(string(r)))
		}
		if len(runes) > 0 {
			s = regexp.MustCompile(strings.Join(runes, `[\s\v\x{85}\p{Z}]*`)).ReplaceAllLiteralString(s, "[redacted]")
		}
	}
	return secretShaped.ReplaceAllString(s, "[redacted]")
}

// cleanQuoted makes provider text safe to quote: valid UTF-8, one line, redacted, then cut (no half secret survives).
func cleanQuoted(s, presented string, max int) string {
	s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "\uFFFD")), " ")
	return truncateUTF8(redact(s, presented), max)
}
