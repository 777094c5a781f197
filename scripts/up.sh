#!/usr/bin/env bash
# A real cluster for the kubernetes backend, from nothing: a kind cluster
# (Calico, gVisor), the cluster assets, an OpenBao for credentials, the
# runner image, the daemon's files for it (root's, outside the repository:
# the repository is the agents' workspace), then `gateway verify --backend
# kubernetes`. Needs root, docker, kind, kubectl and internet access
# (Calico, gVisor, image base layers). Idempotent: each step skips what is
# done. scripts/demo.sh then starts the daemon and drives it over MCP.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${KIND_CLUSTER:-gateway}"
IMAGE="${GATEWAY_IMAGE:-gateway-runner:0.1.0}"
state="$root/.tools/cluster"
# The daemon's own files: root's, outside the workspace (the daemon refuses
# anything the agent could write).
daemon_dir="${GATEWAY_KIND_DIR:-/var/lib/gateway-kind}"
kubectl="${KUBECTL:-kubectl}"
say() { printf 'up: %s\n' "$*" >&2; }
mkdir -p "$state"

for tool in docker kind "$kubectl" cargo; do
  command -v "$tool" >/dev/null 2>&1 || { say "$tool is required"; exit 2; }
done

if kind get clusters | grep -qx "$CLUSTER"; then
  say "kind cluster $CLUSTER exists"
else
  kind create cluster --name "$CLUSTER" --config "$root/cluster/kind/cluster.yaml"
fi
"$kubectl" config use-context "kind-$CLUSTER" >&2
KIND_CLUSTER="$CLUSTER" "$root/scripts/install-calico.sh"
KIND_CLUSTER="$CLUSTER" "$root/scripts/install-gvisor.sh"
for f in namespaces runtimeclass rbac workspace; do
  "$kubectl" apply -f "$root/cluster/$f.yaml" >&2
done
address="$("$root/scripts/apply-sandbox-policy.sh")"
# The egress canary: the cluster DNS service, which every pod reaches and the
# sandboxes' default-deny policy denies; sandboxes run nothing until it is
# unreachable (a NetworkPolicy applies only some time after a pod starts).
dns="$("$kubectl" -n kube-system get service kube-dns -o jsonpath='{.spec.clusterIP}')"
[ -n "$dns" ] || { say "no kube-dns service: set egress_canary in gateway.toml by hand"; exit 1; }

# OpenBao: a dev server on this host (listening where the cluster reaches it).
if [ ! -f "$state/bao.pid" ] || ! kill -0 "$(cat "$state/bao.pid")" 2>/dev/null; then
  "$root/scripts/install-tools.sh" openbao
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$state/bao-root-token"
  "$root/.tools/bin/bao" server -dev -dev-listen-address=0.0.0.0:8200 \
    -dev-root-token-id="$(cat "$state/bao-root-token")" >"$state/bao.log" 2>&1 &
  echo $! > "$state/bao.pid"
  sleep 2
fi
export VAULT_ADDR="http://127.0.0.1:8200"
VAULT_TOKEN="$(cat "$state/bao-root-token")"
export VAULT_TOKEN
cargo build --release --manifest-path "$root/Cargo.toml"
"$root/scripts/vault-setup.sh" --approle --secret-id-file "$state/approle-secret-id" | tee "$state/vault-setup.txt"
role_id="$(sed -n 's/^approle gateway: role_id //p' "$state/vault-setup.txt")"

# The runner image, loaded into the nodes.
docker build -t "$IMAGE" -f "$root/images/runner/Dockerfile" "$root"
kind load docker-image --name "$CLUSTER" "$IMAGE"

# The daemon's files for this cluster: its binaries, policies, secrets and
# configuration, all root's and outside the repository.
install -d -m 0755 "$daemon_dir" "$daemon_dir/bin"
install -d -m 0700 "$daemon_dir/state"
install -m 0755 "$root/target/release/gateway" "$root/target/release/gateway-runner" "$daemon_dir/bin/"
rm -rf "$daemon_dir/policies.new"
cp -r "$root/policies" "$daemon_dir/policies.new"
chmod -R go-w "$daemon_dir/policies.new"
rm -rf "$daemon_dir/policies" && mv "$daemon_dir/policies.new" "$daemon_dir/policies"
install -m 0600 "$state/approle-secret-id" "$daemon_dir/approle-secret-id"
"$kubectl" config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' \
  | base64 -d > "$daemon_dir/kube-ca.pem"
cat > "$daemon_dir/gateway.toml" <<TOML
policies = "$daemon_dir/policies"
home = "$daemon_dir/state"
[daemon]
socket = "/run/gateway-kind/gateway.sock"
socket_group = "${GATEWAY_GROUP:-root}"
[endpoints]
kube-apiserver = 6443
[vault]
address = "http://127.0.0.1:8200"
auth = "approle"
[vault.approle]
role_id = "$role_id"
secret_id_file = "$daemon_dir/approle-secret-id"
[kubernetes]
ca_file = "$daemon_dir/kube-ca.pem"
[sandbox]
backend = "kubernetes"
[sandbox.kubernetes]
image = "$IMAGE"
workspace_pvc = "gateway-workspace"
workspace_root = "$root"
egress_canary = "$dns:53"
[sandbox.kubernetes.endpoint_addresses]
kube-apiserver = "$address"
TOML
chmod 0644 "$daemon_dir/gateway.toml"
say "wrote $daemon_dir/gateway.toml"
"$daemon_dir/bin/gateway" --config "$daemon_dir/gateway.toml" verify --backend kubernetes
