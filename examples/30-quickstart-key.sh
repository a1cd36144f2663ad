#!/usr/bin/env bash
# README "Quick start", with a provider API key: the commands README shows,
# with $BRAMA for `go run .`, the stub as OpenAI and an ephemeral port.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_OPENAI_BASE_URL="$STUB_URL/v1"
start_brama # go run . serve: prints the admin token once on stderr
expect "a newcomer's /readyz names the missing payer" "$(curl -s "$BRAMA_URL/readyz" | jq -r '.reasons | join(" ")' | grep -c payer)" "1"
export BRAMA_TOKEN=$TOKEN # the brama_… token serve printed
OPENAI_API_KEY=sk-example-not-a-real-key
# --- README block ---
printf '%s\n' "$OPENAI_API_KEY" | "$BRAMA" credentials set openai
"$BRAMA" routes set chat openai/gpt-4o-mini
out=$(curl -s "$BRAMA_URL/v1/chat/completions" -H "Authorization: Bearer $BRAMA_TOKEN" \
	-d '{"model":"chat","messages":[{"role":"user","content":"Say hi"}]}')
# --- end ---
expect "a first real answer" "$(echo "$out" | jq -r '.choices[0].message.content')" "Hello from the stub provider."
expect "ready" "$(curl -s "$BRAMA_URL/readyz" | jq -r .ready)" "true"
