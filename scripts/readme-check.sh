#!/usr/bin/env bash
# The README's quick start, run as a new user runs it (scripts/test.sh runs
# this last, so CI fails when a README command fails):
#
# 1. The main job: the command in the README block marked
#    `<!-- readme-check: main -->`, run verbatim by bash.
# 1b. The policy author's signed-bundle commands (the block marked
#    `<!-- readme-check: bundle -->`), verbatim, in a scratch dir holding a
#    copy of the policies, with the release build's `gateway` on PATH.
# 2. The client path of "Use it from an MCP client" (the block marked
#    `<!-- readme-check: client -->`): every command of that block must still
#    be in it (checked below), and each is run here as the person it is
#    meant for, with two differences CI cannot avoid: the approver's key is
#    a plain ed25519 key of a second OS user (CI has no security key to
#    touch), and `sudo` is root itself (CI runs as root; where there is no
#    sudo, the line runs directly). Then that user's MCP client (the official
#    Python SDK, started from the config `client install` wrote) plans, asks
#    to apply, the approver approves with a signature, and the apply runs.
#
# Needs root, and a machine whose gateway installation is its own: it
# installs the daemon for real (/etc/gateway, /var/lib/gateway, the unit,
# two OS users, an approver key without a passphrase), so it refuses a
# machine where /etc/gateway exists and was not made by it (CI's machines
# are fresh). The daemon it starts is stopped at the end; the installation
# stays, marked as its own.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
say() { printf 'readme-check: %s\n' "$*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "run it as root"
marker=/etc/gateway/.installed-by-readme-check
if [ -e /etc/gateway ] && [ ! -e "$marker" ]; then
  fail "/etc/gateway exists and is not this check's: it would add a throwaway approver key to a real installation. Run it on a machine of its own (CI's), or remove /etc/gateway first"
fi

# The lines of the fenced block after `<!-- readme-check: NAME -->`.
block() {
  awk -v m="<!-- readme-check: $1 -->" '
    $0 == m { found = 1; next }
    found && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' README.md
}

# 1. The main job, as written.
main="$(block main)"
[ -n "$main" ] || fail "README.md has no block marked <!-- readme-check: main -->"
# The main job is exactly what this check knows it to be.
[ "$main" = 'scripts/bootstrap.sh && cargo run --release -- demo' ] ||
  fail "the README's main command is no longer 'scripts/bootstrap.sh && cargo run --release -- demo' (update scripts/readme-check.sh with it): $main"
say "the README's main command: $main"
if ! bash -euo pipefail -c "$main"; then
  fail "the README's main command failed: $main"
fi

# 1b. The policy author's bundle commands, as written, in a scratch dir
# holding a copy of the policies, with this build's gateway first on PATH.
bundle="$(block bundle)"
[ -n "$bundle" ] || fail "README.md has no block marked <!-- readme-check: bundle -->"
bundle_dir="$(mktemp -d)"
cp -r "$root/policies" "$bundle_dir/policies"
say "the README's bundle commands"
if ! (cd "$bundle_dir" && PATH="$root/target/release:$PATH" bash -euo pipefail -c "$bundle"); then
  rm -rf "$bundle_dir"
  fail "the README's bundle commands failed"
fi
rm -rf "$bundle_dir"

# 2. The client path. Its commands, as the README spells them:
client="$(block client)"
# shellcheck disable=SC2016 # the lines as the README spells them, unexpanded
expected=(
  'cargo build --release'
  'sudo target/release/gateway daemon install --user "$USER" --approver-key ~/.ssh/gateway_approver.pub'
  'target/release/gateway client install claude-code'
)
for line in "${expected[@]}"; do
  grep -qxF -- "$line" <<<"$(sed 's/[[:space:]]*#.*$//; s/[[:space:]]*$//' <<<"$client")" ||
    fail "the README's client block no longer says: $line (update scripts/readme-check.sh with it)"
done

agent=gw-readme-agent
approver=gw-readme-approver
for u in "$agent" "$approver"; do
  id "$u" >/dev/null 2>&1 || useradd -m -s /bin/bash "$u"
done
agent_home="$(getent passwd "$agent" | cut -d: -f6)"
approver_home="$(getent passwd "$approver" | cut -d: -f6)"
as() { local u="$1"; shift; runuser -u "$u" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$(getent passwd "$u" | cut -d: -f6)" USER="$u" "$@"; }

# The approver's key (the README's is a security key; CI has none to touch).
if [ ! -f "$approver_home/.ssh/gateway_approver" ]; then
  as "$approver" mkdir -p "$approver_home/.ssh"
  as "$approver" ssh-keygen -q -t ed25519 -N "" -C "$approver" -f "$approver_home/.ssh/gateway_approver"
fi

say "cargo build --release"
cargo build --release --locked
# A daemon this script started before and that outlived it.
pidfile=/run/gateway-readme-check.pid
if [ -s "$pidfile" ]; then
  kill "$(cat "$pidfile")" 2>/dev/null || true
  rm -f "$pidfile"
fi
say "gateway daemon install --user $agent --approver $approver --approver-key $approver=… --no-start"
# --no-start: this script starts the daemon itself, as the unit would,
# whether or not the machine runs systemd.
mkdir -p /etc/gateway
touch "$marker"
target/release/gateway daemon install --no-start --user "$agent" --approver "$approver" \
  --approver-key "$approver=$approver_home/.ssh/gateway_approver.pub" || fail "daemon install"

# The daemon, started as its unit's ExecStart says (no systemd here, or
# one: the same command).
exec_start="$(sed -n 's/^ExecStart=//p' /etc/systemd/system/gateway.service)"
[ -n "$exec_start" ] || fail "the unit has no ExecStart"
log="$(mktemp)"
# shellcheck disable=SC2086 # ExecStart is a command line, split as systemd splits it
$exec_start >>"$log" 2>&1 &
daemon_pid=$!
echo "$daemon_pid" >"$pidfile"
trap 'kill "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; rm -f "$log" "$pidfile"' EXIT
for _ in $(seq 1 100); do
  [ -S /run/gateway/gateway.sock ] && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$log" >&2; fail "the daemon exited"; }
  sleep 0.1
done
[ -S /run/gateway/gateway.sock ] || { cat "$log" >&2; fail "no socket after 10 s"; }

# The doctor, as the README spells it, with the daemon running: no problem.
doctor="$(block doctor | sed 's/[[:space:]]*#.*$//')"
[ -n "$doctor" ] || fail "README.md has no block marked <!-- readme-check: doctor -->"
[ "$doctor" = 'cargo run --release -- doctor' ] ||
  fail "the README's doctor command is no longer 'cargo run --release -- doctor' (update scripts/readme-check.sh with it): $doctor"
say "the README's doctor command: $doctor"
bash -euo pipefail -c "$doctor" || fail "the README's doctor command found a problem: $doctor"

# The agent's repository, with the demo module, as the agent user.
repo="$agent_home/repo"
rm -rf "$repo"
as "$agent" mkdir -p "$repo/terraform/offline-demo"
for f in terraform/offline-demo/*.tf; do
  as "$agent" cp "$root/$f" "$repo/$f"
done

say "gateway client install claude-code (as $agent)"
(cd "$repo" && as "$agent" "$root/target/release/gateway" client install claude-code) ||
  fail "client install"

client_py=("$root/.tools/venv-user/bin/python" "$root/scripts/readme-client.py")
say "the agent's MCP client: terraform_plan, then terraform_apply (waits for a person)"
request="$(cd "$repo" && as "$agent" "${client_py[@]}" request)" || fail "the client's request"
id="$(sed -n 's/^APPROVAL //p' <<<"$request")"
[ -n "$id" ] || fail "no approval id in: $request"

say "the approver ($approver) approves $id with a signature"
(cd "$approver_home" && as "$approver" "$root/target/release/gateway" approve "$id" \
  --key "$approver_home/.ssh/gateway_approver" --reason "readme check") || fail "approve"

say "the agent's MCP client: terraform_apply with the approval"
applied="$(cd "$repo" && as "$agent" "${client_py[@]}" apply "$id")" || fail "the approved apply"
grep -q '^APPLIED ' <<<"$applied" || fail "not applied: $applied"
[ -s "$repo/terraform/offline-demo/terraform.tfstate" ] || fail "no state written back into the agent's repository"
say "ok: $applied"
