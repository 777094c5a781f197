//! `mcp_upstream`: a tool of an upstream MCP server the operator declared
//! (config/upstreams) and locked (config/upstream_lock), decided by the
//! policy like any tool (upstreams.rego makes it a catalog entry).
//!
//! The arguments (the params without `approval_id`) are checked against
//! the locked input schema first; a call the policy lets run without a
//! person runs now, one that needs a person's approval gets a pending
//! approval bound to the upstream, the tool, its definition's digest and
//! the exact arguments ([`upstream::call_digest`]), spent once by the
//! same call with `approval_id`. The server runs in a throwaway sandbox
//! per call (its declared paths or its declared image, no network but
//! its declared endpoints), where the step runner
//! speaks MCP to it and calls the tool only if its live definition is
//! still the locked one; what comes back is hostile input, capped.

use serde_json::{Value, json};

use super::{RunnerFuture, ToolRunner};
use crate::pipeline::{Call, Outcome, Pipeline, SandboxCall, Stop, Toolset, Violation};
use crate::tools::upstream::{self, UpstreamOp};
use gateway_audit::audit::Event;
use gateway_policy::Decision;

pub struct Upstream;

impl ToolRunner for Upstream {
    fn name(&self) -> &'static str {
        "mcp_upstream"
    }

    fn result_schema(&self) -> Value {
        json!({"type": "object", "required": ["upstream", "tool", "definition_sha256"],
        "properties": {
            "upstream": {"type": "string"},
            "tool": {"type": "string", "description": "the tool's name on the upstream"},
            "definition_sha256": {"type": "string", "description": "the digest of the locked definition the call was made against"},
            "isError": {"type": "boolean", "description": "the upstream said its call failed"},
            "content": {"type": "array", "description": "the upstream's content blocks, as it sent them"},
            "structuredContent": {"description": "the upstream's structured result (checked against its locked output schema)"},
            "result_bytes": {"type": "integer"},
            "result_sha256": {"type": "string"},
            "refused": {"type": "string", "description": "why the tool was not called (gone, or not as locked)"},
            "live_definition_sha256": {"type": "string"},
            "error": {"type": "object", "description": "what ended the call: too_large, timeout, closed, rpc_error, protocol, output_schema"},
            "requests_refused": {"type": "integer", "description": "requests of the server's (sampling, elicitation, roots) refused"},
            "notifications": {"type": "integer"}
        }})
    }

    fn run<'a>(&'a self, p: &'a Pipeline, call: &'a mut Call, first: Decision) -> RunnerFuture<'a> {
        Box::pin(async move {
            let mut op = UpstreamOp::from_decision(first.operation.as_ref())
                .map_err(|e| Stop::refused(format!("{e}; nothing was run")))?;
            op.credential = first.credential.as_ref().map(|c| json!(c));
            // Before anyone is asked to approve a call that cannot run.
            op.server
                .runs_on(
                    &op.upstream,
                    p.sandbox.uses_host_tools(),
                    p.sandbox.backend(),
                )
                .map_err(|e| Stop::refused(format!("{e}; nothing was run")))?;
            let outcome = self.call_upstream(p, call, &first, op).await;
            // The audit keeps what the call came to, never the server's
            // content (a file read through it may be a secret).
            if let Ok(Outcome::Completed { result, .. }) = &outcome {
                call.audit_result = Some(upstream::audited(result));
            }
            outcome
        })
    }
}

