//! The `kubectl_change` runner's commands and the objects it sends. The
//! operation comes whole from the policy (`operation`, built by
//! `kubernetes.rego`); this module checks it is well formed (a floor, not
//! a decision), reads the live object, works out the object to send for
//! each verb, and builds the raw API requests kubectl makes in the sandbox:
//! the live object's GET, the dry run (`dryRun=All`) of the write, and the
//! write itself with the live object's `resourceVersion` as its
//! precondition. Everything the cluster hands back is hostile input.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::kubectl::{api_word as word, dns_name as dns};
use super::{KUBECTL, Step};
use gateway_runner::protocol::FILES_IN_DIR;

/// One change, as the policy decided it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeOp {
    pub verb: String,
    pub namespace: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub kind: String,
    pub name: String,
    pub replicas: f64,
    pub container: String,
    pub image: String,
    pub to_revision: f64,
    pub manifest: Option<Value>,
    pub result_bytes: f64,
}

/// The verbs this runner carries out.
pub const VERBS: &[&str] = &[
    "scale",
    "rollout_restart",
    "set_image",
    "rollout_undo",
    "apply",
    "delete",
];

/// The largest manifest the runner sends, whatever the policy says.
pub const MAX_MANIFEST_BYTES: usize = 256 * 1024;

/// The object file among the sandbox's files in.
pub const OBJECT_FILE: &str = "object.json";

/// The annotation `kubectl rollout restart` sets on the pod template.
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";
/// The revision annotation of a Deployment's ReplicaSets.
pub const REVISION: &str = "deployment.kubernetes.io/revision";

impl ChangeOp {
    /// The operation in a decision, checked against the credential's
    /// namespace.
    pub fn from_decision(op: Option<&Value>, namespace: &str) -> Result<ChangeOp, String> {
        let Some(v) = op.filter(|v| !v.is_null()) else {
            return Err("the decision carries no Kubernetes operation for kubectl_change".into());
        };
        let op: ChangeOp = serde_json::from_value(v.clone())
            .map_err(|e| format!("the decision's Kubernetes operation is malformed: {e}"))?;
        op.check(namespace)?;
        Ok(op)
    }

