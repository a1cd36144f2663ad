#!/usr/bin/env bash
# Retire a donated subscription, see it listed as retired with its
# credential disabled and the retirement journaled, then reinstate it.
. "$(dirname "$0")/lib.sh"
start_brama
export BRAMA_TOKEN=$TOKEN
gw=(-gateway "$BRAMA_URL")
id=$(echo "sk-example-retire-0123456789" | "$BRAMA" subscription add "${gw[@]}" -provider openai -agent a1)
"$BRAMA" subscription retire "${gw[@]}" -agent a1 -reason "key rotated" "$id"
"$BRAMA" subscription list "${gw[@]}" -agent a1
row=$("$BRAMA" subscription list "${gw[@]}" -agent a1 -json | jq -c '.subscriptions[0] | [.status, .credential.state]')
expect "listed as retired" "$row" '["retired","disabled"]'
expect "journal has the retire line" "$(grep -c "\"kind\":\"retire\".*\"subscription_id\":\"$id\",\"reason\":\"key rotated\"" "$BRAMA_STATE_DIR/journal.jsonl")" "1"
# Retiring again is fine; reinstating needs a reason (exit 2 without one).
"$BRAMA" subscription retire "${gw[@]}" -agent a1 "$id"
set +e
"$BRAMA" subscription reinstate "${gw[@]}" -agent a1 "$id" 2>/dev/null
code=$?
set -e
expect "reinstate without -reason" "$code" "2"
"$BRAMA" subscription reinstate "${gw[@]}" -agent a1 -reason "false alarm" "$id"
row=$("$BRAMA" subscription list "${gw[@]}" -agent a1 -json | jq -c '.subscriptions[0] | [.status, .credential.state]')
expect "active again" "$row" '["active","active"]'
expect "journal has the reinstate line" "$(grep -c "\"kind\":\"reinstate\".*\"subscription_id\":\"$id\"" "$BRAMA_STATE_DIR/journal.jsonl")" "1"
"$BRAMA" journal check
