#!/usr/bin/env bash
# An explicit subscription route: kimi/<model> is paid by the calling agent's
# kimi subscription, at most two calls, rotating only on 401/403, 429 or quota.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_KIMI_BASE_URL="$STUB_URL/v1"
start_brama
export BRAMA_TOKEN=$TOKEN
printf '%s\n' "sk-kimi-example-one" | "$BRAMA" subscription add -gateway "$BRAMA_URL" -provider kimi -agent a1 -label first >/dev/null
printf '%s\n' "sk-kimi-example-two" | "$BRAMA" subscription add -gateway "$BRAMA_URL" -provider kimi -agent a1 -label second >/dev/null
app=$("$BRAMA" clients add app-a1 -agent a1 2>/dev/null) # a bearer bound to the agent
chat() { curl -s -D "$WORK/h" -H "Authorization: Bearer $app" -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" "$BRAMA_URL/v1/chat/completions"; }
out=$(chat kimi/stub-model)
expect "answer" "$(echo "$out" | jq -r '.choices[0].message.content')" "Hello from the stub provider."
expect "one attempt" "$(grep -i '^brama-attempts:' "$WORK/h" | tr -d '\r' | awk '{print $2}')" "1"
# The ledger recorded the spend on the subscription that served.
rows=$("$BRAMA" subscription list -gateway "$BRAMA_URL" -agent a1 -json)
expect "requests measured" "$(echo "$rows" | jq '[.subscriptions[].measured.requests] | add')" "1"
# A provider that answers 429 for the model: both subscriptions are tried,
# each is blocked until the stated reset, and the answer says so.
out=$(chat kimi/fail-429)
expect "rate limited after two calls" "$(echo "$out" | jq -r '.error.code + " " + (.error.attempts|tostring)')" "provider_rate_limited 2"
out=$(chat kimi/stub-model)
expect "both blocked: no call" "$(echo "$out" | jq -r '.error.code + " " + (.error.attempts|tostring)')" "subscription_unavailable 0"
grep -i '^retry-after:' "$WORK/h" && echo "ok: Retry-After"
