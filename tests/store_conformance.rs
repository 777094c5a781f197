//! One conformance suite for the approval store, run against each of its
//! databases: SQLite (a file, the embedded default) and a real PostgreSQL
//! (tests/support/postgres.rs). Every case runs on a fresh database of
//! each; the concurrency cases open several stores on one database, as
//! several replicas (or the daemon and the CLI) do.

mod common;
#[path = "support/postgres.rs"]
mod pg;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gateway::approvals::{Approval, ApprovalStore, Approver, NewApproval, Refusal, State};
use serde_json::json;

const MIN30: Duration = Duration::from_secs(1800);

fn new(approvers: u32, ttl: Duration) -> NewApproval {
    NewApproval {
        tool: "terraform_apply".into(),
        params: json!({"working_dir": "terraform/offline-demo"}),
        plan_sha256: Some("aa".repeat(32)),
        plan_summary: json!([{"address": "terraform_data.web", "actions": ["delete", "create"], "reason": null, "paths": []}]),
        signals: json!([{"kind": "replace"}]),
        request_id: "req-1".into(),
        requested_by: "alice".into(),
        requested_client: "test".into(),
        requester: serde_json::Value::Null,
        approvers_required: approvers,
        ttl,
        reason_required: false,
    }
}

fn who(name: &str) -> Approver {
    Approver {
        identity: None,
        name: name.into(),
        kind: "os_user",
        os_user: name.into(),
        signed: None,
    }
}

fn spend(s: &mut ApprovalStore, id: &str) -> Result<Approval, Refusal> {
    s.spend(
        id,
        "terraform_apply",
        &json!({"working_dir": "terraform/offline-demo"}),
        Some(&"aa".repeat(32)),
        "req-2",
    )
    .expect("db")
}

/// Of 32 spenders of one granted approval, each on its own connection,
/// exactly one succeeds and every other is told it was spent.
fn one_spend_among_many(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    let s = make();
    let (a, _) = s.create(&new(1, MIN30)).expect("create");
    s.grant(&a.id, &who("bob"), "")
        .expect("db")
        .expect("granted");
    let spent = AtomicUsize::new(0);
    let refused = AtomicUsize::new(0);
    let barrier = std::sync::Barrier::new(32);
    // Opened first: a store that failed to open in a thread would leave
    // the others at the barrier for ever.
    let stores: Vec<ApprovalStore> = (0..32).map(|_| make()).collect();
    std::thread::scope(|scope| {
        for (i, mine) in stores.iter().enumerate() {
            let (id, spent, refused, barrier) = (&a.id, &spent, &refused, &barrier);
            scope.spawn(move || {
                barrier.wait();
                match mine
                    .spend(
                        id,
                        "terraform_apply",
                        &json!({"working_dir": "terraform/offline-demo"}),
                        Some(&"aa".repeat(32)),
                        &format!("req-{i}"),
                    )
                    .expect("db")
                {
                    Ok(_) => spent.fetch_add(1, Ordering::SeqCst),
                    Err(Refusal::AlreadySpent { .. }) => refused.fetch_add(1, Ordering::SeqCst),
                    Err(other) => panic!("a spender was refused otherwise: {other}"),
                };
            });
        }
    });
    assert_eq!(spent.load(Ordering::SeqCst), 1, "exactly one spend");
    assert_eq!(refused.load(Ordering::SeqCst), 31);
    let read = s.get(&a.id).expect("db").expect("a");
    assert_eq!(read.state, State::Spent);
}

