#!/usr/bin/env bash
# A prefix alias serves a client's own default model name (Claude Code's
# changes with every release) without an alias per version: claude-* sends
# each claude-… name to anthropic under that same name.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_ANTHROPIC_BASE_URL="$STUB_URL"
start_brama
expect "serve names the next step" "$(grep -c '^next: brama credentials set anthropic' "$WORK/brama.out")" "1"
ask() { # ask MODEL: one Messages call as Claude Code would make it
	curl -s "$BRAMA_URL/v1/messages" -H "Authorization: Bearer $TOKEN" \
		-d "{\"model\":\"$1\",\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"
}
out=$(ask claude-opus-5-5)
expect "an undeclared name is 404" "$(echo "$out" | jq -r .error.code)" "alias_unknown"
expect "the 404 names the fix" "$(echo "$out" | jq -r .error.message | grep -c "brama routes set 'claude-\*' 'anthropic/\*'")" "1"
printf '%s\n' sk-ant-example-not-a-real-key | "$BRAMA" credentials set anthropic
"$BRAMA" routes set 'claude-*' 'anthropic/*'
out=$(ask claude-opus-5-5)
expect "the provider is asked for the client's own name" "$(echo "$out" | jq -r .model)" "claude-opus-5-5"
expect "a later release's name serves too" "$(ask claude-sonnet-6-0 | jq -r .model)" "claude-sonnet-6-0"
"$BRAMA" routes set claude-sonnet-6-0 anthropic/claude-sonnet-4-5 # an exact alias beats the prefix
expect "exact beats prefix" "$(ask claude-sonnet-6-0 | jq -r .model)" "claude-sonnet-4-5"
expect "the prefix alias serves" "$(curl -s -H "Authorization: Bearer $TOKEN" "$BRAMA_URL/v1/aliases" | jq -r '.aliases[] | select(.alias=="claude-*") | .state')" "serving"
out=$(curl -s "$BRAMA_URL/v1/v1/messages" -H "Authorization: Bearer $TOKEN" -d '{}')
expect "a doubled /v1 names the base URL" "$(echo "$out" | jq -r .error.message | grep -c 'without /v1')" "1"
"$BRAMA" routes list
