//! The fake API server (tests/support/fake_kube.rs) held to a real one:
//! for each behaviour a real Kubernetes 1.36 API server was recorded doing
//! (tests/fixtures/kubernetes-api-1.36/), the fake answers the same request
//! with the same status, the same `Status` shape and the same message. A
//! fake that forgives what a real server refuses hides bugs that only a
//! cluster finds (it answered TokenReviews from anyone, ignored log
//! options, and replayed compacted watches); each row here is one of those
//! differences, fixed.

#[path = "support/fake_kube.rs"]
mod fake_kube;

use std::time::Duration;

use serde_json::{Value, json};

const NS: &str = "api-probe";

fn fixture(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kubernetes-api-1.36")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("JSON")
}

/// The keys of an object, sorted.
fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    k.sort();
    k
}

/// A real `Status` and the fake's agree: status code, reason, which keys
/// and which `details` keys, `details.group` and `details.kind`, and the
/// message once the real names are swapped for the fake's.
fn same_status(real: &Value, fake: &Value, names: &[(&str, &str)]) {
    assert_eq!(keys(real), keys(fake), "real {real:#}\nfake {fake:#}");
    for k in ["kind", "apiVersion", "status", "reason", "code"] {
        assert_eq!(real[k], fake[k], "{k}: real {real:#}\nfake {fake:#}");
    }
    assert_eq!(
        keys(&real["details"]),
        keys(&fake["details"]),
        "details: real {real:#}\nfake {fake:#}"
    );
    for k in ["group", "kind"] {
        assert_eq!(real["details"][k], fake["details"][k], "details.{k}");
    }
    let mut message = real["message"].as_str().unwrap_or_default().to_string();
    for (from, to) in names {
        message = message.replace(from, to);
    }
    assert_eq!(
        fake["message"].as_str().unwrap_or_default(),
        message,
        "message"
    );
}

struct Api {
    kube: fake_kube::FakeKube,
    http: reqwest::Client,
}

impl Api {
    async fn start() -> Api {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kube = fake_kube::FakeKube::start().await;
        let http = reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(kube.ca_pem.as_bytes()).expect("ca"),
            )
            .build()
            .expect("client");
        Api { kube, http }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, String) {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.kube.url()))
            .bearer_auth(token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    }

    async fn json(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let (status, text) = self.send(method, path, token, body).await;
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| json!({"text": text})),
        )
    }

    fn admin(&self) -> String {
        self.kube.admin_jwt.clone()
    }

    /// A ServiceAccount that may only get and list pods in [`NS`] (the
    /// recorded `probe-sa`).
    fn pod_reader(&self) -> String {
        self.kube.with(|s| {
            s.put(
                "roles",
                NS,
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": {"name": "probe"},
                    "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}),
            );
            s.put(
                "rolebindings",
                NS,
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": "probe"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "probe"},
                    "subjects": [{"kind": "ServiceAccount", "name": "probe-sa", "namespace": NS}]}),
            );
            s.service_account_token(NS, "probe-sa")
        })
    }

    /// A running one-container pod `name` (container `t`) with a log.
    fn running_pod(&self, name: &str) {
        self.kube.with(|s| {
            s.put(
                "pods",
                NS,
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"containers": [{"name": "t", "image": "ticker:0.1"}]},
                    "status": {"phase": "Running", "containerStatuses": [{"name": "t", "restartCount": 0,
                        "state": {"running": {"startedAt": "2026-12-06T14:38:00Z"}}, "lastState": {}}]}}),
            );
        });
    }
}

fn job(name: &str) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "ticker:0.1"}]}}}})
}

