"""End-to-end scenarios of `gateway serve` driven by the official MCP Python
SDK (PyPI `mcp`) over stdio, relayed to a `gateway daemon` the test started
(HOME and POLICIES are that daemon's). Run by tests/mcp_e2e.rs:

    python scenarios.py GATEWAY_BIN HOME WORKSPACE POLICIES SOCKET

Each scenario asserts on the MCP result and on the audit trail of its
request id; the script prints one line per scenario and exits non-zero on
the first failure.
"""
import asyncio
import json
import os
import subprocess
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

GATEWAY, HOME, WORKSPACE, POLICIES, SOCKET = sys.argv[1:6]
MODULE = "terraform/offline-demo"


def audit_events(request_id):
    path = os.path.join(HOME, "audit.jsonl")
    with open(path) as f:
        events = [json.loads(line) for line in f if line.strip()]
    return [e["event"] for e in events if e.get("request_id") == request_id]


def rid(result):
    return result.structured_content["request_id"]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def scenarios(s):
    init_tools = await s.list_tools()
    names = sorted(t.name for t in init_tools.tools)
    check(names == ["k8s_get_pod_status", "terraform_apply", "terraform_plan"], names)
    apply_tool = next(t for t in init_tools.tools if t.name == "terraform_apply")
    check(apply_tool.annotations.destructive_hint is True, apply_tool.annotations)
    check(apply_tool.input_schema["additionalProperties"] is False, apply_tool.input_schema)
    check(apply_tool.output_schema is not None, "output schema")
    print("PASS list tools: only the policy's tools, with annotations and schemas")

    r = await s.call_tool("k8s_get_pod_status", {"namespace": "kube-system"})
    check(r.is_error and "not in the allowlist" in r.content[0].text, r)
    check(audit_events(rid(r)) == ["tool.request", "policy.decision", "tool.result"], audit_events(rid(r)))
    print("PASS pod status outside the allowlist is denied (never reaches broker or sandbox)")

    progress = []

    async def on_progress(p, total, message):
        progress.append(message)

    r = await s.call_tool("terraform_plan", {"working_dir": MODULE}, progress_callback=on_progress)
    check(not r.is_error, r.content[0].text)
    check(r.structured_content["status"] == "completed", r.structured_content)
    check(r.meta and r.meta.get("request_id") == rid(r), r.meta)
    trail = audit_events(rid(r))
    check(trail[:3] == ["tool.request", "policy.decision", "sandbox.started"] and trail[-1] == "tool.result", trail)
    check(any("sandbox" in (m or "") for m in progress) and any("plan computed" in (m or "") for m in progress), progress)
    print("PASS terraform_plan of the demo module runs in a sandbox, with progress notifications")

    # Seed the resources so that an edit replaces one (approved out of band).
    r = await s.call_tool("terraform_apply", {"working_dir": MODULE})
    seed_id = r.structured_content["approval_id"]
    approve(seed_id)
    r = await s.call_tool("terraform_apply", {"working_dir": MODULE, "approval_id": seed_id})
    check(not r.is_error and "From the state: 2 added," in r.content[0].text, r.content[0].text)

    main_tf = os.path.join(WORKSPACE, MODULE, "main.tf")
    text = open(main_tf).read()
    open(main_tf, "w").write(text.replace('labels = "app=web"', 'labels = "app=web,tier=frontend"', 1))
    state = os.path.join(WORKSPACE, MODULE, "terraform.tfstate")
    state_before = open(state).read()
    r = await s.call_tool("terraform_apply", {"working_dir": MODULE})
    sc = r.structured_content
    check(not r.is_error and sc["status"] == "pending_approval", sc)
    check(any(sig["kind"] == "replace" for sig in sc["signals"]), sc["signals"])
    check(sc["approve_command"].startswith("gateway approve " + sc["approval_id"]), sc)
    check(open(state).read() == state_before, "nothing was applied")
    check(audit_events(rid(r))[-2:] == ["approval.requested", "tool.result"], audit_events(rid(r)))
    approval = sc["approval_id"]
    print("PASS apply without approval returns a pending approval and changes nothing")

    out = approve(approval)
    check("approved" in out, out)
    print("PASS gateway approve from another process")

    r = await s.call_tool("terraform_apply", {"working_dir": "terraform/k8s-demo", "approval_id": approval})
    check(r.is_error and "bound to other params" in r.content[0].text, r.content[0].text)
    check("approval.refused" in audit_events(rid(r)), audit_events(rid(r)))
    print("PASS the approval used with other params is refused")

    r = await s.call_tool("terraform_apply", {"working_dir": MODULE, "approval_id": approval})
    check(not r.is_error and "From the state: 0 added, 1 replaced, 0 removed." in r.content[0].text, r.content[0].text)
    trail = audit_events(rid(r))
    check(trail[:3] == ["tool.request", "policy.decision", "policy.decision"], trail)
    check(["approval.spent", "sandbox.started", "sandbox.completed", "state.saved", "state.saved", "tool.result"] == trail[-6:], trail)
    print("PASS apply with the approval applies the approved plan")

    r = await s.call_tool("terraform_apply", {"working_dir": MODULE, "approval_id": approval})
    check(r.is_error and "already spent" in r.content[0].text, r.content[0].text)
    print("PASS the same approval again is refused")

    r = await s.call_tool("terraform_plan", {"working_dir": "../../etc"})
    check(r.is_error and "contains '..'" in r.content[0].text, r.content[0].text)
    check(audit_events(rid(r)) == ["tool.request", "policy.decision", "tool.result"], audit_events(rid(r)))
    print("PASS working_dir ../../etc is refused")

    r = await s.call_tool("delete_everything", {})
    check(r.is_error and "unknown tool" in r.content[0].text, r.content[0].text)
    print("PASS an unknown tool is refused")

    r = await s.call_tool("terraform_plan", {"working_dir": MODULE, "role": "admin"})
    check(r.is_error and 'unknown param "role"' in r.content[0].text, r.content[0].text)
    check(r.structured_content["violations"] == [{"param": "role", "problem": "unknown",
          "message": 'unknown param "role" for tool "terraform_plan"'}], r.structured_content)
    check(audit_events(rid(r)) == ["tool.request", "policy.decision", "tool.result"], audit_events(rid(r)))
    print("PASS malformed arguments are a tool error naming the field, found by the policy after the request is audited")

    # Cancellation: make the plan slow, cancel it, check its sandbox is gone.
    slow = os.path.join(WORKSPACE, MODULE, "slow.tf")
    open(slow, "w").write('resource "terraform_data" "many" {\n  count = 4000\n  input = count.index\n}\n')
    with anyio.move_on_after(4):
        await s.call_tool("terraform_plan", {"working_dir": MODULE})
        check(False, "the slow plan finished before it could be cancelled")
    os.remove(slow)
    cancelled = []
    for _ in range(100):  # the server records it once the sandbox is removed
        events = [json.loads(l) for l in open(os.path.join(HOME, "audit.jsonl")) if l.strip()]
        cancelled = [e for e in events if e["event"] == "tool.result" and e["data"].get("status") == "cancelled"]
        if cancelled:
            break
        await anyio.sleep(0.1)
    check(len(cancelled) == 1, cancelled)
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    check(not any("runsc" in l and cancelled[0]["request_id"] in l for l in left.splitlines()), left)
    trail = audit_events(cancelled[0]["request_id"])
    check(trail[0] == "tool.request" and "sandbox.started" in trail and trail[-1] == "tool.result", trail)
    print("PASS cancelling a slow call kills its sandbox and the audit says cancelled")

    r = subprocess.run([GATEWAY, "--home", HOME, "audit", "verify"], capture_output=True, text=True)
    check(r.returncode == 0, r.stdout + r.stderr)
    print("PASS the audit chain verifies")


def approve(approval_id):
    r = subprocess.run(
        [GATEWAY, "--home", HOME, "--policies", POLICIES, "approve", approval_id,
         "--reason", "reviewed in the MCP test"],
        capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError("gateway approve failed: " + r.stdout + r.stderr)
    return r.stdout


async def main():
    params = StdioServerParameters(
        command=GATEWAY,
        args=["serve", "--workspace", WORKSPACE],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
             "GATEWAY_SOCKET": SOCKET},
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            if init.protocol_version != "2025-11-25":
                raise AssertionError(init.protocol_version)
            await session.send_ping()
            print("PASS initialize (protocol 2025-11-25) and ping")
            await scenarios(session)


if __name__ == "__main__":
    anyio.run(main)