    fn check(&self, namespace: &str) -> Result<(), String> {
        if !VERBS.contains(&self.verb.as_str()) {
            return Err(format!(
                "kubectl_change has no verb {:?} (it has: {})",
                self.verb,
                VERBS.join(", ")
            ));
        }
        if self.namespace != namespace || !dns(&self.namespace, 63, false) {
            return Err(format!(
                "the operation names namespace {:?} but the credential is scoped to {namespace:?}",
                self.namespace
            ));
        }
        if !dns(&self.name, 253, true) {
            return Err(format!("{:?} is not an object name", self.name));
        }
        if !word(&self.group)
            || !word(&self.version)
            || self.version.is_empty()
            || !dns(&self.resource, 63, false)
            || !self.kind.chars().all(|c| c.is_ascii_alphanumeric())
            || self.kind.is_empty()
        {
            return Err(format!(
                "{:?} of {:?}/{:?} is not a resource",
                self.resource, self.group, self.version
            ));
        }
        let whole = |f: f64| f >= 0.0 && f.fract() == 0.0 && f <= 1e9;
        match self.verb.as_str() {
            "scale" if !whole(self.replicas) => {
                return Err("scale needs a whole number of replicas".into());
            }
            "set_image"
                if !dns(&self.container, 63, false)
                    || self.image.is_empty()
                    || self.image.len() > 255
                    || self.image.starts_with('-')
                    || self
                        .image
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control()) =>
            {
                return Err("set_image needs a container name and an image reference".into());
            }
            "rollout_undo" if !whole(self.to_revision) || self.to_revision < 1.0 => {
                return Err("rollout_undo needs a revision (1 or more)".into());
            }
            "apply" => {
                let m = self.manifest.as_ref().ok_or("apply needs a manifest")?;
                let size = serde_json::to_vec(m).map(|b| b.len()).unwrap_or(usize::MAX);
                if size > MAX_MANIFEST_BYTES {
                    return Err(format!(
                        "the manifest is {size} bytes, more than {MAX_MANIFEST_BYTES}"
                    ));
                }
                if m["kind"] != self.kind.as_str()
                    || m["apiVersion"] != self.api_version().as_str()
                    || m["metadata"]["name"] != self.name.as_str()
                    || !(m["metadata"]["namespace"].is_null()
                        || m["metadata"]["namespace"] == self.namespace.as_str())
                    || !m["metadata"]["generateName"].is_null()
                {
                    return Err(
                        "the manifest is not the object the operation names (kind, apiVersion, name, namespace)"
                            .into(),
                    );
                }
            }
            _ => {}
        }
        if self.result_bytes < 1.0 {
            return Err("result_bytes must be at least 1".into());
        }
        Ok(())
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The API path of the object's collection.
    pub fn collection_path(&self) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        format!("{base}/namespaces/{}/{}", self.namespace, self.resource)
    }

    /// The API path of the object.
    pub fn object_path(&self) -> String {
        format!("{}/{}", self.collection_path(), self.name)
    }

    /// `Kind namespace/name`, as a person reads it.
    pub fn address(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }

    fn kubectl(&self, kubeconfig: &str, args: &[&str]) -> Step {
        let mut argv: Vec<String> = vec![
            KUBECTL.into(),
            "--kubeconfig".into(),
            kubeconfig.into(),
            "--request-timeout=30s".into(),
        ];
        argv.extend(args.iter().map(|s| s.to_string()));
        Step {
            argv,
            stdout_file: None,
            mcp: None,
        }
    }

    /// The plan's first sandbox: the live object.
    pub fn read_steps(&self, kubeconfig: &str) -> Vec<Step> {
        vec![self.kubectl(kubeconfig, &["get", "--raw", &self.object_path()])]
    }

    /// An undo's second read: the ReplicaSets the live Deployment selects
    /// (its `spec.selector.matchLabels`, each checked to be a label before
    /// it goes into the query), which hold its revisions (the role of
    /// `k8s_rollout_undo` may list them). Not the namespace's every
    /// ReplicaSet: in a busy namespace that list outgrows the output cap.
    pub fn revisions_steps(&self, kubeconfig: &str, live: &Value) -> Result<Vec<Step>, String> {
        let labels = live["spec"]["selector"]["matchLabels"]
            .as_object()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                format!(
                    "{} selects its pods without matchLabels: an undo needs them to find its revisions",
                    self.address()
                )
            })?;
        let mut selector = Vec::new();
        for (k, v) in labels {
            let v = v.as_str().unwrap_or_default();
            if !label_key(k) || !label_value(v) {
                return Err(format!(
                    "{}'s selector holds {k:?}={v:?}, which is not a label",
                    self.address()
                ));
            }
            selector.push(format!("{k}={v}"));
        }
        let query: String = selector
            .join(",")
            .chars()
            .map(|c| match c {
                '=' => "%3D".to_string(),
                ',' => "%2C".to_string(),
                '/' => "%2F".to_string(),
                c => c.to_string(),
            })
            .collect();
        Ok(vec![self.kubectl(
            kubeconfig,
            &[
                "get",
                "--raw",
                &format!(
                    "/apis/apps/v1/namespaces/{}/replicasets?labelSelector={query}",
                    self.namespace
                ),
            ],
        )])
    }

    /// The one request of a dry run (`dry_run`) or of the write: PUT of
    /// the object to send (which carries the live object's
    /// resourceVersion), POST when there is no live object, DELETE with
    /// the live object's uid and resourceVersion as preconditions. The
    /// body is [`OBJECT_FILE`] among the files in.
    pub fn write_steps(&self, kubeconfig: &str, creates: bool, dry_run: bool) -> Vec<Step> {
        let body = format!("{FILES_IN_DIR}/{OBJECT_FILE}");
        let mut query = vec!["fieldValidation=Strict"];
        if dry_run {
            query.insert(0, "dryRun=All");
        }
        let (verb, path) = match (self.verb.as_str(), creates) {
            ("delete", _) => ("delete", self.object_path()),
            (_, true) => ("create", self.collection_path()),
            _ => ("replace", self.object_path()),
        };
        if verb == "delete" {
            query.retain(|q| !q.starts_with("fieldValidation"));
        }
        let url = if query.is_empty() {
            path
        } else {
            format!("{path}?{}", query.join("&"))
        };
        vec![self.kubectl(kubeconfig, &[verb, "--raw", &url, "-f", &body])]
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of
/// at most 63 alphanumerics, `-`, `_` and `.`, alphanumeric at both ends.
fn label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            })
    }) && !name.is_empty()
        && label_value(name)
}

