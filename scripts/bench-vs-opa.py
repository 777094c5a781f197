#!/usr/bin/env python3
"""The gateway's policy engine beside OPA's, on the same policies and inputs,
in one run.

1. Runs the criterion benches `decision/request` and `decision/plan_5000_total`
   (`cargo bench --bench policy`), which also write the exact policy inputs
   they decide to target/bench-inputs/ (request.json; plan_5000.json, the
   whole input with a 5,000-resource plan).
2. Loads the same policy dirs into OPA's own Go engine (PyPI
   opa-golib-python-bindings, the way scripts/opa-conformance.py does) and
   times `data.gateway.decision` on those inputs, the input handed over as
   JSON bytes (so OPA parses the plan, as the gateway does).
3. Measures the binding's floor: the same call on a trivial policy
   (`x := 1`) with `{}` as input, and subtracts it from OPA's figures.
4. Checks that OPA's decisions equal the gateway's on both inputs, and
   prints both engines' figures and the ratios.

Usage: scripts/bench-vs-opa.py [--no-cargo] [--json OUT]
`--no-cargo` reads the last bench results under target/criterion instead of
running the benches (they must be from the same run to compare).
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
import importlib.util

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def conformance_module():
    spec = importlib.util.spec_from_file_location(
        "opa_conformance", os.path.join(ROOT, "scripts", "opa-conformance.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def raw_eval(engine, path, input_bytes):
    """OpaEvalDocument with the input as JSON bytes (no Python encoding)."""
    lib = engine._lib
    ptr = lib.OpaEvalDocument(engine._handle, path.encode(), input_bytes, 0, 0)
    if not ptr:
        raise RuntimeError("OPA returned NULL")
    try:
        raw = ctypes.string_at(ptr)
    finally:
        lib.OpaFreeString(ptr)
    return raw


def decision_of(raw):
    env = json.loads(raw)
    if env.get("error"):
        raise RuntimeError(f"OPA: {env['error']}")
    rs = env.get("result") or []
    if not rs or not rs[0].get("expressions"):
        raise RuntimeError("OPA: the decision is undefined")
    return rs[0]["expressions"][0]["value"]


def timed(fn, min_seconds, min_runs):
    """Per-call seconds: the median of runs until both minimums are met."""
    times = []
    started = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - started < min_seconds:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def criterion_ns(name):
    # A bench in a group is under its group's dir; `decision/request` is a
    # plain bench_function (criterion names its dir decision_request).
    path = os.path.join(ROOT, "target", "criterion", "decision", name, "new", "estimates.json")
    if not os.path.exists(path):
        path = os.path.join(ROOT, "target", "criterion", f"decision_{name}", "new", "estimates.json")
    with open(path) as f:
        est = json.load(f)
    return est["median"]["point_estimate"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-cargo", action="store_true")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    if not args.no_cargo:
        subprocess.run(
            ["cargo", "bench", "--locked", "--bench", "policy", "--", "decision/request|decision/plan_5000_total"],
            cwd=ROOT,
            check=True,
        )
    inputs = os.path.join(ROOT, "target", "bench-inputs")
    with open(os.path.join(inputs, "request.json"), "rb") as f:
        request = f.read()
    with open(os.path.join(inputs, "plan_5000.json"), "rb") as f:
        plan = f.read()

    conf = conformance_module()
    engine, _ = conf.load_engine([os.path.join(ROOT, "policies")])
    floor_engine = conf.OpaEngine()
    floor_engine.add_policy("floor.rego", "package floor\n\nx := 1\n")

    # Same decisions first: a figure for a different answer means nothing.
    binary = os.path.join(ROOT, "target", "release", "gateway")
    if not os.path.exists(binary):
        binary = os.path.join(ROOT, "target", "debug", "gateway")
    for name, doc in (("request", request), ("plan_5000", plan)):
        out = subprocess.run(
            [binary, "--policies", os.path.join(ROOT, "policies"), "policy", "eval",
             "--input", os.path.join(inputs, f"{name}.json")],
            capture_output=True, check=True,
        )
        mine = json.loads(out.stdout)
        theirs = decision_of(raw_eval(engine, "gateway.decision", doc))
        if json.dumps(theirs, sort_keys=True) != json.dumps(mine, sort_keys=True):
            print(f"{name}: OPA and the gateway decide differently", file=sys.stderr)
            return 1

    floor = timed(lambda: raw_eval(floor_engine, "floor.x", b"{}"), 2.0, 200)
    opa_request = timed(lambda: raw_eval(engine, "gateway.decision", request), 3.0, 200) - floor
    opa_plan = timed(lambda: raw_eval(engine, "gateway.decision", plan), 10.0, 10) - floor
    gw_request = criterion_ns("request") / 1e9
    gw_plan = criterion_ns("plan_5000_total") / 1e9

    rows = [
        ("decision/request", gw_request, opa_request),
        ("decision/plan_5000_total", gw_plan, opa_plan),
    ]
    print(f"OPA binding floor (trivial policy, {{}} input): {floor * 1e6:.1f} µs, subtracted")
    print(f"plan input: {len(plan) / 1e6:.1f} MB")
    print(f"{'bench':<28}{'gateway':>14}{'OPA':>14}{'OPA / gateway':>16}")
    figures = {"floor_s": floor}
    for name, gw, opa in rows:
        unit, scale = ("ms", 1e3) if gw > 1e-3 or opa > 1e-3 else ("µs", 1e6)
        print(f"{name:<28}{gw * scale:>11.1f} {unit}{opa * scale:>11.1f} {unit}{opa / gw:>15.1f}×")
        figures[name] = {"gateway_s": gw, "opa_s": opa, "ratio": opa / gw}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