/// Rows 1, 3–6, 20, 22: Job and Pod errors name the group resource and the
/// object (`jobs.batch "x"`, `details.group`), a Job's deletion is answered
/// with a `Status`, its pod is named `<job>-<5 chars>` and its `startTime`
/// has whole seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_of_group_resources_and_a_jobs_deletion_are_what_the_real_server_sends() {
    use reqwest::Method;
    let api = Api::start().await;
    let admin = api.admin();
    let jobs = format!("/apis/batch/v1/namespaces/{NS}/jobs");
    let (status, created) = api.json(Method::POST, &jobs, &admin, Some(job("dl"))).await;
    assert_eq!(status, 201, "{created}");
    let (status, again) = api.json(Method::POST, &jobs, &admin, Some(job("dl"))).await;
    assert_eq!(status, 409);
    same_status(&fixture("job-create-again.body"), &again, &[]);
    let (status, missing) = api
        .json(Method::GET, &format!("{jobs}/nope"), &admin, None)
        .await;
    assert_eq!(status, 404);
    same_status(&fixture("job-404.body"), &missing, &[]);
    let (status, missing) = api
        .json(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/pods/nope"),
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 404);
    same_status(&fixture("pod-404.body"), &missing, &[]);

    // The job controller's pod: `<job>-` and five of utilrand's characters.
    let pods = api.kube.with(|s| s.pods_of("dl"));
    assert_eq!(pods.len(), 1);
    let suffix = pods[0].strip_prefix("dl-").expect("prefix");
    assert_eq!(suffix.len(), 5, "{}", pods[0]);
    assert!(
        suffix
            .chars()
            .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)),
        "{}",
        pods[0]
    );
    let (_, got) = api
        .json(Method::GET, &format!("{jobs}/dl"), &admin, None)
        .await;
    let start = got["status"]["startTime"].as_str().expect("startTime");
    assert!(
        regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
            .expect("re")
            .is_match(start),
        "whole seconds, as the job controller writes it: {start}"
    );

    let (status, deleted) = api
        .json(
            Method::DELETE,
            &format!("{jobs}/dl"),
            &admin,
            Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})),
        )
        .await;
    assert_eq!(status, 200);
    let real = fixture("job-delete.body");
    assert_eq!(keys(&real), keys(&deleted), "{deleted:#}");
    assert_eq!(deleted["status"], "Success");
    assert_eq!(keys(&real["details"]), keys(&deleted["details"]));
    assert_eq!(deleted["details"]["uid"], created["metadata"]["uid"]);
    let (status, gone) = api
        .json(
            Method::DELETE,
            &format!("{jobs}/dl"),
            &admin,
            Some(json!({"propagationPolicy": "Background"})),
        )
        .await;
    assert_eq!(status, 404);
    same_status(&fixture("job-404.body"), &gone, &[("nope", "dl")]);
}

/// Rows 2, 7, 8: a running pod's deletion is graceful (Terminating, then
/// gone); RBAC refusals name the object and the subresource; a bad token
/// is a 401 with no `details`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_a_pods_graceful_deletion_are_what_the_real_server_sends() {
    use reqwest::Method;
    let api = Api::start().await;
    let admin = api.admin();
    let reader = api.pod_reader();
    let sa = format!("system:serviceaccount:{NS}:probe-sa");
    api.running_pod("web-1");

    let (status, body) = api
        .json(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/secrets/some-secret"),
            &reader,
            None,
        )
        .await;
    assert_eq!(status, 403);
    same_status(&fixture("sa-get-secret.body"), &body, &[]);
    let (status, body) = api
        .json(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/secrets"),
            &reader,
            None,
        )
        .await;
    assert_eq!(status, 403);
    same_status(&fixture("sa-list-secrets.body"), &body, &[]);
    let (status, body) = api
        .json(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/pods/web-1/attach?stdin=true&container=t"),
            &reader,
            None,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    same_status(
        &fixture("sa-attach.body"),
        &body,
        &[("web-558cc8c854-jcvv7", "web-1"), (&sa, &sa)],
    );
    for token in ["not-a-token", ""] {
        let (status, body) = api
            .json(
                Method::GET,
                &format!("/api/v1/namespaces/{NS}/pods"),
                token,
                None,
            )
            .await;
        assert_eq!(status, 401);
        assert_eq!(body, fixture("unauth.body"), "exactly the real body");
    }

    // A running pod: Terminating first (the answer is the pod with its
    // deletionTimestamp), gone once the kubelet confirms.
    let pod = format!("/api/v1/namespaces/{NS}/pods/web-1");
    let (status, deleting) = api.json(Method::DELETE, &pod, &admin, None).await;
    assert_eq!(status, 200);
    assert_eq!(deleting["kind"], "Pod", "{deleting:#}");
    let real = fixture("pod-delete.body");
    assert_eq!(real["metadata"]["deletionGracePeriodSeconds"], 30);
    assert_eq!(deleting["metadata"]["deletionGracePeriodSeconds"], 30);
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    let (status, still) = api.json(Method::GET, &pod, &admin, None).await;
    assert_eq!(status, 200, "still there, Terminating");
    assert!(still["metadata"]["deletionTimestamp"].is_string());
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (status, _) = api.json(Method::GET, &pod, &admin, None).await;
    assert_eq!(status, 404);
}

