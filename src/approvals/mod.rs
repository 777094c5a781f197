//! Approvals (README.md: approvals): a SQLite store (WAL, busy timeout, versioned schema)
//! of approvals that are bound to one call, single-use, expiring, and
//! granted only out of band by a person through the CLI.
//!
//! States: `pending` -> `approved` (enough distinct approvers) -> `spent`;
//! `pending` -> `denied`; `pending`/`approved` -> `expired` (by time,
//! computed at every read and spend).
//!
//! The MCP server uses only [`ApprovalStore::create`], [`ApprovalStore::get`]
//! and [`ApprovalStore::spend`]; granting and denying are reached only from
//! the CLI (`gateway approve` / `gateway deny`).

use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod proof;
pub mod signature;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The database file's name under the gateway's home.
pub const FILE_NAME: &str = "approvals.db";

const SCHEMA_VERSION: i64 = 5;

const MIGRATIONS: &[&str] = &[
    // 1: approvals and the verdicts people gave on them.
    r#"
    CREATE TABLE approvals (
        id                 TEXT PRIMARY KEY,
        tool               TEXT NOT NULL,
        params_json        TEXT NOT NULL,
        params_sha256      TEXT NOT NULL,
        plan_sha256        TEXT,
        plan_summary_json  TEXT NOT NULL,
        signals_json       TEXT NOT NULL,
        request_id         TEXT NOT NULL,
        requested_by       TEXT NOT NULL,
        requested_client   TEXT NOT NULL,
        created_at_ms      INTEGER NOT NULL,
        expires_at_ms      INTEGER NOT NULL,
        approvers_required INTEGER NOT NULL CHECK (approvers_required >= 1),
        reason_required    INTEGER NOT NULL,
        state              TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'spent')),
        spent_at_ms        INTEGER,
        spent_request_id   TEXT
    );
    CREATE TABLE verdicts (
        approval_id TEXT NOT NULL REFERENCES approvals(id),
        approver    TEXT NOT NULL,
        verdict     TEXT NOT NULL CHECK (verdict IN ('grant', 'deny')),
        reason      TEXT NOT NULL,
        at_ms       INTEGER NOT NULL,
        UNIQUE (approval_id, approver, verdict)
    );
    CREATE INDEX approvals_state ON approvals(state, expires_at_ms);
    "#,
    // 2: a re-plan supersedes older approvals (a new state, so the table is
    // rebuilt: SQLite cannot change a CHECK); a verdict records how its
    // approver was identified (the OS user the kernel named, or an SSH
    // signature with its statement and key). Verdicts of version 1 were
    // recorded under names nobody proved (`--as`): they are kept as
    // `legacy` and no policy counts them.
    r#"
    CREATE TABLE approvals_v2 (
        id                 TEXT PRIMARY KEY,
        tool               TEXT NOT NULL,
        params_json        TEXT NOT NULL,
        params_sha256      TEXT NOT NULL,
        plan_sha256        TEXT,
        plan_summary_json  TEXT NOT NULL,
        signals_json       TEXT NOT NULL,
        request_id         TEXT NOT NULL,
        requested_by       TEXT NOT NULL,
        requested_client   TEXT NOT NULL,
        created_at_ms      INTEGER NOT NULL,
        expires_at_ms      INTEGER NOT NULL,
        approvers_required INTEGER NOT NULL CHECK (approvers_required >= 1),
        reason_required    INTEGER NOT NULL,
        state              TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'spent', 'superseded')),
        spent_at_ms        INTEGER,
        spent_request_id   TEXT,
        superseded_by      TEXT
    );
    INSERT INTO approvals_v2 SELECT *, NULL FROM approvals;
    CREATE TABLE verdicts_v2 (
        approval_id     TEXT NOT NULL REFERENCES approvals_v2(id),
        approver        TEXT NOT NULL,
        verdict         TEXT NOT NULL CHECK (verdict IN ('grant', 'deny')),
        reason          TEXT NOT NULL,
        at_ms           INTEGER NOT NULL,
        kind            TEXT NOT NULL CHECK (kind IN ('os_user', 'ssh_key', 'legacy')),
        os_user         TEXT NOT NULL,
        key_fingerprint TEXT,
        public_key      TEXT,
        statement       TEXT,
        signature       TEXT,
        UNIQUE (approval_id, approver, verdict)
    );
    INSERT INTO verdicts_v2 (approval_id, approver, verdict, reason, at_ms, kind, os_user)
        SELECT approval_id, approver, verdict, reason, at_ms, 'legacy', '' FROM verdicts;
    DROP TABLE verdicts;
    DROP TABLE approvals;
    ALTER TABLE approvals_v2 RENAME TO approvals;
    ALTER TABLE verdicts_v2 RENAME TO verdicts;
    CREATE INDEX approvals_state ON approvals(state, expires_at_ms);
    CREATE INDEX approvals_call ON approvals(params_sha256, state);
    "#,
    // 3: what the apply that spent an approval did (its outcome as the
    // call returned it, or why it could not end), kept with the approval so
    // that it can be read again after the client went away.
    r#"
    ALTER TABLE approvals ADD COLUMN outcome_json TEXT;
    ALTER TABLE approvals ADD COLUMN outcome_at_ms INTEGER;
    "#,
    // 4: who requested the call, as the policy knows them ({kind, user,
    // email, issuer, subject}): an SSO requester's id is not a name its
    // other identities (an OS user, a key) carry, so the policy needs its
    // names to keep its own grant from counting.
    r#"
    ALTER TABLE approvals ADD COLUMN requester_json TEXT;
    "#,
    // 5: a verdict may be given by an SSO identity (a bearer token the HTTP
    // transport verified): its kind is `sso` and the identity it proved
    // ({issuer, subject, email, groups}) is kept with it, for the policy of
    // the spend to judge again. SQLite cannot change a CHECK: the table is
    // rebuilt.
    r#"
    CREATE TABLE verdicts_v5 (
        approval_id     TEXT NOT NULL REFERENCES approvals(id),
        approver        TEXT NOT NULL,
        verdict         TEXT NOT NULL CHECK (verdict IN ('grant', 'deny')),
        reason          TEXT NOT NULL,
        at_ms           INTEGER NOT NULL,
        kind            TEXT NOT NULL CHECK (kind IN ('os_user', 'ssh_key', 'legacy', 'sso')),
        os_user         TEXT NOT NULL,
        key_fingerprint TEXT,
        public_key      TEXT,
        statement       TEXT,
        signature       TEXT,
        identity_json   TEXT,
        UNIQUE (approval_id, approver, verdict)
    );
    INSERT INTO verdicts_v5 (approval_id, approver, verdict, reason, at_ms, kind, os_user,
            key_fingerprint, public_key, statement, signature)
        SELECT approval_id, approver, verdict, reason, at_ms, kind, os_user,
            key_fingerprint, public_key, statement, signature FROM verdicts;
    DROP TABLE verdicts;
    ALTER TABLE verdicts_v5 RENAME TO verdicts;
    "#,
];

