#!/usr/bin/env bash
# Donate a subscription (an agent's own API key) through the admin API with
# `brama subscription add`, list it, and show the key lives only in the vault.
. "$(dirname "$0")/lib.sh"
start_brama
export BRAMA_TOKEN=$TOKEN # every `brama subscription …` is a client of the daemon
key="sk-example-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
# The key comes on stdin (never as a flag: flags show up in ps).
id=$(printf '%s\n' "$key" | "$BRAMA" subscription add -gateway "$BRAMA_URL" -provider kimi -agent a1 -label work)
expect "id shape" "$(echo "$id" | grep -cE '^sub_[0-9a-f]{16}$')" "1"
"$BRAMA" subscription list -gateway "$BRAMA_URL" -agent a1
body=$("$BRAMA" subscription list -gateway "$BRAMA_URL" -agent a1 -json)
expect "listed" "$(echo "$body" | jq -r '.subscriptions[0].id')" "$id"
expect "active" "$(echo "$body" | jq -r '.subscriptions[0].status')" "active"
# The agent itself lists through a bearer bound to it.
app=$("$BRAMA" clients add app-a1 -agent a1 2>/dev/null)
own=$(curl -s -H "Authorization: Bearer $app" "$BRAMA_URL/v1/subscriptions/a1")
expect "agent's own listing" "$(echo "$own" | jq -r '.subscriptions[0].label')" "work"
other=$(curl -s -H "Authorization: Bearer $app" "$BRAMA_URL/v1/subscriptions/someone-else")
expect "another agent's listing" "$(echo "$other" | jq -r .error.code)" "forbidden"
# The secret is in the vault and nowhere else.
expect "overlay holds metadata only" "$(grep -c -- "$key" "$BRAMA_STATE_DIR/donated-subscriptions.json" || true)" "0"
expect "listing holds no secret" "$(echo "$body$own" | grep -c -- "$key" || true)" "0"
expect "vault holds the key" "$(jq -r --arg id "$id" '.subscriptions[$id].api_key' "$BRAMA_STATE_DIR/vault.json")" "$key"
expect "overlay item" "$(jq -c '.items[0] | [.id==$id, .provider, .agent_id, .label]' --arg id "$id" "$BRAMA_STATE_DIR/donated-subscriptions.json")" '[true,"kimi","a1","work"]'
