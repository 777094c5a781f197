//! `gateway`: policy-gated, sandboxed infrastructure actions for AI coding agents.
//!
//! The modules follow the pipeline of SPEC §1. Every decision is made by the
//! Rego policies under `policies/` (see [`policy`]); Rust moves data.

pub mod approvals;
pub mod audit;
pub mod broker;
pub mod canonical;
pub mod cli;
pub mod config;
pub mod db;
pub mod mcp;
pub mod pipeline;
pub mod policy;
pub mod process;
pub mod sandbox;
pub mod tools;
