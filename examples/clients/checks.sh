# Sourced by examples/clients/run: the shared setup and one function per
# check. A check prints nothing (or a short note) and returns 0, or prints
# why it failed and returns 1. Each runs after setup, in this order.
CHECKS=(
	claude-anthropic claude-subscription claude-translate claude-chat claude-api-key
	codex-responses codex-subscription codex-anthropic codex-chat codex-think-responses codex-think-anthropic
	chat-passthrough chat-stream-passthrough
	responses-passthrough responses-stream-passthrough
	messages-passthrough messages-stream-passthrough
	messages-bearer messages-cut-answer count-tokens
	chat-to-messages-schema responses-to-chat-schema messages-to-responses-schema
	dropped-hosted-tool
	ai-generate-openai ai-stream-openai ai-generate-anthropic ai-stream-anthropic
	ai-object-responses-to-messages ai-object-chat-to-responses ai-object-messages-to-chat
	ai-anthropic-error
)
for c in openai anthropic ai claude codex; do
	for m in 400 cut malformed 500; do CHECKS+=("refuse-$c-$m"); done
done
for c in openai anthropic ai; do
	for m in 422 429; do CHECKS+=("refuse-$c-$m"); done
done
CHECKS+=(refuse-openai-401 refuse-anthropic-401 refuse-ai-401 refuse-claude-401 refuse-codex-401 no-credential-openai no-credential-anthropic)
for c in openai anthropic ai claude codex; do CHECKS+=("retries-off-$c"); done
CHECKS+=(no-secrets-kept)

# Model names the clients send by default (see /work/notes/clients-findings.md);
# the registry declares each as an alias whose destination a check sets.
CLAUDE_MODEL=claude-opus-5-5
CODEX_MODEL=gpt-6.2-sol
SECRET=PINEAPPLE-42

# setup starts the fake and brama, declares the agent, its bound client and
# its two donated OAuth grants; on failure it sets SETUP_WHY.
setup() {
	"$WORK/fake" >"$WORK/fake.out" 2>&1 &
	PIDS+=($!)
	wait_line "$WORK/fake.out" '^listening on ' || { SETUP_WHY="the fake did not start"; return 1; }
	FAKE=$(sed -n 's/^listening on //p' "$WORK/fake.out")

	export BRAMA_STATE_DIR="$WORK/state" BRAMA_MODEL_CATALOG_URL=off BRAMA_MODEL_CATALOG_PATH="$WORK/catalog.json"
	for id in OPENAI OPENAI_RESPONSES ANTHROPIC OPENROUTER GROQ MISTRAL DEEPSEEK XAI TOGETHER FIREWORKS CEREBRAS CLAUDE_CODE CODEX KIMI; do
		export "BRAMA_PROVIDER_${id}_BASE_URL=http://127.0.0.1:9"
	done
	export BRAMA_PROVIDER_CODEX_USAGE_URL=http://127.0.0.1:9
	for id in CLAUDE_CODE CODEX KIMI; do export "BRAMA_OAUTH_${id}_TOKEN_URL=http://127.0.0.1:9"; done
	export BRAMA_PROVIDER_ANTHROPIC_BASE_URL=$FAKE/anthropic BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL=$FAKE/claude-code \
		BRAMA_PROVIDER_OPENAI_BASE_URL=$FAKE/openai/v1 BRAMA_PROVIDER_OPENAI_RESPONSES_BASE_URL=$FAKE/openai/v1 \
		BRAMA_PROVIDER_CODEX_BASE_URL=$FAKE/codex \
		BRAMA_OAUTH_CLAUDE_CODE_TOKEN_URL=$FAKE/oauth/token BRAMA_OAUTH_CODEX_TOKEN_URL=$FAKE/oauth/token
	# claude-sonnet-4-5: the Quick start's gpt-* destination (quickstart.sh);
	# a translation to it takes its output limit from the catalogue.
	model() { printf '"%s":{"id":"%s","release_date":"2026-01-01","limit":{"context":200000,"output":8192},"modalities":{"input":["text","image"],"output":["text"]}}' "$1" "$1"; }
	printf '{"anthropic":{"id":"anthropic","models":{%s,%s,%s}},"openai":{"id":"openai","models":{%s,%s,%s}}}\n' \
		"$(model claude-fake)" "$(model "$CLAUDE_MODEL")" "$(model claude-sonnet-4-5)" "$(model gpt-fake-chat)" "$(model gpt-fake-responses)" "$(model "$CODEX_MODEL")" >"$WORK/catalog.json"

	printf '{"anthropic":"fake-anthropic-key","openai":"fake-openai-key","openai-responses":"fake-openai-key"}' >"$WORK/creds"
	"$WORK/brama" serve -addr 127.0.0.1:0 -local-credentials-stdin <"$WORK/creds" >"$WORK/brama.out" 2>"$WORK/brama.err" &
	BRAMA_PID=$!
	PIDS+=($!)
	wait_line "$WORK/brama.out" '^listening on ' || { SETUP_WHY="brama serve did not start: $(tail -2 "$WORK/brama.err")"; return 1; }
	BRAMA_URL=$(sed -n 's/^listening on //p' "$WORK/brama.out")
	ADMIN=$(sed -n 's/.*bearer token (shown once): //p' "$WORK/brama.err" | head -1)
	APP=$("$WORK/brama" clients add app-a1 -agent a1 2>/dev/null) || { SETUP_WHY="clients add"; return 1; }
	local exp=$(($(date +%s) * 1000 + 86400000))
	printf '{"access_token":"fake-cc-access","refresh_token":"fake-cc-refresh","expires_at_ms":%s}' "$exp" >"$WORK/cc.json"
	printf '{"access_token":"fake-codex-access","refresh_token":"fake-codex-refresh","expires_at_ms":%s,"account_id":"acct-fake"}' "$exp" >"$WORK/codex.json"
	for p in claude-code codex; do
		f=$WORK/cc.json
		[ $p = codex ] && f=$WORK/codex.json
		BRAMA_TOKEN=$ADMIN "$WORK/brama" subscription add -gateway "$BRAMA_URL" -provider $p -agent a1 -oauth-file "$f" >/dev/null 2>&1 </dev/null ||
			{ SETUP_WHY="donating the $p grant failed"; return 1; }
	done
	set_alias to-chat openai/gpt-fake-chat && set_alias to-responses openai-responses/gpt-fake-responses &&
		set_alias to-messages anthropic/claude-fake || { SETUP_WHY="declaring aliases failed"; return 1; }

	# The project the CLIs work in: a git repository holding the file the
	# scripted tool turn reads.
	PROJ=$WORK/proj
	mkdir -p "$PROJ" "$WORK/home" "$WORK/codex-home"
	echo "The secret word is $SECRET." >"$PROJ/note.txt"
	git -C "$PROJ" init -q && git -C "$PROJ" add note.txt && git -C "$PROJ" -c user.name=x -c user.email=x@x commit -qm init
}