impl Upstream {
    async fn call_upstream(
        &self,
        p: &Pipeline,
        call: &mut Call,
        first: &Decision,
        op: UpstreamOp,
    ) -> Result<Outcome, Stop> {
        {
            let mut arguments = call.input.params.clone();
            let approval_id = arguments
                .as_object_mut()
                .and_then(|m| m.remove("approval_id"))
                .and_then(|v| v.as_str().map(str::to_string));
            let schema = op
                .definition
                .get("inputSchema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            let errors = upstream::argument_errors(&schema, &arguments);
            if !errors.is_empty() {
                let violations: Vec<Violation> = errors
                    .iter()
                    .map(|(at, msg)| Violation {
                        param: at.trim_start_matches('/').to_string(),
                        problem: "schema".into(),
                        message: format!("{}: {msg}", if at.is_empty() { "arguments" } else { at }),
                    })
                    .collect();
                // Durable with the call's result, which the refusal
                // comes to before the client hears of it.
                p.audit.record_deferred(
                    call.request_id(),
                    Event::UpstreamArgumentsRefused {
                        upstream: op.upstream.clone(),
                        tool: op.tool.clone(),
                        definition_sha256: op.definition_sha256.clone(),
                        errors: violations.iter().map(|v| v.message.clone()).collect(),
                    },
                )?;
                return Err(Stop::Denied {
                    reasons: vec![format!(
                        "the arguments do not match {}.{}'s locked input schema",
                        op.upstream, op.tool
                    )],
                    violations,
                });
            }
            let binds = upstream::binds(&op.upstream, &op.server, &p.home, &p.policy.dirs())
                .map_err(|e| Stop::refused(format!("{e}; nothing was run")))?;
            let digest = upstream::call_digest(&op, &arguments);
            if let Some(id) = &approval_id
                && let Some(outcome) = p.spent_outcome(call, first, id).await?
            {
                return Ok(outcome);
            }
            let needs_person = first.approval.required && !first.approval.satisfied;
            match approval_id {
                None if needs_person => {
                    let shown = json!([{
                        "address": format!("{}.{}", op.upstream, op.tool),
                        "actions": ["call"],
                        "reason": null,
                        "paths": null,
                        "upstream": op.upstream,
                        "tool": op.tool,
                        "definition_sha256": op.definition_sha256,
                        "arguments": arguments,
                        "credential": op.credential,
                    }]);
                    // The agent is told what the approval is for in
                    // the shape every tool's pending approval has.
                    let changes = json!([{
                        "address": format!("{}.{}", op.upstream, op.tool),
                        "actions": ["call"],
                        "reason": null,
                        "paths": null,
                    }]);
                    p.request_approval(call, first, &digest, shown, changes)
                }
                None => {
                    let rid = call.request_id().to_string();
                    call.commitment.commit(None, || ((), true))?;
                    let _applying = p.applying(&rid, None);
                    p.upstream_call(call, first, &op, binds, &arguments).await
                }
                Some(id) => {
                    let approval = p.requesters_approval(call, &id)?;
                    // Kept with the approval without the server's content.
                    let keep = |o: &Outcome| match o {
                        Outcome::Completed {
                            ok,
                            summary: _,
                            result,
                        } => json!({"status": "completed", "ok": ok,
                            "summary": "the upstream's answer (kept as its digest only)",
                            "result": upstream::audited(result)}),
                        other => serde_json::to_value(other).unwrap_or(Value::Null),
                    };
                    p.spend_and_run(call, &approval, &digest, keep, async |call, decision| {
                        p.upstream_call(call, decision, &op, binds, &arguments)
                            .await
                    })
                    .await
                }
            }
        }
    }
}

impl Pipeline {
    /// The call itself: the server in its sandbox, the report read.
    async fn upstream_call(
        &self,
        call: &Call,
        decision: &Decision,
        op: &UpstreamOp,
        mut binds: Vec<gateway_sandbox::Bind>,
        arguments: &Value,
    ) -> Result<Outcome, Stop> {
        binds.sort_by(|a, b| a.inside.cmp(&b.inside));
        let (report, warm) = if op.server.remote() {
            (
                self.remote_upstream_call(call, decision, op, arguments)
                    .await?,
                None,
            )
        } else if !op.server.warm {
            // No longer declared warm: a warm sandbox left from before goes.
            self.warm_upstreams.retire(&op.upstream);
            (
                self.sandboxed_upstream_call(call, decision, op, binds, arguments)
                    .await?,
                None,
            )
        } else if self.sandbox.runs_sessions() {
            match self
                .warm_upstream_call(call, decision, op, &binds, arguments)
                .await?
            {
                Some((report, name)) => (report, Some(name)),
                None => (
                    self.sandboxed_upstream_call(call, decision, op, binds, arguments)
                        .await?,
                    None,
                ),
            }
        } else {
            (
                self.sandboxed_upstream_call(call, decision, op, binds, arguments)
                    .await?,
                None,
            )
        };
        self.upstream_reported(call, op, arguments, report, warm)
    }

