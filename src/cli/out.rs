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
    /// Print what was gathered, then return `code`.
    pub fn print(self, code: u8) -> std::process::ExitCode {
        use std::io::Write;
        let _ = std::io::stdout().write_all(self.stdout.as_bytes());
        let _ = std::io::stderr().write_all(self.stderr.as_bytes());
        std::process::ExitCode::from(code)
    }
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
