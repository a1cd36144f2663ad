#!/usr/bin/env bash
# brama routes migrate drops retired fields and is idempotent byte for byte.
. "$(dirname "$0")/lib.sh"
mkdir -p -m 700 "$BRAMA_STATE_DIR"
cat >"$BRAMA_STATE_DIR/routes.json" <<'JSON'
{"schema_version":1,"routes":{"chat":"openai/gpt-4o"},"fallbacks":{"chat":["anthropic/claude-sonnet-4-5"]}}
JSON
chmod 600 "$BRAMA_STATE_DIR/routes.json"
first=$("$BRAMA" routes migrate)
second=$("$BRAMA" routes migrate)
expect "idempotent output" "$first" "$second"
expect "fallbacks dropped" "$(jq -r 'has("fallbacks")' "$BRAMA_STATE_DIR/routes.json")" "false"
expect "file is what was printed" "$(cat "$BRAMA_STATE_DIR/routes.json")" "$first"
# A group-readable registry is refused, exit 1, untouched.
chmod 640 "$BRAMA_STATE_DIR/routes.json"
if "$BRAMA" routes migrate 2>"$WORK/err"; then echo "FAIL: group-readable registry migrated" >&2; exit 1; fi
grep -q '^route migration error: ' "$WORK/err" && echo "ok: refused: $(cat "$WORK/err")"