/// A label value: at most 63 alphanumerics, `-`, `_` and `.`,
/// alphanumeric at both ends (or empty).
fn label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// The body of a dry run: for a delete, its DeleteOptions with `dryRun:
/// ["All"]` — the API server reads a DELETE's options from its body when
/// it has one and then ignores the query's `dryRun`, so a dry run said
/// only in the query would delete for real. Other writes carry the object.
pub fn dry_run_body(op: &ChangeOp, desired: &Value) -> Value {
    let mut b = desired.clone();
    if op.verb == "delete" {
        b["dryRun"] = json!(["All"]);
    }
    b
}

/// The live object from the first sandbox's GET: `None` when kubectl said
/// NotFound (an apply that creates).
pub fn live_object(
    op: &ChangeOp,
    ok: bool,
    stdout: &[u8],
    stderr: &str,
) -> Result<Option<Value>, String> {
    if !ok {
        if stderr.contains("(NotFound)") && op.verb == "apply" {
            return Ok(None);
        }
        if stderr.contains("(NotFound)") {
            return Err(format!("{} does not exist", op.address()));
        }
        return Err(format!(
            "{} could not be read: {}",
            op.address(),
            gateway_base::text::escaped(stderr.trim(), false)
        ));
    }
    let v: Value =
        serde_json::from_slice(stdout).map_err(|e| format!("the live object is not JSON: {e}"))?;
    // The shape every change below edits: a hostile answer (a `spec`
    // that is a string) is refused here, never indexed into.
    let shaped = v["spec"].is_null()
        || (v["spec"].is_object()
            && (v["spec"]["template"].is_null()
                || (v["spec"]["template"].is_object()
                    && (v["spec"]["template"]["metadata"].is_null()
                        || v["spec"]["template"]["metadata"].is_object())
                    && (v["spec"]["template"]["spec"].is_null()
                        || v["spec"]["template"]["spec"].is_object()))));
    if v["kind"] != op.kind.as_str()
        || v["metadata"]["name"] != op.name.as_str()
        || v["metadata"]["namespace"] != op.namespace.as_str()
        || !v["metadata"]["resourceVersion"].is_string()
        || !v["metadata"]["uid"].is_string()
        || !shaped
    {
        return Err(format!(
            "the API server's answer for {} is not that object (kind, name, namespace, resourceVersion, uid)",
            op.address()
        ));
    }
    Ok(Some(v))
}

/// An object without what only the server writes about it now: its
/// managed fields and its status (a write of the main resource ignores
/// status anyway).
pub fn without_server_state(mut o: Value) -> Value {
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    if let Some(m) = o.as_object_mut() {
        m.remove("status");
    }
    o
}

/// What to send for `op`, from the live object: the live object changed
/// as the verb says, carrying the live resourceVersion (the precondition);
/// for an apply the manifest (with the live object's resourceVersion when
/// it exists); for a delete, DeleteOptions with the live uid and
/// resourceVersion as preconditions.
pub fn desired(
    op: &ChangeOp,
    live: Option<&Value>,
    replicasets: Option<&Value>,
    now_rfc3339: &str,
) -> Result<Value, String> {
    let rv_uid = |l: &Value| {
        (
            l["metadata"]["resourceVersion"].clone(),
            l["metadata"]["uid"].clone(),
        )
    };
    if op.verb == "apply" {
        let mut m = op.manifest.clone().ok_or("apply needs a manifest")?;
        m["metadata"]["namespace"] = json!(op.namespace);
        if let Some(l) = live {
            m["metadata"]["resourceVersion"] = rv_uid(l).0;
        }
        return Ok(m);
    }
    let live = live.ok_or_else(|| format!("{} does not exist", op.address()))?;
    if op.verb == "delete" {
        let (rv, uid) = rv_uid(live);
        return Ok(json!({"apiVersion": "v1", "kind": "DeleteOptions",
            "preconditions": {"uid": uid, "resourceVersion": rv},
            "propagationPolicy": "Background"}));
        // (The dry run's copy says `dryRun: ["All"]` in the body itself:
        // [`dry_run_body`].)
    }
    let mut o = without_server_state(live.clone());
    if !o["spec"].is_object() {
        return Err(format!("{} has no spec", op.address()));
    }
    match op.verb.as_str() {
        "scale" => o["spec"]["replicas"] = json!(op.replicas as u64),
        "rollout_restart" => {
            if !o["spec"]["template"].is_object() {
                return Err(format!("{} has no pod template", op.address()));
            }
            let t = &mut o["spec"]["template"];
            if !t["metadata"].is_object() {
                t["metadata"] = json!({});
            }
            if !t["metadata"]["annotations"].is_object() {
                t["metadata"]["annotations"] = json!({});
            }
            t["metadata"]["annotations"][RESTARTED_AT] = json!(now_rfc3339);
        }
        "set_image" => {
            let containers = o["spec"]["template"]["spec"]["containers"]
                .as_array_mut()
                .ok_or_else(|| format!("{} has no containers", op.address()))?;
            let c = containers
                .iter_mut()
                .find(|c| c["name"] == op.container.as_str())
                .ok_or_else(|| format!("{} has no container {:?}", op.address(), op.container))?;
            c["image"] = json!(op.image);
        }
        "rollout_undo" => {
            let (template, annotations) = revision_template(op, live, replicasets)?;
            o["spec"]["template"] = template;
            // As kubectl rollout undo: the revision's own annotations (its
            // change-cause) come back with its template, merged over the
            // Deployment's; the controller's bookkeeping ones do not.
            for (k, v) in annotations {
                o["metadata"]["annotations"][k] = v;
            }
        }
        other => return Err(format!("no change verb {other:?}")),
    }
    Ok(o)
}

