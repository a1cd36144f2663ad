#!/usr/bin/env bash
# Set and delete an alias over the admin API; each write is journaled.
. "$(dirname "$0")/lib.sh"
start_brama
auth=(-H "Authorization: Bearer $TOKEN")
out=$(curl -s "${auth[@]}" -X PUT -d '{"alias":"chat","route":"openai/gpt-4o"}' "$BRAMA_URL/v1/admin/routes")
expect "PUT ok" "$(echo "$out" | jq -r .ok)" "true"
expect "PUT committed" "$(echo "$out" | jq -r .routes.routes.chat)" "openai/gpt-4o"
out=$(curl -s "${auth[@]}" -X DELETE -d '{"alias":"chat"}' "$BRAMA_URL/v1/admin/routes")
expect "DELETE ok" "$(echo "$out" | jq -r '.routes.routes | length')" "0"
# Deleting it again is alias_unknown, with details.
out=$(curl -s "${auth[@]}" -X DELETE -d '{"alias":"chat"}' "$BRAMA_URL/v1/admin/routes")
expect "DELETE unknown" "$(echo "$out" | jq -r .error.code)" "alias_unknown"
expect "route_change lines" "$(grep -c '"kind":"route_change"' "$BRAMA_STATE_DIR/journal.jsonl")" "2"
"$BRAMA" journal check
