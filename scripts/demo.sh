#!/usr/bin/env bash
# The agent's side against the cluster scripts/up.sh made: the daemon
# (kubernetes backend, OpenBao credentials) is started if it is not
# running, then the real MCP Python SDK drives `gateway serve` relaying to
# it: the pods of demo-app, then a plan of terraform/k8s-demo.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
daemon_dir="${GATEWAY_KIND_DIR:-/var/lib/gateway-kind}"
config="$daemon_dir/gateway.toml"
socket=/run/gateway-kind/gateway.sock
[ -f "$config" ] || { echo "demo: run scripts/up.sh first" >&2; exit 2; }
if [ ! -S "$socket" ]; then
  "$daemon_dir/bin/gateway" --config "$config" daemon 2> "$daemon_dir/daemon.log" &
  for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done
  [ -S "$socket" ] || { cat "$daemon_dir/daemon.log" >&2; exit 1; }
fi
"$root/scripts/install-tools.sh" mcp
GATEWAY_SOCKET="$socket" "$root/.tools/venv/bin/python" - "$daemon_dir/bin/gateway" "$root" <<'PY'
import asyncio, json, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main(gateway, workspace):
    params = StdioServerParameters(command=gateway, args=["serve", "--workspace", workspace])
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for name, args in [("k8s_get_pod_status", {"namespace": "demo-app"}),
                               ("terraform_plan", {"working_dir": "terraform/k8s-demo"})]:
                res = await s.call_tool(name, args)
                print(f"== {name} {json.dumps(args)}")
                for c in res.content:
                    print(getattr(c, "text", ""))

asyncio.run(main(sys.argv[1], sys.argv[2]))
PY
