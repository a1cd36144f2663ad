package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Advisory data no request waits on (SPEC §6.4, §13): the model catalogue and the perf registry.

const defaultCatalogURL = "https://models.dev/api.json" // SPEC §16

type (
	// modelInfo is what Brama keeps of a catalogue model (0 and nil: unknown); callers must not modify its slices.
	modelInfo struct {
		ID          string            `json:"id"`
		ReleaseDate string            `json:"release_date,omitempty"` // "YYYY-MM-DD" or "YYYY-MM"; "" unknown
		Limit       catalogLimit      `json:"limit"`
		Modalities  catalogModalities `json:"modalities"`
	}
	// catalogLimit and catalogModalities keep api.json's member names, so the cache is in its shape.
	catalogLimit struct {
		Context float64 `json:"context"`
		Output  float64 `json:"output"`
	}
	catalogModalities struct {
		Input  []string `json:"input"`
		Output []string `json:"output"`
	}
	// catalogData is api.json's shape (vendor → "models" → id → model) in memory, so the cache is its one json.Marshal.
	catalogData   = map[string]catalogVendor
	catalogVendor struct {
		Models map[string]modelInfo `json:"models"`
	}
)

// catalog is the model metadata of SPEC §6.4. Its source is a file (read on demand) or a URL (read in the
// background, each good read kept in the model metadata cache); either read settles memory for one TTL.
type catalog struct {
	path, url string       // BRAMA_MODEL_CATALOG_PATH (it wins), else the live URL; "" none
	cachePath string       // the model metadata cache; "" without a state directory or for a file
	client    *http.Client // the provider client: no timeout of Brama's own (SPEC §7.4)
	sys
	ttl        time.Duration
	mu         sync.Mutex      // guards the fields below
	data       catalogData     // nil when absent
	why        string          // why data is nil
	nextTry    time.Time       // a TTL after the last read, good or bad
	fileID     string          // a file source's size and mtime at the last read
	ctx        context.Context // start's, for every background read
	wg         *sync.WaitGroup // start's: counts the background reads; nil until start
	refreshing bool            // a background read is running (single flight)
}

// catalogCache is $STATE/model-metadata.json: the last good catalogue and its fetch time.
type catalogCache struct {
	FetchedAt time.Time       `json:"fetched_at"`
	Body      json.RawMessage `json:"body"`
}

// newCatalog configures the catalogue (SPEC §16); for a URL, memory starts from the cache until start reads it.
func newCatalog(st state, getenv func(string) string, client *http.Client, log *slog.Logger, now func() time.Time) *catalog {
	ttl := envSeconds(getenv, "BRAMA_MODEL_CATALOG_TTL_SECS", "model_catalog_ttl_invalid", 1, 900, log)
	c := &catalog{client: client, sys: sys{log, now}, ttl: ttl, path: strings.TrimSpace(getenv("BRAMA_MODEL_CATALOG_PATH")),
		why: "no catalogue read has been started"}
	if c.path != "" {
		return c
	}
	if c.url = cmp.Or(strings.TrimSpace(getenv("BRAMA_MODEL_CATALOG_URL")), defaultCatalogURL); strings.EqualFold(c.url, "off") {
		c.url = ""
	}
	var cc catalogCache
	var err error
	if c.cachePath, err = st.path("model metadata cache", "model-metadata.json"); err != nil {
		log.Warn("model_metadata_cache_unplaced", "cause", err.Error())
	} else if cc, _, err = (&stateFile[catalogCache]{role: "model metadata cache", path: c.cachePath}).read(); err == nil {
		c.data, err = parseCatalog(cc.Body, nil)
	}
	switch {
	case errors.Is(err, errFileAbsent):
		err = errors.New("there is no cached copy")
	case err != nil && c.cachePath != "": // an unplaced cache was logged above
		log.Warn("model_metadata_cache_unreadable", "cause", err.Error())
		err = fmt.Errorf("the cached copy is unreadable: %w", err)
	}
	if c.url == "" && err != nil {
		c.why = "live reads are off (BRAMA_MODEL_CATALOG_URL=off) and " + err.Error() // data is nil: no usable copy
	}
	return c
}

// start reads a URL source in the background until ctx (its only cancel, SPEC §7.4): once, then once per stale lookup.
func (c *catalog) start(ctx context.Context, wg *sync.WaitGroup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.url != "" && c.wg == nil {
		c.ctx, c.wg, c.why = ctx, wg, "the first catalogue read has not finished"
		c.readLocked()
	}
}

// readLocked starts one background read, the one in flight (refreshing). Only a live ctx starts one, and serve waits on wg
// after its requests ended, so no read is added to wg while it is waited on. A good read is kept in the cache too.
func (c *catalog) readLocked() {
	c.refreshing = true
	c.wg.Go(func() {
		status, b, err := callEndpoint(c.ctx, c.client, http.MethodGet, c.url, nil, nil)
		if err == nil && status/100 != 2 {
			err = fmt.Errorf("HTTP status %d", status)
		}
		data, err := parseCatalog(b, err)
		c.mu.Lock()
		if c.refreshing = false; err == nil || c.ctx.Err() == nil { // shutting down is no catalogue failure
			c.settleLocked(data, err)
		}
		c.mu.Unlock()
		if err == nil && c.cachePath != "" { // outside the lock: no lookup waits on the disk
			if err := writeState(c.cachePath, catalogCache{c.now().UTC(), must(json.Marshal(data))}); err != nil {
				c.log.Warn("model_metadata_cache_write_failed", "cause", err.Error())
			}
		}
	})
}

