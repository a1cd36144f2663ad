package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// perf.json, rewritten at most every 30 s (SPEC §2.2).
const (
	perfFile       = "perf.json"
	perfFlushEvery = 30 * time.Second
)

// perfEntry is one route's counters in the perf registry (SPEC §13).
type perfEntry struct {
	Count          int64   `json:"count"`
	Failures       int64   `json:"failures"`
	TotalLatencyMs int64   `json:"total_latency_ms"`
	LastLatencyMs  int64   `json:"last_latency_ms"`
	OutputTokens   int64   `json:"output_tokens"`
	LastTokensPerS float64 `json:"last_tokens_per_second"`
}

// perfDocument is the shape of $STATE/perf.json.
type perfDocument struct {
	SchemaVersion int                  `json:"schema_version"`
	FlushedAt     time.Time            `json:"flushed_at"`
	Routes        map[string]perfEntry `json:"routes"`
}

// perfRegistry keeps one entry per route ever served, in memory, and writes
// them to perf.json at most every 30 s. There is no timer: a flush happens
// only inside record (when due) and flush (at shutdown), so an idle daemon
// writes nothing.
type perfRegistry struct {
	sys
	st state

	mu        sync.Mutex // guards routes, lastFlush, seq, unplaced
	routes    map[string]perfEntry
	lastFlush time.Time // zero: never flushed, so the first record flushes
	seq       uint64    // snapshots taken for writing, in order
	unplaced  bool      // perf_stats_unplaced was logged

	file snapshotFile // perf.json, written in snapshot order
}

// newPerfRegistry starts from perf.json when it exists. A file that fails
// the §2.2 guards or does not parse is logged and the registry starts empty
// (the next flush replaces it): telemetry never stops serving.
func newPerfRegistry(st state, sy sys) *perfRegistry {
	p := &perfRegistry{sys: sy, st: st, routes: map[string]perfEntry{}}
	name, err := st.path("perf telemetry", perfFile)
	if err != nil {
		return p // perf_stats_unplaced is logged at the first record
	}
	f := stateFile[*perfDocument]{role: "perf telemetry", path: name, absentErr: true, parse: func(b []byte) (*perfDocument, error) {
		doc := &perfDocument{}
		return doc, decodeStrict("perf telemetry", b, doc)
	}}
	doc, err := f.fresh()
	if err != nil && !errors.Is(err, errFileAbsent) {
		sy.log.Warn("perf_stats_unreadable", "cause", err.Error())
	}
	if err == nil {
		maps.Copy(p.routes, doc.Routes)
	}
	return p
}

// validate refuses another schema.
func (d *perfDocument) validate() error {
	if d.SchemaVersion != 1 {
		return fmt.Errorf("perf telemetry: schema_version %d, want 1", d.SchemaVersion)
	}
	return nil
}

// record adds one request for route. A route gets its entry when it first
// serves (a success): a failure counts only on a route that has served, so
// invented names that never reach a model leave nothing behind (SPEC §13;
// issue 10: 20,000 unknown names made /metrics 54 MB). Tokens per second is
// updated only by a success that produced output in a measurable time.
func (p *perfRegistry) record(route string, ok bool, latency time.Duration, outputTokens int) {
	ms := latency.Milliseconds()
	if ms < 0 {
		ms = 0
	}
	now := p.now()
	p.mu.Lock()
	if e, served := p.routes[route]; served || ok {
		e.Count++
		if !ok {
			e.Failures++
		}
		e.TotalLatencyMs += ms
		e.LastLatencyMs = ms
		if outputTokens > 0 {
			e.OutputTokens += int64(outputTokens)
			if ok && latency > 0 {
				e.LastTokensPerS = float64(outputTokens) / latency.Seconds()
			}
		}
		p.routes[route] = e
	}
	name, err := p.st.path("perf telemetry", perfFile)
	if err != nil {
		first := !p.unplaced
		p.unplaced = true
		p.mu.Unlock()
		if first {
			p.log.Warn("perf_stats_unplaced", "cause", err.Error())
		}
		return
	}
	if !p.lastFlush.IsZero() && now.Sub(p.lastFlush) < perfFlushEvery {
		p.mu.Unlock()
		return
	}
	seq, doc := p.takeLocked(now)
	p.mu.Unlock()
	if err := p.write(name, seq, doc); err != nil {
		p.log.Warn("perf_stats_flush_failed", "cause", err.Error())
	}
}

