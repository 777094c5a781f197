"""The MCP client a user's agent is, for scripts/readme-check.sh: it starts
the gateway exactly as the config `gateway client install claude-code`
wrote says (command, args, env from ~/.claude.json) with the official MCP
Python SDK, in the user's repository, and calls the tools.

    python readme-client.py request      plan, then ask to apply: prints APPROVAL <id>
    python readme-client.py apply ID     apply with the approval: prints APPLIED
"""
import json
import os
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

MODULE = "terraform/offline-demo"


def server():
    with open(os.path.expanduser("~/.claude.json")) as f:
        entry = json.load(f)["mcpServers"]["gateway"]
    env = dict(os.environ)
    env.update(entry.get("env") or {})
    return StdioServerParameters(
        command=entry["command"], args=entry.get("args", []), env=env, cwd=os.getcwd()
    )


def structured(result):
    if result.is_error:
        text = " ".join(c.text for c in result.content if getattr(c, "text", None))
        raise SystemExit(f"the call failed: {text}")
    return result.structured_content or {}


async def main(argv):
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            assert {"terraform_plan", "terraform_apply"} <= names, names
            if argv[0] == "request":
                plan = structured(await s.call_tool("terraform_plan", {"working_dir": MODULE}))
                assert plan.get("status") == "completed", plan
                asked = structured(await s.call_tool("terraform_apply", {"working_dir": MODULE}))
                assert asked.get("status") == "pending_approval", asked
                print("APPROVAL", asked["approval_id"], flush=True)
            elif argv[0] == "apply":
                done = structured(
                    await s.call_tool(
                        "terraform_apply", {"working_dir": MODULE, "approval_id": argv[1]}
                    )
                )
                assert done.get("status") == "completed" and done.get("ok") is True, done
                print("APPLIED", json.dumps(done.get("summary", "")), flush=True)
            else:
                raise SystemExit(__doc__)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