/// A once-only mark (a sign-in ceremony, a page session's sign-out): of
/// 16 takers of one mark, each on its own connection, exactly one is
/// first; it stays taken while it lasts, other marks are apart, and a mark
/// past its expiry (and the margin for clocks behind) is swept and free.
fn a_mark_is_taken_once(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let until = now + 60_000;
    let first = AtomicUsize::new(0);
    let barrier = std::sync::Barrier::new(16);
    let stores: Vec<ApprovalStore> = (0..16).map(|_| make()).collect();
    std::thread::scope(|scope| {
        for mine in &stores {
            let (first, barrier) = (&first, &barrier);
            scope.spawn(move || {
                barrier.wait();
                if mine.spend_once("page-login:abc", until).expect("db") {
                    first.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(first.load(Ordering::SeqCst), 1, "exactly one taker");
    let s = make();
    assert!(s.is_spent("page-login:abc").expect("db"));
    assert!(!s.spend_once("page-login:abc", until).expect("db"), "taken");
    assert!(!s.is_spent("page-session:other").expect("db"));
    assert!(s.spend_once("page-session:other", until).expect("db"));
    // Long past (beyond the margin): swept by the next mark, free again.
    let old = now - 24 * 3600 * 1000;
    assert!(s.spend_once("page-login:old", old).expect("db"));
    assert!(!s.is_spent("page-login:old").expect("db"), "expired");
    assert!(
        s.spend_once("page-login:old", until).expect("db"),
        "free again"
    );
}

/// Two approvers granting at once an approval that needs both: it ends
/// approved, with both verdicts (neither grant is lost to the other).
fn two_grants_at_once_both_count(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    for _ in 0..5 {
        let s = make();
        let (a, _) = s.create(&new(2, MIN30)).expect("create");
        let barrier = std::sync::Barrier::new(2);
        let stores = [make(), make()];
        std::thread::scope(|scope| {
            for (name, mine) in ["bob", "carol"].into_iter().zip(&stores) {
                let (id, barrier) = (&a.id, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    mine.grant(id, &who(name), "")
                        .expect("db")
                        .expect("granted");
                });
            }
        });
        let read = s.get(&a.id).expect("db").expect("a");
        assert_eq!(read.verdicts.len(), 2);
        assert_eq!(read.state, State::Approved, "{read:?}");
    }
}

fn create_grant_spend_then_refuse_reuse(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    let mut s = make();
    let (a, _) = s.create(&new(1, MIN30)).expect("create");
    assert_eq!(a.state, State::Pending);
    assert!(
        a.id.starts_with("ap-") && a.id.len() == 43,
        "160 random bits: {}",
        a.id
    );
    assert_eq!(
        spend(&mut s, &a.id).map(|_| ()),
        Err(Refusal::NotApproved {
            id: a.id.clone(),
            given: 0,
            needed: 1
        })
    );
    let g = s
        .grant(&a.id, &who("bob"), "looks right")
        .expect("db")
        .expect("granted");
    assert_eq!(g.state, State::Approved);
    let spent = spend(&mut s, &a.id).expect("spent");
    assert_eq!(spent.state, State::Spent);
    assert_eq!(spent.spent_request_id.as_deref(), Some("req-2"));
    assert_eq!(
        spend(&mut s, &a.id).map(|_| ()),
        Err(Refusal::AlreadySpent { id: a.id.clone() })
    );
    assert_eq!(
        s.grant(&a.id, &who("carol"), "").expect("db").map(|_| ()),
        Err(Refusal::AlreadySpent { id: a.id.clone() })
    );
}

fn only_the_spending_request_records_the_outcome_and_only_once(
    make: &(dyn Fn() -> ApprovalStore + Sync),
) {
    let mut s = make();
    let (a, _) = s.create(&new(1, MIN30)).expect("create");
    let done = json!({"status": "completed", "ok": true});
    // Not spent yet: nothing to record.
    assert!(!s.record_outcome(&a.id, "req-2", &done).expect("db"));
    s.grant(&a.id, &who("bob"), "")
        .expect("db")
        .expect("granted");
    spend(&mut s, &a.id).expect("spent");
    assert_eq!(s.get(&a.id).expect("db").expect("a").outcome, None);
    // Another request cannot write the spender's outcome.
    assert!(!s.record_outcome(&a.id, "req-9", &done).expect("db"));
    assert!(s.record_outcome(&a.id, "req-2", &done).expect("db"));
    let later = json!({"status": "refused"});
    assert!(!s.record_outcome(&a.id, "req-2", &later).expect("db"));
    let read = s.get(&a.id).expect("db").expect("a");
    assert_eq!(read.outcome, Some(done));
    assert!(read.outcome_at.is_some());
}

fn params_plan_and_tool_are_bound(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    let mut s = make();
    let (a, _) = s.create(&new(1, MIN30)).expect("create");
    s.grant(&a.id, &who("bob"), "")
        .expect("db")
        .expect("granted");
    let other_params = s
        .spend(
            &a.id,
            "terraform_apply",
            &json!({"working_dir": "terraform/k8s-demo"}),
            Some(&"aa".repeat(32)),
            "r",
        )
        .expect("db");
    assert_eq!(
        other_params.map(|_| ()),
        Err(Refusal::ParamsMismatch { id: a.id.clone() })
    );
    let other_plan = s
        .spend(
            &a.id,
            "terraform_apply",
            &json!({"working_dir": "terraform/offline-demo"}),
            Some(&"bb".repeat(32)),
            "r",
        )
        .expect("db");
    assert_eq!(
        other_plan.map(|_| ()),
        Err(Refusal::PlanMismatch { id: a.id.clone() })
    );
    let no_plan = s
        .spend(
            &a.id,
            "terraform_apply",
            &json!({"working_dir": "terraform/offline-demo"}),
            None,
            "r",
        )
        .expect("db");
    assert_eq!(
        no_plan.map(|_| ()),
        Err(Refusal::PlanMismatch { id: a.id.clone() })
    );
    let other_tool = s
        .spend(
            &a.id,
            "terraform_plan",
            &json!({"working_dir": "terraform/offline-demo"}),
            Some(&"aa".repeat(32)),
            "r",
        )
        .expect("db");
    assert!(matches!(other_tool, Err(Refusal::ToolMismatch { .. })));
    // Key order in params does not matter (canonical digest).
    assert!(spend(&mut s, &a.id).is_ok());
}

fn expiry_is_checked_at_read_grant_and_spend(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    let mut s = make();
    let (a, _) = s
        .create(&new(1, Duration::from_millis(300)))
        .expect("create");
    s.grant(&a.id, &who("bob"), "")
        .expect("db")
        .expect("granted");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        s.get(&a.id).expect("db").map(|x| x.state),
        Some(State::Expired)
    );
    assert!(matches!(spend(&mut s, &a.id), Err(Refusal::Expired { .. })));
    let (b, _) = s.create(&new(1, Duration::from_millis(1))).expect("create");
    std::thread::sleep(Duration::from_millis(20));
    assert!(matches!(
        s.grant(&b.id, &who("bob"), "").expect("db"),
        Err(Refusal::Expired { .. })
    ));
    assert!(
        s.list(false).expect("list").is_empty(),
        "expired ones are not pending"
    );
    assert_eq!(s.list(true).expect("list").len(), 2);
}

fn a_denial_ends_it(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    let mut s = make();
    let (a, _) = s.create(&new(2, MIN30)).expect("create");
    s.grant(&a.id, &who("bob"), "")
        .expect("db")
        .expect("granted");
    let d = s
        .deny(&a.id, &who("carol"), "not during the freeze")
        .expect("db")
        .expect("denied");
    assert_eq!(d.state, State::Denied);
    assert_eq!(
        s.grant(&a.id, &who("dave"), "").expect("db").map(|_| ()),
        Err(Refusal::Denied { id: a.id.clone() })
    );
    assert_eq!(
        spend(&mut s, &a.id).map(|_| ()),
        Err(Refusal::Denied { id: a.id.clone() })
    );
}

fn one_identity_counts_once(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    let mut s = make();
    let (a, _) = s.create(&new(2, MIN30)).expect("create");
    let one = s
        .grant(&a.id, &who("bob"), "")
        .expect("db")
        .expect("recorded");
    assert_eq!((one.state, one.grants()), (State::Pending, 1));
    assert!(matches!(
        s.grant(&a.id, &who("bob"), "again").expect("db"),
        Err(Refusal::DuplicateApprover { .. })
    ));
    assert!(matches!(
        spend(&mut s, &a.id),
        Err(Refusal::NotApproved {
            given: 1,
            needed: 2,
            ..
        })
    ));
    let two = s
        .grant(&a.id, &who("carol"), "")
        .expect("db")
        .expect("approved");
    assert_eq!((two.state, two.grants()), (State::Approved, 2));
    assert!(spend(&mut s, &a.id).is_ok());
}

fn a_new_plan_of_the_same_call_supersedes_older_live_approvals(
    make: &(dyn Fn() -> ApprovalStore + Sync),
) {
    let mut s = make();
    let (first, none) = s.create(&new(1, MIN30)).expect("create");
    assert!(none.is_empty());
    let (approved, _) = s.create(&new(1, MIN30)).expect("create");
    assert_eq!(
        s.get(&first.id)
            .expect("db")
            .map(|a| (a.state, a.superseded_by)),
        Some((State::Superseded, Some(approved.id.clone())))
    );
    s.grant(&approved.id, &who("bob"), "ok")
        .expect("db")
        .expect("granted");
    let mut other = new(1, MIN30);
    other.params = json!({"working_dir": "terraform/k8s-demo"});
    let (unrelated, none) = s.create(&other).expect("create");
    assert!(none.is_empty(), "other params supersede nothing");
    let mut someone_else = new(1, MIN30);
    someone_else.requested_by = "mallory".into();
    let (_, none) = s.create(&someone_else).expect("create");
    assert!(
        none.is_empty(),
        "another user's plan supersedes nothing of alice's"
    );
    let (newest, gone) = s.create(&new(1, MIN30)).expect("create");
    assert_eq!(
        gone,
        vec![approved.id.clone()],
        "an approved, unspent one goes too"
    );
    assert_eq!(
        spend(&mut s, &approved.id).map(|_| ()),
        Err(Refusal::Superseded {
            id: approved.id.clone(),
            by: newest.id.clone()
        })
    );
    assert!(matches!(
        s.grant(&first.id, &who("bob"), "").expect("db"),
        Err(Refusal::Superseded { .. })
    ));
    assert_eq!(
        s.get(&unrelated.id).expect("db").map(|a| a.state),
        Some(State::Pending)
    );
    assert_eq!(s.list(false).expect("list").len(), 3);
}

fn a_required_reason_must_be_given(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    let s = make();
    let mut n = new(1, MIN30);
    n.reason_required = true;
    let (a, _) = s.create(&n).expect("create");
    assert_eq!(
        s.grant(&a.id, &who("bob"), "  ").expect("db").map(|_| ()),
        Err(Refusal::ReasonRequired { id: a.id.clone() })
    );
    assert!(
        s.grant(&a.id, &who("bob"), "checked the plan")
            .expect("db")
            .is_ok()
    );
}

fn unknown_ids_are_refused(make: &(dyn Fn() -> ApprovalStore + Sync)) {
    let mut s = make();
    assert_eq!(
        spend(&mut s, "ap-nope").map(|_| ()),
        Err(Refusal::UnknownId {
            id: "ap-nope".into()
        })
    );
    assert_eq!(
        s.grant("ap-nope", &who("bob"), "").expect("db").map(|_| ()),
        Err(Refusal::UnknownId {
            id: "ap-nope".into()
        })
    );
}

/// Every case, each on a fresh database from `fresh` (which returns a
/// maker of stores on that database).
fn conformance(fresh: &dyn Fn(&str) -> Box<dyn Fn() -> ApprovalStore + Sync>) {
    type Case = fn(&(dyn Fn() -> ApprovalStore + Sync));
    let cases: &[(&str, Case)] = &[
        (
            "create_grant_spend_then_refuse_reuse",
            create_grant_spend_then_refuse_reuse,
        ),
        (
            "only_the_spending_request_records_the_outcome_and_only_once",
            only_the_spending_request_records_the_outcome_and_only_once,
        ),
        (
            "params_plan_and_tool_are_bound",
            params_plan_and_tool_are_bound,
        ),
        (
            "expiry_is_checked_at_read_grant_and_spend",
            expiry_is_checked_at_read_grant_and_spend,
        ),
        ("a_denial_ends_it", a_denial_ends_it),
        ("one_identity_counts_once", one_identity_counts_once),
        (
            "a_new_plan_of_the_same_call_supersedes_older_live_approvals",
            a_new_plan_of_the_same_call_supersedes_older_live_approvals,
        ),
        (
            "a_required_reason_must_be_given",
            a_required_reason_must_be_given,
        ),
        ("unknown_ids_are_refused", unknown_ids_are_refused),
        ("one_spend_among_many", one_spend_among_many),
        ("a_mark_is_taken_once", a_mark_is_taken_once),
        (
            "two_grants_at_once_both_count",
            two_grants_at_once_both_count,
        ),
    ];
    for (name, case) in cases {
        eprintln!("case {name}");
        let make = fresh(name);
        case(make.as_ref());
    }
}

#[test]
fn the_approval_store_conforms_on_sqlite() {
    let dirs = tempfile::tempdir().expect("tmp");
    conformance(&|name| {
        let path = dirs.path().join(format!("{name}.db"));
        Box::new(move || ApprovalStore::open(&path).expect("open"))
    });
}

#[test]
fn the_approval_store_conforms_on_postgresql() {
    let server = pg::Postgres::start();
    conformance(&|name| {
        let conninfo = server.database(name);
        Box::new(move || ApprovalStore::postgres(&conninfo, None).expect("connect"))
    });
}

/// A database that stops answering fails a call instead of holding it:
/// every session the store opens has PostgreSQL's own time limits set.
/// A transaction whose body panics half-way leaves nothing behind for the
/// next caller: its connection is closed, not handed out again still in
/// its transaction (where the next caller's BEGIN would be only a warning,
/// and its COMMIT would keep the half-done write too).
#[test]
fn a_transaction_that_panics_leaves_no_write_for_the_next_caller() {
    use gateway::db::postgres::{PoolSettings, PostgresDb};
    use gateway::db::{Db, End};
    let server = pg::Postgres::start();
    let one = PoolSettings {
        size: 1,
        wait: Duration::from_secs(10),
    };
    let db = PostgresDb::connect_pooled(&server.database("panics"), None, one).expect("connect");
    db.write(&mut |tx| {
        tx.execute("CREATE TABLE t (v TEXT NOT NULL)", &[])?;
        Ok(End::Commit)
    })
    .expect("table");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        db.write(&mut |tx| {
            tx.execute("INSERT INTO t VALUES ('half-done')", &[])?;
            panic!("the body fails half-way")
        })
    }));
    assert!(panicked.is_err(), "the body panicked");
    db.write(&mut |tx| {
        tx.execute("INSERT INTO t VALUES ('next')", &[])?;
        Ok(End::Commit)
    })
    .expect("the next caller");
    let mut kept = Vec::new();
    db.read(&mut |tx| {
        kept = tx
            .query("SELECT v FROM t ORDER BY v", &[])?
            .iter()
            .map(|r| r.text(0))
            .collect::<Result<_, _>>()?;
        Ok(End::Rollback)
    })
    .expect("read");
    assert_eq!(kept, ["next"]);
}

/// A caller that finds every connection of the pool in use waits the
/// pool's wait, then fails with the reason (which setting, never the
/// connection string); once a connection is free again calls go on.
#[test]
fn a_full_pool_refuses_after_its_wait_with_the_reason_and_recovers() {
    use gateway::db::postgres::{PoolSettings, PostgresDb};
    use gateway::db::{Db, End};
    let server = pg::Postgres::start();
    let settings = PoolSettings {
        size: 1,
        wait: Duration::from_secs(1),
    };
    // A password the server (trust) ignores: it must not be shown.
    let url = format!("{} password=pool-secret-pw", server.database("pool_full"));
    let db = PostgresDb::connect_pooled(&url, None, settings).expect("connect");
    let (held, taken) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            db.read(&mut |tx| {
                let _ = held.send(());
                tx.query("SELECT pg_sleep(3)::text", &[])?;
                Ok(End::Rollback)
            })
            .expect("the holder");
        });
        taken.recv().expect("the holder has the connection");
        let started = std::time::Instant::now();
        let e = db
            .read(&mut |tx| {
                tx.query("SELECT 1::text", &[])?;
                Ok(End::Rollback)
            })
            .expect_err("no connection free");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_millis(2500),
            "waited {waited:?}"
        );
        let said = e.to_string();
        assert!(
            said.contains("pool_size") && said.contains("pool_wait_secs"),
            "{said}"
        );
        assert!(!said.contains("pool-secret-pw"), "{said}");
    });
    db.read(&mut |tx| {
        tx.query("SELECT 1::text", &[])?;
        Ok(End::Rollback)
    })
    .expect("free again");
    assert_eq!(db.pool_status().0, 1, "never more than the pool's size");
}

