package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// The model catalogue (SPEC §6.4): a file read on demand, or a URL read in the background
// into the model metadata cache. Advisory: no route needs it, no request waits on it.

const ( // SPEC §16
	defaultCatalogURL = "https://models.dev/api.json"
	defaultCatalogTTL = 900 * time.Second
	catalogCacheFile  = "model-metadata.json"
)

// modelInfo is what Brama keeps of a catalogue model, in api.json's shape.
// Slices are shared with memory (replaced whole): callers must not modify them.
type modelInfo struct {
	ID          string            `json:"id"`
	ReleaseDate string            `json:"release_date,omitempty"` // "YYYY-MM-DD" (or "YYYY-MM"); "" when unknown
	Limit       catalogLimit      `json:"limit"`
	Modalities  catalogModalities `json:"modalities"`
}

// catalogLimit is a model's token limits; 0 when unknown.
type catalogLimit struct {
	Context int `json:"context,omitempty"`
	Output  int `json:"output,omitempty"`
}

// catalogModalities is what a model takes and gives; nil when unknown.
type catalogModalities struct {
	Input  []string `json:"input,omitempty"`
	Output []string `json:"output,omitempty"`
}

// catalogData is a catalogue in memory: vendor → model id → info.
type catalogData = map[string]map[string]modelInfo

// catalogVendors maps a provider id to the catalogue's vendor key where they
// differ (SPEC §7.3, and models.dev's own keys for together and fireworks);
// local-openai serves whatever a deployment runs: none.
var catalogVendors = map[string]string{
	"claude-code": "anthropic", "codex": "openai", "openai-responses": "openai",
	"kimi": "moonshotai", "together": "togetherai", "fireworks": "fireworks-ai", "local-openai": "",
}

func catalogVendor(provider string) string {
	if v, ok := catalogVendors[provider]; ok {
		return v
	}
	return provider
}

// catalog is the model metadata of SPEC §6.4 and its sources.
type catalog struct {
	path      string // BRAMA_MODEL_CATALOG_PATH; wins over url
	url       string // live source; "" when path is set or live reads are off
	ttl       time.Duration
	cachePath string       // the model metadata cache; "" without a state directory or for a file source
	client    *http.Client // the provider client: no timeout of Brama's own (SPEC §7.4)
	log       *slog.Logger
	now       func() time.Time

	testingOnlyReadDone func() // runs after each background read settled; nil in production

	mu         sync.Mutex    // guards the fields below
	data       catalogData   // nil when absent
	loadedAt   time.Time     // fetch time of data; zero means "age unknown"
	lastTry    time.Time     // when the last read (good or bad) settled
	lastErr    error         // the last failed read, nil after a good one
	fileID     string        // a file source's fileID at the last read
	reads      int           // source reads attempted, for tests and logs
	kick       chan struct{} // wakes the background reader; nil until start
	refreshing bool          // a background read is queued or running (single flight)
	cacheErr   error         // why the cache could not supply data
}

// newCatalog configures the catalogue (SPEC §16) and, for a URL, fills memory from the
// cache; a file is read by the first lookup, a URL by start.
func newCatalog(st state, getenv func(string) string, client *http.Client, log *slog.Logger, now func() time.Time) *catalog {
	const ttlName = "BRAMA_MODEL_CATALOG_TTL_SECS"
	ttl, err := envSeconds(getenv, ttlName, 1, defaultCatalogTTL)
	if err != nil {
		log.Warn("model_catalog_ttl_invalid", "value", strings.TrimSpace(getenv(ttlName)),
			"default_secs", int(defaultCatalogTTL/time.Second))
	}
	c := &catalog{client: client, log: log, now: now, ttl: ttl}
	if c.path = strings.TrimSpace(getenv("BRAMA_MODEL_CATALOG_PATH")); c.path == "" {
		c.url = cmp.Or(strings.TrimSpace(getenv("BRAMA_MODEL_CATALOG_URL")), defaultCatalogURL)
		if strings.EqualFold(c.url, "off") {
			c.url = ""
		}
		c.loadCache(st)
	}
	return c
}

// start runs the background reader of a URL source until ctx (its only
// cancel, SPEC §7.4) is done; wg lets run wait for it.
func (c *catalog) start(ctx context.Context, wg *sync.WaitGroup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.url == "" || c.kick != nil {
		return // nothing to read, or already started
	}
	c.kick, c.refreshing = make(chan struct{}, 1), true
	wg.Add(1)
	go func(kick <-chan struct{}) { // reads once, then once per kick from a stale lookup
		defer wg.Done()
		for ctx.Err() == nil {
			c.readOnce(ctx)
			select {
			case <-ctx.Done():
			case <-kick:
			}
		}
	}(c.kick)
}

