//! The credential broker against a REAL OpenBao dev server (`bao server
//! -dev`), whose Kubernetes secrets engine talks to a FAKE Kubernetes API
//! server (tests/support/fake_kube.rs — no real API server can run here; the
//! fake follows the API for what client-go and kubectl send, protobuf
//! bodies included). Vault is configured by the real `gateway vault setup`,
//! and the gateway runs with a token carrying only the policy that setup
//! wrote. The end-to-end test runs real kubectl in a real gVisor sandbox.

mod common;
#[path = "support/fake_kube.rs"]
mod fake_kube;
#[path = "support/kube_world.rs"]
mod kube_world;
#[path = "support/openbao.rs"]
mod openbao;
#[path = "support/otlp.rs"]
mod otlp;
#[path = "support/postgres.rs"]
mod pg;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use fake_kube::FakeKube;
use gateway::broker::vault::{Secret, VaultAuth, VaultBroker, VaultSettings};
use gateway::broker::{Broker, CredentialMeta};
use gateway::pipeline::{Outcome, ToolCall};
use gateway::policy::set::LoadOptions;
use gateway::policy::{CredentialScope, PolicyStore, Principal};
use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::tools::ToolPaths;
use kube_world::{World, everything_written, pipeline, settings, trail, world};
use serde_json::{Value, json};

fn pod_reader() -> CredentialScope {
    // Exactly what the default policy derives for k8s_get_pod_status/demo-app.
    let store = PolicyStore::open(
        vec![common::repo().join("policies")],
        LoadOptions::default(),
    );
    let input = gateway::policy::DecisionInput::new(
        "k8s_get_pod_status",
        json!({"namespace": "demo-app"}),
        principal(),
    );
    store
        .decide(&input)
        .decision
        .credential
        .expect("the policy derives a credential")
}

fn principal() -> Principal {
    Principal::os_user("test".into(), "alice".into(), 1000, vec![])
}

