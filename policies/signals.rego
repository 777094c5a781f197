# Destructive signals, read from the structured Terraform plan
# (input.plan: the output of `terraform show -json PLANFILE`).
#
# A signal is raised for every planned change that deletes, replaces or
# forgets a resource (by its actions, its action_reason or its
# replace_paths), and for every way the plan could be hiding one: an
# incomplete or errored plan, deferred changes, an unknown format version,
# action or action_reason. Each signal names the resource address, the kind,
# the actions, the reason, the replace paths and a one-line message.
#
# Not signals: resource_drift (changes outside Terraform, not planned),
# output_changes, and create/update/read/no-op changes with no destructive
# reason.
package gateway.signals

cfg := data.config.signals

plan := input.plan

# Terraform omits resource_changes when a plan has no resources at all.
raw_changes := object.get(plan, "resource_changes", [])

# The resource changes that are well-formed enough to read; the rest are
# reported as plan-malformed below.
changes := [rc | some rc in raw_changes; is_array(rc.change.actions)] if is_array(raw_changes)

else := []

# Every signal, ordered by address (then kind and message) so that decisions
# are deterministic.
signals := [entry[3] | some entry in sort({[s.address, s.kind, s.message, s] | some s in found})] if inspected

else := []

# Whether the call carries anything the rules read: a plan, the
# configuration files of its plan file, or a Kubernetes change's plan.
# Without any, every rule finds nothing, so none is evaluated (a read's
# decision skips them all).
inspected if {
	_ = input.plan
}

inspected if {
	_ = input.plan_config_files
}

# A Kubernetes change's plan (kubernetes_signals.rego reads it).
inspected if {
	_ = input.kubernetes
}

# A Kubernetes change's signals.
found contains s if {
	some s in data.gateway.kubernetes_signals.found
}

# --- Per-resource signals ---------------------------------------------------

found contains signal if {
	some rc in changes
	# Each field is read once: what kind and message decide from.
	c := {
		"address": address(rc),
		"actions": rc.change.actions,
		"reason": object.get(rc, "action_reason", ""),
		"paths": object.get(rc.change, "replace_paths", []),
	}
	k := kind(c)
	signal := {
		"address": c.address,
		"kind": k,
		"actions": c.actions,
		"reason": object.get(rc, "action_reason", null),
		"paths": c.paths,
		"message": message(k, c),
	}
}

# A deposed object (left over from a create-before-destroy) is named apart
# from the current object at the same address.
address(rc) := sprintf("%s (deposed object %s)", [rc.address, rc.deposed]) if {
	rc.deposed
} else := rc.address

# The kind of a resource change (c: its address, actions, action_reason
# or "", replace_paths), or undefined when it is not destructive. The
# first matching line wins.
kind(c) := "replace" if {
	"delete" in c.actions
	"create" in c.actions
} else := "delete" if {
	"delete" in c.actions
} else := "forget" if {
	"forget" in c.actions
} else := "unknown-action" if {
	some action in c.actions
	not action in cfg.known_actions
} else := "replace" if {
	startswith(c.reason, "replace_")
} else := "delete" if {
	startswith(c.reason, "delete_")
} else := "replace" if {
	count(c.paths) > 0
} else := "unknown-reason" if {
	c.reason != ""
	not c.reason in cfg.known_reasons
}

message(k, c) := sprintf("%s will be destroyed and re-created", [c.address]) if {
	k == "replace"
	c.actions == ["delete", "create"]
} else := sprintf("%s will be replaced: the new object is created before the old one is destroyed", [c.address]) if {
	k == "replace"
	c.actions == ["create", "delete"]
} else := sprintf("%s will be replaced (action_reason %s, actions %v)", [c.address, c.reason, c.actions]) if {
	k == "replace"
} else := sprintf("%s will be destroyed", [c.address]) if {
	k == "delete"
	"delete" in c.actions
} else := sprintf("%s carries destructive action_reason %s (actions %v)", [c.address, c.reason, c.actions]) if {
	k == "delete"
} else := sprintf("%s will be removed from Terraform state but left running, unmanaged", [c.address]) if {
	k == "forget"
} else := sprintf("%s has actions %v, which this policy does not know", [c.address, c.actions]) if {
	k == "unknown-action"
} else := sprintf("%s has action_reason %q, which this policy does not know", [c.address, c.reason])

