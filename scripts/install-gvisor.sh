#!/usr/bin/env bash
# Put gVisor (runsc and its containerd shim) into every node of the kind
# cluster; cluster/kind/cluster.yaml already registers the `runsc` runtime handler
# with containerd, and cluster/runtimeclass.yaml names it `gvisor`.
# Downloads are checked against gVisor's published SHA-512 sums. Idempotent.
set -euo pipefail

CLUSTER="${KIND_CLUSTER:-gateway}"
GVISOR_RELEASE="${GVISOR_RELEASE:-latest}"
arch="$(uname -m)"
url="https://storage.googleapis.com/gvisor/releases/release/${GVISOR_RELEASE}/${arch}"
say() { printf 'install-gvisor: %s\n' "$*" >&2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for f in runsc containerd-shim-runsc-v1; do
  curl -fsSL -o "$work/$f" "$url/$f"
  curl -fsSL -o "$work/$f.sha512" "$url/$f.sha512"
  (cd "$work" && sha512sum -c "$f.sha512" >&2)
  chmod 0755 "$work/$f"
done
for node in $(kind get nodes --name "$CLUSTER"); do
  if docker exec "$node" runsc --version >/dev/null 2>&1; then
    say "$node: gVisor already installed"
    continue
  fi
  say "$node: installing runsc"
  docker cp "$work/runsc" "$node:/usr/local/bin/runsc"
  docker cp "$work/containerd-shim-runsc-v1" "$node:/usr/local/bin/containerd-shim-runsc-v1"
  docker exec "$node" systemctl restart containerd
done
say "gVisor is installed on every node of $CLUSTER"
