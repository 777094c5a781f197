//! How calls reach the pipeline: MCP (over stdio, the daemon's Unix socket
//! and HTTPS), the daemon that owns the pipeline and its sockets, and the
//! HTTPS listener with the approval page, health and metrics. Each
//! transport turns a connection into a principal and a call; none decides.

pub mod daemon;
pub mod http;
pub mod mcp;
