#!/usr/bin/env python3
"""The policy contract, checked by OPA itself.

Loads the policy dirs the way an OPA bundle is loaded (every `.rego`
module; data only from `data.json` / `data.yaml` / `data.yml`, mounted at its
directory's path; a top-level `schema/` dir is not data) into OPA's own Go
engine (PyPI opa-golib-python-bindings), then:

1. runs every `test_*` rule, as `opa test` does, and compares each outcome
   with `gateway policy test --format json` on the same dirs: the same tests,
   the same outcomes, all passing;
2. builds a matrix of calls (every catalog tool with good and bad params,
   every real plan fixture, approvals, a real saved plan file whose
   configuration carries provisioners), has the gateway build each input
   and decide it (`gateway policy eval --show-input`), and evaluates
   `data.gateway.decision` under OPA with that same input: the decisions
   must be equal;
3. validates every input against policies/schema/input.json and every
   decision (the gateway's and OPA's) against policies/schema/decision.json.

Usage: scripts/opa-conformance.py [--gateway target/debug/gateway]
Exit status 0 only when everything agrees.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import jsonschema
import yaml
from opa_bindings import OpaEngine, OpaError, OpaUndefinedError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_OK = "terraform/offline-demo"
DATA_FILES = ("data.json", "data.yaml", "data.yml")


def canonical(value):
    """JSON text with sorted keys: equal only when the documents are (Python's
    own == takes True for 1 and 1 for 1.0)."""
    return json.dumps(value, sort_keys=True)


def bundle_files(root):
    """(relative path, absolute path) of every file OPA's bundle reader takes:
    every .rego file and data.json/data.yaml/data.yml, hidden ones too, links
    not followed (the gateway refuses hidden policy files and links, so a
    set that has any fails `gateway policy test` here)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            if name.endswith(".rego") or name in DATA_FILES:
                out.append((os.path.join(rel_dir, name), path))
    return out


def load_engine(roots):
    engine = OpaEngine()
    modules = {}
    for root in roots:
        for rel, path in bundle_files(root):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if rel.endswith(".rego"):
                name = os.path.join(os.path.basename(root), rel)
                engine.add_policy(name, text)
                modules[name] = text
            else:
                value = json.loads(text) if rel.endswith(".json") else yaml.safe_load(text)
                parts = [p for p in os.path.dirname(rel).split(os.sep) if p]
                engine.add_data(value, path=".".join(parts))
    return engine, modules


PACKAGE = re.compile(r"^package\s+([A-Za-z0-9_.]+)", re.M)
TEST_RULE = re.compile(r"^(test_[A-Za-z0-9_]+)\b", re.M)


def opa_tests(engine, modules):
    """{data.pkg.test_x: "pass" | "fail" | "error"} as `opa test` decides."""
    results = {}
    for text in modules.values():
        pkg = PACKAGE.search(text)
        if not pkg:
            continue
        for name in dict.fromkeys(TEST_RULE.findall(text)):
            full = f"data.{pkg.group(1)}.{name}"
            try:
                value = engine.eval_document(f"{pkg.group(1)}.{name}")
                results[full] = "pass" if value is True else "fail"
            except OpaUndefinedError:
                results[full] = "fail"
            except OpaError as e:
                results[full] = f"error: {e}"
    return results