#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("approval database {path}: {source}")]
    Db {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "approval database {path} has schema version {found}, newer than this gateway understands ({SCHEMA_VERSION})"
    )]
    SchemaTooNew { path: PathBuf, found: i64 },
    #[error("stored approval {id} is corrupt: {message}")]
    Corrupt { id: String, message: String },
    #[error("cannot generate an approval id: {0}")]
    Random(String),
}

/// Why a grant, denial or spend was refused. Each names the check that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum Refusal {
    #[error("no approval with id {id}")]
    UnknownId { id: String },
    #[error("approval {id} expired at {expired_at}")]
    Expired { id: String, expired_at: String },
    #[error("approval {id} was denied")]
    Denied { id: String },
    #[error("approval {id} was already spent")]
    AlreadySpent { id: String },
    #[error("approval {id} is still pending: {given} of {needed} approvals given")]
    NotApproved { id: String, given: u32, needed: u32 },
    #[error("approval {id} is already {state}; nothing to decide")]
    AlreadyDecided { id: String, state: String },
    #[error("approval {id} is bound to other params (params digest differs)")]
    ParamsMismatch { id: String },
    #[error(
        "approval {id} is bound to another plan (plan digest differs: re-planned or changed plan file)"
    )]
    PlanMismatch { id: String },
    #[error("approval {id} is for tool {bound}, not {asked}")]
    ToolMismatch {
        id: String,
        bound: String,
        asked: String,
    },
    #[error(
        "approval {id} was superseded by {by}: the call was planned again; approve the newer plan"
    )]
    Superseded { id: String, by: String },
    #[error("{approver} already approved {id}; it needs approvals from other people")]
    DuplicateApprover { id: String, approver: String },
    #[error("approval {id} requires a reason (--reason)")]
    ReasonRequired { id: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Pending,
    Approved,
    Denied,
    Spent,
    Superseded,
    Expired,
}

impl State {
    fn parse(s: &str) -> Option<State> {
        Some(match s {
            "pending" => State::Pending,
            "approved" => State::Approved,
            "denied" => State::Denied,
            "spent" => State::Spent,
            "superseded" => State::Superseded,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Approved => "approved",
            State::Denied => "denied",
            State::Spent => "spent",
            State::Superseded => "superseded",
            State::Expired => "expired",
        }
    }
}

/// What is recorded when a call needs approval.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub tool: String,
    pub params: Value,
    /// SHA-256 of the saved plan file, when the call applies a plan.
    pub plan_sha256: Option<String>,
    /// What the plan would do: each resource change (address, actions,
    /// reason, replace paths), for the approver to read.
    pub plan_summary: Value,
    /// The decision's signals.
    pub signals: Value,
    pub request_id: String,
    pub requested_by: String,
    pub requested_client: String,
    /// The requester as the policy knows them (`{kind, user, email,
    /// issuer, subject}`), or null.
    pub requester: Value,
    pub approvers_required: u32,
    pub ttl: Duration,
    pub reason_required: bool,
}