// readOnce fetches the URL into memory and, when good, the cache file; a
// failure keeps whatever memory held.
func (c *catalog) readOnce(ctx context.Context) {
	data, err := c.fetch(ctx)
	now := c.now()
	c.mu.Lock()
	c.refreshing = false
	if err != nil && ctx.Err() != nil { // shutting down: not a catalogue failure
		c.mu.Unlock()
		return
	}
	c.settleLocked("url", data, err, now)
	c.mu.Unlock()
	if err == nil {
		c.log.Info("model_catalog_read", "source", "url", "vendors", len(data))
		c.writeCache(data, now)
	}
	if c.testingOnlyReadDone != nil {
		c.testingOnlyReadDone()
	}
}

// fetch is one whole read of the catalogue URL; errors never quote the body.
func (c *catalog) fetch(ctx context.Context) (catalogData, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		err = ue.Err // its URL may hold a key in the query, as a call's does
	}
	if err != nil {
		return nil, fmt.Errorf("catalogue URL: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.client.Do(req)
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		err = ue.Err // its URL may hold a key in the query
	}
	if err != nil {
		return nil, fmt.Errorf("catalogue read: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body) // whole, even after an error status, so the connection is reused
	switch {
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("catalogue read: HTTP status %d", resp.StatusCode)
	case err != nil:
		return nil, fmt.Errorf("catalogue read: %w", err)
	}
	return parseCatalog(b)
}

// catalogCache is $STATE/model-metadata.json: the last good catalogue,
// re-encoded with only the fields Brama keeps, and its fetch time.
type catalogCache struct {
	FetchedAt time.Time       `json:"fetched_at"`
	Body      json.RawMessage `json:"body"`
}

// writeCache keeps data in the model metadata cache, if it has a place.
func (c *catalog) writeCache(data catalogData, fetchedAt time.Time) {
	if c.cachePath == "" {
		return
	}
	if err := writeState(c.cachePath, catalogCache{FetchedAt: fetchedAt.UTC(), Body: marshalCatalog(data)}); err != nil {
		c.log.Warn("model_metadata_cache_write_failed", "cause", err.Error())
	}
}

// loadCache places the model metadata cache and fills memory from it.
func (c *catalog) loadCache(st state) {
	name, err := st.path("model metadata cache", catalogCacheFile)
	if err != nil {
		c.cacheErr = err
		c.log.Warn("model_metadata_cache_unplaced", "cause", err.Error())
		return
	}
	c.cachePath = name
	b, _, err := readGuarded("model metadata cache", name)
	var cc catalogCache
	if err == nil {
		err = json.Unmarshal(b, &cc)
	}
	var data catalogData
	if err == nil {
		data, err = parseCatalog(cc.Body)
	}
	switch {
	case errors.Is(err, errFileAbsent):
		c.cacheErr = errors.New("there is no cached copy")
	case err != nil:
		c.cacheErr = fmt.Errorf("the cached copy is unreadable: %w", err)
		c.log.Warn("model_metadata_cache_unreadable", "cause", err.Error())
	case cc.FetchedAt.After(c.now()):
		c.data = data // a fetch time from the future has no usable age
	default:
		c.data, c.loadedAt = data, cc.FetchedAt
	}
}

// settleLocked records a read of source that ended at now: a good one
// replaces memory, a failed one keeps it and waits one TTL.
func (c *catalog) settleLocked(source string, data catalogData, err error, now time.Time) {
	c.reads++
	c.lastTry, c.lastErr = now, err
	if err != nil {
		c.log.Warn("model_catalog_read_failed", "source", source, "cause", err.Error())
		return
	}
	c.data, c.loadedAt = data, now
}

// current is the catalogue usable now, or nil with the cause. A file is read on demand; a URL's
// memory absent or past the TTL kicks one background read. A failed read waits a TTL.
func (c *catalog) current() (catalogData, string) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	stale := func() bool { return c.data == nil || c.loadedAt.IsZero() || now.Sub(c.loadedAt) >= c.ttl }
	mayTry := c.lastTry.IsZero() || now.Sub(c.lastTry) >= c.ttl
	switch {
	case c.path != "" && (stale() && mayTry || c.data == nil && fileID(c.path) != c.fileID): // on demand (SPEC §6.4)
		c.fileID = fileID(c.path)
		b, err := os.ReadFile(c.path)
		var data catalogData
		if err == nil {
			data, err = parseCatalog(b)
		} else {
			if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
				err = pe.Err // the path is outside the state directory; /readyz must not show it
			}
			err = fmt.Errorf("BRAMA_MODEL_CATALOG_PATH: %w", err)
		}
		c.settleLocked("file", data, err, now)
	case c.path == "" && c.kick != nil && !c.refreshing && stale() && mayTry:
		c.refreshing = true
		c.kick <- struct{}{} // never blocks: refreshing admits one kick at a time to its one slot
	}
	const unavailable = "the model catalogue is unavailable: "
	switch {
	case c.data != nil:
		return c.data, ""
	case c.lastErr != nil:
		return nil, unavailable + c.lastErr.Error()
	case c.url == "":
		return nil, unavailable + "live reads are off (BRAMA_MODEL_CATALOG_URL=off) and " + c.cacheErr.Error()
	case c.kick == nil:
		return nil, unavailable + "no catalogue read has been started"
	}
	return nil, unavailable + "the first catalogue read has not finished"
}

