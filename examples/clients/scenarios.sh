# Sourced by examples/clients/run: the wire scenarios (scenarios.mjs). Each
# check runs one SDK case against all three aliases in one node process:
# the alias of the caller's own format passes through, the other two are
# translated; a check fails when the SDK throws or sees a wrong shape on
# any of them, and says which.
ALIASES=to-chat,to-messages,to-responses
CHECKS+=(tools-chat tools-chat-stream tools-responses tools-responses-stream tools-messages tools-messages-stream)
for p in openai openai-chat anthropic; do CHECKS+=("ai-tools-$p" "ai-tools-$p-stream"); done
CHECKS+=(image-chat image-responses image-messages tool-image-messages tool-image-responses stop-messages)
CHECKS+=(usage-chat usage-messages usage-responses)
CHECKS+=(reasoning-chat-stream reasoning-responses-stream reasoning-messages reasoning-messages-stream)
CHECKS+=(abort-chat abort-messages abort-responses)
CHECKS+=(tools-said-chat-stream tools-said-responses-stream tools-said-messages-stream ai-tools-anthropic-said-stream ai-tools-openai-said-stream ai-tools-openai-said-unstored-stream)
CHECKS+=(length-chat-stream length-messages-stream length-responses-stream)
CHECKS+=(length-ai-openai-stream length-ai-anthropic-stream)
for c in openai anthropic ai; do
	for m in cut malformed inband; do CHECKS+=("fail-$c-$m-stream"); done
done
CHECKS+=(count-tokens-across forced-chat-stream forced-responses-stream forced-messages-stream)
for p in openai openai-chat anthropic; do CHECKS+=("ai-stream-object-$p"); done
CHECKS+=(document-messages)
CHECKS+=(interleaved-messages-stream interleaved-responses-stream interleaved-chat-stream interleaved-ai-anthropic-stream interleaved-ai-openai-stream claude-interleaved)
CHECKS+=(claude-parallel-anthropic claude-parallel-translate claude-parallel-chat claude-parallel-kimi-ids claude-image-translate claude-image-chat)

# role_path ALIAS: the fake's path its calls reach.
role_path() {
	case $1 in
	to-chat) echo /openai/v1/chat/completions ;;
	to-responses) echo /openai/v1/responses ;;
	to-messages) echo /anthropic/v1/messages ;;
	esac
}

