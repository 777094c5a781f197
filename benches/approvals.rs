//! Throughput of the approval store and the audit log, on real SQLite, a
//! real PostgreSQL (started by the bench from Debian's binaries, on a Unix
//! socket; tests/support/postgres.rs) and a real file (each audit append is
//! fsynced):
//! - `store/create_grant_spend/sqlite` and `.../postgres`: one approval
//!   created, granted and spent, on each store in the same run;
//! - `store/postgres_spend_concurrent/1_connection` and `.../pool_8`: 32
//!   granted approvals spent at once by 32 threads through one store, its
//!   PostgreSQL client holding one connection (what the store had before
//!   its pool: one connection, taken in turn) and the default pool of 8;
//!   criterion's rate is spends per second, both in the same run;
//! - `audit/append`: one event appended (scrubbed, hashed, flock, fsync).
//! - `store/audit_append/postgres`: one event appended to the replicas'
//!   chain in PostgreSQL by one writer;
//! - `store/audit_append/3_replicas_48_writers`: three replicas (each its
//!   own chain handle and connection) with 16 writers each appending at
//!   once; criterion's rate is the team's events per second, and the
//!   latency of each append (p50, p99, max) is printed after the group.
//!
//! - `page/render/20` and `page/render/2000`: the approval page's HTML for
//!   a plan of 20 and of 2,000 changes (two attribute diffs each).
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
    for (name, store) in stores {
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

    // 32 spends at once through one store: one connection against a pool.
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(32));
    // Each sample also creates and grants its approvals (untimed).
    g.sample_size(10);
    for (name, size) in [("1_connection", 1), ("pool_8", 8), ("pool_16", 16)] {
        let db = gateway::db::postgres::PostgresDb::connect_pooled(
            &server.database(&format!("bench_spend_{size}")),
            None,
            gateway::db::postgres::PoolSettings {
                size,
                wait: Duration::from_secs(30),
            },
        )
        .expect("connect");
        let store = ApprovalStore::on_postgres(db).expect("migrate");
        g.bench_function(format!("postgres_spend_concurrent/{name}"), |b| {
            b.iter_custom(|iters| {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    let granted: Vec<String> = (0..32)
                        .map(|i| {
                            // Each its requester's (one requester's new
                            // approval of a call supersedes its older one).
                            let mine = NewApproval {
                                requested_by: format!("agent-{i}"),
                                ..new.clone()
                            };
                            let (a, _) = store.create(&mine).expect("create");
                            store
                                .grant(&a.id, &bob, "ok")
                                .expect("db")
                                .expect("granted");
                            a.id
                        })
                        .collect();
                    let start = std::sync::Barrier::new(33);
                    let began = std::thread::scope(|scope| {
                        for (i, id) in granted.iter().enumerate() {
                            let (store, start, params, plan_sha) =
                                (&store, &start, &params, &plan_sha);
                            scope.spawn(move || {
                                start.wait();
                                store
                                    .spend(
                                        id,
                                        "terraform_apply",
                                        params,
                                        Some(plan_sha),
                                        &format!("req-{i}"),
                                    )
                                    .expect("db")
                                    .expect("spent");
                            });
                        }
                        start.wait();
                        std::time::Instant::now()
                    });
                    took += began.elapsed();
                }
                took
            })
        });
    }
    g.finish();

    let data = json!({"tool": "terraform_apply", "params": params, "decision": {"allow": true, "tier": "high"},
                      "lease_id": "kubernetes/creds/gateway-tf-apply-demo-app/abc123"});
    let chain_db = server.database("bench_chain");
    let replica = || {
        AuditLog::shared(
            gateway::audit::shared::SharedChain::postgres(
                gateway::db::postgres::PostgresDb::connect(&chain_db, None).expect("connect"),
            )
            .expect("chain"),
        )
    };
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(1));
    let one = replica();
    g.bench_function("audit_append/postgres", |b| {
        b.iter(|| {
            one.append("req-bench", "policy.decision", data.clone())
                .expect("append")
        })
    });
    let replicas = [replica(), replica(), replica()];
    let latencies = std::sync::Mutex::new(Vec::<Duration>::new());
    g.bench_function("audit_append/3_replicas_48_writers", |b| {
        b.iter_custom(|iters| {
            let per_writer = iters.div_ceil(48).max(1);
            let started = std::time::Instant::now();
            std::thread::scope(|scope| {
                for r in &replicas {
                    for _ in 0..16 {
                        let (data, latencies) = (&data, &latencies);
                        scope.spawn(move || {
                            let mut mine = Vec::with_capacity(per_writer as usize);
                            for _ in 0..per_writer {
                                let t = std::time::Instant::now();
                                r.append("req-bench", "policy.decision", data.clone())
                                    .expect("append");
                                mine.push(t.elapsed());
                            }
                            latencies.lock().expect("lock").extend(mine);
                        });
                    }
                }
            });
            // Time per event of the team, whatever the rounding above.
            started
                .elapsed()
                .mul_f64(iters as f64 / (per_writer * 48) as f64)
        })
    });
    g.finish();
    let mut l = latencies.into_inner().expect("lock");
    l.sort();
    if !l.is_empty() {
        let at = |q: f64| l[((l.len() as f64 * q) as usize).min(l.len() - 1)];
        eprintln!(
            "store/audit_append/3_replicas_48_writers: {} appends, latency p50 {:?}, p99 {:?}, max {:?}",
            l.len(),
            at(0.50),
            at(0.99),
            l[l.len() - 1]
        );
    }

    let audit = AuditLog::in_home(dir.path()).expect("audit");
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

/// The approval page's HTML for a plan of `n` changes, each with two
/// attribute diffs (what `GET /approvals/ID` renders after the store read):
/// `page/render/20` and `page/render/2000` in one run, so their ratio shows
/// how rendering grows with the plan.
fn page(c: &mut Criterion) {
    let approval = |n: usize| {
        let changes: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                json!({"address": format!("terraform_data.item[{i}]"), "actions": ["update"],
                       "reason": null, "paths": [],
                       "diff": [{"path": "input.size", "before": format!("{i}"), "after": format!("{}", i + 1)},
                                {"path": "input.secret", "before": "(sensitive value)", "after": "(sensitive value)"}]})
            })
            .collect();
        json!({"id": "ap-0123", "state": "pending", "tool": "terraform_apply",
               "params": {"working_dir": "terraform/x"}, "params_sha256": "ab", "plan_sha256": "cd",
               "requested_by": "alice", "requested_client": "agent", "requester": null,
               "created_at": "2026-12-03T00:00:00Z", "expires_at": "2026-12-03T00:30:00Z",
               "approvers_required": 1, "reason_required": true, "verdicts": [],
               "signals": [{"address": "terraform_data.item[0]", "kind": "delete", "message": "destroyed",
                            "reason": null, "paths": []}],
               "plan_summary": changes})
    };
    let mut g = c.benchmark_group("page");
    for n in [20usize, 2000] {
        let a = approval(n);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("render/{n}"), |b| {
            b.iter(|| {
                gateway::http::page::approval_html("bob", "csrf", &a, &Ok(()))
                    .into_string()
                    .len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench, page);
criterion_main!(benches);
