//! The step runner's MCP client, talking to an upstream server whose every
//! byte is the fuzzer's: answers, requests of its own (sampling, roots),
//! notifications, garbage, lines over the cap. Whatever the server writes,
//! the exchange ends with a report within its bounds (at most 16 of the
//! server's methods named, each short; a short error), the call is made
//! only against the locked definition, and the report reads back as the
//! gateway reads it.
#![no_main]

use gateway_runner::mcp::exchange_over;
use gateway_runner::protocol::{McpCall, McpExchange, McpReport};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// The server's stdin: what the runner sent it, kept for the checks. The
/// runner writes on a thread of its own; `_done` ends with that thread.
struct Sent {
    bytes: Arc<Mutex<Vec<u8>>>,
    _done: std::sync::mpsc::Sender<()>,
}

impl std::io::Write for Sent {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.bytes.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let definition = json!({"name": "echo", "description": "Echo the text.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}});
    let ex = McpExchange {
        max_bytes: 64 * 1024,
        timeout_ms: 2_000,
        call: Some(McpCall {
            name: "echo".into(),
            arguments: json!({"text": "hi"}),
            definition: definition.clone(),
            progress_token: None,
        }),
        credential: None,
    };
    let bytes = Arc::new(Mutex::new(Vec::new()));
    let (done, writer_gone) = std::sync::mpsc::channel();
    let sent = Sent {
        bytes: Arc::clone(&bytes),
        _done: done,
    };
    let report = exchange_over(sent, std::io::Cursor::new(data.to_vec()), &ex);
    // Everything the runner sent is written once its writer has ended.
    let _ = writer_gone.recv();
    let sent: Vec<Value> = bytes
        .lock()
        .map(|b| b.clone())
        .unwrap_or_default()
        .split(|c| *c == b'\n')
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect();
    // The call went out only if the server listed the tool exactly as
    // locked (the runner compares the whole definition).
    if sent.iter().any(|m| m["method"] == "tools/call") {
        let listed_as_locked = data
            .split(|c| *c == b'\n')
            .filter_map(|l| serde_json::from_slice::<Value>(l.trim_ascii()).ok())
            .any(|m| {
                m["result"]["tools"]
                    .as_array()
                    .is_some_and(|t| t.contains(&definition))
            });
        assert!(
            listed_as_locked,
            "tools/call sent without the locked definition listed"
        );
        assert_eq!(
            sent.iter().filter(|m| m["method"] == "tools/call").count(),
            1
        );
    }
    assert!(report.refused_methods.len() <= 16);
    assert!(
        report
            .refused_methods
            .iter()
            .all(|m| m.chars().count() <= 64)
    );
    if let Some(e) = &report.error {
        assert!(e.chars().count() <= 700, "a long error: {e:?}");
        assert!(report.error_kind.is_some());
    }
    // A call made means the live definition was the locked one.
    if report.result.is_some() {
        assert!(report.refused.is_none() && report.error_kind.is_none());
    }
    if report.live_definition.is_some() {
        assert!(report.result.is_none() && report.refused.is_some());
        assert_ne!(report.live_definition.as_ref(), Some(&definition));
    }
    let mut line = serde_json::to_vec(&report).expect("a report serialises");
    line.push(b'\n');
    assert_eq!(McpReport::from_stdout(&line).as_ref(), Ok(&report));
});
