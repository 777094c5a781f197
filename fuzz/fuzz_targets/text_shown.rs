//! Text from outside (a module, a sandbox, a cluster, an MCP client) as
//! the gateway shows it to a person: on a terminal, on the approval page,
//! in a chat message. Whatever the text, what is shown has no control or
//! format character, no word that mixes look-alike scripts, and (for a
//! consumer that renders markup) no tag, mention or link.
#![no_main]

use gateway_base::text::{escaped, is_format_char, markup_escaped, mixed_script_words, visible};
use libfuzzer_sys::fuzz_target;

/// `out` with each escape sequence the gateway writes (`\\u{..}`, `\\n`,
/// `\\t`, `\\r`) replaced by a space: an escape is visible for what it is,
/// and the letters of one (`n`, `u`) next to a letter of another script
/// are no homoglyph of anything.
fn without_escapes(out: &str) -> String {
    let mut kept = String::with_capacity(out.len());
    let mut rest = out;
    while let Some(i) = rest.find('\\') {
        kept.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix("u{")
            && let Some(end) = tail.find('}')
            && end > 0
            && tail[..end].chars().all(|c| c.is_ascii_hexdigit())
        {
            kept.push(' ');
            rest = &tail[end + 1..];
        } else if after.starts_with(['n', 't', 'r']) {
            kept.push(' ');
            rest = &after[1..];
        } else {
            kept.push('\\');
            rest = after;
        }
    }
    kept.push_str(rest);
    kept
}

fn shown_safely(what: &str, out: &str, newlines: bool) {
    for c in out.chars() {
        assert!(
            !is_format_char(c) && (!c.is_control() || (newlines && matches!(c, '\n' | '\t'))),
            "{what} kept {:?} in {out:?}",
            c
        );
    }
    assert!(
        mixed_script_words(&without_escapes(out)).is_empty(),
        "{what} left a mixed-script word in {out:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let one_line = escaped(s, true);
    shown_safely("escaped(one_line)", &one_line, false);
    shown_safely("escaped", &escaped(s, false), true);
    // Text with nothing to hide is shown as it is.
    if mixed_script_words(s).is_empty() && !s.chars().any(|c| c.is_control() || is_format_char(c)) {
        assert_eq!(one_line, s);
    }
    let v = visible(s);
    shown_safely("visible", &v, false);
    let m = markup_escaped(s);
    shown_safely("markup_escaped", &m, false);
    assert!(!m.contains('<') && !m.contains('>'), "markup left in {m:?}");
    for (i, _) in m.match_indices('&') {
        let rest = &m[i..];
        assert!(
            rest.starts_with("&amp;") || rest.starts_with("&lt;") || rest.starts_with("&gt;"),
            "a bare & in {m:?}"
        );
    }
});
