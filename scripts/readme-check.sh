#!/usr/bin/env bash
# The README's quick start, run as a new user runs it (scripts/test.sh runs
# this last, so CI fails when a README command fails):
#
# 1. The main job: the command in the README block marked
#    `<!-- readme-check: main -->`, run verbatim by bash.
# 1b. The policy author's signed-bundle commands (the block marked
#    `<!-- readme-check: bundle -->`), verbatim, in a scratch dir holding a
#    copy of the policies, with the release build's `gateway` on PATH.
# 1d. The Kubernetes demo (the block marked
#    `<!-- readme-check: kubernetes-demo -->`), verbatim, and it must have
#    run the demo to its end.
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

# 1c. "Deploy for a team on Kubernetes" (the block marked
# `<!-- readme-check: kubernetes -->`): no cluster runs here, so what CI
# does is render, with this kubectl's Kustomize, every kustomization the
# block renders or applies (`kubectl kustomize X` and `kubectl apply -k X`)
# and check that every file it applies exists; every line must still be in
# the block (the cluster-side lines are checked to be there, not run).
kubernetes="$(block kubernetes)"
[ -n "$kubernetes" ] || fail "README.md has no block marked <!-- readme-check: kubernetes -->"
rendered=0
while IFS= read -r line; do
  line="${line%%#*}"
  read -r -a words <<<"$line"
  [ "${#words[@]}" -ge 3 ] || continue
  [ "${words[0]}" = kubectl ] || continue
  target=""
  if [ "${words[1]}" = kustomize ]; then
    target="${words[2]}"
  elif [ "${words[1]}" = apply ]; then
    for ((i = 2; i < ${#words[@]}; i++)); do
      if [ "${words[i]}" = -k ]; then
        target="${words[i + 1]}"
      elif [ "${words[i]}" = -f ]; then
        [ -f "${words[i + 1]}" ] || fail "the README's kubernetes block applies ${words[i + 1]}, which does not exist"
      fi
    done
  fi
  if [ -n "$target" ]; then
    kubectl kustomize "$target" >/dev/null || fail "the README's kubernetes block: kubectl kustomize $target"
    rendered=$((rendered + 1))
  fi
done <<<"$kubernetes"
[ "$rendered" -ge 3 ] || fail "the README's kubernetes block renders $rendered kustomizations (expected the kind overlay, its apply and verify)"
# shellcheck disable=SC2016 # the lines as the README spells them, unexpanded
expected_kubernetes=(
  'docker build -t gateway:0.1.0 -f images/gateway/Dockerfile .'
  'kubectl apply --server-side -k deploy/kubernetes/overlays/kind'
  'kubectl apply --server-side -k deploy/kubernetes/verify'
  'kubectl apply --server-side -f cluster/namespaces.yaml -f deploy/kubernetes/overlays/kind/postgres.yaml'
  'scripts/wait-job.sh gateway-sandbox gateway-verify 15m'
)
for line in "${expected_kubernetes[@]}"; do
  grep -qxF -- "$line" <<<"$kubernetes" ||
    fail "the README's kubernetes block no longer says: $line (update scripts/readme-check.sh with it)"
done
say "the README's kubernetes block: $rendered kustomizations render"

# 1d. The Kubernetes demo (the block marked
# `<!-- readme-check: kubernetes-demo -->`), verbatim.
k8s_demo="$(block kubernetes-demo)"
[ "$k8s_demo" = 'cargo test --test kubernetes_toolbox demo_ -- --nocapture' ] ||
  fail "the README's Kubernetes demo is no longer 'cargo test --test kubernetes_toolbox demo_ -- --nocapture' (update scripts/readme-check.sh with it): $k8s_demo"
say "the README's Kubernetes demo: $k8s_demo"
demo_out="$(mktemp)"
if ! bash -euo pipefail -c "$k8s_demo" >"$demo_out" 2>&1; then
  cat "$demo_out" >&2
  fail "the README's Kubernetes demo failed: $k8s_demo"
fi
# It ran the demo (a filter matching no test passes too).
grep -q '^demo complete' "$demo_out" || { cat "$demo_out" >&2; fail "the README's Kubernetes demo ran no demo"; }
rm -f "$demo_out"

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
team_dir=""
provider_pid=""
hosts_mark="# gateway readme-check"
trusted_ca=/usr/local/share/ca-certificates/gateway-readme-check.crt
cleanup() {
  kill "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  rm -f "$log" "$pidfile"
  if [ -n "$provider_pid" ]; then
    kill "$provider_pid" 2>/dev/null
    wait "$provider_pid" 2>/dev/null
  fi
  # /etc/hosts may be a bind mount (containers): rewritten in place.
  if grep -q "$hosts_mark" /etc/hosts 2>/dev/null; then
    local kept
    kept="$(grep -v "$hosts_mark" /etc/hosts)"
    printf '%s\n' "$kept" >/etc/hosts
  fi
  if [ -e "$trusted_ca" ]; then
    rm -f "$trusted_ca"
    update-ca-certificates --fresh >/dev/null 2>&1
  fi
  [ -z "$team_dir" ] || rm -rf "$team_dir"
  return 0
}
trap cleanup EXIT
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

# 3. The team gateway: the blocks marked team-config (added to
# /etc/gateway/gateway.toml), team-policy (who approves from the network)
# and team (the commands), with a real OpenID provider (npm oidc-provider,
# tests/oidc/provider.mjs) as login.example.com. What CI cannot do as a
# company does, it does as the README says: the two names are loopback
# addresses in /etc/hosts, the listen address is the one gateway.example
# resolves to, a test CA made here is added to the system's trust store,
# the daemon is restarted as its unit starts it, the people's browser
# sign-ins are played by tests/oidc/login.py, and `ap-…` is the id the
# agent was given.
team_config="$(block team-config)"
team_policy="$(block team-policy)"
team="$(block team)"
if [ -z "$team_config" ] || [ -z "$team_policy" ] || [ -z "$team" ]; then
  fail "README.md lacks a block marked <!-- readme-check: team-config -->, team-policy or team"
fi
# shellcheck disable=SC2016 # the lines as the README spells them, unexpanded
expected_team=(
  'sudo systemctl restart gateway'
  'curl -fsS https://gateway.example/.well-known/oauth-protected-resource/mcp'
  'gateway client install claude-code --url https://gateway.example/mcp'
  'export GATEWAY_URL=https://gateway.example/mcp'
  'gateway login --issuer https://login.example.com --client-id gateway-cli'
  'gateway approvals'
  'gateway approve ap-… --reason "reviewed the replace of web" --key ~/.ssh/gateway_approver'
)
team_lines="$(sed 's/[[:space:]]*#.*$//; s/[[:space:]]*$//' <<<"$team")"
for line in "${expected_team[@]}"; do
  grep -qxF -- "$line" <<<"$team_lines" ||
    fail "the README's team block no longer says: $line (update scripts/readme-check.sh with it)"
done
grep -qx 'listen = "0.0.0.0:443"' <<<"$team_config" ||
  fail "the README's team-config block no longer listens on 0.0.0.0:443 (update scripts/readme-check.sh with it)"
url=https://gateway.example/mcp
issuer=https://login.example.com

team_dir="$(mktemp -d)"
chmod 755 "$team_dir"
say "a test CA and certificates for gateway.example and login.example.com, the CA in the system's trust store"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=gateway readme-check CA" -keyout "$team_dir/ca.key" -out "$team_dir/ca.pem" \
  -addext "basicConstraints=critical,CA:true" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null ||
  fail "openssl: the test CA"
for name in gateway.example login.example.com; do
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$team_dir/$name.key" -out "$team_dir/$name.csr" 2>/dev/null || fail "openssl: $name's key"
  printf 'subjectAltName=DNS:%s\nbasicConstraints=critical,CA:false\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
    "$name" >"$team_dir/$name.ext"
  openssl x509 -req -in "$team_dir/$name.csr" -CA "$team_dir/ca.pem" -CAkey "$team_dir/ca.key" \
    -CAcreateserial -days 2 -extfile "$team_dir/$name.ext" -out "$team_dir/$name.pem" 2>/dev/null ||
    fail "openssl: $name's certificate"
done
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$team_dir/signing.pem" 2>/dev/null ||
  fail "openssl: the provider's signing key"
chmod 644 "$team_dir"/*
cp "$team_dir/ca.pem" "$trusted_ca"
update-ca-certificates >/dev/null 2>&1 || fail "update-ca-certificates"
printf '127.0.0.2 login.example.com %s\n127.0.0.3 gateway.example %s\n' "$hosts_mark" "$hosts_mark" >>/etc/hosts

say "the OpenID provider as $issuer (oidc-provider, tests/oidc/provider.mjs)"
[ -d "$root/tests/oidc/node_modules/oidc-provider" ] ||
  fail "tests/oidc/node_modules is missing: scripts/install-tools.sh oidc"
cat >"$team_dir/provider.json" <<JSON_END
{"issuer": "$issuer", "host": "127.0.0.2", "port": 443,
 "tls": {"cert": "$team_dir/login.example.com.pem", "key": "$team_dir/login.example.com.key"},
 "keys": ["$team_dir/signing.pem"], "resource": "$url",
 "users": {"alice": {"email": "alice@example.com", "groups": ["developers"]},
           "$approver": {"email": "$approver@example.com", "groups": ["gateway-approvers"]}},
 "clients": [{"client_id": "gateway-cli", "token_endpoint_auth_method": "none", "redirect_uris": [],
              "grant_types": ["urn:ietf:params:oauth:grant-type:device_code"], "response_types": []}],
 "access_token_ttl": 600}
JSON_END
node "$root/tests/oidc/provider.mjs" "$team_dir/provider.json" >"$team_dir/provider.log" 2>&1 &
provider_pid=$!
for _ in $(seq 1 100); do
  grep -q "ready" "$team_dir/provider.log" && break
  kill -0 "$provider_pid" 2>/dev/null || { cat "$team_dir/provider.log" >&2; fail "the provider exited"; }
  sleep 0.1
done
grep -q "ready" "$team_dir/provider.log" || fail "the provider is not ready after 10 s"

say "the team-config block into /etc/gateway/gateway.toml, the team-policy block into the policy"
install -d -m 0700 /etc/gateway/tls
install -m 0644 "$team_dir/gateway.example.pem" /etc/gateway/tls/cert.pem
install -m 0600 "$team_dir/gateway.example.key" /etc/gateway/tls/key.pem
ws_module=/srv/gateway/workspace/terraform/offline-demo
rm -rf "$ws_module"
mkdir -p "$ws_module"
cp "$root"/terraform/offline-demo/*.tf "$ws_module/"
if grep -q '^\[http\]' /etc/gateway/gateway.toml; then
  # This check's own, from a run before: replaced.
  kept="$(sed '/^\[http\]/,$d' /etc/gateway/gateway.toml)"
  printf '%s\n' "$kept" >/etc/gateway/gateway.toml
fi
{
  printf '\n'
  printf '%s\n' "${team_config/listen = \"0.0.0.0:443\"/listen = \"127.0.0.3:443\"}"
} >>/etc/gateway/gateway.toml
approvals_data=/etc/gateway/policies/config/approvals/data.yaml
while IFS= read -r line; do
  key="${line%%:*}"
  key="${key#"${key%%[![:space:]]*}"}"
  # Set by this check's run before on this machine: kept.
  grep -qxF -- "$line" "$approvals_data" && continue
  grep -qx "  $key: \[\]" "$approvals_data" || fail "$approvals_data has no empty $key to set"
  kept="$(awk -v k="  $key: []" -v l="$line" '$0 == k { print l; next } { print }' "$approvals_data")"
  printf '%s\n' "$kept" >"$approvals_data"
done <<<"$team_policy"

say "sudo systemctl restart gateway (the daemon restarted as its unit starts it)"
kill "$daemon_pid"
wait "$daemon_pid" 2>/dev/null || true
: >"$log"
# shellcheck disable=SC2086 # ExecStart is a command line, split as systemd splits it
$exec_start >>"$log" 2>&1 &
daemon_pid=$!
echo "$daemon_pid" >"$pidfile"
for _ in $(seq 1 100); do
  grep -q "serving MCP over HTTP" "$log" && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$log" >&2; fail "the daemon exited"; }
  sleep 0.1
done
grep -q "serving MCP over HTTP" "$log" || { cat "$log" >&2; fail "no HTTPS listener after 10 s"; }

say "curl -fsS https://gateway.example/.well-known/oauth-protected-resource/mcp"
metadata="$(curl -fsS https://gateway.example/.well-known/oauth-protected-resource/mcp)" || fail "the metadata"
grep -qF "\"$issuer\"" <<<"$metadata" || fail "the metadata does not name $issuer: $metadata"

team_path="$root/target/release:/usr/local/bin:/usr/bin:/bin"
as_team() {
  local u="$1"
  shift
  runuser -u "$u" -- env -i PATH="$team_path" HOME="$(getent passwd "$u" | cut -d: -f6)" USER="$u" \
    GATEWAY_URL="$url" "$@"
}

say "gateway client install claude-code --url $url (as $agent)"
(cd "$repo" && as_team "$agent" gateway client install claude-code --url "$url") || fail "client install --url"
team_py=("$root/.tools/venv-user/bin/python" "$root/scripts/readme-team-client.py" alice)
say "alice's agent over HTTPS (the SDK signs her in): terraform_plan, then terraform_apply"
request="$(cd "$repo" && as "$agent" "${team_py[@]}" request)" || { cat "$log" >&2; fail "the remote request"; }
id="$(sed -n 's/^APPROVAL //p' <<<"$request")"
[ -n "$id" ] || fail "no approval id in: $request"

say "gateway login --issuer $issuer --client-id gateway-cli (as $approver)"
as_team "$approver" gateway login --issuer "$issuer" --client-id gateway-cli 2>"$team_dir/login.out" &
login_pid=$!
sign_in=""
for _ in $(seq 1 100); do
  sign_in="$(grep -o 'https://[^ ]*' "$team_dir/login.out" | head -n1 || true)"
  [ -n "$sign_in" ] && break
  kill -0 "$login_pid" 2>/dev/null || { cat "$team_dir/login.out" >&2; fail "gateway login ended"; }
  sleep 0.1
done
[ -n "$sign_in" ] || fail "gateway login showed no address: $(cat "$team_dir/login.out")"
"$root/.tools/venv/bin/python" "$root/tests/oidc/login.py" --device "$sign_in" --user "$approver" \
  --ca /etc/ssl/certs/ca-certificates.crt >/dev/null || fail "the device sign-in"
wait "$login_pid" || fail "gateway login: $(cat "$team_dir/login.out")"

say "gateway approvals (as $approver, over HTTPS)"
listed="$(cd "$approver_home" && as_team "$approver" gateway approvals)" || fail "gateway approvals"
grep -qF "$id" <<<"$listed" || fail "$id is not among the approvals: $listed"

say "gateway approve $id --reason … --key ~/.ssh/gateway_approver (as $approver, over HTTPS)"
(cd "$approver_home" && as_team "$approver" gateway approve "$id" --reason "reviewed the replace of web" \
  --key "$approver_home/.ssh/gateway_approver") || fail "the remote approve"

say "alice's agent over HTTPS: terraform_apply with the approval"
applied="$(cd "$repo" && as "$agent" "${team_py[@]}" apply "$id")" || { cat "$log" >&2; fail "the remote apply"; }
grep -q '^APPLIED ' <<<"$applied" || fail "not applied: $applied"
[ -s "$ws_module/terraform.tfstate" ] || fail "no state in the team workspace"
say "ok (team): $applied"
