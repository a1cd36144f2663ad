#!/usr/bin/env bash
# The classified refusals before dispatch (no attempts key) and after one
# provider call (attempts: 1, never retried).
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_OPENAI_BASE_URL="$STUB_URL/v1"
LOCAL_CREDS='{"openai":"sk-example-not-a-real-key"}' start_brama
"$BRAMA" routes set nokey anthropic/claude-sonnet-4-5
"$BRAMA" routes set broken openai/fail-500
chat() { curl -s -H "Authorization: Bearer $TOKEN" -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" "$BRAMA_URL/v1/chat/completions"; }
out=$(chat ghost)
expect "unknown alias" "$(echo "$out" | jq -r '.error.code + " " + .error.details.state + " " + (.error | has("attempts") | tostring)')" "alias_unknown no_route false"
out=$(chat nokey)
expect "no credential" "$(echo "$out" | jq -r '.error.code + " " + .error.details.state + " " + .error.details.route')" "alias_unserviceable capability_absent anthropic/claude-sonnet-4-5"
out=$(chat broken)
expect "provider 500" "$(echo "$out" | jq -r '.error.code + " " + (.error.attempts | tostring) + " " + (.error.retryable | tostring)')" "dependency_unavailable 1 true"
out=$(chat openai/fail-429)
expect "provider 429" "$(echo "$out" | jq -r '.error.code + " " + (.error.attempts | tostring)')" "provider_rate_limited 1"
out=$(curl -s -H "Authorization: Bearer $TOKEN" -d '{"model":' "$BRAMA_URL/v1/chat/completions")
expect "malformed JSON" "$(echo "$out" | jq -r .error.code)" "invalid_request"
expect "unknown path" "$(curl -s "$BRAMA_URL/v2/nothing" | jq -r .error.code)" "not_found"
expect "wrong method" "$(curl -s -X DELETE "$BRAMA_URL/health" | jq -r .error.code)" "method_not_allowed"
# Every error says x-should-retry (equal to retryable); a retryable one
# with a known wait passes the provider's Retry-After on (SPEC §8.1).
hdr() { curl -s -o /dev/null -D - -H "Authorization: Bearer $TOKEN" -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"${2:-hi}\"}]}" "$BRAMA_URL/v1/chat/completions" | tr -d '\r' | awk -v k="$3" 'tolower($1) == tolower(k) ":" { print $2 }'; }
expect "provider 429 x-should-retry" "$(hdr openai/fail-429 hi x-should-retry)" "true"
expect "provider 429 Retry-After" "$(hdr openai/fail-429 hi retry-after)" "120"
expect "provider 500 x-should-retry" "$(hdr openai/fail-500 hi x-should-retry)" "true"
expect "unknown alias x-should-retry" "$(hdr ghost hi x-should-retry)" "false"
# The replay guard: a direct route's 401 is provider_failure after one call;
# the same request again is refused the same way with no provider call.
out=$(chat openai/fail-401)
expect "direct 401" "$(echo "$out" | jq -r '.error.code + " " + (.error.attempts | tostring)')" "provider_failure 1"
expect "replay refused" "$(hdr openai/fail-401 hi brama-replay-refused) $(chat openai/fail-401 | jq -r '.error.code + " " + (.error.attempts | tostring)')" "true provider_failure 0"
