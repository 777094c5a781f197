#!/usr/bin/env bash
# Remove what scripts/up.sh made: the kind cluster and the OpenBao dev server.
# Idempotent.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${KIND_CLUSTER:-gateway}"
state="$root/.tools/cluster"
say() { printf 'down: %s\n' "$*" >&2; }

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind delete cluster --name "$CLUSTER"
else
  say "no kind cluster $CLUSTER"
fi
if [ -f "$state/bao.pid" ]; then
  kill "$(cat "$state/bao.pid")" 2>/dev/null || true
  rm -f "$state/bao.pid"
  say "stopped OpenBao"
fi
