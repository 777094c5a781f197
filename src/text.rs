//! Text from outside (a module, a sandbox, a cluster, an MCP client) made
//! safe to show a person: on a terminal, and in what a notifier's consumer
//! renders. Below the CLI and the pipeline, which both use it.

use serde_json::Value;

/// Whether `c` is a format character that can hide or reorder text on a
/// terminal or a page (soft hyphen, bidi marks and overrides, zero-width
/// marks, BOM, blanks that render as nothing).
pub fn is_format_char(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x061C | 0x180E | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064
        | 0x2066..=0x206F | 0xFEFF | 0xFFF9..=0xFFFB | 0xE0000..=0xE007F
        // Line and paragraph separators, prepended concatenation marks
        // (Arabic, Syriac, Kaithi), musical formatting, and the Hangul and
        // Braille blanks that render as nothing.
        | 0x2028 | 0x2029 | 0x0600..=0x0605 | 0x06DD | 0x070F | 0x08E2 | 0x110BD | 0x110CD
        | 0x1D173..=0x1D17A | 0x115F | 0x1160 | 0x3164 | 0xFFA0 | 0x2800 | 0x034F
        // Variation selectors, Mongolian free variation selectors, Khmer
        // inherent vowels, shorthand format controls, Egyptian hieroglyph
        // format controls.
        | 0xFE00..=0xFE0F | 0xE0100..=0xE01EF | 0x180B..=0x180F | 0x17B4 | 0x17B5
        | 0x1BCA0..=0x1BCA3 | 0x13430..=0x1343F)
}

/// `s` with every control character (C0, DEL, C1: ESC, CSI, OSC, BEL, CR …)
/// and format character escaped as `\u{..}` (`\r`, and `\n`, `\t` when
/// `one_line`), so that no text from a module, a sandbox, a cluster or an
/// MCP client can move the cursor, erase or repaint a line, set a title or
/// reorder what a person reads. Newlines and tabs are kept unless
/// `one_line`.
pub fn escaped(s: &str, one_line: bool) -> String {
    if !s
        .chars()
        .any(|c| (c.is_control() && (one_line || !matches!(c, '\n' | '\t'))) || is_format_char(c))
    {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\n' | '\t' if !one_line => out.push(c),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() || is_format_char(c) => {
                out.push_str(&format!("\\u{{{:04x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// `s` for a consumer that renders markup (Slack's mrkdwn, HTML, a chat
/// client): control and format characters escaped as [`escaped`] does on
/// one line, then `&`, `<` and `>` as HTML entities, so no mention
/// (`<!channel>`), link (`<http://…|label>`) or tag survives.
pub fn markup_escaped(s: &str) -> String {
    // A backslash is doubled first, so that a literal `\u{202e}` in the
    // input cannot pass for an escaped character.
    escaped(&s.replace('\\', "\\\\"), true)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `v` with every string in it, object keys included, [`markup_escaped`]:
/// for JSON whose fields a consumer may render one by one.
pub fn markup_escaped_json(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(markup_escaped(s)),
        Value::Array(a) => Value::Array(a.iter().map(markup_escaped_json).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (markup_escaped(k), markup_escaped_json(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_mentions_links_and_hidden_characters_are_escaped_in_every_field() {
        let v = serde_json::json!({
            "client": "<!channel> & <http://evil|ok>",
            "signals": [{"message": "ok\u{202e}txt.exe\u{200b}\n<b>"}],
            "<k>": 1,
        });
        let e = markup_escaped_json(&v);
        assert_eq!(e["client"], "&lt;!channel&gt; &amp; &lt;http://evil|ok&gt;");
        assert_eq!(
            e["signals"][0]["message"],
            "ok\\u{202e}txt.exe\\u{200b}\\n&lt;b&gt;"
        );
        assert_eq!(e["&lt;k&gt;"], 1);
        assert_eq!(markup_escaped("\\u{202e}"), "\\\\u{202e}");
    }
}
