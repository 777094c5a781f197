//! What a per-call credential costs: `broker/issue_revoke` mints a
//! pod-reader credential from a REAL OpenBao dev server (`bao server -dev`)
//! and revokes it with `sync: true` — OpenBao's Kubernetes secrets engine
//! creating and deleting a ServiceAccount, Role, RoleBinding and token on the
//! FAKE Kubernetes API server of the tests (in-process, so a real API
//! server's latency comes on top). `broker/token_lookup` is one Vault round
//! trip (the gateway's token lookup) for scale; `broker/issue_revoke_sustained`
//! is the same with as many in flight as the broker takes at once
//! ([`LANES`] lanes of the engine's mount, two minted at once on each):
//! criterion's time per iteration is the time per credential sustained,
//! bounded by OpenBao's client-go rate limiter of each lane.
//!
//! `cargo bench --bench broker` (needs `.tools/bin/bao`: scripts/install-tools.sh).

#[path = "../tests/support/fake_kube.rs"]
mod fake_kube;
#[path = "../tests/support/openbao.rs"]
mod openbao;

use criterion::{Criterion, criterion_group, criterion_main};
use gateway::broker::Broker;
use gateway::broker::vault::VaultBroker;
use gateway::policy::set::LoadOptions;
use gateway::policy::{DecisionInput, PolicySet, Principal};

/// Lanes of the Kubernetes secrets engine set up and used (`gateway vault
/// setup --lanes`, `[vault] lanes`), unless `BENCH_LANES` says otherwise
/// (to compare: `BENCH_LANES=1 cargo bench --bench broker`).
const LANES: usize = 16;

fn bench(c: &mut Criterion) {
    let lanes: usize = std::env::var("BENCH_LANES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LANES);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    let kube = rt.block_on(fake_kube::FakeKube::start());
    let bao = openbao::OpenBao::start();
    let set = PolicySet::load(&[repo.join("policies")], &LoadOptions::default()).expect("policies");
    kube.with(|s| s.apply_cluster_assets(&openbao::cluster_roles_yaml()));
    let settings = bao.set_up_gateway(
        &rt,
        kube.url(),
        kube.ca_pem.clone(),
        kube.openbao_jwt.clone(),
        lanes,
    );
    let home = tempfile::tempdir().expect("home");
    let broker = VaultBroker::new(settings, home.path())
        .expect("broker")
        .with_lanes(lanes);
    let broker = std::sync::Arc::new(broker);
    let input = DecisionInput::new(
        "k8s_get_pod_status",
        serde_json::json!({"namespace": "demo-app"}),
        Principal::os_user("bench".into(), "bench".into(), 1000, vec![]),
    );
    let scope = set
        .decide(&input)
        .decision
        .credential
        .expect("a derived credential");
    let mut g = c.benchmark_group("broker");
    g.sample_size(10);
    // Spaced out: OpenBao's Kubernetes engine talks to the API server
    // through client-go's default rate limiter (5 requests/s, burst 10) and
    // a credential is 7 requests (4 to issue, 3 to revoke), so waiting
    // 1.6 s (untimed) between credentials measures the latency of one call.
    g.bench_function("issue_revoke", |b| {
        b.iter_custom(|n| {
            let mut total = std::time::Duration::ZERO;
            for _ in 0..n {
                std::thread::sleep(std::time::Duration::from_millis(1600));
                let t = std::time::Instant::now();
                rt.block_on(async {
                    let cred = broker.issue("bench", &scope).await.expect("issue");
                    broker.revoke(&cred.lease_id).await.expect("revoke");
                });
                total += t.elapsed();
            }
            total
        })
    });
    // Many at once: the sustained rate, which the lanes' rate limiters
    // set (the broker bounds how many it mints at once on each lane).
    g.measurement_time(std::time::Duration::from_secs(30));
    g.bench_function("issue_revoke_sustained", |b| {
        b.iter_custom(|n| {
            let t = std::time::Instant::now();
            rt.block_on(async {
                let mut calls = tokio::task::JoinSet::new();
                for _ in 0..n {
                    let (broker, scope) = (std::sync::Arc::clone(&broker), scope.clone());
                    calls.spawn(async move {
                        let cred = broker.issue("bench", &scope).await.expect("issue");
                        broker.revoke(&cred.lease_id).await.expect("revoke");
                    });
                }
                while let Some(done) = calls.join_next().await {
                    done.expect("pair");
                }
            });
            t.elapsed()
        })
    });
    g.bench_function("token_lookup", |b| {
        b.iter(|| rt.block_on(broker.check()).expect("lookup"))
    });
    g.finish();
    assert!(
        kube.with(|s| s.live("serviceaccounts").is_empty()),
        "every credential was revoked"
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
