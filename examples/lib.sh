# Shared setup for Brama's runnable examples: a fresh state directory, a
# local stub provider and a brama serve, all torn down on exit.
# Needs BRAMA (the brama binary) and STUB (the examples/stub binary);
# examples/run-all builds both.
set -euo pipefail
: "${BRAMA:?set BRAMA to a built brama binary (examples/run-all does)}"
: "${STUB:?set STUB to a built examples/stub binary (examples/run-all does)}"

WORK=$(mktemp -d)
export BRAMA_STATE_DIR="$WORK/state" BRAMA_MODEL_CATALOG_URL=off
# Nothing here may reach beyond this machine: every provider, usage report
# and token endpoint starts at a closed loopback port; a script points the
# ones it uses at the stub after sourcing this file.
for id in OPENAI OPENAI_RESPONSES ANTHROPIC OPENROUTER GROQ MISTRAL DEEPSEEK XAI TOGETHER FIREWORKS CEREBRAS CLAUDE_CODE CODEX KIMI; do
	export "BRAMA_PROVIDER_${id}_BASE_URL=http://127.0.0.1:9"
done
export BRAMA_PROVIDER_CODEX_USAGE_URL=http://127.0.0.1:9
for id in CLAUDE_CODE CODEX KIMI; do export "BRAMA_OAUTH_${id}_TOKEN_URL=http://127.0.0.1:9"; done
unset HOME_OVERRIDE || true
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT

# wait_for FILE PATTERN: poll until FILE has a line matching PATTERN (10 s).
wait_for() {
	for _ in $(seq 100); do
		grep -q "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "timed out waiting for '$2' in $1" >&2
	cat "$1" >&2 || true
	return 1
}

# start_stub: run the stub provider; sets STUB_URL.
start_stub() {
	"$STUB" >"$WORK/stub.out" 2>&1 &
	PIDS+=($!)
	wait_for "$WORK/stub.out" '^listening on '
	STUB_URL=$(sed -n 's/^listening on //p' "$WORK/stub.out")
}

# start_brama [serve flags]: run brama serve; sets BRAMA_URL and TOKEN (the
# admin token printed at first start). With LOCAL_CREDS set (a JSON object
# provider → key), serve gets -local-credentials-stdin and reads it.
start_brama() {
	local flags=("$@")
	printf '%s' "${LOCAL_CREDS:-}" >"$WORK/creds"
	if [ -n "${LOCAL_CREDS:-}" ]; then flags+=(-local-credentials-stdin); fi
	# Emptied here, not by the background job's own redirection: that runs
	# after the fork, so a restart could read the previous serve's address.
	: >"$WORK/brama.out"
	: >"$WORK/brama.err"
	"$BRAMA" serve -addr 127.0.0.1:0 "${flags[@]}" <"$WORK/creds" >"$WORK/brama.out" 2>"$WORK/brama.err" &
	PIDS+=($!)
	wait_for "$WORK/brama.out" '^listening on '
	BRAMA_URL=$(sed -n 's/^listening on //p' "$WORK/brama.out")
	TOKEN=$(sed -n 's/.*bearer token (shown once): //p' "$WORK/brama.err" | head -1)
}

# expect WHAT ACTUAL WANT: fail loudly unless ACTUAL equals WANT.
expect() {
	if [ "$2" != "$3" ]; then
		echo "FAIL: $1: got '$2', want '$3'" >&2
		exit 1
	fi
	echo "ok: $1"
}