def gateway_tests(gateway, roots):
    out = subprocess.run(
        [gateway, "--policies", roots[0], "policy", "test", *roots, "--format", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    doc = json.loads(out.stdout)
    return {r["name"]: r["outcome"] for r in doc["results"]}


def saved_plan_with_config(work):
    """A real saved plan file whose configuration has a provisioner and a
    removed block with one (made offline with built-in resources)."""
    terraform = os.environ.get("TERRAFORM", os.path.join(ROOT, ".tools/bin/terraform"))
    module = os.path.join(work, "module")
    os.makedirs(module)
    with open(os.path.join(module, "main.tf"), "w") as f:
        f.write(
            'resource "terraform_data" "web" {\n'
            '  input = "v1"\n'
            '  provisioner "local-exec" {\n'
            '    command = "echo ${self.input}"\n'
            "  }\n"
            "}\n"
        )
    rc = os.path.join(work, "terraformrc")
    open(rc, "w").close()
    env = dict(os.environ, TF_CLI_CONFIG_FILE=rc, TF_IN_AUTOMATION="1", CHECKPOINT_DISABLE="1")
    for args in (["init", "-input=false"], ["plan", "-input=false", "-out=plan.tfplan"]):
        subprocess.run([terraform, f"-chdir={module}", *args], check=True, env=env,
                       capture_output=True)
    show = subprocess.run([terraform, f"-chdir={module}", "show", "-json", "plan.tfplan"],
                          check=True, env=env, capture_output=True)
    plan_json = os.path.join(work, "plan.json")
    with open(plan_json, "wb") as f:
        f.write(show.stdout)
    return os.path.join(module, "plan.tfplan"), plan_json


def cases(policies, work):
    """Every call the matrix decides: (name, policy eval arguments)."""
    with open(os.path.join(policies, "config/tools/data.yaml")) as f:
        catalog = yaml.safe_load(f)
    good = {
        "k8s_get_pod_status": [{"namespace": "demo-app"}, {"namespace": "kube-system"}],
        "terraform_plan": [{"working_dir": d} for d in
                           ("terraform/offline-demo", "terraform/k8s-demo", "terraform/other",
                            "/etc", "terraform/../x")],
    }
    good["terraform_apply"] = good["terraform_plan"] + [
        {"working_dir": "terraform/offline-demo", "approval_id": "appr-1"}]
    # The Kubernetes reads: typed params (integers, booleans), patterns,
    # listed choices, and the operation each call resolves to.
    ns = {"namespace": "demo-app"}
    good["k8s_get"] = [{**ns, "kind": k} for k in ("pods", "deployments", "secrets", "nodes")] + [
        {**ns, "kind": "deployments", "name": "web"}, {**ns, "kind": "pods", "name": "--raw=/x"},
        {"namespace": "kube-system", "kind": "pods"}]
    good["k8s_logs"] = [{**ns, "name": "web-1"}, {**ns, "name": "web-1", "tail_lines": 5.0},
                        {**ns, "name": "web-1", "tail_lines": 2.5}, {**ns, "name": "web-1", "tail_lines": 0},
                        {**ns, "name": "web-1", "tail_lines": 2000, "since_seconds": 60, "previous": True,
                         "container": "app"},
                        {**ns, "name": "web-1", "previous": "true"}, {**ns, "name": "Web_1"}]
    good["k8s_events"] = [ns, {**ns, "kind": "pods", "name": "web-1"}, {**ns, "kind": "pods"},
                          {**ns, "name": "web-1"}]
    for t in ("k8s_describe", "k8s_rollout_status", "k8s_rollout_history"):
        good[t] = [{**ns, "kind": "deployments", "name": "web"}, {**ns, "kind": "secrets", "name": "db"}]
    # The Kubernetes changes, and hostile manifests.
    web = {**ns, "kind": "deployments", "name": "web"}
    good["k8s_scale"] = [{**web, "replicas": 0}, {**web, "replicas": 3.0}, {**web, "replicas": -1},
                         {**web, "replicas": 2, "approval_id": "appr-1"}]
    good["k8s_rollout_restart"] = [web, {**ns, "kind": "pods", "name": "web"}]
    good["k8s_set_image"] = [{**web, "container": "app", "image": "web:latest"},
                             {**web, "container": "app", "image": "--x"}]
    good["k8s_rollout_undo"] = [{**web, "to_revision": 1}, {**web, "to_revision": 0}]
    good["k8s_delete"] = [{**ns, "kind": "statefulsets", "name": "db"}, {**ns, "kind": "nodes", "name": "n"}]
    cm = lambda meta: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"a": "b"}}
    good["k8s_apply"] = [{**ns, "manifest": m} for m in (
        cm({"name": "web-config"}), cm({"name": "x", "namespace": "kube-system"}), cm({"generateName": "x-"}),
        cm({"name": "x", "uid": "u", "ownerReferences": []}), {**cm({"name": "x"}), "status": {}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}},
        {"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
        "apiVersion: v1\nkind: ConfigMap", {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}})]
    out = []
    for tool in catalog:
        for p in good.get(tool, [{}]):
            out.append((f"{tool} {p}", ["--tool", tool, "--params", json.dumps(p)]))
        # Bad params: missing, unknown, not a string, too long.
        for p in ({}, {"bogus": "x"}, {k: 7 for k in catalog[tool]["params"]},
                  {k: "x" * 500 for k in catalog[tool]["params"]}):
            out.append((f"{tool} {json.dumps(p)[:40]}", ["--tool", tool, "--params", json.dumps(p)]))
        for client in ("claude-code", "cursor"):
            out.append((f"{tool} as {client}", ["--tool", tool, "--client", client,
                                                "--params", json.dumps(good.get(tool, [{}])[0])]))
    out.append(("unknown tool", ["--tool", "kubectl_delete", "--params", "{}"]))
    # Kubernetes change plans (input.kubernetes): each signal, and none.
    def dep(replicas, pod, kind="Deployment"):
        return {"kind": kind, "metadata": {"name": "web", "namespace": "demo-app"},
                "spec": {"replicas": replicas, "template": {"spec": pod}}}
    app = lambda image, **extra: {"containers": [{"name": "app", "image": image, **extra}]}
    risky = {"hostNetwork": True, "serviceAccountName": "admin", "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
             "containers": [{"name": "app", "image": "web:latest",
                             "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}}]}
    plans = {
        "harmless": ("k8s_scale", "scale", dep(2, app("web:1")), dep(3, app("web:1"))),
        "to zero": ("k8s_scale", "scale", dep(2, app("web:1")), dep(0, app("web:1"))),
        "halved": ("k8s_scale", "scale", dep(5, app("web:1")), dep(2, app("web:1"))),
        "mutable image": ("k8s_set_image", "set_image", dep(1, app("web:1")), dep(1, app("web"))),
        "risky pod": ("k8s_apply", "apply", dep(1, app("web:1", resources={"limits": {"cpu": "1"}})), dep(1, risky)),
        "create": ("k8s_apply", "apply", None, dep(1, app("web:latest"))),
        "delete data": ("k8s_delete", "delete", dep(1, app("x"), kind="StatefulSet"), None),
        "secret handed over": ("k8s_apply", "apply", dep(1, app("web:1")),
                               dep(1, {"volumes": [{"name": "s", "secret": {"secretName": "db"}}],
                                       "containers": [{"name": "app", "image": "web:1",
                                                       "envFrom": [{"secretRef": {"name": "api"}}]}]})),
    }
    for name, (tool, verb, live, planned) in plans.items():
        doc = os.path.join(work, f"k8s-{name.replace(' ', '-')}.json")
        with open(doc, "w") as f:
            json.dump({"tool": tool, "params": {"namespace": "demo-app", "kind": "deployments", "name": "web"},
                       "kubernetes": {"verb": verb, "live": live, "planned": planned, "changes": []}}, f)
        out.append((f"kubernetes plan {name}", ["--input", doc]))
    # Lengths in characters, not bytes or UTF-16 units (the engines' count()
    # differs on these), and a long unknown name (quoted short).
    for n in (31, 32, 63, 64, 126, 127, 200):
        out.append((f"namespace of {n} emoji", ["--tool", "k8s_get_pod_status",
                                                "--params", json.dumps({"namespace": "\U0001F600" * n})]))
        out.append((f"working_dir of {n} accented letters",
                    ["--tool", "terraform_plan", "--params", json.dumps({"working_dir": "\u00e9" * n})]))
    out.append(("long unknown param name", ["--tool", "terraform_plan", "--params",
                                            json.dumps({"working_dir": MODULE_OK, "\u00e9" * 300: "x"})]))
    plans = os.path.join(ROOT, "policy-tests/plans")
    for fixture in sorted(os.listdir(plans)):
        plan = os.path.join(plans, fixture, "data.json")
        for tool in ("terraform_plan", "terraform_apply"):
            for wd in ("terraform/offline-demo", "terraform/k8s-demo"):
                out.append((f"{tool} {wd} plan {fixture}",
                            ["--tool", tool, "--params", json.dumps({"working_dir": wd}),
                             "--plan", plan]))
    def key(name):
        return {"name": name, "kind": "ssh_key", "os_user": "root",
                "key": {"fingerprint": "SHA256:x", "type": "ssh-ed25519", "principals": [name]}}

    def user(name, groups):
        return {"name": name, "kind": "os_user", "os_user": name, "groups": groups}

    def approval(status, ids, **extra):
        return {"id": "appr-1", "status": status, "approvers": [i["name"] for i in ids],
                "identities": ids, **extra}

    approvals = [
        approval("expired", [key("alice")]),
        approval("spent", [key("alice")]),
        approval("superseded", [key("alice")]),
        approval("approved", [key("alice")]),
        approval("approved", [key("alice"), key("bob")]),
        approval("approved", [user("carol", ["carol", "gateway-approvers"])]),
        approval("approved", [user("dave", ["dave"])]),
        approval("approved", [key("root")], requested_by="root"),
        approval("approved", [key("root"), key("bob")], requested_by="root"),
        approval("pending", []),
        approval("denied", []),
    ]
    for fixture in ("replace", "create", "no-changes"):
        for a in approvals:
            out.append((f"apply {fixture} approval {a['status']} {len(a['approvers'])}",
                        ["--tool", "terraform_apply",
                         "--params", json.dumps({"working_dir": "terraform/offline-demo",
                                                 "approval_id": "appr-1"}),
                         "--plan", os.path.join(plans, fixture, "data.json"),
                         "--approval", json.dumps(a)]))
    plan_file, plan_json = saved_plan_with_config(work)
    for tool in ("terraform_plan", "terraform_apply"):
        out.append((f"{tool} saved plan with a provisioner",
                    ["--tool", tool, "--params", json.dumps({"working_dir": "terraform/offline-demo"}),
                     "--plan", plan_json, "--plan-file", plan_file]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gateway", default=os.path.join(ROOT, "target/debug/gateway"))
    ap.add_argument("--policies", default="policies")
    ap.add_argument("--tests", default="policy-tests")
    a = ap.parse_args()
    os.chdir(ROOT)
    failures = []

    # 1. The Rego unit tests under OPA and under the gateway.
    engine, modules = load_engine([a.policies, a.tests])
    opa = opa_tests(engine, modules)
    ours = gateway_tests(a.gateway, [a.policies, a.tests])
    for name in sorted(set(opa) | set(ours)):
        o, g = opa.get(name, "missing"), ours.get(name, "missing")
        if o != "pass" or g != "pass":
            failures.append(f"test {name}: OPA {o}, gateway {g}")
    print(f"opa-conformance: {len(opa)} Rego tests under OPA, {len(ours)} under the gateway")
    engine.close()

    # 2. and 3. Decisions on the matrix, and the schemas.
    with open(os.path.join(a.policies, "schema/input.json")) as f:
        input_schema = json.load(f)
    with open(os.path.join(a.policies, "schema/decision.json")) as f:
        decision_schema = json.load(f)
    validator_in = jsonschema.Draft202012Validator(input_schema)
    validator_out = jsonschema.Draft202012Validator(decision_schema)
    engine, _ = load_engine([a.policies])
    with tempfile.TemporaryDirectory() as work:
        matrix = cases(a.policies, work)
        for name, args in matrix:
            out = subprocess.run(
                [a.gateway, "--policies", a.policies, "policy", "eval", "--show-input", *args],
                capture_output=True, text=True)
            if out.returncode != 0 or out.stderr.strip():
                failures.append(f"{name}: gateway policy eval failed: {out.stderr.strip()}")
                continue
            doc = json.loads(out.stdout)
            theirs = engine.eval_document("gateway.decision", doc["input"])
            ours = doc["decision"]
            # `operation` is optional in the contract: the gateway leaves a
            # null one out of what it prints.
            ours.setdefault("operation", None)
            if canonical(theirs) != canonical(ours):
                failures.append(f"{name}: decisions differ\n  gateway: {json.dumps(doc['decision'])}"
                                f"\n  OPA:     {json.dumps(theirs)}")
            for what, validator, value in (("input", validator_in, doc["input"]),
                                           ("gateway decision", validator_out, doc["decision"]),
                                           ("OPA decision", validator_out, theirs)):
                for err in validator.iter_errors(value):
                    failures.append(f"{name}: {what} does not match its schema at "
                                    f"/{'/'.join(map(str, err.absolute_path))}: {err.message}")
        # tools/list for two clients.
        for client in ("claude-code", "cli"):
            principal = {"client": client, "os_user": "alice"}
            theirs = engine.eval_document("gateway.tool_list", {"principal": principal})
            out = subprocess.run(
                [a.gateway, "--policies", a.policies, "policy", "eval", "--tool-list",
                 "--client", client], capture_output=True, text=True)
            if out.returncode == 0 and canonical(json.loads(out.stdout)) != canonical(theirs):
                failures.append(f"tool_list for {client}: gateway and OPA differ")
            elif out.returncode != 0:
                failures.append(f"tool_list for {client}: {out.stderr.strip()}")
    print(f"opa-conformance: {len(matrix)} decisions compared")
    engine.close()

    for f in failures:
        print(f"opa-conformance: FAIL {f}", file=sys.stderr)
    if failures:
        print(f"opa-conformance: {len(failures)} disagreement(s)", file=sys.stderr)
        return 1
    print("opa-conformance: OPA and the gateway agree on every test and decision")
    return 0


if __name__ == "__main__":
    sys.exit(main())
