//! The credential broker (README.md: credentials): a credential minted for one call, in the
//! narrowest scope the decision derived, revoked as soon as the sandbox
//! ends — on success, failure, deadline, cancellation or panic alike.
//!
//! This module holds the broker contract and the revocation guarantee;
//! [`vault`] is the Vault/OpenBao implementation and [`leases`] its ledger of
//! issued leases. With no broker configured, a call whose decision needs a
//! credential is refused before anything runs.

pub mod kubeconfig;
pub mod leases;
pub mod setup;
pub mod vault;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use gateway_audit::audit::{AuditLog, Event};
use gateway_base::secret::SecretFile;
use gateway_policy::CredentialScope;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The most lanes `gateway vault setup --lanes` makes and `[vault] lanes`
/// takes.
pub const MAX_LANES: usize = 64;

/// The mount of lane `lane` (0-based) of the Kubernetes secrets engine
/// mounted at `mount`: lane 0 is `mount` itself, lane 1 `MOUNT-lane-2`…
/// Each lane is the same engine, configured the same, with the same roles:
/// OpenBao's engine talks to the API server through a client-side rate
/// limiter of its own per mount (5 requests/s, burst 10), and a credential
/// costs 7 requests: one mount sustained 1.25 credentials a second
/// (`broker/issue_revoke_sustained`), and lanes add up.
pub fn lane_mount(mount: &str, lane: usize) -> String {
    let mount = mount.trim_matches('/');
    if lane == 0 {
        mount.to_string()
    } else {
        format!("{mount}-lane-{}", lane + 1)
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    #[error("the credential broker is unreachable: {0}")]
    Unreachable(String),
    #[error("the credential broker refused: {0}")]
    Refused(String),
}

/// A credential minted for one call. The secret prints as `<redacted>`
/// and is zeroed when dropped.
#[derive(Debug, Clone)]
pub struct IssuedCredential {
    /// The lease to revoke (kept in the audit log; not a secret).
    pub lease_id: String,
    pub secret: SecretFile,
    pub ttl: Duration,
    /// What the secret is (not secret itself).
    pub meta: CredentialMeta,
}

/// What kind of secret a credential file holds, and its public facts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CredentialMeta {
    /// A Kubernetes service account token (the file is the bare token).
    KubernetesToken {
        namespace: String,
        service_account: String,
    },
    /// AWS keys (the file is a shared credentials file).
    AwsKeys { access_key_id: String },
    /// A database user (the file is `username = …` and `password = …`
    /// lines; the user's name is not secret, its password is).
    DatabaseUser { username: String },
    /// Anything else (test doubles).
    Opaque,
}

/// A broker's leave to mint one credential now (a lane and its permit):
/// held from [`Broker::turn`] to [`Broker::issue_in_turn`]; dropped
/// unused, it gives the turn back and nothing was minted.
#[derive(Debug, Default)]
pub struct Turn {
    /// The mount to mint on (a lane of the scope's), when the broker chose one.
    pub mount: Option<String>,
    /// Held while minting.
    pub permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A source of per-call credentials.
pub trait Broker: Send + Sync {
    /// Mint exactly the credential `scope` names, for request `request_id`.
    fn issue<'a>(
        &'a self,
        request_id: &'a str,
        scope: &'a CredentialScope,
    ) -> BoxFuture<'a, Result<IssuedCredential, BrokerError>>;
    /// Wait until `scope` may be minted now. Nothing is asked of the
    /// secrets engine before this returns, so dropping the future (the
    /// call was cancelled while it waited) costs nothing.
    fn turn<'a>(&'a self, _scope: &'a CredentialScope) -> BoxFuture<'a, Result<Turn, BrokerError>> {
        Box::pin(async { Ok(Turn::default()) })
    }
    /// Mint `scope` in a turn [`Broker::turn`] gave.
    fn issue_in_turn<'a>(
        &'a self,
        _turn: Turn,
        request_id: &'a str,
        scope: &'a CredentialScope,
    ) -> BoxFuture<'a, Result<IssuedCredential, BrokerError>> {
        self.issue(request_id, scope)
    }
    /// Revoke a lease (synchronously: it is dead when this returns Ok).
    fn revoke<'a>(&'a self, lease_id: &'a str) -> BoxFuture<'a, Result<(), BrokerError>>;
}