    /// A remote server's call: made by the gateway over streamable HTTP
    /// (no sandbox: the server runs elsewhere), with its declared token.
    async fn remote_upstream_call(
        &self,
        call: &Call,
        decision: &Decision,
        op: &UpstreamOp,
        arguments: &Value,
    ) -> Result<gateway_runner::protocol::McpReport, Stop> {
        if decision.credential.is_some() || !decision.sandbox.egress.is_empty() {
            return Err(Stop::refused(format!(
                "upstream {} is remote: the decision's credential or egress is for a server the gateway runs; nothing was called",
                op.upstream
            )));
        }
        call.progress
            .say(format!("calling {}.{} at its URL", op.upstream, op.tool));
        let step = op.call_step(arguments);
        let ex = step
            .mcp
            .as_ref()
            .ok_or_else(|| Stop::refused("no MCP exchange for the call"))?;
        use crate::tools::upstream_remote::{self as remote, Presented};
        let rid = call.request_id();
        let server = &op.server;
        let mut presented = match Presented::obtain(server).await {
            Ok(p) => p,
            Err(e) => {
                if let Some(oauth) = &server.oauth {
                    self.audit.record(
                        rid,
                        Event::CredentialRefused {
                            mount: oauth.token_url.clone(),
                            role: oauth.client_id.clone(),
                            error: e.clone(),
                        },
                    )?;
                }
                return Err(Stop::refused(format!(
                    "upstream {}: {e}; nothing was called",
                    op.upstream
                )));
            }
        };
        if let (Presented::Granted(g), Some(oauth)) = (&presented, &server.oauth) {
            // Not recorded: nothing is called, and the token is revoked
            // (the drop below) before the error goes on.
            let recorded = self.audit.record(
                rid,
                Event::CredentialIssued {
                    lease_id: g.id.clone(),
                    mount: oauth.token_url.clone(),
                    role: oauth.client_id.clone(),
                    params: Some(json!({"grant": "client_credentials", "scope": oauth.scope})),
                    ttl_seconds: g.expires_in,
                    credential: Some(json!({"kind": "oauth_access_token"})),
                    after_cancellation: None,
                },
            );
            if let Err(e) = recorded {
                let _ = presented.revoke().await;
                return Err(e.into());
            }
        }
        // The server's progress, passed on to the agent as it comes.
        let progress = call.progress.clone();
        let tell: remote::OnProgress = std::sync::Arc::new(move |line: String| progress.say(line));
        let report = remote::exchange(server, ex, presented.token(), Some(tell)).await;
        let report = remote::redacted(report, presented.token());
        let granted = match &presented {
            Presented::Granted(g) => Some(g.id.clone()),
            _ => None,
        };
        if let Some(id) = granted {
            let revoked = presented.revoke().await;
            self.audit.record(
                rid,
                match revoked {
                    Ok(true) => Event::CredentialRevoked {
                        lease_id: id.clone(),
                        attempt: None,
                        recovered: None,
                        reason: None,
                        issued_at: None,
                        owner_pid: None,
                        owner_replica: None,
                    },
                    Ok(false) => Event::CredentialRevokeFailed {
                        lease_id: id.clone(),
                        error: "the authorization server has no revocation_url: the token lives until it expires".into(),
                        attempt: None,
                        of: None,
                        recovered: None,
                        expires_at: None,
                    },
                    Err(e) => Event::CredentialRevokeFailed {
                        lease_id: id.clone(),
                        error: e,
                        attempt: None,
                        of: None,
                        recovered: None,
                        expires_at: None,
                    },
                },
            )?;
        }
        report.map_err(|e| Stop::refused(format!("upstream {}: {e}", op.upstream)))
    }

    /// A stdio server's call: the server in its sandbox, the report read.
    async fn sandboxed_upstream_call(
        &self,
        call: &Call,
        decision: &Decision,
        op: &UpstreamOp,
        binds: Vec<gateway_sandbox::Bind>,
        arguments: &Value,
    ) -> Result<gateway_runner::protocol::McpReport, Stop> {
        call.progress.say(format!(
            "calling {}.{} in its sandbox",
            op.upstream, op.tool
        ));
        let r = self
            .run_sandbox(
                &call.progress,
                call.request_id(),
                decision,
                SandboxCall {
                    suffix: "",
                    tool: Toolset::Upstream {
                        binds,
                        env: op.server.env(),
                        image: op.server.image.clone(),
                    },
                    steps: vec![op.call_step(arguments)],
                    workdir: None,
                    files_in: vec![],
                    files_out: vec![],
                    // The credential and endpoints upstreams.rego derived
                    // from its declaration (none unless it names them).
                    with_credential: true,
                },
            )
            .await?;
        if r.stdout.truncated {
            return Err(Stop::refused(format!(
                "upstream {}'s report is more than the sandbox's output cap (sandbox.rego output_bytes); raise it above the upstream's max_result_bytes",
                op.upstream
            )));
        }
        match upstream::read_report(&r.stdout.bytes) {
            Ok(report) => Ok(report),
            Err(e) => {
                // The server's stderr is its own text (it may hold what it
                // read): in the daemon's log, not in the result or audit.
                tracing::warn!(
                    request_id = call.request_id(),
                    upstream = %op.upstream,
                    "no report from the upstream's sandbox: {}",
                    gateway_base::text::escaped(&crate::pipeline::tail(&r.stderr.text(), 5), true)
                );
                Err(Stop::refused(format!(
                    "{e} ({:?}); the server's own output is in the gateway's log",
                    r.ended
                )))
            }
        }
    }

