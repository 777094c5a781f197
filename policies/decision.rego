# The decision: the one question the gateway asks at every step of a call.
#
# The gateway evaluates data.gateway.decision with the input described in
# README.md (tool, params, request_id, now, principal, and plan / approval
# once they exist) and expects exactly this object back, every field
# present. Each concern lives in its own file:
#   tools.rego      catalog, params, risk tier, MCP annotations
#   scope.rego      allowlists and the credential to mint
#   signals.rego    destructive signals from the Terraform plan
#   approvals.rego  when a person must approve, how many, for how long
#   sandbox.rego    sandbox limits and egress
#   kubernetes.rego the operation a Kubernetes tool's runner carries out
#   upstreams.rego  the tools of upstream MCP servers, as locked
# Tables live in config/*.yaml.
package gateway


# Deny by default: the call is allowed only when no rule found a reason to
# refuse it.
deny_reasons := ((data.gateway.tools.deny | data.gateway.scope.deny) | data.gateway.kubernetes.deny) | data.gateway.upstreams.deny

decision := {
	"allow": count(deny_reasons) == 0,
	"deny_reasons": sort(deny_reasons),
	"violations": [{"param": t[1], "problem": t[2], "message": t[0]} | some t in sort({[v.message, v.param, v.problem] | some v in data.gateway.tools.violations})],
	"runner": data.gateway.tools.runner,
	"tier": data.gateway.tools.tier,
	"annotations": data.gateway.tools.annotations,
	"credential": data.gateway.scope.credential,
	"sandbox": data.gateway.sandbox.limits,
	"signals": data.gateway.signals.signals,
	"approval": data.gateway.approvals.requirement,
	"operation": operation,
}

# What the tool's runner carries out: an upstream MCP server's call, or a
# Kubernetes tool's operation (null for the others).
operation := data.gateway.upstreams.operation if data.gateway.upstreams.requested

else := data.gateway.kubernetes.operation

# tools/list: the tools this principal may see, by name.
tool_list := data.gateway.tools.visible
