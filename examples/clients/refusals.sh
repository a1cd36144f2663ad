# Sourced by examples/clients/run: the refusal checks (issue 9). The fake
# fails every call whose body carries this check's marker; the count of
# such calls is the provider spend of one logical request. Each client runs
# with its default settings (retries-off-*: with its own retries turned
# off) and is stopped after REFUSAL_TIMEOUT seconds (default 30).

# one_request CLIENT MARKER [SETTING...]: one logical request; sets RC.
one_request() {
	local client=$1 m=$2
	shift 2
	CLI_TIMEOUT=${REFUSAL_TIMEOUT:-30}
	case $client in
	openai) sdk refuse-openai to-chat MARKER="$m" "$@" ;;
	anthropic) sdk refuse-anthropic to-messages MARKER="$m" "$@" ;;
	ai) sdk refuse-ai to-responses MARKER="$m" "$@" ;;
	claude)
		set_alias "$CLAUDE_MODEL" "anthropic/$CLAUDE_MODEL" >/dev/null
		claude "$@" -- "Say hi. $m"
		;;
	codex)
		set_alias "$CODEX_MODEL" "openai-responses/$CODEX_MODEL" >/dev/null
		codex "$@" -- "Say hi. $m"
		;;
	esac
	RC=$?
	unset CLI_TIMEOUT
}

# client_failed CLIENT: the client reported the refusal (did not succeed).
client_failed() {
	case $1 in
	openai | anthropic | ai) [ "$(sdk_field .error)" != null ] ;;
	*) [ "$RC" != 0 ] ;;
	esac
}

# client_says CLIENT: the client's last words, on one line.
client_says() {
	case $1 in
	openai | anthropic | ai) sdk_field '.error.message // .result' | head -c 300 ;;
	*) echo "$(brief "$WORK/$1.out" | tail -c 150) $(brief "$WORK/$1.err" | tail -c 250)" ;;
	esac
}

# served: how many caller requests Brama has logged so far.
served() { grep -c '"msg":"request".*"path":"/v1/\(messages\|chat/completions\|responses\)"' "$WORK/brama.err"; }

# refuse CLIENT MODE: count the provider calls one request makes.
refuse() {
	local client=$1 mode=$2 m n start secs before
	m=$(marker "$client-$mode")
	script "$(jq -nc --arg f "$mode" --arg m "$m" '{fail:$f, match:$m, retry_after:"1"}')"
	start=$(date +%s) before=$(served)
	one_request "$client" "$m"
	secs=$(($(date +%s) - start))
	n=$(count_marked "$m")
	local note="$n provider calls, $(($(served) - before)) requests to Brama, ${secs}s"
	[ "$RC" = 124 ] && note="$note (still retrying; stopped)"
	if [ "$n" = 0 ]; then
		echo "the request never reached the provider: $(client_says "$client")"
		return 1
	fi
	client_failed "$client" || { echo "the client reported success after a provider $mode"; return 1; }
	if [ "$mode" = 429 ]; then # retryable: the SDK may retry, after the provider's Retry-After
		retry_after_kept "$client" || return 1
		echo "$note"
		return 0
	fi
	if [ "$mode" = 500 ]; then
		echo "$note"
		return 0
	fi
	[ "$n" = 1 ] || { echo "$note, want 1"; return 1; }
	echo "$note"
}
for c in openai anthropic ai claude codex; do
	for m in 400 401 422 429 cut malformed 500; do
		eval "check_refuse_${c}_$m() { refuse $c $m; }"
	done
done

# retry_after_kept CLIENT: an SDK's answers to a provider 429 carried the
# provider's Retry-After (1) and x-should-retry: true; each retry waited it.
retry_after_kept() {
	case $1 in openai | anthropic | ai) ;; *) return 0 ;; esac
	local got
	got=$(sdk_field '[.calls[] | .respHeaders | (.["retry-after"] // "none") + "/" + (.["x-should-retry"] // "none")] | unique | join(" ")')
	[ "$got" = 1/true ] || { echo "Brama's 429 answers had Retry-After/x-should-retry $got, want 1/true"; return 1; }
}

# retries_off CLIENT SETTING...: a provider 500 with the client's own
# retries turned off makes exactly one call.
retries_off() {
	local client=$1 m n
	shift
	m=$(marker "$client-off")
	script "$(jq -nc --arg m "$m" '{fail:"500", match:$m}')"
	one_request "$client" "$m" "$@"
	n=$(count_marked "$m")
	[ "$n" != 0 ] || { echo "the request never reached the provider: $(client_says "$client")"; return 1; }
	client_failed "$client" || { echo "the client reported success after a provider 500"; return 1; }
	[ "$n" = 1 ] || { echo "$n provider calls with $*, want 1"; return 1; }
	echo "1 provider call with $*"
}
check_retries_off_openai() { retries_off openai MAX_RETRIES=0; }
check_retries_off_anthropic() { retries_off anthropic MAX_RETRIES=0; }
check_retries_off_ai() { retries_off ai MAX_RETRIES=0; }
check_retries_off_claude() { retries_off claude CLAUDE_CODE_MAX_RETRIES=0; }
check_retries_off_codex() { retries_off codex 'request_max_retries = 0' 'stream_max_retries = 0'; }

# no_credential CLIENT: a refusal Brama makes itself before any call (no
# key for the route's provider: 503, x-should-retry false) is not retried
# by the SDKs that obey x-should-retry.
no_credential() {
	set_alias no-credential groq/llama-fake >/dev/null || return 1
	local before kase=refuse-$1
	before=$(served)
	sdk "$kase" no-credential || return 1
	local n=$(($(served) - before)) got
	got=$(sdk_field '.calls[0] | (.status | tostring) + " " + (.respHeaders["x-should-retry"] // "none")')
	[ "$got" = "503 false" ] || { echo "Brama answered $got, want 503 false (x-should-retry)"; return 1; }
	[ "$n" = 1 ] || { echo "the SDK sent $n requests, want 1"; return 1; }
}
check_no_credential_openai() { no_credential openai; }
check_no_credential_anthropic() { no_credential anthropic; }
