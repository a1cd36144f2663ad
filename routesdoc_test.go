package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// specRegistry is the example document of SPEC §4.1.
const specRegistry = `{
  "schema_version": 1,
  "deployments": [
    {"name": "qwen-local", "endpoint": {"host": "127.0.0.1", "port": 11434}, "model": "qwen2.5:7b", "adapters": [{"name": "qwen-lora"}]}
  ],
  "routes": {
    "chat": "anthropic/claude-sonnet-4-5",
    "cheap": "qwen-local",
    "smart": "best"
  }
}`

// regDoc builds a registry document around routes with the SPEC example's
// deployment.
func regDoc(routes string) string {
	return `{"deployments":[{"name":"qwen-local","endpoint":{"host":"127.0.0.1","port":11434},"adapters":[{"name":"qwen-lora"}]}],"routes":` + routes + `}`
}

// regDeployment builds a registry document with one deployment object.
func regDeployment(dep string) string {
	return `{"deployments":[` + dep + `],"routes":{}}`
}

func TestParseRegistry(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    *routesDoc // checked when wantErr is ""
		wantErr string     // a substring of the refusal
	}{
		{name: "spec example", in: specRegistry, want: &routesDoc{
			SchemaVersion: 1,
			Deployments: []deployment{{
				Name: "qwen-local", Endpoint: deploymentEndpoint{Host: "127.0.0.1", Port: 11434},
				Model: "qwen2.5:7b", Adapters: []adapter{{Name: "qwen-lora"}},
			}},
			Routes: map[string]string{"chat": "anthropic/claude-sonnet-4-5", "cheap": "qwen-local", "smart": "best"},
		}},
		{name: "empty file", in: "", want: emptyRoutesDoc()},
		{name: "whitespace only", in: " \n\t\r\n", want: emptyRoutesDoc()},
		{name: "empty object", in: "{}", want: emptyRoutesDoc()},
		{name: "schema_version absent reads as 1", in: `{"routes":{"a":"openai/gpt-4o"}}`, want: &routesDoc{
			SchemaVersion: 1, Deployments: []deployment{}, Routes: map[string]string{"a": "openai/gpt-4o"},
		}},
		{name: "empty adapters list is no adapters", in: regDeployment(`{"name":"d","endpoint":{"host":"100.64.0.1","port":1},"adapters":[]}`), want: &routesDoc{
			SchemaVersion: 1, Deployments: []deployment{{Name: "d", Endpoint: deploymentEndpoint{Host: "100.64.0.1", Port: 1}}}, Routes: map[string]string{},
		}},
		{name: "unknown provider accepted by the reader", in: `{"routes":{"a":"nosuch/model"}}`, want: &routesDoc{
			SchemaVersion: 1, Deployments: []deployment{}, Routes: map[string]string{"a": "nosuch/model"},
		}},
		{name: "adapter as bare destination", in: regDoc(`{"lora":"qwen-lora"}`), want: func() *routesDoc {
			d, _ := parseRegistry([]byte(regDoc(`{}`)))
			d.Routes["lora"] = "qwen-lora"
			return d
		}()},

		{name: "unknown top-level field", in: `{"schema_version":1,"routes":{},"fallbacks":{"a":["b"]}}`,
			wantErr: `registry field "fallbacks" is not part of schema 1; run brama routes migrate`},
		{name: "empty top-level field name", in: `{"routes":{},"":{}}`, wantErr: `registry field "" is not part of schema 1; run brama routes migrate`},
		{name: "top-level field case differs", in: `{"Routes":{}}`, wantErr: `registry field "Routes" is not part of schema 1`},
		{name: "schema_version 2", in: `{"schema_version":2}`, wantErr: `"schema_version" must be 1`},
		{name: "schema_version string", in: `{"schema_version":"1"}`, wantErr: `"schema_version" must be 1`},
		{name: "top level array", in: `[]`, wantErr: "must be one JSON object"},
		{name: "top level null", in: `null`, wantErr: "must be one JSON object"},
		{name: "not JSON", in: `{"routes":`, wantErr: "not valid JSON"},
		{name: "two top-level numbers", in: `00`, wantErr: "not valid JSON"},
		{name: "nested deeper than the limit", in: `{"fallbacks":` + strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1) + `}`, wantErr: "nests deeper"},
		{name: "trailing value", in: `{} {}`, wantErr: "not valid JSON"},
		{name: "invalid UTF-8", in: "{\"routes\":{\"a\":\"openai/\xff\"}}", wantErr: "not valid UTF-8"},
		{name: "larger than 1 MiB", in: `{"routes":{}}` + strings.Repeat(" ", maxRegistryBytes), wantErr: "limit is 1 MiB"},
		{name: "duplicate top-level key", in: `{"routes":{},"routes":{}}`, wantErr: `duplicate key "routes"`},
		{name: "duplicate alias", in: `{"routes":{"a":"best","a":"openai/x"}}`, wantErr: `duplicate key "a"`},
		{name: "duplicate alias by escape", in: `{"routes":{"a":"best","\u0061":"best"}}`, wantErr: `duplicate key "a"`},
		{name: "duplicate deployment member", in: regDeployment(`{"name":"d","name":"e","endpoint":{"host":"127.0.0.1","port":1}}`), wantErr: `duplicate key "name"`},
		{name: "duplicate in second deployment endpoint", in: `{"deployments":[{"name":"a","endpoint":{"host":"127.0.0.1","port":1}},{"name":"b","endpoint":{"host":"127.0.0.1","port":1,"port":2}}]}`, wantErr: `duplicate key "port"`},
		{name: "deployments null", in: `{"deployments":null}`, wantErr: `"deployments" must be an array`},
		{name: "routes null", in: `{"routes":null}`, wantErr: `"routes" must be an object`},
		{name: "fallback list as destination", in: `{"routes":{"chat":["openai/a","openai/b"]}}`, wantErr: `route "chat": the destination must be one string`},
		{name: "deployment not an object", in: regDeployment(`"qwen"`), wantErr: "deployment #1 is not an object"},
		{name: "deployment without name", in: regDeployment(`{"endpoint":{"host":"127.0.0.1","port":1}}`), wantErr: `deployment #1 has no string "name"`},
		{name: "deployment unknown member", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"api_key":"x"}`), wantErr: `deployment "d" has unknown member "api_key"`},
		{name: "deployment member case differs", in: regDeployment(`{"Name":"d","name":"d","endpoint":{"host":"127.0.0.1","port":1}}`), wantErr: `deployment "d" has unknown member "Name"`},
		{name: "deployment member with an empty name", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"":1}`), wantErr: `deployment "d" has unknown member ""`},
		{name: "endpoint member case differs", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","Port":1,"port":1}}`), wantErr: `deployment "d" endpoint has unknown member "Port"`},
		{name: "adapter member case differs", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"adapters":[{"name":"l","Name":"l"}]}`), wantErr: `adapter "l" has unknown member "Name"`},
		{name: "endpoint unknown member", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1,"tls":true}}`), wantErr: `deployment "d" endpoint has unknown member "tls"`},
		{name: "endpoint missing", in: regDeployment(`{"name":"d"}`), wantErr: `deployment "d" needs an "endpoint"`},
		{name: "endpoint public host", in: regDeployment(`{"name":"d","endpoint":{"host":"8.8.8.8","port":1}}`), wantErr: `deployment "d": endpoint host "8.8.8.8" is not an IPv4 loopback`},
		{name: "endpoint hostname", in: regDeployment(`{"name":"d","endpoint":{"host":"localhost","port":1}}`), wantErr: `endpoint host "localhost"`},
		{name: "endpoint IPv6 loopback", in: regDeployment(`{"name":"d","endpoint":{"host":"::1","port":1}}`), wantErr: `endpoint host "::1"`},
		{name: "endpoint beyond 100.64/10", in: regDeployment(`{"name":"d","endpoint":{"host":"100.128.0.1","port":1}}`), wantErr: `endpoint host "100.128.0.1"`},
		{name: "endpoint port zero", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":0}}`), wantErr: `deployment "d": endpoint port 0`},
		{name: "endpoint port too large", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":70000}}`), wantErr: `endpoint port 70000`},
		{name: "endpoint port fraction", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1.5}}`), wantErr: `deployment "d" endpoint needs an integer "port"`},
		{name: "deployment name pattern", in: regDeployment(`{"name":"Qwen","endpoint":{"host":"127.0.0.1","port":1}}`), wantErr: `deployment "Qwen": a deployment name must match`},
		{name: "deployment names unique", in: `{"deployments":[{"name":"d","endpoint":{"host":"127.0.0.1","port":1}},{"name":"d","endpoint":{"host":"127.0.0.2","port":1}}]}`, wantErr: `deployment "d" is declared twice`},
		{name: "deployment empty model", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"model":""}`), wantErr: `deployment "d" member "model" must be a non-empty string`},
		{name: "adapter unknown member", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"adapters":[{"name":"l","path":"/x"}]}`), wantErr: `adapter "l" has unknown member "path"`},
		{name: "adapter name pattern", in: regDeployment(`{"name":"d","endpoint":{"host":"127.0.0.1","port":1},"adapters":[{"name":"L"}]}`), wantErr: `adapter "L": an adapter name must match`},
		{name: "alias pattern", in: regDoc(`{"Chat":"best"}`), wantErr: `alias "Chat" must match`},
		{name: "alias too long", in: regDoc(`{"` + strings.Repeat("a", 129) + `":"best"}`), wantErr: "must match [a-z0-9._/-]{1,128}"},
		{name: "alias any", in: regDoc(`{"any":"best"}`), wantErr: `alias "any" is a selector name`},
		{name: "alias any-vision-capable", in: regDoc(`{"any-vision-capable":"best"}`), wantErr: `alias "any-vision-capable" is a selector name`},
		{name: "alias best to best", in: regDoc(`{"best":"best"}`), wantErr: `route "best" must name a canonical route`},
		{name: "alias best to deployment", in: regDoc(`{"best":"qwen-local"}`), wantErr: `route "best" must name a canonical route (provider/model), not deployment "qwen-local"`},
		{name: "alias best to a deployment's canonical form", in: regDoc(`{"best":"local-openai/qwen-local"}`), wantErr: `route "best" must name a canonical route of a subscription-capable provider, not deployment "local-openai/qwen-local"`},
		{name: "destination empty", in: regDoc(`{"a":""}`), wantErr: `route "a": the destination is empty`},
		{name: "destination untrimmed", in: regDoc(`{"a":" openai/x"}`), wantErr: `route "a": destination " openai/x" has leading or trailing space`},
		{name: "destination wildcard", in: regDoc(`{"a":"openai/*"}`), wantErr: `route "a": destination "openai/*" contains "*"`},
		{name: "destination control character", in: regDoc(`{"a":"openai/x\u0007"}`), wantErr: `route "a": destination "openai/x\a" contains a control character`},
		{name: "destination too long", in: regDoc(`{"a":"openai/` + strings.Repeat("m", 510) + `"}`), wantErr: `route "a": the destination is 517 bytes`},
		{name: "destination bad provider", in: regDoc(`{"a":"OpenAI/x"}`), wantErr: `route "a": destination "OpenAI/x" is not a canonical route`},
		{name: "destination empty model", in: regDoc(`{"a":"openai/"}`), wantErr: `route "a": destination "openai/" is not a canonical route: the model is empty`},
		{name: "bare name matching nothing", in: regDoc(`{"a":"llama"}`), wantErr: `route "a": destination "llama" names no deployment or adapter`},
		{name: "bare name matching two", in: `{"deployments":[{"name":"x","endpoint":{"host":"127.0.0.1","port":1}},{"name":"y","endpoint":{"host":"127.0.0.1","port":2},"adapters":[{"name":"x"}]}],"routes":{"a":"x"}}`, wantErr: `route "a": destination "x" names 2 deployments or adapters`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRegistry([]byte(tt.in))
			if tt.wantErr != "" {
				var ri *routesInvalidError
				if err == nil || !errors.As(err, &ri) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseRegistry error = %v, want a *routesInvalidError containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseRegistry: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("document mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseRegistryUnknownFieldExactMessage(t *testing.T) {
	_, err := parseRegistry([]byte(`{"schema_version":1,"deployments":[],"routes":{},"fallbacks":{}}`))
	want := `registry field "fallbacks" is not part of schema 1; run brama routes migrate`
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want exactly %q", err, want)
	}
}

func TestEncodeRegistryCanonical(t *testing.T) {
	tests := []struct {
		name string
		doc  *routesDoc
		want string
	}{
		{name: "zero document", doc: &routesDoc{}, want: "{\n  \"schema_version\": 1,\n  \"deployments\": [],\n  \"routes\": {}\n}\n"},
		{name: "routes sorted, optional members omitted", doc: &routesDoc{
			Deployments: []deployment{{Name: "d", Endpoint: deploymentEndpoint{Host: "127.0.0.1", Port: 8000}}},
			Routes:      map[string]string{"z": "best", "a": "d"},
		}, want: `{
  "schema_version": 1,
  "deployments": [
    {
      "name": "d",
      "endpoint": {
        "host": "127.0.0.1",
        "port": 8000
      }
    }
  ],
  "routes": {
    "a": "d",
    "z": "best"
  }
}
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(encodeRegistry(tt.doc))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("encoding mismatch (-want +got):\n%s", diff)
			}
			back, err := parseRegistry([]byte(got))
			if err != nil {
				t.Fatalf("canonical bytes do not parse: %v", err)
			}
			if again := string(encodeRegistry(back)); again != got {
				t.Errorf("re-encoding changed the bytes:\n%s", again)
			}
		})
	}
}

