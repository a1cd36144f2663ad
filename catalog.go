package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of SPEC §16 for the model catalogue (§6.4).
const (
	defaultCatalogURL = "https://models.dev/api.json"
	defaultCatalogTTL = 900 * time.Second
	catalogCacheFile  = "model-metadata.json"
)

// modelInfo is what Brama keeps of one catalogue model (SPEC §6.4). The
// catalogue is advisory: nothing here ever makes a route available.
// Input and Output are shared with the catalogue's memory copy, which is
// replaced whole and never changed in place; callers must not modify them.
type modelInfo struct {
	ID           string
	ReleaseDate  string   // "YYYY-MM-DD" (or "YYYY-MM"); "" when unknown
	OutputLimit  int      // limit.output; 0 when unknown
	ContextLimit int      // limit.context; 0 when unknown
	Input        []string // modalities.input; nil when unknown
	Output       []string // modalities.output; nil when unknown
}

// catalogVendor maps a Brama provider id to the catalogue's vendor key
// (SPEC §7.3). local-openai serves whatever the deployment runs, so it has
// no vendor and the catalogue knows nothing about it.
func catalogVendor(provider string) string {
	switch provider {
	case "claude-code":
		return "anthropic"
	case "codex", "openai-responses":
		return "openai"
	case "kimi":
		return "moonshotai"
	case "local-openai", "":
		return ""
	}
	return provider
}

// catalog is the model metadata of SPEC §6.4: a file read on demand, or a
// URL read in the background, kept in memory for a TTL and (for a URL) in
// $STATE/model-metadata.json. Requests never wait for a network read.
type catalog struct {
	path   string // BRAMA_MODEL_CATALOG_PATH; wins over url
	url    string // live source; "" when path is set or live reads are off
	ttl    time.Duration
	st     state
	client *http.Client
	log    *slog.Logger
	now    func() time.Time

	// testingOnlyReadDone runs after each background read has settled
	// (memory and cache updated). Nil in production.
	testingOnlyReadDone func()

	mu         sync.Mutex                      // guards the fields below
	data       map[string]map[string]modelInfo // vendor → model id → info; nil when absent
	loadedAt   time.Time                       // fetch time of data; zero means "age unknown"
	lastTry    time.Time                       // when the last read (good or bad) settled
	lastErr    error                           // the last failed read, nil after a good one
	reads      int                             // source reads attempted, for tests and logs
	kick       chan struct{}                   // wakes the background reader; nil until start
	refreshing bool                            // a background read is queued or running (single flight)
	cacheTried bool                            // the cache file was consulted once already
	cacheErr   error                           // why the cache could not supply data
	unplaced   bool                            // model_metadata_cache_unplaced was logged
}

