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

pub mod passkey;
pub mod proof;
pub mod review;
pub mod signature;

use gateway_store::postgres::PostgresDb;
use gateway_store::sqlite::SqliteDb;
use gateway_store::{Db, DbError, End, Tx};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a verdict is told to every replica listening (PostgreSQL's
/// LISTEN/NOTIFY; the payload is the approval's id).
pub const CHANGES_CHANNEL: &str = "gateway_approvals";

/// The database file's name under the gateway's home.
pub const FILE_NAME: &str = "approvals.db";

const SCHEMA_VERSION: i64 = 7;

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
    // 6: a verdict may be given with a passkey (the approval page): its
    // kind is `passkey`, its credential, statement and assertion are kept
    // like a key's signature. SQLite cannot change a CHECK: rebuilt.
    r#"
    CREATE TABLE verdicts_v6 (
        approval_id     TEXT NOT NULL REFERENCES approvals(id),
        approver        TEXT NOT NULL,
        verdict         TEXT NOT NULL CHECK (verdict IN ('grant', 'deny')),
        reason          TEXT NOT NULL,
        at_ms           INTEGER NOT NULL,
        kind            TEXT NOT NULL CHECK (kind IN ('os_user', 'ssh_key', 'legacy', 'sso', 'passkey')),
        os_user         TEXT NOT NULL,
        key_fingerprint TEXT,
        public_key      TEXT,
        statement       TEXT,
        signature       TEXT,
        identity_json   TEXT,
        UNIQUE (approval_id, approver, verdict)
    );
    INSERT INTO verdicts_v6 SELECT * FROM verdicts;
    DROP TABLE verdicts;
    ALTER TABLE verdicts_v6 RENAME TO verdicts;
    "#,
    // 7: single-use marks of the approval page (a sign-in's challenge once
    // used, a session signed out), shared by replicas ([`ApprovalStore::spend_once`]).
    ONCE_MARKS,
];

/// How long past its expiry a single-use mark is kept (replicas' clocks
/// differ by a little).
const ONCE_MARGIN_MS: i64 = 5 * 60 * 1000;

/// [`ApprovalStore::spend_once`]'s table, the same on both databases.
const ONCE_MARKS: &str = r#"
    CREATE TABLE once_marks (
        id            TEXT PRIMARY KEY,
        expires_at_ms BIGINT NOT NULL
    );
    CREATE INDEX once_marks_expiry ON once_marks(expires_at_ms);
    "#;

#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error("approval database {at}: {source}")]
    Db {
        at: String,
        #[source]
        source: DbError,
    },
    #[error(
        "approval database {at} has schema version {found}, newer than this gateway understands ({SCHEMA_VERSION})"
    )]
    SchemaTooNew { at: String, found: i64 },
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

