# Destructive signals. data.plans.* are the real plans under
# tests/fixtures/plans (made by scripts/make-plan-fixtures.sh with a real
# Terraform), mounted here through the policy-tests/plans link; the small
# inline plans cover formats and cases a current Terraform cannot produce on
# demand (errored, deferred, old format versions, unknown values).
package gateway_test.signals

import data.gateway.signals

sig(plan) := s if {
	s := signals.signals with input as {"tool": "terraform_apply", "params": {}, "plan": plan}
}

plan_with(changes) := {"format_version": "1.2", "planned_values": {}, "complete": true, "errored": false, "resource_changes": changes}

rc(address, actions, extra) := object.union({"address": address, "change": {"actions": actions}}, extra)

test_real_replace_plan_gives_one_replace_signal if {
	sig(data.plans.replace) == [{
		"address": "terraform_data.web",
		"kind": "replace",
		"actions": ["delete", "create"],
		"reason": "replace_because_cannot_update",
		"paths": [["triggers_replace"]],
		"message": "terraform_data.web will be destroyed and re-created",
	}]
}

test_real_create_before_destroy_replace if {
	[s] := sig(data.plans["replace-create-before-destroy"])
	s.kind == "replace"
	s.actions == ["create", "delete"]
	s.message == "terraform_data.web will be replaced: the new object is created before the old one is destroyed"
}

test_real_replace_by_request if {
	[s] := sig(data.plans["replace-by-request"])
	s.kind == "replace"
	s.reason == "replace_by_request"
	s.address == "terraform_data.db"
}

test_real_delete_of_a_removed_resource if {
	sig(data.plans.delete) == [{
		"address": "terraform_data.db",
		"kind": "delete",
		"actions": ["delete"],
		"reason": "delete_because_no_resource_config",
		"paths": [],
		"message": "terraform_data.db will be destroyed",
	}]
}

test_real_delete_by_count_index if {
	[s] := sig(data.plans["delete-count-index"])
	s.address == "terraform_data.worker[2]"
	s.reason == "delete_because_count_index"
}

test_real_destroy_plan_signals_every_resource if {
	s := sig(data.plans["destroy-all"])
	[x.address | some x in s] == ["terraform_data.db", "terraform_data.web"]
	every x in s {
		x.kind == "delete"
		x.reason == null
	}
}

test_real_forget_is_a_signal if {
	[s] := sig(data.plans.forget)
	s.kind == "forget"
	s.actions == ["forget"]
	s.message == "terraform_data.db will be removed from Terraform state but left running, unmanaged"
}

test_real_plans_without_destruction_have_no_signals if {
	sig(data.plans.create) == []
	sig(data.plans.update) == []
	sig(data.plans["no-changes"]) == []
}

test_real_empty_plan_without_resource_changes_has_no_signals if {
	not data.plans.empty.resource_changes
	sig(data.plans.empty) == []
}

test_real_targeted_plan_is_incomplete if {
	[s] := sig(data.plans["targeted-incomplete"])
	s.kind == "plan-incomplete"
	s.address == ""
}

test_no_plan_no_signals if {
	signals.signals == [] with input as {"tool": "terraform_plan", "params": {}}
}

test_errored_plan_is_a_signal if {
	p := object.union(plan_with([]), {"errored": true})
	[s.kind | some s in sig(p)] == ["plan-errored"]
}

test_deferred_changes_are_a_signal if {
	p := object.union(plan_with([]), {"deferred_changes": [{"reason": "provider_config_unknown", "resource_change": {}}]})
	[s] := sig(p)
	s.kind == "plan-deferred"
	s.message == "the plan defers 1 change(s) to a later run"
}

test_unknown_format_version_is_a_signal if {
	p := object.union(plan_with([]), {"format_version": "2.0"})
	[s.kind | some s in sig(p)] == ["plan-unknown-format"]
}

test_format_0_1_plans_from_terraform_0_12_are_understood if {
	# Terraform 0.12 wrote format 0.1: no action_reason, no complete/errored.
	p := {"format_version": "0.1", "terraform_version": "0.12.31", "planned_values": {}, "resource_changes": [
		rc("aws_instance.a", ["delete", "create"], {}),
		rc("aws_instance.b", ["update"], {}),
		rc("aws_instance.c", ["delete"], {}),
	]}
	[[s.address, s.kind] | some s in sig(p)] == [["aws_instance.a", "replace"], ["aws_instance.c", "delete"]]
}

