#!/usr/bin/env bash
# Selectors: `any` walks the agent's subscription models (alias destinations,
# then the catalogue's newest). `task:<name>` is retired: an undeclared alias.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_KIMI_BASE_URL="$STUB_URL/v1"
start_brama
export BRAMA_TOKEN=$TOKEN
printf '%s\n' "sk-kimi-example" | "$BRAMA" subscription add -gateway "$BRAMA_URL" -provider kimi -agent a1 >/dev/null
"$BRAMA" routes set coder kimi/stub-model
app=$("$BRAMA" clients add app-a1 -agent a1 2>/dev/null)
chat() { curl -s -D "$WORK/h" -H "Authorization: Bearer $app" -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" "$BRAMA_URL/v1/chat/completions"; }
out=$(chat any)
expect "any answers from the candidate route" "$(grep -i '^brama-route:' "$WORK/h" | tr -d '\r' | awk '{print $2}')" "kimi/stub-model"
expect "same format passes through: the body names the provider's model" "$(echo "$out" | jq -r .model)" "stub-model"
out=$(chat task:review)
expect "task: is no selector" "$(echo "$out" | jq -r '.error.code + " " + (.error | has("attempts") | tostring)')" "alias_unknown false"