// settleLocked records a read that ended now: a good one replaces memory, a failed one keeps it; either waits one TTL.
func (c *catalog) settleLocked(data catalogData, err error) {
	if c.nextTry = c.now().Add(c.ttl); err != nil {
		c.why = err.Error()
		c.log.Warn("model_catalog_read_failed", "cause", err.Error())
	} else {
		c.data = data
		c.log.Info("model_catalog_read", "vendors", len(data))
	}
}

// current is the catalogue usable now, or nil with the cause. A file is read on demand (SPEC §6.4),
// at once when changed while memory is empty; a URL due kicks one background read.
func (c *catalog) current() (catalogData, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	due := !c.now().Before(c.nextTry)
	if c.path != "" {
		fileID := "" // the file's size and modification time: they tell it changed
		if fi, err := os.Stat(c.path); err == nil {
			fileID = fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
		}
		if due || c.data == nil && fileID != c.fileID {
			c.fileID = fileID
			b, err := os.ReadFile(c.path)
			c.settleLocked(parseCatalog(b, cmp.Or(errors.Unwrap(err), err))) // a *fs.PathError's cause: not its path
		}
	} else if c.wg != nil && !c.refreshing && due && c.ctx.Err() == nil {
		c.readLocked()
	}
	if c.data == nil {
		return nil, "the model catalogue is unavailable: " + c.why
	}
	return c.data, ""
}

// lookup is the entry for model of p's catalogue vendor, or a short cause naming vendor/model.
func (c *catalog) lookup(p providerInfo, model string) (info modelInfo, ok bool, cause string) {
	if p.vendor == "" {
		return modelInfo{}, false, "the catalogue has no vendor for provider " + p.id
	}
	data, cause := c.current()
	if info, ok = data[p.vendor].Models[model]; ok && info.Limit.Output <= 0 {
		cause = fmt.Sprintf("the catalogue has no output limit for %s/%s", p.vendor, model)
	} else if !ok && data != nil {
		cause = fmt.Sprintf("the catalogue has no entry for %s/%s", p.vendor, model)
	}
	return info, ok, cause
}

// models lists provider's vendor's models, newest release first (unknown last), then by id (SPEC §7.3).
func (c *catalog) models(provider string) []modelInfo {
	data, _ := c.current() // parseCatalog leaves no vendor "": local-openai has none
	p, _ := lookupProvider(provider)
	return slices.SortedFunc(maps.Values(data[p.vendor].Models), func(a, b modelInfo) int {
		return cmp.Or(strings.Compare(b.ReleaseDate, a.ReleaseDate), strings.Compare(a.ID, b.ID))
	})
}

// errCatalogShape is wrapped by every parse failure of parseCatalog: the top level is not an object of vendor objects.
var errCatalogShape = errors.New("the model catalogue is not a JSON object of provider objects")

// parseCatalog reads api.json, vendor → {"models": {id → model}}, strict only at the top: the document
// grows, so what Brama does not understand (a member of the wrong type too) is left out. A failed read of the
// source (readErr) is its bare cause: errors quote neither the body, nor the path (it may lie outside the state
// directory, and /readyz shows them) nor the URL (its query may hold a key).
func parseCatalog(b []byte, readErr error) (catalogData, error) {
	var top map[string]json.RawMessage
	if readErr != nil {
		return nil, fmt.Errorf("catalogue read: %w", readErr)
	} else if err := json.Unmarshal(b, &top); err != nil || top == nil {
		return nil, fmt.Errorf("%w: %v", errCatalogShape, cmp.Or(err, errors.New("null")))
	}
	out := make(catalogData, len(top))
	for _, vendor := range slices.Sorted(maps.Keys(top)) { // sorted: a refusal names the same vendor every time
		var v struct{ Models map[string]json.RawMessage }
		raw := top[vendor] // a RawMessage starts at its value, never empty
		if raw[0] != '{' {
			return nil, fmt.Errorf("%w: provider %q is not an object", errCatalogShape, truncateUTF8(vendor, 64))
		}
		json.Unmarshal(raw, &v)
		out[vendor] = catalogVendor{map[string]modelInfo{}}
		for id, raw := range v.Models {
			var m modelInfo
			if id == "" || raw[0] != '{' {
				continue
			}
			json.Unmarshal(raw, &m)
			_, notDay := time.Parse("2006-01-02", m.ReleaseDate)
			if _, notMonth := time.Parse("2006-01", m.ReleaseDate); notDay != nil && notMonth != nil { // some carry only the month
				m.ReleaseDate = ""
			}
			for _, n := range []*float64{&m.Limit.Context, &m.Limit.Output} { // a positive whole token count, else 0 (unknown)
				if *n <= 0 || *n > math.MaxInt32 || *n != math.Trunc(*n) {
					*n = 0
				}
			}
			for _, s := range []*[]string{&m.Modalities.Input, &m.Modalities.Output} { // what was not a string decoded as ""
				*s = slices.DeleteFunc(*s, func(x string) bool { return x == "" })
			}
			m.ID = id
			out[vendor].Models[id] = m
		}
	}
	delete(out, "")
	return out, nil
}