/// Rows 9–13: `tailLines`, `sinceSeconds`, both, `timestamps`; invalid
/// values are 422 with their causes; `previous` without a restart, a
/// waiting container and a two-container pod without `container` are 400
/// with the real messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_options_are_applied_and_refused_as_the_real_server_does() {
    use reqwest::Method;
    let api = Api::start().await;
    let admin = api.admin();
    api.running_pod("web-1");
    api.kube.with(|s| {
        for i in 1..=6 {
            // Line i written 6-i seconds ago (line 6 now).
            s.log_line("web-1", &format!("line {i}"), (6 - i) as f64 + 0.5);
        }
    });
    let log = |q: &str| format!("/api/v1/namespaces/{NS}/pods/web-1/log{q}");
    let (status, text) = api
        .send(Method::GET, &log("?tailLines=3"), &admin, None)
        .await;
    assert_eq!((status, text.as_str()), (200, "line 4\nline 5\nline 6\n"));
    let (_, text) = api
        .send(Method::GET, &log("?tailLines=0"), &admin, None)
        .await;
    assert_eq!(text, "");
    let (_, text) = api
        .send(Method::GET, &log("?sinceSeconds=2"), &admin, None)
        .await;
    assert_eq!(text, "line 5\nline 6\n");
    let (_, text) = api
        .send(
            Method::GET,
            &log("?sinceSeconds=2&tailLines=1"),
            &admin,
            None,
        )
        .await;
    assert_eq!(text, "line 6\n");
    let (_, text) = api
        .send(
            Method::GET,
            &log("?tailLines=2&timestamps=true"),
            &admin,
            None,
        )
        .await;
    let stamped =
        regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z line \d\n$").expect("re");
    let real = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kubernetes-api-1.36/log-ts.body"),
    )
    .expect("log-ts");
    let shape = regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ").expect("re");
    for line in real.split_inclusive('\n') {
        assert!(shape.is_match(line), "the real prefix: {line:?}");
    }
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines.iter().all(|l| stamped.is_match(l)), "{text}");

    let pod = "web-5c4bfdcb47-94p6k";
    let (status, body) = api
        .json(Method::GET, &log("?tailLines=-1"), &admin, None)
        .await;
    assert_eq!(status, 422);
    same_status(&fixture("log-tailneg.body"), &body, &[(pod, "web-1")]);
    assert_eq!(body["details"]["causes"][0]["field"], "tailLines");
    let (status, body) = api
        .json(Method::GET, &log("?sinceSeconds=0"), &admin, None)
        .await;
    assert_eq!(status, 422);
    same_status(&fixture("log-since0.body"), &body, &[(pod, "web-1")]);
    assert_eq!(body["details"]["causes"][0]["field"], "sinceSeconds");
    let (status, body) = api
        .json(Method::GET, &log("?previous=true"), &admin, None)
        .await;
    assert_eq!(status, 400);
    same_status(&fixture("log-prev.body"), &body, &[(pod, "web-1")]);
    let (status, body) = api
        .json(Method::GET, &log("?container=nope"), &admin, None)
        .await;
    assert_eq!(status, 400);
    same_status(&fixture("log-badcontainer.body"), &body, &[(pod, "web-1")]);
    let (status, body) = api
        .json(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/pods/nopod/log"),
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 404);
    same_status(&fixture("log-nopod.body"), &body, &[]);

    // A pod of two containers, the first waiting on its image.
    api.kube.with(|s| {
        s.put(
            "pods",
            NS,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waiting"},
                "spec": {"containers": [{"name": "a", "image": "does-not-exist:1"}, {"name": "b", "image": "ticker:0.1"}]},
                "status": {"phase": "Pending", "containerStatuses": [
                    {"name": "a", "restartCount": 0, "state": {"waiting": {"reason": "ErrImageNeverPull",
                        "message": "Container image \"does-not-exist:1\" is not present with pull policy of Never"}}},
                    {"name": "b", "restartCount": 0, "state": {"running": {"startedAt": "2026-12-06T14:39:16Z"}}}]}}),
        );
    });
    let waiting = |q: &str| format!("/api/v1/namespaces/{NS}/pods/waiting/log{q}");
    let (status, body) = api
        .json(Method::GET, &waiting("?container=a"), &admin, None)
        .await;
    assert_eq!(status, 400);
    same_status(&fixture("log-waiting.body"), &body, &[]);
    let (status, body) = api.json(Method::GET, &waiting(""), &admin, None).await;
    assert_eq!(status, 400);
    same_status(&fixture("log-nocontainer.body"), &body, &[]);
}

