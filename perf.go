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
	perfRole       = "perf telemetry"
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

// perfRegistry keeps one entry per route ever served, written to perf.json
// by record (at most every 30 s) and flush: no timer, so idle writes nothing.
type perfRegistry struct {
	sys
	path     string    // perf.json; "" when pathErr is set
	pathErr  error     // no state directory: the numbers live in memory only
	unplaced sync.Once // logs perf_stats_unplaced at the first record

	mu        sync.Mutex // guards routes, lastFlush, seq
	routes    map[string]perfEntry
	lastFlush time.Time // zero: never flushed, so the first record flushes
	seq       uint64    // snapshots taken for writing, in order

	file snapshotFile // perf.json, written in snapshot order
}

// newPerfRegistry starts from perf.json. A file failing the guards or the
// parse is logged and replaced at the next flush: telemetry never stops serving.
func newPerfRegistry(st state, sy sys) *perfRegistry {
	p := &perfRegistry{sys: sy, routes: map[string]perfEntry{}}
	if p.path, p.pathErr = st.path(perfRole, perfFile); p.pathErr != nil {
		return p
	}
	b, _, err := readGuarded(perfRole, p.path)
	doc := &perfDocument{}
	if err == nil {
		err = decodeStrict(perfRole, b, doc)
	}
	switch {
	case err == nil:
		maps.Copy(p.routes, doc.Routes)
	case !errors.Is(err, errFileAbsent):
		sy.log.Warn("perf_stats_unreadable", "cause", err.Error())
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

// record adds one request for route. A failure counts only on a route that has served, so
// invented names leave nothing (SPEC §13; issue 10: 20,000 of them made /metrics 54 MB).
func (p *perfRegistry) record(route string, ok bool, latency time.Duration, outputTokens int) {
	ms := max(latency.Milliseconds(), 0)
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
	p.mu.Unlock()
	if err := p.write(now, false); err != nil {
		p.log.Warn("perf_stats_flush_failed", "cause", err.Error())
	}
}

// flush writes perf.json now (at shutdown), a failure logged as record logs
// it; without a state directory the numbers were only ever in memory.
func (p *perfRegistry) flush() error {
	err := p.write(p.now(), true)
	if err != nil {
		p.log.Warn("perf_stats_flush_failed", "cause", err.Error())
	}
	return err
}

// write snapshots the registry into perf.json 30 s after the last flush (even a failed
// one), or now with force; numbered, so racing writes never leave older numbers.
func (p *perfRegistry) write(now time.Time, force bool) error {
	if p.pathErr != nil {
		if !force {
			p.unplaced.Do(func() { p.log.Warn("perf_stats_unplaced", "cause", p.pathErr.Error()) })
		}
		return nil
	}
	p.mu.Lock()
	if !force && !p.lastFlush.IsZero() && now.Sub(p.lastFlush) < perfFlushEvery {
		p.mu.Unlock()
		return nil
	}
	p.lastFlush = now
	p.seq++
	seq, doc := p.seq, perfDocument{SchemaVersion: 1, FlushedAt: now.UTC(), Routes: maps.Clone(p.routes)}
	p.mu.Unlock()
	b, err := marshalState(doc)
	if err == nil {
		err = p.file.write(p.path, seq, b)
	}
	if err != nil {
		return fmt.Errorf("write perf telemetry: %w", err)
	}
	return nil
}

// snapshot copies the registry for /metrics.
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

// perfFamilies are the per-route metric families, in output order.
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

// writeMetrics renders the perf registry, then the extras (_total: a counter) in Prometheus
// text format 0.0.4, skipping a name outside the grammar or taken by a route family.
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
	for _, n := range slices.Sorted(maps.Keys(extra)) {
		if !promMetricName.MatchString(n) || slices.ContainsFunc(perfFamilies, func(f perfFamily) bool { return f.name == n }) {
			continue
		}
		typ := "gauge"
		if strings.HasSuffix(n, "_total") {
			typ = "counter"
		}
		fmt.Fprintf(&b, "# TYPE %s %s\n%s %s\n", n, typ, n, formatMetric(extra[n]))
	}
	io.WriteString(w, b.String())
}

// escapeLabel escapes backslash, double quote and line feed in a label
// value, and makes it valid UTF-8 as the exposition format requires.
func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(strings.ToValidUTF8(s, "\uFFFD"))
}

// formatMetric is a sample value as Prometheus parses it; counters read as
// integers, and FormatFloat already spells NaN, +Inf and -Inf that way.
func formatMetric(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
