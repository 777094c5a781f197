//! Replicas of one gateway sharing approvals and plans in PostgreSQL
//! (`[store] backend = "postgres"`): real `gateway daemon` processes (as
//! root, real gVisor, real Terraform) on one real PostgreSQL server
//! (tests/support/postgres.rs), each with its own socket and home; the
//! agent and the approver are unprivileged OS users.
//!
//! - An apply asked for on replica A is listed and granted through
//!   replica B, seen granted from A, and applied through B (which never
//!   planned it: the plan comes from the database).
//! - 32 agents spend one granted approval at once through three replicas:
//!   exactly one apply runs.

#[path = "support/agent.rs"]
mod agent;
mod common;
#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/postgres.rs"]
mod pg;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent::Agent;
use daemon::{AGENT, APPROVER, Daemon};
use serde_json::{Value, json};

const MODULE: &str = "terraform/offline-demo";

fn gateway() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gateway"))
}

/// The `[store]` section naming `conninfo`, through a root-only file.
fn store_section(dir: &Path, conninfo: &str) -> String {
    let file = dir.join("postgres.url");
    std::fs::write(&file, format!("{conninfo}\n")).expect("url file");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    format!("[store]\nbackend = \"postgres\"\nurl_file = {file:?}\n")
}

fn replicas(n: usize, policies: &Path, store: &str) -> Vec<Daemon> {
    (0..n).map(|_| Daemon::start(policies, store)).collect()
}

/// `gateway <args>` as `user` through replica `d`'s socket.
fn cli(d: &Daemon, user: &str, home: &Path, args: &[&str]) -> std::process::Output {
    let out = daemon::as_user(user, home, &[("GATEWAY_SOCKET", &d.socket)], &gateway())
        .args(args)
        .output()
        .expect("gateway");
    if !out.status.success() {
        eprintln!("gateway {args:?} failed; the daemon's log:\n{}", d.log());
    }
    out
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        common::stdout(out),
        common::stderr(out)
    );
    common::stdout(out)
}

/// An apply asked for through `d`: the pending approval's id.
fn asked(d: &Daemon, workspace: &Path, home: &Path) -> String {
    let mut a = Agent::start(d, workspace, home);
    a.apply(1, json!({"working_dir": MODULE}));
    let r = a.wait(|v| v["id"] == 1, Duration::from_secs(600));
    let sc = &r["result"]["structuredContent"];
    assert_eq!(sc["status"], "pending_approval", "{r}");
    sc["approval_id"].as_str().expect("id").to_string()
}

/// Every replica writes to one chain in the database: read once.
fn spent_events(ds: &[Daemon], id: &str) -> usize {
    ds[0]
        .events()
        .into_iter()
        .filter(|e| e["event"] == "approval.spent" && e["data"]["approval_id"] == id)
        .count()
}

