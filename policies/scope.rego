# Credential scope derivation and target allowlists.
#
# From the tool (its `scope` and `credential` kind in config/tools/data.yaml) and
# its params, derive the target (a namespace or a Terraform module dir) and
# the exact credential to mint for it, using only config/scopes/data.yaml. A target
# outside the allowlists, or a target for which no role is configured, is
# refused: no scope, no call.
package gateway.scope


cfg := data.config.scopes

kind := data.gateway.tools.tool.credential

# --- Kubernetes namespace targets -------------------------------------------

namespace_entry := cfg.namespaces[data.gateway.tools.params.namespace] if data.gateway.tools.tool.scope == "namespace"

deny contains msg if {
	data.gateway.tools.tool.scope == "namespace"
	ns := data.gateway.tools.params.namespace
	is_string(ns)
	not data.gateway.tools.violated("namespace")
	not cfg.namespaces[ns]
	msg := sprintf("namespace %q is not in the allowlist (allowed: %s)", [ns, concat(", ", sort(object.keys(cfg.namespaces)))])
}

# --- Terraform module targets -----------------------------------------------

# The gateway keeps a module's state itself: the default local state
# (terraform.tfstate in the module dir), copied into each sandbox and back
# after an approved apply. A configuration (as the saved plan file carries
# it, parsed) that keeps state anywhere else would lose it with the sandbox.
deny contains msg if {
	data.gateway.tools.tool.scope == "module"
	some path, body in object.get(input, "plan_config_files", {})
	some t in data.gateway.signals.as_list(object.get(body, "terraform", []))
	is_object(t)
	some k in ["backend", "cloud"]
	k in object.keys(t)
	msg := sprintf("%q declares a %s block: the gateway keeps only the default local state (terraform.tfstate in the module dir); remove the block", [path, k])
}

module_entry := cfg.modules[data.gateway.tools.params.working_dir] if data.gateway.tools.tool.scope == "module"

deny contains msg if {
	data.gateway.tools.tool.scope == "module"
	wd := data.gateway.tools.params.working_dir
	is_string(wd)
	not data.gateway.tools.violated("working_dir")
	startswith(wd, "/")
	msg := sprintf("working_dir %q is absolute: name an allowed module dir relative to the repository", [wd])
}

deny contains msg if {
	data.gateway.tools.tool.scope == "module"
	wd := data.gateway.tools.params.working_dir
	is_string(wd)
	not data.gateway.tools.violated("working_dir")
	".." in split(replace(wd, "\\", "/"), "/")
	msg := sprintf("working_dir %q contains '..': paths may not leave the allowed module dirs", [wd])
}

deny contains msg if {
	data.gateway.tools.tool.scope == "module"
	wd := data.gateway.tools.params.working_dir
	is_string(wd)
	not data.gateway.tools.violated("working_dir")
	not cfg.modules[wd]
	msg := sprintf("working_dir %q is not an allowed module dir (allowed: %s)", [wd, concat(", ", sort(object.keys(cfg.modules)))])
}

# --- The credential ---------------------------------------------------------

# The namespace a credential is scoped to.
target_namespace := data.gateway.tools.params.namespace if namespace_entry

target_namespace := module_entry.namespace if module_entry

# The allowlist entry of the target, whichever kind it is.
entry := namespace_entry

entry := module_entry

# No credential unless one is derived below.
default credential := null

credential := {
	"kind": kind,
	"type": cfg.credential_kinds[kind].type,
	"mount": cfg.credential_kinds[kind].mount,
	"role": entry.roles[kind],
	"params": {
		"kubernetes_namespace": target_namespace,
		"ttl": cfg.credential_kinds[kind].ttl,
	},
}

# An upstream MCP server's call: the credential and endpoints its
# declaration names (upstreams.rego). Its tools have no `credential` kind
# of their own, so the rules above never derive one for them.
credential := data.gateway.upstreams.credential if data.gateway.upstreams.requested

# Network endpoints the credential is for (none without a credential).
default egress := []

egress := cfg.credential_kinds[kind].egress if credential != null

egress := data.gateway.upstreams.egress if data.gateway.upstreams.requested

# A target that is allowed but has no role for this tool's credential kind
# (and does not say it needs none) has no scope: refuse.
deny contains msg if {
	kind
	entry
	credential == null
	object.get(entry, "credential", "") != "none"
	msg := sprintf("no credential scope: the policy has no %q role for this target", [kind])
}

# --- The Vault setup defines every role the policy derives -------------------

# config/vault_roles/data.yaml is what `gateway vault setup` creates. A derived
# role missing from it, or defined for another mount or namespace, would fail
# at Vault (or worse, mint a broader credential): refuse it here. (A
# database user's role is the operator's, made on the database secrets
# engine with the statements that say what the user may do.)
vault_role := data.config.vault_roles.roles[credential.role] if credential.type == "kubernetes"

# A built-in tool's credential is a Kubernetes token: any other type (a
# database user is an upstream's; a misspelt type) is refused here rather
# than left to the gateway.
deny contains msg if {
	credential != null
	not data.gateway.upstreams.requested
	credential.type != "kubernetes"
	msg := sprintf("credential kind %q is of type %q: a built-in tool's credential must be of type kubernetes", [credential.kind, credential.type])
}

deny contains msg if {
	credential.type == "kubernetes"
	not vault_role
	msg := sprintf("credential role %q is not defined by the Vault setup (config/vault_roles/data.yaml)", [credential.role])
}

deny contains msg if {
	some field in ["mount", "namespace"]
	ours := {"mount": credential.mount, "namespace": credential.params.kubernetes_namespace}[field]
	vault_role[field] != ours
	msg := sprintf("credential role %q is set up for %s %q, not %q", [credential.role, field, vault_role[field], ours])
}