# wait_line FILE PATTERN: poll until FILE has a line matching PATTERN (10 s).
wait_line() {
	for _ in $(seq 100); do
		grep -q "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# set_alias ALIAS ROUTE declares (or moves) an alias through the admin API.
set_alias() {
	local out
	out=$(curl -s -X PUT -H "Authorization: Bearer $ADMIN" -d "{\"alias\":\"$1\",\"route\":\"$2\"}" "$BRAMA_URL/v1/admin/routes")
	[ "$(echo "$out" | jq -r .ok)" = true ] || { echo "alias $1 → $2 refused: $out"; return 1; }
}

# script JSON replaces the fake's script and forgets its recorded calls.
script() { curl -sf -d "$1" "$FAKE/_script" || echo "the fake refused the script $1"; }
# calls prints the fake's recorded calls (a JSON array).
calls() { curl -sf "$FAKE/_calls"; }
# marker makes a string unique to this check's requests.
marker() { echo "MARK-$1-$RANDOM$RANDOM"; }
# count_marked M: the fake's calls whose body carries marker M.
count_marked() { calls | jq --arg m "$1" '[.[] | select(.body | contains($m))] | length'; }

# cli_env: the environment every CLI runs with: fresh HOME, a dead proxy
# for anything not on loopback, no telemetry, no auto-update.
cli_env() {
	echo PATH="$PATH" HOME="$WORK/home" LANG=C.UTF-8 TERM=dumb \
		HTTPS_PROXY=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 http_proxy=http://127.0.0.1:9 \
		NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost \
		DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 DISABLE_BUG_COMMAND=1 \
		CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 CODEX_HOME="$WORK/codex-home"
}

# claude [ENV=V...] -- PROMPT: `claude -p PROMPT` in the project with
# ANTHROPIC_BASE_URL at Brama and the agent-bound client's token as
# ANTHROPIC_AUTH_TOKEN unless ENV overrides; stdout in $WORK/claude.out.
claude() {
	local extra=()
	while [ "$1" != -- ]; do extra+=("$1"); shift; done
	shift
	local auth=(ANTHROPIC_AUTH_TOKEN="$APP")
	[[ " ${extra[*]} " == *" ANTHROPIC_API_KEY="* ]] && auth=()
	# shellcheck disable=SC2046
	(cd "$PROJ" && env -i $(cli_env) ANTHROPIC_BASE_URL="$BRAMA_URL" "${auth[@]}" "${extra[@]}" \
		timeout "${CLI_TIMEOUT:-45}" "$BIN/claude" -p "$1" </dev/null >"$WORK/claude.out" 2>"$WORK/claude.err")
}

# codex [CONFIG-LINES] -- PROMPT: `codex exec PROMPT` whose config.toml is
# only a model provider block pointing at Brama (plus CONFIG-LINES inside it),
# with update checks and analytics off.
codex() {
	local extra=()
	while [ "$1" != -- ]; do extra+=("$1"); shift; done
	shift
	{
		echo 'model_provider = "brama"'
		echo 'check_for_update_on_startup = false # no update check, no analytics:'
		echo '[analytics]                        # nothing here shapes a model request'
		echo 'enabled = false'
		echo
		echo '[model_providers.brama]'
		echo 'name = "Brama"'
		echo "base_url = \"$BRAMA_URL/v1\""
		echo 'env_key = "BRAMA_API_KEY"'
		echo 'wire_api = "responses"'
		printf '%s\n' "${extra[@]}"
	} >"$WORK/codex-home/config.toml"
	# shellcheck disable=SC2046
	(cd "$PROJ" && env -i $(cli_env) BRAMA_API_KEY="$APP" \
		timeout "${CLI_TIMEOUT:-45}" "$BIN/codex" exec "$1" </dev/null >"$WORK/codex.out" 2>"$WORK/codex.err")
}

# sdk CASE MODEL [ENV=V...]: run one sdk.mjs case; its JSON in $WORK/sdk.json.
sdk() {
	local kase=$1 model=$2
	shift 2
	(cd "$WORK" && env BRAMA_URL="$BRAMA_URL" BRAMA_CLIENT_TOKEN="$APP" "$@" timeout "${CLI_TIMEOUT:-45}" node sdk.mjs "$kase" "$model" >"$WORK/sdk.json" 2>"$WORK/sdk.err")
	[ -s "$WORK/sdk.json" ] || { echo "node sdk.mjs $kase printed nothing: $(tail -3 "$WORK/sdk.err")"; return 1; }
}
sdk_field() { jq -r "$@" "$WORK/sdk.json"; }
# sdk_ok: the case returned a result (else say its error).
sdk_ok() {
	[ "$(sdk_field '.error')" = null ] && return 0
	echo "the SDK failed: $(sdk_field '.error.message' | head -c 400)"
	return 1
}

# cli_failed CLI RC says how a CLI run failed.
cli_failed() {
	local why="exited $2"
	[ "$2" = 124 ] && why="still running after ${CLI_TIMEOUT:-45}s (stopped)"
	echo "$1 $why: $(brief "$WORK/$1.out") $(brief "$WORK/$1.err" | tail -c 250)"
}

# brief FILE: the last lines of a client's output, on one line.
brief() { tail -c 300 "$1" | tr '\n' ' '; }

# --- Claude Code --------------------------------------------------------

# claude_tool_turn ROUTE ROLE: Claude Code's default model resolves to
# ROUTE; the fake (as ROLE) answers a Read of note.txt, then quotes the
# tool_result; the answer must carry the file's secret.
claude_tool_turn() {
	set_alias "$CLAUDE_MODEL" "$1" || return 1
	script "$(jq -nc --arg f "$PROJ/note.txt" '{tool:"Read", args:({file_path:$f}|tojson)}')"
	claude -- "Read note.txt and tell me the secret word." || { cli_failed claude $?; return 1; }
	grep -q "$SECRET" "$WORK/claude.out" || { echo "no tool result in the answer: $(brief "$WORK/claude.out")"; return 1; }
	local roles
	roles=$(calls | jq -r '[.[] | .role + ":" + .answer] | join(",")')
	[[ $roles == *"$2:tool"*"$2:text"* ]] || { echo "the fake saw $roles, want a $2 tool call then a $2 text"; return 1; }
	[ "$2" = openai ] && return 0
	# Passthrough: Claude Code's own members and betas reach the provider.
	local first
	first=$(calls | jq -c '.[0] | {beta: .headers["anthropic-beta"], body: (.body | fromjson | {m1: .messages[1].role, thinking, output_config, context_management})}')
	jq -e '(.beta | contains("claude-code-20250219")) and .body.m1 == "system" and .body.thinking != null and .body.output_config != null and .body.context_management != null' <<<"$first" >/dev/null ||
		{ echo "Claude Code's request did not pass through: $first"; return 1; }
}
check_claude_anthropic() { claude_tool_turn "anthropic/$CLAUDE_MODEL" anthropic; }
check_claude_subscription() { claude_tool_turn "claude-code/$CLAUDE_MODEL" claude-code; }
check_claude_translate() { claude_tool_turn openai-responses/gpt-fake-responses openai; }
check_claude_chat() { claude_tool_turn openai/gpt-fake-chat openai; }
check_claude_api_key() {
	set_alias "$CLAUDE_MODEL" "anthropic/$CLAUDE_MODEL" || return 1
	script '{}'
	claude ANTHROPIC_API_KEY="$APP" -- "Say hello." || { cli_failed claude $?; return 1; }
	grep -q "Hello from the fake provider" "$WORK/claude.out" || { echo "unexpected answer: $(brief "$WORK/claude.out")"; return 1; }
	[ "$(calls | jq --arg t "$APP" '[.[] | select(.headers | tostring | contains($t))] | length')" = 0 ] || { echo "Brama's token reached the provider"; return 1; }
}

# --- Codex CLI ----------------------------------------------------------

# The Codex CLI's default model offers a free-form `exec` tool (JavaScript
# that calls tools.exec_command); across formats it is flattened to
# functions__exec: toward messages a function taking one string member
# input, toward chat a custom tool still. ROLE openai-chat is the fake's
# openai role translated to (chat).
CODEX_JS='const r = await tools.exec_command({cmd: "cat note.txt"});
text(typeof r === "string" ? r : JSON.stringify(r));'
codex_tool_turn() {
	set_alias "$CODEX_MODEL" "$1" || return 1
	local tool=exec args=$CODEX_JS role=${2%-chat}
	case $2 in
	anthropic) tool=functions__exec args=$(jq -nc --arg js "$CODEX_JS" '{input:$js}') ;;
	openai-chat) tool=functions__exec ;;
	esac
	script "$(jq -nc --arg t "$tool" --arg a "$args" --argjson x "${CODEX_SCRIPT:-{\}}" '{tool:$t, args:$a} + $x')"
	codex -- "Run cat note.txt and tell me the secret word." || { cli_failed codex $?; return 1; }
	local roles
	roles=$(calls | jq -r '[.[] | .role + ":" + .answer] | join(",")')
	[[ $roles == *"$role:tool"*"$role:text"* ]] ||
		{ echo "the fake saw $roles, want a $role call to $tool then a $role text; it was offered: $(offered_tools)"; return 1; }
	if [ "$2" = openai ] || [ "$2" = codex ]; then
		# Passthrough: the Codex CLI's own members reach the provider.
		local first
		first=$(calls | jq -c '.[0].body | fromjson | {t0: .input[0].type, include, pck: (.prompt_cache_key != null), cm: (.client_metadata != null), reasoning}')
		jq -e '.t0 == "additional_tools" and .include != null and .pck and .cm and .reasoning != null' <<<"$first" >/dev/null ||
			{ echo "the Codex CLI's request did not pass through: $first"; return 1; }
	fi
	grep -q "exec_command\|cat note.txt" "$WORK/codex.err" "$WORK/codex.out" || { echo "no exec_command ran: $(brief "$WORK/codex.err")"; return 1; }
	grep -q "$SECRET" "$WORK/codex.out" || { echo "no tool result in the answer: $(brief "$WORK/codex.out") $(brief "$WORK/codex.err")"; return 1; }
}
# offered_tools: the tool names the fake's first call offered (nested
# groups as group/name), to say why no tool was called.
offered_tools() {
	calls | jq -r '.[0].body | fromjson | [(.tools // []), ([(.input // [])[] | objects | select(.type == "additional_tools") | .tools[]])] | flatten |
		map(if .type == "namespace" then .name + "/{" + ([.tools[].name] | join(",")) + "}" else (.name // .function.name // .type) end) | join(" ")' 2>/dev/null | head -c 300
}
check_codex_responses() { codex_tool_turn "openai-responses/$CODEX_MODEL" openai; }
check_codex_subscription() { codex_tool_turn "codex/$CODEX_MODEL" codex; }
check_codex_anthropic() { codex_tool_turn anthropic/claude-fake anthropic; }
check_codex_chat() { codex_tool_turn openai/gpt-fake-chat openai-chat; }
# CODEX_SCRIPT adds to the fake's script: here it thinks before the call.
THINK='{"think":"The file holds the word."}'
check_codex_think_responses() { CODEX_SCRIPT=$THINK codex_tool_turn "openai-responses/$CODEX_MODEL" openai; }
check_codex_think_anthropic() { CODEX_SCRIPT=$THINK codex_tool_turn anthropic/claude-fake anthropic; }

# --- After everything ---------------------------------------------------

# no-secrets-kept: after the checks before it, Brama's log and state hold
# no credential, bearer, prompt or provider body (the vault aside).
check_no_secrets_kept() {
	local s hits=()
	for s in fake-anthropic-key fake-openai-key fake-cc-access fake-cc-refresh fake-codex-access "$APP" "$SECRET" "tell me the secret word"; do
		if grep -rlqF --exclude=vault.json -e "$s" "$WORK/brama.err" "$WORK/brama.out" "$BRAMA_STATE_DIR"; then
			hits+=("${s:0:12}…")
		fi
	done
	[ ${#hits[@]} -eq 0 ] || { echo "found in Brama's log or state: ${hits[*]}"; return 1; }
}
