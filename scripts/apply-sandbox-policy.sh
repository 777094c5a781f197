#!/usr/bin/env bash
# Apply the sandbox namespace's NetworkPolicies with the Kubernetes API
# server's REAL endpoint (its EndpointSlice address and port), not the
# `kubernetes` Service's ClusterIP: kube-proxy DNATs the ClusterIP before
# NetworkPolicy is evaluated, so a rule for it never matches. Prints the
# address for gateway.toml (sandbox.kubernetes.endpoint_addresses). Idempotent.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kubectl="${KUBECTL:-kubectl}"
say() { printf 'apply-sandbox-policy: %s\n' "$*" >&2; }

slice=(get endpointslice -n default -l kubernetes.io/service-name=kubernetes)
address="$("$kubectl" "${slice[@]}" -o jsonpath='{.items[0].endpoints[0].addresses[0]}')"
port="$("$kubectl" "${slice[@]}" -o jsonpath='{.items[0].ports[0].port}')"
if [ -z "$address" ] || [ -z "$port" ]; then
  say "could not find the API server's endpoint"
  exit 1
fi
say "API server endpoint: $address:$port"
sed -e "s#203\.0\.113\.1/32#${address}/32#g" -e "s#port: 6443#port: ${port}#g" \
  "$root/cluster/networkpolicy.yaml" | "$kubectl" apply -f - >&2
printf '%s\n' "$address"
