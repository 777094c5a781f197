//! Pod Security Standards, `restricted` profile (which includes
//! `baseline`), checked in code against the sandbox pod, rule by rule as the
//! Kubernetes documentation lists them — plus the gateway's own rules the
//! standard does not have (read-only root, no service account token, a
//! runtime class). A change that weakens the sandbox pod fails the tests.

use k8s_openapi::api::core::v1::{Container, PodSpec, SecurityContext};

const BASELINE_CAPS: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

const SAFE_SYSCTLS: [&str; 8] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
];

const SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

fn all_containers(spec: &PodSpec) -> Vec<(&str, &Container)> {
    let mut v: Vec<(&str, &Container)> = spec.containers.iter().map(|c| ("container", c)).collect();
    v.extend(
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| ("init container", c)),
    );
    v
}

/// Every violation of `restricted` and of the gateway's own rules for a
/// sandbox pod; empty when the pod passes.
pub fn violations(spec: &PodSpec) -> Vec<String> {
    let mut v = restricted(spec);
    // --- the gateway's own rules for a sandbox ---
    for (kind, c) in all_containers(spec) {
        let ro = c
            .security_context
            .as_ref()
            .and_then(|sc| sc.read_only_root_filesystem);
        if ro != Some(true) {
            v.push(format!(
                "gateway: {kind} {:?} must have a read-only root filesystem",
                c.name
            ));
        }
    }
    if spec.automount_service_account_token != Some(false) {
        v.push("gateway: automountServiceAccountToken must be false".into());
    }
    if spec.runtime_class_name.as_deref().unwrap_or("").is_empty() {
        v.push("gateway: the pod must name its runtimeClassName (gVisor)".into());
    }
    v
}

