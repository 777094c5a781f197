#!/usr/bin/env bash
# Builds the trusted Terraform provider mirror the gateway's sandboxes take
# providers from, for the modules given, where a provider registry is
# reachable (run it on a build host, not in a sandbox):
#
#   scripts/make-provider-mirror.sh MIRROR_DIR MODULE_DIR [MODULE_DIR...]
#
# For each module: `terraform providers mirror` copies every provider the
# module requires into MIRROR_DIR (Terraform's packed mirror layout), then
# `terraform providers lock -fs-mirror` records in the module's
# .terraform.lock.hcl the hashes of exactly those packages, so `init` in a
# sandbox refuses anything else. Commit the lock files with the modules.
# Finally the mirror is made read-only and readable by the sandbox user.
# Point [sandbox] provider_mirror in gateway.toml at MIRROR_DIR (local
# backend), or bake it into the runner image at /opt/terraform/providers
# (kubernetes backend, images/runner).
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 MIRROR_DIR MODULE_DIR [MODULE_DIR...]" >&2
  exit 2
fi
mirror="$1"
shift
terraform="${TERRAFORM:-terraform}"
platform="${PLATFORM:-linux_amd64}"
mkdir -p "$mirror"
mirror="$(cd "$mirror" && pwd)"
for module in "$@"; do
  echo "make-provider-mirror: $module" >&2
  (cd "$module" && "$terraform" providers mirror -platform="$platform" "$mirror")
  (cd "$module" && "$terraform" providers lock -fs-mirror="$mirror" -platform="$platform")
done
chmod -R a+rX,go-w "$mirror"
echo "make-provider-mirror: $mirror holds:" >&2
find "$mirror" -type f -name '*.zip' -printf '  %P\n' >&2
