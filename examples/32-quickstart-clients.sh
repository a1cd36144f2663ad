#!/usr/bin/env bash
# README "Quick start", with Claude Code or the Codex CLI pointed at Brama:
# runs README's block itself, the built brama for `go run .`, the stub as
# Anthropic, on this run's own port and HOME. `claude` and `codex` are
# stand-ins here that send what the pinned clients send with no model
# setting of their own (their default names below), so the quick start runs
# where neither client is installed; examples/clients runs the same block
# with the real clients (its checks quickstart-claude-default and
# quickstart-codex-default).
. "$(dirname "$0")/lib.sh"
block=$(awk '/^\*\*With Claude Code or the Codex CLI\*\*/{f=1} f && /^```sh/{b=1; next} f && b && /^```/{exit} b' "$(dirname "$0")/../README.md")
start_stub
export BRAMA_PROVIDER_ANTHROPIC_BASE_URL="$STUB_URL"
# The Codex CLI sends no output limit; Brama takes the model's own from the
# catalogue (models.dev when online; a local copy here).
printf '%s' '{"anthropic":{"id":"anthropic","models":{"claude-sonnet-4-5":{"id":"claude-sonnet-4-5","release_date":"2025-09-29","limit":{"context":200000,"output":64000},"modalities":{"input":["text","image"],"output":["text"]}}}}}' >"$WORK/models.json"
export BRAMA_MODEL_CATALOG_PATH=$WORK/models.json
start_brama
export BRAMA_TOKEN=$TOKEN ANTHROPIC_API_KEY=sk-ant-example-not-a-real-key HOME=$WORK/home
mkdir -p "$HOME" "$WORK/bin"

# Claude Code 2.1.332's defaults: claude-opus-5-5, and a haiku for small
# tasks; Messages, streamed, ?beta=true, its betas, ANTHROPIC_AUTH_TOKEN as
# a bearer and ANTHROPIC_API_KEY as x-api-key when set (both: refused).
cat >"$WORK/bin/claude" <<'SH'
#!/usr/bin/env bash
[ "$1" = -p ] || exit 2
auth=(-H "Authorization: Bearer $ANTHROPIC_AUTH_TOKEN")
[ -n "${ANTHROPIC_API_KEY:-}" ] && auth+=(-H "x-api-key: $ANTHROPIC_API_KEY")
for model in claude-opus-5-5 claude-haiku-4-5; do
	body=$(jq -nc --arg m "$model" --arg p "$2" '{model:$m,max_tokens:32000,stream:true,system:[{type:"text",text:"You are Claude Code."}],messages:[{role:"user",content:[{type:"text",text:$p}]}]}')
	out=$(curl -s -N "$ANTHROPIC_BASE_URL/v1/messages?beta=true" "${auth[@]}" -H 'anthropic-version: 2023-06-01' \
		-H 'anthropic-beta: claude-code-20250219,interleaved-thinking-2025-05-14' -H 'content-type: application/json' -d "$body")
	echo "$out" | sed -n 's/^data: //p' | jq -r 'select(.type=="message_start") | "model: " + .message.model'
	echo "$out" | sed -n 's/^data: //p' | jq -rj 'select(.type=="content_block_delta") | .delta.text'
	echo
done
SH
# The Codex CLI 0.171.0's default: gpt-6.2-sol; Responses, streamed, to the
# profile's base_url + /responses, its env_key's value as a bearer.
cat >"$WORK/bin/codex" <<'SH'
#!/usr/bin/env bash
[ "$1 $2" = "exec --profile" ] || exit 2
conf=$HOME/.codex/$3.config.toml
base_url=$(sed -n 's/^base_url = "\(.*\)"/\1/p' "$conf")
key=$(sed -n 's/^env_key = "\(.*\)"/\1/p' "$conf")
body=$(jq -nc --arg p "${!#}" '{model:"gpt-6.2-sol",instructions:"You are Codex.",input:[{type:"message",role:"user",content:[{type:"input_text",text:$p}]}],tools:[],tool_choice:"auto",parallel_tool_calls:false,store:false,stream:true,include:[]}')
curl -s -N "$base_url/responses" -H "Authorization: Bearer ${!key}" -H 'content-type: application/json' -d "$body" |
	sed -n 's/^data: //p' | jq -rj 'select(.type=="response.output_text.delta") | .delta'
echo
SH
chmod +x "$WORK/bin/claude" "$WORK/bin/codex"
export PATH=$WORK/bin:$PATH

block=${block//go run ./\"\$BRAMA\"}
block=${block//127.0.0.1:8080/${BRAMA_URL#http://}}
eval "$block" >"$WORK/block.out" 2>&1 || { cat "$WORK/block.out" >&2; exit 1; }
expect "Claude Code's default model, served as itself" "$(grep -c '^model: claude-opus-5-5$' "$WORK/block.out")" "1"
expect "Claude Code's small model, served as itself" "$(grep -c '^model: claude-haiku-4-5$' "$WORK/block.out")" "1"
expect "three answers: Claude Code's two, the Codex CLI's one" "$(grep -c '^Hello from the stub provider\.$' "$WORK/block.out")" "3"
expect "nothing refused" "$(grep '"msg":"request"' "$WORK/brama.err" | jq -r 'select(.outcome != "ok") | .outcome' | sort -u)" ""
expect "the Codex CLI's name went to the gpt-* route" "$(grep '"msg":"request"' "$WORK/brama.err" | jq -r 'select(.requested_model == "gpt-6.2-sol") | .route')" "anthropic/claude-sonnet-4-5"
