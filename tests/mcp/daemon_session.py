"""An unprivileged user's MCP sessions with the gateway daemon, driven by the
official MCP Python SDK (PyPI `mcp`). Run by tests/daemon.rs as that user
(never root):

    python daemon_session.py scenarios GATEWAY_BIN SOCKET WORKSPACE DAEMON_POLICIES VICTIM
    python daemon_session.py list-tools CONFIG_FILE CLIENT WORKSPACE
    python daemon_session.py call GATEWAY_BIN SOCKET WORKSPACE TOOL ARGS_JSON

`scenarios` plays the agent, attacker included: it tries every way a user
with a shell has to change a decision (flags, environment, a gateway.toml in
the workspace or home, policies it writes itself, the daemon's own files)
and checks that the apply still waits for a person. When it needs an
approval it prints `NEED-APPROVAL <id>` and waits for a line on stdin (the
test approves as another OS user). `list-tools` starts the server exactly as
a client config written by `gateway client install` says and lists tools.
"""
import json
import os
import pwd
import subprocess
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

MODULE = "terraform/offline-demo"


# The default catalog's tools, sorted (policies/config/tools/data.yaml).
DEFAULT_TOOLS = ["k8s_apply", "k8s_delete", "k8s_describe", "k8s_events", "k8s_get", "k8s_get_pod_status",
                 "k8s_logs", "k8s_rollout_history", "k8s_rollout_restart", "k8s_rollout_status",
                 "k8s_rollout_undo", "k8s_scale", "k8s_set_image", "k8s_top", "terraform_apply", "terraform_plan"]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def base_env(socket):
    # What a client passes on: no GATEWAY_* but the socket.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_SOCKET"] = socket
    return env


async def session(params, body):
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            return await body(s)


def serve_params(gateway, socket, workspace, args=(), env=None, cwd=None):
    return StdioServerParameters(
        command=gateway,
        args=["serve", "--workspace", workspace, *args],
        env=env if env is not None else base_env(socket),
        cwd=cwd or workspace,
    )


def refused_to_start(gateway, args, env, what):
    """`gateway serve` with these args/env exits non-zero before relaying."""
    r = subprocess.run([gateway, *args], env=env, input="", capture_output=True, text=True, timeout=30)
    check(r.returncode != 0 and "belong to the" in r.stderr, f"{what}: {r.returncode} {r.stderr}")


