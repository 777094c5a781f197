"""End-to-end scenarios of `gateway serve` driven by the official MCP Python
SDK (PyPI `mcp`) over stdio, relayed to a `gateway daemon` the test started
(HOME and POLICIES are that daemon's). Run by tests/mcp_e2e.rs:

    python scenarios.py GATEWAY_BIN HOME WORKSPACE POLICIES SOCKET MODE

MODE is the SDK's: `auto` (its default: it probes `server/discover` and
speaks 2026-07-28, with no handshake and the client's info in each
request's `_meta`) or `legacy` (the `initialize` handshake, 2025-11-25).
Each scenario asserts on the MCP result and on the audit trail of its
request id; every schema tools/list shows is checked as JSON Schema and
every `structuredContent` against its tool's output schema. The script
prints one line per scenario and exits non-zero on the first failure.
"""
import asyncio
import json
import os
import subprocess
import sys
import time

from typing import Any, Literal

import anyio
import jsonschema
import mcp_types as types
from mcp import StdioServerParameters
from mcp.client.client import Client
from mcp.client.extension import ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field

GATEWAY, HOME, WORKSPACE, POLICIES, SOCKET, MODE = sys.argv[1:7]
MODULE = "terraform/offline-demo"
CLIENT = "gateway-e2e-" + MODE
OUTPUT_SCHEMAS = {}


def audit_events(request_id):
    path = os.path.join(HOME, "audit.jsonl")
    with open(path) as f:
        events = [json.loads(line) for line in f if line.strip()]
    return [e["event"] for e in events if e.get("request_id") == request_id]


def rid(result):
    sc = result.structured_content
    schema = OUTPUT_SCHEMAS.get(sc["tool"])
    check(schema is not None, "no output schema for " + sc["tool"])
    jsonschema.Draft202012Validator(schema).validate(sc)
    return sc["request_id"]


def requests_of(request_id):
    path = os.path.join(HOME, "audit.jsonl")
    with open(path) as f:
        events = [json.loads(line) for line in f if line.strip()]
    return [e["data"] for e in events if e.get("request_id") == request_id and e["event"] == "tool.request"]


# The default catalog's tools, sorted (policies/config/tools/data.yaml).
DEFAULT_TOOLS = ["k8s_apply", "k8s_delete", "k8s_describe", "k8s_events", "k8s_get", "k8s_get_pod_status",
                 "k8s_logs", "k8s_rollout_history", "k8s_rollout_restart", "k8s_rollout_status",
                 "k8s_rollout_undo", "k8s_scale", "k8s_set_image", "k8s_top", "terraform_apply", "terraform_plan"]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


