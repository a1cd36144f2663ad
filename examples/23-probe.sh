#!/usr/bin/env bash
# Probe one subscription: exactly one minimal completion ("ping", 16 output
# tokens) on exactly that subscription, recorded in its row. Only an
# operator runs it; no pass or timer ever does.
. "$(dirname "$0")/lib.sh"
start_stub
export BRAMA_PROVIDER_KIMI_BASE_URL=$STUB_URL BRAMA_PROVIDER_OPENAI_BASE_URL=$STUB_URL
start_brama
export BRAMA_TOKEN=$TOKEN
id=$(echo "sk-example-kimi-0123456789" | "$BRAMA" subscription add -gateway "$BRAMA_URL" -provider kimi -agent a1 2>/dev/null)
probe() { curl -s -H "Authorization: Bearer $TOKEN" -X POST ${1:+-d "$1"} "$BRAMA_URL/v1/admin/subscriptions/a1/$id/probe"; }
out=$(probe)
expect "probe ok (kimi-for-coding by default)" "$(echo "$out" | jq -r .probe.ok)" "true"
echo "probe detail: $(echo "$out" | jq -r .probe.detail)"
# The stub's model fail-401 refuses the credential: recorded, not retried.
out=$(probe '{"model":"fail-401"}')
expect "refused probe answers 200" "$(echo "$out" | jq -r .ok),$(echo "$out" | jq -r .probe.ok)" "true,false"
expect "needs reauthorization" "$(echo "$out" | jq -r .subscription.credential.state)" "needs_reauthorization"
# A successful probe makes it active again.
expect "reactivated" "$(probe | jq -r .subscription.credential.state)" "active"
# A provider without a built-in probe model needs one named.
oid=$(echo "sk-example-openai-0123456789" | "$BRAMA" subscription add -gateway "$BRAMA_URL" -provider openai -agent a1 2>/dev/null)
code=$(curl -s -o "$WORK/409" -w '%{http_code}' -H "Authorization: Bearer $TOKEN" -X POST "$BRAMA_URL/v1/admin/subscriptions/a1/$oid/probe")
expect "no probe model" "$code $(jq -r .error.code "$WORK/409")" "409 state_conflict"
# Another agent's (or an unknown) id is 404.
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TOKEN" -X POST "$BRAMA_URL/v1/admin/subscriptions/a1/sub_0000000000000000/probe")
expect "unknown id" "$code" "404"
expect "probe log lines" "$(grep -c '"msg":"usage_probe_' "$WORK/brama.err")" "3"
