package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// The donated-subscription overlay's shape and the rules every donation,
// overlay item, label and reason obey (SPEC §2.2, §10.1). The inventory that
// reads and writes it is in subscriptions.go.

// overlayItem is one donated subscription: metadata only, never a secret and
// never a status (retirement lives in the journal).
type overlayItem struct {
	ID        string `json:"id"`
	Provider  string `json:"provider"`
	AgentID   string `json:"agent_id"`
	Label     string `json:"label"`
	CreatedAt string `json:"created_at"`
}

// overlayDoc is donated-subscriptions.json (SPEC §2.2), schema 1.
type overlayDoc struct {
	SchemaVersion int           `json:"schema_version"`
	Items         []overlayItem `json:"items"`
}

// donation is the strict body (and the CLI's request) of POST …/subscriptions/{agent_id}.
type donation struct {
	Provider string      `json:"provider"`
	Label    string      `json:"label"`
	APIKey   string      `json:"api_key"`
	OAuth    *oauthGrant `json:"oauth"`
}

// donatedSubscription is the 201 answer: metadata only, never the secret.
type donatedSubscription struct {
	ID       string `json:"id"`
	Provider string `json:"provider"`
	AgentID  string `json:"agent_id"`
	Label    string `json:"label"`
	Status   string `json:"status"`
}

// overlayFile is the overlay's name in the state directory; overlayRole is
// how errors and refusals name it.
const (
	overlayFile = "donated-subscriptions.json"
	overlayRole = "donated-subscription overlay"
)

// maxLabelBytes bounds a subscription label; maxReasonBytes a retire or
// reinstate reason (both end up in listings or the journal).
const (
	maxLabelBytes  = 128
	maxReasonBytes = 512
)

// errOverlayInvalid wraps every refusal of parseOverlay, so callers (and the
// fuzz target) can tell a bad file from an I/O failure.
var errOverlayInvalid = errors.New("donated-subscription overlay is invalid")

// parseOverlay strictly parses the overlay: unknown members and duplicate
// keys are refused (decodeStrict), and so is any item a writer would never
// have produced (bad id, unknown provider, bad agent id, label or time, a
// repeated id). An empty file is an empty overlay.
func parseOverlay(b []byte) (*overlayDoc, error) {
	doc := &overlayDoc{SchemaVersion: 1, Items: []overlayItem{}}
	if len(b) == 0 {
		return doc, nil
	}
	if err := decodeStrict(overlayFile, b, doc); err != nil {
		return nil, fmt.Errorf("%w: %w", errOverlayInvalid, err)
	}
	if doc.SchemaVersion != 1 {
		return nil, fmt.Errorf("%w: schema_version %d is not 1", errOverlayInvalid, doc.SchemaVersion)
	}
	if doc.Items == nil {
		doc.Items = []overlayItem{}
	}
	seen := map[string]bool{}
	for i, it := range doc.Items {
		if err := checkOverlayItem(it); err != nil {
			return nil, fmt.Errorf("%w: items[%d]: %w", errOverlayInvalid, i, err)
		}
		if seen[it.ID] {
			return nil, fmt.Errorf("%w: items[%d]: id %q appears twice", errOverlayInvalid, i, it.ID)
		}
		seen[it.ID] = true
	}
	return doc, nil
}

// checkOverlayItem applies the rules a donation enforces to one stored item.
func checkOverlayItem(it overlayItem) error {
	if !isSubscriptionID(it.ID) {
		return fmt.Errorf("id %q is not sub_ followed by 16 lower-case hex digits", it.ID)
	}
	if p, ok := lookupProvider(it.Provider); !ok || p.cred == credNone {
		return fmt.Errorf("provider %q takes no subscription", it.Provider)
	}
	if !idPattern.MatchString(it.AgentID) {
		return fmt.Errorf("agent_id %q must match [a-z0-9-]{1,64}", it.AgentID)
	}
	if err := checkLabel(it.Label); err != nil {
		return err
	}
	if _, err := time.Parse(time.RFC3339Nano, it.CreatedAt); err != nil {
		return fmt.Errorf("created_at %q is not an RFC 3339 time", it.CreatedAt)
	}
	return nil
}

// isSubscriptionID reports whether id is sub_ + 16 lower-case hex digits.
func isSubscriptionID(id string) bool {
	rest, ok := strings.CutPrefix(id, "sub_")
	if !ok || len(rest) != 16 {
		return false
	}
	for _, c := range []byte(rest) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// newSubscriptionID is sub_ + 16 random hex digits (64 bits: collisions
// are refused, not expected).
func newSubscriptionID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "sub_" + hex.EncodeToString(b)
}

// checkLabel allows any printable text of at most 128 bytes, so a listing
// never carries control characters into a terminal.
func checkLabel(label string) error {
	if len(label) > maxLabelBytes {
		return fmt.Errorf("label is %d bytes; the limit is %d", len(label), maxLabelBytes)
	}
	if !printable(label) {
		return errors.New("label must be printable UTF-8 text")
	}
	return nil
}

// printable reports whether s is valid UTF-8 made only of printable runes
// (space included, tabs and newlines not).
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// checkReason bounds a retire or reinstate reason before it is journaled.
func checkReason(reason string) error {
	switch {
	case strings.TrimSpace(reason) == "":
		return refuse("invalid_request", "a reason is required")
	case len(reason) > maxReasonBytes:
		return refuse("invalid_request", "the reason is %d bytes; the limit is %d", len(reason), maxReasonBytes)
	case !printable(reason):
		return refuse("invalid_request", "the reason must be printable UTF-8 text on one line")
	}
	return nil
}

// checkCredential applies SPEC §6.1 and §10.1 to a donated or replacing
// credential: a known provider other than local-openai, exactly one of an
// API key or an OAuth grant, and a grant only for claude-code, codex and
// kimi. Its refusals never quote the secret.
func checkCredential(provider string, cred vaultCredential) error {
	p, ok := lookupProvider(provider)
	if !ok {
		return refuse("invalid_request", "unknown provider %q", provider)
	}
	if p.cred == credNone {
		return refuse("invalid_request", "provider %q takes no subscription: its deployments need no credential", provider)
	}
	if (cred.APIKey != "") == (cred.OAuth != nil) {
		return refuse("invalid_request", "give exactly one of api_key or oauth")
	}
	if k := cred.APIKey; k != "" {
		if strings.TrimSpace(k) != k || !printable(k) || len(k) > 8192 {
			return refuse("invalid_request", "api_key must be one line of printable text (at most 8192 bytes) without surrounding spaces")
		}
		return nil
	}
	if p.cred != credSubscription {
		return refuse("invalid_request", "provider %q takes an api_key, not an oauth grant (oauth is for claude-code, codex and kimi)", provider)
	}
	g := cred.OAuth
	switch {
	case g.AccessToken == "" || g.RefreshToken == "":
		return refuse("invalid_request", "oauth needs access_token and refresh_token")
	case g.ExpiresAtMs < 0:
		return refuse("invalid_request", "oauth expires_at_ms must not be negative")
	}
	return nil
}