/// Issue for request `request_id` in a task of its own. If the call is
/// cancelled while the broker is minting (the caller's future dropped), the
/// credential that still arrives is audited and revoked at once, instead of
/// living, unused, until its TTL: nobody else holds its lease id. That
/// holds too when the credential was already sent and the caller is
/// dropped before taking it: the value in the channel revokes itself
/// ([`Unclaimed`]).
pub async fn issue_for_call(
    broker: &Arc<dyn Broker>,
    audit: &Arc<AuditLog>,
    request_id: &str,
    scope: &CredentialScope,
) -> Result<IssuedCredential, BrokerError> {
    // The wait for a turn is the caller's: a call cancelled while it waits
    // leaves nothing to mint (a burst of started-and-cancelled calls does
    // not queue mints that nobody will use).
    let turn = broker.turn(scope).await?;
    let (tx, rx) = tokio::sync::oneshot::channel::<Result<Unclaimed, BrokerError>>();
    let (b, a, rid, sc) = (
        Arc::clone(broker),
        Arc::clone(audit),
        request_id.to_string(),
        scope.clone(),
    );
    // Counted like a revocation, so that a stopping daemon waits (within
    // its grace) for a credential being minted to arrive and be revoked.
    let pending = AbortRevocation::start();
    tokio::spawn(async move {
        let _pending = pending;
        let issued = b.issue_in_turn(turn, &rid, &sc).await.map(|c| Unclaimed {
            credential: Some(c),
            broker: b,
            audit: a,
            request_id: rid,
            scope: sc,
        });
        // Not received (the caller is gone): dropped here, it revokes itself.
        let _ = tx.send(issued);
    });
    match rx.await {
        Ok(Ok(mut unclaimed)) => unclaimed.credential.take().ok_or_else(|| {
            BrokerError::Unreachable("the credential request ended without an answer".into())
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(BrokerError::Unreachable(
            "the credential request ended without an answer".into(),
        )),
    }
}

/// A credential minted for a call that has not taken it yet. Dropped
/// untaken (the call was cancelled while it was minted, or just after),
/// it is audited and revoked from a task.
struct Unclaimed {
    credential: Option<IssuedCredential>,
    broker: Arc<dyn Broker>,
    audit: Arc<AuditLog>,
    request_id: String,
    scope: CredentialScope,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(orphan) = self.credential.take() else {
            return;
        };
        let (b, a, rid, sc) = (
            Arc::clone(&self.broker),
            Arc::clone(&self.audit),
            self.request_id.clone(),
            self.scope.clone(),
        );
        let record = move || {
            let _ = a.record(
                &rid,
                Event::CredentialIssued {
                    lease_id: orphan.lease_id.clone(),
                    mount: sc.mount.clone(),
                    role: sc.role.clone(),
                    params: None,
                    ttl_seconds: None,
                    credential: None,
                    after_cancellation: Some(true),
                },
            );
            (a, rid, orphan.lease_id.clone())
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let pending = AbortRevocation::start();
                handle.spawn(async move {
                    let (a, rid, lease) = record();
                    revoke_with_retries(b.as_ref(), &a, &rid, &lease).await;
                    drop(pending);
                });
            }
            Err(_) => {
                // No runtime left: the lease is in the ledger for the next start.
                let _ = record();
            }
        }
    }
}

/// Delays between revoke attempts.
pub const REVOKE_BACKOFF: [Duration; 4] = [
    Duration::from_millis(0),
    Duration::from_millis(200),
    Duration::from_millis(800),
    Duration::from_millis(2000),
];

/// Revoke with retries; audits `credential.revoked`, or
/// `credential.revoke_failed` for each failed attempt.
pub async fn revoke_with_retries(
    broker: &dyn Broker,
    audit: &AuditLog,
    request_id: &str,
    lease_id: &str,
) -> bool {
    for (attempt, delay) in REVOKE_BACKOFF.iter().enumerate() {
        tokio::time::sleep(*delay).await;
        match broker.revoke(lease_id).await {
            Ok(()) => {
                let _ = audit.record(
                    request_id,
                    Event::CredentialRevoked {
                        lease_id: lease_id.into(),
                        attempt: Some(attempt + 1),
                        recovered: None,
                        reason: None,
                        issued_at: None,
                        owner_pid: None,
                        owner_replica: None,
                    },
                );
                return true;
            }
            Err(e) => {
                let _ = audit.record(
                    request_id,
                    Event::CredentialRevokeFailed {
                        lease_id: lease_id.into(),
                        error: e.to_string(),
                        attempt: Some(attempt + 1),
                        of: Some(REVOKE_BACKOFF.len()),
                        recovered: None,
                        expires_at: None,
                    },
                );
            }
        }
    }
    false
}

