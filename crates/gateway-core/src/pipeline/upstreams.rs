//! What the gateway last read of each upstream MCP server's tools, and the
//! watch that reads them: at the daemon's start, then every
//! `check_seconds` of the upstream's (300 unless set), each upstream is
//! started as a call would start it and its tools compared with the lock.
//! The readings go to the policy as `input.upstreams` (tools/list hides a
//! tool that is not as locked, a call of it is refused before any sandbox
//! starts), a difference is audited (`upstream.tool_changed`) and counted
//! once per digest seen, and sessions are told their tool list changed.
//! A server that changes its tools without saying so is caught at the next
//! reading; one that says so (`notifications/tools/list_changed` during a
//! call) gets a reading at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Pipeline;
use crate::tools::upstream::{self, Server};
use gateway_audit::audit::Event;

/// How often an upstream is read when it does not say.
pub const DEFAULT_CHECK_SECONDS: u64 = 300;

/// The readings: `{name: {"tools": {tool: sha256}}}`, the digests of the
/// tools the server lists now (every locked one, at most 256 in all; a
/// locked tool it no longer lists is absent). A reading that fails leaves
/// the last good one.
pub struct UpstreamReadings {
    tx: tokio::sync::watch::Sender<Value>,
    /// Asked for a reading now (a server said its list changed).
    now: tokio::sync::Notify,
}

impl Default for UpstreamReadings {
    fn default() -> Self {
        UpstreamReadings {
            tx: tokio::sync::watch::Sender::new(json!({})),
            now: tokio::sync::Notify::new(),
        }
    }
}

impl UpstreamReadings {
    /// The readings as the policy sees them (`input.upstreams`).
    pub fn snapshot(&self) -> Value {
        self.tx.borrow().clone()
    }

    /// Changes of the readings (what sessions shown a tool list watch).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Value> {
        self.tx.subscribe()
    }

    /// Read every upstream again soon.
    pub fn read_now(&self) {
        self.now.notify_one();
    }

    fn set(&self, name: &str, reading: Value) {
        self.tx.send_if_modified(|all| {
            let changed = all.get(name) != Some(&reading);
            if changed && let Some(m) = all.as_object_mut() {
                m.insert(name.to_string(), reading);
            }
            changed
        });
    }

    fn keep_only(&self, names: &[String]) {
        self.tx.send_if_modified(|all| {
            let Some(m) = all.as_object_mut() else {
                return false;
            };
            let before = m.len();
            m.retain(|k, _| names.contains(k));
            before != m.len()
        });
    }
}

impl Pipeline {
    /// Read every declared upstream once, now.
    pub async fn read_upstreams(&self) {
        let mut reported = std::collections::BTreeSet::new();
        for (name, (server, _)) in self.declared_upstreams() {
            self.read_upstream(&name, &server, &mut reported).await;
        }
    }

    /// Read the declared upstreams now and then, for as long as the
    /// pipeline lives (the daemon runs this on its runtime).
    pub async fn watch_upstreams(self: Arc<Self>) {
        // name -> when it was last read.
        let mut last: BTreeMap<String, std::time::Instant> = BTreeMap::new();
        // (upstream, tool, live digest) already reported.
        let mut reported = std::collections::BTreeSet::new();
        let mut swaps = self.policy.swaps();
        loop {
            let declared = self.declared_upstreams();
            let names: Vec<String> = declared.keys().cloned().collect();
            self.upstream_readings.keep_only(&names);
            self.warm_upstreams.keep_only(
                &declared
                    .iter()
                    .filter(|(_, (server, _))| server.warm)
                    .map(|(name, _)| name.clone())
                    .collect(),
            );
            last.retain(|k, _| names.contains(k));
            let mut next = Duration::from_secs(DEFAULT_CHECK_SECONDS);
            for (name, (server, every)) in &declared {
                let due = last.get(name).is_none_or(|at| at.elapsed() >= *every);
                if due {
                    last.insert(name.clone(), std::time::Instant::now());
                    self.read_upstream(name, server, &mut reported).await;
                }
                let left = last
                    .get(name)
                    .map(|at| every.saturating_sub(at.elapsed()))
                    .unwrap_or_default();
                next = next.min(left.max(Duration::from_secs(1)));
            }
            tokio::select! {
                _ = tokio::time::sleep(next) => {}
                // Another policy: a server no longer declared warm loses
                // its warm sandbox now.
                r = swaps.changed() => if r.is_err() { return },
                // A server said its list changed: read again what was not
                // read in the last 10 s (a server that says so at every
                // call does not get a sandbox per call).
                _ = self.upstream_readings.now.notified() => {
                    last.retain(|_, at| at.elapsed() < Duration::from_secs(10));
                }
            }
        }
    }

