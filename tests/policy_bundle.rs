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

    // YAML data, even signed, is refused: its digest is taken over a JSON
    // form it does not map onto exactly (`{7: x}` and `{"7": x}` hash the
    // same and load differently).
    let mut files = bundle::unpack(&std::fs::read(&ours).expect("ours")).expect("unpack");
    files.push(bundle::BundleFile {
        name: "config/extra/data.yaml".into(),
        bytes: b"7: evil\n".to_vec(),
    });
    let key =
        bundle::SigningKey::from_pem("team-key", "ES256", &std::fs::read(&private).expect("key"))
            .expect("key");
    let yaml = dir.path().join("yaml.tar.gz");
    std::fs::write(
        &yaml,
        bundle::pack(&bundle::sign(&files, &key).expect("sign")).expect("pack"),
    )
    .expect("write");
    let o = common::gateway(&dir.path().join("home"))
        .args(["policy", "verify"])
        .arg(&yaml)
        .arg("--public-key")
        .arg(&public)
        .args(["--key-id", "team-key"])
        .output()
        .expect("verify");
    assert!(
        !o.status.success() && common::stderr(&o).contains("YAML data is not accepted in a bundle"),
        "{}",
        common::stderr(&o)
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

/// The next policy event is a refused reload saying `why`.
fn refused(d: &daemon::Daemon, seen: &mut usize, why: &str) -> serde_json::Value {
    let ev = next_policy_event(d, *seen);
    *seen += 1;
    assert_eq!(ev["event"], "policy.reload_failed", "{ev:#}");
    assert!(
        ev["data"]["error"].as_str().unwrap_or("").contains(why),
        "not {why:?}: {ev:#}"
    );
    ev
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
    assert_eq!(first["data"]["signed"]["key_id"], "team-key", "{first:#}");
    let mut seen = 1;
    let good = std::fs::read(&path).expect("bundle");

    // 1. Half a bundle written in place, left unchanged for longer than
    // two polls: refused, the loaded set stays.
    std::fs::write(&path, &good[..good.len() / 2]).expect("half");
    let ev = refused(&d, &mut seen, "gzipped tar");
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
    refused(&d, &mut seen, "approvals.rego: digest mismatch");

    // 3. A file added that the signature does not list.
    let mut files = bundle::unpack(&good).expect("unpack");
    files.push(bundle::BundleFile {
        name: "zz.rego".into(),
        bytes: b"package gateway.zz\n".to_vec(),
    });
    put(&path, &bundle::pack(&files).expect("pack"));
    refused(
        &d,
        &mut seen,
        "zz.rego is in the bundle but not in its signature",
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
    refused(&d, &mut seen, "does not verify");
    let unsigned: Vec<_> = bundle::unpack(&good)
        .expect("unpack")
        .into_iter()
        .filter(|f| f.name != bundle::SIGNATURES)
        .collect();
    put(&path, &bundle::pack(&unsigned).expect("pack"));
    refused(&d, &mut seen, "only signed bundles");

    // 5. A new set, properly signed: loaded. Then the bundle it replaced,
    // put back: signed before it, a rollback, refused.
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
    assert_eq!(ev["data"]["signed"]["key_id"], "team-key", "{ev:#}");
    assert!(
        ev["data"]["signed"]["revision"]
            .as_str()
            .is_some_and(|r| r.len() == 64),
        "{ev:#}"
    );
    seen += 1;
    put(&path, &good);
    refused(&d, &mut seen, "an older policy put back is refused");
    d.assert_audit_verifies();
}

/// Python's HTTPS file server on a free loopback port, serving `dir`.
struct HttpsServer {
    child: std::process::Child,
    port: u16,
}

impl HttpsServer {
    fn start(dir: &Path, cert: &Path, key: &Path) -> HttpsServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("port")
            .local_addr()
            .expect("addr")
            .port();
        let script = "import http.server, ssl, sys, functools\n\
            h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\n\
            s = http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[2])), h)\n\
            c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n\
            c.load_cert_chain(sys.argv[3], sys.argv[4])\n\
            s.socket = c.wrap_socket(s.socket, server_side=True)\n\
            s.serve_forever()\n";
        let child = Command::new("python3")
            .args(["-c", script])
            .arg(dir)
            .arg(port.to_string())
            .arg(cert)
            .arg(key)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python https server");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the HTTPS server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        HttpsServer { child, port }
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_daemon_polls_a_bundle_over_https_and_refuses_plain_http() {
    let keys = tempfile::tempdir().expect("keys");
    let (private, public) = key(keys.path(), "team");
    let (ca, cert, tls_key) = common::tls_files(keys.path());
    let served = tempfile::tempdir().expect("served");
    let path = served.path().join("policy.tar.gz");
    build(
        &common::repo().join("policies"),
        &path,
        &private,
        "team-key",
    );
    let server = HttpsServer::start(served.path(), &cert, &tls_key);
    let config = |source: &str, ca: Option<&Path>| {
        format!(
            "[policy_bundle]\nsource = {source:?}\npoll_seconds = 1\n{}[[policy_bundle.keys]]\nid = \"team-key\"\nalgorithm = \"ES256\"\npublic_key = {public:?}\n",
            ca.map(|c| format!("ca_file = {c:?}\n")).unwrap_or_default()
        )
    };
    // Plain HTTP is refused at start: the network could replay an older
    // signed bundle.
    let (dir, cfg) = daemon::Daemon::layout(
        &common::repo().join("policies"),
        &config(
            &format!("http://127.0.0.1:{}/policy.tar.gz", server.port),
            None,
        ),
    );
    let out = daemon::Daemon::command(dir.path(), &cfg)
        .output()
        .expect("daemon");
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("only a file path or an https:// URL"),
        "{}",
        common::stderr(&out)
    );

    // Without the CA the server is not trusted: nothing loads, every call
    // would be denied.
    let url = format!("https://127.0.0.1:{}/policy.tar.gz", server.port);
    let untrusted = daemon::Daemon::start(&common::repo().join("policies"), &config(&url, None));
    let ev = next_policy_event(&untrusted, 0);
    assert_eq!(ev["event"], "policy.load_failed", "{ev:#}");
    drop(untrusted);

    // With it: loaded, then a tampered bundle on the server is refused.
    let d = daemon::Daemon::start(&common::repo().join("policies"), &config(&url, Some(&ca)));
    let ev = next_policy_event(&d, 0);
    assert_eq!(ev["event"], "policy.loaded", "{ev:#}\n{}", d.log());
    let mut files = bundle::unpack(&std::fs::read(&path).expect("bundle")).expect("unpack");
    let f = files
        .iter_mut()
        .find(|f| f.name == "calls.rego")
        .expect("calls.rego");
    f.bytes.extend_from_slice(b"\n# edited on the server\n");
    put(&path, &bundle::pack(&files).expect("pack"));
    refused(&d, &mut 1, "calls.rego: digest mismatch");
}