# --- Plan-level signals: the plan itself cannot be trusted to be complete ---

plan_signal(k, msg) := {
	"address": "",
	"kind": k,
	"actions": [],
	"reason": null,
	"paths": [],
	"message": msg,
}

found contains plan_signal("plan-incomplete", "the plan is not complete: some changes are not planned yet (for example -target was used), so what it destroys is unknown") if {
	plan.complete == false
}

found contains plan_signal("plan-errored", "Terraform reported errors while planning: the plan may be missing changes") if {
	plan.errored == true
}

found contains plan_signal("plan-deferred", sprintf("the plan defers %d change(s) to a later run", [count(plan.deferred_changes)])) if {
	count(plan.deferred_changes) > 0
}

found contains plan_signal("plan-unknown-format", sprintf("plan format_version %q is not one this policy understands", [version])) if {
	version := object.get(plan, "format_version", "")
	not split(version, ".")[0] in cfg.known_format_majors
}

found contains plan_signal("plan-malformed", "the plan's resource_changes is not a list") if {
	plan
	not is_array(raw_changes)
}

found contains plan_signal("plan-malformed", sprintf("resource change %d has no change.actions list", [i])) if {
	is_array(raw_changes)
	some i, rc in raw_changes
	not has_actions_list(rc)
}

# Through a function, not `not is_array(rc.change.actions)`: OPA makes a
# negated built-in call with an undefined argument fail instead of succeed
# (regorus does not), and the signal must be raised under both.
has_actions_list(rc) if is_array(rc.change.actions)

# --- Apply-time code: provisioners ------------------------------------------

# A provisioner runs a command when its resource is created (a creation-time
# one) or destroyed (`when = destroy`), with the apply's credential: whatever
# it does is not in the plan's resource changes. A provisioner in the
# configuration, in child modules too, is a signal that names the resource,
# the provisioner and its command, when the plan creates or deletes an
# instance of its resource (a replace does both). On an update, a read or a
# no-op nothing runs, and a signal there would teach approvers to click
# through. The plan's JSON does not say which provisioners are destroy-time,
# so either action counts for both; a resource the plan does not mention at
# all keeps its signal (fail closed).
found contains signal if {
	some m in config_modules
	some resource in object.get(m.module, "resources", [])
	some p in object.get(resource, "provisioners", [])
	addr := concat("", [m.prefix, resource.address])
	provisioners_may_run(addr)
	signal := {
		"address": addr,
		"kind": "provisioner",
		"actions": [],
		"reason": null,
		"paths": [],
		"message": sprintf("%s runs a %s provisioner at apply time (%s): code outside the plan, with the apply's credential", [addr, p.type, provisioner_detail(p)]),
	}
}

# Whether the apply creates or deletes an instance of the configuration's
# resource `addr` (`module.a.type.name`), or the plan does not mention it.
provisioners_may_run(addr) if {
	some rc in changes
	rc.mode == "managed"
	config_address(rc) == addr
	some action in rc.change.actions
	action in {"create", "delete"}
}

provisioners_may_run(addr) if not planned(addr)

planned(addr) if {
	some rc in changes
	rc.mode == "managed"
	config_address(rc) == addr
}

# A resource change's address in the configuration: its module path without
# instance keys (`module.a["x"].module.b[0]` => `module.a.module.b`), then
# its type and name.
config_address(rc) := concat(".", [module_path(rc), rc.type, rc.name]) if {
	object.get(rc, "module_address", "") != ""
} else := concat(".", [rc.type, rc.name])

module_path(rc) := regex.replace(rc.module_address, `\[("([^"\\]|\\.)*"|[0-9]+)\]`, "")

# The configuration's modules with the address prefix of each ("" for the
# root, "module.a.module.b." below), to a depth of config_depth module
# calls (Rego has no recursion); deeper nesting is itself a signal.
config_depth := 8

