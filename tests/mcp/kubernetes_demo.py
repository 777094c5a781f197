"""The Kubernetes demo's agent: a scripted stand-in for a coding agent, asked
"my Deployment in demo-app is crash-looping, find out why and fix it". It
speaks MCP to the gateway daemon with the official MCP Python SDK (PyPI
`mcp`), through `gateway serve`, as an unprivileged OS user. Run by the
`demo_` test of tests/kubernetes_toolbox.rs (the README's second demo):

    python kubernetes_demo.py demo GATEWAY_BIN SOCKET WORKSPACE
    python kubernetes_demo.py tour GATEWAY_BIN SOCKET WORKSPACE

`tour` calls every Kubernetes tool of the default catalog once (the
changes on the same crash-looping world), for tests/kubernetes_toolbox.rs.

It decides only from what the tools return: the pod that is not ready, the
line its previous run died with, the env var the Deployment sets instead,
and it proposes the one-line fix with k8s_apply. When the gateway asks for
a person's approval it prints `NEED-APPROVAL <id>` and waits for a line on
stdin (the test approves as another OS user, as a person would). Every
other line it prints is the story, for the person watching.
"""
import difflib
import json
import os
import re
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

NS = "demo-app"
# What the server owns: a manifest from the agent must not carry them.
SERVER_FIELDS = ["uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"]


def say(text):
    print(text, flush=True)


def fail(text):
    say(f"AGENT FAILED: {text}")
    sys.exit(1)


async def call(s, tool, args):
    r = await s.call_tool(tool, args)
    sc = r.structured_content or {}
    if r.is_error or sc.get("status") not in ("completed", "pending_approval"):
        fail(f"{tool} {json.dumps(args)}: {sc or r.content[0].text}")
    if sc["status"] == "completed" and not sc.get("ok"):
        fail(f"{tool} failed: {sc.get('summary')}")
    return sc


def container_state(pod):
    st = (pod.get("status", {}).get("containerStatuses") or [{}])[0]
    waiting = st.get("state", {}).get("waiting", {}).get("reason")
    last = st.get("lastState", {}).get("terminated", {}).get("reason")
    return st.get("ready", False), st.get("restartCount", 0), waiting or last or "-"


async def demo(s):
    tools = sorted(t.name for t in (await s.list_tools()).tools)
    say(f"agent: the gateway offers {len(tools)} tools: {', '.join(tools)}")

    # 1. Which pod is unwell?
    sc = await call(s, "k8s_get", {"namespace": NS, "kind": "pods"})
    say(f"\n== 1. k8s_get pods in {NS}")
    sick = None
    for pod in sc["result"]["items"]:
        ready, restarts, why = container_state(pod)
        say(f"   {pod['metadata']['name']}: ready={ready} restarts={restarts} last={why}")
        if not ready and restarts > 0:
            sick = pod["metadata"]["name"]
    if not sick:
        fail("no crash-looping pod found")

    # 2. What did its previous run say before it died?
    sc = await call(s, "k8s_logs", {"namespace": NS, "name": sick, "previous": True, "tail_lines": 20})
    text = sc["result"]["text"]
    say(f"\n== 2. k8s_logs {sick} --previous\n" + "\n".join("   " + l for l in text.splitlines()))
    m = re.search(r"([A-Z][A-Z0-9_]+) is not set", text)
    if not m:
        fail("the log does not say what is missing")
    missing = m.group(1)

    # 3. What does the cluster say about it?
    sc = await call(s, "k8s_events", {"namespace": NS})
    say(f"\n== 3. k8s_events in {NS}")
    for e in sc["result"]["events"]:
        say(f"   {e.get('type')} {e.get('reason')}: {e.get('message')}")

    # 4. The Deployment that runs it (owner: the pod's ReplicaSet's).
    sc = await call(s, "k8s_describe", {"namespace": NS, "kind": "deployments", "name": "web"})
    described = sc["result"]["text"]
    say("\n== 4. k8s_describe deployments/web (its environment)")
    for line in described.splitlines():
        if re.match(r"\s+[A-Z][A-Z0-9_]*:", line):
            say("   " + line.strip())
    sc = await call(s, "k8s_get", {"namespace": NS, "kind": "deployments", "name": "web"})
    web = sc["result"]["items"][0]
    containers = web["spec"]["template"]["spec"]["containers"]
    names = [e["name"] for c in containers for e in c.get("env", [])]
    close = difflib.get_close_matches(missing, names, n=1, cutoff=0.8)
    if not close or close[0] == missing:
        fail(f"{missing} is missing and no env var looks like a misspelling of it: {names}")
    typo = close[0]
    say(f"\n   diagnosis: the app needs {missing}; the Deployment sets {typo} instead")

    # 5. The one-line fix, proposed as a manifest.
    manifest = {k: v for k, v in web.items() if k != "status"}
    manifest["metadata"] = {k: v for k, v in web["metadata"].items() if k not in SERVER_FIELDS}
    for c in manifest["spec"]["template"]["spec"]["containers"]:
        for e in c.get("env", []):
            if e["name"] == typo:
                e["name"] = missing
    args = {"namespace": NS, "manifest": manifest}
    sc = await call(s, "k8s_apply", args)
    say("\n== 5. k8s_apply of the fix (planned by the API server's dry run)")
    if sc["status"] != "pending_approval":
        fail(f"a high-tier change ran without a person: {sc}")
    for ch in sc["changes"]:
        say(f"   plan: {ch.get('address')} {ch.get('actions')}")
    for sig in sc["signals"]:
        say(f"   signal: {sig.get('message')}")
    if not sc["signals"]:
        say("   signals: none (k8s_apply is high tier: a person approves it anyway)")
    say(f"   the gateway waits for a person: approval {sc['approval_id']}")
    say(f"NEED-APPROVAL {sc['approval_id']}")
    if not sys.stdin.readline():
        fail("nobody answered")

    # 6. The same call with the approval: exactly the reviewed object.
    sc = await call(s, "k8s_apply", {**args, "approval_id": sc["approval_id"]})
    say(f"\n== 6. k8s_apply with the approval\n   {sc['summary']}")

    # 7. Watch the rollout (at most 60 s).
    say("\n== 7. k8s_rollout_status deployments/web")
    deadline = time.monotonic() + 60
    while True:
        sc = await call(s, "k8s_rollout_status", {"namespace": NS, "kind": "deployments", "name": "web"})
        status = sc["result"]["text"].strip()
        say(f"   {status}")
        if "successfully rolled out" in status:
            break
        if time.monotonic() > deadline:
            fail("the rollout did not finish within 60 s")
        await anyio.sleep(1)
    sc = await call(s, "k8s_get", {"namespace": NS, "kind": "pods"})
    pods = sc["result"]["items"]
    for pod in pods:
        ready, restarts, why = container_state(pod)
        say(f"   {pod['metadata']['name']}: ready={ready} restarts={restarts}")
    if not pods or not all(container_state(p)[0] for p in pods):
        fail("not every pod is ready after the rollout")
    say("\nAGENT DONE: the Deployment is fixed and its pods are ready")