fn kubeconfig(w: &World, token_file: &Path) -> PathBuf {
    let k = gateway::broker::kubeconfig::kubeconfig(
        &format!("https://127.0.0.1:{}", w.kube.port),
        w.kube.ca_pem.as_bytes(),
        "kubernetes",
        &token_file.display().to_string(),
        "demo-app",
    );
    let p = w.dir.path().join("kubeconfig");
    std::fs::write(&p, k).expect("kubeconfig");
    p
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let bin = ToolPaths::discover(&common::repo())
        .kubectl
        .expect("kubectl is installed (scripts/install-tools.sh kubectl)");
    Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .output()
        .expect("kubectl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_and_revoke_a_pod_reader_creates_and_deletes_exactly_the_derived_objects() {
    let w = world().await;
    assert!(
        w.setup_output
            .contains("kubernetes/roles/gateway-pod-reader-demo-app")
    );
    assert!(
        w.setup_output.contains("secrets engine aws/: skipped"),
        "{}",
        w.setup_output
    );
    let broker =
        VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("broker");
    let scope = pod_reader();
    let cred = broker.issue("req-1", &scope).await.expect("issued");
    assert!(
        cred.lease_id
            .starts_with("kubernetes/creds/gateway-pod-reader-demo-app/")
    );
    assert_eq!(format!("{:?}", cred.secret), "<redacted>");
    let CredentialMeta::KubernetesToken {
        namespace,
        service_account,
    } = &cred.meta
    else {
        panic!("a kubernetes token: {:?}", cred.meta);
    };
    assert_eq!(namespace, "demo-app");

    let (sa, role, binding, token) = w.kube.with(|s| {
        // client-go sent protobuf, and the fake decoded it.
        assert!(
            s.seen.iter().any(|r| r.method == "POST"
                && r.content_type
                    .starts_with("application/vnd.kubernetes.protobuf")),
            "{:?}",
            s.seen
        );
        let one = |r: &str| {
            let live = s.minted(r);
            assert_eq!(live.len(), 1, "{r}: {live:?}");
            live[0].clone()
        };
        assert!(s.minted("roles").is_empty(), "OpenBao made a Role");
        let token = s.tokens.keys().next().cloned().expect("a token was minted");
        let binding = one("rolebindings");
        let role = s.objects[&(
            "roles".to_string(),
            "demo-app".to_string(),
            binding["roleRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )]
            .clone();
        (one("serviceaccounts"), role, binding, token)
    });
    assert_eq!(sa["metadata"]["namespace"], "demo-app");
    assert_eq!(sa["metadata"]["name"], json!(service_account));
    // Named by the role's name_template, as the admission policies ask:
    // the ServiceAccount and its binding alike.
    assert!(service_account.starts_with("gw-cred-"), "{service_account}");
    assert_eq!(binding["metadata"]["name"], json!(service_account));
    // Bound to the Role provisioned for it (gateway vault cluster-roles),
    // which holds exactly the rules of config/vault_roles/data.yaml.
    assert_eq!(role["metadata"]["name"], "gateway-pod-reader-demo-app");
    assert_eq!(
        role["rules"],
        json!([{"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["pods"]}]),
        "exactly the rules of config/vault_roles/data.yaml"
    );
    assert_eq!(binding["metadata"]["namespace"], "demo-app");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["subjects"][0]["name"], json!(service_account));
    assert_eq!(
        binding["metadata"]["labels"]["app.kubernetes.io/part-of"],
        "gateway"
    );
    // The credential is the fake's JWT: three parts, with exp.
    assert_eq!(token.split('.').count(), 3);
    let mut secret_bytes = Vec::new();
    {
        // The only way to see the bytes from outside is the file the sandbox gets.
        let dbg = format!("{cred:?}");
        assert!(!dbg.contains(&token), "Debug never shows the token");
        secret_bytes.extend_from_slice(token.as_bytes());
    }

    // The token does what the role says, and nothing more (real kubectl).
    let token_file = w.dir.path().join("token");
    std::fs::write(&token_file, &secret_bytes).expect("token file");
    let kc = kubeconfig(&w, &token_file);
    w.kube.set_pods(
        "demo-app",
        vec![fake_kube::pod("web-0", "demo-app", "Running", true, 0)],
    );
    let ok = kubectl(&kc, &["get", "pods", "-n", "demo-app", "-o", "name"]);
    assert!(ok.status.success(), "{}", common::stderr(&ok));
    assert_eq!(common::stdout(&ok).trim(), "pod/web-0");
    let other_ns = kubectl(&kc, &["get", "pods", "-n", "kube-system"]);
    assert!(!other_ns.status.success());
    assert!(
        common::stderr(&other_ns).contains("forbidden"),
        "{}",
        common::stderr(&other_ns)
    );
    let secrets = kubectl(&kc, &["get", "secrets", "-n", "demo-app"]);
    assert!(
        common::stderr(&secrets).contains("forbidden"),
        "{}",
        common::stderr(&secrets)
    );

    broker.revoke(&cred.lease_id).await.expect("revoked");
    w.kube.with(|s| {
        assert!(s.live("serviceaccounts").is_empty(), "deleted on revoke");
        assert!(s.minted("roles").is_empty());
        assert!(s.minted("rolebindings").is_empty());
        assert!(
            s.objects.contains_key(&(
                "roles".to_string(),
                "demo-app".to_string(),
                "gateway-pod-reader-demo-app".to_string()
            )),
            "the provisioned Role stays"
        );
    });
    let after = kubectl(&kc, &["get", "pods", "-n", "demo-app"]);
    assert!(!after.status.success(), "a revoked token stops working");
    assert!(
        common::stderr(&after).contains("Unauthorized"),
        "{}",
        common::stderr(&after)
    );
    let lookup = w.bao.bao(&["lease", "lookup", &cred.lease_id]);
    assert!(!lookup.status.success(), "Vault no longer knows the lease");
    let ledger = gateway::broker::leases::LeaseLedger::in_home(&w.home).expect("ledger");
    assert_eq!(ledger.is_revoked(&cred.lease_id).expect("q"), Some(true));
}

/// `gateway vault setup --lanes N` again on `w`'s OpenBao and cluster.
fn setup_lanes(w: &World, lanes: u16) -> std::process::Output {
    common::gateway(&w.home)
        .args(["vault", "setup", "--lanes", &lanes.to_string()])
        .args(["--kubernetes-host", &w.kube.url()])
        .arg("--kubernetes-ca-file")
        .arg(&w.ca_file)
        .arg("--service-account-jwt-file")
        .arg(w.dir.path().join("openbao-sa.jwt"))
        .env("VAULT_ADDR", &w.bao.addr)
        .env("VAULT_TOKEN", &w.bao.root_token)
        .env_remove("AWS_ACCESS_KEY_ID")
        .output()
        .expect("vault setup")
}

/// `vault setup --lanes 3`: every role on three mounts of the engine, the
/// gateway's Vault policy on all three; a broker with three lanes spreads
/// its credentials over them, each revoked (its objects deleted) as on one
/// mount. A broker told of more lanes than were set up fails closed on the
/// missing one, saying what to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_spread_over_the_lanes_set_up_and_each_is_revoked() {
    let w = world().await;
    let out = setup_lanes(&w, 3);
    let report = common::stdout(&out);
    assert!(out.status.success(), "{report}{}", common::stderr(&out));
    assert!(
        report.contains("kubernetes-lane-3/roles/gateway-pod-reader-demo-app"),
        "{report}"
    );
    // The policy as rewritten: a token made now holds the lanes.
    let token = w.bao.token_with_policy("gateway");
    let broker = Arc::new(
        VaultBroker::new(settings(&w.bao.addr, &token), &w.home)
            .expect("broker")
            .with_lanes(3),
    );
    let scope = pod_reader();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..6 {
        let (b, sc) = (Arc::clone(&broker), scope.clone());
        calls.spawn(async move { b.issue(&format!("req-lane-{i}"), &sc).await });
    }
    let mut leases = Vec::new();
    while let Some(r) = calls.join_next().await {
        leases.push(r.expect("join").expect("issued").lease_id);
    }
    let mounts: std::collections::BTreeSet<&str> =
        leases.iter().filter_map(|l| l.split('/').next()).collect();
    assert_eq!(
        mounts,
        ["kubernetes", "kubernetes-lane-2", "kubernetes-lane-3"].into(),
        "{leases:?}"
    );
    assert_eq!(w.kube.with(|s| s.live("serviceaccounts").len()), 6);
    for l in &leases {
        broker.revoke(l).await.expect("revoked");
    }
    w.kube.with(|s| {
        for r in ["serviceaccounts", "roles", "rolebindings"] {
            assert!(s.minted(r).is_empty(), "{r}: {:?}", s.minted(r));
        }
    });
    assert!(
        broker.ledger().open_leases().expect("ledger").is_empty(),
        "every lease is recorded revoked"
    );
    // The lanes set up pass the start's check.
    let roles = |mount: &str, role: &str| -> BTreeMap<String, std::collections::BTreeSet<String>> {
        [(mount.to_string(), [role.to_string()].into())].into()
    };
    let mounts = roles("kubernetes", "gateway-pod-reader-demo-app");
    assert_eq!(
        broker
            .check_lanes(&mounts)
            .await
            .expect("three lanes set up"),
        Vec::<String>::new()
    );
    // A role or a mount that is not set up at all is no matter of lanes:
    // noted, and the start goes on (the calls needing it are refused).
    let mut more = mounts.clone();
    more.get_mut("kubernetes")
        .expect("mount")
        .insert("never-set-up".into());
    more.insert("nowhere".into(), ["r".to_string()].into());
    let notes = broker.check_lanes(&more).await.expect("noted, not refused");
    assert!(
        notes.len() == 2
            && notes
                .iter()
                .any(|n| n.contains("kubernetes/creds/never-set-up"))
            && notes.iter().any(|n| n.contains("the mount nowhere")),
        "{notes:?}"
    );
    // Four lanes where three were set up: the fourth is refused, clearly.
    let over = VaultBroker::new(settings(&w.bao.addr, &token), &w.home)
        .expect("broker")
        .with_lanes(4);
    // At the start, before any call: the missing lane and what to run.
    let missing = |r: Result<Vec<String>, gateway::broker::vault::LaneCheck>, what: &[&str]| match r
    {
        Err(gateway::broker::vault::LaneCheck::Missing(m)) => {
            assert!(what.iter().all(|w| m.contains(w)), "{what:?}: {m}")
        }
        other => panic!("{what:?} is missing: {other:?}"),
    };
    missing(
        over.check_lanes(&mounts).await,
        &["kubernetes-lane-4", "vault setup --lanes 4", "not a mount"],
    );
    // A mount at a lane's path that is not the Kubernetes engine is no
    // lane, even when the token may use it; nor is a Kubernetes mount
    // the token may not mint on.
    let grant = |name: &str, hcl: &str| {
        let file = w.dir.path().join(format!("{name}.hcl"));
        std::fs::write(&file, hcl).expect("policy file");
        w.bao
            .ok(&["policy", "write", name, &file.display().to_string()]);
        w.bao.token_with_policy(name)
    };
    w.bao
        .ok(&["secrets", "enable", "-path=other", "kubernetes"]);
    w.bao.ok(&["secrets", "enable", "-path=other-lane-2", "kv"]);
    let kv_token = grant(
        "other-lane",
        "path \"other/creds/r\" {\n  capabilities = [\"update\"]\n}\npath \"other-lane-2/*\" {\n  capabilities = [\"read\"]\n}\n",
    );
    let kv = VaultBroker::new(settings(&w.bao.addr, &kv_token), &w.home)
        .expect("broker")
        .with_lanes(2);
    missing(
        kv.check_lanes(&roles("other", "r")).await,
        &["other-lane-2", "\"kv\""],
    );
    w.bao.ok(&["secrets", "enable", "-path=hand", "kubernetes"]);
    w.bao
        .ok(&["secrets", "enable", "-path=hand-lane-2", "kubernetes"]);
    // `sudo` alone is no grant to mint.
    let hand_token = grant(
        "hand-lane",
        "path \"hand/creds/r\" {\n  capabilities = [\"update\"]\n}\npath \"hand-lane-2/creds/r\" {\n  capabilities = [\"read\", \"sudo\"]\n}\n",
    );
    let hand = VaultBroker::new(settings(&w.bao.addr, &hand_token), &w.home)
        .expect("broker")
        .with_lanes(2);
    missing(
        hand.check_lanes(&roles("hand", "r")).await,
        &["hand-lane-2/creds/r", "mint"],
    );
    // A token Vault refuses says nothing of the lanes.
    let bad = VaultBroker::new(settings(&w.bao.addr, "not-a-token"), &w.home)
        .expect("broker")
        .with_lanes(4);
    assert!(
        matches!(
            bad.check_lanes(&mounts).await,
            Err(gateway::broker::vault::LaneCheck::Unknown(_))
        ),
        "a refused token is not a missing lane"
    );
    let mut refused = None;
    for i in 0..4 {
        if let Err(e) = over.issue(&format!("req-over-{i}"), &scope).await {
            refused = Some(e.to_string());
        }
    }
    let refused = refused.expect("the missing lane is refused");
    assert!(
        refused.contains("kubernetes-lane-4") && refused.contains("--lanes"),
        "{refused}"
    );
    for l in over.ledger().open_leases().expect("ledger") {
        over.revoke(&l.lease_id).await.expect("revoked");
    }
    // A later setup with fewer lanes: the lane it dropped is still
    // mounted, but no longer the gateway's to mint on.
    let out = setup_lanes(&w, 2);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let fewer = VaultBroker::new(
        settings(&w.bao.addr, &w.bao.token_with_policy("gateway")),
        &w.home,
    )
    .expect("broker")
    .with_lanes(3);
    missing(
        fewer.check_lanes(&mounts).await,
        &["kubernetes-lane-3", "vault setup --lanes 3"],
    );
}

/// `[vault] lanes` larger than `vault setup --lanes` made (here one): the
/// daemon refuses to start, naming the missing lane and what to run,
/// instead of failing the first call that lands on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_told_of_more_lanes_than_were_set_up_refuses_to_start() {
    let w = world().await;
    let policies = common::repo().join("policies");
    let (config, socket) = daemon_config(&w, "lanes", "", "lanes = 2", &policies, &w.home);
    let err = refused_start(&w, &config, "lanes");
    assert!(
        err.contains("refuses to start")
            && err.contains("kubernetes-lane-2")
            && err.contains("vault setup --lanes 2"),
        "{err}"
    );
    assert!(!socket.exists(), "it never listened");
}

/// The daemon with `config`, its stderr (info from the gateway) in `log`.
fn spawn_daemon(config: &Path, log: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--config")
        .arg(config)
        .arg("daemon")
        .env_remove("GATEWAY_HOME")
        .env_remove("VAULT_ADDR")
        .env_remove("VAULT_TOKEN")
        .env("RUST_LOG", "warn,gateway=info,rustify=off")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("gateway daemon")
}

/// Run the daemon with `config`, which must refuse to start within 30 s:
/// what it said on stderr.
fn refused_start(w: &World, config: &Path, tag: &str) -> String {
    let log = w.dir.path().join(format!("daemon-{tag}.log"));
    let mut daemon = spawn_daemon(config, &log);
    let ended = wait_until(Duration::from_secs(30), || {
        matches!(daemon.try_wait(), Ok(Some(_)))
    });
    let _ = daemon.kill();
    let status = daemon.wait().expect("wait");
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(ended && !status.success(), "the daemon started: {err}");
    err
}

/// A start refused after it logged in to Vault (AppRole) revokes the token
/// it got: under a service manager that retries, each refused start left
/// one live token behind until its TTL. So does a clean stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_and_a_clean_stop_revoke_the_vault_token_it_logged_in_for() {
    let w = world().await;
    let role_id = w
        .setup_output
        .lines()
        .find_map(|l| l.strip_prefix("approle gateway: role_id "))
        .expect("role id printed")
        .to_string();
    let policies = common::repo().join("policies");
    let (config, socket) = daemon_config(&w, "approle", "", "lanes = 2", &policies, &w.home);
    // AppRole auth instead of the token daemon_config writes.
    let approle = |text: &str| {
        assert!(text.contains("auth = \"token\"\n"), "{text}");
        format!(
            "{}[vault.approle]\nrole_id = {role_id:?}\nsecret_id_file = {:?}\n",
            text.replace("auth = \"token\"\n", "auth = \"approle\"\n"),
            w.dir.path().join("secret-id")
        )
    };
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, approle(&text)).expect("config");
    // Every live token, by accessor (the root token may list them).
    let live = || -> std::collections::BTreeSet<String> {
        serde_json::from_str(&w.bao.ok(&["list", "-format=json", "auth/token/accessors"]))
            .expect("a JSON list of accessors")
    };
    let before = live();
    let err = refused_start(&w, &config, "approle");
    assert!(
        err.contains("refuses to start") && err.contains("kubernetes-lane-2"),
        "refused for its lanes: {err}"
    );
    // It did log in (the lane check asks Vault with its own token).
    assert!(
        err.contains("logged in to Vault with AppRole auth"),
        "{err}"
    );
    let left: Vec<String> = live().difference(&before).cloned().collect();
    assert!(
        left.is_empty(),
        "the refused start's login token is still live ({left:?}): {err}"
    );
    assert!(
        err.contains("revoked the Vault token this refused start logged in for"),
        "{err}"
    );
    assert!(!socket.exists(), "it never listened");

    // A clean stop with none of its credentials open revokes its token too.
    let (config, socket) = daemon_config(&w, "approle-stop", "", "", &policies, &w.home);
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, approle(&text)).expect("config");
    let before = live();
    let log = w.dir.path().join("daemon-approle-stop.log");
    let mut daemon = spawn_daemon(&config, &log);
    let said = |what: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(what)
    };
    let up = wait_until(Duration::from_secs(30), || {
        socket.exists() && said("logged in to Vault with AppRole auth")
    });
    let during: Vec<String> = live().difference(&before).cloned().collect();
    signal(&daemon, "-TERM");
    let ended = wait_until(Duration::from_secs(30), || {
        matches!(daemon.try_wait(), Ok(Some(_)))
    });
    let _ = daemon.kill();
    let _ = daemon.wait();
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(up && ended, "the daemon did not serve and stop: {err}");
    assert_eq!(
        during.len(),
        1,
        "its login token was live while it served: {err}"
    );
    let left: Vec<String> = live().difference(&before).cloned().collect();
    assert!(
        left.is_empty(),
        "its login token outlived a clean stop ({left:?}): {err}"
    );
    assert!(
        err.contains("revoked the Vault token this gateway logged in for"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vault_refusals_are_clear_and_issue_nothing() {
    let w = world().await;
    let scope = pod_reader();
    // A wrong token.
    let wrong = VaultBroker::new(settings(&w.bao.addr, "s.not-a-real-token"), &w.home).expect("b");
    let e = wrong.issue("r", &scope).await.expect_err("wrong token");
    assert!(e.to_string().contains("permission denied"), "{e}");
    assert!(
        !e.to_string().contains("not-a-real-token"),
        "errors never carry the token: {e}"
    );
    // A role the gateway's policy does not grant (least privilege).
    let broker = VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("b");
    let mut other = scope.clone();
    other.role = "gateway-pod-reader-kube-system".into();
    let e = broker.issue("r", &other).await.expect_err("not granted");
    assert!(e.to_string().contains("permission denied"), "{e}");
    // A role that does not exist in Vault (with a token that may ask).
    let root = VaultBroker::new(settings(&w.bao.addr, &w.bao.root_token), &w.home).expect("b");
    let e = root.issue("r", &other).await.expect_err("no such role");
    // Vault's own reason, not just our path echoed back.
    assert!(
        e.to_string()
            .contains("role 'gateway-pod-reader-kube-system' does not exist"),
        "{e}"
    );
    // A namespace the role does not allow is refused by Vault too.
    let mut wrong_ns = scope.clone();
    wrong_ns
        .params
        .insert("kubernetes_namespace".into(), "kube-system".into());
    let e = broker.issue("r", &wrong_ns).await.expect_err("namespace");
    // (Our own prefix names only the path: "kube-system" is Vault's words.)
    assert!(e.to_string().contains("kube-system"), "{e}");
    // The gateway's token cannot read anything else.
    let out = Command::new(openbao::bao_binary())
        .args(["read", "sys/mounts"])
        .env("VAULT_ADDR", &w.bao.addr)
        .env("VAULT_TOKEN", &w.gateway_token)
        .output()
        .expect("bao");
    assert!(!out.status.success(), "least privilege");
    // Nothing was created in the cluster by any of these.
    w.kube
        .with(|s| assert!(s.created.is_empty(), "{:?}", s.created));
    // Sealed.
    w.bao.ok(&["operator", "seal"]);
    let e = broker.issue("r", &scope).await.expect_err("sealed");
    assert!(e.to_string().contains("sealed"), "{e}");
    // Down.
    let mut w = w;
    w.bao.stop();
    let e = broker.issue("r", &scope).await.expect_err("down");
    assert!(e.to_string().contains("unreachable"), "{e}");
    w.kube.with(|s| assert!(s.created.is_empty()));
    let ledger = gateway::broker::leases::LeaseLedger::in_home(&w.home).expect("ledger");
    assert!(
        ledger.open_leases().expect("q").is_empty(),
        "no lease was issued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approle_login_works_and_the_token_is_renewed() {
    let w = world().await;
    let role_id = w
        .setup_output
        .lines()
        .find_map(|l| l.strip_prefix("approle gateway: role_id "))
        .expect("role id printed")
        .to_string();
    let secret_id = std::fs::read_to_string(w.dir.path().join("secret-id")).expect("secret id");
    let mode = std::fs::metadata(w.dir.path().join("secret-id")).expect("meta");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    let s = VaultSettings {
        auth: VaultAuth::AppRole {
            mount: "approle".into(),
            role_id,
            secret_id: Secret::from(secret_id.trim()),
        },
        ..settings(&w.bao.addr, "")
    };
    let broker = VaultBroker::new(s, &w.home).expect("broker");
    let (ttl, renewable) = broker.check().await.expect("logged in");
    assert!(renewable && ttl.as_secs() > 3000, "{ttl:?}");
    let renewed = broker.renew_once().await.expect("renewed");
    assert!(renewed.as_secs() > 3000);
    let cred = broker.issue("req-a", &pod_reader()).await.expect("issued");
    broker.revoke(&cred.lease_id).await.expect("revoked");
    // A wrong secret id is a clear refusal.
    let bad = VaultSettings {
        auth: VaultAuth::AppRole {
            mount: "approle".into(),
            role_id: "nope".into(),
            secret_id: Secret::from("nope"),
        },
        ..settings(&w.bao.addr, "")
    };
    let e = VaultBroker::new(bad, &w.home)
        .expect("b")
        .issue("r", &pod_reader())
        .await
        .expect_err("bad login");
    assert!(e.to_string().contains("AppRole login"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_left_open_by_a_dead_gateway_is_revoked_at_the_next_start() {
    let w = world().await;
    // A gateway process issues a credential and is killed before it revokes
    // it: a real `gateway` child process would do; here the issuing process
    // is a short-lived `sh` whose pid we record as the owner, then it exits.
    let broker = VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("b");
    let cred = broker
        .issue("req-crashed", &pod_reader())
        .await
        .expect("issued");
    drop(broker);
    let mut child = Command::new("sleep").arg("0").spawn().expect("child");
    let dead = gateway::broker::leases::Owner {
        pid: child.id(),
        start: 1,
    };
    child.wait().expect("wait");
    {
        let conn = rusqlite_update_owner(&w.home, &cred.lease_id, dead);
        assert_eq!(conn, 1);
    }
    assert_eq!(
        w.kube.with(|s| s.live("serviceaccounts").len()),
        1,
        "the credential is live"
    );
    // The operator sees it (`gateway vault status`)...
    let gw = |args: &[&str]| {
        let mut cmd = common::gateway(&w.home);
        cmd.args(args)
            .env("VAULT_ADDR", &w.bao.addr)
            .env("VAULT_TOKEN", &w.gateway_token);
        cmd
    };
    let mut status = gw(&["vault", "status"]);
    let out = tokio::task::spawn_blocking(move || status.output().expect("status"))
        .await
        .expect("join");
    let text = common::stdout(&out);
    assert!(out.status.success(), "{text}{}", common::stderr(&out));
    assert!(
        text.contains("reachable; the gateway's token is valid"),
        "{text}"
    );
    assert!(
        text.contains("1 lease(s) not yet revoked") && text.contains(&cred.lease_id),
        "{text}"
    );
    assert!(!text.contains(&w.gateway_token));
    // ...and the next start (a new broker on the same home) revokes it.
    let audit = gateway::audit::AuditLog::in_home(&w.home).expect("audit");
    let next = VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("b");
    assert_eq!(next.recover_orphans(&audit).await, (1, 0));
    let mut recover = gw(&["vault", "recover"]);
    let out = tokio::task::spawn_blocking(move || recover.output().expect("recover"))
        .await
        .expect("join");
    assert!(
        common::stdout(&out).contains("revoked 0 lease(s) left open; 0 could not be revoked"),
        "nothing left for `gateway vault recover`: {}",
        common::stdout(&out)
    );
    assert!(
        w.kube.with(|s| s.live("serviceaccounts").is_empty()),
        "revoked in the cluster too"
    );
    let lookup = w.bao.bao(&["lease", "lookup", &cred.lease_id]);
    assert!(!lookup.status.success());
    let log = std::fs::read_to_string(w.home.join("audit.jsonl")).expect("audit");
    let ev: Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "credential.revoked")
        .expect("audited");
    assert_eq!(ev["request_id"], "req-crashed");
    assert_eq!(ev["data"]["recovered"], true);
    // And a live owner's lease is left alone.
    let mine = next.issue("req-live", &pod_reader()).await.expect("issued");
    assert_eq!(next.recover_orphans(&audit).await, (0, 0));
    next.revoke(&mine.lease_id).await.expect("revoke");
}

/// Point a ledger row at another owner (what a crashed process leaves).
fn rusqlite_update_owner(home: &Path, lease: &str, owner: gateway::broker::leases::Owner) -> usize {
    let conn = rusqlite::Connection::open(home.join("leases.db")).expect("ledger");
    conn.execute(
        "UPDATE leases SET owner_pid = ?1, owner_start = ?2 WHERE lease_id = ?3",
        rusqlite::params![owner.pid, owner.start as i64, lease],
    )
    .expect("update")
}

fn call(ns: &str) -> ToolCall {
    ToolCall {
        trace: None,
        tool: "k8s_get_pod_status".into(),
        params: json!({"namespace": ns}),
        principal: principal(),
        workspace: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8s_get_pod_status_runs_real_kubectl_in_gvisor_with_a_minted_token() {
    let w = world().await;
    w.kube.set_pods(
        "demo-app",
        vec![
            fake_kube::pod("web-7d9f-abcde", "demo-app", "Running", true, 0),
            fake_kube::pod("web-7d9f-fghij", "demo-app", "Pending", false, 3),
        ],
    );
    w.kube.set_pods(
        "kube-system",
        vec![fake_kube::pod("etcd-0", "kube-system", "Running", true, 0)],
    );
    let broker =
        Arc::new(VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("b"));
    let p = pipeline(&w, broker);
    // The call is traced (spans to a real OTLP receiver) and counted.
    let spans_dir = tempfile::tempdir().expect("spans");
    let receiver = otlp::Receiver::start(None, spans_dir.path(), None);
    gateway::telemetry::trace::init(&receiver.url(), "gateway-test").expect("traces");
    let r = p.call(call("demo-app")).await.expect("call");
    let spans = otlp::call_spans(spans_dir.path(), &r.request_id).await;
    let root = spans
        .iter()
        .find(|s| s["name"] == "gateway.call")
        .expect("root");
    let stage = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"] == name && s["parent_span_id"] == root["span_id"])
            .unwrap_or_else(|| panic!("no {name} span under the call: {spans:#?}"))
    };
    let (mint, run, revoke) = (
        stage("credential_mint"),
        stage("sandbox_run"),
        stage("credential_revoke"),
    );
    let at = |s: &serde_json::Value, k: &str| s[k].as_u64().expect("time");
    // Minted before the sandbox, revoked after it, each with its time.
    assert!(at(mint, "end") <= at(run, "start"), "{mint} {run}");
    assert!(at(run, "end") <= at(revoke, "start"), "{run} {revoke}");
    assert!(at(revoke, "end") > at(revoke, "start"));
    // The run's stages, as in its `sandbox.completed`, are events on the
    // run's span, in order, within it.
    let completed: Value = std::fs::read_to_string(w.home.join("audit.jsonl"))
        .expect("audit")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["request_id"] == r.request_id.as_str() && e["event"] == "sandbox.completed")
        .expect("sandbox.completed");
    let audited: Vec<&str> = completed["data"]["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .filter_map(|m| m["stage"].as_str())
        .collect();
    let events = run["events"].as_array().expect("events");
    let traced: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(
        !audited.is_empty() && traced == audited,
        "{traced:?} vs {audited:?}"
    );
    let times: Vec<u64> = events.iter().map(|e| at(e, "time")).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1])
            && times[0] >= at(run, "start")
            && times[times.len() - 1] <= at(run, "end"),
        "{times:?} in {run}"
    );
    // (Other tests of this binary run at the same time: only what can
    // only grow is checked.)
    let metrics = gateway::telemetry::metrics().encode();
    assert!(
        !metrics.contains("gateway_credentials_issued_total 0\n")
            && !metrics.contains("gateway_credentials_revoked_total 0\n"),
        "{metrics}"
    );
    let Outcome::Completed {
        ok,
        summary,
        result,
    } = &r.outcome
    else {
        panic!("completed: {r:?}");
    };
    assert!(ok, "{summary} {result}");
    let names: Vec<&str> = result["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["web-7d9f-abcde", "web-7d9f-fghij"]);
    assert_eq!(result["pods"][1]["restarts"], 3);
    assert_eq!(result["pods"][1]["ready"], "0/1");
    assert!(
        summary.contains("2 pod(s) in namespace demo-app"),
        "{summary}"
    );
    // kubectl in the sandbox asked with the minted token, over TLS.
    let (pod_lists, tokens) = w.kube.with(|s| {
        let lists: Vec<_> = s
            .seen
            .iter()
            .filter(|r| r.method == "GET" && r.path == "/api/v1/namespaces/demo-app/pods")
            .cloned()
            .collect();
        (lists, s.tokens.keys().cloned().collect::<Vec<_>>())
    });
    assert_eq!(pod_lists.len(), 1, "{pod_lists:?}");
    assert!(
        pod_lists[0]
            .user
            .starts_with("system:serviceaccount:demo-app:"),
        "{:?}",
        pod_lists[0]
    );
    assert_eq!(pod_lists[0].status, 200);
    assert_eq!(tokens.len(), 1);
    // Revoked after the sandbox: the service account is gone.
    assert!(w.kube.with(|s| s.live("serviceaccounts").is_empty()));
    let t = trail(&w.home, &r.request_id);
    let pos = |e: &str| {
        t.iter()
            .position(|x| x == e)
            .unwrap_or_else(|| panic!("{e} in {t:?}"))
    };
    assert!(pos("credential.issued") < pos("sandbox.started"));
    assert!(pos("sandbox.completed") < pos("credential.revoked"));
    assert!(pos("credential.revoked") < pos("tool.result"));
    // The token is nowhere: not in the result, not in anything under home.
    let result_json = serde_json::to_string(&r).expect("json");
    let written = everything_written(&w.home);
    let traced = std::fs::read_to_string(spans_dir.path().join("spans.jsonl")).expect("spans");
    for token in &tokens {
        assert!(!traced.contains(token.as_str()), "the token is in a span");
        assert!(
            !metrics.contains(token.as_str()),
            "the token is in a metric"
        );
        assert!(!result_json.contains(token.as_str()));
        assert!(
            !written.contains(token.as_str()),
            "the token is not in the audit, ledger or plans"
        );
        // Nor any of its three parts.
        for part in token.split('.').skip(1) {
            assert!(!written.contains(part));
        }
    }

    // A namespace outside the allowlist is denied by policy: nothing is
    // asked of Vault or of the cluster.
    let before = w.kube.with(|s| s.seen.len());
    let r = p.call(call("kube-system")).await.expect("call");
    assert!(matches!(r.outcome, Outcome::Denied { .. }), "{r:?}");
    assert_eq!(
        w.kube.with(|s| s.seen.len()),
        before,
        "the fake saw nothing"
    );
    let t = trail(&w.home, &r.request_id);
    assert!(
        !t.iter()
            .any(|e| e.starts_with("credential.") || e.starts_with("sandbox.")),
        "{t:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_vault_down_the_call_is_refused_and_nothing_runs() {
    let mut w = world().await;
    let broker =
        Arc::new(VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("b"));
    w.bao.stop();
    let p = pipeline(&w, broker);
    let r = p.call(call("demo-app")).await.expect("call");
    let Outcome::Refused { reason } = &r.outcome else {
        panic!("refused: {r:?}");
    };
    assert!(
        reason.contains("unreachable") && reason.contains("nothing was run"),
        "{reason}"
    );
    let t = trail(&w.home, &r.request_id);
    assert!(t.contains(&"credential.refused".to_string()), "{t:?}");
    assert!(!t.iter().any(|e| e.starts_with("sandbox.")), "{t:?}");
    assert!(w.kube.with(|s| s.seen.is_empty()));
}

/// A `gateway serve` child speaking MCP over stdio (newline-delimited JSON-RPC).
/// A `gateway daemon` on the world's state and broker, and a `gateway
/// serve` relaying one MCP session to it. `child` is the daemon (what the
/// tests kill); the relay ends with it.
struct Served {
    child: std::process::Child,
    /// The MCP session the relay holds (dropped after the daemon).
    client: Client,
    stderr: PathBuf,
    socket: PathBuf,
    _workspace: tempfile::TempDir,
}

/// A daemon's configuration file on `w` (extra `[daemon]` and `[vault]`
/// settings), and its socket.
fn daemon_config(
    w: &World,
    tag: &str,
    daemon_extra: &str,
    vault_extra: &str,
    policies: &Path,
    home: &Path,
) -> (PathBuf, PathBuf) {
    let token_file = w.dir.path().join("gateway-token");
    std::fs::write(&token_file, &w.gateway_token).expect("token file");
    let config = w.dir.path().join(format!("gateway-{tag}.toml"));
    let socket = w.dir.path().join(format!("run-{tag}/gateway.sock"));
    std::fs::write(
        &config,
        format!(
            "policies = {:?}\nhome = {:?}\n[daemon]\nsocket = {:?}\nsocket_group = \"root\"\n{daemon_extra}\n[endpoints]\nkube-apiserver = {}\n[vault]\naddress = {:?}\nauth = \"token\"\ntoken_file = {:?}\n{vault_extra}\n[kubernetes]\nca_file = {:?}\n",
            policies,
            home,
            socket,
            w.kube.port,
            w.bao.addr,
            token_file,
            w.ca_file
        ),
    )
    .expect("config");
    (config, socket)
}

impl Served {
    fn start(w: &World, tag: &str) -> Served {
        Served::start_with(w, tag, "")
    }

    /// With extra `[daemon]` settings.
    fn start_with(w: &World, tag: &str, daemon_extra: &str) -> Served {
        Served::start_on(w, tag, daemon_extra, &common::repo().join("policies"))
    }

    /// With extra `[daemon]` settings and the policies in `policies`.
    fn start_on(w: &World, tag: &str, daemon_extra: &str, policies: &Path) -> Served {
        Served::start_in(w, tag, daemon_extra, policies, &w.home)
    }

    /// With its state in `home`.
    fn start_in(w: &World, tag: &str, daemon_extra: &str, policies: &Path, home: &Path) -> Served {
        use std::process::Stdio;
        let (config, socket) = daemon_config(w, tag, daemon_extra, "", policies, home);
        let stderr = w.dir.path().join(format!("daemon-{tag}.log"));
        let mut daemon = Command::new(env!("CARGO_BIN_EXE_gateway"))
            .arg("--config")
            .arg(&config)
            .arg("daemon")
            .env_remove("GATEWAY_HOME")
            .env_remove("VAULT_ADDR")
            .env_remove("VAULT_TOKEN")
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("log"))
            .spawn()
            .expect("gateway daemon");
        let up = wait_until(std::time::Duration::from_secs(30), || {
            socket.exists() || matches!(daemon.try_wait(), Ok(Some(_)))
        });
        assert!(
            up && socket.exists(),
            "the daemon did not listen: {}",
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        let workspace = tempfile::tempdir().expect("workspace");
        let client = Client::connect(&socket, workspace.path(), "broker-test");
        Served {
            child: daemon,
            client,
            stderr,
            socket: socket.clone(),
            _workspace: workspace,
        }
    }

    fn send(&mut self, v: Value) {
        self.client.send(v);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_until(limit: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

/// A daemon with one pod-status call in flight, holding its credential
/// (kubectl has reached the API server, which answers after 15 s).
fn call_in_flight(w: &World, tag: &str, daemon_extra: &str) -> Served {
    in_flight_on(w, Served::start_with(w, tag, daemon_extra))
}

/// [`call_in_flight`] on a daemon already started.
fn in_flight_on(w: &World, mut served: Served) -> Served {
    w.kube.set_pods(
        "demo-app",
        vec![fake_kube::pod("web-0", "demo-app", "Running", true, 0)],
    );
    w.kube
        .with(|s| s.pods_delay = std::time::Duration::from_secs(15));
    let seen_before = w.kube.with(|s| s.arrived.len());
    served.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "k8s_get_pod_status", "arguments": {"namespace": "demo-app"}}}));
    let asked = wait_until(std::time::Duration::from_secs(60), || {
        w.kube.with(|s| {
            s.arrived[seen_before..]
                .iter()
                .any(|p| p == "/api/v1/namespaces/demo-app/pods")
        })
    });
    assert!(asked, "kubectl reached the API server: {}", served.log());
    assert_eq!(w.kube.with(|s| s.live("serviceaccounts").len()), 1);
    served
}

fn signal(child: &std::process::Child, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
}

/// SIGTERM or SIGINT while a call holds its credential: the daemon cancels
/// the session, and revokes the lease before it exits (not at the next
/// start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_stopped_mid_call_revokes_the_lease_before_it_exits() {
    let w = world().await;
    for (n, sig) in ["-TERM", "-INT"].into_iter().enumerate() {
        let mut served =
            tokio::task::block_in_place(|| call_in_flight(&w, &format!("stopped{n}"), ""));
        signal(&served.child, sig);
        let exited = tokio::task::block_in_place(|| {
            wait_until(std::time::Duration::from_secs(30), || {
                matches!(served.child.try_wait(), Ok(Some(_)))
            })
        });
        assert!(exited, "{sig}: the daemon did not stop: {}", served.log());
        // Gone when the daemon is: no next start needed.
        assert!(
            w.kube.with(|s| s.live("serviceaccounts").is_empty()),
            "{sig}: the credential outlived the daemon: {}",
            served.log()
        );
        let ledger = gateway::broker::leases::LeaseLedger::in_home(&w.home).expect("ledger");
        assert!(ledger.open_leases().expect("open").is_empty(), "{sig}");
    }
    let log = std::fs::read_to_string(w.home.join("audit.jsonl")).expect("audit");
    assert_eq!(log.matches("\"credential.revoked\"").count(), 2, "{log}");
}

/// The client goes away mid-call (EOF on `gateway serve`'s stdin), or
/// cancels the call: the daemon, still running, drops the call at once
/// (long before the API server would answer), kills its sandbox and
/// revokes its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_or_cancels_mid_call_has_its_lease_revoked_at_once() {
    let w = world().await;
    for way in ["eof", "cancel"] {
        let mut served = tokio::task::block_in_place(|| call_in_flight(&w, way, ""));
        let started = std::time::Instant::now();
        match way {
            "eof" => drop(served.client.stdin.take()),
            _ => served.send(
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": 1, "reason": "the user pressed Esc"}}),
            ),
        }
        let revoked = tokio::task::block_in_place(|| {
            wait_until(std::time::Duration::from_secs(10), || {
                w.kube.with(|s| s.live("serviceaccounts").is_empty())
            })
        });
        assert!(
            revoked,
            "{way}: the lease outlived the call: {}",
            served.log()
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(12),
            "{way}: revoked only when the call would have ended anyway"
        );
        assert!(
            matches!(served.child.try_wait(), Ok(None)),
            "{way}: the daemon keeps running"
        );
        let ledger = gateway::broker::leases::LeaseLedger::in_home(&w.home).expect("ledger");
        let settled = tokio::task::block_in_place(|| {
            wait_until(std::time::Duration::from_secs(10), || {
                ledger.open_leases().is_ok_and(|o| o.is_empty())
            })
        });
        assert!(settled, "{way}: the ledger marks it revoked");
    }
    let log = std::fs::read_to_string(w.home.join("audit.jsonl")).expect("audit");
    assert_eq!(
        log.matches("\"credential.revoke_on_abort\"").count(),
        2,
        "{log}"
    );
    assert_eq!(log.matches("\"credential.revoked\"").count(), 2, "{log}");
    assert_eq!(
        log.matches("\"cancelled\"").count(),
        2,
        "both calls ended as cancelled: {log}"
    );
}

/// Vault is gone when the daemon is stopped: it does not hang on the
/// revocation. It exits within its shutdown grace (3 s here), and the lease
/// it could not revoke stays in the ledger with an event saying the next
/// start revokes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_stopped_while_vault_is_gone_exits_within_its_grace() {
    let mut w = world().await;
    let mut served =
        tokio::task::block_in_place(|| call_in_flight(&w, "novault", "shutdown_grace_seconds = 3"));
    tokio::task::block_in_place(|| w.bao.stop());
    let started = std::time::Instant::now();
    signal(&served.child, "-TERM");
    let exited = tokio::task::block_in_place(|| {
        wait_until(std::time::Duration::from_secs(30), || {
            matches!(served.child.try_wait(), Ok(Some(_)))
        })
    });
    assert!(exited, "the daemon did not stop: {}", served.log());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "took {:?} with a 3 s grace",
        started.elapsed()
    );
    let ledger = gateway::broker::leases::LeaseLedger::in_home(&w.home).expect("ledger");
    assert_eq!(
        ledger.open_leases().expect("open").len(),
        1,
        "left for the next start"
    );
    let log = std::fs::read_to_string(w.home.join("audit.jsonl")).expect("audit");
    assert!(
        log.contains("\"credential.revoke_failed\"") && log.contains("the next start revokes it"),
        "{log}"
    );
}

/// Two replicas share one PostgreSQL store (and so one lease ledger). One
/// is killed (`kill -9`: no destructor, no revocation) while its call
/// holds a credential: the other, still serving, revokes that credential
/// in OpenBao on its own within a few seconds, with the dead replica named
/// in the audit and the call's end recorded as interrupted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_call_has_its_lease_revoked_by_a_survivor() {
    let w = world().await;
    let server = tokio::task::block_in_place(pg::Postgres::start);
    let url_file = w.dir.path().join("postgres.url");
    let conninfo = tokio::task::block_in_place(|| server.database("replicas"));
    std::fs::write(&url_file, &conninfo).expect("url");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&url_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let store = format!("\n[store]\nbackend = \"postgres\"\nurl_file = {url_file:?}\n");
    let policies = common::repo().join("policies");
    let (home_a, home_b) = (w.dir.path().join("home-a"), w.dir.path().join("home-b"));
    let mut b = tokio::task::block_in_place(|| {
        Served::start_in(&w, "replica-b", &store, &policies, &home_b)
    });
    let mut a = tokio::task::block_in_place(|| {
        in_flight_on(
            &w,
            Served::start_in(&w, "replica-a", &store, &policies, &home_a),
        )
    });
    assert_eq!(w.kube.with(|s| s.live("serviceaccounts").len()), 1);
    let ledger = gateway::broker::leases::SharedLedger::open(
        gateway::db::postgres::PostgresDb::connect(&conninfo, None).expect("db"),
    )
    .expect("ledger");
    use gateway::broker::leases::Ledger;
    let open = ledger.open_leases().expect("open");
    assert_eq!(open.len(), 1, "the lease is in the shared ledger");
    let dead = open[0].owner_replica.clone().expect("a replica owns it");
    a.child.kill().expect("kill -9");
    a.child.wait().expect("wait");
    let killed = std::time::Instant::now();
    let revoked = tokio::task::block_in_place(|| {
        wait_until(std::time::Duration::from_secs(30), || {
            w.kube.with(|s| s.live("serviceaccounts").is_empty())
        })
    });
    let took = killed.elapsed();
    let a_log = a.log();
    assert!(revoked, "no survivor revoked it: {}", b.log());
    eprintln!("time from kill -9 to the credential revoked in OpenBao: {took:?}");
    assert!(
        took < std::time::Duration::from_secs(15),
        "revoked only after {took:?}"
    );
    assert!(
        !w.bao
            .bao(&["lease", "lookup", &open[0].lease_id])
            .status
            .success(),
        "OpenBao no longer knows the lease"
    );
    let marked = tokio::task::block_in_place(|| {
        wait_until(std::time::Duration::from_secs(10), || {
            ledger.is_revoked(&open[0].lease_id).ok() == Some(Some(true))
        })
    });
    assert!(marked, "A: {a_log}\nB: {}", b.log());
    assert!(
        matches!(b.child.try_wait(), Ok(None)),
        "the survivor keeps serving"
    );
    // The survivor's audit names the dead replica and ends the call.
    let rid = open[0].request_id.clone();
    // One chain for both replicas, in the database.
    let chain = gateway::audit::shared::SharedChain::postgres(
        gateway::db::postgres::PostgresDb::connect(&conninfo, None).expect("db"),
    )
    .expect("chain");
    let read = || -> Vec<serde_json::Map<String, Value>> {
        String::from_utf8(chain.export().expect("export").bytes)
            .expect("utf-8")
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let ended = tokio::task::block_in_place(|| {
        wait_until(std::time::Duration::from_secs(10), || {
            read()
                .iter()
                .any(|e| e["request_id"] == rid.as_str() && e["event"] == "tool.result")
        })
    });
    assert!(ended, "no end recorded for {rid}");
    let events = read();
    let mine: Vec<_> = events
        .iter()
        .filter(|e| e["request_id"] == rid.as_str())
        .collect();
    assert!(
        mine.iter().any(|e| e["event"] == "credential.revoked"
            && e["data"]["owner_replica"] == dead.as_str()
            && e["data"]["recovered"] == true),
        "{mine:?}"
    );
    let last = mine.last().expect("events");
    assert_eq!(last["event"], "tool.result");
    assert_eq!(last["data"]["status"], "interrupted", "{last:?}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_call_leaves_a_lease_the_next_start_revokes() {
    let w = world().await;
    w.kube.set_pods(
        "demo-app",
        vec![fake_kube::pod("web-0", "demo-app", "Running", true, 0)],
    );
    // kubectl's pod list hangs, so the gateway is killed while the sandbox
    // holds the live credential.
    w.kube
        .with(|s| s.pods_delay = std::time::Duration::from_secs(15));
    let mut first = tokio::task::block_in_place(|| Served::start(&w, "first"));
    first.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "k8s_get_pod_status", "arguments": {"namespace": "demo-app"}}}));
    let asked = tokio::task::block_in_place(|| {
        wait_until(std::time::Duration::from_secs(60), || {
            w.kube.with(|s| {
                s.arrived
                    .iter()
                    .any(|p| p == "/api/v1/namespaces/demo-app/pods")
            })
        })
    });
    assert!(asked, "kubectl reached the API server: {}", first.log());
    assert_eq!(w.kube.with(|s| s.live("serviceaccounts").len()), 1);
    // SIGKILL: no destructor, no revocation.
    first.child.kill().expect("kill");
    first.child.wait().expect("wait");
    let first_log = first.log();
    drop(first);
    assert_eq!(
        w.kube.with(|s| s.live("serviceaccounts").len()),
        1,
        "the credential outlived its gateway"
    );
    let ledger = gateway::broker::leases::LeaseLedger::in_home(&w.home).expect("ledger");
    let open = ledger.open_leases().expect("open");
    assert_eq!(open.len(), 1, "the ledger kept the lease");
    w.kube.with(|s| s.pods_delay = std::time::Duration::ZERO);

    // The next start revokes it before serving anything.
    let mut second = tokio::task::block_in_place(|| Served::start(&w, "second"));
    let revoked = tokio::task::block_in_place(|| {
        wait_until(std::time::Duration::from_secs(30), || {
            w.kube.with(|s| s.live("serviceaccounts").is_empty())
        })
    });
    assert!(revoked, "the orphan was revoked: {}", second.log());
    // The killed gateway's sandbox (bundle with its credential file,
    // network namespace) was removed by the next start as well.
    let rid = open[0].request_id.clone();
    let bundles = std::path::Path::new("/dev/shm/gateway-sandbox/bundles");
    let left: Vec<String> = std::fs::read_dir(bundles)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&rid))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "leftover bundle {left:?}");
    let netns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    let tag = {
        use sha2::Digest;
        hex::encode(&sha2::Sha256::digest(rid.as_bytes())[..4])
    };
    assert!(
        !common::stdout(&netns).contains(&format!("gw-{tag}")),
        "leftover netns: {}",
        common::stdout(&netns)
    );
    assert_eq!(ledger.is_revoked(&open[0].lease_id).expect("q"), Some(true));
    assert!(
        !w.bao
            .bao(&["lease", "lookup", &open[0].lease_id])
            .status
            .success()
    );

    // And it serves: a full call works, through MCP, and its token leaks nowhere.
    second.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "k8s_get_pod_status", "arguments": {"namespace": "demo-app"}}}));
    let reply = tokio::task::block_in_place(|| {
        second
            .client
            .reply(2, std::time::Duration::from_secs(120))
            .expect("a reply in time")
    });
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    assert_eq!(
        reply["result"]["structuredContent"]["result"]["pods"][0]["name"], "web-0",
        "{reply}"
    );
    let second_log = second.log();
    drop(second);
    let tokens: Vec<String> = w.kube.with(|s| s.tokens.keys().cloned().collect());
    assert_eq!(tokens.len(), 2);
    let written = everything_written(&w.home);
    for t in &tokens {
        for (what, text) in [
            ("MCP reply", reply.to_string()),
            ("first gateway's log", first_log.clone()),
            ("second gateway's log", second_log.clone()),
            ("home", written.clone()),
        ] {
            assert!(
                !text.contains(t.as_str()),
                "the token leaked into the {what}"
            );
        }
    }
    assert!(
        !second_log.contains(&w.gateway_token),
        "the gateway's own Vault token is never logged"
    );
    assert!(!written.contains(&w.gateway_token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_setup_script_is_idempotent_and_writes_what_the_policies_derive() {
    let w = world().await;
    let script = |args: &[&str]| {
        Command::new(common::repo().join("scripts/vault-setup.sh"))
            .args(args)
            .arg("--kubernetes-ca-file")
            .arg(&w.ca_file)
            .env("GATEWAY_BIN", env!("CARGO_BIN_EXE_gateway"))
            .env("VAULT_ADDR", &w.bao.addr)
            .env("VAULT_TOKEN", &w.bao.root_token)
            .env_remove("AWS_ACCESS_KEY_ID")
            .output()
            .expect("vault-setup.sh")
    };
    // A role as the setup before provisioned Roles wrote it (Vault made a
    // Role per credential from generated_role_rules): a new setup must
    // turn it into a binding of the provisioned Role, not fail on it.
    w.bao
        .ok(&["delete", "kubernetes/roles/gateway-pod-reader-demo-app"]);
    w.bao.ok(&[
        "write",
        "kubernetes/roles/gateway-pod-reader-demo-app",
        "allowed_kubernetes_namespaces=demo-app",
        "kubernetes_role_type=Role",
        r#"generated_role_rules={"rules":[{"apiGroups":[""],"resources":["pods"],"verbs":["get","list","watch"]}]}"#,
    ]);
    // world() already ran setup once; run it again through the script.
    let url = w.kube.url();
    for _ in 0..2 {
        let out = script(&["--kubernetes-host", &url]);
        assert!(
            out.status.success(),
            "{}{}",
            common::stdout(&out),
            common::stderr(&out)
        );
        assert!(common::stdout(&out).contains("secrets engine kubernetes/: already enabled"));
    }
    let roles = w.bao.ok(&["list", "-format=json", "kubernetes/roles"]);
    let mut roles: Vec<String> = serde_json::from_str(&roles).expect("json");
    roles.sort();
    assert_eq!(
        roles,
        [
            "gateway-k8s-apply-demo-app",
            "gateway-k8s-delete-demo-app",
            "gateway-k8s-describe-demo-app",
            "gateway-k8s-events-demo-app",
            "gateway-k8s-get-demo-app",
            "gateway-k8s-logs-demo-app",
            "gateway-k8s-restart-demo-app",
            "gateway-k8s-rollout-demo-app",
            "gateway-k8s-scale-demo-app",
            "gateway-k8s-set-image-demo-app",
            "gateway-k8s-top-demo-app",
            "gateway-k8s-undo-demo-app",
            "gateway-pod-reader-demo-app",
            "gateway-tf-apply-demo-app",
            "gateway-tf-plan-demo-app"
        ]
    );
    let role: Value = serde_json::from_str(&w.bao.ok(&[
        "read",
        "-format=json",
        "kubernetes/roles/gateway-pod-reader-demo-app",
    ]))
    .expect("json");
    assert_eq!(
        role["data"]["allowed_kubernetes_namespaces"],
        json!(["demo-app"])
    );
    assert_eq!(
        role["data"]["kubernetes_role_name"], "gateway-pod-reader-demo-app",
        "{role}"
    );
    assert_eq!(role["data"]["generated_role_rules"], "", "{role}");
    // TTLs from config/vault_roles/data.yaml (10m and 30m), in seconds.
    assert_eq!(role["data"]["token_default_ttl"], 600, "{role}");
    assert_eq!(role["data"]["token_max_ttl"], 1800, "{role}");
    let policy = w.bao.ok(&["policy", "read", "gateway"]);
    assert!(
        policy.contains("path \"kubernetes/creds/gateway-pod-reader-demo-app\""),
        "{policy}"
    );
    assert!(!policy.contains("sudo"));
    // Without VAULT_TOKEN the script refuses clearly.
    let out = Command::new(common::repo().join("scripts/vault-setup.sh"))
        .env_remove("VAULT_TOKEN")
        .env_remove("BAO_TOKEN")
        .env("VAULT_ADDR", &w.bao.addr)
        .output()
        .expect("script");
    assert_eq!(out.status.code(), Some(2));
    assert!(common::stderr(&out).contains("VAULT_TOKEN"));
}

/// The test's kubelet and CNI for `gateway verify --backend kubernetes`:
/// runs each new pod's probe as the real node would answer it. The answers
/// depend on the pod as created: the kernel is gVisor's only under the
/// `gvisor` runtime class; a connection leaves the sandbox namespace only
/// to the API server, and only from a pod labelled for that endpoint whose
/// hostAliases point the name at the endpoint (what cluster/networkpolicy.yaml
/// and Calico enforce on a real cluster).
/// The kubelet of the verify test's fake cluster. The `kernel` probe is the
/// real runner binary with the pod's own environment (its output framing is
/// the real one), in real gVisor for a pod of RuntimeClass `gvisor`; the
/// container log is what the runner wrote. `connect` is decided as a CNI
/// enforcing cluster/networkpolicy.yaml would (the fake has no network),
/// with the answer framed as the runner frames it. The runner's lock-down
/// wait is not played here: it is taken to have passed (a pod's policy
/// applies here at once), and tests/runner_binary.rs tests it for real.
fn kubelet(kube: &FakeKube, api_ip: &str, api_port: u16) -> tokio::task::JoinHandle<()> {
    let state = Arc::clone(&kube.state);
    let api = format!("{api_ip}:{api_port}");
    tokio::spawn(async move {
        let gvisor_sb = LocalSandbox::new(LocalConfig::default()).expect("runsc");
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let pending: Vec<(String, String, Value)> = {
                let s = state.lock().expect("state");
                s.objects
                    .iter()
                    .filter(|((r, _, _), v)| r == "pods" && v["status"]["phase"] == "Pending")
                    .map(|((_, n, name), v)| (n.clone(), name.clone(), v.clone()))
                    .collect()
            };
            for (ns, name, pod) in pending {
                let spec = &pod["spec"];
                let argv: Vec<String> = spec["containers"][0]["command"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str().map(str::to_string))
                    .collect();
                let env: Vec<(String, String)> = spec["containers"][0]["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| {
                        Some((
                            e["name"].as_str()?.to_string(),
                            e["value"].as_str()?.to_string(),
                        ))
                    })
                    .collect();
                let gvisor = spec["runtimeClassName"] == "gvisor";
                let framed = |stream: &str, line: &str| {
                    if env
                        .iter()
                        .any(|(k, v)| k == "GATEWAY_FRAMED_OUTPUT" && v == "1")
                    {
                        format!("{stream} {line}\n")
                    } else {
                        format!("{line}\n")
                    }
                };
                let (phase, code, log, ip) = match argv.get(2).map(String::as_str) {
                    Some("kernel") => {
                        let (code, log) = real_kernel_probe(&gvisor_sb, gvisor, &name, &env).await;
                        (
                            if code == 0 { "Succeeded" } else { "Failed" },
                            code,
                            log,
                            None,
                        )
                    }
                    Some("serve") => (
                        "Running",
                        0,
                        framed("o", "serving on 8080"),
                        Some("10.244.1.50"),
                    ),
                    Some("connect") => {
                        let target = argv.get(3).cloned().unwrap_or_default();
                        let (host, port) = target.rsplit_once(':').unwrap_or(("", ""));
                        let resolved = spec["hostAliases"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|h| {
                                h["hostnames"]
                                    .as_array()
                                    .is_some_and(|n| n.iter().any(|x| x == host))
                            })
                            .and_then(|h| h["ip"].as_str())
                            .unwrap_or(host);
                        let dest = format!("{resolved}:{port}");
                        let labelled = pod["metadata"]["labels"]["gateway.dev/egress-kube-apiserver"]
                            == "allow";
                        let allowed = ns != "gateway-sandbox" || (labelled && dest == api);
                        if allowed {
                            (
                                "Succeeded",
                                0,
                                framed("o", &format!("connected {dest}")),
                                None,
                            )
                        } else {
                            (
                                "Failed",
                                1,
                                framed("o", &format!("failed: {dest}: connection timed out")),
                                None,
                            )
                        }
                    }
                    _ => ("Failed", 2, framed("e", "unknown probe"), None),
                };
                let mut s = state.lock().expect("state");
                s.logs.insert(name.clone(), log.into_bytes());
                let state = if phase == "Running" {
                    json!({"running": {}})
                } else {
                    json!({"terminated": {"exitCode": code, "reason": if code == 0 {"Completed"} else {"Error"}}})
                };
                s.update("pods", &ns, &name, |p| {
                    p["status"] = json!({"phase": phase, "podIP": ip,
                        "containerStatuses": [{"name": "runner", "ready": phase == "Running", "restartCount": 0,
                            "image": "gateway-runner:0.1.0", "imageID": "", "state": state}]});
                });
            }
        }
    })
}

