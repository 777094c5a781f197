//! Admission, the first stage of a call: may it start now? The policy
//! (`data.gateway.calls.verdict`, policies/calls.rego) decides from the
//! size of the call's arguments and from what this module counts: the calls
//! each OS user and everyone together have running, and the calls each
//! user started in the last minute. An admitted call is counted as running
//! until its [`Admitted`] guard drops (however the call ends, cancellation
//! included).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;

use crate::policy::PolicySet;
use crate::policy::input::DecisionInput;

/// The window of `per_minute_per_user`.
const WINDOW: Duration = Duration::from_secs(60);

/// The most calls counted per user in the window (memory stays bounded
/// however fast a caller tries).
const MAX_COUNTED: usize = 10_000;

#[derive(Debug, Default)]
struct Counts {
    running: BTreeMap<String, usize>,
    total: usize,
    started: BTreeMap<String, VecDeque<Instant>>,
}

/// The running and recent calls, by OS user id.
#[derive(Debug, Default)]
pub struct Admission {
    counts: Mutex<Counts>,
}

/// What the policy says of one call.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Verdict {
    admit: bool,
    reasons: Vec<String>,
    /// The cap on one audit line (the gateway applies it to the log).
    event_bytes: usize,
    /// How long saved plans are kept.
    plan_retention_seconds: u64,
}

/// What the policy sets for the gateway as a whole, as the last verdict said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub event_bytes: usize,
    pub plan_retention: Duration,
}

/// An admitted call: counted as running until dropped.
#[derive(Debug)]
pub struct Admitted<'a> {
    admission: &'a Admission,
    /// The principal's [`crate::policy::Principal::id`].
    who: String,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut c = self
            .admission
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.running.get_mut(&self.who) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.running.remove(&self.who);
            }
        }
        c.total = c.total.saturating_sub(1);
    }
}

/// Counts bytes written (the size of the arguments without a copy).
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A call counted before its verdict (see [`Admission::reserve`]): what the
/// policy is asked, and the guard that counts it as running.
#[derive(Debug)]
pub struct Reserved<'a> {
    /// The input of `data.gateway.calls.verdict`.
    pub query: serde_json::Value,
    admitted: Admitted<'a>,
}

/// The rule admission asks.
pub const VERDICT_RULE: &str = "data.gateway.calls.verdict";