#[test]
fn postgresql_sessions_carry_time_limits() {
    use gateway::db::{Db, End};
    let server = pg::Postgres::start();
    let db = gateway::db::postgres::PostgresDb::connect(&server.database("limits"), None)
        .expect("connect");
    let mut shown = Vec::new();
    db.read(&mut |tx| {
        shown.clear();
        for setting in ["statement_timeout", "idle_in_transaction_session_timeout"] {
            let row = tx
                .query_opt(&format!("SHOW {setting}"), &[])?
                .expect("a row");
            shown.push(row.text(0)?);
        }
        Ok(End::Rollback)
    })
    .expect("read");
    assert_eq!(shown, ["10s", "30s"]);
    // A statement past the limit is ended by the server, with a reason.
    let e = db
        .write(&mut |tx| {
            tx.query("SELECT pg_sleep(11)::text", &[])?;
            Ok(End::Commit)
        })
        .expect_err("cancelled by statement_timeout");
    assert!(e.to_string().contains("statement timeout"), "{e}");
}

/// A TCP proxy to the test server's socket that, once armed, lets the next
/// `COMMIT` through to the server and then cuts the connection before the
/// server's answer reaches the client: the commit happened, the client
/// never hears of it (a network failure at the worst moment).
struct CommitCutter {
    port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cuts: std::sync::Arc<AtomicUsize>,
}

