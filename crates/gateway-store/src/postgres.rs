//! [`Db`] on PostgreSQL, shared by every replica of a team gateway: each
//! write is a SERIALIZABLE transaction (run again when PostgreSQL gives it
//! up for a concurrent one), so a store's read-check-write is as if it
//! were alone, across processes and hosts.
//!
//! The client is tokio-postgres, pooled by deadpool-postgres: a bounded
//! pool ([`PoolSettings`]: at most `size` connections, a caller waits at
//! most `wait` for one), so that as many transactions run at once as there
//! are connections, and a replica never opens more than its share of the
//! server's. The connections are driven by a small runtime of the
//! store's own ([`io`]), whoever calls: the CLI (no runtime), the daemon's
//! tasks, a test's threads. A caller waits for its own statements only.
//! The stores are synchronous (their callers, the audit log among them,
//! are): a transaction called on a worker of a multi-threaded runtime is
//! run with that worker's other tasks handed over for its length
//! (`block_in_place`, once per transaction), so that a slow database holds
//! the calls that need it, not the replica's HTTP server or heartbeats.
//!
//! A connection lost (the server restarted, its host gone) is dropped from
//! the pool with the idle ones beside it, and the next call connects
//! again; while the database is away every call fails, with the database's
//! reason. LISTEN and the presence lock ([`PostgresDb::listen`],
//! [`PostgresDb::hold`]) have connections of their own, outside the pool.
//! Schemas are versioned with `refinery`, one history table per store,
//! under an advisory lock so that replicas starting together migrate once.

use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError, TimeoutType};
use rustls::pki_types::pem::PemObject;
use tokio_postgres::types::{IsNull, ToSql, Type};
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{Body, Db, DbError, End, Row, SqlValue, Tx};

/// How many times a transaction PostgreSQL gave up is run again.
const RETRIES: u32 = 30;
/// The advisory lock key migrations hold ("gateway" in ASCII).
const MIGRATION_LOCK: i64 = 0x0067_6174_6577_6179;

/// How many connections a store keeps to the database, and how long a
/// caller waits for one when all are in use (`[store] pool_size`,
/// `pool_wait_secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    pub size: usize,
    pub wait: Duration,
}

impl PoolSettings {
    /// At most 8 connections, waited for 5 s: three replicas stay far
    /// under PostgreSQL's default 100 connections, and a caller that
    /// cannot have one in 5 s is told so rather than queued for ever.
    pub const DEFAULT: PoolSettings = PoolSettings {
        size: 8,
        wait: Duration::from_secs(5),
    };
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings::DEFAULT
    }
}

/// A pool of connections to one database (cheap to clone: the clones
/// share the pool).
#[derive(Clone)]
pub struct PostgresDb {
    target: Target,
    describe: String,
    pool: Pool,
    settings: PoolSettings,
}

impl std::fmt::Debug for PostgresDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresDb")
            .field("at", &self.describe)
            .field("pool", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Where to connect, and how to check the server's certificate.
#[derive(Clone)]
struct Target {
    config: Config,
    tls: MakeRustlsConnect,
}

/// The runtime the connections run on: one thread, made on first use and
/// kept for the process's life (a connection outlives the runtime of the
/// task that opened it, and a caller with no runtime has its statements
/// answered all the same).
fn io() -> Result<&'static tokio::runtime::Runtime, DbError> {
    static IO: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    IO.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gateway-db")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| DbError::Other(format!("starting the database client's runtime: {e}")))
}

/// `f` run on [`io`], its result awaited here (through a channel, not the
/// task's handle: a handle draws on the waiting task's runtime budget,
/// which a wait that never yields would never get back).
fn on_io<T: Send + 'static>(
    f: impl Future<Output = Result<T, DbError>> + Send + 'static,
) -> Result<T, DbError> {
    let (tx, rx) = futures::channel::oneshot::channel();
    io()?.spawn(async move {
        let _ = tx.send(f.await);
    });
    wait(rx).map_err(|_| DbError::Other("the database client's task ended".into()))?
}

