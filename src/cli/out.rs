//! What an operator command prints, gathered so that the same code serves
//! a direct run (printed at the end) and the daemon (sent back over its
//! socket to the CLI that asked).

/// A command's stdout and stderr.
#[derive(Debug, Default)]
pub struct Out {
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Print what was gathered (terminal-safe, [`print_safe`]), then
    /// return `code`.
    pub fn print(self, code: u8) -> std::process::ExitCode {
        print_safe(&self.stdout);
        eprint_safe(&self.stderr);
        std::process::ExitCode::from(code)
    }
}

/// Whether `c` is a format character that can hide or reorder text on a
/// terminal (soft hyphen, bidi marks and overrides, zero-width marks, BOM).
fn is_format_char(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x061C | 0x180E | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064
        | 0x2066..=0x206F | 0xFEFF | 0xFFF9..=0xFFFB | 0xE0000..=0xE007F)
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

/// Write `text` to stdout with control and format characters escaped
/// (lines and tabs kept): every CLI command prints through this or
/// [`Out::print`].
pub fn print_safe(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().write_all(escaped(text, false).as_bytes());
}

/// [`print_safe`] for stderr.
pub fn eprint_safe(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(escaped(text, false).as_bytes());
}

/// `println!` into an [`Out`]'s stdout.
macro_rules! outln {
    ($o:expr) => {{ $o.stdout.push('\n'); }};
    ($o:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($o.stdout, $($t)*);
    }};
}

/// `print!` into an [`Out`]'s stdout.
macro_rules! out {
    ($o:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = write!($o.stdout, $($t)*);
    }};
}

/// `eprintln!` into an [`Out`]'s stderr.
macro_rules! errln {
    ($o:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($o.stderr, $($t)*);
    }};
}

pub(crate) use {errln, out, outln};

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn no_control_or_format_character_reaches_the_terminal() {
        let hostile = "ok\r\x1b[2K  !! fake\x1b]0;title\x07\u{9b}31m\u{202e}evil\u{200b}\tend\n";
        for one_line in [true, false] {
            let s = escaped(hostile, one_line);
            assert!(
                s.chars().all(
                    |c| (!c.is_control() || (!one_line && matches!(c, '\n' | '\t')))
                        && !('\u{200b}'..='\u{202e}').contains(&c)
                ),
                "{s:?}"
            );
        }
        assert_eq!(
            escaped(hostile, true),
            "ok\\r\\u{001b}[2K  !! fake\\u{001b}]0;title\\u{0007}\\u{009b}31m\\u{202e}evil\\u{200b}\\tend\\n"
        );
        assert_eq!(
            escaped(hostile, false),
            "ok\\r\\u{001b}[2K  !! fake\\u{001b}]0;title\\u{0007}\\u{009b}31m\\u{202e}evil\\u{200b}\tend\n"
        );
        assert_eq!(
            escaped("plain text, ünïcode\n", false),
            "plain text, ünïcode\n"
        );
    }
}
