package main

import (
	"errors"
	"net/http"
	"strings"
)

// api.go holds the HTTP handlers server.go has no room for (it stays under
// 650 lines): the subscription inventory's (SPEC §10.1) and maintenance's
// (SPEC §11.2), which routes() lists and which each decode, call one plain
// method and encode. The
// agent routes serve the agent the request acts for (a valid signature or
// a bearer bound to it); the admin twins serve any agent.

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

// subscriptionOwner guards the agent routes: the request must act for the
// path's agent, as a signed agent or a bearer bound to it (SPEC §3.1, §3.2).
func (s *server) subscriptionOwner(h http.HandlerFunc) http.HandlerFunc {
	return s.subscriptionAgent(false, h)
}

// subscriptionAgentAgrees guards the admin twins: an admin may act for any
// agent, but a bearer-bound or signed agent must still be the path's (SPEC
// §3.2: bearer, signed and path agent agree where present).
func (s *server) subscriptionAgentAgrees(h http.HandlerFunc) http.HandlerFunc {
	return s.subscriptionAgent(true, h)
}

// subscriptionAgent runs h once the path's agent id obeys the id rule (so
// `/v1/admin/subscriptions/%2e%2e` is a 400, not an empty listing) and the
// request may act for it; admin says whether no agent at all will do.
func (s *server) subscriptionAgent(admin bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		agent, path := infoFrom(r.Context()).agentID, r.PathValue("agent_id")
		switch {
		case !idPattern.MatchString(path):
			s.fail(w, r, refuse("invalid_request", "agent id %q in the path must match [a-z0-9-]{1,64}", path))
		case agent == "" && !admin:
			s.fail(w, r, refuse("unauthenticated", "this route acts for an agent: sign the request as agent %q (X-Agent-Id, X-Agent-Timestamp, X-Agent-Signature) or use a bearer bound to it", path))
		case agent != "" && agent != path:
			s.fail(w, r, refuse("forbidden", "this request acts for agent %q, not %q", agent, path))
		default:
			h(w, r)
		}
	}
}

// handleSubscriptionList serves GET …/subscriptions/{agent_id}.
func (s *server) handleSubscriptionList(w http.ResponseWriter, r *http.Request) {
	rows, err := s.inv.list(r.PathValue("agent_id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"subscriptions": rows})
}

// handleSubscriptionDonate serves POST /v1/subscriptions/{agent_id}.
func (s *server) handleSubscriptionDonate(w http.ResponseWriter, r *http.Request) {
	var body donation
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	it, err := s.inv.donate(r.PathValue("agent_id"), body.Provider, body.Label, vaultCredential{APIKey: body.APIKey, OAuth: body.OAuth})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.maint.changed()
	writeJSON(w, http.StatusCreated, map[string]donatedSubscription{
		"subscription": {ID: it.ID, Provider: it.Provider, AgentID: it.AgentID, Label: it.Label, Status: "active"},
	})
}

// handleAdminSubscriptionDonate serves POST /v1/admin/subscriptions/{agent_id}:
// an admin may donate only to an agent the vault knows.
func (s *server) handleAdminSubscriptionDonate(w http.ResponseWriter, r *http.Request) {
	agent := r.PathValue("agent_id")
	doc, err := s.vault.load()
	if err != nil {
		s.fail(w, r, vaultRefusal(err))
		return
	}
	if _, ok := doc.Agents[agent]; !ok {
		s.fail(w, r, refuse("not_found", "no agent %q in the vault (brama agents add %s)", agent, agent))
		return
	}
	s.handleSubscriptionDonate(w, r)
}

// handleSubscriptionRetire serves DELETE …/subscriptions/{agent_id}/{subscription_id}[?reason=TEXT].
func (s *server) handleSubscriptionRetire(w http.ResponseWriter, r *http.Request) {
	reason := r.URL.Query().Get("reason")
	if reason == "" {
		reason = "retired by " + infoFrom(r.Context()).client.ID
	}
	if err := s.inv.retire(r.PathValue("agent_id"), r.PathValue("subscription_id"), reason); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// handleSubscriptionReinstate serves POST
// /v1/admin/subscriptions/{agent_id}/{subscription_id}/reinstate {"reason"}.
func (s *server) handleSubscriptionReinstate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.inv.reinstate(r.PathValue("agent_id"), r.PathValue("subscription_id"), body.Reason); err != nil {
		s.fail(w, r, err)
		return
	}
	s.maint.changed()
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// handleMaintain serves POST /v1/admin/maintain (body empty or {}): one pass
// now; one that could not list the subscriptions is refused 503 with why.
func (s *server) handleMaintain(m *maintainer) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var none struct{}
		if err := decodeOptionalBody(r, &none); err != nil {
			s.fail(w, r, err)
			return
		}
		rep, err := m.passNow(r.Context())
		switch {
		case errors.Is(err, errMaintenanceStopped):
			s.fail(w, r, refuse("dependency_unavailable", "no pass can run: %v", err).because(err))
		case err != nil:
			s.fail(w, r, asAPIError(err))
		default:
			writeJSON(w, http.StatusOK, rep)
		}
	}
}

// decodeOptionalBody is decodeBody for a route whose body may be empty.
func decodeOptionalBody(r *http.Request, v any) error {
	if len(strings.TrimSpace(string(infoFrom(r.Context()).body))) == 0 {
		return nil
	}
	return decodeBody(r, v)
}
