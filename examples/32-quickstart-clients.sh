#!/usr/bin/env bash
# README "Quick start", with Claude Code or the Codex CLI pointed at Brama.
# The clients themselves are exercised by examples/clients (its checks
# claude-api-key, claude-anthropic, codex-responses, codex-anthropic); here
# the requests those clients send are made with curl against the stub, so
# the quick start runs where neither client is installed.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_ANTHROPIC_BASE_URL="$STUB_URL"
# The Codex CLI sends no output limit; Brama takes the model's own from the
# catalogue (models.dev when online; a local copy here).
printf '%s' '{"anthropic":{"id":"anthropic","models":{"claude-sonnet-4-5":{"id":"claude-sonnet-4-5","release_date":"2025-09-29","limit":{"context":200000,"output":64000},"modalities":{"input":["text","image"],"output":["text"]}}}}}' >"$WORK/models.json"
export BRAMA_MODEL_CATALOG_PATH=$WORK/models.json
start_brama
export BRAMA_TOKEN=$TOKEN
ANTHROPIC_KEY=sk-ant-example-not-a-real-key
# --- README block ---
printf '%s\n' "$ANTHROPIC_KEY" | "$BRAMA" credentials set anthropic
"$BRAMA" routes set chat anthropic/claude-sonnet-4-5
# --- end ---
mkdir -p "$WORK/codex-home"
cat >"$WORK/codex-home/config.toml" <<TOML
model = "chat"
model_provider = "brama"

[model_providers.brama]
name = "Brama"
base_url = "$BRAMA_URL/v1"
env_key = "BRAMA_TOKEN"
wire_api = "responses"
TOML
export ANTHROPIC_BASE_URL=$BRAMA_URL ANTHROPIC_AUTH_TOKEN=$BRAMA_TOKEN
if command -v claude >/dev/null && command -v codex >/dev/null && [ -n "${QUICKSTART_REAL_CLIENTS:-}" ]; then
	ANTHROPIC_MODEL=chat ANTHROPIC_DEFAULT_HAIKU_MODEL=chat claude -p "Say hi"
	CODEX_HOME=$WORK/codex-home codex exec --skip-git-repo-check "Say hi"
	exit 0
fi
# What Claude Code sends: Messages, streamed, ?beta=true, its betas, the
# token as a bearer (ANTHROPIC_AUTH_TOKEN) or as x-api-key (ANTHROPIC_API_KEY).
claude_request='{"model":"chat","max_tokens":32000,"stream":true,"system":[{"type":"text","text":"You are Claude Code."}],"messages":[{"role":"user","content":[{"type":"text","text":"Say hi"}]}]}'
for auth in "Authorization: Bearer $ANTHROPIC_AUTH_TOKEN" "x-api-key: $ANTHROPIC_AUTH_TOKEN"; do
	out=$(curl -s -N "$ANTHROPIC_BASE_URL/v1/messages?beta=true" -H "$auth" -H 'anthropic-version: 2023-06-01' \
		-H 'anthropic-beta: claude-code-20250219,interleaved-thinking-2025-05-14' -H 'content-type: application/json' -d "$claude_request")
	expect "Claude Code's stream (${auth%%:*})" "$(echo "$out" | grep -c '^event: message_stop')" "1"
	expect "Claude Code's answer text (${auth%%:*})" "$(echo "$out" | sed -n 's/^data: //p' | jq -rj 'select(.type=="content_block_delta") | .delta.text')" "Hello from the stub provider."
done
# What the Codex CLI sends with that config.toml: Responses, streamed, to
# base_url + /responses, the env_key's value as a bearer.
base_url=$(sed -n 's/^base_url = "\(.*\)"/\1/p' "$WORK/codex-home/config.toml")
codex_request='{"model":"chat","instructions":"You are Codex.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Say hi"}]}],"tools":[],"tool_choice":"auto","parallel_tool_calls":false,"store":false,"stream":true,"include":[]}'
out=$(curl -s -N "$base_url/responses" -H "Authorization: Bearer $BRAMA_TOKEN" -H 'content-type: application/json' -d "$codex_request")
expect "the Codex CLI's stream completes" "$(echo "$out" | grep -c '^event: response.completed')" "1"
expect "the Codex CLI's answer text" "$(echo "$out" | sed -n 's/^data: //p' | jq -rj 'select(.type=="response.output_text.delta") | .delta')" "Hello from the stub provider."
