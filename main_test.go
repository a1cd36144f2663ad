package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
	binaryDir  string // removed by TestMain
)

// TestMain removes the binary builtBinary made: a test run leaves no file behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if binaryDir != "" {
		os.RemoveAll(binaryDir)
	}
	os.Exit(code)
}

// builtBinary builds brama once per test run into a temporary directory.
func builtBinary(t *testing.T) string {
	t.Helper()
	binaryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "brama-bin")
		if binaryDir = dir; err != nil {
			binaryErr = err
			return
		}
		binaryPath = filepath.Join(dir, "brama")
		out, err := exec.Command("go", "build", "-o", binaryPath, ".").CombinedOutput()
		if err != nil {
			binaryErr = err
			binaryPath = string(out)
		}
	})
	if binaryErr != nil {
		t.Fatalf("go build: %v\n%s", binaryErr, binaryPath)
	}
	return binaryPath
}

// noHomeEnv is an environment with neither HOME nor BRAMA_STATE_DIR.
func noHomeEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "BRAMA_MODEL_CATALOG_URL=off"}
}

func TestBinaryServesWithoutHome(t *testing.T) {
	bin := builtBinary(t)
	cwd := t.TempDir()
	cmd := exec.Command(bin, "serve", "-addr", "127.0.0.1:0")
	cmd.Env, cmd.Dir = noHomeEnv(), cwd
	stdout, _ := cmd.StdoutPipe()
	stderrPipe, _ := cmd.StderrPipe()
	stderr := &syncBuffer{}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The first-start line is written before the listener; read stderr up
	// to it, then keep copying the rest in the background.
	errReader := bufio.NewReader(stderrPipe)
	for !strings.Contains(stderr.String(), "bearer token (shown once)") {
		line, err := errReader.ReadString('\n')
		stderr.Write([]byte(line))
		if err != nil {
			t.Fatalf("stderr ended before the first-start line: %v\n%s", err, stderr.String())
		}
	}
	go io.Copy(stderr, errReader)
	waited := make(chan error, 1)
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := <-waited; err != nil {
			t.Errorf("serve exited with %v after SIGTERM; stderr:\n%s", err, stderr.String())
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	go func() { io.Copy(io.Discard, stdout); waited <- cmd.Wait() }()
	if err != nil {
		t.Fatalf("no listening line: %v; stderr:\n%s", err, stderr.String())
	}
	url := strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
	const cause = "$HOME is not defined"
	if !strings.Contains(stderr.String(), `created admin client "local" for this process only (not kept: `) || !strings.Contains(stderr.String(), cause) {
		t.Errorf("stderr lacks the process-only client line naming the cause:\n%s", stderr.String())
	}
	for i := 0; i < 3; i++ { // keeps serving
		resp, err := http.Get(url + "/health")
		if err != nil {
			t.Fatalf("health %d: %v", i, err)
		}
		var h map[string]string
		json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if resp.StatusCode != 200 || h["status"] != "ok" {
			t.Fatalf("health %d = %d %v", i, resp.StatusCode, h)
		}
	}
	d := &daemon{t: t, url: url}
	tok := tokenFromStderr(stderr.String())
	status, _, body := d.call("PUT", "/v1/admin/routes", tok, `{"alias":"chat","route":"openai/gpt-4o"}`)
	if status != 503 || envelopeOf(t, body)["code"] != "dependency_unavailable" || !strings.Contains(string(body), cause) {
		t.Errorf("registry write without a state directory: %d %s; want 503 dependency_unavailable naming the cause", status, body)
	}
	status, _, body = d.call("GET", "/readyz", "", "")
	if !strings.Contains(string(body), "no state directory") {
		t.Errorf("/readyz does not warn about the missing state directory: %d %s", status, body)
	}

	for _, args := range [][]string{
		{"journal", "check"},
		{"routes", "set", "chat", "openai/gpt-4o"},
		{"clients", "add", "x"},
		{"credentials", "set", "openai"},
	} {
		c := exec.Command(bin, args...)
		c.Env, c.Dir, c.Stdin = noHomeEnv(), cwd, strings.NewReader("sk-test-0123456789\n")
		out, err := c.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), cause) {
			t.Errorf("brama %v without a state directory: %v %q; want exit 1 naming %q", args, err, out, cause)
		}
	}
	if ents, _ := os.ReadDir(cwd); len(ents) != 0 {
		t.Errorf("brama wrote into the working directory: %v", ents)
	}
}

func tokenFromStderr(s string) string {
	_, after, ok := strings.Cut(s, "bearer token (shown once): ")
	if !ok {
		return ""
	}
	tok, _, _ := strings.Cut(after, "\n")
	return strings.TrimSpace(tok)
}

