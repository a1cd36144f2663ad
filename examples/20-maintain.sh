#!/usr/bin/env bash
# Ask the daemon for a maintenance pass (SPEC §11.2): with nothing to
# maintain it is ok (exit 0); a kimi subscription whose provider (here the
# stub, which publishes no usage report) refuses the read makes it not ok
# (exit 1), records a failed read on the row and never makes a completion.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_KIMI_BASE_URL=$STUB_URL
start_brama
export BRAMA_TOKEN=$TOKEN
gw=(-gateway "$BRAMA_URL")

"$BRAMA" maintain "${gw[@]}"
expect "empty pass is ok" "$("$BRAMA" maintain "${gw[@]}" -json | jq -c '[.ok, .usage.subscriptions, .credentials.subscriptions]')" '[true,0,0]'

key="example-kimi-key-0123456789"
id=$(echo "$key" | "$BRAMA" subscription add "${gw[@]}" -provider kimi -agent a1)
set +e
"$BRAMA" maintain "${gw[@]}"
code=$?
body=$("$BRAMA" maintain "${gw[@]}" -json)
set -e
expect "a failed read exits 1" "$code" "1"
expect "the failure names the subscription" "$(echo "$body" | jq -r '.usage.failed[0] | .subscription_id + " " + .provider')" "$id kimi"
expect "the failure names the status" "$(echo "$body" | jq '.usage.failed[0].error | test("HTTP 404")')" "true"
row=$("$BRAMA" subscription list "${gw[@]}" -agent a1 -json | jq -c '.subscriptions[0] | [.usage_read.ok, .stale, .credential.state]')
expect "the row shows the failed read" "$row" '[false,true,"active"]'
passes=$(curl -fsS -H "Authorization: Bearer $TOKEN" "$BRAMA_URL/metrics" | awk '$1 == "brama_maintenance_passes_total" {print $2}')
expect "/metrics counts the start pass and the four asked for" "$passes" "5"
expect "maintenance logged the failed read" "$(grep -c '"msg":"usage_read_failed"' "$WORK/brama.err")" "2"
expect "the key never reaches the log" "$(grep -c "$key" "$WORK/brama.err" || true)" "0"