test_unknown_action_is_a_signal if {
	[s] := sig(plan_with([rc("x.y", ["teleport"], {})]))
	s.kind == "unknown-action"
	s.message == `x.y has actions ["teleport"], which this policy does not know`
}

test_unknown_action_reason_is_a_signal if {
	[s] := sig(plan_with([rc("x.y", ["update"], {"action_reason": "replace_because_moon_phase_x"})]))
	s.kind == "replace"
	[t] := sig(plan_with([rc("x.y", ["update"], {"action_reason": "because_i_said_so"})]))
	t.kind == "unknown-reason"
	t.message == `x.y has action_reason "because_i_said_so", which this policy does not know`
}

test_no_op_with_a_replace_reason_is_still_a_signal if {
	[s] := sig(plan_with([rc("x.y", ["no-op"], {"action_reason": "replace_because_tainted"})]))
	s.kind == "replace"
	s.message == `x.y will be replaced (action_reason replace_because_tainted, actions ["no-op"])`
}

test_no_op_with_a_delete_reason_is_still_a_signal if {
	[s] := sig(plan_with([rc("x.y", ["no-op"], {"action_reason": "delete_because_each_key"})]))
	s.kind == "delete"
	s.message == `x.y carries destructive action_reason delete_because_each_key (actions ["no-op"])`
}

test_read_reasons_are_not_signals if {
	sig(plan_with([rc("data.x.y", ["read"], {"action_reason": "read_because_config_unknown", "mode": "data"})])) == []
}

test_replace_paths_alone_are_a_signal if {
	[s] := sig(plan_with([{"address": "x.y", "change": {"actions": ["update"], "replace_paths": [["name"]]}}]))
	s.kind == "replace"
	s.paths == [["name"]]
}

test_deposed_objects_are_named_apart if {
	[s] := sig(plan_with([rc("x.y", ["delete"], {"deposed": "00a1b2c3"})]))
	s.address == "x.y (deposed object 00a1b2c3)"
	s.message == "x.y (deposed object 00a1b2c3) will be destroyed"
}

test_resource_drift_is_not_a_planned_change if {
	p := object.union(plan_with([]), {"resource_drift": [rc("x.y", ["delete"], {})]})
	sig(p) == []
}

test_malformed_resource_changes_are_a_signal if {
	p := object.union(plan_with([]), {"resource_changes": {"x": 1}})
	"plan-malformed" in {s.kind | some s in sig(p)}
	[t] := sig(plan_with([{"address": "x.y", "change": {}}]))
	t.message == "resource change 0 has no change.actions list"
}

test_signals_are_sorted_and_deterministic if {
	s := sig(plan_with([rc("b.b", ["delete"], {}), rc("a.a", ["delete"], {})]))
	[x.address | some x in s] == ["a.a", "b.b"]
}

# --- Provisioners: apply-time code is a signal ------------------------------

with_config(changes, root_module) := object.union(plan_with(changes), {"configuration": {"root_module": root_module}})

test_a_provisioner_on_a_created_resource_is_a_signal_naming_its_command if {
	plan := with_config([rc("terraform_data.hook", ["create"], {"mode": "managed", "type": "terraform_data", "name": "hook"})], {"resources": [{
		"address": "terraform_data.hook", "mode": "managed", "type": "terraform_data", "name": "hook",
		"provisioners": [{"type": "local-exec", "expressions": {"command": {"constant_value": "terraform destroy -auto-approve"}}}],
	}]})
	sig(plan) == [{
		"address": "terraform_data.hook",
		"kind": "provisioner",
		"actions": [],
		"reason": null,
		"paths": [],
		"message": "terraform_data.hook runs a local-exec provisioner at apply time (command \"terraform destroy -auto-approve\"): code outside the plan, with the apply's credential",
	}]
}

# A provisioner runs only where its resource is created (creation-time) or
# destroyed (destroy-time): an update, a read or a no-op runs none, and a
# signal there is noise that trains approvers to click through.
hook_config := {"resources": [{
	"address": "terraform_data.hook", "mode": "managed", "type": "terraform_data", "name": "hook",
	"provisioners": [{"type": "local-exec", "expressions": {"command": {"constant_value": "./notify.sh"}}}],
}]}

hook_change(actions) := rc("terraform_data.hook", actions, {"mode": "managed", "type": "terraform_data", "name": "hook"})

