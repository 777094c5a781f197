//! [`Db`] on PostgreSQL, shared by every replica of a team gateway: each
//! write is a SERIALIZABLE transaction (run again when PostgreSQL gives it
//! up for a concurrent one), so a store's read-check-write is as if it
//! were alone, across processes and hosts.
//!
//! The client is the `postgres` crate (synchronous, over tokio-postgres):
//! stores are called from synchronous code; inside an async runtime a call
//! runs on a scoped thread of its own, since the client drives a runtime
//! of its own. A lost connection is made again on the next call; while
//! the database is away every call fails, with the database's reason.
//! Schemas are versioned with `refinery`, one history table per store,
//! under an advisory lock so that replicas starting together migrate once.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use postgres::types::{IsNull, ToSql, Type};
use postgres::{Client, Config};
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{Body, Db, DbError, End, Row, SqlValue, Tx};

/// How many times a transaction PostgreSQL gave up is run again.
const RETRIES: u32 = 30;
/// The advisory lock key migrations hold ("gateway" in ASCII).
const MIGRATION_LOCK: i64 = 0x0067_6174_6577_6179;

pub struct PostgresDb {
    target: Target,
    describe: String,
    client: Mutex<Option<Client>>,
}

impl std::fmt::Debug for PostgresDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresDb")
            .field("at", &self.describe)
            .finish_non_exhaustive()
    }
}

impl Drop for PostgresDb {
    /// A client's own drop blocks (it says goodbye to the server), which
    /// an async thread may not: it is dropped where it may.
    fn drop(&mut self) {
        let held = self
            .client
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if held.is_some() {
            off_runtime(move || drop(held));
        }
    }
}

/// Where to connect, and how to check the server's certificate.
#[derive(Clone)]
struct Target {
    config: Config,
    tls: MakeRustlsConnect,
}

