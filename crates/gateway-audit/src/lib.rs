//! What the gateway keeps of what happened and who allowed it: the
//! tamper-evident audit trail (a hash chain in a file or in the team's
//! database, its export and its verification) and the human approvals of
//! destructive calls (the approval store, signed statements, passkeys).
//!
//! One crate for both: `audit verify` re-checks every approval's signature
//! from the chain alone, and an approval's every change is an audit event.

pub mod approvals;
pub mod audit;