async def scenarios(s):
    init_tools = await s.list_tools()
    names = sorted(t.name for t in init_tools.tools)
    check(names == DEFAULT_TOOLS, names)
    apply_tool = next(t for t in init_tools.tools if t.name == "terraform_apply")
    check(apply_tool.annotations.destructive_hint is True, apply_tool.annotations)
    check(apply_tool.input_schema["additionalProperties"] is False, apply_tool.input_schema)
    check(apply_tool.output_schema is not None, "output schema")
    for t in init_tools.tools:
        jsonschema.Draft202012Validator.check_schema(t.input_schema)
        jsonschema.Draft202012Validator.check_schema(t.output_schema)
        for name, prop in t.input_schema["properties"].items():
            check(prop.get("description"), f"{t.name}.{name} has no description")
        OUTPUT_SCHEMAS[t.name] = t.output_schema
    # One result schema per runner: the pod lister, the Kubernetes reads
    # (every k8s_* read shares kubectl_read's), the Kubernetes changes, the
    # plan and the apply.
    check(len({json.dumps(t.output_schema["properties"]["result"], sort_keys=True) for t in init_tools.tools}) == 5,
          "each runner has its own result schema")
    logs = next(t for t in init_tools.tools if t.name == "k8s_logs")
    check(logs.input_schema["properties"]["tail_lines"] == {
        "type": "integer", "minimum": 1, "maximum": 2000,
        "description": "How many of the last lines (default 200)."}, logs.input_schema)
    check(logs.input_schema["properties"]["previous"]["type"] == "boolean", logs.input_schema)
    check(logs.input_schema["properties"]["name"]["pattern"] == "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
          logs.input_schema)
    pods = next(t for t in init_tools.tools if t.name == "k8s_get_pod_status")
    check(pods.input_schema["properties"]["namespace"]["enum"] == ["demo-app"], pods.input_schema)
    check(MODULE in apply_tool.input_schema["properties"]["working_dir"]["enum"], apply_tool.input_schema)
    print("PASS list tools: only the policy's tools, annotations, valid schemas, described params, the policy's choices")

    r = await s.call_tool("k8s_get_pod_status", {"namespace": "kube-system"})
    check(r.is_error and "not in the allowlist" in r.content[0].text, r)
    check(audit_events(rid(r)) == ["tool.request", "policy.decision", "tool.result"], audit_events(rid(r)))
    check(requests_of(rid(r))[0]["principal"]["client"] == CLIENT, requests_of(rid(r)))
    check(len(r.content) == 1 and not r.content[0].text.lstrip().startswith("{"), r.content)
    print("PASS pod status outside the allowlist is denied (never reaches broker or sandbox); the audit names the client")

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
    check(not r.is_error and "was spent by request" in r.content[0].text
          and r.structured_content["status"] == "completed", r.content[0].text)
    again = audit_events(rid(r))
    check("sandbox.started" not in again and "approval.spent" not in again, again)
    print("PASS the same call with the spent approval returns that apply's outcome; nothing runs again")

    r = await s.call_tool("terraform_plan", {"working_dir": "../../etc"})
    check(r.is_error and "contains '..'" in r.content[0].text, r.content[0].text)
    check(audit_events(rid(r)) == ["tool.request", "policy.decision", "tool.result"], audit_events(rid(r)))
    print("PASS working_dir ../../etc is refused")

    try:
        await s.call_tool("delete_everything", {})
        check(False, "an unknown tool got a result")
    except MCPError as e:
        check(e.code == -32602 and e.message == 'Unknown tool: "delete_everything"', (e.code, e.message))
        unknown_id = (e.error.data or {}).get("request_id")
    check(audit_events(unknown_id) == ["tool.request", "policy.decision", "tool.result"], audit_events(unknown_id))
    print("PASS an unknown tool is a JSON-RPC -32602 error, audited")

    r = await s.call_tool("terraform_plan", {"working_dir": MODULE, "role": "admin"})
    check(r.is_error and 'unknown param "role"' in r.content[0].text, r.content[0].text)
    check(r.structured_content["violations"] == [{"param": "role", "problem": "unknown",
          "message": 'unknown param "role" for tool "terraform_plan"'}], r.structured_content)
    check(audit_events(rid(r)) == ["tool.request", "policy.decision", "tool.result"], audit_events(rid(r)))
    print("PASS malformed arguments are a tool error naming the field, found by the policy after the request is audited")

    # Cancellation: make the plan slow, cancel it, check its sandbox is gone.
    slow = os.path.join(WORKSPACE, MODULE, "slow.tf")
    open(slow, "w").write('resource "terraform_data" "many" {\n  count = 4000\n  input = count.index\n}\n')
    beats = []

    async def on_beat(p, total, message):
        beats.append((time.monotonic(), p, total, message))

    with anyio.move_on_after(6):
        await s.call_tool("terraform_plan", {"working_dir": MODULE}, progress_callback=on_beat)
        check(False, "the slow plan finished before it could be cancelled")
    os.remove(slow)
    check(sum(1 for b in beats if b[3].startswith("still working")) >= 2, beats)
    check(all(b[1] > a[1] for a, b in zip(beats, beats[1:])), beats)
    check(max(b[0] - a[0] for a, b in zip(beats, beats[1:])) < 3, beats)
    check(any(b[2] is not None and b[2] > b[1] for b in beats), "a sandbox's deadline is the total")
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
    print("PASS a long call keeps sending progress (heartbeats, the deadline as total); cancelling it kills its sandbox and the audit says cancelled")

    await list_changed(s)

    r = subprocess.run([GATEWAY, "--home", HOME, "audit", "verify"], capture_output=True, text=True)
    check(r.returncode == 0, r.stdout + r.stderr)
    print("PASS the audit chain verifies")


LIST_CHANGED = []


async def on_message(message):
    if getattr(message, "method", None) == "notifications/tools/list_changed":
        LIST_CHANGED.append(message)


async def wait_list_changed(s, sub, seen):
    """The next tools/list_changed: on the listen stream (2026-07-28) or as
    a plain notification (the handshake era)."""
    with anyio.fail_after(15):
        if sub is not None:
            async for event in sub:
                if type(event).__name__ == "ToolsListChanged":
                    return
        else:
            while len(LIST_CHANGED) <= seen:
                await anyio.sleep(0.05)


