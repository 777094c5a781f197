# The Kubernetes toolbox: the exact operation the kubectl_read runner
# carries out, from the tool's catalog entry (`kubernetes.verb`, the kinds
# its `kind` param lists) and the call's params. The runner runs this
# operation and nothing else: the namespace is the one the credential is
# scoped to, the kind is resolved here from config/scopes `kinds`, never
# taken as the agent wrote it.
package gateway.kubernetes

# (The tools package is named in full, not imported: regorus evaluates
# every rule of an imported package at its first use, the whole catalog
# with every upstream's tools included, which cost an upstream call's
# decision 2.3 of its 3.4 ms.)

params := data.gateway.tools.params

cfg := data.config.kubernetes

# The verbs kubectl_read carries out, and those kubectl_change does.
read_verbs := {"get", "describe", "logs", "events", "rollout_status", "rollout_history", "top"}

change_verbs := {"scale", "rollout_restart", "set_image", "rollout_undo", "apply", "delete"}

verbs := read_verbs | change_verbs

# The tool's kubectl verb (undefined for a tool that is not a Kubernetes read).
verb := data.gateway.tools.tool.kubernetes.verb

deny contains msg if {
	data.gateway.tools.tool.kubernetes
	not verb in verbs
	msg := sprintf("the catalog gives tool %s the kubernetes verb %s, which no Kubernetes runner has (they have: %s)", [data.gateway.tools.quoted(input.tool), data.gateway.tools.quoted(sprintf("%v", [object.get(data.gateway.tools.tool.kubernetes, "verb", null)])), concat(", ", sort(verbs))])
}

deny contains msg if {
	data.gateway.tools.tool.kubernetes
	data.gateway.tools.tool.scope != "namespace"
	msg := sprintf("tool %s is a Kubernetes tool but its scope is not `namespace`", [data.gateway.tools.quoted(input.tool)])
}

# The kind the call names, as config/scopes defines it ({} when it names
# none: the events of a whole namespace; a log or a `top` is always a pod's).
kind := k if {
	k := data.config.scopes.kinds[params.kind]
} else := data.config.scopes.kinds.pods if {
	verb in {"logs", "top"}
} else := manifest_kind if {
	verb == "apply"
} else := {}

deny contains msg if {
	data.gateway.tools.tool.kubernetes
	is_string(params.kind)
	not data.gateway.tools.violated("kind")
	not data.config.scopes.kinds[params.kind]
	msg := sprintf("kind %s is not defined in config/scopes (kinds)", [data.gateway.tools.quoted(params.kind)])
}

# Events are of a namespace, or of one object: a kind and a name together.
deny contains msg if {
	verb == "events"
	count({p | some p in ["kind", "name"]; params[p]}) == 1
	msg := "name the object the events are about with both kind and name, or neither for the whole namespace"
}

# Secrets are read as names, types and keys, never values (so is any kind
# the policy marks so).
values := "hidden" if object.get(kind, "values", "shown") == "hidden"

else := "shown"

default operation := null

operation := read_operation if verb in read_verbs

operation := change_operation if verb in change_verbs

read_operation := {
	"verb": verb,
	"namespace": data.gateway.scope.target_namespace,
	"group": object.get(kind, "group", ""),
	"resource": object.get(kind, "resource", ""),
	"kind": object.get(kind, "kind", ""),
	"name": object.get(params, "name", ""),
	"container": object.get(params, "container", ""),
	# round(): a whole number the agent wrote as 5.0 is 5, the same
	# under OPA and regorus.
	"tail_lines": round(object.get(params, "tail_lines", cfg.log_tail_lines)),
	"since_seconds": round(object.get(params, "since_seconds", 0)),
	"previous": object.get(params, "previous", false),
	"values": values,
	"result_bytes": cfg.result_bytes,
} if {
	count(data.gateway.tools.violations) == 0
	count(deny) == 0
}

# --- Changes ------------------------------------------------------------------

