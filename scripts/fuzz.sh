#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ (or those named) for a while, each
# from its corpus in fuzz/corpus/TARGET. A crash stops the run: the input
# that crashed is in fuzz/artifacts/TARGET/, and
#   cargo +nightly fuzz run -O TARGET fuzz/artifacts/TARGET/crash-…
# replays it. What a run learns goes to a scratch directory unless --keep
# merges it into fuzz/corpus (minimised; commit it).
#
#   scripts/fuzz.sh --seconds 10            # every target, 10 s each (CI)
#   scripts/fuzz.sh --minutes 30 --keep     # a long run that grows the corpora
#   scripts/fuzz.sh --minutes 5 text_shown  # one target
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
say() { printf 'fuzz: %s\n' "$*" >&2; }

seconds=60
keep=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --minutes) seconds=$(( $2 * 60 )); shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) say "unknown option $1"; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

if ! cargo fuzz --version >/dev/null 2>&1; then
  say "cargo-fuzz is missing: scripts/bootstrap.sh installs it (with the nightly toolchain it needs)"
  exit 1
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  say "the nightly toolchain is missing: rustup toolchain install nightly --profile minimal"
  exit 1
fi
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list --fuzz-dir fuzz)
  if [ ${#targets[@]} -eq 0 ]; then
    say "cargo fuzz list found no target in fuzz/"
    exit 1
  fi
fi

say "building ${#targets[@]} targets (nightly, address sanitizer, optimised)"
cargo +nightly fuzz build -O --fuzz-dir fuzz

for t in "${targets[@]}"; do
  corpus="fuzz/corpus/$t"
  mkdir -p "$corpus"
  scratch="$(mktemp -d)"
  # A target's own libFuzzer flags, with the reason beside them.
  opts=()
  if [ -f "fuzz/options/$t" ]; then
    mapfile -t opts < <(grep -v -e '^#' -e '^$' "fuzz/options/$t")
  fi
  say "$t: ${seconds} s from $(find "$corpus" -type f | wc -l) corpus inputs ${opts[*]}"
  # -timeout: one input taking 10 s is a hang, reported as a crash.
  # -rss_limit_mb: a target holding 2 GB is a leak or a blow-up.
  if ! cargo +nightly fuzz run -O --fuzz-dir fuzz "$t" "$scratch" "$corpus" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${opts[@]}" \
      > "$scratch.log" 2>&1; then
    grep -m 1 -A 12 -e 'panicked at' -e 'ERROR: ' "$scratch.log" >&2 || true
    tail -n 20 "$scratch.log" >&2
    say "$t FAILED: the input is in fuzz/artifacts/$t/ (replay: cargo +nightly fuzz run -O $t fuzz/artifacts/$t/<file>)"
    rm -rf "$scratch" "$scratch.log"
    exit 1
  fi
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch.log" | tail -n 1)"
  say "$t: ok, ${runs:-?} inputs run"
  if [ "$keep" -eq 1 ]; then
    # Merge what the run found into the corpus, keeping only inputs that
    # add coverage.
    cargo +nightly fuzz run -O --fuzz-dir fuzz "$t" "$corpus" "$scratch" -- -merge=1 "${opts[@]}" \
      > "$scratch.log" 2>&1 || { tail -n 20 "$scratch.log" >&2; exit 1; }
    say "$t: corpus now $(find "$corpus" -type f | wc -l) inputs"
  fi
  rm -rf "$scratch" "$scratch.log"
done
say "every target ran ${seconds} s without a crash"