/// Where approvals are kept: a SQLite file (one host) or PostgreSQL (the
/// replicas of a team gateway), behind [`gateway_store::Db`]. The checks and
/// writes are the same on both.
#[derive(Debug)]
pub struct ApprovalStore {
    db: Box<dyn Db>,
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

/// The schema on PostgreSQL (refinery's versions; SQLite's history is
/// [`MIGRATIONS`]): the tables of SQLite's version 5, then its version 6's change.
const POSTGRES_MIGRATIONS: &[(&str, &str)] = &[
    (
        "V1__approvals",
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
        created_at_ms      BIGINT NOT NULL,
        expires_at_ms      BIGINT NOT NULL,
        approvers_required BIGINT NOT NULL CHECK (approvers_required >= 1),
        reason_required    BOOLEAN NOT NULL,
        state              TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'spent', 'superseded')),
        spent_at_ms        BIGINT,
        spent_request_id   TEXT,
        superseded_by      TEXT,
        outcome_json       TEXT,
        outcome_at_ms      BIGINT,
        requester_json     TEXT
    );
    CREATE INDEX approvals_state ON approvals(state, expires_at_ms);
    CREATE INDEX approvals_call ON approvals(params_sha256, state);
    CREATE TABLE verdicts (
        rowid           BIGSERIAL PRIMARY KEY,
        approval_id     TEXT NOT NULL REFERENCES approvals(id),
        approver        TEXT NOT NULL,
        verdict         TEXT NOT NULL CHECK (verdict IN ('grant', 'deny')),
        reason          TEXT NOT NULL,
        at_ms           BIGINT NOT NULL,
        kind            TEXT NOT NULL CHECK (kind IN ('os_user', 'ssh_key', 'legacy', 'sso')),
        os_user         TEXT NOT NULL,
        key_fingerprint TEXT,
        public_key      TEXT,
        statement       TEXT,
        signature       TEXT,
        identity_json   TEXT,
        UNIQUE (approval_id, approver, verdict)
    );
    "#,
    ),
    (
        "V2__passkey_verdicts",
        r#"
    ALTER TABLE verdicts DROP CONSTRAINT verdicts_kind_check;
    ALTER TABLE verdicts ADD CONSTRAINT verdicts_kind_check
        CHECK (kind IN ('os_user', 'ssh_key', 'legacy', 'sso', 'passkey'));
    "#,
    ),
    ("V3__once_marks", ONCE_MARKS),
];

/// What a transaction found, kept out of it (a transaction may run again).
type Found<T> = Option<Result<T, ApprovalError>>;

/// How a write transaction runs with the others ([`Db::write`],
/// [`Db::write_queued`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    Serializable,
    Queued,
}

impl ApprovalStore {
    /// Open (creating and migrating) the SQLite database at `path`.
    pub fn open(path: impl Into<PathBuf>) -> Result<ApprovalStore, ApprovalError> {
        let path = path.into();
        let at = path.display().to_string();
        let mut db = SqliteDb::open(&path, "NORMAL").map_err(|source| ApprovalError::Db {
            at: at.clone(),
            source,
        })?;
        migrate_sqlite(db.connection(), &at)?;
        Ok(ApprovalStore { db: Box::new(db) })
    }

    /// The SQLite database under a gateway home directory.
    pub fn in_home(home: &Path) -> Result<ApprovalStore, ApprovalError> {
        ApprovalStore::open(home.join(FILE_NAME))
    }

    /// Approvals in a PostgreSQL database (libpq connection string or
    /// URL; `ca_file`: CA certificates for its TLS, beside the system's),
    /// its schema brought up to date.
    pub fn postgres(
        conninfo: &str,
        ca_file: Option<&Path>,
    ) -> Result<ApprovalStore, ApprovalError> {
        let db = PostgresDb::connect(conninfo, ca_file).map_err(|source| ApprovalError::Db {
            at: "postgresql".into(),
            source,
        })?;
        ApprovalStore::on_postgres(db)
    }

    /// Approvals in the PostgreSQL database `db` (its pool shared with
    /// whatever else holds a clone of it), its schema brought up to date.
    pub fn on_postgres(db: PostgresDb) -> Result<ApprovalStore, ApprovalError> {
        db.migrate("gateway_approvals_schema", POSTGRES_MIGRATIONS)
            .map_err(|source| ApprovalError::Db {
                at: db.label(),
                source,
            })?;
        Ok(ApprovalStore { db: Box::new(db) })
    }

    fn db_error(&self, source: DbError) -> ApprovalError {
        let label = self.db.label();
        if label != self.db.describe() {
            tracing::warn!(db = %self.db.describe(), "the approval store: {source}");
        }
        ApprovalError::Db { at: label, source }
    }

    /// Run `body` as one write transaction; what it found is the result.
    fn write<T: Send>(
        &self,
        body: impl FnMut(&mut dyn Tx) -> Result<(End, Found<T>), DbError> + Send,
    ) -> Result<T, ApprovalError> {
        self.write_as(Isolation::Serializable, body)
    }