// takeLocked snapshots the registry for writing and marks the flush done
// (a failed write waits for the next 30 s too). p.mu is held.
func (p *perfRegistry) takeLocked(now time.Time) (uint64, perfDocument) {
	p.lastFlush = now
	p.seq++
	return p.seq, perfDocument{SchemaVersion: 1, FlushedAt: now.UTC(), Routes: maps.Clone(p.routes)}
}

// write puts doc in perf.json unless a newer snapshot is already there, so
// two flushes racing outside p.mu never leave older numbers on disk.
func (p *perfRegistry) write(name string, seq uint64, doc perfDocument) error {
	b, err := marshalState(doc)
	if err != nil {
		return err
	}
	if err := p.file.write(name, seq, b); err != nil {
		return fmt.Errorf("write perf telemetry: %w", err)
	}
	return nil
}

// flush writes perf.json now (at shutdown). Without a state directory it
// does nothing: the numbers were only ever in memory.
func (p *perfRegistry) flush() error {
	name, err := p.st.path("perf telemetry", perfFile)
	if err != nil {
		return nil
	}
	p.mu.Lock()
	seq, doc := p.takeLocked(p.now())
	p.mu.Unlock()
	return p.write(name, seq, doc)
}

// snapshot copies the registry for /stats and /metrics.
func (p *perfRegistry) snapshot() map[string]perfEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.routes)
}

// perfFamily is one per-route metric family of /metrics.
type perfFamily struct {
	name, typ, help string
	value           func(perfEntry) float64
}

// perfFamilies are the per-route metric families of /metrics, in output
// order.
var perfFamilies = []perfFamily{
	{"brama_route_requests_total", "counter", "Requests served on the route.", func(e perfEntry) float64 { return float64(e.Count) }},
	{"brama_route_failures_total", "counter", "Requests on the route that ended in a refusal.", func(e perfEntry) float64 { return float64(e.Failures) }},
	{"brama_route_latency_milliseconds_total", "counter", "Sum of request latencies on the route, in milliseconds.", func(e perfEntry) float64 { return float64(e.TotalLatencyMs) }},
	{"brama_route_last_latency_milliseconds", "gauge", "Latency of the route's last request, in milliseconds.", func(e perfEntry) float64 { return float64(e.LastLatencyMs) }},
	{"brama_route_output_tokens_total", "counter", "Output tokens produced on the route.", func(e perfEntry) float64 { return float64(e.OutputTokens) }},
	{"brama_route_last_tokens_per_second", "gauge", "Output tokens per second of the route's last successful request.", func(e perfEntry) float64 { return e.LastTokensPerS }},
}

// promMetricName is the Prometheus metric name grammar.
var promMetricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// writeMetrics renders the perf registry and the extra values in the
// Prometheus text exposition format (version 0.0.4), deterministically:
// the route families in a fixed order with routes sorted, then the extras
// sorted by name. An extra whose name ends in _total is a counter, any
// other a gauge; a name outside the metric grammar, or one a route family
// already uses, is skipped.
func writeMetrics(w io.Writer, perf map[string]perfEntry, extra map[string]float64) {
	var b strings.Builder
	if routes := slices.Sorted(maps.Keys(perf)); len(routes) > 0 {
		for _, f := range perfFamilies {
			fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
			for _, r := range routes {
				fmt.Fprintf(&b, "%s{route=\"%s\"} %s\n", f.name, escapeLabel(r), formatMetric(f.value(perf[r])))
			}
		}
	}
	names := make([]string, 0, len(extra))
	for n := range extra {
		if promMetricName.MatchString(n) && !slices.ContainsFunc(perfFamilies, func(f perfFamily) bool { return f.name == n }) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		typ := "gauge"
		if strings.HasSuffix(n, "_total") {
			typ = "counter"
		}
		fmt.Fprintf(&b, "# HELP %s %s as /stats reports it.\n# TYPE %s %s\n%s %s\n", n, n, n, typ, n, formatMetric(extra[n]))
	}
	io.WriteString(w, b.String())
}

// escapeLabel escapes a label value as the exposition format requires:
// backslash, double quote and line feed. Invalid UTF-8 becomes U+FFFD
// because label values must be UTF-8.
func escapeLabel(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// formatMetric is a sample value as Prometheus parses it (NaN, +Inf, -Inf
// included).
func formatMetric(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return strconv.FormatFloat(v, 'f', -1, 64) // counters read as integers
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
