#!/usr/bin/env bash
# A direct route (provider/model) in each caller dialect, paid by a direct
# API key stored with `brama credentials set`.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_OPENAI_BASE_URL="$STUB_URL/v1"
printf '%s\n' "sk-example-not-a-real-key" | "$BRAMA" credentials set openai
start_brama
auth=(-H "Authorization: Bearer $TOKEN")
out=$(curl -s -D "$WORK/h" "${auth[@]}" -d '{"model":"openai/stub-model","messages":[{"role":"user","content":"hi"}]}' "$BRAMA_URL/v1/chat/completions")
expect "chat completions text" "$(echo "$out" | jq -r '.choices[0].message.content')" "Hello from the stub provider."
expect "same format passes through: the body names the provider's model" "$(echo "$out" | jq -r .model)" "stub-model"
expect "Brama-Route names the route" "$(grep -i '^brama-route:' "$WORK/h" | tr -d '\r' | awk '{print $2}')" "openai/stub-model"
expect "one attempt" "$(grep -i '^brama-attempts:' "$WORK/h" | tr -d '\r' | awk '{print $2}')" "1"
out=$(curl -s "${auth[@]}" -d '{"model":"openai/stub-model","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}' "$BRAMA_URL/v1/messages")
expect "messages dialect text" "$(echo "$out" | jq -r '.content[0].text')" "Hello from the stub provider."
expect "a translated answer names the requested model" "$(echo "$out" | jq -r .model)" "openai/stub-model"
out=$(curl -s "${auth[@]}" -d '{"model":"openai/stub-model","input":"hi"}' "$BRAMA_URL/v1/responses")
expect "responses dialect text" "$(echo "$out" | jq -r '.output[0].content[0].text')" "Hello from the stub provider."
# The key never leaves the vault.
if grep -rq "sk-example-not-a-real-key" "$WORK/brama.err" "$BRAMA_STATE_DIR/journal.jsonl" 2>/dev/null; then echo "FAIL: key leaked" >&2; exit 1; fi
echo "ok: the key appears in no log or journal"
