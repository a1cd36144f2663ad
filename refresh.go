package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
)

// The operator refresh (SPEC §11.4): an operator forces one refresh of
// every usable OAuth grant of one provider, e.g. after the provider revoked
// tokens or a tool signed in on the same account. It runs only when asked,
// and it is journaled (subscription_refresh) so the history shows who spent
// which refresh tokens and why.

// maxRefreshDetail bounds the journal detail of an operator refresh: one
// sentence per failed subscription, cut here.
const maxRefreshDetail = 1024

// refreshOutcome is the answer of POST /v1/admin/subscriptions/refresh and
// the fields of its journal record.
type refreshOutcome struct {
	Provider  string `json:"provider"`
	Attempted int    `json:"attempted"`
	Result    string `json:"result"` // "refreshed" or "failed"
	Detail    string `json:"detail"`
}

// handleOperatorRefresh serves POST /v1/admin/subscriptions/refresh
// {"provider","reason"}. A refresh the provider refused is still a 200 with
// result "failed": the refresh ran and the answer says how.
func (s *server) handleOperatorRefresh(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Provider string `json:"provider"`
		Reason   string `json:"reason"`
	}
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	out, err := s.operatorRefresh(r.Context(), body.Provider, body.Reason)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// operatorRefresh forces one refresh of each non-retired subscription of
// provider that holds an OAuth grant and whose credential is active, one
// after another, and journals the outcome. It refuses 400 for an empty
// reason or a provider without OAuth grants and 503 when the journal could
// not record it, before any token call.
func (s *server) operatorRefresh(ctx context.Context, provider, reason string) (refreshOutcome, error) {
	if err := checkReason(reason); err != nil {
		return refreshOutcome{}, err
	}
	if _, err := lookupOAuth(provider); err != nil {
		return refreshOutcome{}, refuse("invalid_request", "provider %q has no OAuth grants to refresh (claude-code, codex, kimi)", provider)
	}
	if err := s.journal.ready(); err != nil {
		return refreshOutcome{}, refuse("dependency_unavailable", "nothing refreshed: the journal cannot record an operator refresh: %v", err).because(err)
	}
	subs, err := s.refreshable(provider)
	if err != nil {
		return refreshOutcome{}, err
	}
	out := refreshOutcome{Provider: provider, Attempted: len(subs), Result: "refreshed"}
	var failed []string
	for _, id := range subs {
		_, err := s.oauth.refresh(ctx, id, provider, "")
		switch {
		case err == nil, errors.Is(err, errRefreshSuperseded): // a newer grant is stored either way
		case ctx.Err() != nil:
			return refreshOutcome{}, refuse("client_cancelled", "the operator hung up during the refresh").because(err)
		default:
			failed = append(failed, id+": "+redact(err.Error()))
		}
	}
	switch {
	case len(subs) == 0:
		out.Detail = fmt.Sprintf("no non-retired %s subscription holds an active OAuth grant; nothing to refresh", provider)
	case len(failed) == 0:
		out.Detail = fmt.Sprintf("%d grant(s) refreshed", len(subs))
	default:
		out.Result = "failed"
		out.Detail = truncateUTF8(fmt.Sprintf("%d of %d refresh(es) failed: %s", len(failed), len(subs), strings.Join(failed, "; ")), maxRefreshDetail)
	}
	s.inv.invalidate(false)
	attempted := out.Attempted
	err = s.journal.append(journalRecord{Kind: "subscription_refresh", Provider: provider, Reason: reason,
		Result: out.Result, Attempted: &attempted, Detail: out.Detail})
	s.log.LogAttrs(ctx, slog.LevelInfo, "subscription_refresh", slog.String("provider", provider),
		slog.String("result", out.Result), slog.Int("attempted", out.Attempted), slog.String("detail", out.Detail))
	if err != nil {
		return refreshOutcome{}, refuse("dependency_unavailable", "the refresh ran (%s), but the journal refused its record: %v", out.Detail, err).because(err)
	}
	return out, nil
}

// refreshable lists the ids an operator refresh of provider forces, in
// overlay order: not retired (from the journal), an OAuth grant in the
// vault, and a credential the ledger holds active (a refused one waits for
// a sign-in, SPEC §11.1).
func (s *server) refreshable(provider string) ([]string, error) {
	items, err := s.inv.items()
	if err != nil {
		return nil, err
	}
	retired, err := s.inv.retiredSet()
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, it := range items {
		if it.Provider != provider || retired[it.ID] || s.ledger.credentialState(it.ID) != credActive {
			continue
		}
		cred, err := s.inv.credential(it.ID)
		if err != nil {
			return nil, err
		}
		if cred.OAuth != nil {
			ids = append(ids, it.ID)
		}
	}
	return ids, nil
}

// subscriptionRefresh is `brama subscription refresh <provider> -reason
// TEXT`: it asks the daemon (SPEC §2.3) and exits 1 unless every attempted
// refresh succeeded.
func (e cliEnv) subscriptionRefresh(args []string) error {
	const usage = "subscription refresh -reason TEXT [-gateway URL] PROVIDER"
	fs := e.newFlags("subscription refresh")
	gw := gatewayFlag(fs)
	reason := fs.String("reason", "", "why (required; journaled)")
	asJSON := fs.Bool("json", false, "print the body of POST /v1/admin/subscriptions/refresh")
	pos, err := parseFlags(fs, args, 1, usage)
	if err != nil {
		return err
	}
	if err := requireFlag("reason", *reason, usage); err != nil {
		return err
	}
	g, err := e.subscriptionGateway(*gw, bufio.NewReader(e.stdin))
	if err != nil {
		return err
	}
	b, err := g.call("POST", "/v1/admin/subscriptions/refresh", map[string]string{"provider": pos[0], "reason": *reason})
	if err != nil {
		return err
	}
	var out refreshOutcome
	if err := json.Unmarshal(b, &out); err != nil || out.Result == "" {
		return fmt.Errorf("the gateway's answer is not a refresh outcome: %s", truncateUTF8(string(b), 200))
	}
	if *asJSON {
		e.stdout.Write(b)
	} else {
		fmt.Fprintf(e.stdout, "%s %s: attempted %d: %s\n", out.Result, out.Provider, out.Attempted, out.Detail)
	}
	if out.Result != "refreshed" {
		return errRefused
	}
	return nil
}