# What kubectl_change carries out. The object is named by the call (or, for
# an apply, by its manifest); the runner reads the live object, works out
# what to send, and asks the API server's dry run what it would become.
change_operation := {
	"verb": verb,
	"namespace": data.gateway.scope.target_namespace,
	"group": kind.group,
	"version": kind.version,
	"resource": kind.resource,
	"kind": kind.kind,
	"name": object_name,
	"replicas": round(object.get(params, "replicas", -1)),
	"container": object.get(params, "container", ""),
	"image": object.get(params, "image", ""),
	"to_revision": round(object.get(params, "to_revision", 0)),
	"manifest": object.get(params, "manifest", null),
	"result_bytes": cfg.result_bytes,
} if {
	count(data.gateway.tools.violations) == 0
	count(deny) == 0
}

object_name := manifest.metadata.name if verb == "apply"

else := object.get(params, "name", "")

# --- A manifest from the agent is hostile input -------------------------------

# The manifest of an apply, when it is an object (anything else is a param
# violation: YAML text is never taken, so no anchors, aliases or second
# documents can reach the cluster).
manifest := params.manifest if is_object(params.manifest)

# The kinds the tool applies (its manifest param's `kinds`), as defined in
# config/scopes.
apply_kinds := {k | some name in data.gateway.tools.tool.params.manifest.kinds; k := data.config.scopes.kinds[name]}

manifest_kind := k if {
	some k in apply_kinds
	k.kind == manifest.kind
}

# apiVersion as the API server serves the kind: v1, or group/version.
api_version(k) := k.version if k.group == ""

else := concat("/", [k.group, k.version])

deny contains msg if {
	manifest
	not manifest_kind
	msg := sprintf("the manifest's kind %s is not one this tool applies (it applies: %s)", [
		data.gateway.tools.quoted(sprintf("%v", [object.get(manifest, "kind", null)])),
		concat(", ", sort([k.kind | some k in apply_kinds])),
	])
}

deny contains msg if {
	manifest_kind
	object.get(manifest, "apiVersion", null) != api_version(manifest_kind)
	msg := sprintf("the manifest's apiVersion %s does not serve kind %s here (expected %q)", [data.gateway.tools.quoted(sprintf("%v", [object.get(manifest, "apiVersion", null)])), manifest_kind.kind, api_version(manifest_kind)])
}

deny contains msg if {
	manifest
	not valid_name(object.get(object.get(manifest, "metadata", {}), "name", null))
	msg := "the manifest needs metadata.name: a DNS name (lowercase letters, digits, '-' and '.', at most 253 characters)"
}

valid_name(n) if {
	is_string(n)
	not data.gateway.tools.longer_than(n, 253)
	regex.match("^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", n)
}

deny contains "the manifest sets metadata.generateName: name the object instead (a name the server makes up cannot be approved beforehand)" if {
	manifest
	object.get(object.get(manifest, "metadata", {}), "generateName", null) != null
}

deny contains msg if {
	ns := object.get(object.get(manifest, "metadata", {}), "namespace", null)
	ns != null
	ns != params.namespace
	msg := sprintf("the manifest's namespace %s is not the call's (%q): an apply stays in its namespace", [data.gateway.tools.quoted(sprintf("%v", [ns])), params.namespace])
}

# What the server owns, or what would tie the object to another one: the
# runner sets the resourceVersion it planned against itself.
server_owned := ["resourceVersion", "uid", "managedFields", "creationTimestamp", "deletionTimestamp", "generation", "ownerReferences", "selfLink", "finalizers"]

deny contains msg if {
	some field in server_owned
	object.get(object.get(manifest, "metadata", {}), field, null) != null
	msg := sprintf("the manifest sets metadata.%s, which the server keeps (or which would let another object own and delete it, or keep it from being deleted): leave it out", [field])
}

deny contains "the manifest sets status, which the server keeps: leave it out" if {
	object.get(manifest, "status", null) != null
}
