#!/usr/bin/env bash
# /health and /readyz answer without a bearer token.
. "$(dirname "$0")/lib.sh"
start_brama
expect "health status" "$(curl -s "$BRAMA_URL/health" | jq -r .status)" "ok"
# No payer yet (no key, deployment or subscription): /readyz says why with 503.
expect "readyz status" "$(curl -s -o /dev/null -w '%{http_code}' "$BRAMA_URL/readyz")" "503"
expect "readyz reason" "$(curl -s "$BRAMA_URL/readyz" | jq -r '.reasons[0]' | cut -c1-8)" "no payer"
# Every response carries X-Request-Id.
curl -s -D - -o /dev/null "$BRAMA_URL/health" | grep -qi '^x-request-id: ' && echo "ok: X-Request-Id"