#[test]
fn any_replica_shows_grants_and_applies_what_another_was_asked_and_one_approval_is_spent_once() {
    let server = pg::Postgres::start();
    let conninfo = server.database("gateway");
    let secrets = tempfile::tempdir().expect("dir");
    let store = store_section(secrets.path(), &conninfo);
    // Enough room per replica for every agent below to reach the spend.
    let policies = common::policies_with(&[
        (
            "config/calls/data.yaml",
            "running_per_user: 4",
            "running_per_user: 32",
        ),
        (
            "config/calls/data.yaml",
            "running_total: 8",
            "running_total: 32",
        ),
    ]);
    let ds = replicas(3, policies.path(), &store);
    let (a, b, c) = (&ds[0], &ds[1], &ds[2]);
    let workspace = daemon::demo_workspace(AGENT);
    let agent_home = daemon::owned_dir(AGENT);
    let approver_home = daemon::owned_dir(APPROVER);

    // Asked on A.
    let id = asked(a, workspace.path(), agent_home.path());
    // Listed and granted through B.
    let listed = ok(&cli(b, APPROVER, approver_home.path(), &["approvals"]));
    assert!(listed.contains(&id), "B lists A's approval: {listed}");
    ok(&cli(
        b,
        APPROVER,
        approver_home.path(),
        &["approve", &id, "--reason", "reviewed on B"],
    ));
    // Seen granted from C.
    let shown: Value = serde_json::from_str(&ok(&cli(
        c,
        AGENT,
        agent_home.path(),
        &["approvals", "show", &id, "--json"],
    )))
    .expect("json");
    assert_eq!(shown["state"], "approved", "{shown}");
    // Applied through B, which never made the plan.
    assert!(
        !b.home
            .join("plans")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some()),
        "B holds no plan of its own before the apply"
    );
    let mut on_b = Agent::start(b, workspace.path(), agent_home.path());
    on_b.apply(2, json!({"working_dir": MODULE, "approval_id": id}));
    let r = on_b.wait(|v| v["id"] == 2, Duration::from_secs(600));
    assert_eq!(
        r["result"]["structuredContent"]["status"], "completed",
        "{r}"
    );
    assert_eq!(spent_events(&ds, &id), 1);
    // Spent on B: A does not spend it again.
    let mut on_a = Agent::start(a, workspace.path(), agent_home.path());
    on_a.apply(3, json!({"working_dir": MODULE, "approval_id": id}));
    let again = on_a.wait(|v| v["id"] == 3, Duration::from_secs(120));
    assert_ne!(
        again["result"]["structuredContent"]["status"], "pending_approval",
        "{again}"
    );
    assert_eq!(spent_events(&ds, &id), 1, "{again}");

    // A new change, planned and granted; then 32 agents at once, spread
    // over the three replicas, each spending the same approval.
    std::fs::write(
        workspace.path().join(MODULE).join("more.tf"),
        "resource \"terraform_data\" \"more\" {\n  input = \"replicas\"\n}\n",
    )
    .expect("more.tf");
    daemon::chown_tree(workspace.path(), AGENT);
    let id = asked(c, workspace.path(), agent_home.path());
    ok(&cli(
        a,
        APPROVER,
        approver_home.path(),
        &["approve", &id, "--reason", "reviewed"],
    ));
    let mut agents: Vec<Agent> = (0..32)
        .map(|i| Agent::start(&ds[i % 3], workspace.path(), agent_home.path()))
        .collect();
    for (i, a) in agents.iter_mut().enumerate() {
        a.apply(
            100 + i as u64,
            json!({"working_dir": MODULE, "approval_id": id}),
        );
    }
    let answers: Vec<Value> = agents
        .iter()
        .enumerate()
        .map(|(i, a)| a.wait(|v| v["id"] == 100 + i as u64, Duration::from_secs(600)))
        .collect();
    let completed = answers
        .iter()
        .filter(|r| r["result"]["structuredContent"]["status"] == "completed")
        .count();
    assert_eq!(
        spent_events(&ds, &id),
        1,
        "exactly one replica spent it: {answers:#?}"
    );
    assert!(
        completed >= 1,
        "the one that spent it applied: {answers:#?}"
    );
    // State written back by two requests only: the apply through B, and
    // this one.
    let applies: std::collections::BTreeSet<String> = ds[0]
        .events()
        .into_iter()
        .filter(|e| e["event"] == "state.saved")
        .filter_map(|e| e["request_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        applies.len(),
        2,
        "one apply ran for the 32 spenders: {applies:?}"
    );
    let state = std::fs::read_to_string(workspace.path().join(MODULE).join("terraform.tfstate"))
        .expect("state");
    assert!(state.contains("replicas"), "the new resource is applied");
    // One chain holds what every replica recorded: the approval asked for
    // on C, granted through A and spent by an agent of any of the three.
    let events = a.events();
    let of = |name: &str| {
        events
            .iter()
            .filter(|e| e["event"] == name && e["data"]["approval_id"] == id.as_str())
            .count()
    };
    assert_eq!(
        (
            of("approval.requested"),
            of("approval.granted"),
            of("approval.spent")
        ),
        (1, 1, 1)
    );
    for d in &ds {
        d.assert_audit_verifies();
    }
    // Its export is the file a single host keeps, checked by the same
    // command with no database.
    let export = secrets.path().join("export.jsonl");
    let out = std::process::Command::new(gateway())
        .arg("--config")
        .arg(&a.config)
        .args(["audit", "export", "--out"])
        .arg(&export)
        .output()
        .expect("export");
    ok(&out);
    let verify = std::process::Command::new(gateway())
        .arg("--home")
        .arg(secrets.path())
        .args(["audit", "verify", "--file"])
        .arg(&export)
        .output()
        .expect("verify");
    let said = ok(&verify);
    assert!(
        said.contains(&format!("ok: {} events verified", events.len())),
        "{said}"
    );
}