async def list_changed(s):
    catalog = os.path.join(POLICIES, "config/tools/data.yaml")
    original = open(catalog).read()
    check(original.rstrip().endswith("openWorldHint: true"), "terraform_apply is the catalog's last entry")

    async def body(sub):
        seen = len(LIST_CHANGED)
        # Only another client may see terraform_apply now.
        open(catalog, "w").write(original.rstrip() + "\n  clients: [ops-console]\n")
        try:
            await wait_list_changed(s, sub, seen)
            names = sorted(t.name for t in (await s.list_tools()).tools)
            check(names == [n for n in DEFAULT_TOOLS if n != "terraform_apply"], names)
            try:
                await s.call_tool("terraform_apply", {"working_dir": MODULE})
                check(False, "a tool the client is not shown got a result")
            except MCPError as e:
                # The same words as for a tool that does not exist.
                check(e.code == -32602 and e.message == 'Unknown tool: "terraform_apply"', e.message)
                hidden = (e.error.data or {}).get("request_id")
                check(audit_events(hidden) == ["tool.request", "policy.decision", "tool.result"], audit_events(hidden))
        finally:
            seen = len(LIST_CHANGED)
            open(catalog, "w").write(original)
        await wait_list_changed(s, sub, seen)
        names = sorted(t.name for t in (await s.list_tools()).tools)
        check(names == DEFAULT_TOOLS, names)

    if MODE == "legacy":
        await body(None)
    else:
        async with s.listen(tools_list_changed=True) as sub:
            await body(sub)
    print("PASS a policy edit that changes the client's tools sends tools/list_changed (and a hidden tool is a -32602 error)")


def approve(approval_id):
    return verdict("approve", approval_id)


def verdict(what, approval_id):
    reason = "not now" if what == "deny" else "reviewed in the MCP test"
    r = subprocess.run(
        [GATEWAY, "--home", HOME, "--policies", POLICIES, what, approval_id, "--reason", reason],
        capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"gateway {what} failed: " + r.stdout + r.stderr)
    return r.stdout