/// Wait here for `f`: a statement's answer, sent by its connection's task
/// on [`io`] (the future needs no runtime of its own).
fn wait<F: Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

/// `f`, which waits on the database, run where it may: on a worker of a
/// multi-threaded runtime, with the worker's other tasks handed over while
/// it waits; elsewhere as it is.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A pooled connection in use: unless its transaction is known to have
/// ended (COMMIT or ROLLBACK answered), it is closed rather than handed
/// out again, a panic in a transaction's body included, so that no caller
/// ever begins inside another's transaction.
struct InUse {
    client: Option<Object>,
    ended: bool,
}

impl InUse {
    fn client(&self) -> &deadpool_postgres::ClientWrapper {
        self.client
            .as_deref()
            .expect("a connection in use is held until dropped")
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            if self.ended && !c.is_closed() {
                drop(c);
            } else {
                drop(Object::take(c));
            }
        }
    }
}

/// Opens the pool's connections on [`io`] and sets each session's limits
/// before the pool hands it out.
struct Connector {
    tls: MakeRustlsConnect,
}

impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        config: &Config,
    ) -> std::pin::Pin<
        Box<
            dyn Future<
                    Output = Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
                > + Send
                + '_,
        >,
    > {
        let tls = self.tls.clone();
        let config = config.clone();
        Box::pin(async move {
            let (client, task) = open(&config, tls).await?;
            Ok((client, task))
        })
    }
}

/// How long one statement may run, and a transaction stay idle, before
/// PostgreSQL ends it: a database that hangs fails the call instead of
/// holding it (and the store's lock) for ever. The server's side of a TCP
/// connection probes too (a client whose host vanished has its session,
/// and the locks it holds, ended in about 25 s rather than the system's
/// 2 h); ignored over a Unix socket.
const SESSION_LIMITS: &str = "SET statement_timeout = '10s'; \
     SET idle_in_transaction_session_timeout = '30s'; \
     SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3";

