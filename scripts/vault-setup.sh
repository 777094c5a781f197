#!/usr/bin/env bash
# Configure a Vault or OpenBao for the default policies: the Kubernetes
# secrets engine pointed at the cluster, one role per credential scope
# (policies/config/vault_roles/data.yaml), the gateway's least-privilege policy and
# its AppRole. Idempotent. A thin wrapper over `gateway vault setup`.
#
# Needs VAULT_ADDR and an admin VAULT_TOKEN (BAO_ADDR/BAO_TOKEN work too).
#
#   scripts/vault-setup.sh                      # the cluster of the current kubectl context:
#                                               # applies cluster/vault-rbac.yaml and mints
#                                               # Vault's own service account token
#   scripts/vault-setup.sh --kubernetes-host URL --kubernetes-ca-file CA.pem \
#                          [--service-account-jwt-file JWT] [--approle --secret-id-file F]
#
# Environment: GATEWAY_BIN (default: target/release/gateway, else target/debug/gateway),
# KUBECTL (default: kubectl), AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (configure the
# AWS secrets engine too; skipped, and said so, without them).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf 'vault-setup: %s\n' "$*" >&2; }

export VAULT_ADDR="${VAULT_ADDR:-${BAO_ADDR:-}}"
export VAULT_TOKEN="${VAULT_TOKEN:-${BAO_TOKEN:-}}"
if [ -z "$VAULT_ADDR" ] || [ -z "$VAULT_TOKEN" ]; then
  say "set VAULT_ADDR and VAULT_TOKEN (an admin token) first"
  exit 2
fi

gateway="${GATEWAY_BIN:-}"
if [ -z "$gateway" ]; then
  for candidate in "$root/target/release/gateway" "$root/target/debug/gateway"; do
    if [ -x "$candidate" ]; then gateway="$candidate"; break; fi
  done
fi
if [ -z "$gateway" ] || [ ! -x "$gateway" ]; then
  say "no gateway binary: run 'cargo build --release' or set GATEWAY_BIN"
  exit 2
fi

has_host=false
for arg in "$@"; do
  [ "$arg" = "--kubernetes-host" ] && has_host=true
done

if [ "$has_host" = true ]; then
  exec "$gateway" --policies "$root/policies" vault setup "$@"
fi

kubectl="${KUBECTL:-kubectl}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
say "using the current kubectl context: $("$kubectl" config current-context)"
server="$("$kubectl" config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')"
"$kubectl" config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' \
  | base64 -d > "$work/ca.pem"
"$kubectl" apply -f "$root/cluster/namespaces.yaml" >&2
"$kubectl" apply -f "$root/cluster/vault-rbac.yaml" >&2
# The credential roles' Roles, from the policies in use (not the committed
# copy: the policy data may have changed), then checked.
"$gateway" --policies "$root/policies" vault cluster-roles | "$kubectl" apply --server-side -f - >&2
"$gateway" --policies "$root/policies" vault cluster-roles --check >&2
"$kubectl" -n vault create token openbao --duration=8760h > "$work/openbao.jwt"
chmod 0600 "$work/openbao.jwt"
"$gateway" --policies "$root/policies" vault setup \
  --kubernetes-host "$server" \
  --kubernetes-ca-file "$work/ca.pem" \
  --service-account-jwt-file "$work/openbao.jwt" \
  "$@"