def all_events():
    with open(os.path.join(HOME, "audit.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


class TaskHandle(types.Result):
    """SEP-2663's CreateTaskResult (`resultType: "task"`)."""
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str


class GetTaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(types.Request[GetTaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class AnyResult(types.Result):
    model_config = ConfigDict(extra="allow")


class CancelTask(types.Request[GetTaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class TaskCancelled(Exception):
    pass


class Tasks(ClientExtension):
    """The client side of the Tasks extension, which the SDK leaves to
    extensions: declares it, and resolves a task handle by polling tasks/get
    (each status message is kept, for the test to read)."""
    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self):
        self.statuses = []
        self.handles = []
        # When set: tasks/cancel once the task has left its wait (the
        # approval was granted), as an agent that wants the apply undone.
        self.cancel_after_grant = False

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle, ctx):
        self.handles.append(handle)
        while True:
            raw = await ctx.session.send_request(GetTask(params=GetTaskParams(taskId=handle.task_id)), AnyResult)
            task = raw.model_dump(by_alias=True)
            self.statuses.append((task["status"], task.get("statusMessage")))
            if task["status"] == "completed":
                return types.CallToolResult.model_validate(task["result"])
            if task["status"] == "cancelled":
                raise TaskCancelled(task)
            if task["status"] == "failed":
                raise AssertionError(f"task failed: {task}")
            message = task.get("statusMessage") or ""
            waited = any(m and "waiting for a person's approval" in m for _, m in self.statuses)
            # Once the apply's sandbox runs (its approval spent: after the
            # grant the only sandbox is the apply's): the cancel that would
            # leave it half done. A cancel between the grant and the spend
            # abandons the call and leaves the approval unspent.
            if self.cancel_after_grant and waited and message.startswith("sandbox "):
                self.cancel_after_grant = False
                await ctx.session.send_request(CancelTask(params=GetTaskParams(taskId=handle.task_id)), AnyResult)
            await anyio.sleep(0.1)


async def waiting_approval(tasks):
    """The approval id a task's status says it waits for."""
    with anyio.fail_after(120):
        while not any(m and "waiting for a person's approval" in m for _, m in tasks.statuses):
            await anyio.sleep(0.2)
    waiting = next(m for _, m in tasks.statuses if m and "waiting for a person's approval" in m)
    return waiting.split("approval ", 1)[1].split(":", 1)[0]


async def task_scenarios(params):
    """A client with the Tasks extension: a pending apply is a task that
    waits for the approval and completes once `gateway approve` grants it."""
    tasks = Tasks()
    client_info = types.Implementation(name="gateway-e2e-tasks", version="1")
    async with Client(params, client_info=client_info, extensions=[tasks]) as c:
        check(c.protocol_version == "2026-07-28", c.protocol_version)
        tools = await c.list_tools()
        for t in tools.tools:
            OUTPUT_SCHEMAS[t.name] = t.output_schema
        main_tf = os.path.join(WORKSPACE, MODULE, "main.tf")
        text = open(main_tf).read()
        open(main_tf, "w").write(text.replace('labels = "app=web,tier=frontend"', 'labels = "app=web,tier=backend"', 1))
        result = {}

        async def call():
            result["r"] = await c.call_tool("terraform_apply", {"working_dir": MODULE})

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            approval = await waiting_approval(tasks)
            await anyio.sleep(1.5)  # still waiting: nobody has approved
            check("r" not in result, "the task completed before the approval")
            await anyio.to_thread.run_sync(approve, approval)
        r = result["r"]
        check(len(tasks.handles) == 1, tasks.handles)
        check(not r.is_error and "1 replaced" in r.content[0].text, r.content[0].text)
        check(r.structured_content["status"] == "completed", r.structured_content)
        trail = audit_events(rid(r))
        check("approval.spent" in trail and trail[-1] == "tool.result", trail)
        check(requests_of(rid(r))[0]["principal"]["client"] == "gateway-e2e-tasks", requests_of(rid(r)))
        ended = [e["data"] for e in all_events() if e["event"] == "task.ended" and e["data"].get("request_id") == rid(r)]
        check(len(ended) == 1 and ended[0]["outcome"] == "completed", ended)
        print("PASS a pending apply run as a task waits for the approval and completes, applied, after gateway approve")

        # Denied: the task completes with an error result saying so.
        # (Read before opening for writing: that truncates the file.)
        edited = open(main_tf).read().replace('tier=backend', 'tier=db', 1)
        open(main_tf, "w").write(edited)
        result.clear()
        tasks.statuses.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            approval = await waiting_approval(tasks)
            await anyio.to_thread.run_sync(verdict, "deny", approval)
        r = result["r"]
        check(r.is_error and "was denied: not now" in r.content[0].text, r.content[0].text)
        check(r.structured_content["status"] == "refused", r.structured_content)
        ended = [e["data"] for e in all_events() if e["event"] == "task.ended" and e["data"]["outcome"] == "refused"]
        check(len(ended) == 1 and approval in ended[0]["detail"], ended)
        print("PASS a task whose approval is denied completes with an error result that says so, audited")

        # The agent cancels the task the moment its apply starts, to leave
        # it half done (resources changed, state not saved).
        # Once the approval can be spent the apply runs to its end: the
        # state comes back and the audit has the apply's result.
        edited = open(main_tf).read().replace('tier=db', 'tier=cache', 1)
        open(main_tf, "w").write(edited)
        state = os.path.join(WORKSPACE, MODULE, "terraform.tfstate")
        result.clear()
        tasks.statuses.clear()
        tasks.cancel_after_grant = True
        cancelled = {}

        async def call_cancelled():
            try:
                await c.call_tool("terraform_apply", {"working_dir": MODULE})
            except TaskCancelled as e:
                cancelled["task"] = e

        async with anyio.create_task_group() as tg:
            tg.start_soon(call_cancelled)
            approval = await waiting_approval(tasks)
            await anyio.to_thread.run_sync(approve, approval)
        check("task" in cancelled, f"the task was cancelled after the grant: {tasks.statuses}")
        ended = [e["data"] for e in all_events() if e["event"] == "task.ended" and e["data"]["outcome"] == "cancelled"]
        check(len(ended) == 1 and "runs to its end" in ended[0]["detail"], ended)
        applied = ended[0]["request_id"]
        with anyio.fail_after(180):
            while not audit_events(applied) or audit_events(applied)[-1] != "tool.result":
                await anyio.sleep(0.2)
        trail = audit_events(applied)
        check("approval.spent" in trail and "state.saved" in trail, trail)
        results = [e["data"] for e in all_events() if e["request_id"] == applied and e["event"] == "tool.result"]
        check(results[-1]["status"] == "completed" and results[-1]["ok"] is True, results)
        check(results[-1]["result"]["state"]["change"]["replaced"] == ["terraform_data.web"], results[-1])
        saved = json.load(open(state))
        webs = [r for r in saved.get("resources", []) if r.get("name") == "web"]
        check(webs, json.dumps(saved)[:2000])
        web = webs[0]["instances"][0]["attributes"]
        check(web["triggers_replace"]["value"]["labels"] == "app=web,tier=cache", web)
        print("PASS a task cancelled once its approval is granted still applies to the end: state saved, audited")


async def main():
    params = StdioServerParameters(
        command=GATEWAY,
        args=["serve", "--workspace", WORKSPACE],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
             "GATEWAY_SOCKET": SOCKET},
    )
    client_info = types.Implementation(name=CLIENT, version="1")
    async with Client(params, mode=MODE, client_info=client_info, message_handler=on_message) as c:
        want = "2025-11-25" if MODE == "legacy" else "2026-07-28"
        check(c.protocol_version == want, c.protocol_version)
        if MODE == "legacy":
            await c.send_ping()
        print(f"PASS connected in {MODE} mode (protocol {want})")
        await scenarios(c)
    if MODE != "legacy":
        await task_scenarios(params)


if __name__ == "__main__":
    anyio.run(main)