/// A new connection, driven by a task on the current runtime (always
/// [`io`] here), with the session's time limits set.
async fn open(
    config: &Config,
    tls: MakeRustlsConnect,
) -> Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
    let (client, connection) = config.connect(tls).await?;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("a database connection ended: {e}");
        }
    });
    client.batch_execute(SESSION_LIMITS).await?;
    Ok((client, task))
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
    /// system's roots and `ca_file`'s, with the default pool. Connects at
    /// once: a database that cannot be reached is an error here, not at
    /// the first call.
    pub fn connect(conninfo: &str, ca_file: Option<&Path>) -> Result<PostgresDb, DbError> {
        PostgresDb::connect_pooled(conninfo, ca_file, PoolSettings::DEFAULT)
    }

    /// [`PostgresDb::connect`] with a pool of `settings`.
    pub fn connect_pooled(
        conninfo: &str,
        ca_file: Option<&Path>,
        settings: PoolSettings,
    ) -> Result<PostgresDb, DbError> {
        if settings.size == 0 {
            return Err(DbError::Other(
                "[store] pool_size is 0: at least one connection is needed".into(),
            ));
        }
        let mut config: Config = conninfo.parse().map_err(|e: tokio_postgres::Error| {
            DbError::Other(format!("the connection string: {e}"))
        })?;
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
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
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
        let tls = tls(ca_file)?;
        let manager = deadpool_postgres::Manager::from_connect(
            config.clone(),
            Connector { tls: tls.clone() },
            deadpool_postgres::ManagerConfig {
                // A connection is checked (closed or not) as it is handed
                // out; one lost since is found by its BEGIN (`begin`).
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let connect_timeout = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(5));
        let pool = Pool::builder(manager)
            .max_size(settings.size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(settings.wait))
            // Connecting and setting the session's limits.
            .create_timeout(Some(connect_timeout + Duration::from_secs(5)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| DbError::Other(format!("the connection pool: {e}")))?;
        let db = PostgresDb {
            target: Target { config, tls },
            describe,
            pool,
            settings,
        };
        drop(db.checkout()?);
        Ok(db)
    }

    /// The pool's bounds.
    pub fn pool_settings(&self) -> PoolSettings {
        self.settings
    }

    /// How many connections the pool holds now, and how many of them are
    /// idle.
    pub fn pool_status(&self) -> (usize, usize) {
        let s = self.pool.status();
        (s.size, s.available)
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
        blocking(|| self.migrate_here(&table, &list))
    }

    fn migrate_here(&self, table: &str, list: &[refinery::Migration]) -> Result<(), DbError> {
        let mut client = self.checkout()?;
        let lock = format!("SELECT pg_advisory_lock({MIGRATION_LOCK})");
        let unlock = format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})");
        wait(client.batch_execute(&lock))?;
        // A replica of the previous version, started while a newer one
        // has already added its (additive) migrations, still runs.
        let mut runner = refinery::Runner::new(list).set_abort_missing(false);
        runner.set_migration_table_name(table);
        let ran = wait(runner.run_async(&mut **client))
            .map_err(|e| DbError::Other(format!("migrating {table}: {e}")));
        if wait(client.batch_execute(&unlock)).is_err() {
            // The lock is the session's: a connection that may still hold
            // it is closed, never handed out again.
            drop(Object::take(client));
        }
        ran.map(|_| ())
    }

    /// Call `on` with the payload of every notification on `channel`, on
    /// a connection of its own (outside the pool), for as long as the
    /// process lives; a lost connection is made again (a second later, and
    /// `on("")` says that notifications may have been missed meanwhile).
    pub fn listen(
        &self,
        channel: &str,
        on: impl Fn(&str) + Send + Sync + 'static,
    ) -> Result<(), DbError> {
        let target = self.target.clone();
        let listen = format!("LISTEN \"{}\"", channel.replace('"', ""));
        let at = self.describe.clone();
        let on = Arc::new(on);
        io()?.spawn(async move {
            loop {
                if let Err(e) = listening(&target, &listen, Arc::clone(&on)).await {
                    tracing::warn!(db = %at, "listening for changes: {e}");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Ok(())
    }

    /// Hold the session-level advisory lock `key` on a connection of its
    /// own (outside the pool) for as long as the returned guard lives,
    /// running `beat` (with `params`) once when the lock is taken and
    /// every `every` after: the way a replica shows it is alive. Another
    /// session can take the lock (`pg_try_advisory_xact_lock`) only once
    /// this connection is gone: the process died (its socket closed by the
    /// kernel), the guard was dropped, or the connection was lost (then it
    /// is made again, the lock taken again, and `beat` run, a second
    /// later). Returns once the lock is held and `beat` ran the first time.
    pub fn hold(
        &self,
        key: i64,
        beat: &str,
        params: Vec<SqlValue>,
        every: Duration,
    ) -> Result<HeldLock, DbError> {
        let target = self.target.clone();
        let at = self.describe.clone();
        let beat = Arc::new(dollar(beat));
        let params = Arc::new(params);
        let first = {
            let (target, beat, params) = (target.clone(), Arc::clone(&beat), Arc::clone(&params));
            blocking(|| {
                on_io(async move {
                    let c = take_lock(&target, key).await?;
                    run_beat(&c, &beat, &params).await?;
                    Ok(c)
                })
            })?
        };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let since = Arc::new(Mutex::new(Some(std::time::Instant::now())));
        let held_since = Arc::clone(&since);
        io()?.spawn(async move {
            let mut client = Some(first);
            let step = Duration::from_millis(100);
            let mut wait = every;
            'outer: loop {
                let mut waited = Duration::ZERO;
                while waited < wait {
                    if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                        break 'outer;
                    }
                    tokio::time::sleep(step).await;
                    waited += step;
                }
                let result = match client.as_ref() {
                    Some(c) => run_beat(c, &beat, &params).await,
                    None => match take_lock(&target, key).await {
                        Ok(c) => {
                            *held_since.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(std::time::Instant::now());
                            let beat = run_beat(&c, &beat, &params).await;
                            client = Some(c);
                            beat
                        }
                        Err(e) => Err(e),
                    },
                };
                if matches!(result, Ok(true)) {
                    tracing::error!(
                        db = %at,
                        "the other replicas had taken this one for dead (its connection to the database was lost for too long): the credentials of its calls then in flight were revoked, and those calls fail; it is registered again"
                    );
                }
                wait = every;
                if let Err(e) = result {
                    tracing::warn!(db = %at, "showing this replica alive: {e}");
                    // Only a lost connection lost the lock: it is made
                    // again at once (then every second), so that the
                    // others find the lock taken again before they call
                    // this replica dead.
                    if client.as_ref().is_none_or(Client::is_closed) {
                        client = None;
                        *held_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
                        wait = Duration::from_secs(1);
                    }
                }
            }
            drop(client);
        });
        Ok(HeldLock { stop, since })
    }

    /// A connection from the pool (waiting at most the pool's `wait` for
    /// one), opened on [`io`] if none is idle.
    fn checkout(&self) -> Result<Object, DbError> {
        let pool = self.pool.clone();
        let settings = self.settings;
        on_io(async move {
            pool.get().await.map_err(|e| match e {
                PoolError::Timeout(TimeoutType::Wait) => DbError::Other(format!(
                    "all {} connections to the database ([store] pool_size) stayed in use for {} s ([store] pool_wait_secs)",
                    settings.size,
                    settings.wait.as_secs_f32()
                )),
                PoolError::Timeout(_) => {
                    DbError::Other("the database did not answer a new connection in time".into())
                }
                PoolError::Backend(e) => DbError::Postgres(e),
                other => DbError::Other(format!("the connection pool: {other}")),
            })
        })
    }

    /// A connection with `begin` run on it. A pooled connection whose
    /// BEGIN gets no answer was lost (the server restarted, say): nothing
    /// ran on it, and the idle ones beside it are likely lost too, so they
    /// are all let go and a new connection begins instead, once.
    fn begin(&self, begin: &str) -> Result<InUse, DbError> {
        let client = InUse {
            client: Some(self.checkout()?),
            ended: false,
        };
        match wait(client.client().batch_execute(begin)) {
            Ok(()) => return Ok(client),
            // The server answered, on a connection that is still open: its
            // refusal is the answer (the connection, its transaction in an
            // unknown state, is closed).
            Err(e) if e.as_db_error().is_some() && !client.client().is_closed() => {
                return Err(e.into());
            }
            Err(_) => {
                drop(client);
                self.pool.retain(|_, _| false);
            }
        }
        let client = InUse {
            client: Some(self.checkout()?),
            ended: false,
        };
        wait(client.client().batch_execute(begin))?;
        Ok(client)
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
        blocking(|| self.run_here(begin, body, read_only))
    }

    fn run_here(&self, begin: &str, body: &mut Body<'_>, read_only: bool) -> Result<(), DbError> {
        let mut attempt = 0;
        loop {
            let mut held = self.begin(begin)?;
            let client = held.client();
            // Whether the transaction is known to have ended (else the
            // connection is closed, not handed out again).
            let (ended, run) = match body(&mut PgTx(client)) {
                Ok(End::Commit) if !read_only => match wait(client.batch_execute("COMMIT")) {
                    Ok(()) => (true, Ok(())),
                    // The server answered: it did not commit, and the
                    // transaction is over.
                    Err(e) if e.as_db_error().is_some() => (true, Err(e.into())),
                    // No answer: it may have committed or not.
                    Err(e) => (
                        false,
                        Err(DbError::CommitUnknown(DbError::from(e).to_string())),
                    ),
                },
                Ok(_) => match wait(client.batch_execute("ROLLBACK")) {
                    Ok(()) => (true, Ok(())),
                    Err(e) => (false, Err(e.into())),
                },
                Err(e) => (wait(client.batch_execute("ROLLBACK")).is_ok(), Err(e)),
            };
            held.ended = ended;
            drop(held);
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
    }
}

/// One connection's life listening on a channel: ends (with its reason)
/// when the connection does.
async fn listening(
    target: &Target,
    listen: &str,
    on: Arc<impl Fn(&str) + Send + Sync + 'static>,
) -> Result<(), DbError> {
    let (client, mut connection) = target.config.connect(target.tls.clone()).await?;
    // The connection's messages are read here (the notifications among
    // them) while the client sends LISTEN.
    let heard = Arc::clone(&on);
    let reader = tokio::spawn(async move {
        loop {
            match futures::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    // Off this runtime's one thread: a listener that waited
                    // on the database here would wait on itself.
                    let heard = Arc::clone(&heard);
                    tokio::task::spawn_blocking(move || heard(n.payload()));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(DbError::from(e)),
                None => return Ok(()),
            }
        }
    });
    let listened = client.batch_execute(listen).await;
    if let Err(e) = listened {
        reader.abort();
        return Err(e.into());
    }
    let told = Arc::clone(&on);
    tokio::task::spawn_blocking(move || told(""));
    let ended = reader
        .await
        .map_err(|e| DbError::Other(format!("the listener's task: {e}")))?;
    drop(client);
    ended.and(Err(DbError::Other("the connection was closed".into())))
}

/// A connection of its own holding the session advisory lock `key`.
async fn take_lock(target: &Target, key: i64) -> Result<Client, DbError> {
    let (c, _task) = open(&target.config, target.tls.clone()).await?;
    c.execute("SELECT pg_advisory_lock($1)", &[&key]).await?;
    Ok(c)
}

/// Run a presence beat. A beat may return one boolean: true when what it
/// keeps had to be made again (the others had taken it for gone).
async fn run_beat(c: &Client, beat: &str, params: &[SqlValue]) -> Result<bool, DbError> {
    let rows = c.query(beat, &bound(params)).await?;
    Ok(rows
        .first()
        .and_then(|r| r.try_get::<_, bool>(0).ok())
        .unwrap_or(false))
}

/// An advisory lock [`PostgresDb::hold`] holds: released (its connection
/// closed) soon after this is dropped.
#[derive(Debug)]
pub struct HeldLock {
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Since when the lock has been held without a break (`None`: lost
    /// now).
    since: Arc<Mutex<Option<std::time::Instant>>>,
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

fn jitter_ms() -> u64 {
    let mut b = [0u8; 1];
    let _ = getrandom::fill(&mut b);
    u64::from(b[0] % 8)
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

/// A value bound as the statement's parameter wants it: NULL of any
/// type, the others as their own type is bound (an integer to a `BIGINT`,
/// text to `TEXT`; another type is refused, not converted).
impl ToSql for SqlValue {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            SqlValue::Null => Ok(IsNull::Yes),
            SqlValue::Int(v) => v.to_sql_checked(ty, out),
            SqlValue::Text(v) => v.to_sql_checked(ty, out),
            SqlValue::Bool(v) => v.to_sql_checked(ty, out),
            SqlValue::Bytes(v) => v.to_sql_checked(ty, out),
        }
    }
    fn accepts(_: &Type) -> bool {
        true
    }
    tokio_postgres::types::to_sql_checked!();
}

/// A statement's parameters as the client takes them.
fn bound(params: &[SqlValue]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// A transaction's statements on a pooled connection. Each is prepared
/// unnamed, as it runs, not kept on the connection: a pooler between the
/// gateway and the database (PgBouncer in transaction mode) may hand the
/// next transaction another server connection, where a kept statement
/// would not exist.
struct PgTx<'a>(&'a deadpool_postgres::ClientWrapper);

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

impl Tx for PgTx<'_> {
    fn notify(&mut self, channel: &str, payload: &str) -> Result<(), DbError> {
        wait(
            self.0
                .execute("SELECT pg_notify($1, $2)", &[&channel, &payload]),
        )?;
        Ok(())
    }

    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        Ok(wait(self.0.execute(dollar(sql).as_str(), &bound(params)))?)
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<Vec<Row>, DbError> {
        let rows = wait(self.0.query(dollar(sql).as_str(), &bound(params)))?;
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