/// `gateway-runner probe kernel` for real, with the pod's environment: in
/// gVisor (the local backend) for a gvisor pod, on the host otherwise. The
/// log is what the container runtime keeps: stdout, then stderr.
async fn real_kernel_probe(
    sb: &LocalSandbox,
    gvisor: bool,
    pod: &str,
    env: &[(String, String)],
) -> (i32, String) {
    use gateway::sandbox::{Bind, Limits, Network, Sandbox, SandboxRequest};
    if gvisor {
        let req = SandboxRequest {
            name: format!("kubelet-{pod}"),
            argv: vec![
                gateway::protocol::RUNNER.into(),
                "probe".into(),
                "kernel".into(),
            ],
            env: env.to_vec(),
            binds: {
                let mut b = gateway::tools::shared_lib_binds(&common::runner_bin()).expect("libs");
                b.push(Bind {
                    host: common::runner_bin(),
                    inside: gateway::protocol::RUNNER.into(),
                    writable: false,
                });
                b
            },
            workdir: None,
            files_in: vec![],
            credential: None,
            limits: Limits::default(),
            deadline: std::time::Duration::from_secs(60),
            network: Network::None,
            files_out: vec![],
            on_stderr_line: None,
            image: None,
        };
        match sb.run(req).await {
            Ok(r) => (
                r.exit_code.unwrap_or(1),
                format!("{}{}", r.stdout.text(), r.stderr.text()),
            ),
            Err(e) => (1, format!("kubelet: {e}\n")),
        }
    } else {
        let out = tokio::process::Command::new(common::runner_bin())
            .args(["probe", "kernel"])
            .envs(env.iter().cloned())
            .output()
            .await
            .expect("runner");
        (
            out.status.code().unwrap_or(1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_on_the_kubernetes_backend_passes_and_fails_for_the_right_reasons() {
    use gateway::sandbox::kubernetes::{KubeSandboxConfig, KubernetesSandbox};
    use gateway::verify::kubernetes as verify;
    let w = world().await;
    w.kube
        .with(|s| s.restricted_namespaces = vec!["gateway-sandbox".into()]);
    w.kube.set_pods(
        "demo-app",
        vec![fake_kube::pod("web-0", "demo-app", "Running", true, 0)],
    );
    let _kubelet = kubelet(&w.kube, "172.18.0.2", 6443);
    // The gateway's (operator's) access to the cluster.
    let token = w.dir.path().join("admin-token");
    std::fs::write(&token, &w.kube.admin_jwt).expect("token");
    let kubeconfig = w.dir.path().join("admin-kubeconfig");
    std::fs::write(
        &kubeconfig,
        gateway::broker::kubeconfig::kubeconfig(
            &w.kube.url(),
            w.kube.ca_pem.as_bytes(),
            "kubernetes",
            &token.display().to_string(),
            "default",
        ),
    )
    .expect("kubeconfig");
    let cfg = KubeSandboxConfig {
        kubeconfig: Some(kubeconfig),
        endpoint_addresses: BTreeMap::from([("kube-apiserver".into(), "172.18.0.2".into())]),
        grace_seconds: 5,
        egress_canary: Some("10.96.0.10:53".into()),
        ..KubeSandboxConfig::default()
    };
    // The real API server keeps authenticating a revoked token for a while.
    w.kube
        .with(|s| s.token_cache = std::time::Duration::from_secs(2));
    let base = gateway::sandbox::kubernetes::config(&cfg)
        .await
        .expect("config");
    let client = kube::Client::try_from(base.clone()).expect("client");
    let broker =
        VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("broker");
    let scope = pod_reader();
    let sb = KubernetesSandbox::new(client.clone(), cfg.clone());
    let checks = verify::verify_kubernetes(&sb, &base, 6443, Some((&broker, &scope))).await;
    for c in &checks {
        assert!(c.pass, "{}: {}", c.name, c.detail);
    }
    assert_eq!(checks.len(), 5);
    assert!(
        checks[4]
            .detail
            .contains("pods in kube-system: 403; secrets in demo-app: 403"),
        "{}",
        checks[4].detail
    );
    assert!(
        checks[4].detail.contains("after revoke: 403 for ")
            && checks[4]
                .detail
                .contains("(the API server's token cache), then 401"),
        "{}",
        checks[4].detail
    );
    assert!(
        checks[1]
            .detail
            .contains("canary from the baseline namespace: exit Some(0), connected 10.96.0.10:53"),
        "{}",
        checks[1].detail
    );
    // Nothing is left: no Job, no Secret, the scratch namespace is gone.
    w.kube.with(|s| {
        assert!(
            s.live("jobs").is_empty() && s.live("secrets").is_empty(),
            "{:?}",
            s.live("jobs")
        );
        assert!(s.live("namespaces").is_empty());
    });

    // The same through the binary: `gateway verify --backend kubernetes`
    // with a gateway.toml (operator kubeconfig, the gateway's Vault token).
    let token_file = w.dir.path().join("gateway-token");
    std::fs::write(&token_file, &w.gateway_token).expect("token file");
    let config = w.dir.path().join("verify.toml");
    std::fs::write(
        &config,
        format!(
            "policies = {:?}\n[endpoints]\nkube-apiserver = 6443\n[vault]\naddress = {:?}\ntoken_file = {:?}\n[sandbox]\nbackend = \"kubernetes\"\n[sandbox.kubernetes]\nkubeconfig = {:?}\ngrace_seconds = 5\negress_canary = \"10.96.0.10:53\"\n[sandbox.kubernetes.endpoint_addresses]\nkube-apiserver = \"172.18.0.2\"\n",
            common::repo().join("policies"),
            w.bao.addr,
            token_file,
            cfg.kubeconfig.clone().expect("kubeconfig")
        ),
    )
    .expect("config");
    let mut cmd = common::gateway(&w.home);
    cmd.arg("--config").arg(&config).arg("verify");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("gateway verify"))
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "{}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
    assert!(common::stdout(&out).contains("gateway verify: kubernetes backend"));
    assert!(
        common::stdout(&out).contains("7 passed, 0 failed"),
        "{}",
        common::stdout(&out)
    );
    // The toolbox's read and the dry run of a change, with their own
    // tokens: the dry run admitted by the server and nothing created.
    assert!(
        common::stdout(&out).contains("deployments in demo-app: listed (")
            && common::stdout(&out)
                .contains(": admitted; afterwards in the cluster: absent; tokens revoked: both"),
        "{}",
        common::stdout(&out)
    );
    assert!(w.kube.with(|s| s.live("configmaps").is_empty()));
    // A namespace the policy does not allow: the credential check fails and
    // says why, in the policy's words.
    let mut cmd = common::gateway(&w.home);
    cmd.arg("--config")
        .arg(&config)
        .args(["verify", "--namespace", "kube-system"]);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("gateway verify"))
        .await
        .expect("join");
    assert!(!out.status.success());
    assert!(
        common::stdout(&out)
            .contains("the policy denies k8s_get_pod_status in namespace kube-system")
            && common::stdout(&out).contains("the policy denies k8s_get (")
            && common::stdout(&out).contains("5 passed, 2 failed"),
        "{}",
        common::stdout(&out)
    );
    // A credential Role that lost a verb in the cluster: the change's dry
    // run is refused by RBAC, and the drift check names the Role.
    w.kube.with(|s| {
        s.update("roles", "demo-app", "gateway-k8s-apply-demo-app", |r| {
            for rule in r["rules"].as_array_mut().into_iter().flatten() {
                rule["verbs"] = json!(["get", "update"]);
            }
        });
    });
    let mut cmd = common::gateway(&w.home);
    cmd.arg("--config").arg(&config).arg("verify");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("gateway verify"))
        .await
        .expect("join");
    let said = common::stdout(&out);
    assert!(!out.status.success());
    assert!(
        said.contains("5 passed, 2 failed")
            && said.contains("dry-run create of ConfigMap demo-app/gateway-verify-")
            && said.contains("refused (403")
            && said.contains("Role demo-app/gateway-k8s-apply-demo-app has other rules"),
        "{said}"
    );
    w.kube.with(|s| {
        s.apply_yaml(&openbao::cluster_roles_yaml());
    });

    // And each check can fail: a cluster without gVisor, without the
    // NetworkPolicy labels, with admission off.
    w.kube.with(|s| s.restricted_namespaces.clear());
    let weak = KubernetesSandbox::new(
        client,
        KubeSandboxConfig {
            runtime_class: "runc".into(),
            endpoint_addresses: BTreeMap::from([("kube-apiserver".into(), "10.96.0.1".into())]),
            egress_canary: None,
            ..cfg
        },
    );
    let checks = verify::verify_kubernetes(&weak, &base, 6443, None).await;
    let failed: Vec<&str> = checks.iter().filter(|c| !c.pass).map(|c| c.name).collect();
    assert_eq!(checks.len(), 4);
    assert!(
        checks
            .iter()
            .any(|c| !c.pass && c.detail.contains("no [sandbox.kubernetes] egress_canary")),
        "{checks:?}"
    );
    assert!(failed.iter().any(|n| n.contains("gVisor")), "{failed:?}");
    assert!(
        failed.iter().any(|n| n.contains("API server endpoint")),
        "ClusterIP is not the endpoint: {failed:?}"
    );
    assert!(
        failed.iter().any(|n| n.contains("privileged")),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_auth_logs_the_gateway_in_with_its_service_account() {
    let w = world().await;
    let jwt_file = w.dir.path().join("openbao-sa.jwt");
    let out = common::gateway(&w.home)
        .args(["vault", "setup", "--kubernetes-host", &w.kube.url()])
        .arg("--kubernetes-ca-file")
        .arg(&w.ca_file)
        .arg("--service-account-jwt-file")
        .arg(&jwt_file)
        .args(["--kubernetes-auth", "gateway-sandbox/gateway"])
        .env("VAULT_ADDR", &w.bao.addr)
        .env("VAULT_TOKEN", &w.bao.root_token)
        .output()
        .expect("setup");
    assert!(
        out.status.success(),
        "{}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
    assert!(
        common::stdout(&out)
            .contains("auth kubernetes/role/gateway: service account gateway-sandbox/gateway")
    );
    let k8s_auth = |jwt: &str, tag: &str| {
        let file = w.dir.path().join(format!("sa-{tag}.jwt"));
        std::fs::write(&file, jwt).expect("jwt");
        VaultSettings {
            auth: VaultAuth::Kubernetes {
                mount: "kubernetes".into(),
                role: "gateway".into(),
                jwt_file: file,
            },
            ..settings(&w.bao.addr, "")
        }
    };
    // The gateway pod's own service account token.
    let token = w
        .kube
        .with(|s| s.service_account_token("gateway-sandbox", "gateway"));
    let broker = VaultBroker::new(k8s_auth(&token, "gateway"), &w.home).expect("broker");
    // OpenBao reviews the token as its own service account: without
    // `system:auth-delegator` the API server refuses the TokenReview (as a
    // real one does), the login fails, and the error says what to bind.
    let refused = broker
        .check()
        .await
        .expect_err("no login without the reviewer's TokenReview permission");
    let said = refused.to_string();
    assert!(
        said.contains("system:auth-delegator") && said.contains("cluster/vault-rbac.yaml"),
        "{said}"
    );
    let reviews = w.kube.with(|s| {
        s.seen
            .iter()
            .filter(|r| r.path.ends_with("/tokenreviews"))
            .map(|r| r.status)
            .collect::<Vec<_>>()
    });
    assert!(
        reviews.iter().all(|s| *s == 403) && !reviews.is_empty(),
        "{reviews:?}"
    );
    // The cluster assets bind it (cluster/vault-rbac.yaml): now it logs in.
    w.kube.with(|s| s.apply_cluster_bindings());
    let checked = broker.check().await;
    let seen = w.kube.with(|s| {
        s.seen
            .iter()
            .map(|r| format!("{} {} {} {}", r.method, r.path, r.user, r.status))
            .collect::<Vec<_>>()
    });
    let (ttl, renewable) =
        checked.unwrap_or_else(|e| panic!("logged in: {e}; the API server saw {seen:#?}"));
    assert!(renewable && ttl.as_secs() > 3000, "{ttl:?}");
    let cred = broker
        .issue("req-k8s-auth", &pod_reader())
        .await
        .expect("issued with the gateway policy");
    broker.revoke(&cred.lease_id).await.expect("revoked");

    // Tokens that run out fast: the gateway keeps a valid one at every
    // moment, checked every 300 ms. First tokens that cannot be renewed
    // (batch, 6 s): it logs in again before each runs out; then renewable
    // ones (6 s, at most 14 s): it renews, and logs in again before the
    // maximum.
    let mut logins_before = 0;
    let mut broker = None;
    for (kind, extra, run_for) in [
        (
            "batch",
            ["token_type=batch", "token_ttl=6s", "token_max_ttl=0"],
            16,
        ),
        (
            "service",
            ["token_type=service", "token_ttl=6s", "token_max_ttl=14s"],
            22,
        ),
    ] {
        let mut args = vec![
            "write",
            "auth/kubernetes/role/gateway",
            "bound_service_account_names=gateway",
            "bound_service_account_namespaces=gateway-sandbox",
            "token_policies=gateway",
        ];
        args.extend(extra);
        w.bao.ok(&args);
        let b = Arc::new(VaultBroker::new(k8s_auth(&token, kind), &w.home).expect("broker"));
        let (ttl, renewable) = b.check().await.expect("logged in");
        assert!(ttl.as_secs() <= 6, "{kind}: {ttl:?}");
        assert_eq!(renewable, kind == "service");
        let renewal = b.spawn_renewal();
        let started = std::time::Instant::now();
        let mut failures = Vec::new();
        while started.elapsed() < Duration::from_secs(run_for) {
            if let Err(e) = b.check().await {
                failures.push(format!("{:?}: {e}", started.elapsed()));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        renewal.abort();
        assert!(
            failures.is_empty(),
            "{kind}: the token lapsed: {failures:#?}"
        );
        let logins = w.kube.with(|s| {
            s.seen
                .iter()
                .filter(|r| r.path.ends_with("/tokenreviews"))
                .count()
        });
        assert!(
            logins - logins_before >= 2,
            "{kind}: logged in again before the token ran out ({} logins)",
            logins - logins_before
        );
        logins_before = logins;
        broker = Some(b);
    }
    let broker = broker.expect("broker");
    let cred = broker
        .issue("req-k8s-auth-2", &pod_reader())
        .await
        .expect("issued after 40 s");
    broker.revoke(&cred.lease_id).await.expect("revoked");

    // Another service account is not the gateway.
    let other = w
        .kube
        .with(|s| s.service_account_token("default", "builder"));
    let e = VaultBroker::new(k8s_auth(&other, "other"), &w.home)
        .expect("b")
        .issue("r", &pod_reader())
        .await
        .expect_err("not bound");
    assert!(
        e.to_string()
            .contains("Kubernetes login at auth/kubernetes"),
        "{e}"
    );
    assert!(
        !e.to_string().contains(&other),
        "the JWT is not in the error"
    );
}

/// One MCP client of a running daemon: a `gateway serve` relay.
struct Client {
    relay: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<Value>,
    next_id: u64,
}

impl Client {
    fn connect(socket: &Path, workspace: &Path, name: &str) -> Client {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut relay = common::serve_command(socket, workspace)
            .stderr(Stdio::null())
            .spawn()
            .expect("gateway serve");
        let stdin = relay.stdin.take();
        let stdout = relay.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        let mut c = Client {
            relay,
            stdin,
            lines,
            next_id: 1,
        };
        c.send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": name, "version": "1"}}}));
        c.reply(0, std::time::Duration::from_secs(60))
            .expect("initialized");
        c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        c
    }

    fn send(&mut self, v: Value) {
        use std::io::Write;
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{v}").and_then(|_| stdin.flush());
        }
    }

    fn reply(&mut self, id: u64, limit: std::time::Duration) -> Option<Value> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let v = self.lines.recv_timeout(left).ok()?;
            if v["id"] == json!(id) {
                return Some(v);
            }
        }
    }

    fn call(&mut self, namespace: &str) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "k8s_get_pod_status", "arguments": {"namespace": namespace}}}));
        id
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.relay.kill();
        let _ = self.relay.wait();
    }
}

