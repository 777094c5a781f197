//! The policy input (README.md: the policy contract), built the same way by the server and by
//! `gateway policy eval`.

use serde::{Deserialize, Serialize};

/// How a principal's identity was proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrincipalKind {
    /// An OS user, as the kernel named the daemon socket's peer (or the
    /// real user of a direct command's process).
    #[default]
    OsUser,
    /// A bearer token of a configured OpenID issuer, checked by the HTTP
    /// transport (signature, issuer, audience, lifetime).
    Sso,
}

/// Who is making the call: identity as data for the policy, whatever
/// proved it (README.md: the policy contract).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Principal {
    /// How the identity was proven: `os_user` or `sso`.
    #[serde(default)]
    pub kind: PrincipalKind,
    /// The MCP client's name, as the client said it: a claim, not an
    /// identity (any process can say any name).
    pub client: String,
    /// The name the policy knows this person by: the OS user's name, or
    /// an SSO identity's username claim (its e-mail by default).
    #[serde(default)]
    pub user: String,
    /// The OS user on the other end of the daemon's socket, named from the
    /// uid the kernel reported (`SO_PEERCRED`); for a direct command, the
    /// real user of the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_user: Option<String>,
    /// That OS user's uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The user's groups, by name: the OS user's (primary first), or the
    /// token's groups claim.
    pub groups: Vec<String>,
    /// SSO: the token's issuer (`iss`), as configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// SSO: the token's subject (`sub`), stable for one person at one issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// SSO: the token's e-mail claim, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// SSO: the OAuth client the token was issued to (`client_id`, else
    /// `azp`): which application holds it, as the issuer says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
}

impl Principal {
    /// The principal of `caller` speaking through a client that says its
    /// name is `client`.
    pub fn new(client: impl Into<String>, caller: &gateway_base::identity::Caller) -> Principal {
        Principal::os_user(
            client.into(),
            caller.user.clone(),
            caller.uid,
            caller.groups.clone(),
        )
    }

    /// An OS user's principal.
    pub fn os_user(client: String, os_user: String, uid: u32, groups: Vec<String>) -> Principal {
        Principal {
            kind: PrincipalKind::OsUser,
            client,
            user: os_user.clone(),
            os_user: Some(os_user),
            uid: Some(uid),
            groups,
            issuer: None,
            subject: None,
            email: None,
            client_id: None,
        }
    }

    /// Who this is, as one string no other identity can have: an OS user
    /// is its name (which cannot contain `:`), an SSO identity
    /// `sso:<issuer>#<subject>`. Approvals record their requester by it:
    /// only that identity may spend one, and its grants never count.
    pub fn id(&self) -> String {
        match self.kind {
            PrincipalKind::OsUser => self.os_user.clone().unwrap_or_else(|| self.user.clone()),
            PrincipalKind::Sso => format!(
                "sso:{}#{}",
                self.issuer.as_deref().unwrap_or(""),
                self.subject.as_deref().unwrap_or("")
            ),
        }
    }

    /// A principal read from a document (`gateway policy eval --principal`):
    /// an OS user's `user` is its `os_user` when not given.
    pub fn normalized(mut self) -> Principal {
        if self.user.is_empty()
            && let Some(u) = &self.os_user
        {
            self.user = u.clone();
        }
        self
    }
}

/// The input of one decision.
#[derive(Debug, Clone)]
pub struct DecisionInput {
    pub tool: String,
    pub params: serde_json::Value,
    pub request_id: String,
    /// RFC 3339, UTC, seconds precision.
    pub now: String,
    pub principal: Principal,
    /// `terraform show -json` of the plan, once one exists.
    pub plan: Option<PlanInput>,
    /// The approval presented with the call (`{id, status, approvers}`).
    pub approval: Option<serde_json::Value>,
    /// The configuration the saved plan file carries, `{path: text}`
    /// (`plan_config_files` in the input), once a plan exists.
    pub plan_config_files: Option<serde_json::Value>,
    /// A Kubernetes change's plan, once it exists (`kubernetes` in the
    /// input): `{verb, live, planned, changes}`, the live object and what
    /// the API server's dry run said it would become.
    pub kubernetes: Option<serde_json::Value>,
    /// For a tool with a pinned input schema (an upstream MCP server's):
    /// what is wrong with `params` (without approval_id) for that schema,
    /// as `[{param, message}]` (`schema_violations` in the input; empty:
    /// nothing). The policy reports them as violations.
    pub schema_violations: Option<serde_json::Value>,
    /// What the gateway last read of the called upstream's tools
    /// (`upstreams` in the input: `{name: {tools: {tool: sha256}}}`).
    pub upstreams: Option<serde_json::Value>,
}

