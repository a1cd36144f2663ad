# Sourced by examples/clients/run: README's Quick start "With Claude Code
# or the Codex CLI", run as README's block says (issue 21). Each check
# starts a newcomer's `brama serve` (its own state, the fake as the
# anthropic provider), runs the block's `go run .` lines with the built
# brama and ANTHROPIC_API_KEY set, then the block's client lines as they
# stand (only the port and the client's path changed) in a fresh HOME
# with no model setting anywhere: each client asks for its own default.
CHECKS+=(quickstart-claude-default quickstart-codex-default)
QS_KEY=fake-anthropic-key # the key the fake takes as anthropic

# qs_block: README's fenced block under "With Claude Code or the Codex CLI".
qs_block() { awk '/^\*\*With Claude Code or the Codex CLI\*\*/{f=1} f && /^```sh/{b=1; next} f && b && /^```/{exit} b' "$repo/README.md"; }

# quickstart CLIENT: serve, the block's brama lines, then CLIENT's lines
# (claude: the `claude` line; codex: from its config.toml to the end);
# the answer in $QS/out. Says why and returns 1 on failure.
quickstart() {
	local block brama client how rc
	block=$(qs_block)
	[ -n "$block" ] || { echo "README has no block under **With Claude Code or the Codex CLI**"; return 1; }
	# No model setting of the clients' own, and no alias naming one version.
	if grep -nE 'ANTHROPIC_(MODEL|DEFAULT_[A-Z]+_MODEL|SMALL_FAST_MODEL)|--model|(^| )-m |^ *model *=' <<<"$block"; then
		echo "the block sets a client's model (above)"
		return 1
	fi
	if grep -E 'routes set' <<<"$block" | grep -vE "routes set '[a-z0-9._-]+\*' "; then
		echo "the block declares an alias that is not a prefix alias (above)"
		return 1
	fi
	brama=$(grep -E '(^|\| )go run \. ' <<<"$block")
	case $1 in
	claude) client=$(grep -E '(^| )claude ' <<<"$block") ;;
	codex) client=$(sed -n '/\.codex/,$p' <<<"$block") ;;
	esac
	[ "$(grep -c 'routes set' <<<"$brama")" -ge 1 ] && [ -n "$client" ] || { echo "the block lost its brama or $1 lines"; return 1; }

	QS=$WORK/qs-$1
	rm -rf "$QS" && mkdir -p "$QS/home" "$QS/dir"
	BRAMA_STATE_DIR=$QS/state "$WORK/brama" serve -addr 127.0.0.1:0 >"$QS/serve.out" 2>"$QS/serve.err" &
	QS_PID=$!
	wait_line "$QS/serve.out" '^listening on ' || { echo "the quick start's serve did not start: $(brief "$QS/serve.err")"; return 1; }
	local url token
	url=$(sed -n 's/^listening on //p' "$QS/serve.out")
	token=$(sed -n 's/.*bearer token (shown once): //p' "$QS/serve.err" | head -1)
	brama=${brama//go run ./\"\$WORK/brama\"}
	if ! (export BRAMA_STATE_DIR=$QS/state BRAMA_TOKEN=$token ANTHROPIC_API_KEY=$QS_KEY && eval "$brama") >"$QS/brama.out" 2>&1; then
		echo "the block's brama lines failed: $(brief "$QS/brama.out")"
		return 1
	fi
	script '{}'
	client=${client//127.0.0.1:8080/${url#http://}}
	client=$(sed -E 's#(^|[ ;&|])(claude|codex) #\1"$BIN/\2" #' <<<"$client")
	# The user's shell: BRAMA_TOKEN and ANTHROPIC_API_KEY exported, as the
	# block's first lines leave them; nothing else but cli_env's fences.
	# shellcheck disable=SC2046
	(cd "$QS/dir" && env -i $(cli_env) env -u CODEX_HOME HOME="$QS/home" BIN="$BIN" BRAMA_TOKEN="$token" ANTHROPIC_API_KEY="$QS_KEY" \
		timeout "${CLI_TIMEOUT:-45}" bash -ec "$client" </dev/null >"$QS/out" 2>"$QS/err")
	rc=$?
	if [ $rc != 0 ]; then
		how="exited $rc"
		[ $rc = 124 ] && how="still running after ${CLI_TIMEOUT:-45}s (stopped)"
		echo "the block's $1 lines $how: $(brief "$QS/out") $(brief "$QS/err" | tail -c 250)"
		return 1
	fi
	grep -q "Hello from the fake provider" "$QS/out" || { echo "unexpected answer: $(brief "$QS/out")"; return 1; }
}

# qs_check CLIENT WANT: quickstart CLIENT, then every model the fake saw
# matches WANT (an ERE) and was paid with the block's key; notes the
# client's own model names (as Brama's log has them) and what was sent.
qs_check() {
	local rc=0 why asked refused sent keys
	QS_PID=
	quickstart "$1" >"$WORK/qs.why" || rc=1
	why=$(cat "$WORK/qs.why")
	if [ $rc = 0 ]; then
		asked=$(grep '"msg":"request"' "$QS/serve.err" | jq -r 'select(.path | startswith("/v1/admin") | not) | .requested_model' | sort -u | paste -sd, -)
		# client_cancelled is no refusal: the Codex CLI hangs up once it has
		# read response.completed, and Brama may log that hang-up (reported).
		refused=$(grep '"msg":"request"' "$QS/serve.err" | jq -r 'select(.outcome != "ok" and .outcome != "client_cancelled") | .requested_model + " " + .path + ": " + .outcome' | sort -u | paste -sd, -)
		sent=$(calls | jq -r '[.[] | .body | fromjson | .model] | unique | join(",")')
		keys=$(calls | jq -r '[.[] | .headers["x-api-key"] // "none"] | unique | join(",")')
		if [ -z "$sent" ] || grep -vqE "^($2)$" <<<"${sent//,/$'\n'}"; then
			why="the fake saw models '$sent', want each to match $2; the client asked for $asked"
			rc=1
		elif [ "$keys" != "$QS_KEY" ]; then
			why="the fake saw keys '$keys', want the one the block set"
			rc=1
		elif [ -n "$refused" ]; then
			why="Brama refused: $refused"
			rc=1
		else
			why="the client asked for $asked; the fake saw $sent"
		fi
	fi
	[ -n "$QS_PID" ] && kill "$QS_PID" 2>/dev/null && wait "$QS_PID" 2>/dev/null
	echo "$why"
	return $rc
}
check_quickstart_claude_default() { qs_check claude 'claude-[a-z0-9.-]+'; }
# The Codex CLI's names go to the one model the block's `gpt-*` line names.
check_quickstart_codex_default() {
	local dest
	dest=$(qs_block | sed -n "s#.*routes set 'gpt-\*' [a-z0-9._-]*/\([^ ]*\).*#\1#p")
	qs_check codex "${dest:-no gpt-* route in the block}"
}