impl CommitCutter {
    fn start(socket: std::path::PathBuf) -> CommitCutter {
        use std::io::{Read, Write};
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (a, c) = (Arc::clone(&armed), Arc::clone(&cuts));
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let server = std::os::unix::net::UnixStream::connect(&socket).expect("server");
                let cut = Arc::new(AtomicBool::new(false));
                let (mut c_in, mut s_out) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                let (mut s_in, mut c_out) = (server, client);
                let (armed, cuts, cut2) = (Arc::clone(&a), Arc::clone(&c), Arc::clone(&cut));
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = c_in.read(&mut buf) {
                        if n == 0 || s_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        let commit = buf[..n].windows(7).any(|w| w == b"COMMIT\0");
                        if commit && armed.swap(false, Ordering::SeqCst) {
                            cut2.store(true, Ordering::SeqCst);
                            cuts.fetch_add(1, Ordering::SeqCst);
                            // The server has it; the client hears nothing.
                            std::thread::sleep(Duration::from_millis(300));
                            let _ = c_in.shutdown(std::net::Shutdown::Both);
                            let _ = s_out.shutdown(std::net::Shutdown::Both);
                            break;
                        }
                    }
                });
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = s_in.read(&mut buf) {
                        if n == 0
                            || cut.load(Ordering::SeqCst)
                            || c_out.write_all(&buf[..n]).is_err()
                        {
                            break;
                        }
                    }
                });
            }
        });
        CommitCutter { port, armed, cuts }
    }
}

/// The connection is lost after the server committed a spend but before
/// the gateway heard: the spend is this call's (read back from the row),
/// so its apply runs and the approval is not burned for nothing.
#[test]
fn a_spend_whose_commit_answer_is_lost_is_still_the_callers() {
    let server = pg::Postgres::start();
    server.database("cut");
    let cutter = CommitCutter::start(
        server
            .socket_dir()
            .join(format!(".s.PGSQL.{}", server.port)),
    );
    let conninfo = format!(
        "host=127.0.0.1 port={} user=postgres dbname=cut",
        cutter.port
    );
    let s = ApprovalStore::postgres(&conninfo, None).expect("connect through the proxy");
    let (a, _) = s.create(&new(1, MIN30)).expect("create");
    s.grant(&a.id, &who("bob"), "")
        .expect("db")
        .expect("granted");
    cutter.armed.store(true, Ordering::SeqCst);
    let spent = s.spend(
        &a.id,
        "terraform_apply",
        &json!({"working_dir": "terraform/offline-demo"}),
        Some(&"aa".repeat(32)),
        "req-lost-answer",
    );
    assert_eq!(
        cutter.cuts.load(Ordering::SeqCst),
        1,
        "the commit's answer was cut"
    );
    let spent = spent
        .expect("read back, not an error")
        .expect("spent by this call");
    assert_eq!(spent.state, State::Spent);
    assert_eq!(spent.spent_request_id.as_deref(), Some("req-lost-answer"));
}

