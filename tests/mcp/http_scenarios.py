"""The official MCP Python SDK over HTTPS against `gateway daemon`'s HTTP
transport, with a bearer token from the test OpenID provider.

    python http_scenarios.py URL TOKEN CA MODE STEP [APPROVAL]

MODE is the SDK's (`auto`: 2026-07-28, stateless; `legacy`: the 2025-11-25
handshake and a session). STEP:
  plan   list the tools, a denied call, a plan, then an apply that waits
         for an approval: prints {"approval_id": ...} last
  apply  the apply again with APPROVAL: prints {"result": ...} last
Every check that fails raises; PASS lines say what held.
"""

import json
import sys

import anyio
import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

URL, TOKEN, CA, MODE, STEP = sys.argv[1:6]
APPROVAL = sys.argv[6] if len(sys.argv) > 6 else None
MODULE = "terraform/offline-demo"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def main():
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {TOKEN}"},
        verify=CA,
        timeout=httpx2.Timeout(30, read=600),
    )
    info = types.Implementation(name="sdk-over-https", version="1")
    async with Client(streamable_http_client(URL, http_client=http), mode=MODE, client_info=info) as c:
        want = "2026-07-28" if MODE == "auto" else "2025-11-25"
        check(c.protocol_version == want, c.protocol_version)
        print(f"PASS connected over HTTPS in {MODE} mode (protocol {c.protocol_version})")
        if STEP == "plan":
            tools = await c.list_tools()
            names = sorted(t.name for t in tools.tools)
            check("terraform_plan" in names and "terraform_apply" in names, names)
            print(f"PASS tools/list shows the policy's tools: {names}")
            r = await c.call_tool("k8s_get_pod_status", {"namespace": "kube-system"})
            check(r.is_error and "not in the allowlist" in r.content[0].text, r)
            print("PASS a call the policy denies is denied, as over the socket")
            r = await c.call_tool("terraform_plan", {"working_dir": MODULE})
            check(not r.is_error and r.structured_content["status"] == "completed", r.content[0].text)
            print("PASS terraform_plan ran in a sandbox for the SSO user")
            r = await c.call_tool("terraform_apply", {"working_dir": MODULE})
            sc = r.structured_content
            check(not r.is_error and sc["status"] == "pending_approval", sc)
            print("PASS terraform_apply waits for a person's approval")
            print(json.dumps({"approval_id": sc["approval_id"], "review_url": sc.get("review_url"),
                              "text": r.content[0].text, "request_id": (r.meta or {}).get("request_id")}))
        elif STEP == "apply":
            r = await c.call_tool("terraform_apply", {"working_dir": MODULE, "approval_id": APPROVAL})
            print(json.dumps({"result": r.structured_content, "text": r.content[0].text, "is_error": r.is_error}))
        else:
            raise SystemExit(f"unknown step {STEP}")


anyio.run(main)