// newCatalog configures the catalogue from the environment (SPEC §16).
// client is the provider HTTP client: it has no timeout and none is added
// (SPEC §7.4). No read happens here: a file is read by the first lookup, a
// URL by start.
func newCatalog(st state, getenv func(string) string, client *http.Client, log *slog.Logger, now func() time.Time) *catalog {
	if client == nil {
		client = &http.Client{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	c := &catalog{st: st, client: client, log: log, now: now, ttl: defaultCatalogTTL}
	if v := strings.TrimSpace(getenv("BRAMA_MODEL_CATALOG_TTL_SECS")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > math.MaxInt32 {
			log.Warn("model_catalog_ttl_invalid", "value", v, "default_secs", int(defaultCatalogTTL/time.Second))
		} else {
			c.ttl = time.Duration(n) * time.Second
		}
	}
	c.path = strings.TrimSpace(getenv("BRAMA_MODEL_CATALOG_PATH"))
	if c.path == "" {
		c.url = strings.TrimSpace(getenv("BRAMA_MODEL_CATALOG_URL"))
		switch {
		case c.url == "":
			c.url = defaultCatalogURL
		case strings.EqualFold(c.url, "off"):
			c.url = ""
		}
	}
	return c
}

// start runs the background reader for a URL source: one read now, then one
// whenever a lookup finds memory older than the TTL. It exits when ctx is
// done; wg lets run wait for it. The read's only cancel is ctx: Brama adds
// no deadline of its own (SPEC §7.4).
func (c *catalog) start(ctx context.Context, wg *sync.WaitGroup) {
	if c.url == "" {
		return
	}
	c.mu.Lock()
	if c.kick != nil {
		c.mu.Unlock()
		return // already started
	}
	kick := make(chan struct{}, 1)
	c.kick = kick
	c.refreshing = true
	c.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.loop(ctx, kick)
	}()
}

// loop reads once, then waits for a kick or the end of ctx.
func (c *catalog) loop(ctx context.Context, kick <-chan struct{}) {
	for {
		if ctx.Err() != nil {
			return
		}
		c.readOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
	}
}

// readOnce fetches the URL, publishes the result to memory and, when good,
// to the cache file. A failure keeps whatever memory held.
func (c *catalog) readOnce(ctx context.Context) {
	data, err := c.fetch(ctx)
	if err != nil && ctx.Err() != nil {
		c.mu.Lock()
		c.refreshing = false
		c.mu.Unlock()
		return // shutting down: not a catalogue failure
	}
	now := c.now()
	c.mu.Lock()
	c.reads++
	c.lastTry = now
	c.refreshing = false
	c.lastErr = err
	if err == nil {
		c.data, c.loadedAt = data, now
	}
	c.mu.Unlock()
	if err != nil {
		c.log.Warn("model_catalog_read_failed", "source", "url", "cause", err.Error())
	} else {
		c.log.Info("model_catalog_read", "source", "url", "vendors", len(data))
		c.writeCache(data, now)
	}
	if c.testingOnlyReadDone != nil {
		c.testingOnlyReadDone()
	}
}

// fetch is one whole read of the catalogue URL. The error never quotes the
// response body.
func (c *catalog) fetch(ctx context.Context) (map[string]map[string]modelInfo, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return nil, fmt.Errorf("catalogue URL: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("catalogue read: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		io.Copy(io.Discard, resp.Body) // let the connection be reused
		return nil, fmt.Errorf("catalogue read: HTTP status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("catalogue read: %w", err)
	}
	return parseCatalog(b)
}

// catalogCache is the shape of $STATE/model-metadata.json: the last good
// catalogue (re-encoded with only the fields Brama keeps) and its fetch time.
type catalogCache struct {
	FetchedAt time.Time       `json:"fetched_at"`
	Body      json.RawMessage `json:"body"`
}

// writeCache keeps data in the model metadata cache. Without a state
// directory it logs the refusal once and the catalogue lives in memory only.
func (c *catalog) writeCache(data map[string]map[string]modelInfo, fetchedAt time.Time) {
	c.mu.Lock()
	name, err := c.cachePathLocked()
	c.mu.Unlock()
	if err != nil {
		return
	}
	b, err := marshalState(catalogCache{FetchedAt: fetchedAt.UTC(), Body: marshalCatalog(data)})
	if err == nil {
		err = writeFileAtomic(name, b)
	}
	if err != nil {
		c.log.Warn("model_metadata_cache_write_failed", "cause", err.Error())
	}
}

// cachePathLocked names the cache file, logging
// model_metadata_cache_unplaced the first time there is no state directory.
// c.mu is held.
func (c *catalog) cachePathLocked() (string, error) {
	name, err := c.st.path("model metadata cache", catalogCacheFile)
	if err != nil && !c.unplaced {
		c.unplaced = true
		c.log.Warn("model_metadata_cache_unplaced", "cause", err.Error())
	}
	return name, err
}

// loadCacheLocked fills memory from the cache file, once. c.mu is held; the
// file is local, so no request waits on the network.
func (c *catalog) loadCacheLocked(now time.Time) {
	c.cacheTried = true
	name, err := c.cachePathLocked()
	if err != nil {
		c.cacheErr = err
		return
	}
	b, _, err := readGuarded("model metadata cache", name)
	if errors.Is(err, errFileAbsent) {
		c.cacheErr = errors.New("there is no cached copy")
		return
	}
	var cc catalogCache
	if err == nil {
		err = json.Unmarshal(b, &cc)
	}
	var data map[string]map[string]modelInfo
	if err == nil {
		data, err = parseCatalog(cc.Body)
	}
	if err != nil {
		c.cacheErr = fmt.Errorf("the cached copy is unreadable: %w", err)
		c.log.Warn("model_metadata_cache_unreadable", "cause", err.Error())
		return
	}
	c.data, c.loadedAt = data, cc.FetchedAt
	if cc.FetchedAt.After(now) {
		c.loadedAt = time.Time{} // a fetch time from the future has no usable age
	}
}

// readFileLocked reads the catalogue file (SPEC §6.4: on demand). A failed
// re-read keeps the older memory copy. c.mu is held.
func (c *catalog) readFileLocked(now time.Time) {
	c.reads++
	c.lastTry = now
	b, err := os.ReadFile(c.path)
	var data map[string]map[string]modelInfo
	if err == nil {
		data, err = parseCatalog(b)
	} else {
		// The path is outside the state directory; /readyz must not show it.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		err = fmt.Errorf("BRAMA_MODEL_CATALOG_PATH: %w", err)
	}
	c.lastErr = err
	if err != nil {
		c.log.Warn("model_catalog_read_failed", "source", "file", "cause", err.Error())
		return
	}
	c.data, c.loadedAt = data, now
}

// staleLocked reports whether memory is absent or older than the TTL, and
// mayTryLocked whether a read may start (a failure waits one TTL).
func (c *catalog) staleLocked(now time.Time) bool {
	return c.data == nil || c.loadedAt.IsZero() || now.Sub(c.loadedAt) >= c.ttl
}

func (c *catalog) mayTryLocked(now time.Time) bool {
	return c.lastTry.IsZero() || now.Sub(c.lastTry) >= c.ttl
}

// current is the catalogue a request may use right now, or nil with the
// cause. It reads a file source on demand; for a URL source it never waits:
// memory, else the cache file, else unknown, and a stale memory copy kicks
// one background read.
func (c *catalog) current() (map[string]map[string]modelInfo, string) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.path != "" {
		if c.data == nil || (c.staleLocked(now) && c.mayTryLocked(now)) {
			c.readFileLocked(now)
		}
	} else {
		if c.data == nil && !c.cacheTried {
			c.loadCacheLocked(now)
		}
		if c.kick != nil && !c.refreshing && c.staleLocked(now) && c.mayTryLocked(now) {
			c.refreshing = true
			select {
			case c.kick <- struct{}{}:
			default:
			}
		}
	}
	if c.data == nil {
		return nil, "the model catalogue is unavailable: " + c.unavailableLocked()
	}
	return c.data, ""
}

// unavailableLocked says why memory is empty. c.mu is held.
func (c *catalog) unavailableLocked() string {
	switch {
	case c.lastErr != nil:
		return c.lastErr.Error()
	case c.path != "":
		return "the catalogue file has not been read"
	case c.url == "":
		why := "there is no cached copy"
		if c.cacheErr != nil {
			why = c.cacheErr.Error()
		}
		return "live reads are off (BRAMA_MODEL_CATALOG_URL=off) and " + why
	case c.kick == nil:
		return "no catalogue read has been started"
	}
	return "the first catalogue read has not finished"
}

// lookup is the catalogue's entry for model of provider's vendor. ok=false
// comes with a short cause for messages and logs.
func (c *catalog) lookup(provider, model string) (info modelInfo, ok bool, cause string) {
	vendor := catalogVendor(provider)
	if vendor == "" {
		return modelInfo{}, false, fmt.Sprintf("the catalogue has no vendor for provider %s", provider)
	}
	data, cause := c.current()
	if data == nil {
		return modelInfo{}, false, cause
	}
	info, ok = data[vendor][model]
	if !ok {
		return modelInfo{}, false, fmt.Sprintf("the catalogue has no entry for %s/%s", vendor, model)
	}
	return info, true, ""
}

// outputLimit is §6.4's max_tokens lookup: the model's own output limit, or
// 0 with the cause. The caller decides whether to omit the field or refuse.
func (c *catalog) outputLimit(provider, model string) (int, string) {
	info, ok, cause := c.lookup(provider, model)
	if !ok {
		return 0, cause
	}
	if info.OutputLimit <= 0 {
		return 0, fmt.Sprintf("the catalogue has no output limit for %s/%s", catalogVendor(provider), model)
	}
	return info.OutputLimit, ""
}

// models lists the models of provider's vendor, newest release first, then
// by id (SPEC §7.3); unknown release dates sort last.
func (c *catalog) models(provider string) []modelInfo {
	vendor := catalogVendor(provider)
	if vendor == "" {
		return nil
	}
	data, _ := c.current()
	var out []modelInfo
	for _, m := range data[vendor] {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b modelInfo) int {
		if a.ReleaseDate != b.ReleaseDate {
			return strings.Compare(b.ReleaseDate, a.ReleaseDate)
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// available is the /readyz view: false with a sentence when no catalogue
// can be used right now.
func (c *catalog) available() (bool, string) {
	data, cause := c.current()
	return data != nil, cause
}

// errCatalogShape marks a catalogue whose top level is not a JSON object of
// vendor objects; parseCatalog wraps it in every error it returns.
var errCatalogShape = errors.New("the model catalogue is not a JSON object of provider objects")

// parseCatalog reads the models.dev api.json shape: vendor → {"models":
// {id → model}}. It is strict only about that skeleton's top level; below
// it, anything Brama does not understand (unknown members, a member of the
// wrong type, a model that is not an object) is left out rather than
// failing the whole catalogue, because the upstream document grows.
// The map key, not the inner "id", is a model's id.
func parseCatalog(b []byte) (map[string]map[string]modelInfo, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil || top == nil {
		if err == nil {
			err = errors.New("null")
		}
		return nil, fmt.Errorf("%w: %v", errCatalogShape, err)
	}
	out := make(map[string]map[string]modelInfo, len(top))
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
		ReleaseDate json.RawMessage `json:"release_date"`
		Limit       json.RawMessage `json:"limit"`
		Modalities  json.RawMessage `json:"modalities"`
	}
	if id == "" || json.Unmarshal(raw, &m) != nil || string(raw) == "null" {
		return modelInfo{}, false
	}
	info := modelInfo{ID: id}
	var date string
	if json.Unmarshal(m.ReleaseDate, &date) == nil && catalogDate(date) {
		info.ReleaseDate = date
	}
	var limit struct{ Context, Output json.RawMessage }
	if json.Unmarshal(m.Limit, &limit) == nil {
		info.ContextLimit = catalogCount(limit.Context)
		info.OutputLimit = catalogCount(limit.Output)
	}
	var mod struct{ Input, Output json.RawMessage }
	if json.Unmarshal(m.Modalities, &mod) == nil {
		info.Input = catalogStrings(mod.Input)
		info.Output = catalogStrings(mod.Output)
	}
	return info, true
}

// catalogDate accepts "YYYY-MM-DD" and the "YYYY-MM" some entries carry;
// both sort correctly as strings.
func catalogDate(s string) bool {
	if _, err := time.Parse("2006-01-02", s); err == nil {
		return true
	}
	_, err := time.Parse("2006-01", s)
	return err == nil
}

// catalogCount is a positive whole token count, else 0 (unknown).
func catalogCount(raw json.RawMessage) int {
	var f float64
	if json.Unmarshal(raw, &f) != nil || f <= 0 || f > math.MaxInt32 || f != math.Trunc(f) {
		return 0
	}
	return int(f)
}

// catalogStrings keeps the string elements of a JSON array; nil when none.
func catalogStrings(raw json.RawMessage) []string {
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil
	}
	var out []string
	for _, it := range items {
		var s string
		if json.Unmarshal(it, &s) == nil {
			out = append(out, s)
		}
	}
	return out
}

// marshalCatalog encodes data back into the api.json shape with only the
// fields Brama keeps; parseCatalog reads it back to the same value. It is
// what the model metadata cache holds.
func marshalCatalog(data map[string]map[string]modelInfo) []byte {
	type limitWire struct {
		Context int `json:"context,omitempty"`
		Output  int `json:"output,omitempty"`
	}
	type modalitiesWire struct {
		Input  []string `json:"input,omitempty"`
		Output []string `json:"output,omitempty"`
	}
	type modelWire struct {
		ID          string          `json:"id"`
		ReleaseDate string          `json:"release_date,omitempty"`
		Limit       *limitWire      `json:"limit,omitempty"`
		Modalities  *modalitiesWire `json:"modalities,omitempty"`
	}
	type vendorWire struct {
		ID     string               `json:"id"`
		Models map[string]modelWire `json:"models"`
	}
	out := make(map[string]vendorWire, len(data))
	for vendor, models := range data {
		vw := vendorWire{ID: vendor, Models: make(map[string]modelWire, len(models))}
		for id, m := range models {
			mw := modelWire{ID: id, ReleaseDate: m.ReleaseDate}
			if m.ContextLimit > 0 || m.OutputLimit > 0 {
				mw.Limit = &limitWire{Context: m.ContextLimit, Output: m.OutputLimit}
			}
			if len(m.Input) > 0 || len(m.Output) > 0 {
				mw.Modalities = &modalitiesWire{Input: m.Input, Output: m.Output}
			}
			vw.Models[id] = mw
		}
		out[vendor] = vw
	}
	b, err := json.Marshal(out)
	if err != nil {
		// Only maps, strings, ints and slices of strings: Marshal cannot fail.
		panic("brama: marshal catalogue: " + err.Error())
	}
	return b
}
