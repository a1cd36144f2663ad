package main

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// testSys is the sys a test hands to what it builds: a logger into t.Logf
// and now (time.Now when nil).
func testSys(t testing.TB, now func() time.Time) sys {
	if now == nil {
		now = time.Now
	}
	return sys{log: slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})), now: now}
}

// testLogWriter sends each log line to t.Logf.
type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Logf("%s", p)
	return len(p), nil
}

// readVault reads the vault file at path as serve would, past any cache.
func readVault(path string) (*vaultDoc, fileIdentity, error) {
	doc, _, err := newVault(path, nil).read()
	return doc, fileIdentity{}, err
}

// TestStateFileKeepsAbsence: an absent file's document is kept like a present one's (SPEC §2.3), so a
// request does not open and parse a routes file that is not there; the file appearing is read at once.
func TestStateFileKeepsAbsence(t *testing.T) {
	path, parses := filepath.Join(t.TempDir(), "routes.json"), 0
	f := stateFile[int]{role: "test file", path: path, parse: func(b []byte) (int, error) {
		parses++
		return len(b), nil
	}}
	for range 3 {
		if n, err := f.load(); n != 0 || err != nil {
			t.Fatalf("absent: %d, %v", n, err)
		}
	}
	if parses != 1 {
		t.Errorf("absent file parsed %d times in 3 loads, want once", parses)
	}
	if err := os.WriteFile(path, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := f.load(); n != 2 || err != nil || parses != 2 {
		t.Errorf("after the file appeared: %d, %v after %d parses, want its 2 bytes read at once", n, err, parses)
	}
}

// TestRefusedOpensCloseTheirFiles: a file a guard refuses, or whose lock is held elsewhere, is closed, not leaked:
// a long-running serve meets such refusals on every read of a broken state file.
func TestRefusedOpensCloseTheirFiles(t *testing.T) {
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd to count open files with")
		}
		return len(ents)
	}
	dir := t.TempDir()
	exposed, locked := filepath.Join(dir, "exposed.json"), filepath.Join(dir, "locked.json")
	os.WriteFile(exposed, []byte("{}"), 0o644)
	holder, err := flockFile(locked, os.O_RDWR|os.O_CREATE, syscall.LOCK_EX|syscall.LOCK_NB)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	before := fds()
	for range 200 {
		if f, _, err := guardFile("test file", exposed, true); f != nil || err == nil {
			t.Fatal("a group-readable file passed the guard")
		}
		if f, err := flockFile(locked, os.O_RDONLY, syscall.LOCK_SH|syscall.LOCK_NB); f != nil || !errors.Is(err, syscall.EWOULDBLOCK) {
			t.Fatalf("a lock held elsewhere was taken: %v", err)
		}
	}
	if grown := fds() - before; grown > 50 { // other tests' connections may come and go; 400 refusals leaking would show
		t.Errorf("%d more files open after 400 refused opens", grown)
	}
}

// TestStateFileRefusesWhatIsNotARegularFile: a state file that is a FIFO or a directory is refused as one, never read
// as a document: a FIFO with no writer reads as empty, which would serve as an empty registry (SPEC §2.3).
func TestStateFileRefusesWhatIsNotARegularFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(string) error
	}{
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o600) }},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "routes.json")
			if err := tc.make(path); err != nil {
				t.Skip(err)
			}
			doc, err := newRegistry(path, nil, newJournal(state{}, testSys(t, nil))).current()
			if want := registryRole + " " + path + " is not a regular file"; err == nil || err.Error() != want {
				t.Errorf("current() = %v, %v; want the error %q", doc, err, want)
			}
		})
	}
}
