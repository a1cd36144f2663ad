#!/usr/bin/env bash
# One signed answer per Idempotency-Key (SPEC §12): the second request is
# replayed from the kept answer without a provider call (sending the request
# again with its key is how a caller reads it), and `brama answers verify`
# checks the signature.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_OPENAI_BASE_URL="$STUB_URL/v1"
LOCAL_CREDS='{"openai":"sk-example-not-a-real-key"}' start_brama
key="order-42"
req='{"model":"openai/stub-model","messages":[{"role":"user","content":"hi"}]}'
auth=(-H "Authorization: Bearer $TOKEN")
# ask N [BODY]: POST with the key; headers in $WORK/hN, body in $WORK/bN.
ask() { curl -s -D "$WORK/h$1" -o "$WORK/b$1" "${auth[@]}" -H "Idempotency-Key: $key" -d "${2:-$req}" "$BRAMA_URL/v1/chat/completions"; }
# hdr N NAME: one response header's value.
hdr() { grep -i "^$2:" "$WORK/h$1" | tr -d '\r' | cut -d' ' -f2-; }
ask 1
ask 2
expect "first answer text" "$(jq -r '.choices[0].message.content' "$WORK/b1")" "Hello from the stub provider."
expect "first answer made one call" "$(hdr 1 brama-attempts)" "1"
expect "second answer is the same bytes" "$(cmp -s "$WORK/b1" "$WORK/b2" && echo same)" "same"
expect "second answer is replayed" "$(hdr 2 brama-answer-replayed)" "true"
expect "the replay made no call" "$(hdr 2 brama-attempts)" "0"
expect "the replay has the same signature" "$(hdr 2 brama-answer-signature)" "$(hdr 1 brama-answer-signature)"
expect "one provider call in all" "$(curl -s "${auth[@]}" "$BRAMA_URL/metrics" | awk '$1 == "brama_attempts_total" {print $2}')" "1"
ask 4 '{"model":"openai/stub-model","messages":[{"role":"user","content":"something else"}]}'
expect "the key with another body" "$(jq -r '.error.code + " " + (.error.retryable | tostring)' "$WORK/b4")" "state_conflict false"

kept="$BRAMA_STATE_DIR/answers/local/$(printf '%s' "$key" | sha256sum | cut -d' ' -f1).json"
expect "kept file is owner-only" "$(stat -c %a "$kept")" "600"
expect "kept file verifies" "$("$BRAMA" answers verify "$kept")" "ok"
sig=$(hdr 1 brama-answer-signature)
expect "raw body verifies" "$("$BRAMA" answers verify -signature "$sig" "$WORK/b1")" "ok"
sed 's/Hello/Jello/' "$WORK/b1" >"$WORK/changed"
expect "a changed byte is rejected" "$("$BRAMA" answers verify -signature "$sig" "$WORK/changed" 2>&1; echo "exit $?")" "brama: signature mismatch
exit 1"
expect "prune removes the complete answer" "$("$BRAMA" answers prune -older-than 0s)" "removed 1 complete answers older than 0s"