test_a_provisioner_signals_only_where_its_resource_is_created_or_destroyed if {
	every actions in [["no-op"], ["update"], ["read"]] {
		[x | some x in sig(with_config([hook_change(actions)], hook_config)); x.kind == "provisioner"] == []
	}
	every actions in [["create"], ["delete"], ["delete", "create"], ["create", "delete"]] {
		[x.address | some x in sig(with_config([hook_change(actions)], hook_config)); x.kind == "provisioner"] == ["terraform_data.hook"]
	}
}

# Instances of a module (count, for_each) are the configuration's one
# resource: module.app["blue"].module.inner[0].terraform_data.b is
# module.app.module.inner.terraform_data.b.
test_a_provisioner_in_a_module_instance_follows_that_instances_actions if {
	config := {"module_calls": {"app": {"module": {"module_calls": {"inner": {"module": {"resources": [{
		"address": "terraform_data.b", "mode": "managed", "type": "terraform_data", "name": "b",
		"provisioners": [{"type": "local-exec", "expressions": {}}],
	}]}}}}}}}
	[x | some x in sig(with_config([instance_change(["update"])], config)); x.kind == "provisioner"] == []
	[x.address | some x in sig(with_config([instance_change(["create"])], config)); x.kind == "provisioner"] == ["module.app.module.inner.terraform_data.b"]
}

instance_change(actions) := rc(`module.app["bl]ue"].module.inner[0].terraform_data.b`, actions, {
	"module_address": `module.app["bl]ue"].module.inner[0]`, "mode": "managed", "type": "terraform_data", "name": "b",
})

test_provisioners_in_child_modules_and_of_every_kind_are_signals if {
	plan := with_config([], {"module_calls": {"app": {"module": {
		"resources": [{"address": "null_resource.a", "provisioners": [
			{"type": "remote-exec", "expressions": {"inline": {"constant_value": ["rm -rf /data"]}}},
			{"type": "local-exec", "expressions": {"command": {"references": ["var.cmd"]}}},
		]}],
		"module_calls": {"inner": {"module": {"resources": [{"address": "terraform_data.b", "provisioners": [{"type": "local-exec", "expressions": {}}]}]}}},
	}}}})
	s := sig(plan)
	count(s) == 3
	{x.address | some x in s} == {"module.app.null_resource.a", "module.app.module.inner.terraform_data.b"}
	some a in s
	contains(a.message, "remote-exec provisioner at apply time (inline [\"rm -rf /data\"])")
	some b in s
	contains(b.message, "module.app.null_resource.a runs a local-exec provisioner at apply time (its command is computed at apply time from [\"var.cmd\"])")
}

test_modules_nested_past_the_inspected_depth_are_a_signal if {
	# Nine module calls deep (built from text: a literal this deep is slow to parse).
	nested := json.unmarshal(`{"module_calls": {"a": {"module": {"module_calls": {"b": {"module": {"module_calls": {"c": {"module": {"module_calls": {"d": {"module": {"module_calls": {"e": {"module": {"module_calls": {"f": {"module": {"module_calls": {"g": {"module": {"module_calls": {"h": {"module": {"module_calls": {"i": {"module": {}}}}}}}}}}}}}}}}}}}}}}}}}}}}`)
	s := sig(with_config([], nested))
	[x.kind | some x in s] == ["config-too-deep"]
}

# The approver reads everything that decides what a provisioner runs, not
# only its command: an interpreter can run any file.
test_a_provisioners_interpreter_environment_and_working_dir_are_named if {
	plan := with_config([], {"resources": [{"address": "terraform_data.x", "provisioners": [{"type": "local-exec", "expressions": {
		"command": {"constant_value": "echo hello"},
		"interpreter": {"constant_value": ["/lib64/ld-linux-x86-64.so.2", "./payload.bin"]},
		"environment": {"constant_value": {"LD_PRELOAD": "./x.so"}},
		"working_dir": {"references": ["var.dir"]},
	}}]}, {"address": "terraform_data.y", "provisioners": [{"type": "local-exec", "expressions": {
		"command": {},
		"working_dir": {"constant_value": "\r\u001b[2K"},
		"environment": {},
	}}]}]})
	[s, t] := sig(plan)
	contains(s.message, "(command \"echo hello\"; interpreter [\"/lib64/ld-linux-x86-64.so.2\", \"./payload.bin\"]; environment {\"LD_PRELOAD\": \"./x.so\"}; working_dir computed at apply time from [\"var.dir\"])")
	contains(t.message, "(its command is computed at apply time; environment computed at apply time; working_dir \"\\r\\x1b[2K\")")
}

