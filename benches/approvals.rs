//! Throughput of the approval store and the audit log, on real SQLite and a
//! real file (each audit append is fsynced):
//! - `approvals/create_grant_spend`: one approval created, granted and spent;
//! - `audit/append`: one event appended (scrubbed, hashed, flock, fsync).
//!
//! Run: `cargo bench --bench approvals`. Criterion reports time per
//! iteration and elements per second.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gateway::approvals::{ApprovalStore, Approver, NewApproval};
use gateway::audit::AuditLog;
use serde_json::json;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tmp");
    let mut store = ApprovalStore::in_home(dir.path()).expect("open");
    let params = json!({"working_dir": "terraform/offline-demo"});
    let plan_sha = "ab".repeat(32);
    let new = NewApproval {
        tool: "terraform_apply".into(),
        params: params.clone(),
        plan_sha256: Some(plan_sha.clone()),
        plan_summary: json!([{"address": "terraform_data.web", "actions": ["delete", "create"], "reason": null, "paths": []}]),
        signals: json!([{"kind": "replace", "message": "terraform_data.web will be destroyed and re-created"}]),
        request_id: "req-bench".into(),
        requested_by: "alice".into(),
        requested_client: "bench".into(),
        requester: serde_json::Value::Null,
        approvers_required: 1,
        ttl: Duration::from_secs(1800),
        reason_required: false,
    };
    let bob = Approver {
        identity: None,
        name: "bob".into(),
        kind: "os_user",
        os_user: "bob".into(),
        signed: None,
    };
    let mut g = c.benchmark_group("approvals");
    g.throughput(Throughput::Elements(1));
    g.bench_function("create_grant_spend", |b| {
        b.iter(|| {
            let (a, _) = store.create(&new).expect("create");
            store
                .grant(&a.id, &bob, "ok")
                .expect("db")
                .expect("granted");
            store
                .spend(&a.id, "terraform_apply", &params, Some(&plan_sha), "req-2")
                .expect("db")
                .expect("spent");
        })
    });
    g.finish();

    let audit = AuditLog::in_home(dir.path()).expect("audit");
    let data = json!({"tool": "terraform_apply", "params": params, "decision": {"allow": true, "tier": "high"},
                      "lease_id": "kubernetes/creds/gateway-tf-apply-demo-app/abc123"});
    let mut g = c.benchmark_group("audit");
    g.throughput(Throughput::Elements(1));
    g.bench_function("append", |b| {
        b.iter(|| {
            audit
                .append("req-bench", "policy.decision", data.clone())
                .expect("append")
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
