package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The route registry document (SPEC §4.1): its types, canonical encoding,
// strict reading and every guard. registry.go holds the file that carries it.

const (
	registryRole        = "route registry" // names the file in guard errors
	maxRegistryBytes    = 1 << 20
	maxDestinationBytes = 512 // a destination, and the model of a canonical route (§4.1, §5.1)
)

var (
	aliasPattern    = regexp.MustCompile(`^([a-z0-9._/-]{1,128}|[a-z0-9._-]{1,128}\*)$`) // exact, or a prefix alias
	namePattern     = regexp.MustCompile(`^[a-z0-9._-]{1,128}$`)                         // deployments and adapters
	providerPattern = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)
	cgnatPrefix     = netip.MustParsePrefix("100.64.0.0/10")
)

// Routing modes (SPEC §5.3) and alias states (SPEC §4.3).
const (
	modeAny          = "any"
	modeAnyVision    = "any-vision-capable"
	modeBest         = "best"
	modeSubscription = "subscription"
	modeAlias        = "alias"
	modeDirect       = "direct"

	stateServing          = "serving"
	stateNoRoute          = "no_route"
	stateCapabilityAbsent = "capability_absent"
	stateRoutesInvalid    = "routes_file_invalid"
)

// deployment is a local OpenAI-compatible server; a bare destination naming it or one of
// its adapters (e.g. a LoRA) routes to local-openai/<name> (SPEC §4.1).
type (
	deployment struct {
		Name     string             `json:"name"`
		Endpoint deploymentEndpoint `json:"endpoint"`
		Model    string             `json:"model,omitempty"`    // upstream model name; "" means Name
		Adapters []adapter          `json:"adapters,omitempty"` // never empty-but-non-nil after parseRegistry
	}
	deploymentEndpoint struct {
		Host string `json:"host"`
		Port int    `json:"port"`
	}
	adapter struct {
		Name string `json:"name"`
	}
)

// routesDoc is one schema-1 registry document. Parsed documents always have
// non-nil Deployments and Routes, and are shared: callers must not modify them.
type routesDoc struct {
	SchemaVersion int               `json:"schema_version"`
	Deployments   []deployment      `json:"deployments"`
	Routes        map[string]string `json:"routes"`
}

func emptyRoutesDoc() *routesDoc {
	return &routesDoc{SchemaVersion: 1, Deployments: []deployment{}, Routes: map[string]string{}}
}

// encodeRegistry is the one canonical encoding every writer commits (two
// space indent, sorted routes, [] and {} when empty), so migrate is idempotent.
func encodeRegistry(d *routesDoc) []byte {
	out := emptyRoutesDoc()
	if d.Deployments != nil {
		out.Deployments = d.Deployments
	}
	if d.Routes != nil {
		out.Routes = d.Routes
	}
	b, _ := marshalState(out) // strings and ints always marshal
	return b
}

// routesInvalidError says why a registry document is refused, naming the
// alias, deployment or field at fault; safe to show an operator.
type routesInvalidError struct{ error }

func invalidf(format string, args ...any) error {
	return &routesInvalidError{fmt.Errorf(format, args...)}
}

// parseRegistry reads a document under every guard of SPEC §4.1. Unknown
// providers pass (capability_absent); only writers refuse them.
func parseRegistry(b []byte) (*routesDoc, error) {
	m, err := registryMembers(b)
	if err != nil {
		return nil, err
	}
	return validateRegistry(m) // nil members: the empty registry
}

// registryTooBig is SPEC §4.1's 1 MiB bound, checked on a file's size before it is read.
func registryTooBig(size int64) error {
	if size > maxRegistryBytes {
		return invalidf("registry is %d bytes; the limit is 1 MiB (%d bytes)", size, maxRegistryBytes)
	}
	return nil
}

// registryMembers decodes b strictly (two readers must never disagree about an alias) into
// raw members, nil when empty: raw, as encoding/json folds case and errors must name the fault.
func registryMembers(b []byte) (map[string]json.RawMessage, error) {
	if err := registryTooBig(int64(len(b))); err != nil {
		return nil, err
	}
	if len(bytes.Trim(b, " \t\r\n")) == 0 { // JSON's whitespace, not Unicode's
		return nil, nil
	}
	var m map[string]json.RawMessage
	err := decodeStrict("registry", b, &m)
	switch {
	case err == nil && m != nil:
		return m, nil
	case utf8.Valid(b) && !json.Valid(b):
		return nil, invalidf("registry is not valid JSON: %v", json.Unmarshal(b, new(any)))
	case err == nil || errors.As(err, new(*json.UnmarshalTypeError)):
		return nil, invalidf("registry must be one JSON object")
	}
	return nil, invalidf("%s", clipName(err.Error()))
}