/// A small deterministic generator (the seed is printed to replay a run).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The daemon's peak resident memory (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Bounded stress, on loopback with real OpenBao and real gVisor: 200 calls
/// from 4 clients at once, each a pod status with a credential minted for
/// it (15% to a namespace the policy denies). About one in five is
/// cancelled mid-way and one in ten loses its client mid-way (the relay
/// killed, or its stdin closed), at random times. Afterwards: no lease left
/// in OpenBao, in the ledger or as a ServiceAccount; no sandbox, network
/// namespace, cgroup, bundle or working dir left; the audit verifies; and
/// the daemon's peak memory stays under 112 MiB. Prints the figures
/// (`CI=true cargo test --test broker_openbao two_hundred -- --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_calls_with_cancellations_and_disconnects_leave_nothing_behind() {
    const CALLS: u64 = 200;
    const CLIENTS: u64 = 4;
    // The daemon here is the debug build: idle, it holds 73 MiB (33 MiB of
    // it its own code, mapped; measured 2026-12-07 with the upstream MCP
    // servers' code in). Peaks were 35 MiB on 2026-12-01 and 96 MiB on
    // 2026-12-07, when this bound (then 96 MiB) was first crossed, by
    // 92 KiB: raised to 112 MiB, and what grew between is for the soak's
    // memory figures (issue "Killed at any step … run for an hour").
    const PEAK_BOUND_KIB: u64 = 112 * 1024;
    let w = world().await;
    w.kube.set_pods(
        "demo-app",
        vec![fake_kube::pod("web-0", "demo-app", "Running", true, 0)],
    );
    // The rate cap would refuse a fifth of these, and the per-user cap on
    // calls running many of the rest (every client is root here): this run
    // measures the ways out, not the caps (tested on their own).
    let policies = common::policies_with(&[
        (
            "config/calls/data.yaml",
            "per_minute_per_user: 60\n",
            "per_minute_per_user: 100000\n",
        ),
        (
            "config/calls/data.yaml",
            "running_per_user: 4\n",
            "running_per_user: 8\n",
        ),
    ]);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64 | 1)
        .unwrap_or(0x9e37_79b9_7f4a_7c15);
    println!("stress seed {seed}");
    let served =
        tokio::task::block_in_place(|| Served::start_on(&w, "stress", "", policies.path()));
    let daemon_pid = served.child.id();
    let socket = served.socket.clone();
    let workspace = tempfile::tempdir().expect("workspace");
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = std::time::Instant::now();
    let tally = tokio::task::block_in_place(|| {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|n| {
                let (socket, ws, next) = (
                    socket.clone(),
                    workspace.path().to_path_buf(),
                    Arc::clone(&next),
                );
                std::thread::spawn(move || {
                    let mut rng = Rng(seed.wrapping_add(n.wrapping_mul(0x9e37_79b9)) | 1);
                    let mut client = Client::connect(&socket, &ws, &format!("stress-{n}"));
                    let mut t = BTreeMap::<&str, u64>::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if i >= CALLS {
                            break;
                        }
                        let ns = if rng.below(100) < 15 {
                            "kube-system"
                        } else {
                            "demo-app"
                        };
                        let id = client.call(ns);
                        let fate = rng.below(100);
                        let wait = std::time::Duration::from_millis(rng.below(2500));
                        if fate < 20 {
                            std::thread::sleep(wait);
                            client.send(
                                json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                "params": {"requestId": id, "reason": "stress"}}),
                            );
                            *t.entry("cancelled").or_default() += 1;
                        } else if fate < 30 {
                            std::thread::sleep(wait);
                            if fate < 25 {
                                let _ = client.relay.kill();
                                *t.entry("client killed").or_default() += 1;
                            } else {
                                drop(client.stdin.take());
                                *t.entry("stdin closed").or_default() += 1;
                            }
                            client = Client::connect(&socket, &ws, &format!("stress-{n}-{i}"));
                        } else {
                            let r = client
                                .reply(id, std::time::Duration::from_secs(180))
                                .unwrap_or_else(|| panic!("call {i}: no reply in 180 s"));
                            let status = r["result"]["structuredContent"]["status"]
                                .as_str()
                                .unwrap_or("error")
                                .to_string();
                            let key = match status.as_str() {
                                "completed" => "completed",
                                "denied" => "denied",
                                "refused" => "refused",
                                _ => "other",
                            };
                            assert_ne!(key, "other", "call {i}: {r}");
                            *t.entry(key).or_default() += 1;
                            if key == "refused" {
                                let why = r["result"]["structuredContent"]["reason"]
                                    .as_str()
                                    .unwrap_or_default();
                                // The only refusal expected here: the cap on
                                // calls running at once, while dropped calls
                                // are still being torn down.
                                assert!(
                                    why.contains("running, the most allowed at once"),
                                    "call {i}: {why}"
                                );
                            }
                        }
                    }
                    t
                })
            })
            .collect();
        let mut all = BTreeMap::<&str, u64>::new();
        for wk in workers {
            for (k, v) in wk.join().expect("worker") {
                *all.entry(k).or_default() += v;
            }
        }
        all
    });
    let ran_for = started.elapsed();
    // Everything settles: every lease revoked, in Vault and in the ledger.
    let ledger = gateway::broker::leases::LeaseLedger::in_home(&w.home).expect("ledger");
    let settled = tokio::task::block_in_place(|| {
        wait_until(std::time::Duration::from_secs(60), || {
            w.kube.with(|s| s.live("serviceaccounts").is_empty())
                && ledger.open_leases().is_ok_and(|o| o.is_empty())
        })
    });
    let log = std::fs::read_to_string(w.home.join("audit.jsonl")).expect("audit");
    let issued = log.matches("\"event\":\"credential.issued\"").count();
    let revoked = log.matches("\"event\":\"credential.revoked\"").count();
    if !settled {
        let open = ledger.open_leases().unwrap_or_default();
        let trails: Vec<_> = open
            .iter()
            .map(|l| (l.request_id.clone(), trail(&w.home, &l.request_id)))
            .collect();
        panic!(
            "{} lease(s) left in the ledger, {} service accounts; their calls: {trails:?}\n{}",
            open.len(),
            w.kube.with(|s| s.live("serviceaccounts").len()),
            served
                .log()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // OpenBao lists no lease under the role (an empty listing is exit 2
    // with `{}`; anything else, a refusal included, is a failure here)...
    let in_vault = w.bao.bao(&[
        "list",
        "-format=json",
        "sys/leases/lookup/kubernetes/creds/gateway-pod-reader-demo-app/",
    ]);
    let listing = String::from_utf8_lossy(&in_vault.stdout).trim().to_string();
    if in_vault.status.success() {
        let listed: Vec<String> = serde_json::from_str(&listing).expect("a lease list");
        panic!("OpenBao still holds {} lease(s): {listed:?}", listed.len());
    }
    assert!(
        in_vault.status.code() == Some(2) && listing == "{}" && in_vault.stderr.is_empty(),
        "listing OpenBao's leases failed: {listing} {}",
        String::from_utf8_lossy(&in_vault.stderr)
    );
    // ...and knows none of the leases the audit says were issued.
    let leases: Vec<String> = gateway::audit::read_events(&w.home.join("audit.jsonl"))
        .expect("audit")
        .into_iter()
        .filter(|e| e["event"] == "credential.issued")
        .filter_map(|e| e["data"]["lease_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(leases.len(), issued);
    for lease in &leases {
        let lookup = w.bao.bao(&["lease", "lookup", lease]);
        assert!(
            !lookup.status.success()
                && String::from_utf8_lossy(&lookup.stderr).contains("invalid lease"),
            "OpenBao still knows {lease}: {}{}",
            common::stdout(&lookup),
            common::stderr(&lookup)
        );
    }
    let peak = peak_rss_kib(daemon_pid);
    // Nothing of any sandbox is left, once the sandboxes of the calls
    // dropped last have been torn down (runsc removes a killed sandbox's
    // cgroups as its processes exit).
    let root = Path::new("/dev/shm/gateway-sandbox");
    let runsc = LocalSandbox::new(LocalConfig::default()).expect("runsc");
    let leftovers = || {
        let mut left = Vec::new();
        let list = Command::new(runsc.runsc())
            .arg("--root")
            .arg(root.join("state"))
            .args(["list", "-quiet"])
            .output()
            .expect("runsc list");
        left.extend(
            String::from_utf8_lossy(&list.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| format!("sandbox {l}")),
        );
        for dir in ["bundles", "scratch", "state"] {
            if let Ok(d) = std::fs::read_dir(root.join(dir)) {
                left.extend(d.flatten().map(|e| format!("{dir} {}", e.path().display())));
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        left.extend(
            mounts
                .lines()
                .filter(|l| l.contains("gateway-sandbox/scratch/"))
                .map(|l| format!("mount {l}")),
        );
        let ns = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip");
        left.extend(
            String::from_utf8_lossy(&ns.stdout)
                .lines()
                .filter(|l| l.starts_with("gw-"))
                .map(|l| format!("netns {l}")),
        );
        for controller in ["cpuacct", "memory", "cpu"] {
            let cg = Path::new("/sys/fs/cgroup").join(controller).join("gateway");
            if let Ok(d) = std::fs::read_dir(&cg) {
                left.extend(
                    d.flatten()
                        .filter(|e| e.path().is_dir())
                        .map(|e| format!("cgroup {}", e.path().display())),
                );
            }
        }
        left
    };
    let clean = tokio::task::block_in_place(|| {
        wait_until(std::time::Duration::from_secs(60), || {
            leftovers().is_empty()
        })
    });
    assert!(clean, "left behind: {:?}", leftovers());
    let report = gateway::audit::verify::verify_file(
        &w.home.join("audit.jsonl"),
        &[],
        gateway::audit::verify::HeadRule::Required,
    )
    .expect("verify");
    assert!(
        report.ok(),
        "the audit does not verify: {:?}",
        report.first_bad
    );
    println!(
        "stress: {CALLS} calls from {CLIENTS} clients in {:.1} s: {tally:?}; {issued} credentials issued, {revoked} revocations, 0 leases left (OpenBao, ledger, ServiceAccounts); 0 sandboxes, runsc state files, netns, cgroups, working dirs left; audit verified ({} events); daemon peak RSS {} MiB",
        ran_for.as_secs_f64(),
        report.verified,
        peak / 1024
    );
    assert_eq!(tally.values().sum::<u64>(), CALLS);
    assert!(
        tally.get("cancelled").copied().unwrap_or(0) > 0
            && tally.get("completed").copied().unwrap_or(0) > 0
    );
    assert!(
        peak > 0 && peak < PEAK_BOUND_KIB,
        "the daemon's peak RSS was {peak} KiB, over the {PEAK_BOUND_KIB} KiB bound"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_while_it_waits_for_a_lane_leaves_nothing_minted() {
    // The attack: start calls and cancel them at once, so that credential
    // requests pile up behind the lane's permits and are each minted (and
    // revoked) after their calls are gone, stalling everyone's minting.
    let w = world().await;
    // A slow API server: each mint takes seconds, so the lane's two
    // permits stay taken while the third call waits.
    w.kube
        .with(|s| s.request_latency = std::time::Duration::from_millis(300));
    let broker: Arc<dyn Broker> =
        Arc::new(VaultBroker::new(settings(&w.bao.addr, &w.gateway_token), &w.home).expect("b"));
    let audit =
        Arc::new(gateway::audit::AuditLog::open(w.dir.path().join("audit.jsonl")).expect("audit"));
    let scope = pod_reader();
    let mut minting = tokio::task::JoinSet::new();
    for i in 0..2 {
        let (b, a, sc) = (Arc::clone(&broker), Arc::clone(&audit), scope.clone());
        minting.spawn(async move {
            gateway::broker::issue_for_call(&b, &a, &format!("req-busy-{i}"), &sc).await
        });
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // The third waits for a permit, and its caller goes away.
    let cancelled = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        gateway::broker::issue_for_call(&broker, &audit, "req-cancelled", &scope),
    )
    .await;
    assert!(cancelled.is_err(), "it was still waiting for its turn");
    let mut leases = Vec::new();
    while let Some(r) = minting.join_next().await {
        leases.push(r.expect("join").expect("issued").lease_id);
    }
    // Long enough for a third mint, had one been queued, to be made.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let made = w.kube.with(|s| {
        s.created
            .iter()
            .filter(|(r, _)| r == "serviceaccounts")
            .count()
    });
    assert_eq!(made, 2, "only the calls still there got a credential");
    let log = std::fs::read_to_string(w.dir.path().join("audit.jsonl")).unwrap_or_default();
    assert!(!log.contains("req-cancelled"), "{log}");
    for l in &leases {
        broker.revoke(l).await.expect("revoked");
    }
}

/// OpenBao's Kubernetes secrets engine holds, through the cluster assets
/// (cluster/vault-rbac.yaml and the Roles `gateway vault cluster-roles`
/// makes), exactly what a credential needs: a ServiceAccount, its token,
/// and a RoleBinding to one of the provisioned credential Roles. Played
/// with its own token, as a compromised OpenBao would: it cannot write a
/// Role (no `escalate`, no `create roles`), nor bind a ClusterRole or a
/// Role that is not a credential role, nor act in a namespace it has no
/// binding in. Before the roles were provisioned, its ClusterRole held
/// `create` and `escalate` on roles: any rules at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_may_bind_the_provisioned_roles_and_nothing_wider() {
    let w = world().await;
    w.kube.with(|s| {
        s.put(
            "clusterroles",
            "",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "admin"},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        );
        // Another team's binding, and its Role, in the same namespace.
        s.put("rolebindings", "demo-app", group_binding("team-binding", "secrets-reader", "team"));
        s.put(
            "roles",
            "demo-app",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "secrets-reader", "namespace": "demo-app"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]}),
        );
    });
    let token_file = w.dir.path().join("openbao.jwt");
    std::fs::write(&token_file, &w.kube.openbao_jwt).expect("token");
    let kc = kubeconfig(&w, &token_file);
    let run = |args: &[&str]| {
        let out = kubectl(&kc, args);
        (
            out.status.success(),
            common::stdout(&out) + &common::stderr(&out),
        )
    };
    // What a credential needs.
    let (ok, said) = run(&[
        "-n",
        "demo-app",
        "create",
        "serviceaccount",
        "gw-cred-probe",
    ]);
    assert!(ok, "{said}");
    let (ok, said) = run(&[
        "-n",
        "demo-app",
        "create",
        "rolebinding",
        "gw-cred-probe",
        "--role=gateway-k8s-get-demo-app",
        "--serviceaccount=demo-app:gw-cred-probe",
    ]);
    assert!(ok, "a credential role may be bound: {said}");
    let (ok, said) = run(&["-n", "demo-app", "create", "token", "gw-cred-probe"]);
    assert!(ok, "its own account's token: {said}");
    // Nothing wider.
    let mut refusals = BTreeMap::new();
    for (args, what) in [
        (
            vec![
                "-n",
                "demo-app",
                "create",
                "role",
                "wide",
                "--verb=*",
                "--resource=secrets",
            ],
            "a Role of its own making",
        ),
        (
            vec![
                "-n",
                "demo-app",
                "create",
                "rolebinding",
                "probe-admin",
                "--clusterrole=admin",
                "--serviceaccount=demo-app:gw-cred-probe",
            ],
            "a ClusterRole",
        ),
        (
            vec![
                "-n",
                "demo-app",
                "create",
                "rolebinding",
                "probe-secrets",
                "--role=secrets-reader",
                "--serviceaccount=demo-app:gw-cred-probe",
            ],
            "a Role that is not a credential role",
        ),
        (
            vec!["-n", "kube-system", "create", "serviceaccount", "probe"],
            "a namespace it has no binding in",
        ),
        // What RBAC's `bind` allows and the admission policy does not: a
        // credential Role for everyone, or for another namespace's account.
        (
            vec![
                "-n",
                "demo-app",
                "create",
                "rolebinding",
                "everyone",
                "--role=gateway-k8s-get-demo-app",
                "--group=system:authenticated",
            ],
            "a credential Role bound to a group",
        ),
        (
            vec![
                "-n",
                "demo-app",
                "create",
                "rolebinding",
                "elsewhere",
                "--role=gateway-k8s-get-demo-app",
                "--serviceaccount=kube-system:default",
            ],
            "a credential Role bound to another namespace's account",
        ),
        (
            vec![
                "-n",
                "demo-app",
                "create",
                "rolebinding",
                "two",
                "--role=gateway-k8s-get-demo-app",
                "--serviceaccount=demo-app:gw-cred-probe",
                "--serviceaccount=demo-app:default",
            ],
            "a credential Role bound to two accounts",
        ),
        (
            vec!["-n", "demo-app", "delete", "rolebinding", "team-binding"],
            "another team's RoleBinding deleted",
        ),
        // An application's account is not a credential's: no binding of a
        // credential Role to it, no token for it, no account of another name.
        (
            vec![
                "-n",
                "demo-app",
                "create",
                "rolebinding",
                "default",
                "--role=gateway-k8s-get-demo-app",
                "--serviceaccount=demo-app:default",
            ],
            "a credential Role bound to an application's account",
        ),
        (
            vec!["-n", "demo-app", "create", "token", "default"],
            "a token for an application's account",
        ),
        (
            vec!["-n", "demo-app", "create", "serviceaccount", "probe"],
            "an account not named as a credential's",
        ),
    ] {
        let (ok, said) = run(&args);
        assert!(!ok && said.contains("forbidden"), "{what}: {said}");
        refusals.insert(what, said);
    }
    // The group binding was refused by the admission policy, in its words.
    let said = &refusals["a credential Role bound to a group"];
    assert!(
        said.contains("ValidatingAdmissionPolicy 'gateway-credential-bindings'")
            && said.contains("holds exactly that one ServiceAccount"),
        "{said}"
    );
    // And an application's account, by the accounts policy.
    let said = &refusals["a token for an application's account"];
    assert!(
        said.contains("ValidatingAdmissionPolicy 'gateway-credential-accounts'"),
        "{said}"
    );

    // The credential's own binding is the engine's to delete.
    let (ok, said) = run(&["-n", "demo-app", "delete", "rolebinding", "gw-cred-probe"]);
    assert!(ok, "{said}");
    assert!(
        w.kube.with(|s| !s.objects.contains_key(&(
            "roles".to_string(),
            "demo-app".to_string(),
            "wide".to_string()
        ))),
        "no Role was made"
    );
}