/// A PostgreSQL server reached over TCP with TLS: with the CA named in
/// `[store] ca_file` the session is encrypted; without it the server's
/// certificate does not verify and nothing is sent, not even in the clear.
#[test]
fn postgresql_over_tls_is_encrypted_and_its_certificate_checked() {
    use gateway::db::{Db, End, SqlValue};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let keys = tempfile::tempdir().expect("dir");
    let (ca, cert, key) = common::tls_files(keys.path());
    let server = pg::Postgres::start_tls(&cert, &key);
    server.database("tls");
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname=tls sslmode=require",
        server.port
    );
    let s = ApprovalStore::postgres(&url, Some(&ca)).expect("TLS with the test CA");
    let (a, _) = s.create(&new(1, MIN30)).expect("create over TLS");
    assert_eq!(a.state, State::Pending);
    let db = gateway::db::postgres::PostgresDb::connect(&url, Some(&ca)).expect("connect");
    let mut encrypted = None;
    db.read(&mut |tx| {
        encrypted = tx
            .query_opt(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )?
            .map(|r| r.0[0].clone());
        Ok(End::Rollback)
    })
    .expect("read");
    assert_eq!(encrypted, Some(SqlValue::Bool(true)));
    let e = ApprovalStore::postgres(&url, None).expect_err("an unknown CA");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
}

/// A verdict given through one connection is told at once to a replica
/// listening on another (LISTEN/NOTIFY): the approval's id, at commit;
/// a refused verdict (rolled back) tells nothing.
#[test]
fn a_verdict_is_told_to_listening_replicas_when_it_commits() {
    let server = pg::Postgres::start();
    let url = server.database("notify");
    let listener = gateway::db::postgres::PostgresDb::connect(&url, None).expect("connect");
    let s = ApprovalStore::postgres(&url, None).expect("store");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    listener
        .listen(gateway::approvals::CHANGES_CHANNEL, move |id| {
            let _ = tx.send(id.to_string());
        })
        .expect("listen");
    // The listener says "" once it listens.
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).expect("listening"),
        ""
    );
    let (a, _) = s.create(&new(2, MIN30)).expect("create");
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "asking is not a verdict"
    );
    s.grant(&a.id, &who("bob"), "")
        .expect("db")
        .expect("granted");
    assert_eq!(rx.recv_timeout(Duration::from_secs(2)).expect("told"), a.id);
    // bob again: refused, rolled back, nothing told.
    assert!(s.grant(&a.id, &who("bob"), "").expect("db").is_err());
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
    s.deny(&a.id, &who("carol"), "no")
        .expect("db")
        .expect("denied");
    assert_eq!(rx.recv_timeout(Duration::from_secs(2)).expect("told"), a.id);
}

// ---- The lease ledger ----------------------------------------------------

use gateway::broker::leases::{Ledger, LocalLedger, SharedLedger};

const TTL: Duration = Duration::from_secs(600);

/// What every ledger does for the process that holds it: a lease is open
/// until revoked, a failed revocation keeps it open with its error, and
/// it is this process's own (never an orphan) while the process lives.
fn a_lease_is_open_until_revoked(make: &dyn Fn() -> Box<dyn Ledger>) {
    let l = make();
    l.issued("k/creds/r/1", "req-1", "k", "r", TTL).expect("1");
    l.issued("k/creds/r/2", "req-2", "k", "r", TTL).expect("2");
    assert_eq!(l.open_leases().expect("open").len(), 2);
    assert_eq!(l.own().expect("own").len(), 2);
    assert!(
        l.claim_orphans().expect("orphans").is_empty(),
        "a live owner's leases are never orphans"
    );
    let other = make();
    assert!(
        other.claim_orphans().expect("orphans").is_empty(),
        "nor to another process on the same ledger"
    );
    if l.watch_every().is_some() {
        // A replica's own leases are its own (on one host, every gateway
        // process in this test is the same process, so this says nothing).
        assert!(other.own().expect("own").is_empty());
    }
    l.revoke_failed("k/creds/r/2", "vault down").expect("fail");
    let two = l
        .open_leases()
        .expect("open")
        .into_iter()
        .find(|r| r.lease_id == "k/creds/r/2")
        .expect("still open");
    assert_eq!(two.last_error.as_deref(), Some("vault down"));
    assert_eq!(two.revoke_attempts, 1);
    l.revoked("k/creds/r/2").expect("revoked");
    assert_eq!(l.is_revoked("k/creds/r/2").expect("q"), Some(true));
    assert_eq!(l.is_revoked("k/creds/r/1").expect("q"), Some(false));
    assert_eq!(l.is_revoked("nope").expect("q"), None);
    let open: Vec<String> = l
        .own()
        .expect("own")
        .into_iter()
        .map(|r| r.lease_id)
        .collect();
    assert_eq!(open, ["k/creds/r/1"]);
}

#[test]
fn the_lease_ledger_conforms_on_sqlite() {
    let dir = tempfile::tempdir().expect("tmp");
    let home = dir.path().to_path_buf();
    a_lease_is_open_until_revoked(&|| Box::new(LocalLedger::in_home(&home).expect("open")));
}

fn shared(conninfo: &str) -> SharedLedger {
    SharedLedger::open(gateway::db::postgres::PostgresDb::connect(conninfo, None).expect("connect"))
        .expect("ledger")
}

#[test]
fn the_lease_ledger_conforms_on_postgresql() {
    let server = pg::Postgres::start();
    let conninfo = server.database("ledger_basic");
    a_lease_is_open_until_revoked(&|| Box::new(shared(&conninfo)));
}

/// Wait until `l` may call others dead (its own lock held long enough).
fn settled(l: &SharedLedger) {
    if let Some(wait) = l.ready_in() {
        std::thread::sleep(wait + Duration::from_millis(200));
    }
    assert!(l.ready_in().is_none());
}

