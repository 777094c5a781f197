# Tool catalog and risk tiers.
#
# A tool exists for the agent only if config/tools/data.yaml lists it. This file
# decides whether the requested tool exists, whether its params are
# acceptable, its risk tier and its MCP annotations.
package gateway.tools

catalog := data.config.tools

# The catalog entry of the requested tool (undefined for an unknown tool).
tool := catalog[input.tool]

# The request's params as sent; a missing params object counts as empty.
raw_params := object.get(input, "params", {})

# The params when they are an object (anything else is refused below).
params := raw_params if is_object(raw_params)

else := {}

# The MCP client making the call ("" when unknown).
client := object.get(object.get(input, "principal", {}), "client", "")

# Unknown tools are treated as the riskiest kind.
default tier := "high"

tier := tool.tier

# Unknown tools get the most cautious annotations.
default annotations := {
	"readOnlyHint": false,
	"destructiveHint": true,
	"idempotentHint": false,
	"openWorldHint": true,
}

annotations := tool.annotations

# A principal may use a tool unless the tool lists its clients and this
# client is not among them.
principal_allowed(entry) if not entry.clients

principal_allowed(entry) if client in entry.clients

# tools/list: every catalog tool this principal may use, by name.
visible[name] := {
	"title": entry.title,
	"description": entry.description,
	"tier": entry.tier,
	"annotations": entry.annotations,
	"params": entry.params,
} if {
	some name, entry in catalog
	principal_allowed(entry)
}

deny contains msg if {
	not tool
	msg := sprintf("unknown tool %q: the policy's tool catalog does not list it", [object.get(input, "tool", "")])
}

deny contains msg if {
	tool
	not principal_allowed(tool)
	msg := sprintf("tool %q is not available to client %q", [input.tool, client])
}

# What is wrong with the call's params, as data: the MCP layer hands these
# to the agent as its validation error (after the request is audited), and
# each also denies the call. `param` is "" for the params as a whole.
violations contains {"param": "", "problem": "not_an_object", "message": "params must be an object"} if {
	tool
	not is_object(raw_params)
}

violations contains {"param": name, "problem": "missing", "message": sprintf("missing required param %q", [name])} if {
	some name, spec in tool.params
	spec.required
	not name in object.keys(params)
}

violations contains {"param": name, "problem": "unknown", "message": sprintf("unknown param %q for tool %q", [name, input.tool])} if {
	tool
	some name, _ in params
	not tool.params[name]
}

violations contains {"param": name, "problem": "not_a_string", "message": sprintf("param %q must be a string", [name])} if {
	some name, value in params
	tool.params[name]
	not is_string(value)
}

violations contains {"param": name, "problem": "too_long", "message": sprintf("param %q is longer than %d characters", [name, tool.params[name].max_length])} if {
	some name, value in params
	is_string(value)
	count(value) > tool.params[name].max_length
}

deny contains v.message if some v in violations
