#!/usr/bin/env bash
# Stopping serve: the first SIGTERM lets a running request finish (no grace
# period of Brama's own), the second cuts what still runs (outcome
# server_shutdown).
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_OPENAI_BASE_URL="$STUB_URL"
LOCAL_CREDS='{"openai":"sk-example-not-a-real-key"}' start_brama
body='{"model":"openai/slow","messages":[{"role":"user","content":"take your time"}]}'

# One SIGTERM: the slow request still gets its answer, then serve exits 0.
curl -s -o "$WORK/answer" -w '%{http_code}' -H "Authorization: Bearer $TOKEN" -d "$body" "$BRAMA_URL/v1/chat/completions" >"$WORK/status" &
client=$!
wait_for "$WORK/stub.out" 'slow request started'
kill -TERM "${PIDS[-1]}"
wait_for "$WORK/brama.err" '"msg":"serve_draining"'
wait "$client"
expect "status after one SIGTERM" "$(cat "$WORK/status")" "200"
expect "answer after one SIGTERM" "$(jq -r '.choices[0].message.content' "$WORK/answer")" "Hello from the stub provider."
wait "${PIDS[-1]}"
expect "serve's exit status" "$?" "0"
expect "request outcome" "$(grep '"msg":"request"' "$WORK/brama.err" | jq -r .outcome)" "ok"

# Two SIGTERMs: the second cuts the running request.
admin=$TOKEN # printed at first start only
LOCAL_CREDS='{"openai":"sk-example-not-a-real-key"}' start_brama
TOKEN=$admin
curl -s -o /dev/null -H "Authorization: Bearer $TOKEN" -d "$body" "$BRAMA_URL/v1/chat/completions" &
client=$!
for _ in $(seq 100); do # the stub's second "slow request started" line
	[ "$(grep -c 'slow request started' "$WORK/stub.out")" -ge 2 ] && break
	sleep 0.1
done
expect "slow requests the stub saw" "$(grep -c 'slow request started' "$WORK/stub.out")" "2"
kill -TERM "${PIDS[-1]}"
wait_for "$WORK/brama.err" '"msg":"serve_draining"'
kill -TERM "${PIDS[-1]}"
wait "${PIDS[-1]}"
expect "serve's exit status after two SIGTERMs" "$?" "0"
wait "$client" || true
expect "request outcome" "$(grep '"msg":"request"' "$WORK/brama.err" | jq -r .outcome)" "server_shutdown"
