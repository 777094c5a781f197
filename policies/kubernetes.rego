# The Kubernetes toolbox: the exact operation the kubectl_read runner
# carries out, from the tool's catalog entry (`kubernetes.verb`, the kinds
# its `kind` param lists) and the call's params. The runner runs this
# operation and nothing else: the namespace is the one the credential is
# scoped to, the kind is resolved here from config/scopes `kinds`, never
# taken as the agent wrote it.
package gateway.kubernetes

import data.gateway.tools

params := tools.params

cfg := data.config.kubernetes

# The verbs kubectl_read carries out.
verbs := {"get", "describe", "logs", "events", "rollout_status", "rollout_history"}

# The tool's kubectl verb (undefined for a tool that is not a Kubernetes read).
verb := tools.tool.kubernetes.verb

deny contains msg if {
	tools.tool.kubernetes
	not verb in verbs
	msg := sprintf("the catalog gives tool %s the kubernetes verb %s, which kubectl_read does not have (it has: %s)", [tools.quoted(input.tool), tools.quoted(sprintf("%v", [object.get(tools.tool.kubernetes, "verb", null)])), concat(", ", sort(verbs))])
}

deny contains msg if {
	tools.tool.kubernetes
	tools.tool.scope != "namespace"
	msg := sprintf("tool %s is a Kubernetes tool but its scope is not `namespace`", [tools.quoted(input.tool)])
}

# The kind the call names, as config/scopes defines it ({} when it names
# none: the events of a whole namespace; a log is always a pod's).
kind := k if {
	k := data.config.scopes.kinds[params.kind]
} else := data.config.scopes.kinds.pods if {
	verb == "logs"
} else := {}

deny contains msg if {
	tools.tool.kubernetes
	is_string(params.kind)
	not tools.violated("kind")
	not data.config.scopes.kinds[params.kind]
	msg := sprintf("kind %s is not defined in config/scopes (kinds)", [tools.quoted(params.kind)])
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

operation := {
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
	verb in verbs
	count(tools.violations) == 0
	count(deny) == 0
}
