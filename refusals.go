package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// This file classifies failed provider calls: non-2xx answers (SPEC §8.2,
// §7.2 step 4) and transport failures.

// Refusal classes of a non-2xx provider answer (SPEC §7.2 step 4).
const (
	refusalAuth  = "auth"  // 401/403: the credential was refused
	refusalRate  = "rate"  // 429: try later
	refusalQuota = "quota" // credit or quota spent, by the provider's type/code
	refusalModel = "model" // 400/404/413/422: a request the provider would not run
	refusalOther = "other" // everything else: answered at once, no rotation
)

// maxSentenceBytes bounds the provider sentence kept for ledger causes.
const maxSentenceBytes = 200

// maxQuotedBytes bounds the provider sentence quoted in an error message:
// enough for a context-length refusal's numbers.
const maxQuotedBytes = 1000

// providerRefusal is a classified non-2xx provider answer (SPEC §8.2,
// §7.2.4): from the status and the error's type/code, never its text.
type providerRefusal struct {
	err        *apiError     // the code the caller gets on a direct/alias route (no attempts set here)
	class      string        // refusalAuth, refusalRate, refusalQuota, refusalModel or refusalOther
	status     int           // the provider's HTTP status
	retryAfter time.Duration // from retry-after or reset headers; 0 when none stated
	sentence   string        // the provider's own error message, redacted, ≤200 bytes
}

// quotaCodes are the provider error types/codes that say the account's
// credit or quota is spent: OpenAI's insufficient_quota (sent with 429)
// and its older billing codes, Anthropic's billing_error (sent with 402).
var quotaCodes = map[string]bool{
	"insufficient_quota":         true,
	"billing_hard_limit_reached": true,
	"billing_not_active":         true,
	"billing_error":              true,
}

// rejectedStatus is provider_rejected's status for a provider's 4xx
// refusal of the request itself (SPEC §8.2); 0 when status is not one.
func rejectedStatus(status int) int {
	switch status {
	case 400, 404, 413, 422:
		return status
	case 401, 403, 408, 409, 429:
		return 0
	}
	if status > 400 && status < 500 {
		return 400
	}
	return 0
}

// classifyRefusal classifies a non-2xx answer of a provider (an id, else a
// protocol). presented is redacted from what is quoted, only after the
// class was decided: a short key must not change what a code says.
func classifyRefusal(protocol string, status int, header http.Header, body []byte, presented string, now time.Time) providerRefusal {
	who, byStatus := "provider", false
	if p, ok := lookupProvider(protocol); ok {
		who = fmt.Sprintf("provider %q", p.id)
		byStatus = p.id == "codex" // SPEC §6.2: codex errors are classified by status alone
	}
	typ, code, msg := providerErrorFields(body)
	quota := !byStatus && (quotaCodes[typ] || quotaCodes[code])
	r := providerRefusal{class: refusalOther, status: status, sentence: cleanQuoted(msg, presented, maxSentenceBytes)}
	ec := "provider_failure" // a malformed answer, 408, 409, a direct route's 401/403
	switch {
	case rejectedStatus(status) != 0:
		ec = "provider_rejected"
	case status == http.StatusGatewayTimeout:
		ec = "dependency_timeout"
	case status >= 500:
		ec = "dependency_unavailable"
	}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		r.class = refusalAuth
	case status >= 400 && status < 500 && (status == http.StatusPaymentRequired || quota):
		r.class, ec = refusalQuota, "provider_quota_exhausted"
	case status == http.StatusTooManyRequests:
		r.class, ec = refusalRate, "provider_rate_limited"
	case status == 400 || status == 404 || status == 413 || status == 422:
		r.class = refusalModel
	}
	wait := retryAfter(header, now)
	if r.class == refusalRate || r.class == refusalQuota {
		r.retryAfter = wait
	}

	m := fmt.Sprintf("%s answered %d", who, status)
	if label := cmp.Or(cleanQuoted(code, presented, 64), cleanQuoted(typ, presented, 64)); label != "" {
		m += " (" + label + ")"
	}
	if quoted := cleanQuoted(msg, presented, maxQuotedBytes); quoted != "" {
		m += ": " + quoted
	}
	r.err = refuse(ec, "%s", m)
	if ec == "provider_rejected" { // the provider's own 4xx; a quota refusal keeps its 502
		r.err.withStatus(rejectedStatus(status))
	}
	if r.err.retryable() {
		r.err.RetryAfter = wait // the provider's own wait, on any route (SPEC §8.1)
	}
	return r
}

