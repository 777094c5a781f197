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
    let mixed = mixed_script_words(s);
    if mixed.is_empty()
        && !s.chars().any(|c| {
            (c.is_control() && (one_line || !matches!(c, '\n' | '\t'))) || is_format_char(c)
        })
    {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 16);
    // The mixed-script words are in order and apart: one pass over them
    // alongside the text (a scan of all of them per character made a long
    // hostile text cost its length squared).
    let mut word = 0;
    for (i, c) in s.char_indices() {
        while word < mixed.len() && mixed[word].end <= i {
            word += 1;
        }
        if !c.is_ascii() && mixed.get(word).is_some_and(|r| r.contains(&i)) {
            out.push_str(&format!("\\u{{{:04x}}}", c as u32));
            continue;
        }
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

/// The script a letter belongs to, for [`mixed_script_words`]: the
/// scripts whose letters pass for one another (Latin, Greek, Cyrillic,
/// Armenian, Cherokee), or `None` for a character that is no letter of
/// them (digits, `-`, other scripts).
fn confusable_script(c: char) -> Option<u8> {
    match c as u32 {
        0x41..=0x5A | 0x61..=0x7A | 0xC0..=0x24F | 0x1E00..=0x1EFF | 0xFF21..=0xFF5A => Some(0),
        0x370..=0x3FF | 0x1F00..=0x1FFF => Some(1),
        0x400..=0x52F | 0x1C80..=0x1C8F | 0x2DE0..=0x2DFF | 0xA640..=0xA69F => Some(2),
        0x530..=0x58F => Some(3),
        0x13A0..=0x13FF | 0xAB70..=0xABBF => Some(4),
        _ => None,
    }
}

/// The byte ranges of the words of `s` (runs of letters, digits, `-`,
/// `_`, `.`) that mix letters of two of the scripts that pass for one
/// another, as `prod-db` spelled with a Cyrillic `о` does. Browsers show
/// such a host name as punycode; here its non-ASCII letters are shown as
/// `\u{..}` so that it cannot pass for the name it imitates.
pub fn mixed_script_words(s: &str) -> Vec<std::ops::Range<usize>> {
    if s.is_ascii() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut start = None;
    let mut seen: u8 = 0;
    let mut close = |start: &mut Option<usize>, seen: &mut u8, end: usize| {
        if let Some(b) = start.take()
            && seen.count_ones() > 1
        {
            out.push(b..end);
        }
        *seen = 0;
    };
    for (i, c) in s.char_indices() {
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '.') {
            start.get_or_insert(i);
            if let Some(script) = confusable_script(c) {
                seen |= 1 << script;
            }
        } else {
            close(&mut start, &mut seen, i);
        }
    }
    close(&mut start, &mut seen, s.len());
    out
}

/// `s` on one line with every control and format character and every
/// mixed-script word shown as `\u{..}` ([`escaped`]), for a page whose
/// template escapes markup itself. A backslash is doubled first, so that a
/// literal `\u{202e}` in the input cannot pass for an escaped character.
pub fn visible(s: &str) -> String {
    escaped(&s.replace('\\', "\\\\"), true)
}

/// `s` for a consumer that renders markup (Slack's mrkdwn, HTML, a chat
/// client): control and format characters escaped as [`escaped`] does on
/// one line, then `&`, `<` and `>` as HTML entities, so no mention
/// (`<!channel>`), link (`<http://…|label>`) or tag survives.
pub fn markup_escaped(s: &str) -> String {
    visible(s)
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
    fn a_name_mixing_look_alike_scripts_is_shown_for_what_it_is() {
        // `prod-db` with a Cyrillic о (U+043E).
        let fake = "prod-db";
        let fake = fake.replacen('o', "\u{43e}", 1);
        assert_ne!(fake, "prod-db");
        assert_eq!(escaped(&fake, true), "pr\\u{043e}d-db");
        assert_eq!(
            markup_escaped(&format!("drop {fake} now")),
            "drop pr\\u{043e}d-db now"
        );
        // One script at a time is left as it is.
        for fine in ["Größe", "Привет world", "ελληνικά", "日本語-db", "prod-db"]
        {
            assert_eq!(escaped(fine, true), fine);
        }
    }

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
