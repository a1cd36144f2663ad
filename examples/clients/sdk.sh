# Sourced by examples/clients/run: the official SDKs' checks (issue 8).
# Aliases (set up once): to-chat → openai/gpt-fake-chat, to-responses →
# openai-responses/gpt-fake-responses, to-messages → anthropic/claude-fake.
# A caller whose format is the destination's passes through; any other
# is translated.

# members_diff A B: which top-level members of two JSON objects differ.
members_diff() {
	if ! jq -e 'type == "object"' >/dev/null 2>&1 <<<"$1" || ! jq -e 'type == "object"' >/dev/null 2>&1 <<<"$2"; then
		echo "not both JSON objects: ${2:0:200}"
		return
	fi
	jq -rn --argjson x "$1" --argjson y "$2" '
		($x | keys_unsorted) as $ka | ($y | keys_unsorted) as $kb |
		[($ka - $kb | map("removed " + .)), ($kb - $ka | map("added " + .)),
		 ([$ka[] | . as $k | select(($y | has($k)) and $x[$k] != $y[$k])] | map("changed " + .))] | flatten |
		if length == 0 then "the same members in other bytes or order" else join(", ") end'
}

# sse_lines TEXT: the event: and data: lines of a stream, in order.
sse_lines() { printf '%s' "$1" | tr -d '\r' | grep -E '^(event|data):' | sed 's/^\(event\|data\): */\1:/'; }

# passthrough CASE ALIAS ROUTE ROLE [STREAM]: the SDK's request reaches the
# fake (as ROLE) byte for byte but for model, and the fake's answer reaches
# the SDK unchanged (buffered: the bytes; streamed: every event).
passthrough() {
	local kase=$1 alias=$2 route=$3 role=$4 stream=${5:-0}
	script '{}'
	sdk "$kase" "$alias" STREAM="$stream" || return 1
	sdk_ok || return 1
	local sent got want reply relayed
	sent=$(sdk_field '.calls[-1].body')
	got=$(calls | jq -r --arg r "$role" '[.[] | select(.role == $r)][-1].body // ""')
	local from="\"model\":\"$alias\"" to="\"model\":\"${route#*/}\""
	want=${sent/"$from"/"$to"}
	if [ "$got" != "$want" ]; then
		echo "the provider's body differs from the caller's: $(members_diff "$want" "$got")"
		return 1
	fi
	reply=$(calls | jq -r --arg r "$role" '[.[] | select(.role == $r)][-1].reply')
	relayed=$(sdk_field '.calls[-1].respBody')
	if [ "$stream" = 1 ]; then
		[ "$(sse_lines "$reply")" = "$(sse_lines "$relayed")" ] ||
			{ echo "the caller's events differ from the provider's: $(diff <(sse_lines "$reply") <(sse_lines "$relayed") | head -4 | tr '\n' ' ')"; return 1; }
	else
		[ "$reply" = "$relayed" ] || { echo "the caller's answer differs from the provider's: $(members_diff "$reply" "$relayed")"; return 1; }
	fi
	local hdr
	hdr=$(sdk_field '.calls[-1].respHeaders["brama-route"] // "absent"')
	[ "$hdr" = "$route" ] || { echo "Brama-Route is $hdr, want $route"; return 1; }
	hdr=$(sdk_field '.calls[-1].respHeaders["brama-attempts"] // "absent"')
	[ "$hdr" = 1 ] || { echo "Brama-Attempts is $hdr, want 1"; return 1; }
	is_greeting_json "$(sdk_field .result)" || return 1
}

# is_greeting_json TEXT: TEXT is JSON of sdk.mjs's schema.
is_greeting_json() {
	echo "$1" | jq -e '(.greeting | type) == "string" and (.count | type) == "number" and (.tags | type) == "array"' >/dev/null 2>&1 && return 0
	echo "the answer is not JSON of the schema: $(echo "$1" | head -c 200)"
	return 1
}

check_chat_passthrough() { passthrough chat-pass to-chat openai/gpt-fake-chat openai; }
check_chat_stream_passthrough() { passthrough chat-pass to-chat openai/gpt-fake-chat openai 1; }
check_responses_passthrough() { passthrough responses-pass to-responses openai-responses/gpt-fake-responses openai; }
check_responses_stream_passthrough() { passthrough responses-pass to-responses openai-responses/gpt-fake-responses openai 1; }
check_messages_passthrough() {
	passthrough messages-pass to-messages anthropic/claude-fake anthropic || return 1
	local beta
	beta=$(calls | jq -r '.[-1].headers["anthropic-beta"] // ""')
	[[ $beta == *interleaved-thinking-2025-05-14* && $beta == *context-management-2025-06-27* ]] ||
		{ echo "the caller's anthropic-beta did not reach the provider (it got '$beta')"; return 1; }
}
check_messages_stream_passthrough() { passthrough messages-pass to-messages anthropic/claude-fake anthropic 1; }