/// A verdict as recorded: who gave it, and how they were identified.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The identity the verdict counts for (an SSH principal, or an OS user).
    pub approver: String,
    pub verdict: String,
    pub reason: String,
    pub at: String,
    /// `ssh_key` (a signature checked against the allowed signers),
    /// `os_user` (the user the kernel named), or `legacy` (a name given
    /// before identities were proven; never counted).
    pub kind: String,
    /// The OS user who submitted it, as the kernel named them (empty for
    /// an SSO identity).
    pub os_user: String,
    /// `sso`: the identity its token proved (`{issuer, subject, email,
    /// groups}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_fingerprint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
    /// The signed statement and its signature, kept so anyone can re-check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statement: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// Who gives a verdict, as proven (never as claimed): the identity it is
/// recorded under, and for a signed one the signer and what was signed.
#[derive(Debug, Clone)]
pub struct Approver {
    pub name: String,
    /// `ssh_key`, `os_user` or `sso`.
    pub kind: &'static str,
    pub os_user: String,
    pub signed: Option<(signature::Signer, signature::Signed)>,
    /// `sso`: what the verified token proved (`{issuer, subject, email,
    /// groups}`), kept with the verdict.
    pub identity: Option<Value>,
}

/// An approval as read (with its effective state: expiry is applied).
#[derive(Debug, Clone, Serialize)]
pub struct Approval {
    pub id: String,
    pub tool: String,
    pub params: Value,
    pub params_sha256: String,
    pub plan_sha256: Option<String>,
    pub plan_summary: Value,
    pub signals: Value,
    pub request_id: String,
    pub requested_by: String,
    pub requested_client: String,
    /// The requester as the policy knows them (null for approvals made
    /// before schema 4: their `requested_by` is an OS user's name).
    pub requester: Value,
    pub created_at: String,
    pub expires_at: String,
    pub approvers_required: u32,
    pub reason_required: bool,
    pub state: State,
    pub verdicts: Vec<Verdict>,
    pub spent_at: Option<String>,
    pub spent_request_id: Option<String>,
    /// The newer approval of the same call that replaced this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// How the call that spent it ended (`None` while it runs, and for
    /// an approval never spent): the outcome as that call returned it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome_at: Option<String>,
    #[serde(skip)]
    pub created_at_ms: i64,
    #[serde(skip)]
    pub expires_at_ms: i64,
}

impl Approval {
    /// The statement an approver signs to give `verdict` with `reason`,
    /// valid until `expires_at_ms` (never past the approval's own expiry).
    pub fn statement(
        &self,
        verdict: &str,
        reason: &str,
        expires_at_ms: i64,
    ) -> signature::Statement {
        signature::Statement {
            kind: signature::STATEMENT_TYPE.into(),
            approval_id: self.id.clone(),
            tool: self.tool.clone(),
            params_sha256: self.params_sha256.clone(),
            plan_sha256: self.plan_sha256.clone(),
            verdict: verdict.into(),
            reason: reason.into(),
            expires_at: ms_to_rfc3339(expires_at_ms.min(self.expires_at_ms)),
        }
    }

    /// Distinct people who granted it.
    pub fn grants(&self) -> u32 {
        self.verdicts
            .iter()
            .filter(|v| v.verdict == "grant")
            .count() as u32
    }
}

#[derive(Debug)]
pub struct ApprovalStore {
    path: PathBuf,
    conn: Connection,
}

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn ms_to_rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| ms.to_string())
}

/// A new approval id: `ap-` and 160 random bits, lowercase hex.
pub fn new_id() -> Result<String, ApprovalError> {
    let mut bytes = [0u8; 20];
    getrandom::fill(&mut bytes).map_err(|e| ApprovalError::Random(e.to_string()))?;
    Ok(format!("ap-{}", hex::encode(bytes)))
}

impl ApprovalStore {
    /// Open (creating and migrating) the database at `path`.
    pub fn open(path: impl Into<PathBuf>) -> Result<ApprovalStore, ApprovalError> {
        let path = path.into();
        let conn = crate::db::open(&path, "NORMAL").map_err(|source| ApprovalError::Db {
            path: path.clone(),
            source,
        })?;
        let mut store = ApprovalStore { path, conn };
        store.migrate()?;
        Ok(store)
    }

    /// The database under a gateway home directory.
    pub fn in_home(home: &Path) -> Result<ApprovalStore, ApprovalError> {
        ApprovalStore::open(home.join(FILE_NAME))
    }