// validateRegistry builds the document from its members under every guard
// of SPEC §4.1: deployments in order, then routes by alias.
func validateRegistry(m map[string]json.RawMessage) (*routesDoc, error) {
	if k := unknownMember(m, "schema_version", "deployments", "routes"); k != "" {
		return nil, invalidf("registry field %s is not part of schema 1; run brama routes migrate", k)
	}
	doc := emptyRoutesDoc()
	var deps []json.RawMessage
	var routes map[string]json.RawMessage
	switch {
	case m["schema_version"] != nil && (!jsonValue(m["schema_version"], &doc.SchemaVersion) || doc.SchemaVersion != 1):
		return nil, invalidf("registry field \"schema_version\" must be 1, not %s", truncateUTF8(string(m["schema_version"]), 32))
	case m["deployments"] != nil && !jsonValue(m["deployments"], &deps):
		return nil, invalidf("registry field \"deployments\" must be an array of deployments")
	case m["routes"] != nil && !jsonValue(m["routes"], &routes):
		return nil, invalidf("registry field \"routes\" must be an object mapping each alias to one destination")
	}
	for i, raw := range deps {
		d, err := parseDeployment(i, raw, doc.Deployments)
		if err != nil {
			return nil, err
		}
		doc.Deployments = append(doc.Deployments, d)
	}
	for _, alias := range slices.Sorted(maps.Keys(routes)) {
		var dest string
		if !jsonValue(routes[alias], &dest) {
			return nil, invalidf("registry route %q: the destination must be one string (there are no fallback lists)", clipName(alias))
		}
		if err := checkRoute(doc, alias, dest); err != nil {
			return nil, err
		}
		doc.Routes[alias] = dest
	}
	return doc, nil
}

// parseDeployment reads deployments[i], declared after before. Its endpoint is an IPv4 loopback
// or tailnet literal: an edit must never point unauthenticated calls at the internet.
func parseDeployment(i int, raw json.RawMessage, before []deployment) (d deployment, err error) {
	m, ok := jsonObject(raw)
	if !ok {
		return d, invalidf("registry deployment #%d is not an object", i+1)
	}
	if !jsonValue(m["name"], &d.Name) {
		return d, invalidf("registry deployment #%d has no string \"name\"", i+1)
	}
	label := fmt.Sprintf("registry deployment %q", clipName(d.Name))
	ep, epOK := jsonObject(m["endpoint"])
	var adapters []json.RawMessage
	k, epk := unknownMember(m, "name", "endpoint", "model", "adapters"), unknownMember(ep, "host", "port")
	switch {
	case k != "":
		return d, invalidf("%s has unknown member %s", label, k)
	case !epOK:
		return d, invalidf("%s needs an \"endpoint\" object {\"host\",\"port\"}", label)
	case epk != "":
		return d, invalidf("%s endpoint has unknown member %s", label, epk)
	case !jsonValue(ep["host"], &d.Endpoint.Host):
		return d, invalidf("%s endpoint needs a string \"host\"", label)
	case !jsonValue(ep["port"], &d.Endpoint.Port):
		return d, invalidf("%s endpoint needs an integer \"port\"", label)
	case m["model"] != nil && (!jsonValue(m["model"], &d.Model) || d.Model == ""):
		return d, invalidf("%s member \"model\" must be a non-empty string (leave it out to use the name)", label)
	case m["adapters"] != nil && !jsonValue(m["adapters"], &adapters):
		return d, invalidf("%s member \"adapters\" must be an array of {\"name\"}", label)
	}
	for j, item := range adapters {
		var a adapter
		am, ok := jsonObject(item)
		switch {
		case !ok || !jsonValue(am["name"], &a.Name):
			return d, invalidf("%s adapter #%d must be an object with a string \"name\"", label, j+1)
		case unknownMember(am, "name") != "":
			return d, invalidf("%s adapter %q has unknown member %s", label, clipName(a.Name), unknownMember(am, "name"))
		case !namePattern.MatchString(a.Name):
			return d, invalidf("%s adapter %q: an adapter name must match [a-z0-9._-]{1,128}", label, clipName(a.Name))
		}
		d.Adapters = append(d.Adapters, a)
	}
	addr, err := netip.ParseAddr(d.Endpoint.Host)
	switch modelErr := checkModelName(d.Model); {
	case !namePattern.MatchString(d.Name):
		return d, invalidf("%s: a deployment name must match [a-z0-9._-]{1,128}", label)
	case slices.ContainsFunc(before, func(o deployment) bool { return o.Name == d.Name }):
		return d, invalidf("%s is declared twice; deployment names must be unique", label)
	case err != nil || !addr.Is4() || !(addr.IsLoopback() || cgnatPrefix.Contains(addr)):
		return d, invalidf("%s: endpoint host %q is not an IPv4 loopback or 100.64.0.0/10 literal",
			label, clipName(d.Endpoint.Host))
	case d.Endpoint.Port < 1 || d.Endpoint.Port > 65535:
		return d, invalidf("%s: endpoint port %d is not a port (1-65535)", label, d.Endpoint.Port)
	case d.Model != "" && modelErr != nil:
		return d, invalidf("%s: model %v", label, modelErr)
	}
	return d, nil
}