    /// A warm server's call ([`crate::pipeline::warm`]): made in its
    /// long-lived sandbox, started first when there is none fit for this
    /// call's decision. `None` when that sandbox is busy with another call
    /// (this one then gets a sandbox of its own). Returns the report and
    /// the warm sandbox's name.
    async fn warm_upstream_call(
        &self,
        call: &Call,
        decision: &Decision,
        op: &UpstreamOp,
        binds: &[gateway_sandbox::Bind],
        arguments: &Value,
    ) -> Result<Option<(gateway_runner::protocol::McpReport, String)>, Stop> {
        use crate::pipeline::warm::{self, Warm};
        if decision.credential.is_some() {
            return Err(Stop::refused(format!(
                "upstream {} is warm: it serves the calls of many and is handed no per-call credential, yet the decision names one; nothing was run",
                op.upstream
            )));
        }
        let slot = self.warm_upstreams.slot(&op.upstream);
        let Ok(mut held) = slot.try_lock() else {
            call.progress.say(format!(
                "{}'s warm sandbox is busy with another call: this one gets a sandbox of its own",
                op.upstream
            ));
            return Ok(None);
        };
        let step = op.server.serve_step();
        let prepared = self.prepare_sandbox(
            decision,
            Toolset::Upstream {
                binds: binds.to_vec(),
                env: op.server.env(),
                image: op.server.image.clone(),
            },
            std::slice::from_ref(&step),
            vec![],
        )?;
        let rid = call.request_id();
        let line_cap = prepared.limits.0.output_bytes;
        // The call's time: the server's own, within the policy's deadline.
        let mut request = op.serve_request(arguments);
        request.timeout_ms = request
            .timeout_ms
            .min(u64::try_from(prepared.limits.1.as_millis()).unwrap_or(u64::MAX));
        let call_time = std::time::Duration::from_millis(request.timeout_ms);
        // CPU time for the sandbox's whole life (the policy's is for one
        // call; its CPU quota still holds each call to its cores).
        let mut limits = prepared.limits.0;
        limits.cpu_seconds = warm::LIFETIME
            .as_secs()
            .saturating_mul(limits.cpu_millicores.div_ceil(1000).max(1));
        let req = gateway_sandbox::SandboxRequest {
            name: format!("{rid}-warm"),
            argv: gateway_runner::protocol::serve_argv(),
            env: prepared.env,
            binds: prepared.binds,
            workdir: None,
            files_in: prepared.files_in,
            credential: None,
            limits,
            deadline: warm::LIFETIME,
            network: prepared.network,
            files_out: vec![],
            on_stderr_line: None,
            image: prepared.image,
        };
        let key = warm::key(&req);
        // Out of the slot for the call: a call dropped half-way (its
        // client gone) drops the sandbox with it, and no later call reads
        // what was meant for this one. Put back only after a clean call.
        let generation = self.warm_upstreams.generation();
        let mut w = match held.take() {
            Some(w) if w.usable(&key, call_time) => w,
            _ => {
                self.audit.record(
                    rid,
                    Event::SandboxStarted {
                        sandbox: req.name.clone(),
                        backend: self.sandbox.backend().into(),
                        limits: json!(req.limits),
                        deadline_seconds: warm::LIFETIME.as_secs(),
                        egress: decision.sandbox.egress.clone(),
                        credential: false,
                        steps: json!([step]),
                    },
                )?;
                call.progress.say(format!(
                    "starting {}'s warm sandbox {}",
                    op.upstream, req.name
                ));
                let name = req.name.clone();
                let mut session = match self.sandbox.start_session(req).await {
                    Ok(s) => s,
                    Err(e) => {
                        self.audit.record(
                            rid,
                            Event::SandboxFailed {
                                sandbox: name,
                                error: e.to_string(),
                                stages: Value::Null,
                            },
                        )?;
                        return Err(Stop::refused(format!(
                            "upstream {}'s warm sandbox did not start: {e}; nothing was called",
                            op.upstream
                        )));
                    }
                };
                // Its end, whenever and however it comes, in the audit of
                // the call that started it.
                if let Some(ended) = session.ended.take() {
                    let audit = std::sync::Arc::clone(&self.audit);
                    let rid = rid.to_string();
                    tokio::spawn(async move {
                        if let Ok(end) = ended.await {
                            let recorded = audit.record(
                                &rid,
                                Event::SandboxCompleted {
                                    sandbox: name,
                                    exit_code: end.exit_code,
                                    ended: json!(end.ended),
                                    duration_ms: end.duration_ms,
                                    stdout_truncated: false,
                                    stderr_truncated: false,
                                    stages: Value::Null,
                                },
                            );
                            if let Err(e) = recorded {
                                tracing::warn!(request_id = %rid, "the warm sandbox's end was not recorded: {e}");
                            }
                        }
                    });
                }
                Warm::new(key, session)
            }
        };
        call.progress.say(format!(
            "calling {}.{} in its warm sandbox {}",
            op.upstream, op.tool, w.session.name
        ));
        let progress = call.progress.clone();
        let tell = move |p: &Value| progress.say(upstream::progress_line(p, &[]));
        let name = w.session.name.clone();
        match w.call(&request, line_cap, &tell).await {
            Ok(report) => {
                // A server over its cap, late, gone, garbled or never
                // initialized is not trusted with another call (its runner
                // has stopped it); nor is one the gateway stopped meanwhile.
                let clean = report.server.is_some()
                    && report
                        .error_kind
                        .as_deref()
                        .is_none_or(|k| k == "rpc_error");
                if clean && generation == self.warm_upstreams.generation() {
                    *held = Some(w);
                }
                // No live credential in what it says (it is handed none,
                // but a path it shares with another upstream might be).
                let secrets = self.live_secrets.all();
                let report = if secrets.is_empty() {
                    report
                } else {
                    let mut bytes = gateway_sandbox::Captured {
                        bytes: serde_json::to_vec(&report).unwrap_or_default(),
                        truncated: false,
                    };
                    bytes.redact_all(&secrets);
                    upstream::read_report(&bytes.bytes)
                        .map_err(|e| Stop::refused(format!("upstream {}: {e}", op.upstream)))?
                };
                Ok(Some((report, name)))
            }
            Err(broken) => {
                drop(w);
                tracing::warn!(
                    request_id = rid,
                    upstream = %op.upstream,
                    sandbox = %name,
                    "the warm sandbox was stopped: {broken}"
                );
                Err(Stop::refused(format!(
                    "upstream {}: {broken}; it was stopped, and the next call starts a new one",
                    op.upstream
                )))
            }
        }
    }