// listedModel is one entry of GET /v1/models, in OpenAI's list shape.
type listedModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	State   string `json:"brama_state,omitempty"`
}

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

// perfRegistry keeps one entry per route ever served, written to perf.json at most every 30 s and at shutdown.
type perfRegistry struct{ persisted[perfEntry] }

// newPerfRegistry starts from perf.json; a bad one is logged and replaced at the next flush: telemetry never stops serving.
func newPerfRegistry(st state, sy sys) *perfRegistry {
	p := &perfRegistry{persisted: persisted[perfEntry]{sys: sy, every: 30 * time.Second, afterFunc: afterFunc,
		unplacedLog: "perf_stats_unplaced", failedLog: "perf_stats_flush_failed", entries: map[string]perfEntry{},
		doc: func(m map[string]perfEntry, now time.Time) any { return perfDocument{1, now.UTC(), m} }}}
	p.name, p.pathErr = st.path("perf telemetry", "perf.json")
	doc, _, err := (&stateFile[perfDocument]{role: "perf telemetry", path: p.name}).read() // name "": absent
	if err == nil {
		maps.Copy(p.entries, doc.Routes)
	} else if !errors.Is(err, errFileAbsent) {
		sy.log.Warn("perf_stats_unreadable", "cause", err.Error())
	}
	return p
}

// record adds one request for route. A failure counts only on a route that has served, so
// invented names leave nothing (SPEC §13; issue 10: 20,000 of them made /metrics 54 MB).
func (p *perfRegistry) record(route string, ok bool, latency time.Duration, outputTokens int) {
	ms := max(latency.Milliseconds(), 0)
	p.change(false, func(routes map[string]perfEntry, _ time.Time) {
		if e, served := routes[route]; served || ok {
			e.Count, e.Failures = e.Count+1, e.Failures+int64(boolCount(!ok))
			e.TotalLatencyMs, e.LastLatencyMs = e.TotalLatencyMs+ms, ms
			e.OutputTokens += int64(max(outputTokens, 0))
			if ok && latency > 0 && outputTokens > 0 {
				e.LastTokensPerS = float64(outputTokens) / latency.Seconds()
			}
			routes[route] = e
		}
	})
}

func (p *perfRegistry) snapshot() map[string]perfEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.entries)
}

// perfFamilies are the per-route metric families of /metrics, in output order.
var perfFamilies = []struct {
	name, typ, help string
	value           func(perfEntry) float64
}{
	{"brama_route_requests_total", "counter", "Requests served on the route.", func(e perfEntry) float64 { return float64(e.Count) }},
	{"brama_route_failures_total", "counter", "Requests on the route that ended in a refusal.", func(e perfEntry) float64 { return float64(e.Failures) }},
	{"brama_route_latency_milliseconds_total", "counter", "Sum of request latencies on the route, in milliseconds.", func(e perfEntry) float64 { return float64(e.TotalLatencyMs) }},
	{"brama_route_last_latency_milliseconds", "gauge", "Latency of the route's last request, in milliseconds.", func(e perfEntry) float64 { return float64(e.LastLatencyMs) }},
	{"brama_route_output_tokens_total", "counter", "Output tokens produced on the route.", func(e perfEntry) float64 { return float64(e.OutputTokens) }},
	{"brama_route_last_tokens_per_second", "gauge", "Output tokens per second of the route's last successful request.", func(e perfEntry) float64 { return e.LastTokensPerS }},
}

var promMetricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// writeMetrics renders the perf registry, then the extras (_total: a counter) in Prometheus text format 0.0.4,
// skipping a name outside the grammar or taken by a route family. Label values escape \, " and newline
// and must be valid UTF-8 (the exposition format).
func writeMetrics(w io.Writer, perf map[string]perfEntry, extra map[string]float64) {
	label := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	routes, extra := slices.Sorted(maps.Keys(perf)), maps.Clone(extra)
	for _, f := range perfFamilies {
		if len(routes) > 0 {
			fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		}
		for _, r := range routes {
			fmt.Fprintf(w, "%s{route=\"%s\"} %s\n", f.name, label.Replace(strings.ToValidUTF8(r, "\uFFFD")), formatMetric(f.value(perf[r])))
		}
		delete(extra, f.name)
	}
	for _, n := range slices.Sorted(maps.Keys(extra)) {
		if promMetricName.MatchString(n) {
			typ := pick(strings.HasSuffix(n, "_total"), "counter", "gauge")
			fmt.Fprintf(w, "# TYPE %s %s\n%s %s\n", n, typ, n, formatMetric(extra[n]))
		}
	}
}

// formatMetric is a value as Prometheus parses it: integers whole; %g spells NaN, +Inf and -Inf so.
func formatMetric(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%g", v)
}