config_level(parents) := [{"prefix": sprintf("%smodule.%s.", [l.prefix, name]), "module": object.get(call, "module", {})} |
	some l in parents
	some name, call in object.get(l.module, "module_calls", {})
]

config_levels := [l0, l1, l2, l3, l4, l5, l6, l7, l8] if {
	l0 := [{"prefix": "", "module": object.get(object.get(plan, "configuration", {}), "root_module", {})}]
	l1 := config_level(l0)
	l2 := config_level(l1)
	l3 := config_level(l2)
	l4 := config_level(l3)
	l5 := config_level(l4)
	l6 := config_level(l5)
	l7 := config_level(l6)
	l8 := config_level(l7)
}

config_modules := [m | some level in config_levels; some m in level]

found contains plan_signal("config-too-deep", sprintf("modules nest deeper than %d calls: apply-time code below that depth is not inspected", [config_depth])) if {
	count(config_level(config_levels[config_depth])) > 0
}

# What a provisioner will run, in words: its command, and whatever else
# decides what runs (an interpreter, the environment, the working dir).
provisioner_detail(p) := concat("; ", array.concat(command_part(p), [sprintf("%s %s", [k, expression_text(p.expressions[k])]) |
	some k in ["interpreter", "environment", "working_dir"]
	p.expressions[k]
]))

command_part(p) := [sprintf("command %q", [p.expressions.command.constant_value])] if {
	is_string(p.expressions.command.constant_value)
} else := [sprintf("inline %v", [p.expressions.inline.constant_value])] if {
	is_array(p.expressions.inline.constant_value)
} else := [sprintf("its command is computed at apply time from %v", [p.expressions.command.references])] if {
	is_array(p.expressions.command.references)
} else := ["its command is computed at apply time"]

# A string is quoted (control characters escaped), other values shown as
# data; an expression names what it is computed from.
expression_text(e) := sprintf("%q", [e.constant_value]) if {
	is_string(e.constant_value)
} else := sprintf("%v", [e.constant_value]) if {
	"constant_value" in object.keys(e)
} else := sprintf("computed at apply time from %v", [e.references]) if {
	is_array(e.references)
} else := "computed at apply time"

# --- Apply-time code the plan's JSON does not show ---------------------------

# The configuration files the saved plan file carries, parsed by the
# gateway from the plan file itself (the bytes the approval is bound to):
# each file's body as data, blocks as objects, repeated blocks as arrays;
# {"gateway_unreadable": reason} for a file that did not parse.
config_bodies := object.get(input, "plan_config_files", {})

# A block, or a list of them, as a list.
as_list(x) := x if is_array(x)

else := [x]

# A removed block's destroy-time provisioner runs at apply time and is not
# in the plan's `configuration`.
found contains plan_signal("config-removed-provisioner", sprintf("%q has a removed block with a provisioner: it runs at apply time and is not shown in the plan's changes", [path])) if {
	some path, body in config_bodies
	some b in as_list(object.get(body, "removed", []))
	is_object(b)
	"provisioner" in object.keys(b)
}

# Provider actions run at apply time outside the planned resource changes.
found contains plan_signal("config-action", sprintf("%q declares an action: provider actions run at apply time outside the planned changes", [path])) if {
	some path, body in config_bodies
	"action" in object.keys(body)
}

found contains plan_signal("config-action", sprintf("%q: resource %s.%s has an action_trigger: provider actions run at apply time outside the planned changes", [path, type, name])) if {
	some path, body in config_bodies
	some block in as_list(object.get(body, "resource", {}))
	some type, named in block
	some names in as_list(named)
	some name, resources in names
	some r in as_list(resources)
	some l in as_list(object.get(r, "lifecycle", []))
	is_object(l)
	"action_trigger" in object.keys(l)
}

# A file the gateway could not read may hide any of the above.
found contains plan_signal("config-unreadable", sprintf("%q could not be read (%s): what it runs at apply time is unknown", [path, body.gateway_unreadable])) if {
	some path, body in config_bodies
	is_string(body.gateway_unreadable)
}