// fileID tells a changed file: its size and modification time ("" unreadable).
func fileID(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	return fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
}

// lookup is the entry for model of provider's vendor, or a short cause.
func (c *catalog) lookup(provider, model string) (info modelInfo, ok bool, cause string) {
	vendor := catalogVendor(provider)
	if vendor == "" {
		return modelInfo{}, false, fmt.Sprintf("the catalogue has no vendor for provider %s", provider)
	}
	data, cause := c.current()
	if data == nil {
		return modelInfo{}, false, cause
	}
	if info, ok = data[vendor][model]; !ok {
		return modelInfo{}, false, fmt.Sprintf("the catalogue has no entry for %s/%s", vendor, model)
	}
	return info, true, ""
}

// outputLimit is §6.4's max_tokens lookup: the model's output limit, or 0
// with the cause.
func (c *catalog) outputLimit(provider, model string) (int, string) {
	info, ok, cause := c.lookup(provider, model)
	if ok && info.Limit.Output <= 0 {
		cause = fmt.Sprintf("the catalogue has no output limit for %s/%s", catalogVendor(provider), model)
	}
	return info.Limit.Output, cause
}

// models lists the models of provider's vendor, newest release first, then
// by id (SPEC §7.3); unknown release dates sort last.
func (c *catalog) models(provider string) []modelInfo {
	vendor := catalogVendor(provider)
	if vendor == "" {
		return nil
	}
	data, _ := c.current()
	return slices.SortedFunc(maps.Values(data[vendor]), func(a, b modelInfo) int {
		return cmp.Or(strings.Compare(b.ReleaseDate, a.ReleaseDate), strings.Compare(a.ID, b.ID))
	})
}

// errCatalogShape marks a catalogue whose top level is not a JSON object of
// vendor objects; parseCatalog wraps it in every error it returns.
var errCatalogShape = errors.New("the model catalogue is not a JSON object of provider objects")

// parseCatalog reads api.json, vendor → {"models": {id → model}}, strict only at the top: the
// document grows, so what Brama does not understand is left out. The key is a model's id.
func parseCatalog(b []byte) (catalogData, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil || top == nil {
		return nil, fmt.Errorf("%w: %v", errCatalogShape, cmp.Or(err, errors.New("null")))
	}
	out := make(catalogData, len(top))
	for vendor, raw := range top {
		var p map[string]json.RawMessage
		if err := json.Unmarshal(raw, &p); err != nil || p == nil {
			return nil, fmt.Errorf("%w: provider %q is not an object", errCatalogShape, truncateUTF8(vendor, 64))
		}
		if vendor == "" {
			continue
		}
		var models map[string]json.RawMessage
		json.Unmarshal(p["models"], &models) // not an object: no models
		vm := make(map[string]modelInfo, len(models))
		for id, mraw := range models {
			if info, ok := parseCatalogModel(id, mraw); ok {
				vm[id] = info
			}
		}
		out[vendor] = vm
	}
	return out, nil
}

// parseCatalogModel keeps the fields of SPEC §6.4 from one model object;
// ok=false when it is not an object or has no id.
func parseCatalogModel(id string, raw json.RawMessage) (modelInfo, bool) {
	var m struct {
		ReleaseDate string `json:"release_date"`
		Limit       struct{ Context, Output any }
		Modalities  struct{ Input, Output any }
	}
	if id == "" || !bytes.HasPrefix(raw, []byte("{")) { // a RawMessage starts at its value
		return modelInfo{}, false
	}
	json.Unmarshal(raw, &m) // a member of the wrong type is left out, the rest still read
	_, day := time.Parse("2006-01-02", m.ReleaseDate)
	_, month := time.Parse("2006-01", m.ReleaseDate) // some entries carry only the month; both sort as strings
	if day != nil && month != nil {
		m.ReleaseDate = ""
	}
	return modelInfo{
		ID: id, ReleaseDate: m.ReleaseDate,
		Limit:      catalogLimit{catalogCount(m.Limit.Context), catalogCount(m.Limit.Output)},
		Modalities: catalogModalities{catalogStrings(m.Modalities.Input), catalogStrings(m.Modalities.Output)},
	}, true
}

// catalogCount is a positive whole token count, else 0 (unknown).
func catalogCount(v any) int {
	f, _ := v.(float64)
	if f <= 0 || f > math.MaxInt32 || f != math.Trunc(f) {
		return 0
	}
	return int(f)
}

// catalogStrings keeps the strings of a JSON array; nil when none.
func catalogStrings(v any) (out []string) {
	items, _ := v.([]any)
	for _, it := range items {
		if s, ok := it.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// marshalCatalog encodes data back into the api.json shape with only the
// fields Brama keeps, for the model metadata cache; parseCatalog reads it back.
func marshalCatalog(data catalogData) []byte {
	out := make(map[string]map[string]map[string]modelInfo, len(data)) // vendor → "models" → id → model
	for vendor, models := range data {
		out[vendor] = map[string]map[string]modelInfo{"models": models}
	}
	b, _ := json.Marshal(out) // only maps, strings, ints and string slices: it cannot fail
	return b
}