async def scenarios(gateway, socket, workspace, daemon_policies, victim):
    check(os.getuid() != 0, "these scenarios run as an unprivileged user")
    env = base_env(socket)

    # 1. The normal path: list, plan, apply -> pending approval.
    async def first(s):
        tools = sorted(t.name for t in (await s.list_tools()).tools)
        check(tools == DEFAULT_TOOLS, tools)
        r = await s.call_tool("terraform_plan", {"working_dir": MODULE})
        check(not r.is_error and r.structured_content["status"] == "completed", r.content[0].text)
        r = await s.call_tool("terraform_apply", {"working_dir": MODULE})
        sc = r.structured_content
        check(sc["status"] == "pending_approval", sc)
        return sc["approval_id"]

    approval = await session(serve_params(gateway, socket, workspace), first)
    print("PASS as the user: tools listed, plan run in the daemon's sandbox, apply waits for approval")

    # 2. The user's own approval does not count; the daemon says why.
    r = subprocess.run([gateway, "approve", approval, "--reason", "me"], env=env,
                       capture_output=True, text=True)
    check(r.returncode != 0 and "is not an approver" in r.stderr, r.stdout + r.stderr)
    # A name given on the command line is no identity: --as is gone.
    r = subprocess.run([gateway, "approve", approval, "--as", "someone-else", "--reason", "x"], env=env,
                       capture_output=True, text=True)
    check(r.returncode != 0 and "unexpected argument '--as'" in r.stderr, r.stdout + r.stderr)
    r = subprocess.run([gateway, "audit", "--file", "/etc/shadow"], env=env, capture_output=True, text=True)
    check(r.returncode != 0 and "--file and export are not accepted" in r.stderr, r.stdout + r.stderr)
    r = subprocess.run([gateway, "audit"], env=env, capture_output=True, text=True)
    check(r.returncode != 0 and "is for approvers" in r.stderr, r.stdout + r.stderr)
    r = subprocess.run([gateway, "approvals", "--all", "--json"], env=env, capture_output=True, text=True)
    me = pwd.getpwuid(os.getuid()).pw_name
    mine = json.loads(r.stdout) if r.returncode == 0 else None
    check(mine and [a["id"] for a in mine] == [approval] and mine[0]["requested_by"] == me,
          r.stdout + r.stderr)
    print("PASS the requester cannot approve its own call, nor name another approver, nor read files or the audit via the daemon")

    # 3. Flags and environment that would change policy, config or state.
    for args, extra, what in [
        (["--policies", "/tmp", "serve"], {}, "--policies"),
        (["--home", "/tmp", "serve"], {}, "--home"),
        (["--config", "/tmp/x.toml", "serve"], {}, "--config"),
        (["serve"], {"GATEWAY_POLICIES": "/tmp"}, "GATEWAY_POLICIES"),
        (["serve"], {"GATEWAY_HOME": "/tmp"}, "GATEWAY_HOME"),
        (["serve"], {"GATEWAY_CONFIG": "/tmp/x.toml"}, "GATEWAY_CONFIG"),
    ]:
        refused_to_start(gateway, args, {**env, **extra}, what)
    print("PASS serve refuses every flag and variable that names policies, configuration or state")

    # 4. Files the user can write: a permissive policy set of its own, and
    # a gateway.toml naming it in the workspace and in its home.
    mine = os.path.join(workspace, "policies")
    subprocess.run(["cp", "-r", daemon_policies, mine], check=True)
    catalog = os.path.join(mine, "config/tools/data.yaml")
    text = open(catalog).read()
    check("tier: high" in text, "the catalog has a high-tier tool to flip")
    open(catalog, "w").write(text.replace("tier: high", "tier: low"))
    for where in (workspace, os.path.expanduser("~")):
        open(os.path.join(where, "gateway.toml"), "w").write(f'policies = "{mine}"\n')
    try:
        open(os.path.join(daemon_policies, "config/tools/data.yaml"), "a").write("\n")
        check(False, "the daemon's policy dir is writable by the user")
    except PermissionError:
        pass

    async def again(s):
        r = await s.call_tool("terraform_apply", {"working_dir": MODULE})
        return r.structured_content

    sc = await session(serve_params(gateway, socket, workspace), again)
    check(sc["status"] == "pending_approval", sc)
    # The same call planned again supersedes the first approval: the
    # approver will be asked about the newer plan.
    r = subprocess.run([gateway, "approvals", "show", approval, "--json"], env=env,
                       capture_output=True, text=True)
    check(r.returncode == 0 and json.loads(r.stdout)["state"] == "superseded", r.stdout + r.stderr)
    approval = sc["approval_id"]
    print("PASS a policy set, gateway.toml in the workspace and home, and the daemon's files: none changes the decision")

    # 5. A workspace that is not the user's own is refused by the daemon.
    for foreign in ("/", os.path.dirname(daemon_policies)):
        r = subprocess.run([gateway, "serve", "--workspace", foreign], env=env, input="",
                           capture_output=True, text=True, timeout=30)
        check(r.returncode != 0 and "refused the session" in r.stderr, r.stderr)
    print("PASS a workspace the user does not own is refused")

    # 5b. An admitted workspace swapped for a link to another user's
    # repository (VICTIM, the approver's) mid-session: the daemon opens what
    # the path now names, and refuses it because it is not the caller's.
    async def swapped(s):
        aside = workspace + ".mine"
        os.rename(workspace, aside)
        os.symlink(victim, workspace)
        try:
            return await s.call_tool("terraform_plan", {"working_dir": MODULE})
        finally:
            os.remove(workspace)
            os.rename(aside, workspace)

    r = await session(serve_params(gateway, socket, workspace, cwd="/"), swapped)
    check(r.is_error and "not to the caller" in r.content[0].text, r.content[0].text)
    print("PASS a workspace swapped for a link to another user's repository is refused")

    # 6. Another OS user approves (the test does it when asked), then the apply runs.
    print(f"NEED-APPROVAL {approval}", flush=True)
    check(sys.stdin.readline().strip() == "APPROVED", "the test did not approve")

    async def apply(s):
        r = await s.call_tool("terraform_apply", {"working_dir": MODULE, "approval_id": approval})
        return r

    r = await session(serve_params(gateway, socket, workspace), apply)
    check(not r.is_error and "2 added" in r.content[0].text, r.content[0].text)
    print("PASS after another user's approval the apply runs the approved plan")

    # 7. A client that disconnects mid-call: the daemon cancels the call.
    slow = os.path.join(workspace, MODULE, "slow.tf")
    open(slow, "w").write('resource "terraform_data" "many" {\n  count = 4000\n  input = count.index\n}\n')
    with anyio.move_on_after(4):
        await session(serve_params(gateway, socket, workspace),
                      lambda s: s.call_tool("terraform_plan", {"working_dir": MODULE}))
        check(False, "the slow plan finished before the client went away")
    os.remove(slow)
    print("DISCONNECTED", flush=True)
    check(sys.stdin.readline().strip() == "CANCELLED", "the daemon did not cancel the call")
    print("PASS a client that goes away mid-call has its call cancelled in the daemon")


async def list_tools(config_file, client, workspace):
    doc = json.load(open(config_file))
    entry = doc["servers" if client == "vscode" else "mcpServers"]["gateway"]
    args = [a.replace("${workspaceFolder}", workspace) for a in entry["args"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(entry.get("env") or {})
    params = StdioServerParameters(command=entry["command"], args=args, env=env, cwd=workspace)

    async def body(s):
        return sorted(t.name for t in (await s.list_tools()).tools)

    tools = await session(params, body)
    check(tools == DEFAULT_TOOLS, tools)
    print(f"PASS {client}: the installed config reaches the daemon as this user ({len(tools)} tools)")


async def call(gateway, socket, workspace, tool, args):
    """One call in one session; prints its structuredContent and text."""
    async def body(s):
        return await s.call_tool(tool, json.loads(args))

    r = await session(serve_params(gateway, socket, workspace), body)
    print(json.dumps({"is_error": r.is_error, "structured": r.structured_content,
                      "text": r.content[0].text if r.content else ""}))


def main():
    mode = sys.argv[1]
    if mode == "call":
        anyio.run(call, *sys.argv[2:7])
        return
    if mode == "scenarios":
        anyio.run(scenarios, *sys.argv[2:7])
    elif mode == "list-tools":
        anyio.run(list_tools, *sys.argv[2:5])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
