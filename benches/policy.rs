//! Decision latency of the default policies:
//! - `request`: a k8s_get_pod_status decision (no plan);
//! - `admission`, `admit_and_decide`: a call's admission alone, and its
//!   admission and decision in the one evaluation the pipeline makes;
//! - `admit_and_deny`: the same for a call the policy denies (a namespace
//!   outside the allowlist), the evaluation in `pipeline/denied_call`;
//! - `deny`: that decision alone, without the admission and the `with`
//!   that joins them (what the one evaluation costs over the decision);
//! - `plan_5000`: a terraform_apply decision on a 5,000-resource plan (about
//!   5 MB of plan JSON) whose conversion to a policy value was done once;
//! - `plan_5000_convert_once`: that one-time conversion (clone of the parsed
//!   JSON included), done once per plan by `PlanInput::new`;
//! - `plan_5000_total`: the same plan decided from its file, as the gateway
//!   does after `terraform show -json`: read, check, parse both forms,
//!   digest, evaluate.
//!
//! Run: `cargo bench --bench policy`. The plan is built from the real
//! `replace.json` fixture: its resource change repeated 5,000 times under
//! new addresses with a mix of create, update, no-op, delete and replace.
//! The inputs decided are written to `target/bench-inputs/` (`request.json`,
//! `plan_5000.json`: the whole policy input) so that
//! `scripts/bench-vs-opa.py` gives OPA's engine exactly the same documents.

use criterion::{Criterion, criterion_group, criterion_main};
use gateway::policy::set::LoadOptions;
use gateway::policy::{DecisionInput, PlanInput, PolicySet, Principal, plan};

fn big_plan(n: usize) -> serde_json::Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut p =
        plan::read_plan_file(&root.join("policy-tests/plans/replace/data.json")).expect("fixture");
    let template = p["resource_changes"]
        .as_array()
        .and_then(|rcs| rcs.iter().find(|rc| rc["change"]["actions"][0] == "delete"))
        .cloned()
        .expect("a replace in the fixture");
    let actions: [&[&str]; 5] = [
        &["create"],
        &["update"],
        &["no-op"],
        &["delete"],
        &["delete", "create"],
    ];
    let changes: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let mut rc = template.clone();
            rc["address"] = format!("terraform_data.r[{i}]").into();
            rc["index"] = i.into();
            rc["change"]["actions"] = serde_json::json!(actions[i % actions.len()]);
            if i % actions.len() != 4 {
                if let Some(o) = rc.as_object_mut() {
                    o.remove("action_reason");
                }
                if let Some(c) = rc["change"].as_object_mut() {
                    c.remove("replace_paths");
                }
            }
            rc
        })
        .collect();
    p["resource_changes"] = changes.into();
    p
}

fn bench(c: &mut Criterion) {
    // As the gateway binary does (first thing, one thread).
    gateway::quiet_library_backtraces();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let set = PolicySet::load(&[root.join("policies")], &LoadOptions::default()).expect("policies");
    let principal = Principal::os_user("bench".into(), "bench".into(), 1000, vec![]);

    let request = DecisionInput::new(
        "k8s_get_pod_status",
        serde_json::json!({"namespace": "demo-app"}),
        principal.clone(),
    );
    c.bench_function("decision/request", |b| {
        b.iter(|| {
            let ev = set.decide(&request);
            assert!(ev.decision.allow);
            ev
        })
    });

    // A call's start: its admission alone (`data.gateway.calls.verdict`),
    // and admission and decision in one evaluation (what the pipeline asks).
    let admission = serde_json::json!({
        "tool": "k8s_get_pod_status", "client": "bench", "kind": "os_user",
        "user": "bench", "os_user": "bench", "uid": 1000, "issuer": null,
        "groups": [], "params_bytes": 26, "running": {"user": 0, "total": 0},
        "last_minute": {"user": 0},
    });
    c.bench_function("decision/admission", |b| {
        b.iter(|| {
            set.eval_rule(
                "data.gateway.calls.verdict",
                regorus::Value::from(admission.clone()),
            )
            .expect("verdict")
        })
    });
    c.bench_function("decision/admit_and_decide", |b| {
        b.iter(|| {
            let (_, ev) = set
                .admit_and_decide(&admission, &request)
                .expect("one evaluation");
            assert!(ev.expect("decided").decision.allow);
        })
    });

    // The same for a call the policy denies (a namespace outside the
    // allowlist): the evaluation `pipeline/denied_call` makes.
    let denied = DecisionInput::new(
        "k8s_get_pod_status",
        serde_json::json!({"namespace": "kube-system"}),
        principal.clone(),
    );
    c.bench_function("decision/admit_and_deny", |b| {
        b.iter(|| {
            let (_, ev) = set
                .admit_and_decide(&admission, &denied)
                .expect("one evaluation");
            assert!(!ev.expect("decided").decision.allow);
        })
    });

    c.bench_function("decision/deny", |b| {
        b.iter(|| {
            let ev = set.decide(&denied);
            assert!(!ev.decision.allow);
        })
    });

    let mut apply = DecisionInput::new(
        "terraform_apply",
        serde_json::json!({"working_dir": "terraform/offline-demo"}),
        principal,
    );
    let json = big_plan(5000);
    apply.plan = Some(PlanInput::new(json.clone()));
    let mut g = c.benchmark_group("decision");
    g.sample_size(10);
    g.bench_function("plan_5000", |b| {
        b.iter(|| {
            let ev = set.decide(&apply);
            assert_eq!(ev.error, None);
            assert_eq!(ev.decision.signals.len(), 2000);
            ev
        })
    });
    g.bench_function("plan_5000_convert_once", |b| {
        b.iter(|| PlanInput::new(json.clone()))
    });
    let plan_bytes = serde_json::to_vec(&json).expect("plan JSON");
    let plan_file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(plan_file.path(), &plan_bytes).expect("write plan");
    g.bench_function("plan_5000_total", |b| {
        b.iter(|| {
            let bytes = plan::read_bytes(plan_file.path()).expect("read");
            let mut input = apply.clone();
            input.plan = Some(PlanInput::from_bytes(&bytes, "the bench plan").expect("plan"));
            let ev = set.decide(&input);
            assert_eq!(ev.error, None);
            assert_eq!(ev.decision.signals.len(), 2000);
            ev
        })
    });
    g.finish();
    let out = root.join("target/bench-inputs");
    std::fs::create_dir_all(&out).expect("mkdir");
    for (name, input) in [("request", &request), ("plan_5000", &apply)] {
        let doc = serde_json::to_vec(&input.to_json()).expect("input JSON");
        std::fs::write(out.join(format!("{name}.json")), doc).expect("write input");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