/// Rows 14, 15: a watch from a compacted version is one `ERROR` event (410
/// Expired) and its end; a watch that asks for its initial events and
/// bookmarks gets them, then a `BOOKMARK` that marks their end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_from_compacted_versions_end_with_410_and_initial_events_end_with_a_bookmark() {
    use reqwest::Method;
    let api = Api::start().await;
    let admin = api.admin();
    api.running_pod("web-1");
    let (status, text) = tokio::time::timeout(
        Duration::from_secs(10),
        api.send(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/pods?watch=true&resourceVersion=1"),
            &admin,
            None,
        ),
    )
    .await
    .expect("the stream ends");
    assert_eq!(status, 200);
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("event"))
        .collect();
    assert_eq!(events.len(), 1, "{text}");
    let real = fixture("watch-rv1.jsonl");
    assert_eq!(events[0]["type"], real["type"]);
    let (r, f) = (&real["object"], &events[0]["object"]);
    assert_eq!(keys(r), keys(f), "{f:#}");
    for k in ["kind", "status", "reason", "code"] {
        assert_eq!(r[k], f[k], "{k}");
    }
    assert!(
        f["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("too old resource version: 1 (")),
        "{f:#}"
    );

    let url = format!(
        "{}/api/v1/namespaces/{NS}/pods?watch=true&resourceVersion=0&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1",
        api.kube.url()
    );
    let text = api
        .http
        .get(url)
        .bearer_auth(&admin)
        .send()
        .await
        .expect("watch")
        .text()
        .await
        .expect("body");
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("event"))
        .collect();
    assert_eq!(events.len(), 2, "{text}");
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "web-1");
    assert_eq!(events[1]["type"], "BOOKMARK");
    assert_eq!(
        events[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(events[1]["object"]["kind"], "Pod");
}

/// Rows 16–19: a dry-run PATCH or PUT answers the object as it would be
/// (generation + 1, the stored `resourceVersion`) and stores nothing; PUT
/// replaces; a write carrying a stale `resourceVersion` is 409; JSON
/// patches and strategic merge patches are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_a_deployment_are_dry_run_replaced_patched_and_refused_when_stale() {
    use reqwest::Method;
    let api = Api::start().await;
    let admin = api.admin();
    let deployments = format!("/apis/apps/v1/namespaces/{NS}/deployments");
    let web = format!("{deployments}/web");
    let (status, created) = api
        .json(
            Method::POST,
            &deployments,
            &admin,
            Some(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "generation": 1},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "t", "image": "ticker:0.1",
                            "env": [{"name": "V", "value": "1"}]}]}}}})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let rv0 = created["metadata"]["resourceVersion"].clone();

    // The real server's dry run: generation + 1, resourceVersion as stored.
    let (before, dry) = (fixture("dep-get0.body"), fixture("dry-patch.body"));
    assert_eq!(dry["spec"]["replicas"], 3);
    assert_eq!(
        dry["metadata"]["generation"].as_i64(),
        before["metadata"]["generation"].as_i64().map(|g| g + 1)
    );
    assert_eq!(
        dry["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    let merge = |v: Value| v;
    let patch = |ct: &'static str, body: Value, q: &'static str| {
        let url = format!("{}{web}{q}", api.kube.url());
        let admin = admin.clone();
        let http = api.http.clone();
        async move {
            let r = http
                .patch(url)
                .bearer_auth(admin)
                .header("content-type", ct)
                .body(body.to_string())
                .send()
                .await
                .expect("patch");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, dry) = patch(
        "application/merge-patch+json",
        merge(json!({"spec": {"replicas": 3}})),
        "?dryRun=All",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(dry["spec"]["replicas"], 3);
    assert_eq!(dry["metadata"]["generation"], 2);
    assert_eq!(dry["metadata"]["resourceVersion"], rv0);
    let (_, now) = api.json(Method::GET, &web, &admin, None).await;
    assert_eq!(now["spec"]["replicas"], 1, "a dry run stores nothing");
    assert_eq!(now["metadata"]["resourceVersion"], rv0);
    let mut four = now.clone();
    four["spec"]["replicas"] = json!(4);
    let (status, dry) = api
        .json(
            Method::PUT,
            &format!("{web}?dryRun=All"),
            &admin,
            Some(four),
        )
        .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(
        (
            dry["spec"]["replicas"].clone(),
            dry["metadata"]["resourceVersion"].clone()
        ),
        (json!(4), rv0.clone())
    );
    assert_eq!(fixture("dry-put.body")["spec"]["replicas"], 4);

    // A real change moves the version on; writes made against the old one
    // are refused as the real server refuses them.
    let (status, changed) = patch(
        "application/merge-patch+json",
        json!({"spec": {"replicas": 2}}),
        "",
    )
    .await;
    assert_eq!(status, 200);
    assert_ne!(changed["metadata"]["resourceVersion"], rv0);
    let (status, stale) = api.json(Method::PUT, &web, &admin, Some(now.clone())).await;
    assert_eq!(status, 409);
    same_status(&fixture("stale-put.body"), &stale, &[]);
    let (status, stale) = patch(
        "application/merge-patch+json",
        json!({"metadata": {"resourceVersion": rv0}, "spec": {"replicas": 1}}),
        "",
    )
    .await;
    assert_eq!(status, 409);
    same_status(&fixture("stale-patch.body"), &stale, &[]);
    let (_, now) = api.json(Method::GET, &web, &admin, None).await;
    assert_eq!(
        now["spec"]["replicas"], 2,
        "the stale writes changed nothing"
    );

    // What kubectl sends: a JSON patch (rollout undo), a strategic merge
    // patch (set image): the container is merged on its name, its env kept.
    let (status, undone) = patch(
        "application/json-patch+json",
        json!([{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "ticker:0.2"}]),
        "",
    )
    .await;
    assert_eq!(status, 200, "{undone}");
    assert_eq!(
        undone["spec"]["template"]["spec"]["containers"][0]["image"],
        "ticker:0.2"
    );
    let (status, set) = patch(
        "application/strategic-merge-patch+json",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "t", "image": "ticker:0.3"}]}}}}),
        "",
    )
    .await;
    assert_eq!(status, 200, "{set}");
    let c = &set["spec"]["template"]["spec"]["containers"];
    assert_eq!(c.as_array().map(Vec::len), Some(1));
    assert_eq!(c[0]["image"], "ticker:0.3");
    assert_eq!(c[0]["env"], json!([{"name": "V", "value": "1"}]));
    let (status, refused) = patch("application/x-unknown", json!({}), "").await;
    assert_eq!(status, 415, "{refused}");
}