/// A replica that dies (here: its ledger, and so its presence connection,
/// dropped; a `kill -9` closes the same socket) leaves its open leases to
/// the survivors once its heartbeat is a few beats old (a connection that
/// only blinked is not death): the first survivor to look takes them
/// over, with the dead replica named, and no other survivor gets them
/// too. Revoked leases are not taken.
#[test]
fn a_dead_replicas_open_leases_go_to_exactly_one_survivor() {
    let server = pg::Postgres::start();
    let conninfo = server.database("ledger_death");
    let survivors: Vec<SharedLedger> = (0..4).map(|_| shared(&conninfo)).collect();
    for s in &survivors {
        settled(s);
    }
    let dying = shared(&conninfo);
    let dead_id = dying.replica().to_string();
    dying
        .issued("k/creds/r/a", "req-a", "k", "r", TTL)
        .expect("a");
    dying
        .issued("k/creds/r/b", "req-b", "k", "r", TTL)
        .expect("b");
    dying.revoked("k/creds/r/b").expect("b revoked");
    for s in &survivors {
        assert!(s.claim_orphans().expect("none yet").is_empty());
    }
    drop(dying);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        survivors[0].claim_orphans().expect("claim").is_empty(),
        "its lock is free, but its heartbeat is fresh: not dead yet"
    );
    // Then all four look at once, until one takes it.
    let started = std::time::Instant::now();
    let claimed: Vec<Vec<_>> = loop {
        let got: Vec<Vec<_>> = std::thread::scope(|scope| {
            let hs: Vec<_> = survivors
                .iter()
                .map(|s| scope.spawn(move || s.claim_orphans().expect("claim")))
                .collect();
            hs.into_iter().map(|h| h.join().expect("join")).collect()
        });
        if got.iter().any(|g| !g.is_empty()) || started.elapsed() > Duration::from_secs(20) {
            break got;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(4),
        "taken {took:?} after the lock went: sooner than its heartbeat went stale"
    );
    let all: Vec<_> = claimed.iter().flatten().collect();
    assert_eq!(all.len(), 1, "exactly one survivor takes it: {claimed:?}");
    assert_eq!(all[0].lease_id, "k/creds/r/a");
    assert_eq!(all[0].request_id, "req-a");
    assert_eq!(all[0].owner_replica.as_deref(), Some(dead_id.as_str()));
    let taker = claimed.iter().position(|g| !g.is_empty()).expect("taker");
    assert_eq!(
        survivors[taker].own().expect("own").len(),
        1,
        "it is the taker's own now"
    );
    // It is no longer among the live (whose sandboxes the living keep).
    let live = survivors[0]
        .live_replicas()
        .expect("live")
        .expect("a shared ledger");
    assert!(!live.contains(&dead_id), "{live:?}");
    assert!(
        survivors
            .iter()
            .all(|s| live.iter().any(|l| l == s.replica())),
        "{live:?}"
    );
    // Until revoked, the taker is reminded of it (a failed revocation is
    // tried again); no one else is.
    let pending = survivors[taker].claimed_unrevoked().expect("pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].owner_replica.as_deref(), Some(dead_id.as_str()));
    // A failed revocation is tried again after a pause that grows.
    survivors[taker]
        .revoke_failed("k/creds/r/a", "vault away")
        .expect("failed");
    assert!(
        survivors[taker]
            .claimed_unrevoked()
            .expect("pending")
            .is_empty(),
        "not at once"
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        survivors[taker].claimed_unrevoked().expect("pending").len(),
        1,
        "again after 2 s"
    );
    for s in &survivors {
        assert!(s.claim_orphans().expect("again").is_empty());
    }
    survivors[taker].revoked("k/creds/r/a").expect("revoked");
    assert!(survivors[taker].claimed_unrevoked().expect("p").is_empty());
    // A reader of the ledger is no replica: it takes nothing.
    let reader = SharedLedger::reader(
        gateway::db::postgres::PostgresDb::connect(&conninfo, None).expect("db"),
    );
    assert!(reader.claim_orphans().expect("reader").is_empty());
}

/// The database restarting drops every replica's lock at once: none is
/// called dead for it (each takes its lock again within a second or two,
/// and none calls another dead before its own lock is settled), and no
/// live replica's lease is taken.
#[test]
fn a_database_restart_makes_no_replica_dead() {
    let mut server = pg::Postgres::start();
    let conninfo = server.database("ledger_restart");
    let (a, b) = (shared(&conninfo), shared(&conninfo));
    settled(&a);
    settled(&b);
    a.issued("k/creds/r/live", "req-live", "k", "r", TTL)
        .expect("live");
    server.kill();
    std::thread::sleep(Duration::from_secs(3));
    server.run();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(15) {
        for l in [&a, &b] {
            if let Ok(c) = l.claim_orphans() {
                assert!(c.is_empty(), "a live replica's lease was taken: {c:?}");
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        a.ready_in().is_none() && b.ready_in().is_none(),
        "both hold their locks again"
    );
    assert_eq!(a.own().expect("own").len(), 1, "still its own");
}

/// A replica whose host vanished keeps its lock until the database notices
/// the connection is gone; its heartbeat stopping is enough: one older
/// than the limit makes it dead to the survivors.
#[test]
fn a_replica_whose_heartbeat_stopped_is_dead_even_while_its_lock_is_held() {
    use gateway::db::{Db, End};
    let server = pg::Postgres::start();
    let conninfo = server.database("ledger_stale");
    let survivor = shared(&conninfo);
    settled(&survivor);
    let stuck = shared(&conninfo);
    stuck
        .issued("k/creds/r/s", "req-s", "k", "r", TTL)
        .expect("s");
    assert!(survivor.claim_orphans().expect("alive").is_empty());
    let db = gateway::db::postgres::PostgresDb::connect(&conninfo, None).expect("db");
    let id = stuck.replica().to_string();
    // The presence thread beats every 2 s: the row is aged and the claim
    // made at once, again if a beat came between.
    let mut claimed = Vec::new();
    for _ in 0..5 {
        db.write(&mut |tx| {
            tx.execute(
                "UPDATE gateway_replicas SET heartbeat_at = now() - interval '1 hour' WHERE id = ?1",
                &[id.as_str().into()],
            )?;
            Ok(End::Commit)
        })
        .expect("age it");
        claimed = survivor.claim_orphans().expect("claim");
        if !claimed.is_empty() {
            break;
        }
    }
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0].owner_replica.as_deref(), Some(id.as_str()));
    // The stuck replica, called dead, records no new lease (its call is
    // refused, the credential revoked by the broker) until its next beat
    // registers it again.
    let refused = stuck.issued("k/creds/r/t", "req-t", "k", "r", TTL);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("not registered as alive")),
        "{refused:?}"
    );
    std::thread::sleep(SharedLedger::WATCH_EVERY + Duration::from_millis(500));
    stuck
        .issued("k/creds/r/u", "req-u", "k", "r", TTL)
        .expect("registered again by its heartbeat");
}