func TestHelpPrintsFlags(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "-h"}, {"routes", "list", "-h"}, {"routes", "migrate", "-h"}, {"clients", "add", "-h"},
		{"journal", "check", "-h"}, {"credentials", "set", "-h"},
	} {
		out, errOut, code := runCLI(t, stateEnv(t), "", args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: brama "+strings.Join(args[:len(args)-1], " ")) {
			t.Errorf("brama %v: exit %d, stdout %q, stderr %q; want exit 0 and its help on stdout", args, code, out, errOut)
		}
	}
	if _, _, code := runCLI(t, stateEnv(t), "", "routes", "bogus"); code != 2 {
		t.Errorf("unknown subcommand exit = %d, want 2", code)
	}
	if _, _, code := runCLI(t, stateEnv(t), "", "clients", "add"); code != 2 {
		t.Errorf("missing positional exit = %d, want 2", code)
	}
}

func TestVersionTakesNoArguments(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stdout string // a substring of stdout
		stderr string // a substring of stderr
	}{
		{args: []string{"version"}, code: 0, stdout: "brama " + version + "\n"},
		{args: []string{"-version"}, code: 0, stdout: "brama " + version + "\n"},
		{args: []string{"--version"}, code: 0, stdout: "brama " + version + "\n"},
		{args: []string{"version", "-h"}, code: 0, stdout: "usage: brama version"},
		{args: []string{"version", "extra"}, code: 2, stderr: "brama version: want no arguments; see brama version -h"},
		{args: []string{"version", "-json"}, code: 2, stderr: "flag provided but not defined: -json"},
	}
	for _, tt := range tests {
		out, errOut, code := runCLI(t, stateEnv(t), "", tt.args...)
		if code != tt.code || !strings.Contains(out, tt.stdout) || !strings.Contains(errOut, tt.stderr) {
			t.Errorf("brama %v: exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
				tt.args, code, out, errOut, tt.code, tt.stdout, tt.stderr)
		}
		if tt.code != 0 && out != "" || tt.code == 0 && errOut != "" {
			t.Errorf("brama %v printed %q on a usage error", tt.args, out)
		}
	}
}

// TestAnswersPruneHelp: -older-than is required, so its help names no
// default (a sentinel such as -1ns would read as one), and zero is a value.
func TestAnswersPruneHelp(t *testing.T) {
	out, _, code := runCLI(t, stateEnv(t), "", "answers", "prune", "-h")
	if code != 0 || !strings.Contains(out, "-older-than duration") || strings.Contains(out, "default") {
		t.Errorf("answers prune -h: exit %d, stdout %q; want its flag without a default", code, out)
	}
	if _, errOut, code := runCLI(t, stateEnv(t), "", "answers", "prune"); code != 2 {
		t.Errorf("answers prune without -older-than: exit %d (%q), want 2", code, errOut)
	}
	if out, errOut, code := runCLI(t, stateEnv(t), "", "answers", "prune", "-older-than", "0s"); code != 0 || !strings.Contains(out, "removed 0") {
		t.Errorf("answers prune -older-than 0s: exit %d, %q %q; want 0", code, out, errOut)
	}
}

// TestServeStartedLogLine: serve logs serve_started with the address it listens on, its version, and whether it has
// a state directory (AUTHORIZATION.md lists the event).
func TestServeStartedLogLine(t *testing.T) {
	d := startDaemon(t, stateEnv(t), "")
	d.stop()
	for l := range strings.SplitSeq(d.stderr.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "serve_started" {
			if want := strings.TrimPrefix(d.url, "http://"); m["addr"] != want || m["version"] != version || m["state_dir"] != true {
				t.Errorf("serve_started line %v, want addr %s, version %s, state_dir true", m, want, version)
			}
			return
		}
	}
	t.Errorf("no serve_started line in:\n%s", d.stderr.String())
}

// TestServeRefusesToStartWhenTheFirstClientIsNotKept: a first start whose clients file cannot be written (a full
// disk at the rename) ends serve with the error: no token is printed for a client that was never kept, and serve
// never listens for requests no bearer could make.
func TestServeRefusesToStartWhenTheFirstClientIsNotKept(t *testing.T) {
	env := stateEnv(t)
	testingOnlyRename = func(oldpath, newpath string) error {
		if filepath.Base(newpath) == "clients.json" {
			return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: syscall.ENOSPC}
		}
		return os.Rename(oldpath, newpath)
	}
	defer func() { testingOnlyRename = nil }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	stderr, done := &syncBuffer{}, make(chan error, 1)
	go func() {
		err := run(ctx, nil, []string{"serve", "-addr", "127.0.0.1:0"}, testEnv(env), strings.NewReader(""), pw, stderr)
		pw.Close()
		done <- err
	}()
	if line, _ := bufio.NewReader(pr).ReadString('\n'); line != "" {
		cancel()
		<-done
		t.Fatalf("serve started (%q) though its first client was not kept; stderr:\n%s", line, stderr.String())
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Errorf("serve returned %v, want the clients file's write error", err)
	}
	if strings.Contains(stderr.String(), "bearer token") {
		t.Errorf("a token was printed for a client that was not kept:\n%s", stderr.String())
	}
	if _, err := os.Stat(filepath.Join(env["BRAMA_STATE_DIR"], "clients.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("clients.json after the failed write: %v", err)
	}
}