/// Revokes its lease when dropped without [`RevokeGuard::revoke`] having
/// run — the cancellation and panic paths. The revocation then runs on the
/// runtime in the background (a `Drop` cannot wait for it).
pub struct RevokeGuard {
    broker: Arc<dyn Broker>,
    audit: Arc<AuditLog>,
    request_id: String,
    lease_id: Option<String>,
}

impl std::fmt::Debug for RevokeGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RevokeGuard")
            .field("lease_id", &self.lease_id)
            .finish_non_exhaustive()
    }
}

impl RevokeGuard {
    pub fn new(
        broker: Arc<dyn Broker>,
        audit: Arc<AuditLog>,
        request_id: &str,
        lease_id: &str,
    ) -> RevokeGuard {
        RevokeGuard {
            broker,
            audit,
            request_id: request_id.into(),
            lease_id: Some(lease_id.into()),
        }
    }

    /// Revoke now (the normal path); true when the lease is revoked. The
    /// guard keeps the lease until the revocation has returned: a call
    /// dropped in the middle of it (cancelled, its client gone) still
    /// hands the lease to the background revocation of [`Drop`].
    pub async fn revoke(mut self) -> bool {
        let Some(lease) = self.lease_id.clone() else {
            return true;
        };
        let done =
            revoke_with_retries(self.broker.as_ref(), &self.audit, &self.request_id, &lease).await;
        self.lease_id = None;
        done
    }
}

/// Revocations of dropped calls' credentials still running in the
/// background, so that a stopping daemon can wait for them
/// ([`abort_revocations_done`]) before it revokes what is left itself.
static ABORT_REVOCATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static ABORT_REVOCATIONS_DONE: tokio::sync::Notify = tokio::sync::Notify::const_new();

struct AbortRevocation;

impl AbortRevocation {
    fn start() -> AbortRevocation {
        ABORT_REVOCATIONS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        AbortRevocation
    }
}

impl Drop for AbortRevocation {
    fn drop(&mut self) {
        ABORT_REVOCATIONS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        ABORT_REVOCATIONS_DONE.notify_waiters();
    }
}

/// Wait until no dropped call's revocation is running in the background.
pub async fn abort_revocations_done() {
    loop {
        let notified = ABORT_REVOCATIONS_DONE.notified();
        if ABORT_REVOCATIONS.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return;
        }
        notified.await;
    }
}

impl Drop for RevokeGuard {
    fn drop(&mut self) {
        let Some(lease) = self.lease_id.take() else {
            return;
        };
        let (broker, audit, rid) = (
            Arc::clone(&self.broker),
            Arc::clone(&self.audit),
            self.request_id.clone(),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let pending = AbortRevocation::start();
                handle.spawn(async move {
                    let _ = audit.record(
                        &rid,
                        Event::CredentialRevokeOnAbort {
                            lease_id: lease.clone(),
                        },
                    );
                    revoke_with_retries(broker.as_ref(), &audit, &rid, &lease).await;
                    drop(pending);
                });
            }
            Err(_) => {
                // No runtime (process teardown): say so; the lease still
                // expires at its TTL.
                let _ = audit.record(
                    &rid,
                    Event::CredentialRevokeFailed {
                        lease_id: lease.clone(),
                        error: "no runtime to revoke on; the lease expires at its TTL".into(),
                        attempt: None,
                        of: None,
                        recovered: None,
                        expires_at: None,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Revokes after a pause, counting what it revoked.
    #[derive(Default)]
    struct Slow {
        revoked: Mutex<Vec<String>>,
    }

    impl Broker for Slow {
        fn issue<'a>(
            &'a self,
            _: &'a str,
            _: &'a CredentialScope,
        ) -> BoxFuture<'a, Result<IssuedCredential, BrokerError>> {
            Box::pin(async { Err(BrokerError::Unreachable("not in this test".into())) })
        }
        fn revoke<'a>(&'a self, lease_id: &'a str) -> BoxFuture<'a, Result<(), BrokerError>> {
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                self.revoked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(lease_id.into());
                Ok(())
            })
        }
    }

