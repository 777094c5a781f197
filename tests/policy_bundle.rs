//! Signed policy bundles (OPA's format): what the gateway signs verifies
//! under OPA's own code and what OPA's code signs loads in the gateway; the
//! daemon loads only a bundle whose signature and digests verify, so a
//! half-written, tampered or foreign-signed one never becomes the policy
//! (red-team finding: a half-written policy file that stayed unchanged for
//! a second was loaded from a policy dir).

mod common;
#[path = "support/daemon.rs"]
mod daemon;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gateway::policy::bundle;

fn python() -> PathBuf {
    let p = common::repo().join(".tools/venv/bin/python");
    assert!(
        p.is_file(),
        "OPA's engine is installed by scripts/install-tools.sh opa"
    );
    p
}

fn key(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    for args in [
        vec![
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
        ],
        vec!["pkey", "-pubout", "-in"],
    ] {
        let mut c = Command::new("openssl");
        c.args(&args);
        if args[0] == "genpkey" {
            c.arg(&private);
        } else {
            c.arg(&private).arg("-out").arg(&public);
        }
        let out = c.output().expect("openssl");
        assert!(out.status.success(), "{}", common::stderr(&out));
    }
    (private, public)
}

/// `gateway policy build` of `dir`, signed with `key` as `key_id`.
fn build(dir: &Path, out: &Path, key: &Path, key_id: &str) {
    let o = common::gateway(&out.with_extension("home"))
        .args(["policy", "build"])
        .arg(dir)
        .arg("-o")
        .arg(out)
        .arg("--signing-key")
        .arg(key)
        .args(["--key-id", key_id])
        .output()
        .expect("build");
    assert!(o.status.success(), "{}", common::stderr(&o));
}

#[test]
fn gateway_bundles_verify_under_opas_code_and_opa_signed_ones_load() {
    let dir = tempfile::tempdir().expect("dir");
    let (private, public) = key(dir.path(), "team");
    let ours = dir.path().join("ours.tar.gz");
    build(
        &common::repo().join("policies"),
        &ours,
        &private,
        "team-key",
    );
    let out = Command::new(python())
        .arg(common::repo().join("tests/opa/bundle_check.py"))
        .arg("check")
        .arg(&ours)
        .arg(&public)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}{}",
        common::stdout(&out),
        common::stderr(&out)
    );
    println!("{}", common::stdout(&out).trim());

    // A bundle laid out and signed by OPA's code loads in the gateway.
    let theirs = dir.path().join("opa.tar.gz");
    let out = Command::new(python())
        .arg(common::repo().join("tests/opa/bundle_check.py"))
        .arg("make")
        .arg(&theirs)
        .arg(common::repo().join("policies"))
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", common::stderr(&out));
    let their_key = PathBuf::from(common::stdout(&out).trim());
    let verify = |public: &Path, id: &str| {
        common::gateway(&dir.path().join("home"))
            .args(["policy", "verify"])
            .arg(&theirs)
            .arg("--public-key")
            .arg(public)
            .args(["--key-id", id])
            .output()
            .expect("verify")
    };
    let o = verify(&their_key, "opa-key");
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(
        common::stdout(&o).contains("revision made-by-opa-code"),
        "{}",
        common::stdout(&o)
    );
    // Not with another key, nor under another key id.
    let o = verify(&public, "opa-key");
    assert!(!o.status.success() && common::stderr(&o).contains("does not verify"));
    let o = verify(&their_key, "team-key");
    assert!(
        !o.status.success() && common::stderr(&o).contains("not one of the daemon's bundle keys")
    );
}

/// The policy events the daemon has audited so far.
fn policy_events(d: &daemon::Daemon) -> Vec<serde_json::Value> {
    d.events()
        .into_iter()
        .filter(|e| {
            e["event"]
                .as_str()
                .is_some_and(|n| n.starts_with("policy."))
                && e["event"] != "policy.decision"
        })
        .collect()
}

