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

use gateway_policy::PolicySet;
use gateway_policy::input::DecisionInput;

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

impl Counts {
    /// `who`'s running calls, all running calls, and `who`'s calls in the
    /// last minute (the window moved on to `now`).
    fn now(&mut self, who: &str, now: Instant) -> (usize, usize, usize) {
        let last_minute = match self.started.get_mut(who) {
            Some(recent) => {
                while recent
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= WINDOW)
                {
                    recent.pop_front();
                }
                recent.len()
            }
            None => 0,
        };
        (
            self.running.get(who).copied().unwrap_or(0),
            self.total,
            last_minute,
        )
    }
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
    /// The principal's [`gateway_policy::Principal::id`].
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

/// A call about to be asked about (see [`Admission::reserve`]): what the
/// policy is asked, and the counts that went into it.
#[derive(Debug)]
pub struct Reserved {
    /// The input of `data.gateway.calls.verdict`.
    pub query: serde_json::Value,
    /// The size of the call's arguments (as `query.params_bytes`).
    pub params_bytes: usize,
    who: String,
    /// (the user's running calls, all running calls, the user's calls in
    /// the last minute) as the query gives them.
    seen: (usize, usize, usize),
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
        let ask = |q: serde_json::Value| {
            set.eval_rule(VERDICT_RULE, regorus::Value::from(q))
                .map_err(|e| e.to_string())
        };
        let verdict = ask(reserved.query.clone());
        self.settle(verdict, reserved, ask)
    }

    /// What the policy is asked about `input`'s call: the counts now,
    /// without this call. Nothing is counted yet: the policy is asked
    /// without a lock held, and [`Admission::settle`] counts the call if
    /// the counts it was asked with are still the counts then (else the
    /// policy is asked again, with the lock held).
    pub fn reserve(&self, input: &DecisionInput) -> Reserved {
        let mut size = ByteCount(0);
        let _ = serde_json::to_writer(&mut size, &input.params);
        // Counted per identity: an OS user and an SSO identity never share
        // a count, whatever their names.
        let who = input.principal.id();
        let seen = {
            let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            c.now(&who, Instant::now())
        };
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
            "running": {"user": seen.0, "total": seen.1},
            "last_minute": {"user": seen.2},
        });
        Reserved {
            query,
            params_bytes: size.0,
            who,
            seen,
        }
    }

    /// The verdict on a call asked about: admitted (counted as running
    /// from now until the [`Admitted`] guard drops) or refused with the
    /// reasons. When other calls started or ended since the policy was
    /// asked, `verdict` is of counts no longer true: the policy is asked
    /// again with the counts of now (`ask_again`), under the lock, so that
    /// two calls can never both pass a limit and a refused call is never
    /// counted as running by anyone. A verdict that is an error or of the
    /// wrong shape refuses the call.
    pub fn settle<'a>(
        &'a self,
        verdict: Result<serde_json::Value, String>,
        reserved: Reserved,
        ask_again: impl FnOnce(serde_json::Value) -> Result<serde_json::Value, String>,
    ) -> (Option<Settings>, Result<Admitted<'a>, String>) {
        let Reserved {
            mut query,
            who,
            seen,
            ..
        } = reserved;
        let now = Instant::now();
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let counts = c.now(&who, now);
        let verdict = if counts == seen {
            verdict
        } else {
            query["running"] = json!({"user": counts.0, "total": counts.1});
            query["last_minute"] = json!({"user": counts.2});
            ask_again(query)
        };
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
        // Forget users with nothing in the window, so the map stays small.
        c.started.retain(|_, q| !q.is_empty());
        // Bounded: a caller past any sane rate stays past it.
        let recent = c.started.entry(who.clone()).or_default();
        if recent.len() < MAX_COUNTED {
            recent.push_back(now);
        }
        if !verdict.admit {
            let why = if verdict.reasons.is_empty() {
                "the policy does not admit this call now (data.gateway.calls)".to_string()
            } else {
                verdict.reasons.join("; ")
            };
            return (cap, Err(why));
        }
        *c.running.entry(who.clone()).or_insert(0) += 1;
        c.total += 1;
        (
            cap,
            Ok(Admitted {
                admission: self,
                who,
            }),
        )
    }

    /// Calls running now, in all.
    pub fn running(&self) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_policy::Principal;
    use gateway_policy::set::LoadOptions;

    fn set() -> PolicySet {
        let root =
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("policies");
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
        // Three running for user1, then two more asked about before either
        // is settled: both were asked with three running, and both
        // verdicts admit; the second to settle is asked again with the
        // counts of then, and refused.
        let set = set();
        let a = Admission::default();
        let small = json!({"namespace": "demo-app"});
        let held: Vec<_> = (0..3)
            .map(|_| a.admit(&set, &input(1, small.clone())).1.expect("admitted"))
            .collect();
        let ask = |q: serde_json::Value| {
            set.eval_rule(VERDICT_RULE, regorus::Value::from(q))
                .map_err(|e| e.to_string())
        };
        let first = a.reserve(&input(1, small.clone()));
        let second = a.reserve(&input(1, small.clone()));
        let (v1, v2) = (ask(first.query.clone()), ask(second.query.clone()));
        assert_eq!(v2.as_ref().expect("verdict")["admit"], json!(true));
        let one = a.settle(v1, first, ask).1.expect("the fourth gets in");
        let e = a.settle(v2, second, ask).1.expect_err("the fifth does not");
        assert!(e.contains("user1 already has 4 call(s) running"), "{e}");
        assert_eq!(a.running(), 4);
        drop(one);
        drop(held);
        assert_eq!(a.running(), 0);
        // A call being asked about counts for nobody: another user's calls
        // meanwhile see none of it.
        let pending = a.reserve(&input(9, json!({"namespace": "x".repeat(300_000)})));
        assert_eq!(a.running(), 0);
        let other = a.admit(&set, &input(2, small)).1.expect("admitted");
        let verdict = ask(pending.query.clone());
        let e = a.settle(verdict, pending, ask).1.expect_err("too large");
        assert!(e.contains("more than the 262144"), "{e}");
        assert_eq!(a.running(), 1, "only the admitted call runs");
        drop(other);
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
