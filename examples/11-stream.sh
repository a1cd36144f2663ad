#!/usr/bin/env bash
# A streamed answer through an alias: events are flushed as they are
# translated and the stream ends with the dialect's terminal event.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_ANTHROPIC_BASE_URL="$STUB_URL"
LOCAL_CREDS='{"anthropic":"sk-ant-example-not-a-real-key"}' start_brama
"$BRAMA" routes set chat anthropic/stub-model
out=$(curl -sN -H "Authorization: Bearer $TOKEN" -d '{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":64}' "$BRAMA_URL/v1/chat/completions")
echo "$out" | head -3
expect "last frame" "$(echo "$out" | grep '^data: ' | tail -1)" "data: [DONE]"
text=$(echo "$out" | grep '^data: {' | sed 's/^data: //' | jq -rj '.choices[0].delta.content // empty')
expect "assembled text" "$text" "Hello from the stub provider."
