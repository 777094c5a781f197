//! `gateway`: policy-gated, sandboxed infrastructure actions for AI coding agents.
//!
//! The modules follow the pipeline described in README.md. Every decision is made by the
//! Rego policies under `policies/` (see [`policy`]); Rust moves data.

// The lower crates, re-exported under the module names they had before the
// split (`gateway::policy`, `gateway::audit`, ...), sorted by name;
// CONTRIBUTING.md has their layers.
pub use gateway_audit::{approvals, audit};
pub use gateway_base::{canonical, error_chain, identity, process, secret, text, trust};
pub use gateway_broker as broker;
pub use gateway_core::{config, pipeline, tools};
pub use gateway_policy as policy;
pub use gateway_runner::protocol;
pub use gateway_sandbox as sandbox;
pub use gateway_server::{daemon, http, mcp};
pub use gateway_store as db;
pub use gateway_telemetry as telemetry;

pub mod cli;
pub mod doctor;
pub mod verify;

/// Every binary, bench and test linking the gateway allocates with
/// mimalloc: policy evaluation makes and frees many small values, and
/// glibc's malloc made a plan decision about 30% slower (see README.md,
/// Benchmarks).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Errors made by libraries capture no backtrace unless
/// `RUST_LIB_BACKTRACE` asks for one. regorus makes errors in the normal
/// course of an evaluation; with `RUST_BACKTRACE=1` (common on developer
/// machines) each would capture a backtrace, making a decision 15-35%
/// slower. Panics keep their backtraces (`RUST_BACKTRACE`).
///
/// Call it first thing in `main`, before any thread exists.
pub fn quiet_library_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: called first thing in `main` (the binary's and the
        // benches'), before any other thread exists that could read the
        // environment at the same time.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}