func FuzzParseRegistry(f *testing.F) {
	f.Add([]byte(specRegistry))
	f.Add([]byte(""))
	f.Add([]byte(`{"schema_version":1,"routes":{},"fallbacks":{}}`))
	f.Add([]byte(`{"routes":{"a":"best","a":"openai/x"}}`))
	f.Add([]byte(regDoc(`{"a":"qwen-lora","b":"local-openai/qwen-local","best":"codex/gpt-5"}`)))
	f.Add([]byte(`{"deployments":[{"name":"d","endpoint":{"host":"100.64.0.1","port":1},"model":"m<&>","adapters":[]}],"routes":{"x":"nosuch/\u00e9\ud800"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := parseRegistry(data)
		if err != nil {
			var ri *routesInvalidError
			if !errors.As(err, &ri) {
				t.Fatalf("unclassified error %T: %v", err, err)
			}
			return
		}
		enc := encodeRegistry(doc)
		back, err := parseRegistry(enc)
		if err != nil {
			t.Fatalf("accepted document re-encodes to bytes that do not parse: %v\n%s", err, enc)
		}
		if diff := cmp.Diff(doc, back); diff != "" {
			t.Fatalf("round trip changed the document (-first +second):\n%s", diff)
		}
		if again := encodeRegistry(back); string(again) != string(enc) {
			t.Fatalf("canonical encoding is not stable:\n%s\n%s", enc, again)
		}
	})
}