    /// [`ApprovalStore::write`] at `isolation`.
    fn write_as<T: Send>(
        &self,
        isolation: Isolation,
        mut body: impl FnMut(&mut dyn Tx) -> Result<(End, Found<T>), DbError> + Send,
    ) -> Result<T, ApprovalError> {
        let mut found: Found<T> = None;
        let mut run = |tx: &mut dyn Tx| {
            let (end, f) = body(tx)?;
            found = f;
            Ok(end)
        };
        match isolation {
            Isolation::Serializable => self.db.write(&mut run),
            Isolation::Queued => self.db.write_queued(&mut run),
        }
        .map_err(|e| self.db_error(e))?;
        found.unwrap_or_else(|| {
            Err(ApprovalError::Corrupt {
                id: String::new(),
                message: "a transaction ended without a result".into(),
            })
        })
    }

    /// Run `body` as a read; what it found is the result.
    fn read<T: Send>(
        &self,
        mut body: impl FnMut(&mut dyn Tx) -> Result<Result<T, ApprovalError>, DbError> + Send,
    ) -> Result<T, ApprovalError> {
        let mut found: Found<T> = None;
        self.db
            .read(&mut |tx| {
                found = Some(body(tx)?);
                Ok(End::Rollback)
            })
            .map_err(|e| self.db_error(e))?;
        found.unwrap_or_else(|| {
            Err(ApprovalError::Corrupt {
                id: String::new(),
                message: "a read ended without a result".into(),
            })
        })
    }