// providerErrorFields pulls type, code and message out of the error bodies
// providers send ({"error":{…}}, {"error":"text"}, codex's {"detail":…});
// any other body yields nothing: a raw body is never quoted.
func providerErrorFields(body []byte) (typ, code, msg string) {
	var b struct{ Error, Detail json.RawMessage } // matched as "error", "detail"
	if json.Unmarshal(body, &b) != nil {
		return "", "", ""
	}
	if e, ok := errorObject(b.Error); ok {
		return e.typ, e.code, e.msg
	}
	// codex: {"detail": "text"} or {"detail": {"message": …}}; status decides.
	for _, raw := range []json.RawMessage{b.Error, b.Detail} {
		if s, ok := jsonString(raw); ok {
			return "", "", s
		}
	}
	e, _ := errorObject(b.Detail) // zero unless an object
	return "", "", e.msg
}

type errorFields struct{ typ, code, msg string }

// errorObject reads {"type","code","message"}; code may be a string or a
// number (OpenRouter sends the HTTP status there).
func errorObject(raw json.RawMessage) (errorFields, bool) {
	var e struct {
		Type    json.RawMessage `json:"type"`
		Code    json.RawMessage `json:"code"`
		Message json.RawMessage `json:"message"`
	}
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &e) != nil {
		return errorFields{}, false
	}
	typ, _ := jsonString(e.Type)
	code, _ := jsonScalar(e.Code)
	msg, _ := jsonString(e.Message)
	return errorFields{typ, code, msg}, true
}

// jsonString decodes raw when it is a JSON string.
func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// jsonScalar decodes a JSON string or number as text.
func jsonScalar(raw json.RawMessage) (string, bool) {
	if s, ok := jsonString(raw); ok {
		return s, true
	}
	var n json.Number
	if len(raw) == 0 || json.Unmarshal(raw, &n) != nil {
		return "", false
	}
	return n.String(), true
}

// cleanQuoted makes provider text safe to quote: valid UTF-8, one line,
// the presented credential and secret-shaped tokens redacted, then cut to
// max bytes (redacting first so a cut cannot leave part of a secret).
func cleanQuoted(s, presented string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Join(strings.Fields(s), " ")
	s = redact(s, presented)
	return truncateUTF8(s, max)
}

// redactedFor redacts the presented credential from the provider code an
// in-band stream error quotes: its stream reader does not know it (SPEC §8.1).
func (e *apiError) redactedFor(presented string) *apiError {
	var se *upstreamStreamError
	if presented != "" && errors.As(e.Err, &se) {
		se.Code = redact(se.Code, presented)
		e.Message = fmt.Sprintf(inBandMessage, se.Code)
	}
	return e
}

// maxRetryAfter bounds a stated reset; a block never outlasts it (SPEC §7.2).
const maxRetryAfter = 7 * 24 * time.Hour

