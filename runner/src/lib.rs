//! The only gateway code that runs inside a sandbox: the step runner
//! ([`run`]) and the protocol the gateway speaks to it ([`protocol`]). A
//! crate of its own so that what runs next to the module's code links
//! nothing of the gateway's (no SQLite, Vault client, kube, regorus, rmcp).

pub mod mcp;
pub mod protocol;
pub mod run;
pub mod sigstack;
