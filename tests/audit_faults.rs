//! Nothing runs unrecorded: when the audit log cannot be written (a full
//! disk, a read-only filesystem) calls are refused before anything runs,
//! and a call whose log fills up mid-way ends in an error, never in a
//! result the log does not hold, with its credential revoked. The gateway's
//! home is a real tiny filesystem (a 1 MiB tmpfs; the test needs root to
//! mount it, as CI has). The sandbox is the scripted fake
//! (tests/support/scripted_sandbox.rs), the broker the recording double.

mod common;
#[path = "support/fake_broker.rs"]
mod fake_broker;
#[path = "support/scripted_sandbox.rs"]
mod scripted_sandbox;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gateway::pipeline::{Pipeline, ToolCall};
use gateway::policy::Principal;
use scripted_sandbox::{Phase, ScriptedSandbox};
use serde_json::json;

const MODULE: &str = "terraform/offline-demo";

/// A tmpfs of `size` mounted on a new dir; unmounted when dropped.
struct TinyFs {
    dir: tempfile::TempDir,
}

impl TinyFs {
    fn new(size: &str) -> TinyFs {
        let dir = tempfile::tempdir().expect("dir");
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(
            ok.success(),
            "mounting a tmpfs needs root (CI runs as root)"
        );
        TinyFs { dir }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    /// Write zeros until the filesystem is full.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let p = self.path().join("filler");
        let mut f = std::fs::File::create(&p).expect("filler");
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.write_all(&[0]);
        p
    }
}

/// `file` made read-only where it is (a read-only bind mount of itself,
/// so that files open elsewhere on its filesystem do not matter); undone
/// when dropped.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn new(file: &Path) -> ReadOnly {
        for args in [
            vec!["--bind".to_string()],
            vec!["-o".to_string(), "remount,bind,ro".to_string()],
        ] {
            let ok = std::process::Command::new("mount")
                .args(&args)
                .arg(file)
                .arg(file)
                .status()
                .expect("mount");
            assert!(ok.success(), "mount {args:?}");
        }
        ReadOnly(file.to_path_buf())
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

struct World {
    fs: TinyFs,
    _dirs: Vec<tempfile::TempDir>,
    sandbox: Arc<ScriptedSandbox>,
    broker: Arc<fake_broker::FakeBroker>,
    pipeline: std::sync::Arc<Pipeline>,
}

fn world() -> World {
    let fs = TinyFs::new("1m");
    let home = fs.path().join("home");
    std::fs::create_dir(&home).expect("home");
    let policies = common::policies_with(&[]);
    fake_broker::give_the_offline_module_a_credential(policies.path());
    let (workspace, _module) = common::workspace_with_module(MODULE);
    let sandbox = Arc::new(scripted_sandbox::demo_script("create", Vec::new()));
    let (_, mut pipeline) =
        scripted_sandbox::pipeline(policies.path(), &home, workspace.path(), sandbox.clone());
    fake_broker::reach_a_stand_in_api_server(&mut pipeline);
    let broker = Arc::new(fake_broker::FakeBroker::default());
    pipeline.broker = Some(broker.clone());
    World {
        fs,
        _dirs: vec![policies, workspace],
        sandbox,
        broker,
        pipeline: Arc::new(pipeline),
    }
}

fn plan_call() -> ToolCall {
    ToolCall {
        trace: None,
        tool: "terraform_plan".into(),
        params: json!({"working_dir": MODULE}),
        principal: Principal::os_user("test-agent".into(), "alice".into(), 1000, vec![]),
        workspace: None,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt")
}

#[test]
fn a_full_or_read_only_audit_disk_refuses_calls_before_anything_runs() {
    let w = world();
    let rt = rt();
    // It works while there is room.
    let ok = rt
        .block_on(w.pipeline.call(plan_call()))
        .expect("a call with room");
    assert!(
        matches!(
            ok.outcome,
            gateway::pipeline::Outcome::Completed { ok: true, .. }
        ),
        "{:?}",
        ok.outcome
    );
    let ran = w.sandbox.seen().len();
    assert!(ran >= 2, "plan and show ran");
    let issued = w.broker.issued.lock().expect("lock").len();

    // Disk full: refused, nothing run, no credential minted.
    let filler = w.fs.fill();
    let err = rt
        .block_on(w.pipeline.call(plan_call()))
        .expect_err("refused with a full disk");
    assert!(
        err.to_string().contains("audit log") && err.to_string().contains("No space left"),
        "{err}"
    );
    assert_eq!(w.sandbox.seen().len(), ran, "no sandbox ran");
    assert_eq!(
        w.broker.issued.lock().expect("lock").len(),
        issued,
        "no credential"
    );

    // Read-only: the same.
    std::fs::remove_file(&filler).expect("rm filler");
    let ro = ReadOnly::new(w.pipeline.audit.path());
    let err = rt
        .block_on(w.pipeline.call(plan_call()))
        .expect_err("refused on a read-only disk");
    assert!(err.to_string().contains("Read-only file system"), "{err}");
    assert_eq!(w.sandbox.seen().len(), ran, "no sandbox ran");
    drop(ro);

    // Room again: calls run, and the log still verifies (a line cut by the
    // full disk is ended and recorded by the next writer).
    let again = rt
        .block_on(w.pipeline.call(plan_call()))
        .expect("room again");
    assert!(matches!(
        again.outcome,
        gateway::pipeline::Outcome::Completed { .. }
    ));
    let report = gateway::audit::verify::verify_file(
        w.pipeline.audit.path(),
        &[],
        gateway::audit::verify::HeadRule::Required,
    )
    .expect("verify");
    assert!(
        report.ok(),
        "{report:?}\n{}",
        std::fs::read_to_string(w.pipeline.audit.path()).unwrap_or_default()
    );
}

#[test]
fn a_disk_that_fills_mid_call_ends_it_in_an_error_with_its_credential_revoked() {
    let w = world();
    let rt = rt();
    let root = w.fs.path().to_path_buf();
    // The disk fills while the plan's sandbox (which holds the credential) runs.
    *w.sandbox.on_run.lock().expect("hook") = Some(Box::new(move |phase| {
        if phase == Phase::Plan {
            use std::io::Write;
            let mut f = std::fs::File::create(root.join("filler")).expect("filler");
            let chunk = vec![0u8; 4096];
            while f.write_all(&chunk).is_ok() {}
        }
    }));
    let err = rt
        .block_on(w.pipeline.call(plan_call()))
        .expect_err("the call cannot end in a result the log does not hold");
    assert!(err.to_string().contains("No space left"), "{err}");
    let issued = w.broker.issued.lock().expect("lock").len();
    assert_eq!(issued, 1, "the plan's credential was minted");
    assert!(
        w.broker.live.lock().expect("lock").is_empty(),
        "and revoked: {:?}",
        w.broker.live.lock().expect("lock")
    );
    assert_eq!(
        w.sandbox.phases(),
        vec![Phase::Plan],
        "nothing ran after the log failed"
    );
}
