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
use serde_json::json;

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
    let report = exchange_over(std::io::sink(), std::io::Cursor::new(data.to_vec()), &ex);
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
