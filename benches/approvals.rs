//! Throughput of the approval store and the audit log, on real SQLite, a
//! real PostgreSQL (started by the bench from Debian's binaries, on a Unix
//! socket; tests/support/postgres.rs) and a real file (each audit append is
//! fsynced):
//! - `store/create_grant_spend/sqlite` and `.../postgres`: one approval
//!   created, granted and spent, on each store in the same run;
//! - `audit/append`: one event appended (scrubbed, hashed, flock, fsync).
//!
//! Run as root: `cargo bench --bench approvals`. Criterion reports time per
//! iteration and elements per second.

#[path = "../tests/support/postgres.rs"]
mod pg;

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gateway::approvals::{ApprovalStore, Approver, NewApproval};
use gateway::audit::AuditLog;
use serde_json::json;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tmp");
    let server = pg::Postgres::start();
    let stores = [
        ("sqlite", ApprovalStore::in_home(dir.path()).expect("open")),
        (
            "postgres",
            ApprovalStore::postgres(&server.database("bench"), None).expect("connect"),
        ),
    ];
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
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(1));
    for (name, mut store) in stores {
        g.bench_function(format!("create_grant_spend/{name}"), |b| {
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
    }
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