// ---- The team's audit chain ---------------------------------------------

use gateway::audit::AuditLog;
use gateway::audit::shared::{SharedChain, write_export};
use gateway::audit::verify::{HeadRule, verify_against, verify_file};

/// Three writers (replicas) on one chain, appending at once: one chain of
/// every event, which verifies against its head row; its export is a
/// JSONL file the file verifier accepts as it accepts a host's log.
fn one_chain_for_every_writer(make: &(dyn Fn() -> SharedChain + Sync)) {
    let per_writer = 40;
    // Made once before the writers open it at once (SQLite's switch to
    // WAL is refused, not waited for, while another opens the file).
    drop(make());
    std::thread::scope(|scope| {
        for w in 0..3 {
            scope.spawn(move || {
                let log = AuditLog::shared(make());
                for i in 0..per_writer {
                    log.append(
                        &format!("req-{w}-{i}"),
                        "tool.request",
                        // A NUL and a lone surrogate-free oddity, as a hostile
                        // module's output may carry: kept, escaped, in the chain.
                        json!({"writer": w, "i": i, "password": "hunter2-secret-value", "output": "nul\u{0}byte \u{202e}rtl"}),
                    )
                    .expect("append");
                }
            });
        }
    });
    let export = make().export().expect("export");
    assert_eq!(export.rows, 3 * per_writer);
    assert_eq!(export.events, 3 * per_writer);
    let report = verify_against(&export.bytes, Some(&export.head), &[]);
    assert!(report.ok(), "{:?}", report.first_bad);
    assert_eq!(report.verified as u64, 3 * per_writer);
    let text = String::from_utf8(export.bytes.clone()).expect("utf-8");
    assert_eq!(
        text.matches("nul\\u0000byte").count() as u64,
        3 * per_writer
    );
    assert!(
        !text.contains("hunter2"),
        "events are scrubbed as in the file"
    );
    for w in 0..3 {
        assert_eq!(
            text.matches(&format!("\"writer\":{w}")).count() as u64,
            per_writer
        );
    }
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("export.jsonl");
    write_export(&file, &export).expect("write");
    assert_eq!(std::fs::read(&file).expect("read"), export.bytes);
    let report = verify_file(
        &file,
        std::slice::from_ref(&export.head.hash),
        HeadRule::Required,
    )
    .expect("verify");
    assert!(report.ok(), "{:?}", report.first_bad);
    assert!(
        write_export(&file, &export).is_err(),
        "an export never overwrites a file"
    );
}

/// What someone with write access to the tables does shows: an edited
/// line, a removed one in the middle, the last one removed (the head row
/// no longer on the chain).
fn tampering_with_the_chain_is_caught(
    make: &(dyn Fn() -> SharedChain + Sync),
    db: &dyn Fn() -> Box<dyn gateway::db::Db>,
) {
    use gateway::db::End;
    let log = AuditLog::shared(make());
    for i in 0..5 {
        log.append(&format!("req-{i}"), "tool.request", json!({"i": i}))
            .expect("append");
    }
    let good = make().export().expect("export");
    assert!(verify_against(&good.bytes, Some(&good.head), &[]).ok());
    let run = |sql: &str| {
        db().write(&mut |tx| {
            tx.execute(sql, &[])?;
            Ok(End::Commit)
        })
        .expect("tamper");
    };
    let restore = |sql: &str| run(sql);
    // An edited event.
    run("UPDATE gateway_audit SET line = replace(line, '\"i\":2', '\"i\":7') WHERE seq = 3");
    let e = make().export().expect("export");
    let r = verify_against(&e.bytes, Some(&e.head), &[]);
    assert_eq!(r.first_bad.as_ref().map(|b| b.0), Some(3), "{r:?}");
    restore("UPDATE gateway_audit SET line = replace(line, '\"i\":7', '\"i\":2') WHERE seq = 3");
    assert!(verify_against(&make().export().expect("e").bytes, Some(&good.head), &[]).ok());
    // The last event removed: the head row names an event no longer there.
    run("DELETE FROM gateway_audit WHERE seq = 5");
    let e = make().export().expect("export");
    assert_eq!(e.rows, 4);
    assert!(!verify_against(&e.bytes, Some(&e.head), &[]).ok());
    // A middle event removed.
    run("DELETE FROM gateway_audit WHERE seq = 2");
    let e = make().export().expect("export");
    assert!(!verify_against(&e.bytes, Some(&e.head), &[]).ok());
}