/// The annotations `kubectl rollout undo` does not copy from a revision:
/// the deployment controller's and kubectl's own bookkeeping.
const UNDO_SKIPS: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    "deployment.kubernetes.io/revision-history",
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
    "deprecated.deployment.rollback.to",
];

/// The pod template of revision `op.to_revision` of Deployment `live`:
/// from the ReplicaSet it owns with that revision, without the
/// pod-template-hash label (as `kubectl rollout undo` does), and that
/// ReplicaSet's annotations but the ones kubectl skips.
fn revision_template(
    op: &ChangeOp,
    live: &Value,
    replicasets: Option<&Value>,
) -> Result<(Value, serde_json::Map<String, Value>), String> {
    let want = format!("{}", op.to_revision as u64);
    let uid = &live["metadata"]["uid"];
    let current = live["metadata"]["annotations"][REVISION].as_str();
    if current == Some(want.as_str()) {
        return Err(format!("{} is at revision {want} already", op.address()));
    }
    let items = replicasets
        .and_then(|r| r["items"].as_array())
        .ok_or("the ReplicaSets could not be read")?;
    let rs = items
        .iter()
        .find(|rs| {
            rs["metadata"]["annotations"][REVISION] == want.as_str()
                && rs["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|o| {
                        o.iter()
                            .any(|r| &r["uid"] == uid && r["controller"] == true)
                    })
        })
        .ok_or_else(|| {
            format!(
                "{} has no revision {want} (k8s_rollout_history lists them)",
                op.address()
            )
        })?;
    let mut t = rs["spec"]["template"].clone();
    if let Some(l) = t["metadata"]["labels"].as_object_mut() {
        l.remove("pod-template-hash");
    }
    if !t.is_object() {
        return Err(format!("revision {want} has no pod template"));
    }
    let annotations = rs["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| !UNDO_SKIPS.contains(&k.as_str()) && v.is_string())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok((t, annotations))
}

/// The dry run's answer: the object the API server says the write would
/// leave (for a delete, the object as it would be deleted). Checked to be
/// that object.
pub fn planned_object(op: &ChangeOp, stdout: &[u8], live: Option<&Value>) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(stdout)
        .map_err(|e| format!("the dry run's answer is not JSON: {e}"))?;
    // A delete of an object without finalizers is answered with a Status
    // naming the object's uid (a Pod, or an object with finalizers, with
    // the object itself).
    if op.verb == "delete" && v["kind"] == "Status" {
        let uid = live.map(|l| &l["metadata"]["uid"]);
        if v["status"] == "Success" && uid.is_some_and(|u| v["details"]["uid"] == *u) {
            return Ok(live.cloned().unwrap_or(Value::Null));
        }
        return Err(format!(
            "the dry run's answer for deleting {} is not a success for that object",
            op.address()
        ));
    }
    let named = v["metadata"]["name"] == op.name.as_str()
        && v["metadata"]["namespace"] == op.namespace.as_str()
        && v["apiVersion"] == op.api_version().as_str();
    // An update's answer is the live object (its uid), not another one.
    let same = live.is_none_or(|l| v["metadata"]["uid"] == l["metadata"]["uid"]);
    if v["kind"] != op.kind.as_str() || !named || !same {
        return Err(format!(
            "the dry run's answer for {} is not that object",
            op.address()
        ));
    }
    Ok(v)
}