/// Row 21: the scheduler's and the kubelet's events have the two shapes a
/// real server shows (the new API's under the old one, and the old API's);
/// `events.k8s.io/v1` selects one object by `regarding.*` and shows them in
/// its own shape; each API refuses the other's field label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_have_both_shapes_and_each_api_its_own_field_labels() {
    use reqwest::Method;
    let api = Api::start().await;
    let admin = api.admin();
    api.running_pod("web-1");
    api.kube.with(|s| {
        s.put(
            "events",
            NS,
            fake_kube::scheduler_event(NS, "web-1", "u1", "Scheduled", "Successfully assigned"),
        );
        s.put(
            "events",
            NS,
            fake_kube::kubelet_event(NS, "web-1", "u1", "Pulled", "Container image present", 1),
        );
        s.put(
            "events",
            NS,
            fake_kube::kubelet_event(NS, "other", "u2", "Pulled", "another pod", 1),
        );
    });
    let core = fixture("ev-core.body");
    let (status, got) = api
        .json(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name%3Dweb-1"),
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 200, "{got}");
    // Listed in name order (generated names): the scheduler's first here.
    let by_reason = |got: &Value| {
        let mut items = got["items"].as_array().cloned().unwrap_or_default();
        items.sort_by_key(|e| e["reason"] != "Scheduled");
        items
    };
    let items = by_reason(&got);
    assert_eq!(items.len(), 2, "{got:#}");
    let without = |v: &Value| {
        let mut k = keys(v);
        k.retain(|k| k != "apiVersion" && k != "kind");
        k
    };
    assert_eq!(
        without(&items[0]),
        without(&core["items"][0]),
        "the scheduler's"
    );
    assert!(items[0]["eventTime"].is_string() && items[0]["firstTimestamp"].is_null());
    assert_eq!(
        without(&items[1]),
        without(&core["items"][1]),
        "the kubelet's"
    );
    assert_eq!(items[1]["source"]["component"], "kubelet");
    assert!(items[1]["eventTime"].is_null() && items[1]["count"] == 1);

    let new = fixture("ev-new.body");
    let (status, got) = api
        .json(
            Method::GET,
            &format!(
                "/apis/events.k8s.io/v1/namespaces/{NS}/events?fieldSelector=regarding.name%3Dweb-1"
            ),
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        (got["kind"].clone(), got["apiVersion"].clone()),
        (new["kind"].clone(), new["apiVersion"].clone())
    );
    let items = by_reason(&got);
    assert_eq!(items.len(), 2, "{got:#}");
    assert_eq!(without(&items[0]), without(&new["items"][0]));
    assert_eq!(without(&items[1]), without(&new["items"][1]));
    assert_eq!(items[0]["reportingController"], "default-scheduler");
    assert_eq!(items[1]["reportingController"], "kubelet");

    let (status, bad) = api
        .json(
            Method::GET,
            &format!(
                "/apis/events.k8s.io/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name%3Dweb-1"
            ),
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 400);
    same_status(&fixture("ev-new-bad.body"), &bad, &[]);
    let (status, _) = api
        .json(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/events?fieldSelector=regarding.name%3Dweb-1"),
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 400, "core/v1 has no regarding.*");
}