    /// Record a pending approval, and in the same transaction supersede
    /// every live (pending or approved, unexpired) approval of the same
    /// tool and params requested by the same user: their plans are older.
    /// (Another user's are left alone: its working dir is in its own
    /// workspace, and its call is not this user's to cancel.) Returns the new approval and
    /// the ids it superseded.
    pub fn create(&self, new: &NewApproval) -> Result<(Approval, Vec<String>), ApprovalError> {
        let id = new_id()?;
        let now = now_ms();
        let ttl_ms = i64::try_from(new.ttl.as_millis()).unwrap_or(i64::MAX);
        let params = gateway_base::canonical::canonical_json(&new.params);
        let digest = gateway_base::canonical::call_digest(&new.tool, &new.params);
        self.write(|tx| {
            let superseded: Vec<String> = tx
                .query(
                    "SELECT id FROM approvals WHERE params_sha256 = ?1 AND requested_by = ?3
                     AND state IN ('pending', 'approved') AND expires_at_ms > ?2 ORDER BY created_at_ms, id",
                    &[digest.as_str().into(), now.into(), new.requested_by.as_str().into()],
                )?
                .iter()
                .map(|r| r.text(0))
                .collect::<Result<_, _>>()?;
            tx.execute(
                "INSERT INTO approvals (id, tool, params_json, params_sha256, plan_sha256, plan_summary_json,
                    signals_json, request_id, requested_by, requested_client, created_at_ms, expires_at_ms,
                    approvers_required, reason_required, state, requester_json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, 'pending', ?15)",
                &[
                    id.as_str().into(),
                    new.tool.as_str().into(),
                    params.as_str().into(),
                    digest.as_str().into(),
                    new.plan_sha256.as_deref().into(),
                    new.plan_summary.to_string().into(),
                    new.signals.to_string().into(),
                    new.request_id.as_str().into(),
                    new.requested_by.as_str().into(),
                    new.requested_client.as_str().into(),
                    now.into(),
                    now.saturating_add(ttl_ms).into(),
                    new.approvers_required.max(1).into(),
                    new.reason_required.into(),
                    (!new.requester.is_null())
                        .then(|| new.requester.to_string())
                        .into(),
                ],
            )?;
            for old in &superseded {
                tx.execute(
                    "UPDATE approvals SET state = 'superseded', superseded_by = ?2
                     WHERE id = ?1 AND state IN ('pending', 'approved')",
                    &[old.as_str().into(), id.as_str().into()],
                )?;
            }
            let created = match read_approval(tx, &id, now)? {
                Ok(Some(a)) => Ok((a, superseded.clone())),
                Ok(None) => Err(ApprovalError::Corrupt {
                    id: id.clone(),
                    message: "vanished after insert".into(),
                }),
                Err(e) => Err(e),
            };
            let end = if created.is_ok() {
                End::Commit
            } else {
                End::Rollback
            };
            Ok((end, Some(created)))
        })
    }

    /// One approval with its effective state, or `None`.
    pub fn get(&self, id: &str) -> Result<Option<Approval>, ApprovalError> {
        let now = now_ms();
        self.read(|tx| read_approval(tx, id, now))
    }

    /// Approvals, newest first. `all == false`: only pending and approved
    /// (not yet spent, not expired).
    pub fn list(&self, all: bool) -> Result<Vec<Approval>, ApprovalError> {
        let now = now_ms();
        self.read(|tx| {
            let ids: Vec<String> = tx
                .query(
                    "SELECT id FROM approvals ORDER BY created_at_ms DESC, id",
                    &[],
                )?
                .iter()
                .map(|r| r.text(0))
                .collect::<Result<_, _>>()?;
            let mut out = Vec::new();
            for id in ids {
                match read_approval(tx, &id, now)? {
                    Ok(Some(a)) => {
                        if all || matches!(a.state, State::Pending | State::Approved) {
                            out.push(a);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => return Ok(Err(e)),
                }
            }
            Ok(Ok(out))
        })
    }

    /// Mark `id` used until `expires_at_ms`: true the first time, false
    /// for every later try while the mark lasts, whichever replica makes
    /// it (one insert decides). Marks past their expiry are swept here.
    pub fn spend_once(&self, id: &str, expires_at_ms: i64) -> Result<bool, ApprovalError> {
        let now = now_ms();
        // Kept past the expiry by a margin: a replica whose clock is behind
        // still takes the cookie a little longer.
        let expires_at_ms = expires_at_ms.saturating_add(ONCE_MARGIN_MS);
        self.write(|tx| {
            tx.execute(
                "DELETE FROM once_marks WHERE expires_at_ms < ?1",
                &[now.into()],
            )?;
            let n = tx.execute(
                "INSERT INTO once_marks (id, expires_at_ms) VALUES (?1, ?2) ON CONFLICT (id) DO NOTHING",
                &[id.into(), expires_at_ms.into()],
            )?;
            Ok((End::Commit, Some(Ok(n == 1))))
        })
    }

    /// Whether `id` is marked used ([`ApprovalStore::spend_once`]) now.
    pub fn is_spent(&self, id: &str) -> Result<bool, ApprovalError> {
        let now = now_ms();
        self.read(|tx| {
            Ok(Ok(tx
                .query_opt(
                    "SELECT 1 FROM once_marks WHERE id = ?1 AND expires_at_ms >= ?2",
                    &[id.into(), now.into()],
                )?
                .is_some()))
        })
    }

    /// How many approvals are in each effective state (expiry applied),
    /// for the metrics: one query, no approval read in full.
    pub fn counts(&self) -> Result<Vec<(&'static str, i64)>, ApprovalError> {
        let now = now_ms();
        self.read(|tx| {
            let rows = tx.query(
                "SELECT state, COUNT(*) FROM approvals WHERE state NOT IN ('pending', 'approved') GROUP BY state
                 UNION ALL
                 SELECT CASE WHEN expires_at_ms <= ?1 THEN 'expired' ELSE state END, COUNT(*)
                   FROM approvals WHERE state IN ('pending', 'approved')
                   GROUP BY CASE WHEN expires_at_ms <= ?1 THEN 'expired' ELSE state END",
                &[now.into()],
            )?;
            let mut out: Vec<(&'static str, i64)> = [
                State::Pending,
                State::Approved,
                State::Denied,
                State::Spent,
                State::Superseded,
                State::Expired,
            ]
            .into_iter()
            .map(|s| (s.as_str(), 0))
            .collect();
            for r in rows {
                let (state, n) = (r.text(0)?, r.int(1)?);
                if let Some(slot) = out.iter_mut().find(|(s, _)| *s == state) {
                    slot.1 += n;
                }
            }
            Ok(Ok(out))
        })
    }

    /// A person grants the approval. Becomes `approved` once enough distinct
    /// identities granted it. Whether this approver may is the policy's
    /// (asked before); the store checks the approval's own state and binding.
    pub fn grant(
        &self,
        id: &str,
        approver: &Approver,
        reason: &str,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        self.decide(id, approver, reason, "grant")
    }

    /// A person denies the approval: it can no longer be approved or spent.
    pub fn deny(
        &self,
        id: &str,
        approver: &Approver,
        reason: &str,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        self.decide(id, approver, reason, "deny")
    }

    fn decide(
        &self,
        id: &str,
        approver: &Approver,
        reason: &str,
        verdict: &str,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        // A verdict counts the others: serialisable with them.
        self.change(id, Isolation::Serializable, |tx, approval, now| {
            decide_in(tx, approval, now, approver, reason, verdict)
        })
    }

    /// One change to approval `id`, in one write transaction: read it (an
    /// unknown id is a refusal), let `f` check and write, then read it
    /// back and commit. A refusal from `f` rolls back.
    fn change(
        &self,
        id: &str,
        isolation: Isolation,
        f: impl Fn(&mut dyn Tx, &Approval, i64) -> Result<Option<Refusal>, DbError> + Send + Sync,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        self.write_as(isolation, |tx| {
            let now = now_ms();
            let approval = match read_approval(tx, id, now)? {
                Ok(Some(a)) => a,
                Ok(None) => {
                    return Ok((
                        End::Rollback,
                        Some(Ok(Err(Refusal::UnknownId { id: id.into() }))),
                    ));
                }
                Err(e) => return Ok((End::Rollback, Some(Err(e)))),
            };
            if let Some(r) = f(tx, &approval, now)? {
                return Ok((End::Rollback, Some(Ok(Err(r)))));
            }
            let after = match read_approval(tx, id, now)? {
                Ok(Some(a)) => Ok(Ok(a)),
                Ok(None) => Err(ApprovalError::Corrupt {
                    id: id.into(),
                    message: "vanished".into(),
                }),
                Err(e) => Err(e),
            };
            let end = if after.is_ok() {
                End::Commit
            } else {
                End::Rollback
            };
            Ok((end, Some(after)))
        })
    }

    /// Spend the approval for one call: in one transaction, check that it
    /// exists, is approved, has not expired, is for this tool, and is bound
    /// to these params and this plan digest; then mark it spent. Of any
    /// number of concurrent spenders exactly one succeeds.
    pub fn spend(
        &self,
        id: &str,
        tool: &str,
        params: &Value,
        plan_sha256: Option<&str>,
        request_id: &str,
    ) -> Result<Result<Approval, Refusal>, ApprovalError> {
        let digest = gateway_base::canonical::call_digest(tool, params);
        // Queued, not serialisable: what is checked besides the state (tool,
        // params, plan, expiry) never changes after the approval is made,
        // and the state is checked again by the UPDATE itself, which
        // concurrent spenders of one approval take in turn (the second
        // finds it spent). Serialisable, spends of different approvals
        // gave each other up for the table's index pages they share: 7,673
        // retries for about 1,800 spends, 32 at once (the benchmark
        // `store/postgres_spend_concurrent`).
        let spent = self.change(id, Isolation::Queued, |tx, approval, now| {
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
                (approval.params_sha256 != digest)
                    .then(|| Refusal::ParamsMismatch { id: id.into() })
            })
            .or_else(|| {
                (approval.plan_sha256.as_deref() != plan_sha256)
                    .then(|| Refusal::PlanMismatch { id: id.into() })
            });
            if refusal.is_some() {
                return Ok(refusal);
            }
            // The state check again in the UPDATE itself: of two spenders
            // that read it approved, only one can flip it.
            let changed = tx.execute(
                "UPDATE approvals SET state = 'spent', spent_at_ms = ?2, spent_request_id = ?3
                 WHERE id = ?1 AND state = 'approved' AND expires_at_ms > ?2",
                &[id.into(), now.into(), request_id.into()],
            )?;
            if changed == 1 {
                return Ok(None);
            }
            // Another writer changed it first: spent, or superseded by a
            // newer plan of the same call, and the refusal says which.
            let gone = match read_approval(tx, id, now)? {
                Ok(Some(now_state)) => ended(&now_state),
                _ => None,
            };
            Ok(Some(gone.unwrap_or_else(|| Refusal::AlreadySpent {
                id: id.into(),
            })))
        });
        match spent {
            // Its commit went unanswered: whether this call spent it is
            // in the row (an approval spent here must be applied here,
            // one still approved is still to spend).
            Err(ApprovalError::Db {
                source: DbError::CommitUnknown(why),
                at,
            }) => match self.get(id)? {
                Some(a)
                    if a.state == State::Spent
                        && a.spent_request_id.as_deref() == Some(request_id) =>
                {
                    Ok(Ok(a))
                }
                _ => Err(ApprovalError::Db {
                    source: DbError::CommitUnknown(why),
                    at,
                }),
            },
            other => other,
        }
    }

    /// Record how the call that spent approval `id` (request `request_id`)
    /// ended. Only that call's outcome is taken, once: returns whether it
    /// was recorded (false: not spent by that request, or recorded already).
    pub fn record_outcome(
        &self,
        id: &str,
        request_id: &str,
        outcome: &Value,
    ) -> Result<bool, ApprovalError> {
        let outcome = outcome.to_string();
        self.write(|tx| {
            let changed = tx.execute(
                "UPDATE approvals SET outcome_json = ?3, outcome_at_ms = ?4
                 WHERE id = ?1 AND state = 'spent' AND spent_request_id = ?2 AND outcome_json IS NULL",
                &[
                    id.into(),
                    request_id.into(),
                    outcome.as_str().into(),
                    now_ms().into(),
                ],
            )?;
            Ok((End::Commit, Some(Ok(changed == 1))))
        })
    }
}