impl DecisionInput {
    /// An input for `tool` with a fresh request id and the current time.
    pub fn new(tool: impl Into<String>, params: serde_json::Value, principal: Principal) -> Self {
        DecisionInput {
            tool: tool.into(),
            params,
            request_id: new_request_id(),
            now: now_rfc3339(),
            principal,
            plan: None,
            approval: None,
            plan_config_files: None,
            kubernetes: None,
            schema_violations: None,
            upstreams: None,
        }
    }

    /// The input as the JSON document the policy sees as `input`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut doc = self.to_json_without_plan();
        if let (Some(plan), Some(m)) = (&self.plan, doc.as_object_mut()) {
            m.insert("plan".into(), plan.json());
        }
        if let (Some(k), Some(m)) = (&self.kubernetes, doc.as_object_mut()) {
            m.insert("kubernetes".into(), k.clone());
        }
        doc
    }

    /// [`DecisionInput::to_json`] with `plan` as `{"sha256_of_json": …}`
    /// (what the audit log keeps: the plan itself is saved apart), without
    /// ever copying the plan.
    pub fn to_json_with_plan_digest(&self) -> serde_json::Value {
        let mut doc = self.to_json_without_plan();
        if let (Some(plan), Some(m)) = (&self.plan, doc.as_object_mut()) {
            m.insert(
                "plan".into(),
                serde_json::json!({"sha256_of_json": plan.sha256}),
            );
        }
        // A Kubernetes plan's objects are kept apart too (they are saved
        // with the plan): the audit keeps their digest.
        if let (Some(k), Some(m)) = (&self.kubernetes, doc.as_object_mut()) {
            use sha2::Digest as _;
            let bytes = serde_json::to_vec(k).unwrap_or_default();
            m.insert(
                "kubernetes".into(),
                serde_json::json!({"sha256_of_json": hex::encode(sha2::Sha256::digest(&bytes))}),
            );
        }
        doc
    }

    fn to_json_without_plan(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("tool".into(), self.tool.clone().into());
        m.insert("params".into(), self.params.clone());
        m.insert("request_id".into(), self.request_id.clone().into());
        m.insert("now".into(), self.now.clone().into());
        m.insert(
            "principal".into(),
            serde_json::to_value(&self.principal).unwrap_or(serde_json::Value::Null),
        );
        if let Some(approval) = &self.approval {
            m.insert("approval".into(), approval.clone());
        }
        if let Some(files) = &self.plan_config_files {
            m.insert("plan_config_files".into(), files.clone());
        }
        if let Some(v) = &self.schema_violations {
            m.insert("schema_violations".into(), v.clone());
        }
        if let Some(v) = &self.upstreams {
            m.insert("upstreams".into(), v.clone());
        }
        serde_json::Value::Object(m)
    }

    /// The input as a regorus value, converting the plan straight from the
    /// parsed JSON (never re-parsing text: that costs more than the policy).
    pub fn to_rego(&self) -> regorus::Value {
        let mut obj = std::collections::BTreeMap::new();
        let s = |v: &str| regorus::Value::from(v);
        obj.insert(s("tool"), s(&self.tool));
        obj.insert(s("params"), regorus::Value::from(self.params.clone()));
        obj.insert(s("request_id"), s(&self.request_id));
        obj.insert(s("now"), s(&self.now));
        let mut principal = std::collections::BTreeMap::new();
        let p = &self.principal;
        principal.insert(
            s("kind"),
            s(match p.kind {
                PrincipalKind::OsUser => "os_user",
                PrincipalKind::Sso => "sso",
            }),
        );
        principal.insert(s("client"), s(&p.client));
        principal.insert(s("user"), s(&p.user));
        if let Some(uid) = p.uid {
            principal.insert(s("uid"), regorus::Value::from(u64::from(uid)));
        }
        for (k, v) in [
            ("os_user", &p.os_user),
            ("issuer", &p.issuer),
            ("subject", &p.subject),
            ("email", &p.email),
            ("client_id", &p.client_id),
        ] {
            if let Some(v) = v {
                principal.insert(s(k), s(v));
            }
        }
        principal.insert(
            s("groups"),
            regorus::Value::from(
                self.principal
                    .groups
                    .iter()
                    .map(|g| regorus::Value::from(g.as_str()))
                    .collect::<Vec<_>>(),
            ),
        );
        obj.insert(s("principal"), regorus::Value::from(principal));
        if let Some(plan) = &self.plan {
            obj.insert(s("plan"), plan.rego.clone());
        }
        if let Some(approval) = &self.approval {
            obj.insert(s("approval"), regorus::Value::from(approval.clone()));
        }
        if let Some(v) = &self.schema_violations {
            obj.insert(s("schema_violations"), regorus::Value::from(v.clone()));
        }
        if let Some(v) = &self.upstreams {
            obj.insert(s("upstreams"), regorus::Value::from(v.clone()));
        }
        if let Some(files) = &self.plan_config_files {
            obj.insert(s("plan_config_files"), regorus::Value::from(files.clone()));
        }
        if let Some(k) = &self.kubernetes {
            obj.insert(s("kubernetes"), regorus::Value::from(k.clone()));
        }
        regorus::Value::from(obj)
    }
}