    fn db(&self) -> impl Fn(rusqlite::Error) -> ApprovalError + '_ {
        move |source| ApprovalError::Db {
            path: self.path.clone(),
            source,
        }
    }

    fn migrate(&mut self) -> Result<(), ApprovalError> {
        let path = self.path.clone();
        let db = |source| ApprovalError::Db {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(db)?;
        if version > SCHEMA_VERSION {
            return Err(ApprovalError::SchemaTooNew {
                path,
                found: version,
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.execute_batch(sql).map_err(db)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)
                .map_err(db)?;
        }
        tx.commit().map_err(db)
    }

    /// Record a pending approval, and in the same transaction supersede
    /// every live (pending or approved, unexpired) approval of the same
    /// tool and params requested by the same user: their plans are older.
    /// (Another user's are left alone: its working dir is in its own
    /// workspace, and its call is not this user's to cancel.) Returns the new approval and
    /// the ids it superseded.
    pub fn create(&mut self, new: &NewApproval) -> Result<(Approval, Vec<String>), ApprovalError> {
        let id = new_id()?;
        let now = now_ms();
        let ttl_ms = i64::try_from(new.ttl.as_millis()).unwrap_or(i64::MAX);
        let params = crate::canonical::canonical_json(&new.params);
        let digest = crate::canonical::call_digest(&new.tool, &new.params);
        let path = self.path.clone();
        let db = |source| ApprovalError::Db {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        let superseded: Vec<String> = {
            let mut stmt = tx
                .prepare(
                    "SELECT id FROM approvals WHERE params_sha256 = ?1 AND requested_by = ?3
                     AND state IN ('pending', 'approved') AND expires_at_ms > ?2 ORDER BY created_at_ms, id",
                )
                .map_err(db)?;
            let rows = stmt
                .query_map(params![digest, now, new.requested_by], |r| r.get(0))
                .map_err(db)?;
            rows.collect::<Result<_, _>>().map_err(db)?
        };
        tx.execute(
            "INSERT INTO approvals (id, tool, params_json, params_sha256, plan_sha256, plan_summary_json,
                signals_json, request_id, requested_by, requested_client, created_at_ms, expires_at_ms,
                approvers_required, reason_required, state, requester_json)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, 'pending', ?15)",
            params![
                id,
                new.tool,
                params,
                digest,
                new.plan_sha256,
                new.plan_summary.to_string(),
                new.signals.to_string(),
                new.request_id,
                new.requested_by,
                new.requested_client,
                now,
                now.saturating_add(ttl_ms),
                new.approvers_required.max(1),
                new.reason_required,
                (!new.requester.is_null()).then(|| new.requester.to_string()),
            ],
        )
        .map_err(db)?;
        for old in &superseded {
            tx.execute(
                "UPDATE approvals SET state = 'superseded', superseded_by = ?2
                 WHERE id = ?1 AND state IN ('pending', 'approved')",
                params![old, id],
            )
            .map_err(db)?;
        }
        tx.commit().map_err(db)?;
        let created = self.get(&id)?.ok_or_else(|| ApprovalError::Corrupt {
            id,
            message: "vanished after insert".into(),
        })?;
        Ok((created, superseded))
    }

    /// One approval with its effective state, or `None`.
    pub fn get(&self, id: &str) -> Result<Option<Approval>, ApprovalError> {
        read_approval(&self.conn, id, now_ms()).map_err(|e| self.map(e))
    }

    fn map(&self, e: ReadError) -> ApprovalError {
        map_read(&self.path, e)
    }

    /// Approvals, newest first. `all == false`: only pending and approved
    /// (not yet spent, not expired).
    pub fn list(&self, all: bool) -> Result<Vec<Approval>, ApprovalError> {
        let ids: Vec<String> = {
            let mut stmt = self
                .conn
                .prepare("SELECT id FROM approvals ORDER BY created_at_ms DESC, id")
                .map_err(self.db())?;
            let rows = stmt.query_map([], |r| r.get(0)).map_err(self.db())?;
            rows.collect::<Result<_, _>>().map_err(self.db())?
        };
        let now = now_ms();
        let mut out = Vec::new();
        for id in ids {
            if let Some(a) = read_approval(&self.conn, &id, now).map_err(|e| self.map(e))?
                && (all || matches!(a.state, State::Pending | State::Approved))
            {
                out.push(a);
            }
        }
        Ok(out)
    }

    /// A person grants the approval. Becomes `approved` once enough distinct
    /// identities granted it. Whether this approver may is the policy's
    /// (asked before); the store checks the approval's own state and binding.
    pub fn grant(
        &mut self,
        id: &str,
        approver: &Approver,
        reason: &str,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        self.decide(id, approver, reason, "grant")
    }

    /// A person denies the approval: it can no longer be approved or spent.
    pub fn deny(
        &mut self,
        id: &str,
        approver: &Approver,
        reason: &str,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        self.decide(id, approver, reason, "deny")
    }

    fn decide(
        &mut self,
        id: &str,
        approver: &Approver,
        reason: &str,
        verdict: &str,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        self.change(id, |tx, approval, now, db| {
            decide_in(tx, approval, now, db, approver, reason, verdict)
        })
    }

    /// One change to approval `id`, in one immediate transaction: read it
    /// (an unknown id is a refusal), let `f` check and write, then read it
    /// back and commit. A refusal from `f` rolls back.
    fn change(
        &mut self,
        id: &str,
        f: impl FnOnce(
            &Connection,
            &Approval,
            i64,
            &dyn Fn(rusqlite::Error) -> ApprovalError,
        ) -> Result<Option<Refusal>, ApprovalError>,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        let path = self.path.clone();
        let db = |source| ApprovalError::Db {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db)?;
        let now = now_ms();
        let approval = match read_for_update(&tx, &path, id, now)? {
            Ok(a) => a,
            Err(r) => return Ok(Err(r)),
        };
        if let Some(r) = f(&tx, &approval, now, &db)? {
            return Ok(Err(r));
        }
        let after = read_approval(&tx, id, now).map_err(|e| map_read(&path, e))?;
        tx.commit().map_err(db)?;
        after.map(Ok).ok_or_else(|| ApprovalError::Corrupt {
            id: id.into(),
            message: "vanished".into(),
        })
    }

    /// Spend the approval for one call: in one transaction, check that it
    /// exists, is approved, has not expired, is for this tool, and is bound
    /// to these params and this plan digest; then mark it spent. Of any
    /// number of concurrent spenders exactly one succeeds.
    pub fn spend(
        &mut self,
        id: &str,
        tool: &str,
        params: &Value,
        plan_sha256: Option<&str>,
        request_id: &str,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        self.change(id, |tx, approval, now, db| {
            let refusal = match approval.state {
                State::Expired | State::Denied | State::Spent | State::Superseded => {
                    ended(approval)
                }
                State::Pending => Some(Refusal::NotApproved {
                    id: id.into(),
                    given: approval.grants(),
                    needed: approval.approvers_required,
                }),
                State::Approved => None,
            }
            .or_else(|| {
                (approval.tool != tool).then(|| Refusal::ToolMismatch {
                    id: id.into(),
                    bound: approval.tool.clone(),
                    asked: tool.into(),
                })
            })
            .or_else(|| {
                (approval.params_sha256 != crate::canonical::call_digest(tool, params))
                    .then(|| Refusal::ParamsMismatch { id: id.into() })
            })
            .or_else(|| {
                (approval.plan_sha256.as_deref() != plan_sha256)
                    .then(|| Refusal::PlanMismatch { id: id.into() })
            });
            if refusal.is_some() {
                return Ok(refusal);
            }
            // The state check again in the UPDATE itself: even without the
            // immediate transaction, only one spender could flip it.
            let changed = tx
                .execute(
                    "UPDATE approvals SET state = 'spent', spent_at_ms = ?2, spent_request_id = ?3
                     WHERE id = ?1 AND state = 'approved' AND expires_at_ms > ?2",
                    params![id, now, request_id],
                )
                .map_err(db)?;
            Ok((changed != 1).then(|| Refusal::AlreadySpent { id: id.into() }))
        })
    }

    /// Record how the call that spent approval `id` (request `request_id`)
    /// ended. Only that call's outcome is taken, once: returns whether it
    /// was recorded (false: not spent by that request, or recorded already).
    pub fn record_outcome(
        &mut self,
        id: &str,
        request_id: &str,
        outcome: &Value,
    ) -> Result<bool, ApprovalError> {
        let changed = self
            .conn
            .execute(
                "UPDATE approvals SET outcome_json = ?3, outcome_at_ms = ?4
                 WHERE id = ?1 AND state = 'spent' AND spent_request_id = ?2 AND outcome_json IS NULL",
                params![id, request_id, outcome.to_string(), now_ms()],
            )
            .map_err(self.db())?;
        Ok(changed == 1)
    }
}