impl Admission {
    /// Admit `input`'s call under `set`, or say why not. A policy that
    /// errors, or a verdict of the wrong shape, refuses the call. Also
    /// returns the settings the policy gives, when it answered. Every call
    /// asked about counts towards its user's rate, admitted or not (a
    /// refused call costs audit lines too).
    pub fn admit<'a>(
        &'a self,
        set: &PolicySet,
        input: &DecisionInput,
    ) -> (Option<Settings>, Result<Admitted<'a>, String>) {
        let reserved = self.reserve(input);
        let verdict = set
            .eval_rule(VERDICT_RULE, regorus::Value::from(reserved.query.clone()))
            .map_err(|e| e.to_string());
        Admission::settle(verdict, reserved)
    }

    /// Count `input`'s call before its verdict: as started in its user's
    /// minute and as running, and say what the policy is asked (the counts
    /// without this call). The policy is then asked without a lock held
    /// (see [`Admission::settle`]): a call counted here and refused is
    /// uncounted as running when settled, so two calls asked about at once
    /// can never both pass a limit (the second sees the first), at worst
    /// one is refused for a call that is refused too.
    pub fn reserve<'a>(&'a self, input: &DecisionInput) -> Reserved<'a> {
        let mut size = ByteCount(0);
        let _ = serde_json::to_writer(&mut size, &input.params);
        // Counted per identity: an OS user and an SSO identity never share
        // a count, whatever their names.
        let who = input.principal.id();
        let now = Instant::now();
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        // Forget users with nothing in the window, so the map stays small.
        c.started.retain(|_, q| {
            while q.front().is_some_and(|t| now.duration_since(*t) >= WINDOW) {
                q.pop_front();
            }
            !q.is_empty()
        });
        let recent = c.started.entry(who.clone()).or_default();
        let last_minute = recent.len();
        // Bounded: a caller past any sane rate stays past it.
        if recent.len() < MAX_COUNTED {
            recent.push_back(now);
        }
        let query = json!({
            "tool": input.tool,
            "client": input.principal.client,
            "kind": input.principal.kind,
            "user": input.principal.user,
            "os_user": input.principal.os_user,
            "uid": input.principal.uid,
            "issuer": input.principal.issuer,
            "groups": input.principal.groups,
            "params_bytes": size.0,
            "running": {"user": c.running.get(&who).copied().unwrap_or(0), "total": c.total},
            "last_minute": {"user": last_minute},
        });
        *c.running.entry(who.clone()).or_insert(0) += 1;
        c.total += 1;
        Reserved {
            query,
            admitted: Admitted {
                admission: self,
                who,
            },
        }
    }

    /// The verdict on a reserved call: admitted (still counted as running)
    /// or refused with the reasons (uncounted at once). A verdict that is
    /// an error or of the wrong shape refuses the call.
    pub fn settle<'a>(
        verdict: Result<serde_json::Value, String>,
        reserved: Reserved<'a>,
    ) -> (Option<Settings>, Result<Admitted<'a>, String>) {
        let verdict = verdict
            .map_err(|e| format!("the call could not be admitted: the policy failed ({e})"))
            .and_then(|v| {
                serde_json::from_value::<Verdict>(v).map_err(|e| {
                    format!(
                        "the call could not be admitted: data.gateway.calls.verdict is not {{admit, reasons, event_bytes, plan_retention_seconds}} ({e})"
                    )
                })
            });
        let verdict = match verdict {
            Ok(v) => v,
            Err(e) => return (None, Err(e)),
        };
        let cap = Some(Settings {
            event_bytes: verdict.event_bytes,
            plan_retention: Duration::from_secs(verdict.plan_retention_seconds),
        });
        if !verdict.admit {
            let why = if verdict.reasons.is_empty() {
                "the policy does not admit this call now (data.gateway.calls)".to_string()
            } else {
                verdict.reasons.join("; ")
            };
            return (cap, Err(why));
        }
        (cap, Ok(reserved.admitted))
    }

    /// Calls running now, in all.
    pub fn running(&self) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Principal;
    use crate::policy::set::LoadOptions;

    fn set() -> PolicySet {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        PolicySet::load(&[root], &LoadOptions::default()).expect("policies load")
    }

    fn input(uid: u32, params: serde_json::Value) -> DecisionInput {
        DecisionInput::new(
            "k8s_get_pod_status",
            params,
            Principal::os_user("test".into(), format!("user{uid}"), uid, vec![]),
        )
    }

    #[test]
    fn running_calls_are_counted_until_they_end() {
        let set = set();
        let a = Admission::default();
        let small = json!({"namespace": "demo-app"});
        let held: Vec<_> = (0..4)
            .map(|_| a.admit(&set, &input(1, small.clone())).1.expect("admitted"))
            .collect();
        let e = a
            .admit(&set, &input(1, small.clone()))
            .1
            .expect_err("fifth");
        assert!(e.contains("user1 already has 4 call(s) running"), "{e}");
        // Another user still gets in, up to the total.
        let other: Vec<_> = (0..4)
            .map(|_| a.admit(&set, &input(2, small.clone())).1.expect("admitted"))
            .collect();
        let e = a
            .admit(&set, &input(3, small.clone()))
            .1
            .expect_err("total");
        assert!(e.contains("already runs 8 calls"), "{e}");
        assert_eq!(a.running(), 8);
        drop(held);
        drop(other);
        assert_eq!(a.running(), 0);
        let (cap, ok) = a.admit(&set, &input(3, small));
        assert!(ok.is_ok());
        assert_eq!(cap.map(|c| c.event_bytes), Some(65536));
    }

    #[test]
    fn calls_asked_about_at_once_never_both_pass_a_limit() {
        // Four running for user1, then two more reserved before either is
        // settled: the second sees the first, so at most one gets in.
        let set = set();
        let a = Admission::default();
        let small = json!({"namespace": "demo-app"});
        let held: Vec<_> = (0..3)
            .map(|_| a.admit(&set, &input(1, small.clone())).1.expect("admitted"))
            .collect();
        let first = a.reserve(&input(1, small.clone()));
        let second = a.reserve(&input(1, small.clone()));
        let ask = |r: &Reserved<'_>| {
            set.eval_rule(VERDICT_RULE, regorus::Value::from(r.query.clone()))
                .map_err(|e| e.to_string())
        };
        let (v1, v2) = (ask(&first), ask(&second));
        let one = Admission::settle(v1, first).1.expect("the fourth gets in");
        let e = Admission::settle(v2, second)
            .1
            .expect_err("the fifth does not");
        assert!(e.contains("user1 already has 4 call(s) running"), "{e}");
        assert_eq!(a.running(), 4, "the refused call is no longer counted");
        drop(one);
        drop(held);
        assert_eq!(a.running(), 0);
    }

    #[test]
    fn large_arguments_and_fast_callers_are_refused() {
        let set = set();
        let a = Admission::default();
        let big = json!({"namespace": "x".repeat(300_000)});
        let e = a.admit(&set, &input(1, big)).1.expect_err("big");
        assert!(e.contains("300016 bytes, more than the 262144"), "{e}");
        for _ in 0..60 {
            drop(a.admit(&set, &input(5, json!({}))).1.expect("admitted"));
        }
        let e = a.admit(&set, &input(5, json!({}))).1.expect_err("61st");
        assert!(e.contains("made 60 calls in the last minute"), "{e}");
        // Refused calls do not count as running, but towards the rate.
        assert_eq!(a.running(), 0);
        let e = a.admit(&set, &input(5, json!({}))).1.expect_err("still");
        assert!(e.contains("made 61 calls in the last minute"), "{e}");
    }
}
