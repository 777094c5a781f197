#!/usr/bin/env bash
# The HTTP transport's fairness figure and the memory of an idle session
# (README: "One identity cannot take the listener"): a real daemon, the
# test OpenID provider, TLS, on loopback. Prints the FAIRNESS and SESSION
# MEMORY lines; fails when bob's tools/list p99 under alice's flood is over
# 2x his p99 alone. Run as root (the daemon's tests are).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo test --locked --test http_limits -- --ignored --nocapture --test-threads 1 \
  fairness_while_one_identity_floods memory_of_an_idle_session 2>&1 |
  grep -E 'FAIRNESS|SESSION MEMORY|test result|panicked'
