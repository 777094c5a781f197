//! What the gateway reads from a sandbox the step runner ran in: an
//! upstream MCP server's report (one line) and a warm server's lines. The
//! sandbox ran hostile code, so any bytes may come: a report is read or
//! refused with a reason, never half-read, and what is read is what the
//! runner would have written (it reads back the same).
#![no_main]

use gateway_runner::protocol::{McpReport, ServeLine};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match McpReport::from_stdout(data) {
        Ok(report) => {
            let mut line = serde_json::to_vec(&report).expect("a report serialises");
            line.push(b'\n');
            assert_eq!(
                McpReport::from_stdout(&line).as_ref(),
                Ok(&report),
                "the report does not read back"
            );
        }
        Err(why) => assert!(!why.is_empty()),
    }
    if let Ok(l) = serde_json::from_slice::<ServeLine>(data) {
        let again = serde_json::to_vec(&l).expect("a line serialises");
        assert_eq!(
            serde_json::from_slice::<ServeLine>(&again).ok().as_ref(),
            Some(&l)
        );
    }
});