# across CASE [ENV=V...]: run CASE on every alias; each alias's failure is
# said as "ALIAS: why".
across() {
	local kase=$1 a why fails=()
	shift
	sdk "$kase" "$ALIASES" "$@" || return 1
	for a in ${ALIASES//,/ }; do
		why=$(sdk_field --arg a "$a" '.results[$a].error.message // empty' | head -c 300)
		[ -z "$why" ] || fails+=("$a: $why")
	done
	[ ${#fails[@]} -eq 0 ] && return 0
	printf '%s; ' "${fails[@]}"
	return 1
}
# result ALIAS FILTER: jq FILTER over ALIAS's result.
result() { jq -c --arg a "$1" ".results[\$a].result | $2" "$WORK/sdk.json"; }
# expect ALIAS FILTER WANT: FILTER over ALIAS's result is WANT, else say so.
expect() {
	local got
	got=$(result "$1" "$2")
	[ "$got" = "$3" ] && return 0
	echo "$1: $2 is $got, want $3"
	return 1
}
# provider_bodies ALIAS: the bodies the fake got from ALIAS's calls, one a line.
provider_bodies() { calls | jq -c --arg p "$(role_path "$1")" '.[] | select(.path == $p) | .body | fromjson'; }
# dropped ALIAS: Brama-Dropped of ALIAS's last answer.
dropped() { sdk_field --arg a "$1" '[.calls[] | select(.model == $a)][-1].respHeaders["brama-dropped"] // ""'; }

# --- Tool loops: two parallel calls, then a turn of both results --------

PARALLEL='{"calls":[{"tool":"get_weather","args":"{\"city\":\"Oslo\"}"},{"tool":"get_time","args":"{\"city\":\"Oslo\"}"}]}'
tools_loop() {
	script "${TOOLS_SCRIPT:-$PARALLEL}"
	across "$@" || return 1
	local a n
	for a in ${ALIASES//,/ }; do
		n=$(calls | jq --arg p "$(role_path "$a")" '[.[] | select(.path == $p) | .answer] | join(",")')
		[ "$n" = '"tool,text"' ] || { echo "$a: the fake answered $n, want a tool turn then a text"; return 1; }
	done
}
check_tools_chat() { tools_loop chat-tools; }
check_tools_chat_stream() { tools_loop chat-tools STREAM=1; }
check_tools_responses() { tools_loop responses-tools; }
check_tools_responses_stream() { tools_loop responses-tools STREAM=1; }
check_tools_messages() { tools_loop messages-tools; }
check_tools_messages_stream() { tools_loop messages-tools STREAM=1; }
for p in openai openai-chat anthropic; do
	eval "check_ai_tools_${p//-/_}() { tools_loop ai-tools AI_PROVIDER=$p; }"
	eval "check_ai_tools_${p//-/_}_stream() { tools_loop ai-tools AI_PROVIDER=$p STREAM=1; }"
done

# tools_said CASE [ENV=V...]: the tool turn opens with a text (as Claude's
# usually do); every SDK shows that text beside its calls.
SAID="Let me look that up."
tools_said() {
	TOOLS_SCRIPT=$(jq -c --arg s "$SAID" '. + {say: $s}' <<<"$PARALLEL") tools_loop "$@" || return 1
	local a
	for a in ${ALIASES//,/ }; do
		expect "$a" .said "\"$SAID\"" || return 1
	done
}
check_tools_said_chat_stream() { tools_said chat-tools STREAM=1; }
check_tools_said_responses_stream() { tools_said responses-tools STREAM=1; }
check_tools_said_messages_stream() { tools_said messages-tools STREAM=1; }
check_ai_tools_anthropic_said_stream() { tools_said ai-tools AI_PROVIDER=anthropic STREAM=1; }
# With its default store: true the Responses provider sends the text back
# as an item_reference, which translation drops and names (README, Real clients).
check_ai_tools_openai_said_stream() { tools_said ai-tools AI_PROVIDER=openai STREAM=1; }
check_ai_tools_openai_said_unstored_stream() { tools_said ai-tools AI_PROVIDER=openai AI_STORE=false STREAM=1; }

# interleaved CASE [ENV=V...]: a chat provider starts both calls, then
# alternates their arguments; every caller still gets both calls whole.
interleaved() {
	TOOLS_SCRIPT=$(jq -c '. + {interleave: true}' <<<"$PARALLEL") ALIASES=to-chat,to-messages tools_loop "$@"
}
check_interleaved_messages_stream() { interleaved messages-tools STREAM=1; }
check_interleaved_responses_stream() { interleaved responses-tools STREAM=1; }
check_interleaved_chat_stream() { interleaved chat-tools STREAM=1; }
check_interleaved_ai_anthropic_stream() { interleaved ai-tools AI_PROVIDER=anthropic STREAM=1; }
check_interleaved_ai_openai_stream() { interleaved ai-tools AI_PROVIDER=openai STREAM=1; }

# --- Images and stop sequences: what the provider was asked --------------

PNG_HEAD=iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB
image_across() {
	script '{}'
	across "$1" || return 1
	local a want
	for a in ${ALIASES//,/ }; do
		case $a in
		to-chat) want='.messages[-1].content[] | select(.type == "image_url") | .image_url.url' ;;
		to-responses) want='.input[-1].content[] | select(.type == "input_image") | .image_url' ;;
		to-messages) want='.messages[-1].content[] | select(.type == "image") | .source | "data:" + .media_type + ";base64," + .data' ;;
		esac
		provider_bodies "$a" | jq -r "$want" | grep -q "^data:image/png;base64,$PNG_HEAD" ||
			{ echo "$a: the provider got no image part: $(provider_bodies "$a" | head -c 300)"; return 1; }
	done
}
check_image_chat() { image_across chat-image; }

# tool_image_across CASE: a tool result's image reaches the providers whose
# tool results hold images (messages, responses); toward chat it is named
# in Brama-Dropped.
tool_image_across() {
	script '{"tool":"get_weather","args":"{\"city\":\"Oslo\"}"}'
	across "$1" || return 1
	local a got
	for a in to-messages to-responses; do
		case $a in
		to-responses) got='.input[] | select(.type == "function_call_output") | .output | arrays | .[] | select(.type == "input_image") | .image_url' ;;
		to-messages) got='.messages[-1].content[] | select(.type == "tool_result") | .content | arrays | .[] | select(.type == "image") | .source | "data:" + .media_type + ";base64," + .data' ;;
		esac
		provider_bodies "$a" | tail -1 | jq -r "$got" | grep -q "^data:image/png;base64,$PNG_HEAD" ||
			{ echo "$a: the tool result's image did not reach the provider (Brama-Dropped: $(dropped "$a"))"; return 1; }
	done
	[ -n "$(dropped to-chat)" ] || { echo "to-chat: the tool result's image is not named in Brama-Dropped"; return 1; }
}
check_tool_image_messages() { tool_image_across messages-tool-image; }
check_tool_image_responses() { tool_image_across responses-tool-image; }
check_image_responses() { image_across responses-image; }
check_image_messages() { image_across messages-image; }

# stop_across CASE MEMBER: the stop sequences reach chat's stop and
# messages' stop_sequences; toward responses (none) MEMBER is named dropped.
stop_across() {
	script '{}'
	across "$1" || return 1
	local got
	got=$(provider_bodies to-chat | jq -c .stop)
	[ "$got" = '["END","STOP"]' ] || { echo "to-chat: the provider's stop is $got"; return 1; }
	got=$(provider_bodies to-messages | jq -c .stop_sequences)
	[ "$got" = '["END","STOP"]' ] || { echo "to-messages: the provider's stop_sequences is $got"; return 1; }
	[[ ",$(dropped to-responses | tr -d ' ')," == *",$2,"* ]] || { echo "to-responses: Brama-Dropped is '$(dropped to-responses)', want it to name $2"; return 1; }
}
check_stop_messages() { stop_across messages-stop stop_sequences; }

# --- Usage at a stream's end --------------------------------------------

check_usage_chat() {
	script '{}'
	across chat-usage || return 1
	local a
	for a in ${ALIASES//,/ }; do
		expect "$a" .text '"Hello from the fake provider."' && expect "$a" .lastChoices 0 && expect "$a" .usageChunks 1 &&
			expect "$a" '.usage | [.prompt_tokens, .completion_tokens, .total_tokens]' '[10,5,15]' || return 1
	done
}
usage_across() {
	script '{}'
	across "$1" || return 1
	local a
	for a in ${ALIASES//,/ }; do
		expect "$a" .text '"Hello from the fake provider."' && expect "$a" '.usage | [.input_tokens, .output_tokens]' '[10,5]' || return 1
	done
}
check_usage_messages() { usage_across messages-usage; }
check_usage_responses() { usage_across responses-usage; }

# --- Reasoning: asked in each dialect, answered with reasoning first ------

# reasoning_across CASE OWN KIND [STREAM=1]: every alias answers the text;
# the caller's own alias (OWN) shows the provider's reasoning KIND too.
reasoning_across() {
	local kase=$1 own=$2 kind=$3
	shift 3
	script '{"think":"The caller wants a greeting."}'
	across "$kase" "$@" || return 1
	local a
	for a in ${ALIASES//,/ }; do
		expect "$a" .text '"Hello from the fake provider."' || return 1
	done
	[ -z "$kind" ] || expect "$own" "[.types[] | select(. == \"$kind\")] | length" 1 || return 1
	local asked
	asked=$(provider_bodies to-messages | jq -c '.thinking.type // "none"')
	[ "$asked" = '"enabled"' ] || { echo "to-messages: the provider was not asked to think (thinking: $asked)"; return 1; }
	asked=$(provider_bodies to-chat | jq -c '.reasoning_effort // "none"')
	[ "$asked" != '"none"' ] || { echo "to-chat: the provider got no reasoning_effort"; return 1; }
	asked=$(provider_bodies to-responses | jq -c '.reasoning.effort // "none"')
	[ "$asked" != '"none"' ] || { echo "to-responses: the provider got no reasoning.effort"; return 1; }
}
check_reasoning_chat_stream() { reasoning_across chat-reasoning to-chat "" STREAM=1; }
check_reasoning_responses_stream() { reasoning_across responses-reasoning to-responses reasoning STREAM=1; }
check_reasoning_messages() { reasoning_across messages-reasoning to-messages thinking; }
check_reasoning_messages_stream() { reasoning_across messages-reasoning to-messages thinking STREAM=1; }

# --- The caller aborts mid-stream ---------------------------------------

# abort_across CASE: after each alias's abort the fake saw its stream's
# caller (Brama) hang up, and Brama logged client_cancelled.
abort_across() {
	local before
	before=$(grep -c '"outcome":"client_cancelled"' "$WORK/brama.err")
	script '{"hold":true}'
	across "$1" || return 1
	local a got
	for _ in $(seq 50); do
		[ "$(calls | jq length)" -ge 3 ] && break
		sleep 0.1
	done
	for a in ${ALIASES//,/ }; do
		got=$(calls | jq -r --arg p "$(role_path "$a")" '[.[] | select(.path == $p) | .answer] | join(",")')
		[ "$got" = hung-up ] || { echo "$a: the provider call was not cancelled (the fake answered '$got')"; return 1; }
	done
	got=$(($(grep -c '"outcome":"client_cancelled"' "$WORK/brama.err") - before))
	[ "$got" = 3 ] || { echo "Brama logged $got client_cancelled requests, want 3"; return 1; }
}
check_abort_chat() { abort_across chat-abort; }
check_abort_messages() { abort_across messages-abort; }
check_abort_responses() { abort_across responses-abort; }

# --- An answer cut at its output limit ------------------------------------

# length_across CASE WANT [ENV=V...]: every alias's answer ends as WANT says.
length_across() {
	local kase=$1 want=$2 a
	shift 2
	script '{"finish":"length"}'
	across "$kase" "$@" || return 1
	for a in ${ALIASES//,/ }; do
		expect "$a" .finish "\"$want\"" && expect "$a" .text '"Hello from the fake provider."' || return 1
	done
}
check_length_chat_stream() { length_across chat-length length STREAM=1; }
check_length_messages_stream() { length_across messages-length max_tokens STREAM=1; }
check_length_responses_stream() { length_across responses-length incomplete:max_output_tokens STREAM=1; }
check_length_ai_openai_stream() { length_across ai-length length AI_PROVIDER=openai STREAM=1; }
check_length_ai_anthropic_stream() { length_across ai-length length AI_PROVIDER=anthropic STREAM=1; }

# --- A stream that fails after commit, on every alias --------------------

# fail_across CLIENT MODE [ALIASES]: the streamed request fails in the SDK
# (never a clean success) after exactly one provider call on each alias.
fail_across() {
	local m a n fails=() aliases=${3:-$ALIASES}
	m=$(marker "$1-$2-stream")
	script "$(jq -nc --arg f "$2" --arg m "$m" '{fail:$f, match:$m}')"
	sdk "refuse-$1" "$aliases" STREAM=1 MARKER="$m" || return 1
	for a in ${aliases//,/ }; do
		n=$(calls | jq --arg p "$(role_path "$a")" --arg m "$m" '[.[] | select(.path == $p and (.body | contains($m)))] | length')
		if [ "$(sdk_field --arg a "$a" '.results[$a].error')" = null ]; then
			fails+=("$a: the SDK reported success: $(sdk_field --arg a "$a" '.results[$a].result' | head -c 150)")
		elif [ "$n" != 1 ]; then
			fails+=("$a: $n provider calls, want 1")
		fi
	done
	[ ${#fails[@]} -eq 0 ] && return 0
	printf '%s; ' "${fails[@]}"
	return 1
}
for c in openai anthropic ai; do
	for m in cut malformed inband; do
		eval "check_fail_${c}_${m}_stream() { fail_across $c $m; }"
	done
done
# The Vercel AI SDK retries, with its backoff, a stream that fails before
# any output (the replay guard answers the retries): one alias is enough.
check_fail_ai_malformed_stream() { fail_across ai malformed to-chat,; }

check_count_tokens_across() {
	script '{}'
	across count-tokens-across || return 1
	local a
	for a in ${ALIASES//,/ }; do
		result "$a" . | grep -qE '^[1-9][0-9]*$' || { echo "$a: input_tokens is $(result "$a" .)"; return 1; }
	done
	expect to-messages . 42
}

# forced_across CASE [ENV=V...]: a tool forced by name is the one call
# every alias answers, in the caller's own form.
forced_across() {
	script '{}'
	across "$@" || return 1
	local a got
	for a in ${ALIASES//,/ }; do
		got=$(result "$a" '. | join(";")')
		[[ $got == '"get_time {\"city\":\"fake\"}"' ]] || { echo "$a: the calls are $got, want get_time alone"; return 1; }
	done
}
check_forced_chat_stream() { forced_across chat-forced STREAM=1; }
check_forced_responses_stream() { forced_across responses-forced STREAM=1; }
check_forced_messages_stream() { forced_across messages-forced STREAM=1; }

ai_stream_object() {
	script '{}'
	across ai-stream-object AI_PROVIDER="$1" || return 1
	local a
	for a in ${ALIASES//,/ }; do
		expect "$a" '.object | [(.greeting | type), (.count | type)]' '["string","number"]' && expect "$a" .partials true || return 1
	done
}
for p in openai openai-chat anthropic; do
	eval "check_ai_stream_object_${p//-/_}() { ai_stream_object $p; }"
done

# document_across CASE: the PDF reaches every provider in its own part.
PDF_HEAD=JVBERi0xLjQK
document_across() {
	script '{}'
	across "$1" || return 1
	local a want
	for a in ${ALIASES//,/ }; do
		case $a in
		to-chat) want='.messages[-1].content[] | select(.type == "file") | .file.file_data' ;;
		to-responses) want='.input[-1].content[] | select(.type == "input_file") | .file_data' ;;
		to-messages) want='.messages[-1].content[] | select(.type == "document") | .source | "data:" + .media_type + ";base64," + .data' ;;
		esac
		provider_bodies "$a" | jq -r "$want" | grep -q "^data:application/pdf;base64,$PDF_HEAD" ||
			{ echo "$a: the provider got no document part (Brama-Dropped: $(dropped "$a")): $(provider_bodies "$a" | head -c 300)"; return 1; }
	done
}
check_document_messages() { document_across messages-document; }

# --- Claude Code: parallel Reads with thinking, and a Read of a picture ---

# claude_parallel ROUTE [ID ID]: the fake thinks, then calls Read on two
# files at once (with these call ids: kimi's are functions.Read:0, …);
# Claude Code runs both and the answer quotes both results.
claude_parallel() {
	set_alias "$CLAUDE_MODEL" "$1" || return 1
	echo "The other word is MANGO-7." >"$PROJ/other.txt"
	script "$(jq -nc --arg a "$PROJ/note.txt" --arg b "$PROJ/other.txt" --arg i "${2:-}" --arg j "${3:-}" \
		'{think: "Two files to read.", calls: [{tool: "Read", args: ({file_path: $a} | tojson), id: $i}, {tool: "Read", args: ({file_path: $b} | tojson), id: $j}]}')"
	claude -- "Read note.txt and other.txt and tell me both words." || { cli_failed claude $?; return 1; }
	grep -q "$SECRET" "$WORK/claude.out" && grep -q MANGO-7 "$WORK/claude.out" ||
		{ echo "the answer lacks a tool result: $(brief "$WORK/claude.out")"; return 1; }
}
check_claude_parallel_anthropic() { claude_parallel "anthropic/$CLAUDE_MODEL"; }
check_claude_parallel_translate() { claude_parallel openai-responses/gpt-fake-responses; }
check_claude_parallel_chat() { claude_parallel openai/gpt-fake-chat; }
check_claude_interleaved() {
	set_alias "$CLAUDE_MODEL" openai/gpt-fake-chat || return 1
	echo "The other word is MANGO-7." >"$PROJ/other.txt"
	script "$(jq -nc --arg a "$PROJ/note.txt" --arg b "$PROJ/other.txt" \
		'{interleave: true, calls: [{tool: "Read", args: ({file_path: $a} | tojson)}, {tool: "Read", args: ({file_path: $b} | tojson)}]}')"
	claude -- "Read note.txt and other.txt and tell me both words." || { cli_failed claude $?; return 1; }
	grep -q "$SECRET" "$WORK/claude.out" && grep -q MANGO-7 "$WORK/claude.out" ||
		{ echo "the answer lacks a tool result: $(brief "$WORK/claude.out")"; return 1; }
}
check_claude_parallel_kimi_ids() { claude_parallel openai/gpt-fake-chat functions.Read:0 functions.Read:1; }

# claude_image ROUTE ALIAS: Claude Code reads a PNG; its tool result's image
# reaches the provider (responses), or is named dropped (chat).
claude_image() {
	set_alias "$CLAUDE_MODEL" "$1" || return 1
	base64 -d <<<"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==" >"$PROJ/map.png"
	script "$(jq -nc --arg f "$PROJ/map.png" '{tool: "Read", args: ({file_path: $f} | tojson)}')"
	claude -- "Look at map.png." || { cli_failed claude $?; return 1; }
	local last
	last=$(provider_bodies "$2" | tail -1)
	case $2 in
	to-responses)
		jq -e '[.input[] | select(.type == "function_call_output") | .output | arrays | .[] | select(.type == "input_image")] | length == 1' <<<"$last" >/dev/null ||
			{ echo "the picture did not reach the provider: $(jq -c '[.input[] | select(.type == "function_call_output")]' <<<"$last" | head -c 300)"; return 1; } ;;
	to-chat)
		grep -q '"dropped":"\([^"]*, \)\?image[,"]' "$WORK/brama.err" ||
			{ echo "the picture is not named dropped in Brama's log"; return 1; } ;;
	esac
}
check_claude_image_translate() { claude_image openai-responses/gpt-fake-responses to-responses; }
check_claude_image_chat() { claude_image openai/gpt-fake-chat to-chat; }
