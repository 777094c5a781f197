#!/usr/bin/env bash
# The agent's side against the cluster scripts/up.sh made: the real MCP
# Python SDK drives `gateway serve` (kubernetes backend, OpenBao
# credentials): the pods of demo-app, then a plan of terraform/k8s-demo.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="$root/.tools/cluster/gateway.toml"
[ -f "$config" ] || { echo "demo: run scripts/up.sh first" >&2; exit 2; }
"$root/scripts/install-tools.sh" mcp
"$root/.tools/venv/bin/python" - "$root/target/release/gateway" "$config" <<'PY'
import asyncio, json, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main(gateway, config):
    params = StdioServerParameters(command=gateway, args=["--config", config, "serve"])
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
