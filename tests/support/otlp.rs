//! The OTLP/HTTP receiver the tests start (tests/observability/receiver.py:
//! it decodes with the official protobuf definitions from PyPI), and what
//! it received.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The receiver on `port`, storing into `out`; killed when dropped.
pub struct Receiver {
    child: Child,
    pub port: u16,
    pub out: PathBuf,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Receiver {
    /// Start it (on `port`, or a free one); with `token`, its JSON-lines
    /// endpoint wants that bearer token.
    pub fn start(port: Option<u16>, out: &Path, token: Option<&str>) -> Receiver {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let python = repo.join(".tools/venv/bin/python");
        assert!(
            python.is_file(),
            "the receiver's Python is installed by scripts/install-tools.sh otlp"
        );
        std::fs::create_dir_all(out).expect("receiver dir");
        let port = port.unwrap_or_else(free_port);
        let mut c = Command::new(python);
        c.arg(repo.join("tests/observability/receiver.py"))
            .arg(port.to_string())
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(out.join("receiver.log"))
                    .expect("receiver log"),
            );
        if let Some(t) = token {
            c.args(["--token", t]);
        }
        let mut child = c.spawn().expect("the OTLP receiver");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "the OTLP receiver exited ({st}): {}",
                    std::fs::read_to_string(out.join("receiver.log")).unwrap_or_default()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the OTLP receiver does not listen after 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Receiver {
            child,
            port,
            out: out.to_path_buf(),
        }
    }

    /// Its base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The JSON lines of a file the receiver wrote.
pub fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The spans received whose `pred` holds, once one whose `done` holds
/// has come (within 60 s).
pub fn spans_until(
    out: &Path,
    pred: impl Fn(&Value) -> bool,
    done: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let spans: Vec<Value> = lines(&out.join("spans.jsonl"))
            .into_iter()
            .filter(|s| pred(s))
            .collect();
        if spans.iter().any(&done) {
            return spans;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the span awaited did not come in 60 s: {spans:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The spans of the call `request_id` made in this process, once its
/// `gateway.call` span came in: this process's spans flushed first.
pub async fn call_spans(out: &Path, request_id: &str) -> Vec<Value> {
    tokio::task::spawn_blocking(gateway::telemetry::trace::flush)
        .await
        .expect("flush");
    spans_until(
        out,
        |s| s["attributes"]["gateway.request_id"] == request_id,
        |s| s["name"] == "gateway.call",
    )
}