/// PostgreSQL killed under a running replica: an apply asked for then is
/// refused with the database's reason and leaves no approval; once the
/// server is back the same replica serves again, without a restart. A
/// granted approval whose apply is refused while the database is away is
/// not burned: it applies once the database is back.
#[test]
fn while_the_database_is_away_nothing_is_asked_and_the_replica_resumes_when_it_is_back() {
    let mut server = pg::Postgres::start();
    let conninfo = server.database("gateway");
    let secrets = tempfile::tempdir().expect("dir");
    let store = store_section(secrets.path(), &conninfo);
    let policies = common::policies_with(&[]);
    let mut d = Daemon::start(policies.path(), &store);
    let workspace = daemon::demo_workspace(AGENT);
    let agent_home = daemon::owned_dir(AGENT);
    let approver_home = daemon::owned_dir(APPROVER);

    // A session opened before the database goes: its call is refused,
    // with the reason, since not even its request can be audited.
    let mut a = Agent::start(&d, workspace.path(), agent_home.path());
    server.kill();
    a.apply(1, json!({"working_dir": MODULE}));
    let r = a.wait(|v| v["id"] == 1, Duration::from_secs(600));
    assert_ne!(
        r["result"]["structuredContent"]["status"], "pending_approval",
        "nothing is asked for without the database: {r}"
    );
    assert!(
        r.to_string()
            .contains("the team's audit chain (its database)"),
        "the refusal names the database: {r}"
    );
    // A new session is refused at once (its opening cannot be audited),
    // and `gateway serve` says why.
    let refused = daemon::as_user(
        AGENT,
        agent_home.path(),
        &[("GATEWAY_SOCKET", &d.socket)],
        &gateway(),
    )
    .arg("serve")
    .arg("--workspace")
    .arg(workspace.path())
    .stdin(std::process::Stdio::null())
    .output()
    .expect("serve");
    assert!(!refused.status.success());
    let said = common::stderr(&refused);
    assert!(
        said.contains("the audit log cannot be written")
            && said.contains("audit chain (its database)"),
        "{said}"
    );
    let out = cli(&d, APPROVER, approver_home.path(), &["approvals"]);
    assert!(
        !out.status.success(),
        "approvals cannot be listed: {}",
        common::stdout(&out)
    );

    server.run();
    let id = asked(&d, workspace.path(), agent_home.path());
    let listed = ok(&cli(&d, APPROVER, approver_home.path(), &["approvals"]));
    assert!(listed.contains(&id), "{listed}");
    ok(&cli(
        &d,
        APPROVER,
        approver_home.path(),
        &["approve", &id, "--reason", "reviewed"],
    ));

    // Granted, then the database goes: the apply is refused and nothing
    // is spent; back, the same approval applies.
    let mut a = Agent::start(&d, workspace.path(), agent_home.path());
    server.kill();
    a.apply(2, json!({"working_dir": MODULE, "approval_id": id}));
    let r = a.wait(|v| v["id"] == 2, Duration::from_secs(600));
    assert_ne!(
        r["result"]["structuredContent"]["status"], "completed",
        "nothing applies without the database: {r}"
    );
    assert!(
        !workspace
            .path()
            .join(MODULE)
            .join("terraform.tfstate")
            .exists(),
        "no state was written"
    );
    server.run();
    a.apply(3, json!({"working_dir": MODULE, "approval_id": id}));
    let r = a.wait(|v| v["id"] == 3, Duration::from_secs(600));
    assert_eq!(
        r["result"]["structuredContent"]["status"], "completed",
        "the approval was not burned by the outage: {r}"
    );
    d.assert_audit_verifies();
    // And it stops cleanly (its database clients closed off the runtime).
    let st = d.terminate(Duration::from_secs(30));
    assert!(st.is_some_and(|s| s.success()), "{st:?}: {}", d.log());
}

