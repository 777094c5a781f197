#!/usr/bin/env bash
# Install Calico (which enforces NetworkPolicy; kind's default CNI does not)
# into the current kubectl context, and wait until it is ready. Idempotent.
set -euo pipefail

CALICO_VERSION="${CALICO_VERSION:-v3.29.3}"
kubectl="${KUBECTL:-kubectl}"
say() { printf 'install-calico: %s\n' "$*" >&2; }

if "$kubectl" get daemonset -n kube-system calico-node >/dev/null 2>&1; then
  say "Calico is already installed"
else
  say "installing Calico $CALICO_VERSION"
  "$kubectl" apply -f "https://raw.githubusercontent.com/projectcalico/calico/${CALICO_VERSION}/manifests/calico.yaml"
fi
"$kubectl" rollout status -n kube-system daemonset/calico-node --timeout=300s
"$kubectl" wait --for=condition=Ready nodes --all --timeout=300s
say "Calico is ready"
