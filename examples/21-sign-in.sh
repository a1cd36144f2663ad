#!/usr/bin/env bash
# Sign in to a claude-code subscription: `brama subscription sign-in` runs
# the PKCE flow locally (authorize URL on stderr, the pasted code on stdin),
# then hands the grant to the daemon. The stub stands in for the provider
# and its token endpoint.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_CLAUDE_CODE_BASE_URL=$STUB_URL BRAMA_OAUTH_CLAUDE_CODE_TOKEN_URL=$STUB_URL/oauth/token
start_brama
export BRAMA_TOKEN=$TOKEN # the code is then stdin's first line (else the line after the bearer)
id=$(echo "example-code" | "$BRAMA" subscription sign-in -gateway "$BRAMA_URL" -provider claude-code -agent a1 -label laptop 2>"$WORK/sign-in.err")
expect "new subscription" "$(echo "$id" | grep -cE '^sub_[0-9a-f]{16}$')" "1"
expect "authorize URL on stderr" "$(grep -c '^https://claude.com/cai/oauth/authorize?' "$WORK/sign-in.err")" "1"
# Signing in again with -id replaces that subscription's grant (PUT …/credential).
again=$(echo "example-code-2" | "$BRAMA" subscription sign-in -gateway "$BRAMA_URL" -provider claude-code -agent a1 -id "$id" 2>/dev/null)
expect "same subscription" "$again" "$id"
expect "journaled sign-ins" "$(grep -c '"kind":"subscription_sign_in".*"result":"signed_in"' "$BRAMA_STATE_DIR/journal.jsonl")" "2"
# A refused code stores nothing (exit 1).
if echo "bad-code" | "$BRAMA" subscription sign-in -gateway "$BRAMA_URL" -provider claude-code -agent a1 -id "$id" 2>"$WORK/bad.err" >/dev/null; then
	echo "FAIL: a refused code was accepted" >&2
	exit 1
fi
echo "ok: refused code: $(tail -1 "$WORK/bad.err")"
# The agent's requests are now paid by the signed-in subscription.
app=$("$BRAMA" clients add app-a1 -agent a1 2>/dev/null)
out=$(curl -s -H "Authorization: Bearer $app" -d '{"model":"claude-code/claude-haiku-4-5","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}' "$BRAMA_URL/v1/messages")
expect "answered" "$(echo "$out" | jq -r '.content[0].text')" "Hello from the stub provider."
# Tokens live only in the vault.
if grep -rlq 'stub-access-\|stub-refresh-' --exclude=vault.json "$BRAMA_STATE_DIR" "$WORK/brama.err"; then
	echo "FAIL: a token left the vault" >&2
	exit 1
fi
echo "ok: tokens only in the vault"