// retryAfter is the wait the provider stated: retry-after-ms, retry-after
// (seconds or an HTTP date), else the latest reset among the limits its
// headers show as exhausted. 0 when nothing is stated.
func retryAfter(h http.Header, now time.Time) time.Duration {
	hv := func(k string) string { return strings.TrimSpace(h.Get(k)) }
	if ms, err := strconv.ParseFloat(hv("Retry-After-Ms"), 64); err == nil && ms > 0 && !math.IsInf(ms, 0) {
		return clampWait(ms / 1000)
	}
	if v := hv("Retry-After"); v != "" {
		s, err := strconv.ParseFloat(v, 64)
		if t, terr := http.ParseTime(v); err != nil && terr == nil {
			s, err = t.Sub(now).Seconds(), nil
		}
		if d := clampWait(s); err == nil && d > 0 {
			return d // a wait already over states none: the reset headers below may
		}
	}
	var d time.Duration
	// OpenAI: x-ratelimit-{remaining,reset}-{requests,tokens}, reset as "6m0s".
	for _, k := range []string{"requests", "tokens"} {
		if x, err := time.ParseDuration(hv("X-Ratelimit-Reset-" + k)); err == nil && hv("X-Ratelimit-Remaining-"+k) == "0" {
			d = max(d, clampWait(x.Seconds()))
		}
	}
	// Anthropic: anthropic-ratelimit-<limit>-{remaining,reset}, reset RFC 3339.
	for _, k := range []string{"requests", "tokens", "input-tokens", "output-tokens"} {
		p := "Anthropic-Ratelimit-" + k
		if t, err := time.Parse(time.RFC3339, hv(p+"-Reset")); err == nil && hv(p+"-Remaining") == "0" {
			d = max(d, clampWait(t.Sub(now).Seconds()))
		}
	}
	// claude-code plan windows (SPEC §6.3): reset in unix seconds.
	for _, k := range []string{"", "5h-", "7d-"} {
		p := "Anthropic-Ratelimit-Unified-" + k
		u, _ := strconv.ParseFloat(hv(p+"Utilization"), 64)
		if s, err := strconv.ParseInt(hv(p+"Reset"), 10, 64); err == nil && (hv(p+"Status") == "rejected" || u >= 1) {
			d = max(d, clampWait(float64(s-now.Unix())))
		}
	}
	// codex plan windows (SPEC §6.3).
	for _, k := range []string{"Primary", "Secondary"} {
		p := "X-Codex-" + k + "-"
		u, uerr := strconv.ParseFloat(hv(p+"Used-Percent"), 64)
		s, err := strconv.ParseFloat(hv(p+"Reset-After-Seconds"), 64)
		if at, aerr := strconv.ParseFloat(hv(p+"Reset-At"), 64); err != nil && aerr == nil { // epoch seconds, without the countdown
			s, err = at-float64(now.Unix()), nil
		}
		if err == nil && uerr == nil && u >= 100 {
			d = max(d, clampWait(s))
		}
	}
	return d
}

// clampWait turns seconds into a wait within (0, maxRetryAfter]; a wait
// already over (or not a number) is 0, "none stated".
func clampWait(s float64) time.Duration {
	switch {
	case !(s > 0):
		return 0
	case s >= maxRetryAfter.Seconds():
		return maxRetryAfter
	}
	return time.Duration(s * float64(time.Second))
}

// classifyTransport maps a failed provider call to its code (SPEC §8.2):
// provider_incomplete once the request may have been sent (and billed).
func classifyTransport(err error) *apiError {
	cause := err
	var ue *url.Error
	if errors.As(err, &ue) {
		cause = ue.Err // drop "Post <url>:"; the URL says nothing new
	}
	text := cleanQuoted(cause.Error(), "", 300)
	if errors.Is(err, context.Canceled) {
		return refuse("client_cancelled", "the caller went away during the provider call").because(err)
	}
	var op *net.OpError
	var dns *net.DNSError
	dial := errors.As(err, &op) && op.Op == "dial"
	switch {
	case dial && op.Timeout(), errors.As(err, &dns) && dns.IsTimeout:
		return refuse("dependency_timeout", "connecting to the provider timed out: %s", text).because(err)
	case dial, errors.As(err, &dns):
		return refuse("dependency_unavailable", "could not connect to the provider, nothing was sent: %s", text).because(err)
	case errors.As(err, new(*tls.CertificateVerificationError)), errors.As(err, new(tls.RecordHeaderError)),
		errors.As(err, new(tls.AlertError)), errors.As(err, new(x509.UnknownAuthorityError)),
		errors.As(err, new(x509.HostnameError)), errors.As(err, new(x509.CertificateInvalidError)):
		return refuse("dependency_unavailable", "TLS handshake with the provider failed, nothing was sent: %s", text).because(err)
	}
	return refuse("provider_incomplete", "the provider connection failed after the request was sent: %s", text).because(err)
}
