//! The agent of the daemon tests: `gateway serve` run as the agent's OS
//! user, spoken to in JSON-RPC lines, as an attacker would.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::daemon::{self, AGENT, Daemon};

fn gateway() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gateway"))
}

/// The agent: `gateway serve` run as the agent's OS user, spoken to in
/// JSON-RPC lines (the 2025-11-25 handshake).
pub struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
}

impl Agent {
    pub fn start(d: &Daemon, workspace: &Path, home: &Path) -> Agent {
        Agent::try_start_at(&d.socket, workspace, home).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Agent::start`] on the daemon at `socket`, or why not (the daemon
    /// gone, stopping, or refusing the session).
    pub fn try_start_at(socket: &Path, workspace: &Path, home: &Path) -> Result<Agent, String> {
        let mut c = daemon::as_user(AGENT, home, &[("GATEWAY_SOCKET", socket)], &gateway());
        c.arg("serve")
            .arg("--workspace")
            .arg(workspace)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Its own process group: "kill the agent's serve" kills it all.
            .process_group(0);
        let mut child = c
            .spawn()
            .map_err(|e| format!("gateway serve as the agent: {e}"))?;
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        let mut a = Agent {
            stdin: child.stdin.take(),
            child,
            lines,
        };
        a.try_send(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "hostile-agent", "version": "1"}}}),
        )?;
        a.try_wait(|v| v["id"] == 0, Duration::from_secs(30))?;
        a.try_send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        Ok(a)
    }

    pub fn try_send(&mut self, v: Value) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{v}").map_err(|e| format!("write to serve: {e}"))?;
        stdin.flush().map_err(|e| format!("flush: {e}"))
    }

    /// [`Agent::wait`], or why nothing came.
    pub fn try_wait(
        &self,
        pred: impl Fn(&Value) -> bool,
        within: Duration,
    ) -> Result<Value, String> {
        let started = Instant::now();
        loop {
            let left = within.saturating_sub(started.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(v) if pred(&v) => return Ok(v),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("no answer within {within:?}"));
                }
                Err(RecvTimeoutError::Disconnected) => return Err("serve closed its output".into()),
            }
        }
    }

    /// Call `tool` as request `id`.
    pub fn call(&mut self, id: u64, tool: &str, args: Value) -> Result<(), String> {
        self.try_send(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": tool, "arguments": args, "_meta": {"progressToken": "p"}}}),
        )
    }

    pub fn send(&mut self, v: Value) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{v}").expect("write to serve");
        stdin.flush().expect("flush");
    }

    /// terraform_apply as request `id`, with a progress token.
    pub fn apply(&mut self, id: u64, args: Value) {
        self.send(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "terraform_apply", "arguments": args, "_meta": {"progressToken": "p"}}}),
        );
    }

    /// The first message `pred` holds for; every message before it is
    /// dropped.
    pub fn wait(&self, pred: impl Fn(&Value) -> bool, within: Duration) -> Value {
        let started = Instant::now();
        loop {
            let left = within.saturating_sub(started.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(v) if pred(&v) => return v,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("no such message within {within:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("serve closed its output"),
            }
        }
    }

    /// A progress message containing `text`.
    pub fn progress(&self, text: &str, within: Duration) {
        self.wait(
            |v| {
                v["method"] == "notifications/progress"
                    && v["params"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(text))
            },
            within,
        );
    }

    pub fn close_input(&mut self) {
        self.stdin.take();
    }

    pub fn kill(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}