/// Wait for the `n`th policy event after the first `before`.
fn next_policy_event(d: &daemon::Daemon, before: usize) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let evs = policy_events(d);
        if evs.len() > before {
            return evs[before].clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no policy event after {before}: {evs:#?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn put(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[test]
fn the_daemon_loads_only_a_bundle_whose_signature_and_digests_verify() {
    let keys = tempfile::tempdir().expect("keys");
    let (private, public) = key(keys.path(), "team");
    let (stranger, _) = key(keys.path(), "stranger");
    let served = tempfile::tempdir().expect("served");
    let path = served.path().join("policy.tar.gz");
    build(
        &common::repo().join("policies"),
        &path,
        &private,
        "team-key",
    );
    let extra = format!(
        "[policy_bundle]\nsource = {:?}\npoll_seconds = 1\n[[policy_bundle.keys]]\nid = \"team-key\"\nalgorithm = \"ES256\"\npublic_key = {:?}\n",
        path, public
    );
    let d = daemon::Daemon::start(&common::repo().join("policies"), &extra);
    let first = next_policy_event(&d, 0);
    assert_eq!(first["event"], "policy.loaded", "{first:#}");
    let mut seen = 1;
    let good = std::fs::read(&path).expect("bundle");

    // 1. Half a bundle written in place, left unchanged for longer than
    // two polls: refused, the loaded set stays.
    std::fs::write(&path, &good[..good.len() / 2]).expect("half");
    let ev = next_policy_event(&d, seen);
    seen += 1;
    assert_eq!(ev["event"], "policy.reload_failed", "{ev:#}");
    assert!(
        ev["data"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("gzipped tar"),
        "{ev:#}"
    );
    assert_eq!(ev["data"]["active"], first["data"]["fingerprint"]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        policy_events(&d).len(),
        seen,
        "a half bundle that stays put is still not loaded"
    );

    // 2. A module changed after signing (the approvals rule waived).
    let mut files = bundle::unpack(&good).expect("unpack");
    let f = files
        .iter_mut()
        .find(|f| f.name == "approvals.rego")
        .expect("approvals.rego");
    let text = String::from_utf8(f.bytes.clone()).expect("utf8");
    f.bytes = format!("{text}\n# waived\n").into_bytes();
    put(&path, &bundle::pack(&files).expect("pack"));
    let ev = next_policy_event(&d, seen);
    seen += 1;
    assert_eq!(ev["event"], "policy.reload_failed", "{ev:#}");
    assert!(
        ev["data"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("approvals.rego: digest mismatch"),
        "{ev:#}"
    );

    // 3. A file added that the signature does not list.
    let mut files = bundle::unpack(&good).expect("unpack");
    files.push(bundle::BundleFile {
        name: "zz.rego".into(),
        bytes: b"package gateway.zz\n".to_vec(),
    });
    put(&path, &bundle::pack(&files).expect("pack"));
    let ev = next_policy_event(&d, seen);
    seen += 1;
    assert!(
        ev["data"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("zz.rego is in the bundle but not in its signature"),
        "{ev:#}"
    );

    // 4. Signed, but with a key the daemon does not have; and unsigned.
    let other = served.path().join("other.tar.gz");
    build(
        &common::repo().join("policies"),
        &other,
        &stranger,
        "team-key",
    );
    put(&path, &std::fs::read(&other).expect("other"));
    let ev = next_policy_event(&d, seen);
    seen += 1;
    assert!(
        ev["data"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("does not verify"),
        "{ev:#}"
    );
    let unsigned: Vec<_> = bundle::unpack(&good)
        .expect("unpack")
        .into_iter()
        .filter(|f| f.name != bundle::SIGNATURES)
        .collect();
    put(&path, &bundle::pack(&unsigned).expect("pack"));
    let ev = next_policy_event(&d, seen);
    seen += 1;
    assert!(
        ev["data"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("only signed bundles"),
        "{ev:#}"
    );

    // 5. A new set, properly signed: loaded.
    let edited = tempfile::tempdir().expect("edited");
    common::copy_dir(&common::repo().join("policies"), edited.path());
    let catalog = edited.path().join("config/tools/data.yaml");
    let text = std::fs::read_to_string(&catalog).expect("catalog");
    std::fs::write(&catalog, format!("{text}\n# a reviewed change\n")).expect("edit");
    let next = served.path().join("next.tar.gz");
    build(edited.path(), &next, &private, "team-key");
    put(&path, &std::fs::read(&next).expect("next"));
    let ev = next_policy_event(&d, seen);
    assert_eq!(ev["event"], "policy.reloaded", "{ev:#}");
    let verify = common::gateway(&d.home)
        .args(["audit", "verify"])
        .output()
        .expect("verify");
    assert!(verify.status.success(), "{}", common::stdout(&verify));
}