/// A plan as the policy sees it: parsed once, shared (not copied) when the
/// input is cloned or evaluated again (an apply evaluates its plan more
/// than once, and parsing a large plan costs more than the policy does).
#[derive(Debug, Clone)]
pub struct PlanInput {
    rego: regorus::Value,
    /// SHA-256 of the plan's JSON: of the bytes read when it was read
    /// ([`PlanInput::from_bytes`]), else of its compact serialization.
    pub sha256: String,
}

impl PlanInput {
    /// A plan already parsed (a plan given inside an input document).
    pub fn new(json: serde_json::Value) -> PlanInput {
        let sha256 = gateway_base::canonical::sha256_hex(json.to_string().as_bytes());
        PlanInput {
            rego: regorus::Value::from(json),
            sha256,
        }
    }

    /// A plan from the bytes of its JSON, checked and parsed straight into
    /// the policy's value ([`super::plan::parse_plan_value`]: no second
    /// tree, no conversion), its digest taken of the bytes themselves.
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<PlanInput, super::plan::PlanError> {
        Ok(PlanInput {
            rego: super::plan::parse_plan_value(bytes, origin)?,
            sha256: gateway_base::canonical::sha256_hex(bytes),
        })
    }

    /// The plan as the policy sees it.
    pub fn value(&self) -> &regorus::Value {
        &self.rego
    }

    /// The plan as JSON (a conversion: for display, not the hot path).
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(&self.rego).unwrap_or(serde_json::Value::Null)
    }
}

/// A new request id: `req-` and 128 random bits in hex.
pub fn new_request_id() -> String {
    format!("req-{}", uuid::Uuid::new_v4().simple())
}

pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rego_and_json_forms_are_the_same_document() {
        let mut input = DecisionInput::new(
            "terraform_apply",
            json!({"working_dir": "terraform/offline-demo"}),
            Principal::os_user(
                "test".into(),
                "alice".into(),
                1000,
                vec!["alice".into(), "ops".into()],
            ),
        );
        input.plan = Some(PlanInput::new(
            json!({"format_version": "1.2", "resource_changes": [{"address": "a"}]}),
        ));
        input.approval = Some(json!({"id": "x", "status": "approved", "approvers": ["bob"]}));
        let from_rego: serde_json::Value =
            serde_json::from_str(&input.to_rego().to_json_str().expect("json")).expect("parse");
        assert_eq!(from_rego, input.to_json());
        assert!(input.request_id.starts_with("req-") && input.request_id.len() == 36);
        // A plan read from its bytes is the same document in both forms,
        // digested as read.
        let bytes =
            br#"{"format_version": "1.2", "planned_values": {}, "n": 1.5e3, "s": "\u00e9\n"}"#;
        let from_bytes = PlanInput::from_bytes(bytes, "p").expect("plan");
        input.plan = Some(from_bytes.clone());
        let from_rego: serde_json::Value =
            serde_json::from_str(&input.to_rego().to_json_str().expect("json")).expect("parse");
        assert_eq!(from_rego, input.to_json());
        assert_eq!(
            from_bytes.sha256,
            gateway_base::canonical::sha256_hex(bytes)
        );
        assert!(input.now.ends_with('Z'));
    }
}
