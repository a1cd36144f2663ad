#!/usr/bin/env bash
# Declare aliases with the CLI and read them back with GET /v1/aliases.
. "$(dirname "$0")/lib.sh"
start_stub
start_brama
port=${STUB_URL##*:}
# A local deployment (an OpenAI-compatible server on loopback) is declared by
# command; aliases can then route to it by its name.
"$BRAMA" deployments add stub-local -port "$port" -model stub-model
expect "deployments list" "$("$BRAMA" deployments list | awk 'NR==2 {print $1, $2}')" "stub-local http://127.0.0.1:$port/v1"
"$BRAMA" routes set chat anthropic/claude-sonnet-4-5
"$BRAMA" routes set cheap stub-local
body=$(curl -s -H "Authorization: Bearer $TOKEN" "$BRAMA_URL/v1/aliases")
expect "chat has no anthropic key" "$(echo "$body" | jq -r '.aliases[] | select(.alias=="chat") | .state')" "capability_absent"
expect "cheap serves" "$(echo "$body" | jq -r '.aliases[] | select(.alias=="cheap") | .state')" "serving"
expect "unserviceable count" "$(echo "$body" | jq -r .unserviceable)" "1"
"$BRAMA" routes list
printf '%s\n' sk-example-not-a-real-key | "$BRAMA" credentials set anthropic
expect "credentials list names providers only" "$("$BRAMA" credentials list)" "anthropic"
expect "clients list shows no token" "$("$BRAMA" clients list | grep -c "$TOKEN")" "0"
"$BRAMA" routes rm cheap
"$BRAMA" deployments rm stub-local
