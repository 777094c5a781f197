//! The gateway's one pipeline: a call's stages from admission to its
//! result (decide, plan, approve, mint, run, audit), the runner each tool is
//! given by policy data, the tools and modules it runs, and the
//! configuration that assembles it. The transports above hand it calls; the
//! crates below (policy, sandbox, broker, audit, store) are its stages'
//! adapters.

pub mod config;
pub mod pipeline;
pub mod tools;