/// The audit export's cursor in the team's database: one replica sends
/// at a time, the cursor moves only for the replica that holds it and
/// only from where it read, and a replica that stopped renewing is taken
/// over from the last acknowledged event.
fn the_export_is_sent_by_one_replica_at_a_time(make: &(dyn Fn() -> SharedChain + Sync)) {
    let chain = make();
    let log = AuditLog::shared(make());
    for i in 0..10 {
        log.append(&format!("req-{i}"), "tool.request", json!({"i": i}))
            .expect("append");
    }
    let now = 1_000_000;
    assert_eq!(
        chain.claim_export("siem", "a", now, 30_000).expect("claim"),
        Some((0, String::new()))
    );
    // B waits while A holds it.
    assert_eq!(
        chain
            .claim_export("siem", "b", now + 1, 30_000)
            .expect("claim"),
        None
    );
    let (lines, head) = chain.lines_after(0, 4).expect("read");
    assert_eq!(head, 10);
    assert_eq!(
        lines.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let hash4 = serde_json::from_str::<serde_json::Value>(&lines[3].1).expect("event")["hash"]
        .as_str()
        .expect("hash")
        .to_string();
    // Only the holder moves it, and only from where it is.
    assert!(
        !chain
            .advance_export("siem", "b", 0, 4, &hash4)
            .expect("advance")
    );
    assert!(
        !chain
            .advance_export("siem", "a", 3, 4, &hash4)
            .expect("advance")
    );
    assert!(
        chain
            .advance_export("siem", "a", 0, 4, &hash4)
            .expect("advance")
    );
    assert_eq!(
        chain
            .claim_export("siem", "a", now + 2, 30_000)
            .expect("claim"),
        Some((4, hash4.clone()))
    );
    // A stops renewing: B takes over from the last acknowledged event, and
    // A's late acknowledgement moves nothing.
    assert_eq!(
        chain
            .claim_export("siem", "b", now + 40_000, 30_000)
            .expect("claim"),
        Some((4, hash4.clone()))
    );
    assert!(
        !chain
            .advance_export("siem", "a", 4, 8, "x")
            .expect("advance")
    );
    let (rest, _) = chain.lines_after(4, 100).expect("read");
    assert_eq!(rest.len(), 6);
    // Another export has its own cursor.
    assert_eq!(
        chain
            .claim_export("other", "a", now + 40_001, 30_000)
            .expect("claim"),
        Some((0, String::new()))
    );
}

/// The chain's table of open calls: a call's request opens it under its
/// replica's name, its result ends it, in the same transaction as the
/// line; a survivor's end of a dead replica's call is written once however
/// many survivors try at once, and never over a call that already ended.
fn open_calls_follow_the_chain(make: &(dyn Fn() -> SharedChain + Sync)) {
    drop(make());
    let a = AuditLog::shared({
        let c = make();
        c.set_replica("replica-a");
        c
    });
    let b = AuditLog::shared({
        let c = make();
        c.set_replica("replica-b");
        c
    });
    // A writer that is no replica tracks nothing.
    let cli = AuditLog::shared(make());
    cli.append("req-cli", "tool.request", json!({}))
        .expect("append");
    a.append("req-1", "tool.request", json!({}))
        .expect("append");
    a.append("req-2", "tool.request", json!({}))
        .expect("append");
    b.append("req-3", "tool.request", json!({}))
        .expect("append");
    a.append("req-1", "tool.result", json!({"status": "completed"}))
        .expect("append");
    let open: Vec<(String, String)> = make()
        .open_calls()
        .expect("open")
        .into_iter()
        .map(|c| (c.request_id, c.replica))
        .collect();
    assert_eq!(
        open,
        vec![
            ("req-2".to_string(), "replica-a".to_string()),
            ("req-3".to_string(), "replica-b".to_string())
        ]
    );
    // replica-a is gone; b ends its calls, from two writers at once: once.
    let far = gateway::audit::now_ms() + 60_000;
    let live = vec!["replica-b".to_string()];
    let ended: Vec<Vec<String>> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let live = live.clone();
                scope.spawn(move || {
                    let log = AuditLog::shared(make());
                    log.end_orphaned_calls(&|r| !live.iter().any(|l| l == r), far)
                        .expect("end")
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("join")).collect()
    });
    assert_eq!(
        ended.concat(),
        vec!["req-2".to_string()],
        "ended once: {ended:?}"
    );
    // A call newer than the cut-off is left (its replica may have joined
    // after the list of live ones was read).
    assert!(
        b.end_orphaned_calls(&|_| true, 0).expect("end").is_empty(),
        "nothing older than the cut-off"
    );
    let export = make().export().expect("export");
    let text = String::from_utf8(export.bytes.clone()).expect("utf-8");
    let ends: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"req-2\"") && l.contains("tool.result"))
        .collect();
    assert_eq!(ends.len(), 1, "{ends:?}");
    assert!(ends[0].contains("interrupted") && ends[0].contains("replica-a"));
    let report = verify_against(&export.bytes, Some(&export.head), &[]);
    assert!(report.ok(), "{:?}", report.first_bad);
    // The late end of a call ended by a survivor is still written (it says
    // what happened); it leaves nothing open.
    b.append("req-3", "tool.result", json!({"status": "completed"}))
        .expect("append");
    assert!(make().open_calls().expect("open").is_empty());
}

#[test]
fn the_audit_chain_conforms_on_sqlite() {
    let dir = tempfile::tempdir().expect("tmp");
    let one = dir.path().join("one.db");
    one_chain_for_every_writer(&|| SharedChain::sqlite(&one).expect("open"));
    let two = dir.path().join("two.db");
    tampering_with_the_chain_is_caught(&|| SharedChain::sqlite(&two).expect("open"), &|| {
        Box::new(gateway::db::sqlite::SqliteDb::open(&two, "FULL").expect("db"))
    });
    let three = dir.path().join("three.db");
    the_export_is_sent_by_one_replica_at_a_time(&|| SharedChain::sqlite(&three).expect("open"));
    let four = dir.path().join("four.db");
    open_calls_follow_the_chain(&|| SharedChain::sqlite(&four).expect("open"));
}

#[test]
fn the_audit_chain_conforms_on_postgresql() {
    let server = pg::Postgres::start();
    let one = server.database("chain_writers");
    let connect = |c: &str| gateway::db::postgres::PostgresDb::connect(c, None).expect("connect");
    one_chain_for_every_writer(&|| SharedChain::postgres(connect(&one)).expect("chain"));
    let two = server.database("chain_tamper");
    tampering_with_the_chain_is_caught(
        &|| SharedChain::postgres(connect(&two)).expect("chain"),
        &|| Box::new(connect(&two)),
    );
    let three = server.database("chain_export");
    the_export_is_sent_by_one_replica_at_a_time(&|| {
        SharedChain::postgres(connect(&three)).expect("chain")
    });
    let four = server.database("chain_open_calls");
    open_calls_follow_the_chain(&|| SharedChain::postgres(connect(&four)).expect("chain"));
}
