#!/usr/bin/env bash
# README "Try it without a key": runs README's block itself, the stub for
# `go run ./examples/stub`, the built brama for `go run .`, on free ports
# and in this run's own directory instead of ~/.brama-try.
. "$(dirname "$0")/lib.sh"
block=$(awk '/^## Try it without a key/{f=1} f && /^```sh/{b=1; next} b && /^```/{exit} b' "$(dirname "$0")/../README.md")
[ "$(grep -c . <<<"$block")" -le 6 ] || { echo "FAIL: the try block grew past five commands" >&2; exit 1; }
# below Linux's ephemeral range (32768-60999), where a connection's own port could already hold one
stub_port=$((10000 + RANDOM % 10000)) brama_port=$((20000 + RANDOM % 10000))
block=${block//go run .\/examples\/stub/\"\$STUB\"}
block=${block//go run ./\"\$BRAMA\"}
block=${block//127.0.0.1:9999/127.0.0.1:$stub_port}
block=${block//\$HOME\/.brama-try/\$WORK\/try}
block=${block//serve -local-credentials-stdin &/serve -addr 127.0.0.1:$brama_port -local-credentials-stdin 2>\"\$WORK/try.err\" \&}
block=${block//localhost:8080/127.0.0.1:$brama_port}
# jobs -p names a pipeline by its first process (echo, gone); $! is its last: the block's serve. Waited for before
# cleanup removes the directory it may still write in as it stops.
trap 'kill $(jobs -p) $! 2>/dev/null || true; wait $! 2>/dev/null || true; cleanup' EXIT
eval "$block" >"$WORK/try.out" || { cat "$WORK/try.out" "$WORK/try.err" >&2; exit 1; }
expect "a first answer without a key" "$(grep "^{" "$WORK/try.out" | tail -1 | jq -r '.choices[0].message.content')" "Hello from the stub provider."