async def approved(s, tool, args):
    """A change that waits for a person: ask, print NEED-APPROVAL, wait for
    the test's line, call again with the approval."""
    sc = await call(s, tool, args)
    if sc["status"] != "pending_approval":
        fail(f"{tool} ran without a person: {sc}")
    say(f"NEED-APPROVAL {sc['approval_id']}")
    if not sys.stdin.readline():
        fail("nobody answered")
    return await call(s, tool, {**args, "approval_id": sc["approval_id"]})


async def tour(s):
    """Every Kubernetes tool of the default catalog once, through the
    daemon; prints `TOOL <name> <summary>` for each, for the test."""
    web = {"namespace": NS, "kind": "deployments", "name": "web"}
    done = {}

    async def low(tool, args):
        sc = await call(s, tool, args)
        if sc["status"] != "completed":
            fail(f"{tool} waited for a person: {sc}")
        done[tool] = sc
        say(f"TOOL {tool} {sc['summary'].splitlines()[0] if sc['summary'] else ''}")

    await low("k8s_get_pod_status", {"namespace": NS})
    await low("k8s_get", {"namespace": NS, "kind": "deployments"})
    await low("k8s_describe", web)
    await low("k8s_logs", {"namespace": NS, "name": "web-5c4b-x7k2p"})
    await low("k8s_events", {"namespace": NS})
    await low("k8s_rollout_status", web)
    await low("k8s_rollout_history", web)
    await low("k8s_top", {"namespace": NS})
    # Medium, no signal: planned by the dry run and applied at once.
    await low("k8s_scale", {**web, "replicas": 2})
    await low("k8s_rollout_restart", web)
    await low("k8s_set_image", {**web, "container": "app", "image": "registry.example/web@sha256:" + "ab" * 32})
    # High: a person approves each.
    for tool, args in [
        ("k8s_rollout_undo", {**web, "to_revision": 1}),
        ("k8s_apply", {"namespace": NS, "manifest": {"apiVersion": "v1", "kind": "ConfigMap",
                                                      "metadata": {"name": "web-flags"}, "data": {"beta": "on"}}}),
        ("k8s_delete", {"namespace": NS, "kind": "configmaps", "name": "web-config"}),
    ]:
        sc = await approved(s, tool, args)
        say(f"TOOL {tool} {sc['summary']}")
    say("TOUR DONE")


async def main(mode, gateway, socket, workspace):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_SOCKET"] = socket
    params = StdioServerParameters(command=gateway, args=["serve", "--workspace", workspace], env=env, cwd=workspace)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            await {"demo": demo, "tour": tour}[mode](s)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
