package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The route registry document (SPEC §4.1): its types, the one canonical
// encoding and the strict parser with every guard. The registry file and
// its writers are in registry.go; alias states and model resolution
// (SPEC §4.3, §5) in resolve.go.

// maxRegistryBytes is the largest registry document Brama reads or writes
// (SPEC §4.1).
const maxRegistryBytes = 1 << 20

// deploymentEndpoint is where a local deployment serves its
// OpenAI-compatible API.
type deploymentEndpoint struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// adapter is a named adapter (e.g. a LoRA) of a deployment; it is sent
// upstream under its own name.
type adapter struct {
	Name string `json:"name"`
}

// deployment is a local OpenAI-compatible model server the registry
// declares; a bare destination naming it (or one of its adapters) routes
// to local-openai/<name>.
type deployment struct {
	Name     string             `json:"name"`
	Endpoint deploymentEndpoint `json:"endpoint"`
	Model    string             `json:"model,omitempty"`    // upstream model name; "" means Name
	Adapters []adapter          `json:"adapters,omitempty"` // never empty-but-non-nil after parseRegistry
}

// routesDoc is one schema-1 registry document. parseRegistry always
// returns non-nil Deployments and Routes, so documents compare equal
// whatever spelling of "empty" the file used. Callers share parsed
// documents and must not modify them.
type routesDoc struct {
	SchemaVersion int               `json:"schema_version"`
	Deployments   []deployment      `json:"deployments"`
	Routes        map[string]string `json:"routes"`
}

// emptyRoutesDoc is the registry of an empty or absent file.
func emptyRoutesDoc() *routesDoc {
	return &routesDoc{SchemaVersion: 1, Deployments: []deployment{}, Routes: map[string]string{}}
}

// encodeRegistry is the one canonical encoding every writer commits: two
// space indentation, routes sorted by alias (encoding/json sorts map keys),
// [] and {} for empty members, and a trailing newline. Committing only this
// form is what makes `brama routes migrate` idempotent byte for byte.
func encodeRegistry(d *routesDoc) []byte {
	out := routesDoc{SchemaVersion: 1, Deployments: d.Deployments, Routes: d.Routes}
	if out.Deployments == nil {
		out.Deployments = []deployment{}
	}
	if out.Routes == nil {
		out.Routes = map[string]string{}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		panic("brama: encode registry: " + err.Error()) // strings and ints always marshal
	}
	return append(b, '\n')
}

// routesInvalidError says why a registry document is refused. Its text names
// the alias, deployment or field at fault and is safe to show an operator.
type routesInvalidError struct {
	reason string
}

func (e *routesInvalidError) Error() string { return e.reason }

func invalidf(format string, args ...any) error {
	return &routesInvalidError{reason: fmt.Sprintf(format, args...)}
}

var (
	aliasPattern    = regexp.MustCompile(`^[a-z0-9._/-]{1,128}$`)
	namePattern     = regexp.MustCompile(`^[a-z0-9._-]{1,128}$`) // deployments and adapters
	providerPattern = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)
	cgnatPrefix     = netip.MustParsePrefix("100.64.0.0/10")
)

// maxDestinationBytes bounds a destination, and the model part of a
// canonical route (SPEC §4.1, §5.1).
const maxDestinationBytes = 512

