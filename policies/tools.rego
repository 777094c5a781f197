# Tool catalog and risk tiers.
#
# A tool exists for the agent only if config/tools/data.yaml lists it. This file
# decides whether the requested tool exists, whether its params are
# acceptable, its risk tier and its MCP annotations.
package gateway.tools

# The operator's catalog, and the tools of the upstream MCP servers the
# operator locked (upstreams.rego): a name in config/tools wins.
catalog := object.union(data.gateway.upstreams.catalog, data.config.tools)

# The catalog entry of the requested tool (undefined for an unknown tool),
# as `catalog[input.tool]`: an upstream's tool with what config/tools says
# of it merged over it (a tier, say), without building the whole catalog.
tool := merged if {
	u := data.gateway.upstreams.requested_entry
	c := data.config.tools[input.tool]
	merged := object.union(u, c)
} else := c if {
	c := data.config.tools[input.tool]
} else := data.gateway.upstreams.requested_entry

# The catalog entry of tool `name`, as `catalog[name]`.
entry_of(name) := merged if {
	u := data.gateway.upstreams.catalog_entry(name)
	c := data.config.tools[name]
	merged := object.union(u, c)
} else := c if {
	c := data.config.tools[name]
} else := data.gateway.upstreams.catalog_entry(name)

# The request's params as sent; a missing params object counts as empty.
raw_params := object.get(input, "params", {})

# The params when they are an object (anything else is refused below).
params := raw_params if is_object(raw_params)

else := {}

# The MCP client making the call ("" when unknown).
client := object.get(object.get(input, "principal", {}), "client", "")

# The gateway's runner for the tool (null: none; the call is refused).
default runner := null

runner := tool.runner

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

# tools/list: every catalog tool this principal may use, by name, with the
# runner that carries it out (whose result its output schema describes).
visible[name] := {
	"title": entry.title,
	"description": entry.description,
	"tier": entry.tier,
	"runner": entry.runner,
	"task": object.get(entry, "task", false),
	"annotations": entry.annotations,
	"params": {p: shown_param(spec) | some p, spec in entry.params},
	"input_schema": object.get(entry, "input_schema", null),
} if {
	some name, entry in catalog
	principal_allowed(entry)
}

# A param as tools/list shows it: one with `choices` lists the keys of that
# config/scopes table as its allowed values (none when there is no such
# table), so that the agent sees what the policy allows.
shown_param(spec) := object.union(spec, {"enum": sort(object.keys(object.get(data.config.scopes, spec.choices, {})))}) if is_string(spec.choices)

else := object.union(spec, {"enum": spec.choices}) if is_array(spec.choices)

else := spec

# A param's type: string unless its spec says integer or boolean.
param_type(spec) := object.get(spec, "type", "string")

deny contains msg if {
	not tool
	msg := sprintf("unknown tool %s: the policy's tool catalog does not list it", [quoted(object.get(input, "tool", ""))])
}

deny contains msg if {
	tool
	not principal_allowed(tool)
	msg := sprintf("tool %s is not available to client %s", [quoted(input.tool), quoted(client)])
}

# Lengths are in characters (Unicode scalar values), the same under OPA and
# regorus, as in the tools/list schema's maxLength. count() of a string is
# not portable: OPA counts characters, regorus UTF-16 units (at least as
# many, at most twice as many). So count() decides the clear cases under
# both, and characters are counted one by one only in between.
longer_than(s, n) if count(s) > 2 * n

longer_than(s, n) if {
	count(s) > n
	count(s) <= 2 * n
	count(regex.find_n("(?s:.)", s, -1)) > n
}

# A string as a message quotes it: at most 64 characters of it, so that
# what the agent sent is not echoed back (and audited) at any size.
short(s) := s if not longer_than(s, 64)

else := concat("", [substring(s, 0, 64), "…"])

quoted(s) := sprintf("%q", [short(s)])