# The Anthropic SDK with authToken sends Authorization: Bearer (apiKey sends x-api-key).
check_messages_bearer() {
	script '{}'
	sdk messages-bearer to-messages || return 1
	sdk_ok || return 1
	[ "$(sdk_field .result)" = "Hello from the fake provider." ] || { echo "answer: $(sdk_field .result)"; return 1; }
}

# A paid answer is never sent again: cut mid-body between the Anthropic SDK
# and Brama, it costs one provider call, and the SDK reports the cut.
check_messages_cut_answer() {
	local m n
	m=$(marker cut-answer)
	script '{}'
	sdk messages-cut-answer to-messages MARKER="$m" || return 1
	[ "$(sdk_field .error)" != null ] || { echo "the SDK read a whole answer through the cut: $(sdk_field .result | head -c 200)"; return 1; }
	n=$(count_marked "$m")
	[ "$n" = 1 ] || { echo "$n provider calls for one request (the SDK sent it again: $(sdk_field '[.calls[].respHeaders["x-should-retry"]] | join(",")'))"; return 1; }
}

check_count_tokens() {
	script '{}'
	sdk count-tokens to-messages || return 1
	sdk_ok || return 1
	[ "$(sdk_field .result)" = 42 ] || { echo "input_tokens is $(sdk_field .result), want the provider's 42"; return 1; }
	[ "$(calls | jq -r '.[-1].path')" = /anthropic/v1/messages/count_tokens ] || { echo "the provider's count_tokens was not called"; return 1; }
}

# schema_across CASE ALIAS ROLE: structured output asked in one format is
# honoured by the fake in another.
schema_across() {
	script '{}'
	sdk "$1" "$2" || return 1
	sdk_ok || return 1
	[ "$(calls | jq -r '.[-1].role + ":" + .[-1].answer')" = "$3:json" ] ||
		{ echo "the provider was not asked for the schema (it saw $(calls | jq -c '[.[] | .role + ":" + .answer]'))"; return 1; }
	is_greeting_json "$(sdk_field .result)"
}
check_chat_to_messages_schema() { schema_across chat-schema to-messages anthropic; }
check_responses_to_chat_schema() { schema_across responses-schema to-chat openai; }
check_messages_to_responses_schema() { schema_across messages-schema to-responses openai; }

check_dropped_hosted_tool() {
	script '{}'
	sdk responses-hosted-tool to-messages || return 1
	sdk_ok || return 1
	local dropped
	dropped=$(sdk_field '.calls[-1].respHeaders["brama-dropped"] // "absent"')
	[[ ",$(tr -d ' ' <<<"$dropped")," == *",file_search,"* ]] || { echo "Brama-Dropped is '$dropped', want it to name file_search"; return 1; }
}

# The Vercel AI SDK: @ai-sdk/openai's default model is the Responses API.
ai_text() {
	script '{}'
	sdk "$1" "$2" || return 1
	sdk_ok || return 1
	[ "$(sdk_field .result)" = "Hello from the fake provider." ] || { echo "answer: $(sdk_field .result | head -c 200)"; return 1; }
}
check_ai_generate_openai() { ai_text ai-generate-openai to-responses; }
check_ai_stream_openai() { ai_text ai-stream-openai to-responses; }
check_ai_generate_anthropic() { ai_text ai-generate-anthropic to-messages; }
check_ai_stream_anthropic() { ai_text ai-stream-anthropic to-messages; }
ai_object() {
	script '{}'
	sdk "$1" "$2" || return 1
	sdk_ok || return 1
	is_greeting_json "$(sdk_field .result)"
}
check_ai_object_responses_to_messages() { ai_object ai-object-openai to-messages; }
check_ai_object_chat_to_responses() { ai_object ai-object-openai-chat to-responses; }
check_ai_object_messages_to_chat() { ai_object ai-object-anthropic to-chat; }

# @ai-sdk/anthropic shows Brama's own message only when the body has
# Anthropic's top-level "type":"error" (SPEC §8.1).
check_ai_anthropic_error() {
	script '{}'
	sdk ai-generate-anthropic no-such-alias MAX_RETRIES=0 || return 1
	[ "$(sdk_field .error)" != null ] || { echo "an unknown alias was answered"; return 1; }
	[ "$(sdk_field '.calls[-1].respBody | fromjson | .type')" = error ] || { echo "the body lacks the top-level \"type\":\"error\": $(sdk_field '.calls[-1].respBody' | head -c 200)"; return 1; }
	local msg
	msg=$(sdk_field .error.message)
	[[ $msg == *no-such-alias* ]] || { echo "the SDK shows '$msg', not Brama's message"; return 1; }
}
