//! The policy engine: every decision the gateway makes is Rego, evaluated
//! in-process by `regorus`.
//!
//! - [`loader`] reads a policy directory (`.rego` modules and `.json`/`.yaml`
//!   data files keyed by their path) into a compiled [`PolicySet`];
//! - [`PolicySet::decide`] evaluates `data.gateway.decision` for one
//!   [`DecisionInput`] and returns a validated [`Decision`], failing closed;
//! - [`store::PolicyStore`] keeps the active set and hot-reloads it;
//! - [`bundle`] reads and verifies signed policy bundles (OPA's format);
//! - [`plan`] reads Terraform plan JSON for the policy input;
//! - [`testing`] runs Rego unit tests the way `opa test` does.

pub mod bundle;
pub mod decision;
pub mod input;
pub mod loader;
pub mod plan;
pub mod set;
pub mod store;
pub mod testing;

pub use decision::{
    Annotations, ApprovalRequirement, CredentialScope, Decision, SandboxLimits, Signal,
};
pub use input::{DecisionInput, PlanInput, Principal, PrincipalKind};
pub use set::{Evaluation, PolicySet};
pub use store::{PolicyEvent, PolicyStore};

use std::path::PathBuf;

/// The rule the gateway asks for every decision.
pub const DECISION_RULE: &str = "data.gateway.decision";
/// The rule the gateway asks for the tools a principal may see.
pub const TOOL_LIST_RULE: &str = "data.gateway.tool_list";

/// Why a policy set could not be loaded or evaluated.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy dir {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("policy dir {0} contains no .rego file")]
    Empty(PathBuf),
    #[error("{path}: not valid UTF-8")]
    Encoding { path: PathBuf },
    #[error("{0}")]
    Parse(String),
    #[error("data file {path}: {message}")]
    Data { path: PathBuf, message: String },
    #[error("policy set does not compile for {rule}: {message}")]
    Compile { rule: String, message: String },
    #[error("policy evaluation failed: {0}")]
    Eval(String),
    #[error("policy evaluation exceeded its time budget of {budget_ms} ms: {message}")]
    Timeout { budget_ms: u128, message: String },
    #[error("policy engine panicked: {0}")]
    Panic(String),
    #[error("decision does not match the contract: {0}")]
    Contract(String),
    #[error(transparent)]
    Untrusted(#[from] gateway_base::trust::TrustError),
    #[error("policy bundle {source_name}: {error}")]
    Bundle {
        source_name: String,
        #[source]
        error: bundle::BundleError,
    },
}
