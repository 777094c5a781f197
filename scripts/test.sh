#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run runs exactly this):
# set-up, format and lint checks, the policy set's own checks and Rego unit
# tests (100% line coverage of policies/ required), the same tests and a
# matrix of decisions under OPA's own engine, the fuzz targets for a few
# seconds each (scripts/fuzz.sh), every Rust test, and last the
# README's quick start as written (scripts/readme-check.sh).
set -euo pipefail

# The sandbox and daemon tests start gVisor and make OS users: root only.
# (Not re-run through sudo here: sudo resets PATH, and rustup's cargo is
# then not found.)
if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test.sh: run it as root (the tests start gVisor sandboxes and make OS users); with sudo: sudo env \"PATH=\$PATH\" scripts/test.sh" >&2
  exit 1
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
step() { printf '\n==> %s (%d s in)\n' "$*" "$SECONDS"; }

step "bootstrap"
scripts/bootstrap.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "shellcheck"
shellcheck .ci/run scripts/*.sh

step "cargo clippy"
cargo clippy --all-targets --locked -- -D warnings

step "build"
cargo build --all-targets --locked

step "gateway policy check"
target/debug/gateway --policies policies policy check

step "gateway policy test --coverage --threshold 100"
target/debug/gateway --policies policies policy test policies policy-tests --coverage --threshold 100

step "OPA conformance: the Rego tests and the fixture decisions under OPA's own engine"
.tools/venv/bin/python scripts/opa-conformance.py --gateway target/debug/gateway

step "benchmarks, once each as a smoke test (criterion --test mode)"
cargo test --benches --locked

step "fuzz targets, 10 s each from their corpora (scripts/fuzz.sh; longer runs: --minutes N)"
scripts/fuzz.sh --seconds 10

step "cargo test"
# CI=true: insta never writes snapshots, a mismatch fails.
CI=true cargo test --lib --bins --tests --locked

step "the README's quick start, as written"
scripts/readme-check.sh
step "done"