/// What is sent at the apply, from the plan: the object the dry run
/// returned (without its managed fields and status) — exactly what was
/// shown — carrying the live resourceVersion for an update (for a create,
/// without what the server assigns); for a delete, the DeleteOptions with
/// their preconditions.
pub fn to_send(op: &ChangeOp, desired: &Value, planned: &Value, live: Option<&Value>) -> Value {
    match (op.verb.as_str(), live) {
        ("delete", _) => desired.clone(),
        // A create sends what the dry run answered too (defaults filled
        // in), so that what the policy and the approver saw is what is
        // created; without what the server assigns itself.
        (_, None) => {
            let mut o = without_server_state(planned.clone());
            if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                for k in ["uid", "resourceVersion", "creationTimestamp", "generation"] {
                    m.remove(k);
                }
            }
            o
        }
        (_, Some(l)) => {
            let mut o = without_server_state(planned.clone());
            o["metadata"]["resourceVersion"] = l["metadata"]["resourceVersion"].clone();
            o
        }
    }
}

/// The plan as the policy sees it (`input.kubernetes`) and the approver
/// reads it: the live object, the planned one, and the attribute changes
/// between them (values of Secrets and ConfigMaps' data masked for the
/// approver's view only when they are Secrets).
pub fn plan_input(op: &ChangeOp, live: Option<&Value>, planned: Option<&Value>) -> Value {
    let strip = |o: Option<&Value>| o.map(|o| without_server_state(o.clone()));
    let (before, after) = (strip(live), strip(planned));
    let secret = op.kind == "Secret";
    let masked = if secret { json!(true) } else { Value::Null };
    let changes = gateway_audit::approvals::review::attribute_changes(
        before.as_ref().unwrap_or(&Value::Null),
        after.as_ref().unwrap_or(&Value::Null),
        &masked,
        &masked,
        &Value::Null,
    );
    json!({"verb": op.verb, "live": before, "planned": after, "changes": changes})
}

/// The approver's view of the plan: one change, in the shape the approval
/// page and `gateway approvals show` render.
pub fn plan_summary(op: &ChangeOp, plan: &Value) -> Value {
    let actions = match (op.verb.as_str(), plan["live"].is_null()) {
        ("delete", _) => json!(["delete"]),
        (_, true) => json!(["create"]),
        _ => json!(["update"]),
    };
    json!([{"address": op.address(), "actions": actions, "reason": Value::Null,
            "paths": [], "diff": plan["changes"]}])
}

/// The result of an applied change: the object the API server answered
/// with, as the agent gets it (no managed fields), capped.
pub fn applied(op: &ChangeOp, stdout: &[u8]) -> (String, Value) {
    let answer: Value = serde_json::from_slice(stdout).unwrap_or(Value::Null);
    let mut o = answer.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    let cap = op.result_bytes.min(1_048_576.0) as usize;
    let size = serde_json::to_vec(&o)
        .map(|b| b.len())
        .unwrap_or(usize::MAX);
    let (object, truncated) = if size > cap {
        (Value::Null, true)
    } else {
        (o, false)
    };
    let rv = answer["metadata"]["resourceVersion"].as_str().unwrap_or("");
    let summary = match op.verb.as_str() {
        "delete" => format!("{} deleted", op.address()),
        _ => format!(
            "{} {}: now at resourceVersion {rv}",
            op.address(),
            past(&op.verb)
        ),
    };
    let mut r = Map::new();
    r.insert("object".into(), object);
    r.insert("truncated".into(), truncated.into());
    (summary, Value::Object(r))
}

fn past(verb: &str) -> &'static str {
    match verb {
        "scale" => "scaled",
        "rollout_restart" => "restarted",
        "set_image" => "image set",
        "rollout_undo" => "rolled back",
        _ => "applied",
    }
}

