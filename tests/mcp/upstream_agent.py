"""An agent using upstream MCP servers through the gateway daemon, with the
official MCP Python SDK (PyPI `mcp`), through `gateway serve`, as an
unprivileged OS user. Run by tests/upstream_servers.rs:

    python upstream_agent.py GATEWAY_BIN SOCKET WORKSPACE DATA_DIR

It lists the tools (the upstreams' appear under their prefixes, with their
locked input schemas), reads a file through the filesystem server, asks to
write one (the gateway answers with a pending approval: it prints
`NEED-APPROVAL <id>` and waits for a line on stdin, as a person approves
out of band), writes it with the approval, and meets the hostile server's
100 MB answer and its request for sampling. Each result line starts with
`RESULT <tool>`; the last line is `UPSTREAM AGENT DONE`.
"""
import json
import os
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def say(text):
    print(text, flush=True)


def fail(text):
    say(f"AGENT FAILED: {text}")
    sys.exit(1)


async def call(s, tool, args):
    r = await s.call_tool(tool, args)
    sc = r.structured_content or {}
    text = r.content[0].text if r.content else ""
    say(f"RESULT {tool} status={sc.get('status')} ok={sc.get('ok')} text={json.dumps(text[:300])}")
    return sc, text


async def run(gateway, socket, workspace, data):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_SOCKET"] = socket
    params = StdioServerParameters(command=gateway, args=["serve", "--workspace", workspace], env=env, cwd=workspace)
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            ours = sorted(n for n in tools if "." in n)
            say(f"TOOLS {' '.join(ours)}")
            schema = tools["fs.read_text_file"].input_schema
            if "path" not in schema.get("properties", {}) or "approval_id" not in schema["properties"]:
                fail(f"fs.read_text_file's schema: {schema}")

            sc, text = await call(s, "fs.read_text_file", {"path": f"{data}/a.txt"})
            if not sc.get("ok") or "hello from the data dir" not in text:
                fail("the read did not come back")

            sc, text = await call(s, "fs.read_text_file", {"path": "/etc/passwd"})
            if sc.get("status") != "denied":
                fail("a path outside the served dir was not denied")

            args = {"path": f"{data}/from-agent.txt", "content": "written through the gateway"}
            sc, text = await call(s, "fs.write_file", args)
            if sc.get("status") != "pending_approval":
                fail("the write did not wait for a person")
            approval = sc["approval_id"]
            say(f"NEED-APPROVAL {approval}")
            sys.stdin.readline()
            sc, text = await call(s, "fs.write_file", dict(args, approval_id=approval))
            if not sc.get("ok"):
                fail("the approved write failed")

            sc, text = await call(s, "hostile.attack", {"kind": "huge"})
            if sc.get("ok") or "more than" not in text:
                fail("the 100 MB answer was not stopped")
            sc, text = await call(s, "hostile.attack", {"kind": "sampling"})
            if "-32601" not in text:
                fail("the sampling request was not refused")
            say("UPSTREAM AGENT DONE")


if __name__ == "__main__":
    anyio.run(run, *sys.argv[1:5])
