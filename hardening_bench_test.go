package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The costs issue 10 measured, as benchmarks (never timed tests). README's
// "Hardening" section records before/after figures. Run one at a time:
//
//	go test -run '^$' -bench 'DeepAdminBody' -benchmem
//	go test -run '^$' -bench 'ReadyzJournal' -benchmem
//	go test -run '^$' -bench 'SignedAfterReplayMemory' -benchmem
//	go test -run '^$' -bench 'ReadyzSubscriptions'

// processPeakRSSMB is this process's peak resident set (VmHWM), in MiB.
// It covers the whole test process, so run the benchmark alone.
func processPeakRSSMB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkDeepAdminBody sends a 1,000,000-deep JSON array as an admin body
// (PUT /v1/admin/routes) over real HTTP and reports the process's peak RSS.
func BenchmarkDeepAdminBody(b *testing.B) {
	env := stateEnv(b)
	env["BRAMA_LOG_LEVEL"] = "error"
	d := startDaemon(b, env, "")
	body := strings.Repeat("[", 1_000_000)
	for b.Loop() {
		req, _ := http.NewRequest("PUT", d.url+"/v1/admin/routes", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+d.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			b.Fatalf("status %d, want 400", resp.StatusCode)
		}
	}
	b.ReportMetric(processPeakRSSMB(), "peak-RSS-MiB")
}

// BenchmarkReadyzJournal300k probes GET /readyz with a 300,000-line journal.
func BenchmarkReadyzJournal300k(b *testing.B) {
	env := stateEnv(b)
	env["BRAMA_LOG_LEVEL"] = "error"
	dir := env["BRAMA_STATE_DIR"]
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	for i := range 300_000 {
		kind := "retire"
		if i%2 == 1 {
			kind = "reinstate"
		}
		fmt.Fprintf(&buf, `{"kind":%q,"at":"2026-11-29T22:00:00.000Z","subscription_id":"sub_%016x","reason":"rotated by the operator during the quarterly key review"}`+"\n", kind, i/2)
	}
	if err := os.WriteFile(filepath.Join(dir, "journal.jsonl"), buf.Bytes(), 0o600); err != nil {
		b.Fatal(err)
	}
	d := startDaemon(b, env, `{"openai":"k"}`, "-local-credentials-stdin")
	probe := func() { readyOK(b, d.url) }
	probe() // the first probe after start reads the journal once, whatever the code
	for b.Loop() {
		probe()
	}
	b.ReportMetric(float64(buf.Len())/(1<<20), "journal-MiB")
}

// writeSubscriptions writes an overlay and a vault holding n deepseek API-key
// subscriptions (no usage report: the start pass reads nothing), 64 per
// agent (the most one agent may hold of a provider).
func writeSubscriptions(tb testing.TB, dir string, n int) {
	tb.Helper()
	overlay := overlayDoc{SchemaVersion: 1}
	v := vaultDoc{SchemaVersion: 1, Subscriptions: map[string]vaultCredential{}}
	for i := range n {
		id := fmt.Sprintf("sub_%016x", i)
		overlay.Items = append(overlay.Items, overlayItem{ID: id, Provider: "deepseek", AgentID: fmt.Sprintf("agent-%d", i/maxPoolSize),
			CreatedAt: "2026-11-29T22:00:00.000Z"})
		v.Subscriptions[id] = vaultCredential{APIKey: "key-" + id}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := writeState(filepath.Join(dir, overlayFile), &overlay); err != nil {
		tb.Fatal(err)
	}
	if err := writeState(filepath.Join(dir, "vault.json"), &v); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkReadyzSubscriptions probes GET /readyz over 1k and 8k
// subscriptions; linear work makes the 8k figure about 8 times the 1k one.
func BenchmarkReadyzSubscriptions(b *testing.B) {
	for _, n := range []int{1000, 8000} {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			env := stateEnv(b)
			env["BRAMA_LOG_LEVEL"] = "error"
			writeSubscriptions(b, env["BRAMA_STATE_DIR"], n)
			d := startDaemon(b, env, "")
			probe := func() { readyOK(b, d.url) }
			probe() // the first probe reads the files once, whatever the code
			for b.Loop() {
				probe()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/subscription")
		})
	}
}

// readyOK probes GET /readyz once and fails b unless it answers 200.
func readyOK(b *testing.B, url string) {
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("status %d", resp.StatusCode)
	}
}
