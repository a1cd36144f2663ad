#!/usr/bin/env bash
# The no-home refusals (seed "State and ownership"): with neither
# BRAMA_STATE_DIR nor a home directory, serve still starts and serves, and
# every reader and writer of state refuses naming the cause.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_OPENAI_BASE_URL="$STUB_URL/v1"
unset BRAMA_STATE_DIR
export LOCAL_CREDS='{"openai":"sk-example-not-a-real-key"}'
HOME='' start_brama
expect "admin client for this process only" "$(grep -c 'for this process only' "$WORK/brama.err")" "1"
expect "/readyz warns" "$(curl -s "$BRAMA_URL/readyz" | jq -r '.warnings | join(" ")' | grep -c 'no state directory')" "1"
chat() { curl -s -H "Authorization: Bearer $TOKEN" "$@" -d '{"model":"openai/gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}' "$BRAMA_URL/v1/chat/completions"; }
expect "a direct route serves" "$(chat | jq -r '.choices[0].message.content')" "Hello from the stub provider."
out=$(curl -s -X PUT -H "Authorization: Bearer $TOKEN" -d '{"alias":"chat","route":"openai/gpt-4o-mini"}' "$BRAMA_URL/v1/admin/routes")
expect "a registry write refuses with the cause" "$(echo "$out" | jq -r .error.code)" "dependency_unavailable"
echo "$out" | jq -r .error.message
out=$(chat -H 'Idempotency-Key: order-42')
expect "a signed answer has no place to be kept" "$(echo "$out" | jq -r '.error.code + ": " + .error.message' | grep -c "^internal_error: this request's one signed answer has no place to be kept: ")" "1"
grep -q '"msg":"perf_stats_unplaced"' "$WORK/brama.err" && echo "ok: perf_stats_unplaced logged"
