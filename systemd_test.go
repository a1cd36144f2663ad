package main

import (
	"os"
	"strings"
	"testing"
)

// TestSystemdUnit keeps examples/systemd/brama.service to what RUNBOOK.md
// says of it: SIGTERM drains, the stop timeout is the only limit and is
// long, no reload, state owner-only.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("examples/systemd/brama.service")
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			set[k] = v
		}
	}
	for _, tt := range []struct{ key, want string }{
		{"ExecStart", "/usr/local/bin/brama serve -addr 127.0.0.1:8080"},
		{"KillSignal", "SIGTERM"},
		{"KillMode", "mixed"},
		{"TimeoutStopSec", "30min"},
		{"UMask", "0077"},
		{"Environment", "BRAMA_STATE_DIR=/var/lib/brama"},
		{"ReadWritePaths", "/var/lib/brama"},
	} {
		if got := set[tt.key]; got != tt.want {
			t.Errorf("%s=%q, want %q", tt.key, got, tt.want)
		}
	}
	if v, ok := set["ExecReload"]; ok {
		t.Errorf("ExecReload=%s: Brama has no reload; SIGHUP stops it", v)
	}
}