// jsonObject decodes a member decodeStrict has read as an object, jsonValue
// as a present non-null v; unknownMember quotes m's first member not in known.
func jsonObject(raw json.RawMessage) (m map[string]json.RawMessage, ok bool) {
	return m, json.Unmarshal(raw, &m) == nil && m != nil
}

func jsonValue(raw json.RawMessage, v any) bool {
	return string(raw) != "null" && json.Unmarshal(raw, v) == nil
}

func unknownMember(m map[string]json.RawMessage, known ...string) string {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(known, k) {
			return strconv.Quote(clipName(k))
		}
	}
	return ""
}

// checkModelName is §5.1's rule for the model of a canonical route, also
// applied to a deployment's upstream model.
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

// checkAlias is the alias guard of SPEC §4.1; no alias may shadow a selector.
func checkAlias(alias string) error {
	if !aliasPattern.MatchString(alias) {
		return invalidf("registry alias %q must match [a-z0-9._/-]{1,128}, or [a-z0-9._-]{1,128} then * for a prefix alias", clipName(alias))
	}
	if alias == modeAny || alias == modeAnyVision {
		return invalidf("registry alias %q is a selector name and cannot be declared", alias)
	}
	return nil
}

// checkRoute applies every §4.1 guard to one alias and its destination in
// doc; a canonical destination of an unknown provider passes.
func checkRoute(doc *routesDoc, alias, dest string) error {
	if err := checkAlias(alias); err != nil {
		return err
	}
	label := fmt.Sprintf("registry route %q", clipName(alias))
	provider, model, canonical := strings.Cut(dest, "/")
	modelErr := checkModelName(model)
	_, _, n := doc.lookupLocal(dest)
	switch {
	case dest == "":
		return invalidf("%s: the destination is empty", label)
	case !utf8.ValidString(dest):
		return invalidf("%s: the destination is not valid UTF-8", label)
	case len(dest) > maxDestinationBytes:
		return invalidf("%s: the destination is %d bytes; the limit is %d", label, len(dest), maxDestinationBytes)
	case dest != strings.TrimSpace(dest):
		return invalidf("%s: destination %q has leading or trailing space", label, dest)
	case strings.Contains(dest, "*") && !(strings.HasSuffix(alias, "*") && canonical && model == "*"):
		return invalidf("%s: destination %q contains \"*\"; only a prefix alias (ending in *) may route to <provider>/*", label, dest)
	case hasControl(dest):
		return invalidf("%s: destination %q contains a control character", label, dest)
	case dest == modeBest && alias == modeBest:
		return invalidf("%s must name a canonical route (provider/model), not best", label)
	case dest == modeBest:
		return nil
	case canonical && !providerPattern.MatchString(provider):
		return invalidf("%s: destination %q is not a canonical route: the provider must match [a-z0-9._-]{1,64}", label, dest)
	case canonical && modelErr != nil:
		return invalidf("%s: destination %q is not a canonical route: the model %v", label, dest, modelErr)
	case canonical && alias == modeBest && provider == "local-openai": // best is paid by subscriptions
		return invalidf("%s must name a canonical route of a subscription-capable provider, not deployment %q", label, dest)
	case canonical:
		return nil
	case alias == modeBest:
		return invalidf("%s must name a canonical route (provider/model), not deployment %q", label, dest)
	case n == 0:
		return invalidf("%s: destination %q names no deployment or adapter", label, dest)
	case n > 1:
		return invalidf("%s: destination %q names %d deployments or adapters; a bare name must name exactly one", label, dest, n)
	}
	return nil
}

// match is what name declares (SPEC §4.1, §5.1): its exact alias's destination, else the
// longest matching prefix alias's, where <provider>/* becomes <provider>/name. A name with
// "/" or "*" matches no prefix alias: "o*" must not take over openai/... canonical routes.
func (doc *routesDoc) match(name string) (dest string, ok bool) {
	if dest, ok = doc.Routes[name]; ok && !strings.HasSuffix(name, "*") {
		return dest, true
	}
	if strings.ContainsAny(name, "/*") || checkModelName(name) != nil {
		return "", false
	}
	longest := ""
	for alias, d := range doc.Routes {
		if prefix, ok := strings.CutSuffix(alias, "*"); ok && len(alias) > len(longest) && strings.HasPrefix(name, prefix) {
			longest, dest = alias, d
		}
	}
	if provider, ok := strings.CutSuffix(dest, "/*"); ok {
		dest = provider + "/" + name
	}
	return dest, longest != ""
}

// lookupLocal finds the deployment or adapter a bare name means, its
// upstream model name, and how many deployments and adapters carry the name.
func (doc *routesDoc) lookupLocal(name string) (dep deployment, upstream string, n int) {
	for _, d := range doc.Deployments {
		if d.Name == name {
			dep, upstream, n = d, cmp.Or(d.Model, d.Name), n+1
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

// clipName shortens a name from the file before an error quotes it: the
// reason is logged and may reach a client.
func clipName(s string) string {
	if len(s) <= 128 {
		return s
	}
	return truncateUTF8(s, 128) + "…"
}