# Whether a param has a violation (other rules then leave it alone).
violated(name) if {
	some v in violations
	v.param == name
}

# The requested tool when this client may use it: only then are its params
# checked (a tool kept from a client says nothing of its params to it).
usable := tool if principal_allowed(tool)

# What is wrong with the call's params, as data: the MCP layer hands these
# to the agent as its validation error (after the request is audited), and
# each also denies the call. `param` is "" for the params as a whole.
violations contains {"param": "", "problem": "not_an_object", "message": "params must be an object"} if {
	usable
	not is_object(raw_params)
}

violations contains {"param": name, "problem": "missing", "message": sprintf("missing required param %q", [name])} if {
	some name, spec in usable.params
	spec.required
	not name in object.keys(params)
}

violations contains {"param": short(name), "problem": "unknown", "message": sprintf("unknown param %s for tool %s", [quoted(name), quoted(input.tool)])} if {
	usable
	not usable.input_schema
	some name, _ in params
	not usable.params[name]
}

violations contains {"param": name, "problem": "not_a_string", "message": sprintf("param %q must be a string", [name])} if {
	some name, value in params
	param_type(usable.params[name]) == "string"
	not is_string(value)
}

# An integer is a number without a fraction (JSON has no integer type:
# 5.0 is 5, as JSON Schema's "integer" takes it).
violations contains {"param": name, "problem": "not_an_integer", "message": sprintf("param %q must be an integer", [name])} if {
	some name, value in params
	param_type(usable.params[name]) == "integer"
	not is_integer(value)
}

is_integer(v) if {
	is_number(v)
	v == round(v)
}

violations contains {"param": name, "problem": "out_of_range", "message": sprintf("param %q must be %s", [name, range_text(spec)])} if {
	some name, value in params
	spec := usable.params[name]
	param_type(spec) == "integer"
	is_integer(value)
	not within(value, spec)
}

range_text(spec) := sprintf("between %v and %v", [spec.minimum, spec.maximum]) if {
	spec.minimum
	spec.maximum
} else := sprintf("at least %v", [spec.minimum]) if spec.minimum

else := sprintf("at most %v", [spec.maximum])

within(v, spec) if {
	v >= object.get(spec, "minimum", v)
	v <= object.get(spec, "maximum", v)
}

violations contains {"param": name, "problem": "not_an_object", "message": sprintf("param %q must be a JSON object", [name])} if {
	some name, value in params
	param_type(usable.params[name]) == "object"
	not is_object(value)
}

violations contains {"param": name, "problem": "not_a_boolean", "message": sprintf("param %q must be true or false", [name])} if {
	some name, value in params
	param_type(usable.params[name]) == "boolean"
	not is_boolean(value)
}

violations contains {"param": name, "problem": "no_match", "message": sprintf("param %q does not have the form %s", [name, spec.pattern])} if {
	some name, value in params
	spec := usable.params[name]
	is_string(value)
	spec.pattern
	not longer_than(value, spec.max_length)
	not regex.match(spec.pattern, value)
}

# A param whose choices are a list takes only those values.
violations contains {"param": name, "problem": "not_allowed", "message": sprintf("param %q must be one of: %s", [name, concat(", ", spec.choices)])} if {
	some name, value in params
	spec := usable.params[name]
	is_array(spec.choices)
	is_string(value)
	not value in spec.choices
}

violations contains {"param": name, "problem": "too_long", "message": sprintf("param %q is longer than %d characters", [name, usable.params[name].max_length])} if {
	some name, value in params
	is_string(value)
	longer_than(value, usable.params[name].max_length)
}

# A tool with a locked input schema (an upstream MCP server's): the gateway
# checks the arguments against it (a JSON Schema validator) before asking,
# and hands what is wrong as input.schema_violations.
violations contains {"param": v.param, "problem": "schema", "message": v.message} if {
	usable.input_schema
	some v in object.get(input, "schema_violations", [])
}

deny contains v.message if some v in violations