/// The checks and writes of a grant or a denial, inside [`ApprovalStore::change`].
fn decide_in(
    tx: &Connection,
    approval: &Approval,
    now: i64,
    db: &dyn Fn(rusqlite::Error) -> ApprovalError,
    approver: &Approver,
    reason: &str,
    verdict: &str,
) -> Result<Option<Refusal>, ApprovalError> {
    let id = approval.id.as_str();
    let refusal = match approval.state {
        State::Expired | State::Denied | State::Spent | State::Superseded => ended(approval),
        State::Approved => Some(Refusal::AlreadyDecided {
            id: id.into(),
            state: "approved".into(),
        }),
        State::Pending => None,
    }
    .or_else(|| {
        (approval.reason_required && reason.trim().is_empty())
            .then(|| Refusal::ReasonRequired { id: id.into() })
    })
    .or_else(|| {
        // One identity counts once (the policy refuses a second grant too;
        // this holds when two grants race).
        approval
            .verdicts
            .iter()
            .any(|v| v.verdict == verdict && v.approver == approver.name)
            .then(|| Refusal::DuplicateApprover {
                id: id.into(),
                approver: approver.name.clone(),
            })
    });
    if refusal.is_some() {
        return Ok(refusal);
    }
    let (signer, signed) = match &approver.signed {
        Some((signer, signed)) => (Some(signer), Some(signed)),
        None => (None, None),
    };
    tx.execute(
        "INSERT INTO verdicts (approval_id, approver, verdict, reason, at_ms, kind, os_user, key_fingerprint,
            public_key, statement, signature, identity_json)
            VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            id,
            approver.name,
            verdict,
            reason,
            now,
            approver.kind,
            approver.os_user,
            signer.map(|s| s.fingerprint.clone()),
            signer.map(|s| s.public_key.clone()),
            signed.map(|s| s.statement.clone()),
            signed.map(|s| s.signature.clone()),
            approver.identity.as_ref().map(|v| v.to_string()),
        ],
    )
    .map_err(db)?;
    let grants: i64 = tx
        .query_row(
            "SELECT COUNT(DISTINCT approver) FROM verdicts WHERE approval_id = ?1 AND verdict = 'grant'",
            [id],
            |r| r.get(0),
        )
        .map_err(db)?;
    let next = if verdict == "deny" {
        "denied"
    } else if grants >= i64::from(approval.approvers_required) {
        "approved"
    } else {
        "pending"
    };
    tx.execute(
        "UPDATE approvals SET state = ?2 WHERE id = ?1 AND state = 'pending'",
        params![id, next],
    )
    .map_err(db)?;
    Ok(None)
}

