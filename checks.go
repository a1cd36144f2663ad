package main

import (
	"fmt"
	"net/http"
	"strings"
)

// Task-quality evidence (SPEC §9 `check`, §7.3 task selectors): a check
// record says how a model did on a named task for one agent. Recording one
// calls no provider.

// checkRequest is the body of POST /v1/admin/checks.
type checkRequest struct {
	AgentID string   `json:"agent_id"`
	Task    string   `json:"task"`
	Model   string   `json:"model"`
	Status  string   `json:"status"`
	Score   *float64 `json:"score,omitempty"`
}

// recordCheck validates c and appends one check record. The score defaults
// to 1 for pass and 0 for fail.
func recordCheck(v *vault, j *journal, c checkRequest) error {
	if !taskPattern.MatchString(c.Task) {
		return refuse("invalid_request", "task must match [a-z0-9._-]{1,64}")
	}
	if c.Status != "pass" && c.Status != "fail" {
		return refuse("invalid_request", `status must be "pass" or "fail"`)
	}
	pid, model, ok := strings.Cut(c.Model, "/")
	if _, known := lookupProvider(pid); !ok || !known || model == "" {
		return refuse("invalid_request", "model %q is not a canonical route of a known provider", c.Model)
	}
	if _, ok := v.agentSecret(c.AgentID); !ok {
		return refuse("invalid_request", "agent %q is not a known agent", c.AgentID)
	}
	score := 0.0
	if c.Status == "pass" {
		score = 1
	}
	if c.Score != nil {
		if *c.Score < 0 || *c.Score > 1 {
			return refuse("invalid_request", "score must be between 0 and 1")
		}
		score = *c.Score
	}
	if err := j.ready(); err != nil {
		return asAPIError(err)
	}
	return j.append(journalRecord{Kind: "check", AgentID: c.AgentID, Task: c.Task, Model: c.Model, Status: c.Status, Score: &score})
}

// handleChecks serves POST /v1/admin/checks.
func (s *server) handleChecks(w http.ResponseWriter, r *http.Request) {
	var c checkRequest
	if err := decodeBody(r, &c); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := recordCheck(s.vault, s.journal, c); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]bool{"ok": true})
}

// tasksRecord is `brama tasks record -agent A -model ROUTE -status pass|fail [-score F] TASK`.
func (e cliEnv) tasksRecord(args []string) error {
	fs := e.newFlags("tasks record")
	agent := fs.String("agent", "", "the `agent` the evidence is for")
	model := fs.String("model", "", "the canonical `route` that was checked")
	status := fs.String("status", "", "pass or fail")
	score := fs.Float64("score", -1, "score from 0 to 1 (default 1 for pass, 0 for fail)")
	pos, err := parseFlags(fs, args, 1, "tasks record -agent A -model ROUTE -status pass|fail [-score F] TASK")
	if err != nil {
		return err
	}
	c := checkRequest{AgentID: *agent, Task: pos[0], Model: *model, Status: *status}
	if *score != -1 {
		c.Score = score
	}
	d := e.deps()
	if err := recordCheck(d.vault, d.journal, c); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "recorded %s for %s on task %s (agent %s)\n", c.Status, c.Model, c.Task, c.AgentID)
	return nil
}