    /// The declared upstreams with how often each is read.
    fn declared_upstreams(&self) -> BTreeMap<String, (Server, Duration)> {
        let Ok(set) = self.policy.current() else {
            return BTreeMap::new();
        };
        let declared = set
            .data("data.config.upstreams")
            .ok()
            .flatten()
            .unwrap_or_default();
        let mut out = BTreeMap::new();
        for (name, decl) in declared.as_object().into_iter().flatten() {
            if let Ok(server) = serde_json::from_value::<Server>(decl.clone()) {
                let every = decl["check_seconds"]
                    .as_u64()
                    .unwrap_or(DEFAULT_CHECK_SECONDS)
                    .max(10);
                out.insert(name.clone(), (server, Duration::from_secs(every)));
            }
        }
        out
    }

    /// One reading of upstream `name`: its tools' digests, compared with
    /// the lock.
    async fn read_upstream(
        &self,
        name: &str,
        server: &Server,
        reported: &mut std::collections::BTreeSet<(String, String, String)>,
    ) {
        if let Err(e) = server.runs_on(name, self.sandbox.uses_host_tools(), self.sandbox.backend())
        {
            // Said once per declaration, not at every reading.
            if reported.insert((name.to_string(), String::new(), e.clone())) {
                tracing::warn!(upstream = name, "not read (its calls are refused): {e}");
            }
            return;
        }
        let report = upstream::list(
            self.sandbox.as_ref(),
            &self.tools,
            (&self.home, &self.policy.dirs()),
            name,
            server,
        )
        .await;
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                // The last good reading stands (a server cannot show a
                // hidden tool again by failing a reading).
                tracing::warn!(
                    upstream = name,
                    "could not read the upstream's tools: {}",
                    gateway_base::text::escaped(&e.chars().take(500).collect::<String>(), true)
                );
                return;
            }
        };
        let lock = self
            .policy
            .current()
            .ok()
            .and_then(|set| set.data("data.config.upstream_lock").ok().flatten())
            .unwrap_or_default();
        let locked = lock[name]["tools"].as_object().cloned().unwrap_or_default();
        // The digests go to the policy (what it compares with the lock).
        let mut tools = serde_json::Map::new();
        let mut new_reported = 0;
        if reported.len() > 4096 {
            reported.clear();
        }
        for def in report.tools.iter().flatten() {
            let Some(t) = def["name"].as_str() else {
                continue;
            };
            let digest = upstream::definition_digest(def);
            let was = locked.get(t).and_then(|l| l["sha256"].as_str());
            // The locked tools, and up to 256 in all: a tool accepted
            // after this reading is offered at once, not at the next one.
            if was.is_some() || tools.len() < 256 {
                tools.insert(t.to_string(), Value::String(digest.clone()));
            }
            if was.is_none() {
                // At most 16 new tools a reading are audited by name.
                if new_reported >= 16 {
                    continue;
                }
                new_reported += 1;
            }
            if was != Some(digest.as_str())
                && reported.insert((name.to_string(), t.to_string(), digest.clone()))
            {
                let _ = self.audit.record(
                    "",
                    Event::UpstreamToolChanged {
                        upstream: name.to_string(),
                        tool: t.chars().take(128).collect(),
                        locked_sha256: was.unwrap_or("").to_string(),
                        live_sha256: Some(digest.clone()),
                        list_changed: false,
                    },
                );
                gateway_telemetry::metrics().upstream_tool_changed(name);
            }
        }
        // A locked tool the server no longer lists: audited once.
        for (t, l) in &locked {
            if !tools.contains_key(t)
                && reported.insert((name.to_string(), t.clone(), String::new()))
            {
                let _ = self.audit.record(
                    "",
                    Event::UpstreamToolChanged {
                        upstream: name.to_string(),
                        tool: t.clone(),
                        locked_sha256: l["sha256"].as_str().unwrap_or("").to_string(),
                        live_sha256: None,
                        list_changed: false,
                    },
                );
                gateway_telemetry::metrics().upstream_tool_changed(name);
            }
        }
        self.upstream_readings.set(name, json!({ "tools": tools }));
    }
}
