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

pub use crate::text::escaped;

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

/// An untrusted string as one field on the terminal: secrets scrubbed and
/// every control or format character escaped, newlines included
/// ([`escaped`]).
pub fn shown(s: &str) -> String {
    escaped(&crate::audit::scrub::scrub_str(s), true)
}

#[cfg(test)]
mod tests {
    use super::{escaped, shown};

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

    #[test]
    fn a_field_shown_has_its_secrets_scrubbed_and_every_control_escaped() {
        let hostile = "ok\r\x1b[2K  !! fake\x1b]0;title\x07\u{9b}31m\u{202e}evil\u{200b}\tend\n";
        let s = shown(hostile);
        assert!(
            s.chars()
                .all(|c| !c.is_control() && !('\u{200b}'..='\u{202e}').contains(&c)),
            "{s:?}"
        );
        assert_eq!(
            s,
            "ok\\r\\u{001b}[2K  !! fake\\u{001b}]0;title\\u{0007}\\u{009b}31m\\u{202e}evil\\u{200b}\\tend\\n"
        );
        assert_eq!(shown("plain text, ünïcode"), "plain text, ünïcode");
    }
}