/// Read an approval inside a write transaction; an unknown id is a refusal.
fn read_for_update(
    conn: &Connection,
    path: &Path,
    id: &str,
    now: i64,
) -> Result<Result<Approval, Refusal>, ApprovalError> {
    match read_approval(conn, id, now) {
        Ok(Some(a)) => Ok(Ok(a)),
        Ok(None) => Ok(Err(Refusal::UnknownId { id: id.into() })),
        Err(e) => Err(map_read(path, e)),
    }
}

/// The refusal for an approval that has ended: expired, denied or spent.
fn ended(a: &Approval) -> Option<Refusal> {
    match a.state {
        State::Expired => Some(Refusal::Expired {
            id: a.id.clone(),
            expired_at: a.expires_at.clone(),
        }),
        State::Denied => Some(Refusal::Denied { id: a.id.clone() }),
        State::Spent => Some(Refusal::AlreadySpent { id: a.id.clone() }),
        State::Superseded => Some(Refusal::Superseded {
            id: a.id.clone(),
            by: a.superseded_by.clone().unwrap_or_default(),
        }),
        State::Pending | State::Approved => None,
    }
}

fn map_read(path: &Path, e: ReadError) -> ApprovalError {
    match e {
        ReadError::Db(source) => ApprovalError::Db {
            path: path.to_path_buf(),
            source,
        },
        ReadError::Corrupt(id, message) => ApprovalError::Corrupt { id, message },
    }
}

enum ReadError {
    Db(rusqlite::Error),
    Corrupt(String, String),
}

impl From<rusqlite::Error> for ReadError {
    fn from(e: rusqlite::Error) -> Self {
        ReadError::Db(e)
    }
}

