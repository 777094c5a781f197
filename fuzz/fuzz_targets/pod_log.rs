//! A sandbox pod's log as the kubernetes backend reads it (hostile: the
//! tool, and whatever it ran, writes there): the runner frames every line
//! it passes on (`o `/`e `) and ends with `x CODE`. Read in pieces as
//! they stream or whole, the end is found at the same byte with the same
//! code; what is found is an end frame exactly; and splitting the log
//! into the output and the errors invents no byte.
#![no_main]

use gateway_runner::protocol::{EndScan, after_ready, end_code, find_end, unframe};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, log)) = data.split_first() else {
        return;
    };
    let whole = find_end(log);
    let mut scan = EndScan::default();
    let mut streamed = None;
    for piece in log.chunks(usize::from(cut).max(1)) {
        streamed = scan.push(piece);
        if streamed.is_some() {
            break;
        }
    }
    assert_eq!(
        streamed, whole,
        "read in pieces of {cut}, the end is elsewhere"
    );
    if let Some((at, code)) = whole {
        let body = &log[..at];
        let start = body[..body.len() - 1]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |nl| nl + 1);
        assert_eq!(end_code(&body[start..]), Some(code));
    }
    let (out, err) = unframe(log);
    assert!(out.len() + err.len() <= log.len());
    if let Some(at) = after_ready(log) {
        assert!(at <= log.len());
    }
});
