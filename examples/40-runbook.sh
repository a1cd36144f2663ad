#!/usr/bin/env bash
# README "Runbook", followed once against a real brama serve: each failure
# an operator can meet is made to happen, what the operator sees is checked,
# and the procedure's commands (the ones README shows) fix it.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_OPENAI_BASE_URL="$STUB_URL/v1" BRAMA_PROVIDER_KIMI_BASE_URL="$STUB_URL/v1"
export BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL=$STUB_URL BRAMA_OAUTH_CLAUDE_CODE_TOKEN_URL=$STUB_URL/oauth/token
S=$BRAMA_STATE_DIR
start_brama
export BRAMA_TOKEN=$TOKEN
serve_again() { start_brama; TOKEN=$BRAMA_TOKEN; } # the admin token is printed at first start only
stop_brama() { SERVE_PID=${PIDS[-1]}; kill -TERM "$SERVE_PID" && wait "$SERVE_PID" 2>/dev/null || true; }
ready() { curl -s "$BRAMA_URL/readyz"; }
chat() { curl -s -D "$WORK/h" -H "Authorization: Bearer ${2-$TOKEN}" -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" "$BRAMA_URL/v1/chat/completions"; }
header() { tr -d '\r' <"$WORK/h" | awk -v k="$1" 'tolower($1) == tolower(k) ":" { print $2 }'; }

# unauthenticated: a caller without a token; the operator makes it one.
expect "no token" "$(chat openai/gpt-4o-mini "" | jq -r '.error.code + ": " + .error.message')" "unauthenticated: no token: send Authorization: Bearer <token> or x-api-key"
app=$("$BRAMA" clients add app 2>/dev/null)
expect "a new client token" "$(echo "$app" | grep -c '^brama_')" "1"

# credential_unauthorized: no payer for a direct route (/readyz: no payer).
expect "no payer" "$(ready | jq -r '.reasons | join(" ")' | grep -c 'payer')" "1"
expect "no direct key" "$(chat openai/gpt-4o-mini "$app" | jq -r .error.code)" "credential_unauthorized"
printf '%s\n' "sk-example-openai-key" | "$BRAMA" credentials set openai
expect "answered once the key is set" "$(chat openai/gpt-4o-mini "$app" | jq -r '.choices[0].message.content')" "Hello from the stub provider."
expect "ready" "$(ready | jq -r .ready)" "true"

# The replay guard: a refusal after a call (here the provider refused the
# key: provider_failure) is answered again without a call for 120 s.
chat openai/fail-401 "$app" >/dev/null
out=$(chat openai/fail-401 "$app")
expect "replay refused" "$(header brama-replay-refused) $(echo "$out" | jq -r '.error.code + " " + (.error.attempts|tostring)')" "true provider_failure 0"
grep -q '"outcome":"provider_failure".*"attempts":0' "$WORK/brama.err" && echo "ok: the refused replay's log line (attempts 0)"
# The fix: a new key makes the guard forget what went through the old one.
printf '%s\n' "sk-example-openai-key-2" | "$BRAMA" credentials set openai
out=$(chat openai/fail-401 "$app")
expect "after a new key the provider is asked again" "$(echo "$out" | jq -r '.error.code + " " + (.error.attempts|tostring)')" "provider_failure 1"
# Or the guard's memory ends with a restart.
chat openai/fail-401 "$app" >/dev/null
stop_brama
serve_again
out=$(chat openai/fail-401 "$app")
expect "after a restart the provider is asked again" "$(echo "$out" | jq -r '.error.code + " " + (.error.attempts|tostring)')" "provider_failure 1"

# A refused grant: every subscription of the agent needs a new sign-in.
agent_app=$("$BRAMA" clients add app-a1 -agent a1 2>/dev/null)
id=$(printf '%s\n' "sk-kimi-example-old" | "$BRAMA" subscription add -gateway "$BRAMA_URL" -provider kimi -agent a1)
out=$(chat kimi/fail-401 "$agent_app")
expect "reauthorization required" "$(echo "$out" | jq -r .error.code)" "subscription_reauthorization_required"
"$BRAMA" subscription list -gateway "$BRAMA_URL" -agent a1
expect "/readyz warns" "$(ready | jq -r '.warnings | join(" ")' | grep -c 'need reauthorization')" "1"
expect "credential refused" "$("$BRAMA" subscription list -gateway "$BRAMA_URL" -agent a1 -json | jq -r '.subscriptions[0].credential.state')" "needs_reauthorization"
# An API-key subscription: put a new key on it.
curl -s -X PUT -H "Authorization: Bearer $TOKEN" -d '{"api_key":"sk-kimi-example-new"}' "$BRAMA_URL/v1/admin/subscriptions/a1/$id/credential"; echo
expect "credential active" "$("$BRAMA" subscription list -gateway "$BRAMA_URL" -agent a1 -json | jq -r '.subscriptions[0].credential.state')" "active"
expect "answered after the new key" "$(chat kimi/stub-model "$agent_app" | jq -r '.choices[0].message.content')" "Hello from the stub provider."
# An OAuth subscription (claude-code, codex): sign in again on the same id.
cc=$(echo "example-code" | "$BRAMA" subscription sign-in -gateway "$BRAMA_URL" -provider claude-code -agent a1 2>/dev/null)
echo "example-code-2" | "$BRAMA" subscription sign-in -gateway "$BRAMA_URL" -provider claude-code -agent a1 -id "$cc" 2>/dev/null >/dev/null
expect "signed in again" "$("$BRAMA" subscription list -gateway "$BRAMA_URL" -agent a1 -json | jq -r --arg id "$cc" '.subscriptions[] | select(.id==$id) | .credential.state')" "active"

# A blocked pool: every subscription answered 429; Retry-After says when.
out=$(chat kimi/fail-429 "$agent_app")
out=$(chat kimi/stub-model "$agent_app")
expect "pool blocked" "$(echo "$out" | jq -r .error.code)" "subscription_unavailable"
expect "Retry-After given" "$(header retry-after | grep -c '^[0-9][0-9]*$')" "1"
# The fix: wait Retry-After seconds (a maintenance pass runs at the block's
# end), or donate another subscription to the pool.
printf '%s\n' "sk-kimi-example-second" | "$BRAMA" subscription add -gateway "$BRAMA_URL" -provider kimi -agent a1 >/dev/null
expect "answered by the new subscription" "$(chat kimi/stub-model "$agent_app" | jq -r '.choices[0].message.content')" "Hello from the stub provider."

# An invalid registry: every alias is routes_file_invalid, /readyz is 503.
"$BRAMA" routes set chat openai/gpt-4o-mini
printf '%s' '{"schema_version":1,"deployments":[],"routes":{"chat":"openai/gpt-4o-mini"},"fallbacks":{}}' >"$S/routes.json"
expect "not ready" "$(ready | jq -r '.reasons | join(" ")' | grep -c 'routes')" "1"
expect "alias state" "$(chat chat "$app" | jq -r .error.details.state)" "routes_file_invalid"
expect "canonical routes keep serving" "$(chat openai/gpt-4o-mini "$app" | jq -r '.choices[0].message.content')" "Hello from the stub provider."
expect "registry writes refused" "$(curl -s -X PUT -H "Authorization: Bearer $TOKEN" -d '{"alias":"x","route":"openai/gpt-4o-mini"}' "$BRAMA_URL/v1/admin/routes" | jq -r .error.code)" "state_conflict"
grep -q '"msg":"inference_routes_invalid"' "$WORK/brama.err" && echo "ok: inference_routes_invalid logged"
if "$BRAMA" routes list >"$WORK/list" 2>&1; then echo "FAIL: routes list passed an invalid registry" >&2; exit 1; fi
cat "$WORK/list"
"$BRAMA" routes migrate >/dev/null # a retired field; any other cause: edit the file until routes list passes
"$BRAMA" routes list
expect "serving again" "$(chat chat "$app" | jq -r '.choices[0].message.content')" "Hello from the stub provider."
expect "ready again" "$(ready | jq -r .ready)" "true"

# A journal line that cannot be read (here one written by hand) and a torn
# final line (a crash mid-write).
printf '%s\n' 'not a record' >>"$S/journal.jsonl"
"$BRAMA" routes set other openai/gpt-4o-mini
printf '%s' '{"kind":"route_change","at":"2026-' >>"$S/journal.jsonl"
"$BRAMA" journal check && { echo "FAIL: journal check passed an unreadable line" >&2; exit 1; }
ready | jq -r '.warnings | join(" ")'
expect "/readyz warns of the line" "$(ready | jq -r '.warnings | join(" ")' | grep -c 'journal')" "1"
N=$({ "$BRAMA" journal check || true; } | sed -n 's/^line \([0-9]*\): .*/\1/p' | head -1)
{ "$BRAMA" journal check || true; } | grep -q 'final line torn (ignored)' && echo "ok: torn final line reported, ignored"
stop_brama
(umask 077 && sed -n "${N}p" "$S/journal.jsonl" >>"$S/journal.removed")
sed -i "${N}d" "$S/journal.jsonl"
"$BRAMA" journal check && echo "ok: journal check passes (the torn final line stays ignored)"
serve_again
"$BRAMA" routes set third openai/gpt-4o-mini # the next append starts a fresh line
if "$BRAMA" journal check; then echo "FAIL: the torn fragment must be reported once it is no longer final" >&2; exit 1; fi
stop_brama
N=$({ "$BRAMA" journal check || true; } | sed -n 's/^line \([0-9]*\): .*/\1/p' | head -1)
(umask 077 && sed -n "${N}p" "$S/journal.jsonl" >>"$S/journal.removed")
sed -i "${N}d" "$S/journal.jsonl"
"$BRAMA" journal check
expect "journal mode kept" "$(stat -c %a "$S/journal.jsonl")" "600"

# A journal readable by others: /readyz names it, chmod fixes it.
chmod 640 "$S/journal.jsonl"
serve_again
expect "journal unusable" "$(ready | jq -r '.reasons | join(" ")' | grep -c 'journal unusable')" "1"
chmod 600 "$S/journal.jsonl"
expect "journal usable" "$(ready | jq -r '.reasons | join(" ")' | grep -c 'journal unusable')" "0"

# An unreadable ledger: read once at start, served empty, never overwritten.
stop_brama
printf '%s' '{"schema_version":1,"subscriptions":' >"$S/ledger.json"
serve_again
expect "ledger unusable" "$(ready | jq -r '.reasons | join(" ")' | grep -c 'ledger unusable')" "1"
stop_brama
mv "$S/ledger.json" "$S/ledger.json.unreadable"
serve_again
expect "ledger usable" "$(ready | jq -r '.reasons | join(" ")' | grep -c 'ledger unusable')" "0"
expect "ready at last" "$(ready | jq -r .ready)" "true"
