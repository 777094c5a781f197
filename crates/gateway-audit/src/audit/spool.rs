//! Events the team's chain refused while its database was away, kept in
//! order and appended once it is back.
//!
//! A call that was running when PostgreSQL stopped cannot record its end
//! then; its client is told so, and the events it could not record wait
//! here. Each is appended later with what it was (`ts` is when it reached
//! the chain; `late` says when it happened and why it waited). While any
//! event waits, every new one queues behind it (a call's events stay in
//! their order), and an append first tries to empty the queue. The daemon
//! also tries every second ([`super::AuditLog::flush_spool`]) and once
//! more at its stop.
//!
//! The queue lives in the replica's memory, bounded ([`MAX_EVENTS`],
//! [`MAX_BYTES`]). What it cannot keep (past the bound, or held by a
//! replica killed before the database came back) is not silently gone:
//! past the bound it is counted and an `audit.dropped` event says how many
//! and why; and a call whose `tool.result` never reached the chain stays
//! in the chain's table of open calls until a survivor ends it as
//! `interrupted` ([`super::shared::Mark::CloseOrphan`]).

use std::collections::VecDeque;

use serde_json::{Map, Value, json};

/// How many events one writer keeps at most while the chain refuses them.
pub const MAX_EVENTS: usize = 10_000;
/// How many bytes of event data (as JSON) one writer keeps at most.
pub const MAX_BYTES: usize = 64 * 1024 * 1024;

/// An event the chain refused, waiting.
#[derive(Debug)]
pub struct Late {
    pub request_id: String,
    pub event: String,
    pub data: Value,
    pub extra: Map<String, Value>,
    bytes: usize,
}

#[derive(Debug, Default)]
pub struct Spool {
    waiting: VecDeque<Late>,
    /// Events waiting per call (request id).
    per_call: std::collections::HashMap<String, usize>,
    bytes: usize,
    /// Events refused past the bound since the queue was last emptied,
    /// and the first and last time one was.
    dropped: u64,
    dropped_first: Option<String>,
    dropped_last: Option<String>,
}

impl Spool {
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.dropped == 0
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether call `request_id` has events waiting.
    pub fn waiting_for(&self, request_id: &str) -> bool {
        self.per_call.contains_key(request_id)
    }

    /// Keep an event the chain refused with `why`; counted as dropped when
    /// the queue is full.
    pub fn keep(
        &mut self,
        request_id: &str,
        event: &str,
        data: Value,
        mut extra: Map<String, Value>,
        why: &str,
    ) {
        let now = super::now_ts();
        let bytes = serde_json::to_string(&data).map_or(0, |s| s.len())
            + serde_json::to_string(&extra).map_or(0, |s| s.len());
        if self.waiting.len() >= MAX_EVENTS || self.bytes + bytes > MAX_BYTES {
            self.dropped += 1;
            self.dropped_first.get_or_insert_with(|| now.clone());
            self.dropped_last = Some(now);
            return;
        }
        extra.insert(
            "late".into(),
            json!({
                "happened_at": now,
                "why": format!("the audit chain refused it then ({why}); kept by the replica and appended once the chain took events again"),
            }),
        );
        self.bytes += bytes;
        if !request_id.is_empty() {
            *self.per_call.entry(request_id.to_string()).or_insert(0) += 1;
        }
        self.waiting.push_back(Late {
            request_id: request_id.to_string(),
            event: event.to_string(),
            data,
            extra,
            bytes,
        });
    }

    /// The oldest event waiting.
    pub fn front(&self) -> Option<&Late> {
        self.waiting.front()
    }

    /// The oldest event was appended.
    pub fn pop(&mut self) {
        if let Some(l) = self.waiting.pop_front() {
            self.bytes = self.bytes.saturating_sub(l.bytes);
            if let Some(n) = self.per_call.get_mut(&l.request_id) {
                *n -= 1;
                if *n == 0 {
                    self.per_call.remove(&l.request_id);
                }
            }
        }
    }

    /// An `audit.dropped` event taken with [`Spool::take_dropped`] could
    /// not be appended: it is owed again.
    pub fn restore_dropped(&mut self, taken: &Value) {
        self.dropped += taken["count"].as_u64().unwrap_or(0);
        if self.dropped_first.is_none() {
            self.dropped_first = taken["first_at"].as_str().map(str::to_string);
        }
        if self.dropped_last.is_none() {
            self.dropped_last = taken["last_at"].as_str().map(str::to_string);
        }
    }

    /// Once every kept event is appended: the `audit.dropped` event owed
    /// for those that could not be kept, if any (taken: it is owed once).
    pub fn take_dropped(&mut self) -> Option<Value> {
        if !self.waiting.is_empty() || self.dropped == 0 {
            return None;
        }
        let out = json!({
            "count": self.dropped,
            "first_at": self.dropped_first.take(),
            "last_at": self.dropped_last.take(),
            "reason": format!(
                "the audit chain refused events for longer than this replica could keep them ({MAX_EVENTS} events or {} MiB); calls whose end is among them are ended as interrupted by a survivor",
                MAX_BYTES / (1024 * 1024)
            ),
        });
        self.dropped = 0;
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_wait_in_order_and_those_past_the_bound_are_counted_not_kept() {
        let mut s = Spool::default();
        assert!(s.is_empty());
        for i in 0..MAX_EVENTS + 3 {
            s.keep("r", "tool.result", json!({"i": i}), Map::new(), "down");
        }
        assert_eq!(s.len(), MAX_EVENTS);
        assert_eq!(s.front().map(|l| l.data["i"].clone()), Some(json!(0)));
        assert!(s.front().is_some_and(|l| {
            l.extra["late"]["why"]
                .as_str()
                .is_some_and(|w| w.contains("(down)"))
        }));
        assert_eq!(s.take_dropped(), None, "owed only once the rest is in");
        s.pop();
        assert_eq!(s.front().map(|l| l.data["i"].clone()), Some(json!(1)));
        while s.front().is_some() {
            s.pop();
        }
        assert!(!s.is_empty(), "the drop is still owed");
        let d = s.take_dropped().expect("owed");
        assert_eq!(d["count"], 3);
        assert!(s.is_empty());
        assert_eq!(s.take_dropped(), None);
    }

    #[test]
    fn the_byte_bound_holds_too() {
        let mut s = Spool::default();
        let big = "x".repeat(MAX_BYTES / 2);
        s.keep("r", "e", json!(big), Map::new(), "down");
        s.keep("r", "e", json!(big), Map::new(), "down");
        assert_eq!(s.len(), 1);
        assert_eq!(s.dropped, 1);
    }
}