/// Found by a second look at the recordings: the job controller enforces
/// `activeDeadlineSeconds` from a whole-second `startTime` (FailureTarget,
/// the pod deleted gracefully, then Failed); `dryRun` takes only `All`
/// and a dry-run deletion deletes nothing; a TokenRequest under ten
/// minutes is refused; the initial-events bookmark carries the current
/// version even when nothing matched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_dry_runs_short_tokens_and_empty_bookmarks_are_what_the_real_server_does() {
    use reqwest::Method;
    let api = Api::start().await;
    let admin = api.admin();
    let jobs = format!("/apis/batch/v1/namespaces/{NS}/jobs");
    let mut dl = job("dl");
    dl["spec"]["activeDeadlineSeconds"] = json!(2);
    let (status, _) = api.json(Method::POST, &jobs, &admin, Some(dl)).await;
    assert_eq!(status, 201);
    let pod = api.kube.with(|s| s.pods_of("dl"))[0].clone();
    api.kube.with(|s| {
        s.update("pods", NS, &pod, |p| {
            p["spec"]["nodeName"] = json!("node");
            p["status"]["phase"] = json!("Running");
        })
    });
    let created = std::time::Instant::now();
    let condition = |j: &Value, t: &str| {
        j["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == t && c["status"] == "True" && c["reason"] == "DeadlineExceeded")
    };
    let mut saw_target = None;
    let mut saw_failed = None;
    while created.elapsed() < Duration::from_secs(10) && saw_failed.is_none() {
        let (_, j) = api
            .json(Method::GET, &format!("{jobs}/dl"), &admin, None)
            .await;
        if saw_target.is_none() && condition(&j, "FailureTarget") {
            saw_target = Some(created.elapsed());
            assert!(!condition(&j, "Failed"), "FailureTarget first: {j:#}");
        }
        if condition(&j, "Failed") {
            saw_failed = Some(created.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let target = saw_target.expect("FailureTarget at the deadline");
    assert!(
        target >= Duration::from_millis(900) && target < Duration::from_secs(5),
        "N-1 to N s after the start (whole seconds): {target:?}"
    );
    assert!(saw_failed.is_some_and(|f| f >= target), "then Failed");
    let (status, _) = api
        .json(
            Method::GET,
            &format!("/api/v1/namespaces/{NS}/pods/{pod}"),
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 404, "its pod is gone");

    // dryRun: `All` or 422; a dry-run deletion deletes nothing.
    let (status, body) = api
        .json(
            Method::POST,
            &format!("{jobs}?dryRun=Yes"),
            &admin,
            Some(job("x")),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let (status, _) = api
        .json(Method::POST, &jobs, &admin, Some(job("keep")))
        .await;
    assert_eq!(status, 201);
    let (status, _) = api
        .json(
            Method::DELETE,
            &format!("{jobs}/keep?dryRun=All"),
            &admin,
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = api
        .json(Method::GET, &format!("{jobs}/keep"), &admin, None)
        .await;
    assert_eq!(status, 200, "still there");

    // A TokenRequest under ten minutes.
    api.kube.with(|s| {
        s.service_account_token(NS, "short");
    });
    let (status, body) = api
        .json(
            Method::POST,
            &format!("/api/v1/namespaces/{NS}/serviceaccounts/short/token"),
            &admin,
            Some(
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": 300}}),
            ),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("may not specify a duration less than 10 minutes")),
        "{body}"
    );

    // The bookmark when nothing matches: the current version, not "0".
    let url = format!(
        "{}/api/v1/namespaces/empty/pods?watch=true&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1",
        api.kube.url()
    );
    let text = api
        .http
        .get(url)
        .bearer_auth(&admin)
        .send()
        .await
        .expect("watch")
        .text()
        .await
        .expect("body");
    let bookmark: Value =
        serde_json::from_str(text.lines().next().expect("one event")).expect("json");
    assert_eq!(bookmark["type"], "BOOKMARK");
    let rv: u64 = bookmark["object"]["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("a version");
    assert!(rv >= 1000, "{bookmark}");
}

/// As the real API server validates a Job's pod template: a container's or
/// init container's volume mount must name one of the pod's volumes, or
/// the Job is refused whole (422 Invalid, the field's path in the message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_mounting_a_volume_it_does_not_have_is_refused_as_invalid() {
    use reqwest::Method;
    let api = Api::start().await;
    let job = |init_mount: &str| {
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "mounts"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "volumes": [{"name": "runner", "emptyDir": {}}],
                "initContainers": [{"name": "install", "image": "i",
                    "volumeMounts": [{"name": init_mount, "mountPath": "/x"}]}],
                "containers": [{"name": "runner", "image": "r",
                    "volumeMounts": [{"name": "runner", "mountPath": "/opt/gateway", "readOnly": true}]}]}}}})
    };
    let path = format!("/apis/batch/v1/namespaces/{NS}/jobs");
    let (status, body) = api
        .json(Method::POST, &path, &api.admin(), Some(job("nope")))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(
        body["message"],
        "Job.batch \"mounts\" is invalid: spec.template.spec.initContainers[0].volumeMounts[0].name: Not found: \"nope\""
    );
    assert!(api.kube.with(|s| s.live("jobs").is_empty()));
    let (status, body) = api
        .json(Method::POST, &path, &api.admin(), Some(job("runner")))
        .await;
    assert_eq!(status, 201, "{body}");
}