test_resources_without_provisioners_raise_nothing if {
	plan := with_config([rc("terraform_data.a", ["create"], {})], {"resources": [{"address": "terraform_data.a", "expressions": {}}]})
	sig(plan) == []
}

# An apply whose plan only creates, but with a provisioner, is approved
# under the destructive settings (a reason is required), not the default.
test_a_provisioner_makes_an_apply_need_the_destructive_approval if {
	plan := with_config([rc("terraform_data.hook", ["create"], {"mode": "managed", "type": "terraform_data", "name": "hook"})], {"resources": [{
		"address": "terraform_data.hook",
		"provisioners": [{"type": "local-exec", "expressions": {"command": {"constant_value": "true"}}}],
	}]})
	d := data.gateway.decision with input as {"tool": "terraform_apply", "params": {"working_dir": "terraform/offline-demo"}, "principal": {"client": "c", "os_user": "u"}, "plan": plan}
	d.approval.required
	d.approval.reason_required
	plain := data.gateway.decision with input as {"tool": "terraform_apply", "params": {"working_dir": "terraform/offline-demo"}, "principal": {"client": "c", "os_user": "u"}, "plan": plan_with([rc("terraform_data.hook", ["create"], {})])}
	not plain.approval.reason_required
	some s in d.signals
	s.kind == "provisioner"
}

# --- Configuration the plan's JSON does not show ------------------------------

sig_with_files(plan, files) := s if {
	s := signals.signals with input as {"tool": "terraform_apply", "params": {}, "plan": plan, "plan_config_files": files}
}

test_a_removed_block_with_a_provisioner_is_a_signal if {
	one := {"m-/main.tf": {"removed": {"from": "${terraform_data.x}", "provisioner": {"local-exec": {"command": "rm -rf /"}}}}}
	[s] := sig_with_files(plan_with([]), one)
	s.kind == "config-removed-provisioner"
	startswith(s.message, "\"m-/main.tf\" has a removed block with a provisioner")
	several := {"m-/x.tf.json": {"removed": [{"from": "a.b"}, {"from": "c.d", "provisioner": [{"local-exec": {}}]}]}}
	[j] := sig_with_files(plan_with([]), several)
	j.kind == "config-removed-provisioner"
}

test_actions_and_action_triggers_are_signals if {
	[s] := sig_with_files(plan_with([]), {"m-/a.tf": {"action": {"local_command": {"x": {}}}}})
	s.kind == "config-action"
	files := {"m-/b.tf": {"resource": {"terraform_data": {"a": {"lifecycle": {"action_trigger": {"events": ["${after_create}"]}}}}}}}
	[t] := sig_with_files(plan_with([]), files)
	t.kind == "config-action"
	contains(t.message, "resource terraform_data.a has an action_trigger")
}

test_a_configuration_file_the_gateway_could_not_read_is_a_signal if {
	[s] := sig_with_files(plan_with([]), {"m-/bad.tf": {"gateway_unreadable": "unexpected token"}})
	s.kind == "config-unreadable"
}

test_ordinary_configuration_files_raise_nothing if {
	sig_with_files(plan_with([]), {"m-/main.tf": {"resource": {"terraform_data": {"removed_things": {"input": "provisioner action backend"}}}}}) == []
	sig_with_files(plan_with([]), {"m-/main.tf": {"removed": {"from": "${terraform_data.x}"}}}) == []
}

# --- Calls with nothing to inspect --------------------------------------------

# The rules are skipped only when the input has neither a plan nor plan
# files: either one alone is still read.
test_configuration_files_without_a_plan_are_still_read if {
	files := {"m-/bad.tf": {"gateway_unreadable": "unexpected token"}}
	[s] := signals.signals with input as {"tool": "terraform_apply", "params": {}, "plan_config_files": files}
	s.kind == "config-unreadable"
}

test_an_empty_plan_is_still_read if {
	kinds := {s.kind | some s in signals.signals with input as {"tool": "terraform_apply", "params": {}, "plan": {}}}
	kinds == {"plan-unknown-format"}
}

test_a_call_without_a_plan_has_no_signals_and_skips_the_rules if {
	signals.signals == [] with input as {"tool": "k8s_get_pod_status", "params": {"namespace": "demo-app"}}
	not signals.inspected with input as {"tool": "k8s_get_pod_status", "params": {"namespace": "demo-app"}}
	signals.inspected with input as {"tool": "terraform_apply", "params": {}, "plan": {}}
}