    /// Issues after a pause, recording what it issued and revoked.
    #[derive(Default)]
    struct Quick {
        issued: Mutex<Vec<String>>,
        revoked: Mutex<Vec<String>>,
    }

    impl Broker for Quick {
        fn issue<'a>(
            &'a self,
            _: &'a str,
            _: &'a CredentialScope,
        ) -> BoxFuture<'a, Result<IssuedCredential, BrokerError>> {
            Box::pin(async move {
                // Long enough that the caller's first poll cannot already
                // find the credential (it would take it, and the test would
                // drop an ordinary result).
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                let lease = "lease-quick".to_string();
                self.issued
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(lease.clone());
                Ok(IssuedCredential {
                    lease_id: lease,
                    secret: gateway_sandbox::SecretFile::new(b"token".to_vec()),
                    ttl: std::time::Duration::from_secs(60),
                    meta: CredentialMeta::Opaque,
                })
            })
        }
        fn revoke<'a>(&'a self, lease_id: &'a str) -> BoxFuture<'a, Result<(), BrokerError>> {
            Box::pin(async move {
                self.revoked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(lease_id.into());
                Ok(())
            })
        }
    }

    /// The credential was minted and handed over, but the call was dropped
    /// before it took it (a cancel that lands just then): it is revoked.
    /// Before, it was dropped with the channel, its lease left open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_credential_sent_to_a_call_dropped_before_taking_it_is_revoked() {
        let dir = tempfile::tempdir().expect("tmp");
        let audit = Arc::new(AuditLog::in_home(dir.path()).expect("audit"));
        let quick = Arc::new(Quick::default());
        let broker: Arc<dyn Broker> = quick.clone();
        let scope = CredentialScope {
            kind: "pod_reader".into(),
            credential_type: "kubernetes".into(),
            mount: "kubernetes".into(),
            role: "r".into(),
            params: Default::default(),
        };
        let call = issue_for_call(&broker, &audit, "req-q", &scope);
        let mut call = Box::pin(call);
        // Polled once: the minting task starts; then never again.
        std::future::poll_fn(|cx| {
            let _ = call.as_mut().poll(cx);
            std::task::Poll::Ready(())
        })
        .await;
        let minted = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while quick
                .issued
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
            {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(minted.is_ok(), "the broker minted");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        drop(call);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        tokio::time::timeout(std::time::Duration::from_secs(5), abort_revocations_done())
            .await
            .expect("the revocation ends");
        assert_eq!(
            *quick.revoked.lock().unwrap_or_else(|p| p.into_inner()),
            vec!["lease-quick".to_string()]
        );
        let log = std::fs::read_to_string(audit.path()).expect("audit");
        assert!(log.contains("\"after_cancellation\":true"), "{log}");
    }

    /// A call dropped while its credential is being revoked (a cancel that
    /// arrives just then) still has the lease revoked: before, the guard
    /// had already given the lease up, and the lease stayed open.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_dropped_mid_revocation_still_revokes() {
        let dir = tempfile::tempdir().expect("tmp");
        let audit = Arc::new(AuditLog::in_home(dir.path()).expect("audit"));
        let slow = Arc::new(Slow::default());
        let broker: Arc<dyn Broker> = slow.clone();
        let guard = RevokeGuard::new(broker, Arc::clone(&audit), "req-1", "lease-1");
        let call = tokio::spawn(guard.revoke());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        call.abort();
        let _ = call.await;
        tokio::time::timeout(std::time::Duration::from_secs(5), abort_revocations_done())
            .await
            .expect("the background revocation ends");
        assert_eq!(
            *slow.revoked.lock().unwrap_or_else(|p| p.into_inner()),
            vec!["lease-1".to_string()]
        );
        let log = std::fs::read_to_string(audit.path()).expect("audit");
        assert!(log.contains("credential.revoke_on_abort"), "{log}");
        assert!(log.contains("\"credential.revoked\""), "{log}");
    }
}