    /// What the server's report comes to: the audit and the outcome.
    fn upstream_reported(
        &self,
        call: &Call,
        op: &UpstreamOp,
        arguments: &Value,
        report: gateway_runner::protocol::McpReport,
        warm: Option<String>,
    ) -> Result<Outcome, Stop> {
        if report.list_changed {
            // The server says its list changed: read it again now.
            self.upstream_readings.read_now();
        }
        if report.refused.is_some() || report.list_changed {
            self.audit.record(
                call.request_id(),
                Event::UpstreamToolChanged {
                    upstream: op.upstream.clone(),
                    tool: op.tool.clone(),
                    locked_sha256: op.definition_sha256.clone(),
                    live_sha256: report
                        .live_definition
                        .as_ref()
                        .map(upstream::definition_digest),
                    list_changed: report.list_changed,
                },
            )?;
            gateway_telemetry::metrics::metrics().upstream_tool_changed(&op.upstream);
        }
        let (ok, summary, result) = upstream::outcome(op, &report);
        // Durable with the call's result, which follows at once and is on
        // disk before the client hears anything (one fsync fewer a call);
        // a crash between the two loses both, as one during the call
        // loses its result: the decision to call is on disk already.
        self.audit.record_deferred(
            call.request_id(),
            Event::UpstreamCalled {
                upstream: op.upstream.clone(),
                tool: op.tool.clone(),
                definition_sha256: op.definition_sha256.clone(),
                arguments_sha256: gateway_base::canonical::sha256_hex(
                    gateway_base::canonical::canonical_json(arguments).as_bytes(),
                ),
                result_bytes: result["result_bytes"].as_u64(),
                result_sha256: result["result_sha256"].as_str().map(str::to_string),
                error: result["error"]["kind"]
                    .as_str()
                    .map(str::to_string)
                    .or_else(|| report.refused.as_ref().map(|_| "refused".to_string())),
                requests_refused: report.requests_refused,
                notifications: report.notifications,
                warm_sandbox: warm,
            },
        )?;
        Ok(Outcome::Completed {
            ok,
            summary,
            result,
        })
    }
}