/// TLS with the system's roots and those of `ca_file` (rustls on ring).
/// The connection string's `sslmode` decides whether it is used: `prefer`
/// (the default) when the server offers it, `require` always, and a
/// certificate that does not verify is always a refusal.
fn tls(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, DbError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| DbError::Other(format!("[store] ca_file {}: {e}", path.display())))?;
        let mut found = 0;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            let cert = cert
                .map_err(|e| DbError::Other(format!("[store] ca_file {}: {e}", path.display())))?;
            roots
                .add(cert)
                .map_err(|e| DbError::Other(format!("[store] ca_file {}: {e}", path.display())))?;
            found += 1;
        }
        if found == 0 {
            return Err(DbError::Other(format!(
                "[store] ca_file {}: no certificate in it",
                path.display()
            )));
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| DbError::Other(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

impl PostgresDb {
    /// A database from a libpq connection string or URL (its password, if
    /// any, is never shown), its server's certificate checked against the
    /// system's roots and `ca_file`'s. Connects at once: a database that
    /// cannot be reached is an error here, not at the first call.
    pub fn connect(conninfo: &str, ca_file: Option<&Path>) -> Result<PostgresDb, DbError> {
        let mut config: Config = conninfo
            .parse()
            .map_err(|e: postgres::Error| DbError::Other(format!("the connection string: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        config.keepalives(true);
        // A connection that idles (the listener's, between notifications)
        // and is dropped silently by a NAT or a load balancer is found out
        // in a minute or so, not after the system's two hours.
        if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
            config.keepalives_idle(Duration::from_secs(30));
        }
        // A server that stops answering mid-call (its host gone) is given
        // up on, as one that is not reached in time is.
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(Duration::from_secs(15));
        }
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                postgres::config::Host::Tcp(h) => h.clone(),
                postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let describe = format!(
            "postgresql database {} at {}{} as {}",
            config.get_dbname().unwrap_or("(default)"),
            hosts.join(","),
            config
                .get_ports()
                .first()
                .map(|p| format!(":{p}"))
                .unwrap_or_default(),
            config.get_user().unwrap_or("(default)")
        );
        let db = PostgresDb {
            target: Target {
                config,
                tls: tls(ca_file)?,
            },
            describe,
            client: Mutex::new(None),
        };
        db.with_client(|_| Ok(()))?;
        Ok(db)
    }

    /// Bring a store's schema up to date: `migrations` are refinery's
    /// `V<n>__<name>` and their SQL, kept in `table`.
    pub fn migrate(&self, table: &str, migrations: &[(&str, &str)]) -> Result<(), DbError> {
        let list = migrations
            .iter()
            .map(|(name, sql)| refinery::Migration::unapplied(name, sql))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| DbError::Other(format!("a migration: {e}")))?;
        let table = table.to_string();
        self.with_client(move |conn| {
            let client = conn.client()?;
            client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])?;
            // A replica of the previous version, started while a newer one
            // has already added its (additive) migrations, still runs.
            let ran = refinery::Runner::new(&list)
                .set_abort_missing(false)
                .set_migration_table_name(&table)
                .run(client)
                .map_err(|e| DbError::Other(format!("migrating {table}: {e}")));
            client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])?;
            ran.map(|_| ())
        })
    }

    /// Call `on` with the payload of every notification on `channel`, from
    /// a thread of its own on a connection of its own, for as long as the
    /// process lives; a lost connection is made again (a second later, and
    /// `on("")` says that notifications may have been missed meanwhile).
    pub fn listen(&self, channel: &str, on: impl Fn(&str) + Send + 'static) -> std::io::Result<()> {
        let target = self.target.clone();
        let listen = format!("LISTEN \"{}\"", channel.replace('"', ""));
        let at = self.describe.clone();
        std::thread::Builder::new()
            .name("db-listen".into())
            .spawn(move || {
                loop {
                    match connect(&target).and_then(|mut c| {
                        c.batch_execute(&listen)?;
                        on("");
                        let mut n = c.notifications();
                        use fallible_iterator::FallibleIterator;
                        let mut it = n.blocking_iter();
                        while let Some(note) = it.next()? {
                            on(note.payload());
                        }
                        Ok(())
                    }) {
                        Ok(()) => {}
                        Err(e) => tracing::warn!(db = %at, "listening for changes: {e}"),
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
            .map(|_| ())
    }

    /// Hold the session-level advisory lock `key` on a connection of its
    /// own for as long as the returned guard lives, running `beat` (with
    /// `params`) once when the lock is taken and every `every` after: the
    /// way a replica shows it is alive. Another session can take the lock
    /// (`pg_try_advisory_xact_lock`) only once this connection is gone: the
    /// process died (its socket closed by the kernel), the guard was
    /// dropped, or the connection was lost (then it is made again, the lock
    /// taken again, and `beat` run, a second later). Returns once the lock
    /// is held and `beat` ran the first time.
    pub fn hold(
        &self,
        key: i64,
        beat: &str,
        params: Vec<SqlValue>,
        every: Duration,
    ) -> Result<HeldLock, DbError> {
        let target = self.target.clone();
        let at = self.describe.clone();
        let beat = dollar(beat);
        let take = move |target: &Target| -> Result<Client, DbError> {
            let mut c = connect(target)?;
            c.execute("SELECT pg_advisory_lock($1)", &[&key])?;
            Ok(c)
        };
        // A beat may return one boolean: true when what it keeps had to be
        // made again (the others had taken it for gone).
        let run = move |c: &mut Client| -> Result<bool, DbError> {
            let bound = bind(&params);
            let refs: Vec<&(dyn ToSql + Sync)> = bound
                .iter()
                .map(|b| b.as_ref() as &(dyn ToSql + Sync))
                .collect();
            let rows = c.query(&beat, &refs)?;
            Ok(rows
                .first()
                .and_then(|r| r.try_get::<_, bool>(0).ok())
                .unwrap_or(false))
        };
        let first = off_runtime(|| {
            let mut c = take(&target)?;
            run(&mut c)?;
            Ok::<_, DbError>(c)
        })?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        let since = std::sync::Arc::new(Mutex::new(Some(std::time::Instant::now())));
        let held_since = std::sync::Arc::clone(&since);
        std::thread::Builder::new()
            .name("db-presence".into())
            .spawn(move || {
                let mut client = Some(first);
                let step = Duration::from_millis(100);
                let mut wait = every;
                'outer: loop {
                    let mut waited = Duration::ZERO;
                    while waited < wait {
                        if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                            break 'outer;
                        }
                        std::thread::sleep(step);
                        waited += step;
                    }
                    let result = match client.as_mut() {
                        Some(c) => run(c),
                        None => take(&target).and_then(|mut c| {
                            *held_since.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(std::time::Instant::now());
                            let beat = run(&mut c);
                            client = Some(c);
                            beat
                        }),
                    };
                    if matches!(result, Ok(true)) {
                        tracing::error!(
                            db = %at,
                            "the other replicas had taken this one for dead (its connection to the database was lost for too long): the credentials of its calls then in flight were revoked, and those calls fail; it is registered again"
                        );
                    }
                    let result = result.map(|_| ());
                    wait = every;
                    if let Err(e) = result {
                        tracing::warn!(db = %at, "showing this replica alive: {e}");
                        // Only a lost connection lost the lock: it is made
                        // again at once (then every second), so that the
                        // others find the lock taken again before they
                        // call this replica dead.
                        if client.as_ref().is_none_or(Client::is_closed) {
                            client = None;
                            *held_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
                            wait = Duration::from_secs(1);
                        }
                    }
                }
                drop(client);
            })
            .map_err(|e| DbError::Other(format!("starting the presence thread: {e}")))?;
        Ok(HeldLock { stop, since })
    }

    /// Run `f` with a live client (made again if it was lost), off any
    /// async runtime.
    fn with_client<T: Send>(
        &self,
        f: impl FnOnce(&mut Conn<'_>) -> Result<T, DbError> + Send,
    ) -> Result<T, DbError> {
        let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
        let held = slot.take();
        let target = &self.target;
        let (kept, result) = off_runtime(move || {
            // A lost client is dropped here too: dropping one blocks (it
            // says goodbye to the server), which an async thread may not.
            let (client, fresh) = match held.filter(|c| !c.is_closed()) {
                Some(c) => (c, false),
                None => match connect(target) {
                    Ok(c) => (c, true),
                    Err(e) => return (None, Err(e)),
                },
            };
            let mut conn = Conn {
                client: Some(client),
                fresh,
                target,
            };
            let r = f(&mut conn);
            (conn.client, r)
        });
        *slot = kept;
        result
    }

    fn transaction(&self, body: &mut Body<'_>, read_only: bool) -> Result<(), DbError> {
        let begin = if read_only {
            "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY"
        } else {
            "BEGIN ISOLATION LEVEL SERIALIZABLE"
        };
        self.run_in(begin, body, read_only)
    }

    fn run_in(&self, begin: &str, body: &mut Body<'_>, read_only: bool) -> Result<(), DbError> {
        self.with_client(|conn| {
            let mut attempt = 0;
            loop {
                let client = conn.begin(begin)?;
                let run = match body(&mut PgTx(client)) {
                    Ok(End::Commit) if !read_only => match client.batch_execute("COMMIT") {
                        Ok(()) => Ok(()),
                        // The server answered: it did not commit.
                        Err(e) if e.as_db_error().is_some() => Err(e.into()),
                        // No answer: it may have committed or not.
                        Err(e) => Err(DbError::CommitUnknown(DbError::from(e).to_string())),
                    },
                    Ok(_) => client.batch_execute("ROLLBACK").map_err(DbError::from),
                    Err(e) => {
                        let _ = client.batch_execute("ROLLBACK");
                        Err(e)
                    }
                };
                match run {
                    Err(e) if e.retryable() && attempt < RETRIES => {
                        attempt += 1;
                        // A little apart, so that the same two do not
                        // collide again at once.
                        std::thread::sleep(Duration::from_millis(u64::from(attempt) + jitter_ms()));
                    }
                    other => return other,
                }
            }
        })
    }
}

/// An advisory lock [`PostgresDb::hold`] holds: released (its connection
/// closed) soon after this is dropped.
#[derive(Debug)]
pub struct HeldLock {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Since when the lock has been held without a break (`None`: lost
    /// now).
    since: std::sync::Arc<Mutex<Option<std::time::Instant>>>,
}

impl HeldLock {
    /// How long the lock has been held without a break (zero while lost).
    pub fn held_for(&self) -> Duration {
        self.since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Run one statement on `c`.
fn exec(c: &mut Client, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
    let bound = bind(params);
    let refs: Vec<&(dyn ToSql + Sync)> = bound
        .iter()
        .map(|b| b.as_ref() as &(dyn ToSql + Sync))
        .collect();
    Ok(c.execute(sql, &refs)?)
}

/// A client in use, and how to make it again.
struct Conn<'a> {
    /// `None` only after a failed reconnection.
    client: Option<Client>,
    /// Made for this call (a failure on it is not a lost connection).
    fresh: bool,
    target: &'a Target,
}

impl Conn<'_> {
    fn client(&mut self) -> Result<&mut Client, DbError> {
        self.client
            .as_mut()
            .ok_or_else(|| DbError::Other("no connection to the database".into()))
    }

    /// Begin a transaction. A client held from before whose BEGIN fails
    /// lost its connection (the server restarted, say): nothing ran on
    /// it, so a new connection begins instead, once.
    fn begin(&mut self, begin: &str) -> Result<&mut Client, DbError> {
        match self.client()?.batch_execute(begin) {
            Ok(()) => {}
            Err(e) if self.fresh => return Err(e.into()),
            Err(_) => {
                self.fresh = true;
                // Dropped first: it may block saying goodbye.
                drop(self.client.take());
                let mut c = connect(self.target)?;
                c.batch_execute(begin)?;
                self.client = Some(c);
            }
        }
        self.client()
    }
}

/// How long one statement may run, and a transaction stay idle, before
/// PostgreSQL ends it: a database that hangs fails the call instead of
/// holding it (and the store's lock) for ever.
const STATEMENT_TIMEOUT: &str = "10s";
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "30s";

/// A new connection, with the session's time limits set.
fn connect(target: &Target) -> Result<Client, DbError> {
    let mut c = target.config.connect(target.tls.clone())?;
    // The server's side of a TCP connection probes too (a client whose host
    // vanished has its session, and the locks it holds, ended in about
    // 25 s rather than the system's 2 h); ignored over a Unix socket.
    c.batch_execute(&format!(
        "SET statement_timeout = '{STATEMENT_TIMEOUT}'; \
         SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'; \
         SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3"
    ))?;
    Ok(c)
}

fn jitter_ms() -> u64 {
    let mut b = [0u8; 1];
    let _ = getrandom::fill(&mut b);
    u64::from(b[0] % 8)
}

/// `f` run where a blocking client may block: on a scoped thread when
/// this thread drives an async runtime. On a multi-threaded runtime the
/// worker also hands its other tasks over while it waits
/// (`block_in_place`): a slow or frozen database then holds the calls that
/// need it, not the replica's other work (its HTTP server, heartbeats,
/// the orphan watch).
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return f();
    };
    let scoped = move || {
        std::thread::scope(|s| match s.spawn(f).join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        })
    };
    if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
        tokio::task::block_in_place(scoped)
    } else {
        scoped()
    }
}