fn read_approval(conn: &Connection, id: &str, now: i64) -> Result<Option<Approval>, ReadError> {
    let row = conn
        .query_row(
            "SELECT id, tool, params_json, params_sha256, plan_sha256, plan_summary_json, signals_json, request_id,
                    requested_by, requested_client, created_at_ms, expires_at_ms, approvers_required,
                    reason_required, state, spent_at_ms, spent_request_id, superseded_by,
                    outcome_json, outcome_at_ms, requester_json
             FROM approvals WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    (r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?),
                    (r.get::<_, Option<String>>(4)?, r.get::<_, String>(5)?, r.get::<_, String>(6)?, r.get::<_, String>(7)?),
                    (r.get::<_, String>(8)?, r.get::<_, String>(9)?, r.get::<_, i64>(10)?, r.get::<_, i64>(11)?),
                    (r.get::<_, i64>(12)?, r.get::<_, bool>(13)?, r.get::<_, String>(14)?),
                    (r.get::<_, Option<i64>>(15)?, r.get::<_, Option<String>>(16)?, r.get::<_, Option<String>>(17)?),
                    (r.get::<_, Option<String>>(18)?, r.get::<_, Option<i64>>(19)?, r.get::<_, Option<String>>(20)?),
                ))
            },
        )
        .optional()?;
    let Some((
        (id, tool, params_json, params_sha256),
        (plan_sha256, summary, signals, request_id),
        (by, client, created, expires),
        (required, reason_required, state),
        (spent_at, spent_req, superseded_by),
        (outcome_json, outcome_at, requester_json),
    )) = row
    else {
        return Ok(None);
    };
    let corrupt = |m: String| ReadError::Corrupt(id.clone(), m);
    let json = |s: &str| serde_json::from_str::<Value>(s).map_err(|e| corrupt(e.to_string()));
    let stored = State::parse(&state).ok_or_else(|| corrupt(format!("unknown state {state}")))?;
    let effective = if matches!(stored, State::Pending | State::Approved) && now >= expires {
        State::Expired
    } else {
        stored
    };
    let mut stmt = conn.prepare(
        "SELECT approver, verdict, reason, at_ms, kind, os_user, key_fingerprint, public_key, statement, signature,
                identity_json
         FROM verdicts WHERE approval_id = ?1 ORDER BY at_ms, rowid",
    )?;
    let verdicts = stmt
        .query_map([&id], |r| {
            Ok(Verdict {
                approver: r.get(0)?,
                verdict: r.get(1)?,
                reason: r.get(2)?,
                at: ms_to_rfc3339(r.get(3)?),
                kind: r.get(4)?,
                os_user: r.get(5)?,
                key_fingerprint: r.get(6)?,
                public_key: r.get(7)?,
                statement: r.get(8)?,
                signature: r.get(9)?,
                identity: r
                    .get::<_, Option<String>>(10)?
                    .and_then(|t| serde_json::from_str(&t).ok()),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Approval {
        params: json(&params_json)?,
        plan_summary: json(&summary)?,
        signals: json(&signals)?,
        id: id.clone(),
        tool,
        params_sha256,
        plan_sha256,
        request_id,
        requested_by: by,
        requested_client: client,
        requester: requester_json
            .as_deref()
            .map(json)
            .transpose()?
            .unwrap_or(Value::Null),
        created_at: ms_to_rfc3339(created),
        expires_at: ms_to_rfc3339(expires),
        approvers_required: u32::try_from(required).unwrap_or(1),
        reason_required,
        state: effective,
        verdicts,
        spent_at: spent_at.map(ms_to_rfc3339),
        spent_request_id: spent_req,
        superseded_by,
        outcome: outcome_json.as_deref().map(json).transpose()?,
        outcome_at: outcome_at.map(ms_to_rfc3339),
        created_at_ms: created,
        expires_at_ms: expires,
    }))
}

/// What a plan would do, for the approver: each resource change that is not
/// a no-op, as `{address, actions, reason, paths}` (taken from the plan JSON
/// as is; what counts as destructive is the policy's signals, stored apart).
pub fn plan_summary(plan: &regorus::Value) -> Value {
    use regorus::Value as R;
    let json = |v: &R| match v {
        R::Undefined => Value::Null,
        v => serde_json::to_value(v).unwrap_or(Value::Null),
    };
    // Read in place: a large plan's changes are not copied to be summed up.
    let Ok(changes) = plan["resource_changes"].as_array() else {
        return Value::Array(vec![]);
    };
    let no_op = R::from(vec![R::from("no-op")]);
    Value::Array(
        changes
            .iter()
            .filter(|rc| rc["change"]["actions"] != no_op)
            .map(|rc| {
                // The plan is a sandbox's output: each field keeps its
                // type or is null, so that what the approver and the MCP
                // output schema see is always the shape they expect.
                let address = match (rc["address"].as_string(), rc["deposed"].as_string()) {
                    (Ok(a), Ok(d)) => format!("{a} (deposed object {d})").into(),
                    (Ok(a), _) => Value::String(a.to_string()),
                    _ => Value::Null,
                };
                let actions = match rc["change"]["actions"].as_array() {
                    Ok(a) if a.iter().all(|x| x.as_string().is_ok()) => {
                        json(&rc["change"]["actions"])
                    }
                    _ => Value::Null,
                };
                let reason = match rc["action_reason"].as_string() {
                    Ok(r) => Value::String(r.to_string()),
                    Err(_) => Value::Null,
                };
                let paths = match &rc["change"]["replace_paths"] {
                    R::Undefined => serde_json::json!([]),
                    p if p.as_array().is_ok() => json(p),
                    _ => Value::Null,
                };
                serde_json::json!({
                    "address": address,
                    "actions": actions,
                    "reason": reason,
                    "paths": paths,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    fn store() -> (tempfile::TempDir, ApprovalStore) {
        let dir = tempfile::tempdir().expect("tmp");
        let s = ApprovalStore::in_home(dir.path()).expect("open");
        (dir, s)
    }

    const MIN30: Duration = Duration::from_secs(1800);

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

    #[test]
    fn create_grant_spend_then_refuse_reuse() {
        let (_d, mut s) = store();
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

    #[test]
    fn only_the_spending_request_records_the_outcome_and_only_once() {
        let (_d, mut s) = store();
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

    #[test]
    fn params_plan_and_tool_are_bound() {
        let (_d, mut s) = store();
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

    #[test]
    fn expiry_is_checked_at_read_grant_and_spend() {
        let (_d, mut s) = store();
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

    #[test]
    fn a_denial_ends_it() {
        let (_d, mut s) = store();
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

    #[test]
    fn one_identity_counts_once() {
        let (_d, mut s) = store();
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

    #[test]
    fn a_new_plan_of_the_same_call_supersedes_older_live_approvals() {
        let (_d, mut s) = store();
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

    #[test]
    fn a_version_1_database_is_migrated_and_its_unproven_verdicts_are_legacy() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE_NAME);
        {
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(MIGRATIONS[0]).expect("v1");
            conn.pragma_update(None, "user_version", 1).expect("v");
            conn.execute_batch(
                "INSERT INTO approvals VALUES ('ap-old', 'terraform_apply', '{}', 'd', NULL, '[]', '[]', 'r', 'alice', 'c',
                   0, 9999999999999, 1, 0, 'approved', NULL, NULL);
                 INSERT INTO verdicts VALUES ('ap-old', 'someone', 'grant', '', 1);",
            )
            .expect("rows");
        }
        let mut s = ApprovalStore::open(&path).expect("migrate");
        let a = s.get("ap-old").expect("db").expect("kept");
        assert_eq!(a.state, State::Approved);
        assert_eq!(a.verdicts[0].kind, "legacy");
        // The new state is accepted by the rebuilt table.
        let mut n = new(1, MIN30);
        n.params = json!({});
        n.tool = "terraform_apply".into();
        s.conn
            .execute(
                "UPDATE approvals SET params_sha256 = ?1",
                [crate::canonical::call_digest("terraform_apply", &json!({}))],
            )
            .expect("digest");
        let (_, gone) = s.create(&n).expect("create");
        assert_eq!(gone, vec!["ap-old".to_string()]);
    }

    #[test]
    fn a_required_reason_must_be_given() {
        let (_d, mut s) = store();
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

    #[test]
    fn unknown_ids_are_refused() {
        let (_d, mut s) = store();
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

    #[test]
    fn schema_is_versioned_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE_NAME);
        drop(ApprovalStore::open(&path).expect("open"));
        let conn = Connection::open(&path).expect("open");
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .expect("pragma");
        assert_eq!(v, SCHEMA_VERSION);
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .expect("pragma");
        assert_eq!(mode, "wal");
        conn.pragma_update(None, "user_version", 99).expect("bump");
        drop(conn);
        assert!(matches!(
            ApprovalStore::open(&path),
            Err(ApprovalError::SchemaTooNew { found: 99, .. })
        ));
    }

    #[test]
    fn plan_summary_lists_every_change_but_no_ops() {
        let plan: Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/policy-tests/plans/replace/data.json"
            ))
            .expect("fixture"),
        )
        .expect("json");
        assert_eq!(
            plan_summary(&regorus::Value::from(plan)),
            json!([{"address": "terraform_data.web", "actions": ["delete", "create"], "reason": "replace_because_cannot_update", "paths": [["triggers_replace"]]}])
        );
        assert_eq!(
            plan_summary(&regorus::Value::from(json!({"format_version": "1.2"}))),
            json!([])
        );
        // A deposed object is named apart; a change without replace_paths
        // or action_reason says so with [] and null.
        let deposed = json!({"resource_changes": [
            {"address": "a.b", "deposed": "00ab", "change": {"actions": ["delete"]}},
            {"address": "a.c", "change": {"actions": ["no-op"]}},
            {"change": {"actions": ["create"]}},
        ]});
        assert_eq!(
            plan_summary(&regorus::Value::from(deposed)),
            json!([
                {"address": "a.b (deposed object 00ab)", "actions": ["delete"], "reason": null, "paths": []},
                {"address": null, "actions": ["create"], "reason": null, "paths": []},
            ])
        );
        // Fields of the wrong type (the plan is a sandbox's output) are null,
        // never passed on as they came.
        let hostile = json!({"resource_changes": [
            {"address": 7, "action_reason": ["x"], "change": {"actions": "delete", "replace_paths": "p"}},
            {"address": "a.d", "change": {"actions": ["delete", 3]}},
        ]});
        assert_eq!(
            plan_summary(&regorus::Value::from(hostile)),
            json!([
                {"address": null, "actions": null, "reason": null, "paths": null},
                {"address": "a.d", "actions": null, "reason": null, "paths": []},
            ])
        );
    }
}
