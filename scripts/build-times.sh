#!/usr/bin/env bash
# How long the quick start's build takes, against the shipped build's:
# `cargo build` with the `release` profile and with the `dist` profile (fat
# LTO, one codegen unit: the settings `release` had before), each cold in a
# target directory of its own (every dependency built), then again after a
# one-line change in the pipeline (a constant appended to
# crates/gateway-core/src/pipeline/limits.rs, removed after). Prints one
# line a build, in wall seconds. Run it with nothing else running; both
# profiles take about half an hour on 2 cores.
#   scripts/build-times.sh [WORKDIR [PROFILE...]]   (default: a new temporary dir; release dist)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:-$(mktemp -d)}"
shift || true
profiles=("$@")
[ "${#profiles[@]}" -gt 0 ] || profiles=(release dist)
change="$root/crates/gateway-core/src/pipeline/limits.rs"
marker='const _: u32 = 1; // build-times: a one-line change'
trap 'grep -vxF "$marker" "$change" >"$change.tmp" && mv "$change.tmp" "$change"' EXIT
timed() {
  local name="$1" profile="$2" start end
  start="$(date +%s.%N)"
  CARGO_TARGET_DIR="$work/$profile" cargo build --locked --profile "$profile" \
    --manifest-path "$root/Cargo.toml" >"$work/$name.log" 2>&1
  end="$(date +%s.%N)"
  printf '%s: %.0f s\n' "$name" "$(echo "$end - $start" | bc)"
}
for profile in "${profiles[@]}"; do
  timed "$profile cold" "$profile"
  echo "$marker" >>"$change"
  timed "$profile after a one-line change" "$profile"
  grep -vxF "$marker" "$change" >"$change.tmp" && mv "$change.tmp" "$change"
done