impl Db for PostgresDb {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn label(&self) -> String {
        "in PostgreSQL ([store])".into()
    }

    fn write(&self, body: &mut Body<'_>) -> Result<(), DbError> {
        self.transaction(body, false)
    }

    fn read(&self, body: &mut Body<'_>) -> Result<(), DbError> {
        self.transaction(body, true)
    }

    fn write_queued(&self, body: &mut Body<'_>) -> Result<(), DbError> {
        // A writer that holds the queue's row and stalls (its host frozen)
        // fails the others after 5 s, not the statement limit's 10.
        self.run_in(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '5s'",
            body,
            false,
        )
    }
}

/// A NULL of whatever type the statement wants.
#[derive(Debug)]
struct AnyNull;

impl ToSql for AnyNull {
    fn to_sql(
        &self,
        _: &Type,
        _: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        Ok(IsNull::Yes)
    }
    fn accepts(_: &Type) -> bool {
        true
    }
    postgres::types::to_sql_checked!();
}

struct PgTx<'a>(&'a mut Client);

/// `?1`-style parameters as PostgreSQL's `$1`.
fn dollar(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

fn bind(params: &[SqlValue]) -> Vec<Box<dyn ToSql + Sync + Send>> {
    params
        .iter()
        .map(|p| -> Box<dyn ToSql + Sync + Send> {
            match p {
                SqlValue::Null => Box::new(AnyNull),
                SqlValue::Int(v) => Box::new(*v),
                SqlValue::Text(v) => Box::new(v.clone()),
                SqlValue::Bool(v) => Box::new(*v),
                SqlValue::Bytes(v) => Box::new(v.clone()),
            }
        })
        .collect()
}

impl Tx for PgTx<'_> {
    fn notify(&mut self, channel: &str, payload: &str) -> Result<(), DbError> {
        self.0
            .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])?;
        Ok(())
    }

    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        exec(self.0, &dollar(sql), params)
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>, DbError> {
        let bound = bind(params);
        let refs: Vec<&(dyn ToSql + Sync)> = bound
            .iter()
            .map(|b| b.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let rows = self.0.query(&dollar(sql), &refs)?;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| {
                        let t = r.columns()[i].type_().clone();
                        Ok(match t {
                            Type::INT8 => r.try_get::<_, Option<i64>>(i)?.map(SqlValue::Int),
                            Type::INT4 => r
                                .try_get::<_, Option<i32>>(i)?
                                .map(|v| SqlValue::Int(i64::from(v))),
                            Type::INT2 => r
                                .try_get::<_, Option<i16>>(i)?
                                .map(|v| SqlValue::Int(i64::from(v))),
                            Type::BOOL => r.try_get::<_, Option<bool>>(i)?.map(SqlValue::Bool),
                            Type::BYTEA => r.try_get::<_, Option<Vec<u8>>>(i)?.map(SqlValue::Bytes),
                            Type::TEXT | Type::VARCHAR | Type::NAME | Type::BPCHAR => {
                                r.try_get::<_, Option<String>>(i)?.map(SqlValue::Text)
                            }
                            other => {
                                return Err(DbError::Shape(format!(
                                    "column {i}: unexpected type {other}"
                                )));
                            }
                        }
                        .unwrap_or(SqlValue::Null))
                    })
                    .collect::<Result<Vec<_>, DbError>>()
                    .map(Row)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parameters_are_renamed_for_postgresql() {
        assert_eq!(
            super::dollar("SELECT a FROM t WHERE b = ?1 AND c IN (?2, ?12) AND d = '?'"),
            "SELECT a FROM t WHERE b = $1 AND c IN ($2, $12) AND d = '?'"
        );
    }

    #[test]
    fn a_connection_string_with_a_password_is_never_shown() {
        let e = super::PostgresDb::connect(
            "host=127.0.0.1 port=9 user=u password=hunter2-secret dbname=d connect_timeout=1",
            None,
        )
        .expect_err("nothing listens on port 9");
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let e = super::PostgresDb::connect("postgresql://u:hunter2-secret@127.0.0.1:9/d", None)
            .expect_err("nothing listens on port 9");
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