/// One call of `tool` through the replica at `socket`, in a session of its
/// own: its result, or why there was none (the replica gone or stopping).
fn one_call(
    socket: &Path,
    workspace: &Path,
    home: &Path,
    tool: &str,
    args: Value,
) -> Result<Value, String> {
    let mut a = Agent::try_start_at(socket, workspace, home)?;
    a.call(1, tool, args)?;
    let r = a.try_wait(|v| v["id"] == 1, Duration::from_secs(600))?;
    let status = r["result"]["structuredContent"]["status"].clone();
    if status == "completed" || status == "pending_approval" {
        Ok(r)
    } else {
        Err(format!("not completed: {r}"))
    }
}

/// What a load balancer and a well-behaved agent do: the call on the next
/// live replica, and again on the next when the answer is a failure of the
/// replica rather than of the call. Returns (result, attempts).
fn call_until_done(
    live: &std::sync::Mutex<Vec<PathBuf>>,
    turn: &std::sync::atomic::AtomicUsize,
    workspace: &Path,
    home: &Path,
    tool: &str,
    args: Value,
) -> (Value, Vec<String>) {
    let mut failures = Vec::new();
    for _ in 0..40 {
        let socket = {
            let l = live.lock().expect("live");
            l[turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % l.len()].clone()
        };
        match one_call(&socket, workspace, home, tool, args.clone()) {
            Ok(r) => return (r, failures),
            Err(e) => {
                failures.push(e);
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    panic!("{tool} never completed: {failures:#?}");
}

/// A rolling update of three replicas, as a Deployment with `maxSurge: 1,
/// maxUnavailable: 0` does it (a new replica ready, then an old one sent
/// SIGTERM, three times), while an agent keeps planning and two granted
/// approvals are applied through replicas as they are stopped. Nothing is
/// lost: every plan ends completed (on another replica when its own was
/// stopping), each approval is spent exactly once and its apply completed,
/// and the one audit chain verifies. (Stand-in for a Deployment: real
/// daemons and PostgreSQL, no kubelet; the endpoint a stopping replica
/// leaves is this test's list of live sockets.)
#[test]
fn a_rolling_restart_of_three_replicas_under_a_stream_of_calls_loses_nothing() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let server = pg::Postgres::start();
    let conninfo = server.database("gateway");
    let secrets = tempfile::tempdir().expect("dir");
    let store = store_section(secrets.path(), &conninfo);
    let policies = common::policies_with(&[(
        "config/scopes/data.yaml",
        "  terraform/offline-demo:\n",
        "  terraform/second:\n    credential: none\n  terraform/stream:\n    credential: none\n  terraform/offline-demo:\n",
    )]);
    let old: Vec<Daemon> = replicas(3, policies.path(), &store);
    let workspace = daemon::demo_workspace(AGENT);
    // Three modules: two to approve, one to plan again and again.
    for m in ["terraform/second", "terraform/stream"] {
        common::copy_dir(&workspace.path().join(MODULE), &workspace.path().join(m));
    }
    daemon::chown_tree(workspace.path(), AGENT);
    let agent_home = daemon::owned_dir(AGENT);
    let approver_home = daemon::owned_dir(APPROVER);

    // Two applies asked and granted before the roll.
    let mut ids = Vec::new();
    for (i, m) in [MODULE, "terraform/second"].into_iter().enumerate() {
        let mut a = Agent::start(&old[i], workspace.path(), agent_home.path());
        a.apply(1, json!({"working_dir": m}));
        let r = a.wait(|v| v["id"] == 1, Duration::from_secs(600));
        let id = r["result"]["structuredContent"]["approval_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string();
        ok(&cli(
            &old[2],
            APPROVER,
            approver_home.path(),
            &["approve", &id, "--reason", "before the roll"],
        ));
        ids.push((m, id));
    }

    let live = Arc::new(Mutex::new(
        old.iter().map(|d| d.socket.clone()).collect::<Vec<_>>(),
    ));
    let turn = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let stream = {
        let (live, turn, stop) = (Arc::clone(&live), Arc::clone(&turn), Arc::clone(&stop));
        let (ws, home) = (
            workspace.path().to_path_buf(),
            agent_home.path().to_path_buf(),
        );
        std::thread::spawn(move || {
            let mut done = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let (r, failures) = call_until_done(
                    &live,
                    &turn,
                    &ws,
                    &home,
                    "terraform_plan",
                    json!({"working_dir": "terraform/stream"}),
                );
                done.push((r["result"]["structuredContent"]["status"].clone(), failures));
            }
            done
        })
    };

    // The roll. Replica 0 leaves the endpoints before its SIGTERM (what
    // preStop's sleep gives); replicas 1 and 2 are sent SIGTERM while an
    // approved apply runs on them and while they are still listed (an
    // endpoint removal that lags), so calls arrive as they stop.
    let mut new = Vec::new();
    let mut applies = Vec::new();
    for (i, mut d) in old.into_iter().enumerate() {
        let fresh = Daemon::start(policies.path(), &store);
        live.lock().expect("live").push(fresh.socket.clone());
        new.push(fresh);
        std::thread::sleep(Duration::from_secs(3));
        if i == 0 {
            live.lock().expect("live").retain(|s| *s != d.socket);
        }
        if let Some((m, id)) = i.checked_sub(1).and_then(|k| ids.get(k)).cloned() {
            let socket = d.socket.clone();
            let (ws, home) = (
                workspace.path().to_path_buf(),
                agent_home.path().to_path_buf(),
            );
            let (live, turn) = (Arc::clone(&live), Arc::clone(&turn));
            applies.push(std::thread::spawn(move || {
                let args = json!({"working_dir": m, "approval_id": id});
                // First on the replica that is about to stop; then as a
                // client does when that fails, on the others.
                match one_call(&socket, &ws, &home, "terraform_apply", args.clone()) {
                    Ok(r) => (id, r, vec![]),
                    Err(e) => {
                        let (r, mut f) =
                            call_until_done(&live, &turn, &ws, &home, "terraform_apply", args);
                        f.insert(0, e);
                        (id, r, f)
                    }
                }
            }));
            // Mid-apply: its sandbox is starting or running.
            std::thread::sleep(Duration::from_millis(if i == 1 { 300 } else { 700 }));
        }
        let st = d.terminate(Duration::from_secs(90));
        live.lock().expect("live").retain(|s| *s != d.socket);
        assert!(
            st.is_some_and(|s| s.success()),
            "replica {i} did not stop cleanly ({st:?}): {}",
            d.log()
        );
    }
    std::thread::sleep(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    let done = stream.join().expect("the stream");
    let retried: usize = done.iter().filter(|(_, f)| !f.is_empty()).count();
    assert!(done.len() >= 3, "{done:#?}");
    assert!(
        done.iter().all(|(s, _)| s == "completed"),
        "every plan completed: {done:#?}"
    );
    let mut cut = 0;
    for a in applies {
        let (id, r, failures) = a.join().expect("an apply");
        assert_eq!(
            r["result"]["structuredContent"]["status"], "completed",
            "{id}: {r} after {failures:#?}"
        );
        assert_eq!(spent_events(&new, &id), 1, "{id} spent once: {failures:#?}");
        // The replica it was sent to stopped under it: its session ended,
        // and the call was made again elsewhere.
        assert!(
            !failures.is_empty(),
            "{id}: the stop did not reach the apply"
        );
        cut += 1;
        eprintln!(
            "rolling restart: {id} cut by its replica's stop, then {} after {} more tries: {failures:?}",
            r["result"]["structuredContent"]["status"],
            failures.len() - 1
        );
    }
    assert_eq!(cut, 2);
    eprintln!(
        "rolling restart: {} plans completed, {retried} of them on another replica after a stopping one failed them",
        done.len()
    );
    new[0].assert_audit_verifies();
}

/// The request id of the `terraform_plan` call that `d`'s chain shows in
/// its sandbox and not yet ended, once there is one.
fn running_plan(d: &Daemon, known: &[String]) -> String {
    let started = std::time::Instant::now();
    loop {
        let events = d.events();
        let ended = |rid: &str| {
            events
                .iter()
                .any(|e| e["request_id"] == rid && e["event"] == "tool.result")
        };
        if let Some(rid) = events
            .iter()
            .filter(|e| e["event"] == "sandbox.started")
            .filter_map(|e| e["request_id"].as_str())
            .find(|rid| !known.iter().any(|k| k == rid) && !ended(rid))
        {
            return rid.to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no plan reached its sandbox: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// PostgreSQL killed while calls run in their sandboxes (the outage found
/// from outside: such calls kept a `tool.request` and a `sandbox.started`
/// and never an end). A call on a replica that lives on records its end,
/// late and saying so, once the database is back; a replica stopped while
/// the database is away leaves its call open in the chain, and a survivor
/// ends it as interrupted. Nothing is left open, and the chain verifies.
#[test]
fn calls_running_when_the_database_stops_end_in_the_audit_once_it_is_back() {
    daemon::os_user(AGENT);
    let mut server = pg::Postgres::start();
    let conninfo = server.database("gateway");
    let secrets = tempfile::tempdir().expect("dir");
    let store = store_section(secrets.path(), &conninfo);
    let policies = common::policies_with(&[]);
    let mut ds = replicas(2, policies.path(), &store);
    let workspace = daemon::demo_workspace(AGENT);
    let agent_home = daemon::owned_dir(AGENT);
    daemon::write_slow_part(workspace.path(), "outage", 300);
    let mut seen = Vec::new();

    // 1. The replica lives on: its call's end is appended late.
    let mut a = Agent::start(&ds[0], workspace.path(), agent_home.path());
    a.call(1, "terraform_plan", json!({"working_dir": MODULE}))
        .expect("call");
    let rid = running_plan(&ds[0], &seen);
    seen.push(rid.clone());
    server.kill();
    let r = a.wait(|v| v["id"] == 1, Duration::from_secs(600));
    assert_ne!(
        r["result"]["structuredContent"]["status"], "completed",
        "the call could not record its end: its client is told so: {r}"
    );
    server.run();
    let mine = ds[0].ended(&rid, Duration::from_secs(60));
    let end = mine
        .iter()
        .find(|e| e["event"] == "tool.result")
        .expect("end");
    assert_eq!(end["data"]["status"], "error", "{end:#}");
    assert!(
        end["late"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("the audit chain refused it")),
        "the end says it is late, and why: {end:#}"
    );
    assert!(
        mine.iter().any(|e| e["event"] == "sandbox.completed"),
        "the sandbox's end is there too: {mine:#?}"
    );
    let order: Vec<&str> = mine.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(order.last(), Some(&"tool.result"), "{order:?}");

    // 2. The replica stops while the database is away: a survivor ends
    // its call.
    let mut a = Agent::start(&ds[0], workspace.path(), agent_home.path());
    a.call(2, "terraform_plan", json!({"working_dir": MODULE}))
        .expect("call");
    let rid = running_plan(&ds[0], &seen);
    server.kill();
    let _ = a.wait(|v| v["id"] == 2, Duration::from_secs(600));
    let st = ds[0].terminate(Duration::from_secs(60));
    assert!(st.is_some(), "the replica stopped: {}", ds[0].log());
    assert!(
        ds[0]
            .log()
            .contains("audit events the team's chain refused are lost"),
        "the stopping replica says what it could not append: {}",
        ds[0].log()
    );
    server.run();
    let mine = ds[1].ended(&rid, Duration::from_secs(120));
    let end = mine
        .iter()
        .find(|e| e["event"] == "tool.result")
        .expect("end");
    assert_eq!(end["data"]["status"], "interrupted", "{end:#}");
    assert!(
        end["data"]["reason"]
            .as_str()
            .is_some_and(|w| w.contains("stopped before the call's end was recorded")),
        "{end:#}"
    );
    assert_eq!(
        mine.iter().filter(|e| e["event"] == "tool.result").count(),
        1,
        "ended once: {mine:#?}"
    );
    ds[1].assert_audit_verifies();
    let st = ds[1].terminate(Duration::from_secs(30));
    assert!(st.is_some_and(|s| s.success()), "{st:?}: {}", ds[1].log());
}