/// Every violation of the Pod Security Standards' `restricted` profile
/// alone (what admission enforces in a namespace labelled
/// `pod-security.kubernetes.io/enforce: restricted`); empty when it passes.
pub fn restricted(spec: &PodSpec) -> Vec<String> {
    let mut v = Vec::new();
    let psc = spec.security_context.clone().unwrap_or_default();
    let containers = all_containers(spec);
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        v.push("ephemeral containers are not allowed".into());
    }

    // --- baseline ---
    for (flag, name) in [
        (spec.host_network, "hostNetwork"),
        (spec.host_pid, "hostPID"),
        (spec.host_ipc, "hostIPC"),
    ] {
        if flag == Some(true) {
            v.push(format!("host namespaces: {name} must be false"));
        }
    }
    if psc
        .windows_options
        .as_ref()
        .and_then(|w| w.host_process)
        .unwrap_or(false)
    {
        v.push("HostProcess: pod windowsOptions.hostProcess must be false".into());
    }
    for vol in spec.volumes.iter().flatten() {
        if vol.host_path.is_some() {
            v.push(format!(
                "hostPath volumes: volume {:?} is a hostPath",
                vol.name
            ));
        }
        // --- restricted: volume types ---
        let allowed = vol.config_map.is_some()
            || vol.csi.is_some()
            || vol.downward_api.is_some()
            || vol.empty_dir.is_some()
            || vol.ephemeral.is_some()
            || vol.persistent_volume_claim.is_some()
            || vol.projected.is_some()
            || vol.secret.is_some();
        if !allowed {
            v.push(format!(
                "volume types: volume {:?} has a type restricted does not allow",
                vol.name
            ));
        }
    }
    for s in psc.sysctls.iter().flatten() {
        if !SAFE_SYSCTLS.contains(&s.name.as_str()) {
            v.push(format!("sysctls: {} is not in the safe set", s.name));
        }
    }
    let check_selinux =
        |who: &str, o: &Option<k8s_openapi::api::core::v1::SELinuxOptions>, v: &mut Vec<String>| {
            if let Some(se) = o {
                if se
                    .type_
                    .as_deref()
                    .is_some_and(|t| !SELINUX_TYPES.contains(&t))
                {
                    v.push(format!("SELinux: {who} type {:?} is not allowed", se.type_));
                }
                if se.user.is_some() || se.role.is_some() {
                    v.push(format!("SELinux: {who} must not set user or role"));
                }
            }
        };
    check_selinux("pod", &psc.se_linux_options, &mut v);
    let apparmor_ok = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    if let Some(a) = &psc.app_armor_profile
        && !apparmor_ok(&a.type_)
    {
        v.push(format!(
            "AppArmor: pod profile {:?} is not allowed",
            a.type_
        ));
    }
    let pod_seccomp = psc.seccomp_profile.as_ref().map(|s| s.type_.as_str());
    if pod_seccomp == Some("Unconfined") {
        v.push("seccomp: the pod profile must not be Unconfined".into());
    }

    for (kind, c) in &containers {
        let who = format!("{kind} {:?}", c.name);
        let sc: SecurityContext = c.security_context.clone().unwrap_or_default();
        if sc.privileged == Some(true) {
            v.push(format!("privileged: {who} must not be privileged"));
        }
        if sc
            .windows_options
            .as_ref()
            .and_then(|w| w.host_process)
            .unwrap_or(false)
        {
            v.push(format!("HostProcess: {who} must not be a host process"));
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        for add in caps.add.iter().flatten() {
            if !BASELINE_CAPS.contains(&add.as_str()) {
                v.push(format!("capabilities: {who} adds {add}"));
            } else if add != "NET_BIND_SERVICE" {
                // --- restricted: only NET_BIND_SERVICE may be added ---
                v.push(format!(
                    "capabilities: {who} adds {add} (restricted allows only NET_BIND_SERVICE)"
                ));
            }
        }
        for p in c.ports.iter().flatten() {
            if p.host_port.unwrap_or(0) != 0 {
                v.push(format!("host ports: {who} uses hostPort {:?}", p.host_port));
            }
        }
        check_selinux(&who, &sc.se_linux_options, &mut v);
        if let Some(a) = &sc.app_armor_profile
            && !apparmor_ok(&a.type_)
        {
            v.push(format!(
                "AppArmor: {who} profile {:?} is not allowed",
                a.type_
            ));
        }
        if sc.proc_mount.as_deref().is_some_and(|p| p != "Default") {
            v.push(format!(
                "/proc mount: {who} must use the Default proc mount"
            ));
        }
        let c_seccomp = sc.seccomp_profile.as_ref().map(|s| s.type_.as_str());
        if c_seccomp == Some("Unconfined") {
            v.push(format!("seccomp: {who} profile must not be Unconfined"));
        }

        // --- restricted ---
        if sc.allow_privilege_escalation != Some(false) {
            v.push(format!(
                "privilege escalation: {who} must set allowPrivilegeEscalation: false"
            ));
        }
        let non_root = sc.run_as_non_root.or(psc.run_as_non_root);
        if non_root != Some(true) {
            v.push(format!(
                "running as non-root: {who} must run with runAsNonRoot: true"
            ));
        }
        if sc.run_as_user.or(psc.run_as_user) == Some(0) {
            v.push(format!(
                "running as non-root user: {who} must not run as uid 0"
            ));
        }
        match c_seccomp.or(pod_seccomp) {
            Some("RuntimeDefault" | "Localhost") => {}
            other => v.push(format!(
                "seccomp: {who} needs RuntimeDefault or Localhost, has {other:?}"
            )),
        }
        if !caps.drop.iter().flatten().any(|d| d == "ALL") {
            v.push(format!("capabilities: {who} must drop ALL"));
        }
    }
    if psc.run_as_user == Some(0) {
        v.push("running as non-root user: the pod must not run as uid 0".into());
    }
    if psc.run_as_non_root == Some(false) {
        v.push("running as non-root: the pod must not set runAsNonRoot: false".into());
    }
    v
}