/// Whether kubectl's failure was the precondition: the object changed
/// since the plan (409 Conflict on the write).
pub fn changed_since(stderr: &str) -> bool {
    stderr.contains("(Conflict)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(v: Value) -> Result<ChangeOp, String> {
        let mut base = json!({"verb": "scale", "namespace": "demo-app", "group": "apps", "version": "v1",
            "resource": "deployments", "kind": "Deployment", "name": "web", "replicas": 3,
            "container": "", "image": "", "to_revision": 0, "manifest": null, "result_bytes": 65536});
        for (k, x) in v.as_object().expect("object") {
            base[k] = x.clone();
        }
        ChangeOp::from_decision(Some(&base), "demo-app")
    }

    fn live() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "demo-app", "uid": "u-1", "resourceVersion": "41",
                "annotations": {"deployment.kubernetes.io/revision": "2"}, "managedFields": [{"manager": "x"}]},
            "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "web:2"}]}}},
            "status": {"replicas": 2}})
    }

    #[test]
    fn each_verb_changes_only_what_it_says_and_keeps_the_live_resource_version() {
        let l = live();
        let d = desired(&op(json!({})).expect("op"), Some(&l), None, "t").expect("scale");
        assert_eq!(d["spec"]["replicas"], 3);
        assert_eq!(d["metadata"]["resourceVersion"], "41");
        assert!(d["metadata"].get("managedFields").is_none() && d.get("status").is_none());
        let d = desired(
            &op(json!({"verb": "set_image", "container": "app", "image": "web:3"})).expect("op"),
            Some(&l),
            None,
            "t",
        )
        .expect("set image");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["image"],
            "web:3"
        );
        let e = desired(
            &op(json!({"verb": "set_image", "container": "db", "image": "x"})).expect("op"),
            Some(&l),
            None,
            "t",
        )
        .expect_err("no such container");
        assert!(e.contains("no container \"db\""), "{e}");
        let d = desired(
            &op(json!({"verb": "rollout_restart"})).expect("op"),
            Some(&l),
            None,
            "2026-12-07T00:00:00Z",
        )
        .expect("restart");
        assert_eq!(
            d["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT],
            "2026-12-07T00:00:00Z"
        );
        let del = desired(
            &op(json!({"verb": "delete"})).expect("op"),
            Some(&l),
            None,
            "t",
        )
        .expect("delete");
        assert_eq!(
            del["preconditions"],
            json!({"uid": "u-1", "resourceVersion": "41"})
        );
    }

    #[test]
    fn undo_takes_the_template_of_the_revision_the_deployment_owns() {
        let l = live();
        let rs = |name: &str, rev: &str, owner: &str, image: &str| {
            json!({"metadata": {"name": name,
            "annotations": {REVISION: rev, "kubernetes.io/change-cause": format!("deploy {image}"),
                "deployment.kubernetes.io/desired-replicas": "3"},
            "ownerReferences": [{"uid": owner, "controller": true}]},
            "spec": {"template": {"metadata": {"labels": {"app": "web", "pod-template-hash": "abc"}},
                "spec": {"containers": [{"name": "app", "image": image}]}}}})
        };
        let list = json!({"items": [rs("a", "1", "someone-else", "evil:1"), rs("b", "1", "u-1", "web:1"), rs("c", "2", "u-1", "web:2")]});
        let o = op(json!({"verb": "rollout_undo", "to_revision": 1})).expect("op");
        let d = desired(&o, Some(&l), Some(&list), "t").expect("undo");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["image"],
            "web:1"
        );
        assert_eq!(
            d["spec"]["template"]["metadata"]["labels"],
            json!({"app": "web"})
        );
        // The revision's change-cause comes back; the controller's
        // bookkeeping and the current revision number stay the live ones.
        let a = &d["metadata"]["annotations"];
        assert_eq!(a["kubernetes.io/change-cause"], "deploy web:1", "{a}");
        assert_eq!(a[REVISION], l["metadata"]["annotations"][REVISION], "{a}");
        assert!(
            a.get("deployment.kubernetes.io/desired-replicas")
                == l["metadata"]["annotations"].get("deployment.kubernetes.io/desired-replicas"),
            "{a}"
        );
        let at = op(json!({"verb": "rollout_undo", "to_revision": 2})).expect("op");
        assert!(
            desired(&at, Some(&l), Some(&list), "t")
                .expect_err("current")
                .contains("already")
        );
        let gone = op(json!({"verb": "rollout_undo", "to_revision": 9})).expect("op");
        assert!(
            desired(&gone, Some(&l), Some(&list), "t")
                .expect_err("none")
                .contains("no revision 9")
        );
    }

    #[test]
    fn requests_are_raw_with_the_dry_run_and_strict_fields() {
        let o = op(json!({})).expect("op");
        let argv = |s: Vec<Step>| s[0].argv[4..].to_vec();
        assert_eq!(
            argv(o.read_steps("/k")),
            [
                "get",
                "--raw",
                "/apis/apps/v1/namespaces/demo-app/deployments/web"
            ]
        );
        // An undo reads its object as any change does (one step, stdout:
        // the sandbox has no writable workdir), and its revisions apart.
        let undo = op(json!({"verb": "rollout_undo", "to_revision": 1})).expect("op");
        assert_eq!(undo.read_steps("/k").len(), 1);
        assert!(undo.read_steps("/k")[0].stdout_file.is_none());
        // Its revisions: the ReplicaSets the Deployment selects.
        let live = json!({"spec": {"selector": {"matchLabels": {"app": "web", "example.com/tier": "front"}}}});
        assert_eq!(
            argv(undo.revisions_steps("/k", &live).expect("steps")),
            [
                "get",
                "--raw",
                "/apis/apps/v1/namespaces/demo-app/replicasets?labelSelector=app%3Dweb%2Cexample.com%2Ftier%3Dfront"
            ]
        );
        // A selector from a hostile cluster that is no label, or none.
        for bad in [
            json!({"spec": {"selector": {"matchLabels": {"app": "web&watch=true"}}}}),
            json!({"spec": {"selector": {"matchLabels": {"a b": "x"}}}}),
            json!({"spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}}),
        ] {
            assert!(undo.revisions_steps("/k", &bad).is_err(), "{bad}");
        }
        assert_eq!(
            argv(o.write_steps("/k", false, true)),
            [
                "replace",
                "--raw",
                "/apis/apps/v1/namespaces/demo-app/deployments/web?dryRun=All&fieldValidation=Strict",
                "-f",
                &format!("{FILES_IN_DIR}/{OBJECT_FILE}")
            ]
        );
        assert_eq!(
            argv(o.write_steps("/k", false, false))[2],
            "/apis/apps/v1/namespaces/demo-app/deployments/web?fieldValidation=Strict"
        );
        let cm = op(json!({"verb": "apply", "group": "", "resource": "configmaps", "kind": "ConfigMap", "name": "c",
            "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}})).expect("apply");
        assert_eq!(
            argv(cm.write_steps("/k", true, true))[..3],
            [
                "create",
                "--raw",
                "/api/v1/namespaces/demo-app/configmaps?dryRun=All&fieldValidation=Strict"
            ]
        );
        let del = op(json!({"verb": "delete"})).expect("op");
        assert_eq!(
            argv(del.write_steps("/k", false, false))[..3],
            [
                "delete",
                "--raw",
                "/apis/apps/v1/namespaces/demo-app/deployments/web"
            ]
        );
    }

    #[test]
    fn an_operation_out_of_shape_is_refused_whatever_the_policy_said() {
        for (bad, why) in [
            (json!({"name": "-f"}), "not an object name"),
            (json!({"namespace": "kube-system"}), "scoped to"),
            (json!({"resource": "deployments/scale"}), "not a resource"),
            (json!({"verb": "exec"}), "no verb"),
            (json!({"replicas": -1}), "whole number"),
            (
                json!({"verb": "set_image", "container": "app", "image": "--x"}),
                "image reference",
            ),
            (
                json!({"verb": "rollout_undo", "to_revision": 0}),
                "revision",
            ),
            (
                json!({"verb": "apply", "manifest": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "other"}}}),
                "not the object",
            ),
            (
                json!({"verb": "apply", "manifest": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "prod"}}}),
                "not the object",
            ),
        ] {
            let e = op(bad.clone()).expect_err(&bad.to_string());
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_live_answer_that_is_not_the_object_is_refused_and_not_found_creates() {
        let o = op(json!({})).expect("op");
        let mut other = live();
        other["metadata"]["name"] = json!("db");
        assert!(live_object(&o, true, other.to_string().as_bytes(), "").is_err());
        assert!(
            live_object(&o, true, live().to_string().as_bytes(), "")
                .expect("live")
                .is_some()
        );
        assert!(live_object(&o, false, b"", "Error from server (NotFound): x").is_err());
        let apply = op(json!({"verb": "apply", "manifest": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}}))
            .expect("apply");
        assert_eq!(
            live_object(&apply, false, b"", "Error from server (NotFound): x"),
            Ok(None)
        );
    }
}
