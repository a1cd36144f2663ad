#!/usr/bin/env bash
# Declare aliases with the CLI and read them back with GET /v1/aliases.
. "$(dirname "$0")/lib.sh"
start_stub
start_brama
port=${STUB_URL##*:}
# A local deployment (an OpenAI-compatible server on loopback) is declared in
# the registry file itself; aliases can then be set with the CLI.
cat >"$BRAMA_STATE_DIR/routes.json" <<JSON
{"schema_version":1,"deployments":[{"name":"stub-local","endpoint":{"host":"127.0.0.1","port":$port},"model":"stub-model"}],"routes":{}}
JSON
chmod 600 "$BRAMA_STATE_DIR/routes.json"
"$BRAMA" routes set chat anthropic/claude-sonnet-4-5
"$BRAMA" routes set cheap stub-local
body=$(curl -s -H "Authorization: Bearer $TOKEN" "$BRAMA_URL/v1/aliases")
expect "chat has no anthropic key" "$(echo "$body" | jq -r '.aliases[] | select(.alias=="chat") | .state')" "capability_absent"
expect "cheap serves" "$(echo "$body" | jq -r '.aliases[] | select(.alias=="cheap") | .state')" "serving"
expect "unserviceable count" "$(echo "$body" | jq -r .unserviceable)" "1"
"$BRAMA" routes list