/// The drift check: `gateway vault cluster-roles --check`, as the operator
/// runs it with their own kubeconfig, passes on the cluster the assets
/// were applied to, and names each difference once the cluster drifts: a
/// credential Role widened by hand, the engine's binder binding deleted,
/// a labelled credential Role the policy data no longer has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drift_check_names_every_way_the_cluster_roles_differ_from_the_policy_data() {
    let w = world().await;
    let kc = w
        .kube
        .kubeconfig(w.dir.path(), &w.kube.admin_jwt, "demo-app");
    let check = || {
        let out = common::gateway(&w.home)
            .args(["vault", "cluster-roles", "--check"])
            .env("KUBECONFIG", &kc)
            .output()
            .expect("check");
        (
            out.status.code(),
            common::stdout(&out) + &common::stderr(&out),
        )
    };
    let (code, said) = check();
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("match the policy data (15 roles"), "{said}");
    w.kube.with(|s| {
        s.update("roles", "demo-app", "gateway-k8s-get-demo-app", |r| {
            r["rules"][0]["verbs"] = json!(["get", "list", "delete"]);
        });
        s.remove("rolebindings", "demo-app", "gateway-credential-binder");
        s.put(
            "roles",
            "demo-app",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "gateway-k8s-old-demo-app", "namespace": "demo-app",
                    "labels": {"gateway.dev/credential-role": "true"}},
                "rules": []}),
        );
        // What a compromised Vault may do with `bind`: hand a credential
        // Role to everyone, for good.
        s.put(
            "rolebindings",
            "demo-app",
            group_binding(
                "everyone",
                "gateway-k8s-get-demo-app",
                "system:authenticated",
            ),
        );
    });
    let (code, said) = check();
    assert_eq!(code, Some(1), "{said}");
    let drift: Vec<&str> = said.lines().filter(|l| l.starts_with("DRIFT ")).collect();
    assert_eq!(drift.len(), 4, "{said}");
    assert!(
        drift[3].contains("RoleBinding demo-app/everyone gives Role gateway-k8s-get-demo-app to")
            && drift[3].contains("system:authenticated"),
        "{said}"
    );
    assert!(
        drift[0].contains("Role demo-app/gateway-k8s-get-demo-app has other rules")
            && drift[0].contains("delete"),
        "{said}"
    );
    assert!(
        drift[1].contains("RoleBinding demo-app/gateway-credential-binder is missing"),
        "{said}"
    );
    assert!(
        drift[2].contains("Role demo-app/gateway-k8s-old-demo-app is labelled"),
        "{said}"
    );
}

/// A RoleBinding in demo-app of Role `role` to group `group`.
fn group_binding(name: &str, role: &str, group: &str) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": "demo-app"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "Group", "name": group, "apiGroup": "rbac.authorization.k8s.io"}]})
}