// parseRegistry reads a schema-1 registry document strictly and applies
// every guard of SPEC §4.1. An empty or whitespace-only document is the
// empty registry. Every error is a *routesInvalidError. Canonical
// destinations whose provider Brama does not know are accepted here (the
// alias is then capability_absent); only writers refuse them.
func parseRegistry(b []byte) (*routesDoc, error) {
	if len(b) > maxRegistryBytes {
		return nil, invalidf("registry is %d bytes; the limit is 1 MiB (%d bytes)", len(b), maxRegistryBytes)
	}
	if !utf8.Valid(b) {
		return nil, invalidf("registry is not valid UTF-8")
	}
	if len(trimJSONSpace(b)) == 0 {
		return emptyRoutesDoc(), nil
	}
	members, err := jsonObject(b, "registry")
	if err != nil {
		return nil, err
	}
	for _, k := range sortedKeys(members) {
		if k != "schema_version" && k != "deployments" && k != "routes" {
			return nil, invalidf("registry field %q is not part of schema 1; run brama routes migrate", clipName(k))
		}
	}
	doc := emptyRoutesDoc()
	if raw, ok := members["schema_version"]; ok {
		var v int
		if isJSONNull(raw) || json.Unmarshal(raw, &v) != nil || v != 1 {
			return nil, invalidf("registry field \"schema_version\" must be 1, not %s", truncateUTF8(string(raw), 32))
		}
	}
	if raw, ok := members["deployments"]; ok {
		var list []json.RawMessage
		if isJSONNull(raw) || json.Unmarshal(raw, &list) != nil {
			return nil, invalidf("registry field \"deployments\" must be an array of deployments")
		}
		for i, item := range list {
			d, err := parseDeployment(i, item)
			if err != nil {
				return nil, err
			}
			doc.Deployments = append(doc.Deployments, d)
		}
	}
	if raw, ok := members["routes"]; ok {
		var routes map[string]json.RawMessage
		if isJSONNull(raw) || json.Unmarshal(raw, &routes) != nil {
			return nil, invalidf("registry field \"routes\" must be an object mapping each alias to one destination")
		}
		for alias, v := range routes {
			var dest *string
			if json.Unmarshal(v, &dest) != nil || dest == nil {
				return nil, invalidf("registry route %q: the destination must be one string (there are no fallback lists)", clipName(alias))
			}
			doc.Routes[alias] = *dest
		}
	}
	if err := checkDocument(doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// parseDeployment reads deployments[i], refusing unknown members by name.
func parseDeployment(i int, raw json.RawMessage) (deployment, error) {
	var d deployment
	m, err := jsonMembers(raw)
	if err != nil {
		return d, invalidf("registry deployment #%d is not an object", i+1)
	}
	if json.Unmarshal(m["name"], &d.Name) != nil || isJSONNull(m["name"]) {
		return d, invalidf("registry deployment #%d has no string \"name\"", i+1)
	}
	label := fmt.Sprintf("registry deployment %q", clipName(d.Name))
	for _, k := range sortedKeys(m) {
		if k != "name" && k != "endpoint" && k != "model" && k != "adapters" {
			return d, invalidf("%s has unknown member %q", label, clipName(k))
		}
	}
	ep, err := jsonMembers(m["endpoint"])
	if err != nil {
		return d, invalidf("%s needs an \"endpoint\" object {\"host\",\"port\"}", label)
	}
	for _, k := range sortedKeys(ep) {
		if k != "host" && k != "port" {
			return d, invalidf("%s endpoint has unknown member %q", label, clipName(k))
		}
	}
	if isJSONNull(ep["host"]) || json.Unmarshal(ep["host"], &d.Endpoint.Host) != nil {
		return d, invalidf("%s endpoint needs a string \"host\"", label)
	}
	if isJSONNull(ep["port"]) || json.Unmarshal(ep["port"], &d.Endpoint.Port) != nil {
		return d, invalidf("%s endpoint needs an integer \"port\"", label)
	}
	if raw, ok := m["model"]; ok {
		if isJSONNull(raw) || json.Unmarshal(raw, &d.Model) != nil || d.Model == "" {
			return d, invalidf("%s member \"model\" must be a non-empty string (leave it out to use the name)", label)
		}
	}
	if raw, ok := m["adapters"]; ok {
		var list []json.RawMessage
		if isJSONNull(raw) || json.Unmarshal(raw, &list) != nil {
			return d, invalidf("%s member \"adapters\" must be an array of {\"name\"}", label)
		}
		for j, item := range list {
			am, err := jsonMembers(item)
			var a adapter
			if err != nil || isJSONNull(am["name"]) || json.Unmarshal(am["name"], &a.Name) != nil {
				return d, invalidf("%s adapter #%d must be an object with a string \"name\"", label, j+1)
			}
			for _, k := range sortedKeys(am) {
				if k != "name" {
					return d, invalidf("%s adapter %q has unknown member %q", label, clipName(a.Name), clipName(k))
				}
			}
			d.Adapters = append(d.Adapters, a)
		}
	}
	return d, nil
}

// checkDocument applies the §4.1 guards that look across the document:
// deployment names, endpoints, and every alias and its destination.
func checkDocument(doc *routesDoc) error {
	seen := map[string]bool{}
	for _, d := range doc.Deployments {
		label := fmt.Sprintf("registry deployment %q", clipName(d.Name))
		if !namePattern.MatchString(d.Name) {
			return invalidf("%s: a deployment name must match [a-z0-9._-]{1,128}", label)
		}
		if seen[d.Name] {
			return invalidf("%s is declared twice; deployment names must be unique", label)
		}
		seen[d.Name] = true
		if err := checkEndpoint(d.Endpoint); err != nil {
			return invalidf("%s: %v", label, err)
		}
		if d.Model != "" {
			if err := checkModelName(d.Model); err != nil {
				return invalidf("%s: model %v", label, err)
			}
		}
		for _, a := range d.Adapters {
			if !namePattern.MatchString(a.Name) {
				return invalidf("%s adapter %q: an adapter name must match [a-z0-9._-]{1,128}", label, clipName(a.Name))
			}
		}
	}
	for _, alias := range sortedKeys(doc.Routes) {
		if err := checkRoute(doc, alias, doc.Routes[alias]); err != nil {
			return err
		}
	}
	return nil
}

// checkEndpoint admits only an IPv4 loopback or 100.64.0.0/10 (CGNAT, as
// used by tailnets) literal and a real port: a registry edit must never
// point Brama's unauthenticated local-openai calls at the open internet.
func checkEndpoint(ep deploymentEndpoint) error {
	addr, err := netip.ParseAddr(ep.Host)
	if err != nil || !addr.Is4() || !(addr.IsLoopback() || cgnatPrefix.Contains(addr)) {
		return fmt.Errorf("endpoint host %q is not an IPv4 loopback or 100.64.0.0/10 literal", clipName(ep.Host))
	}
	if ep.Port < 1 || ep.Port > 65535 {
		return fmt.Errorf("endpoint port %d is not a port (1-65535)", ep.Port)
	}
	return nil
}

// checkModelName is §5.1's rule for the model part of a canonical route,
// also applied to a deployment's upstream model: 1..512 bytes, no control
// characters.
func checkModelName(m string) error {
	switch {
	case m == "":
		return errors.New("is empty")
	case len(m) > maxDestinationBytes:
		return fmt.Errorf("is %d bytes; the limit is %d", len(m), maxDestinationBytes)
	case hasControl(m):
		return errors.New("contains a control character")
	}
	return nil
}

func hasControl(s string) bool { return strings.IndexFunc(s, unicode.IsControl) >= 0 }

// checkAlias is the alias guard of SPEC §4.1. The selector names are
// refused so that an alias can never shadow them.
func checkAlias(alias string) error {
	if !aliasPattern.MatchString(alias) {
		return invalidf("registry alias %q must match [a-z0-9._/-]{1,128}", clipName(alias))
	}
	if alias == modeAny || alias == modeAnyVision {
		return invalidf("registry alias %q is a selector name and cannot be declared", alias)
	}
	return nil
}

// checkRoute applies every §4.1 guard to one alias and its destination in
// doc. It accepts a canonical destination of a provider Brama does not know;
// writers check that separately.
func checkRoute(doc *routesDoc, alias, dest string) error {
	if err := checkAlias(alias); err != nil {
		return err
	}
	label := fmt.Sprintf("registry route %q", clipName(alias))
	switch {
	case dest == "":
		return invalidf("%s: the destination is empty", label)
	case !utf8.ValidString(dest):
		return invalidf("%s: the destination is not valid UTF-8", label)
	case len(dest) > maxDestinationBytes:
		return invalidf("%s: the destination is %d bytes; the limit is %d", label, len(dest), maxDestinationBytes)
	case dest != strings.TrimSpace(dest):
		return invalidf("%s: destination %q has leading or trailing space", label, dest)
	case strings.Contains(dest, "*"):
		return invalidf("%s: destination %q contains \"*\"; wildcards are not routes", label, dest)
	case hasControl(dest):
		return invalidf("%s: destination %q contains a control character", label, dest)
	}
	if dest == modeBest {
		if alias == modeBest {
			return invalidf("%s must name a canonical route (provider/model), not best", label)
		}
		return nil
	}
	if provider, model, ok := strings.Cut(dest, "/"); ok {
		if !providerPattern.MatchString(provider) {
			return invalidf("%s: destination %q is not a canonical route: the provider must match [a-z0-9._-]{1,64}", label, dest)
		}
		if err := checkModelName(model); err != nil {
			return invalidf("%s: destination %q is not a canonical route: the model %v", label, dest, err)
		}
		if alias == modeBest && provider == "local-openai" {
			// local-openai/<name> is a deployment's canonical spelling, and
			// best is paid by subscriptions, which a deployment has none of.
			return invalidf("%s must name a canonical route of a subscription-capable provider, not deployment %q", label, dest)
		}
		return nil
	}
	if alias == modeBest {
		return invalidf("%s must name a canonical route (provider/model), not deployment %q", label, dest)
	}
	if _, _, n := doc.lookupLocal(dest); n != 1 {
		if n == 0 {
			return invalidf("%s: destination %q names no deployment or adapter", label, dest)
		}
		return invalidf("%s: destination %q names %d deployments or adapters; a bare name must name exactly one", label, dest, n)
	}
	return nil
}

// lookupLocal finds the deployment or adapter a bare name (or the model of
// local-openai/<name>) means, the upstream model name it is served under,
// and how many deployments and adapters carry that name.
func (doc *routesDoc) lookupLocal(name string) (dep deployment, upstream string, n int) {
	for _, d := range doc.Deployments {
		if d.Name == name {
			dep, upstream, n = d, d.Name, n+1
			if d.Model != "" {
				upstream = d.Model
			}
		}
		for _, a := range d.Adapters {
			if a.Name == name {
				dep, upstream, n = d, a.Name, n+1
			}
		}
	}
	return dep, upstream, n
}

// baseURL is the deployment's OpenAI-compatible endpoint (SPEC §4.1).
func (d deployment) baseURL() string {
	return "http://" + net.JoinHostPort(d.Endpoint.Host, strconv.Itoa(d.Endpoint.Port)) + "/v1"
}

// jsonObject refuses invalid JSON and duplicate keys at any depth (the
// shared checkDuplicateKeys: encoding/json would silently keep the last, so
// two readers of one file could disagree about an alias), then returns the
// members of the top-level object; what names the document in errors.
func jsonObject(b []byte, what string) (map[string]json.RawMessage, error) {
	// json.Valid first: its scanner refuses bad syntax, and nesting beyond
	// its depth limit, in one linear pass before the token walk.
	if !json.Valid(b) {
		var v any
		return nil, invalidf("%s is not valid JSON: %v", what, json.Unmarshal(b, &v))
	}
	if err := checkDuplicateKeys(json.NewDecoder(bytes.NewReader(b))); err != nil {
		return nil, invalidf("%s has a %s", what, clipName(err.Error()))
	}
	m, err := jsonMembers(b)
	if err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, invalidf("%s is not valid JSON: %v", what, err)
		}
		return nil, invalidf("%s must be one JSON object", what)
	}
	return m, nil
}

// jsonMembers decodes one JSON object into its raw members. Unlike decoding
// into a struct, keys match exactly (encoding/json matches struct fields
// case-insensitively, which would let "Name" pass as "name").
func jsonMembers(raw json.RawMessage) (map[string]json.RawMessage, error) {
	lead := trimJSONSpace(raw)
	if len(lead) == 0 || lead[0] != '{' {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, err
		}
		return nil, errors.New("not an object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// trimJSONSpace drops JSON's four whitespace bytes (not Unicode's) at both
// ends.
func trimJSONSpace(b []byte) []byte { return bytes.Trim(b, " \t\r\n") }

// clipName shortens a name from the file before it is quoted in an error:
// the reason is logged and may reach a client, and a name has no business
// being longer than its 128-byte pattern allows anyway.
func clipName(s string) string {
	if len(s) <= 128 {
		return s
	}
	return truncateUTF8(s, 128) + "…"
}

func isJSONNull(raw json.RawMessage) bool { return string(trimJSONSpace(raw)) == "null" }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