/// SQLite's schema history ([`MIGRATIONS`], in `user_version`).
fn migrate_sqlite(conn: &mut rusqlite::Connection, at: &str) -> Result<(), ApprovalError> {
    let db = |source: rusqlite::Error| ApprovalError::Db {
        at: at.to_string(),
        source: source.into(),
    };
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(db)?;
    let version: i64 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(db)?;
    if version > SCHEMA_VERSION {
        return Err(ApprovalError::SchemaTooNew {
            at: at.to_string(),
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

/// The checks and writes of a grant or a denial, inside [`ApprovalStore::change`].
fn decide_in(
    tx: &mut dyn Tx,
    approval: &Approval,
    now: i64,
    approver: &Approver,
    reason: &str,
    verdict: &str,
) -> Result<Option<Refusal>, DbError> {
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
        &[
            id.into(),
            approver.name.as_str().into(),
            verdict.into(),
            reason.into(),
            now.into(),
            approver.kind.into(),
            approver.os_user.as_str().into(),
            signer.map(|s| s.fingerprint.clone()).into(),
            signer.map(|s| s.public_key.clone()).into(),
            signed.map(|s| s.statement.clone()).into(),
            signed.map(|s| s.signature.clone()).into(),
            approver.identity.as_ref().map(|v| v.to_string()).into(),
        ],
    )?;
    let grants = tx
        .query_opt(
            "SELECT COUNT(DISTINCT approver) FROM verdicts WHERE approval_id = ?1 AND verdict = 'grant'",
            &[id.into()],
        )?
        .map(|r| r.int(0))
        .transpose()?
        .unwrap_or(0);
    let next = if verdict == "deny" {
        "denied"
    } else if grants >= i64::from(approval.approvers_required) {
        "approved"
    } else {
        "pending"
    };
    tx.execute(
        "UPDATE approvals SET state = ?2 WHERE id = ?1 AND state = 'pending'",
        &[id.into(), next.into()],
    )?;
    tx.notify(CHANGES_CHANNEL, id)?;
    Ok(None)
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

/// One approval as stored, with its effective state. The outer error is
/// the database's; the inner one a row that does not read as an approval.
fn read_approval(
    tx: &mut dyn Tx,
    id: &str,
    now: i64,
) -> Result<Result<Option<Approval>, ApprovalError>, DbError> {
    let Some(r) = tx.query_opt(
        "SELECT id, tool, params_json, params_sha256, plan_sha256, plan_summary_json, signals_json, request_id,
                requested_by, requested_client, created_at_ms, expires_at_ms, approvers_required,
                reason_required, state, spent_at_ms, spent_request_id, superseded_by,
                outcome_json, outcome_at_ms, requester_json
         FROM approvals WHERE id = ?1",
        &[id.into()],
    )?
    else {
        return Ok(Ok(None));
    };
    let id = r.text(0)?;
    let corrupt = |m: String| ApprovalError::Corrupt {
        id: id.clone(),
        message: m,
    };
    let json = |s: &str| serde_json::from_str::<Value>(s).map_err(|e| corrupt(e.to_string()));
    let state = r.text(14)?;
    let Some(stored) = State::parse(&state) else {
        return Ok(Err(corrupt(format!("unknown state {state}"))));
    };
    let expires = r.int(11)?;
    let effective = if matches!(stored, State::Pending | State::Approved) && now >= expires {
        State::Expired
    } else {
        stored
    };
    let verdicts = tx
        .query(
            "SELECT approver, verdict, reason, at_ms, kind, os_user, key_fingerprint, public_key, statement,
                    signature, identity_json
             FROM verdicts WHERE approval_id = ?1 ORDER BY at_ms, rowid",
            &[id.as_str().into()],
        )?
        .iter()
        .map(|v| {
            Ok(Verdict {
                approver: v.text(0)?,
                verdict: v.text(1)?,
                reason: v.text(2)?,
                at: ms_to_rfc3339(v.int(3)?),
                kind: v.text(4)?,
                os_user: v.text(5)?,
                key_fingerprint: v.opt_text(6)?,
                public_key: v.opt_text(7)?,
                statement: v.opt_text(8)?,
                signature: v.opt_text(9)?,
                identity: v
                    .opt_text(10)?
                    .and_then(|t| serde_json::from_str(&t).ok()),
            })
        })
        .collect::<Result<Vec<_>, DbError>>()?;
    let created = r.int(10)?;
    let parsed = (|| -> Result<Approval, ReadFail> {
        Ok(Approval {
            params: json(&r.text(2)?)?,
            plan_summary: json(&r.text(5)?)?,
            signals: json(&r.text(6)?)?,
            id: id.clone(),
            tool: r.text(1)?,
            params_sha256: r.text(3)?,
            plan_sha256: r.opt_text(4)?,
            request_id: r.text(7)?,
            requested_by: r.text(8)?,
            requested_client: r.text(9)?,
            requester: r
                .opt_text(20)?
                .as_deref()
                .map(json)
                .transpose()?
                .unwrap_or(Value::Null),
            created_at: ms_to_rfc3339(created),
            expires_at: ms_to_rfc3339(expires),
            approvers_required: u32::try_from(r.int(12)?).unwrap_or(1),
            reason_required: r.bool(13)?,
            state: effective,
            verdicts,
            spent_at: r.opt_int(15)?.map(ms_to_rfc3339),
            spent_request_id: r.opt_text(16)?,
            superseded_by: r.opt_text(17)?,
            outcome: r.opt_text(18)?.as_deref().map(json).transpose()?,
            outcome_at: r.opt_int(19)?.map(ms_to_rfc3339),
            created_at_ms: created,
            expires_at_ms: expires,
        })
    })();
    match parsed {
        Ok(a) => Ok(Ok(Some(a))),
        Err(ReadFail::Db(e)) => Err(e),
        Err(ReadFail::Approval(e)) => Ok(Err(e)),
    }
}

/// Why a row did not read: the database, or the row itself.
enum ReadFail {
    Db(DbError),
    Approval(ApprovalError),
}

impl From<DbError> for ReadFail {
    fn from(e: DbError) -> Self {
        ReadFail::Db(e)
    }
}

impl From<ApprovalError> for ReadFail {
    fn from(e: ApprovalError) -> Self {
        ReadFail::Approval(e)
    }
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

    const MIN30: Duration = Duration::from_secs(1800);

    #[test]
    fn a_version_1_database_is_migrated_and_its_unproven_verdicts_are_legacy() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE_NAME);
        {
            let conn = rusqlite::Connection::open(&path).expect("open");
            conn.execute_batch(MIGRATIONS[0]).expect("v1");
            conn.pragma_update(None, "user_version", 1).expect("v");
            conn.execute_batch(
                "INSERT INTO approvals VALUES ('ap-old', 'terraform_apply', '{}', 'd', NULL, '[]', '[]', 'r', 'alice', 'c',
                   0, 9999999999999, 1, 0, 'approved', NULL, NULL);
                 INSERT INTO verdicts VALUES ('ap-old', 'someone', 'grant', '', 1);",
            )
            .expect("rows");
        }
        let s = ApprovalStore::open(&path).expect("migrate");
        let a = s.get("ap-old").expect("db").expect("kept");
        assert_eq!(a.state, State::Approved);
        assert_eq!(a.verdicts[0].kind, "legacy");
        // The new state is accepted by the rebuilt table.
        let mut n = new(1, MIN30);
        n.params = json!({});
        n.tool = "terraform_apply".into();
        rusqlite::Connection::open(&path)
            .expect("open")
            .execute(
                "UPDATE approvals SET params_sha256 = ?1",
                [gateway_base::canonical::call_digest(
                    "terraform_apply",
                    &json!({}),
                )],
            )
            .expect("digest");
        let (_, gone) = s.create(&n).expect("create");
        assert_eq!(gone, vec!["ap-old".to_string()]);
    }

    #[test]
    fn schema_is_versioned_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE_NAME);
        drop(ApprovalStore::open(&path).expect("open"));
        let conn = rusqlite::Connection::open(&path).expect("open");
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
    fn plan_summary_reads_the_one_parse() {
        // A change whose actions key is written twice: the plan parser keeps
        // the last (as Terraform's JSON reader would), and the summary an
        // approver sees says the same, not the first.
        let twice = br#"{"format_version":"1.2","planned_values":{},"resource_changes":[
            {"address":"a.b","change":{"actions":["no-op"],"actions":["delete"]}}]}"#;
        let v = gateway_policy::plan::parse_plan_value(twice, "p").expect("plan");
        assert_eq!(
            plan_summary(&v),
            json!([{"address": "a.b", "actions": ["delete"], "reason": null, "paths": []}])
        );
    }

    #[test]
    fn plan_summary_lists_every_change_but_no_ops() {
        let plan: Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                concat!(env!("CARGO_MANIFEST_DIR"), "/../.."),
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
