package main

import (
	"log/slog"
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
	doc, err := newVault(path, nil).fresh()
	return doc, fileIdentity{}, err
}
