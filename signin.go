package main

import (
	"context"
	"fmt"
	"log/slog"
)

// Sign-in (SPEC §11.1): the CLI runs the PKCE flow and hands the grant to the
// daemon, which alone writes the vault (SPEC §2.3), as PUT …/credential does.

// signInVia is the query a sign-in's donation carries on POST
// /v1/admin/subscriptions/{agent_id}, so the daemon journals it as a sign-in.
const signInVia = "sign-in"

// replaceSubscriptionCredential replaces agent's subscription id's credential and
// journals subscription_sign_in, refusing first what the journal or owner forbid.
func (s *server) replaceSubscriptionCredential(agent, id string, cred vaultCredential, by string) (overlayItem, error) {
	if err := s.journal.ready(); err != nil {
		return overlayItem{}, refuse("dependency_unavailable", "credential not replaced: the journal cannot record a sign-in: %v", err).because(err)
	}
	kind := "api key"
	if cred.OAuth != nil {
		kind = "oauth grant"
	}
	it, err := s.inv.replaceCredential(agent, id, cred)
	if err != nil {
		if ae := asAPIError(err); ae.Status() >= 500 && it.ID != "" {
			s.journalSignIn(it, "failed", fmt.Sprintf("the %s from client %s was not stored: %s", kind, by, ae.Message))
		}
		return overlayItem{}, err
	}
	s.maint.changed()
	s.replay.forget("", it.Provider) // SPEC §17: the provider's routes may serve now
	if err := s.journalSignIn(it, "signed_in", fmt.Sprintf("%s replaced by client %s", kind, by)); err != nil {
		return overlayItem{}, refuse("dependency_unavailable", "the credential of %s was replaced, but the journal refused the sign-in record: %v", id, err).because(err)
	}
	return it, nil
}

// journalSignIn appends one subscription_sign_in record and logs it.
func (s *server) journalSignIn(it overlayItem, result, detail string) error {
	detail = ledgerSentence(detail)
	err := s.journal.append(journalRecord{Kind: "subscription_sign_in", SubscriptionID: it.ID, Provider: it.Provider, Result: result, Detail: detail})
	level := slog.LevelInfo
	args := []any{"subscription_id", it.ID, "agent_id", it.AgentID, "provider", it.Provider,
		"result", result, "detail", detail}
	if result != "signed_in" || err != nil {
		level = slog.LevelWarn
	}
	if err != nil {
		args = append(args, "journal_error", err.Error())
	}
	s.log.Log(context.Background(), level, "subscription_sign_in", args...)
	return err
}
