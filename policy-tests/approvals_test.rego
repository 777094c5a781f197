# When a person must approve, how many, for how long.
package gateway_test.approvals

import data.gateway.approvals

call(tool, params) := {"tool": tool, "params": params, "principal": {"client": "c", "os_user": "u"}}

apply := call("terraform_apply", {"working_dir": "terraform/offline-demo"})

delete_plan := {"format_version": "1.2", "planned_values": {}, "complete": true, "resource_changes": [{
	"address": "terraform_data.db",
	"change": {"actions": ["delete"]},
	"action_reason": "delete_because_no_resource_config",
}]}

create_plan := {"format_version": "1.2", "planned_values": {}, "complete": true, "resource_changes": [{
	"address": "terraform_data.db",
	"change": {"actions": ["create"]},
}]}

test_high_tier_needs_approval_even_for_a_harmless_plan if {
	r := approvals.requirement with input as object.union(apply, {"plan": create_plan})
	r == {"required": true, "approvers": 1, "ttl_seconds": 1800, "reason_required": false, "satisfied": false}
}

test_a_destructive_plan_uses_the_destructive_settings if {
	r := approvals.requirement with input as object.union(apply, {"plan": delete_plan})
	r.required
	r.reason_required
}

test_low_tier_read_only_tools_need_no_approval if {
	r := approvals.requirement with input as call("k8s_get_pod_status", {"namespace": "demo-app"})
	not r.required
	r.satisfied
}

test_signals_on_a_read_only_tool_are_shown_not_gated if {
	r := approvals.requirement with input as object.union(call("terraform_plan", {"working_dir": "terraform/offline-demo"}), {"plan": delete_plan})
	not r.required
}

test_signals_on_a_low_tier_tool_that_changes_things_need_approval if {
	catalog := object.union(data.config.tools, {"terraform_apply": object.union(data.config.tools.terraform_apply, {"tier": "low"})})
	r := approvals.requirement with data.config.tools as catalog with input as object.union(apply, {"plan": delete_plan})
	r.required
	r2 := approvals.requirement with data.config.tools as catalog with input as object.union(apply, {"plan": create_plan})
	not r2.required
}

test_an_approved_approval_satisfies_the_requirement if {
	inp := object.union(apply, {"plan": create_plan, "approval": {"id": "a1", "status": "approved", "approvers": ["bob"]}})
	approvals.requirement.satisfied with input as inp
}

test_a_pending_approval_does_not_satisfy if {
	inp := object.union(apply, {"plan": create_plan, "approval": {"id": "a1", "status": "pending", "approvers": []}})
	not approvals.requirement.satisfied with input as inp
}

test_k_of_n_needs_k_distinct_approvers if {
	cfg := object.union(data.config.approvals, {"standard": {"approvers": 2, "ttl_seconds": 600, "reason_required": false}})
	twice := object.union(apply, {"approval": {"id": "a1", "status": "approved", "approvers": ["bob", "bob"]}})
	not approvals.requirement.satisfied with data.config.approvals as cfg with input as twice
	two := object.union(apply, {"approval": {"id": "a1", "status": "approved", "approvers": ["bob", "carol"]}})
	approvals.requirement.satisfied with data.config.approvals as cfg with input as two
	approvals.requirement.ttl_seconds == 600 with data.config.approvals as cfg with input as two
}

test_through_the_daemon_the_approver_is_a_configured_approver if {
	approvals.approver == "carol" with input as {"os_user": "carol", "uid": 1002, "groups": ["carol", "gateway-approvers"], "channel": "daemon"}
	approvals.approver == "dave" with input as {"os_user": "dave", "uid": 1003, "groups": ["dave"], "channel": "daemon"} with data.config.approvals.identity.users as ["dave"]
}

test_through_the_daemon_any_other_user_may_not_approve if {
	not approvals.approver with input as {"os_user": "alice", "uid": 1001, "groups": ["alice", "gateway"], "channel": "daemon"}
	not approvals.may_approve with input as {"os_user": "alice", "uid": 1001, "groups": ["alice", "gateway"], "channel": "daemon"}
}

test_through_the_daemon_as_is_never_accepted if {
	not approvals.approver with input as {"os_user": "carol", "uid": 1002, "groups": ["gateway-approvers"], "channel": "daemon", "named": "bob"}
}

test_a_direct_command_is_its_users if {
	approvals.approver == "alice" with input as {"os_user": "alice", "uid": 1001, "groups": ["alice"], "channel": "direct"}
}

test_approve_as_is_allowed_directly_by_the_default_configuration if {
	approvals.approver == "bob" with input as {"os_user": "alice", "channel": "direct", "named": "bob"}
}

test_approve_as_is_refused_when_the_configuration_forbids_it if {
	not approvals.approver with input as {"os_user": "alice", "channel": "direct", "named": "bob"} with data.config.approvals.identity.allow_as as false
}

test_the_requesters_own_grant_never_counts if {
	own := object.union(apply, {"plan": create_plan, "approval": {"id": "a1", "status": "approved", "approvers": ["alice"], "requested_by": "alice"}})
	not approvals.requirement.satisfied with input as own
	other := object.union(apply, {"plan": create_plan, "approval": {"id": "a1", "status": "approved", "approvers": ["alice", "bob"], "requested_by": "alice"}})
	approvals.requirement.satisfied with input as other
}

test_operator_commands_are_for_approvers_unless_listed_for_anyone if {
	approver := {"os_user": "carol", "uid": 1002, "groups": ["gateway-approvers"], "channel": "daemon"}
	other := {"os_user": "alice", "uid": 1001, "groups": ["alice"], "channel": "daemon"}
	approvals.may_run with input as object.union(approver, {"command": "audit"})
	approvals.may_run with input as object.union(other, {"command": "approvals"})
	not approvals.may_run with input as object.union(other, {"command": "audit"})
	not approvals.may_run with input as object.union(other, {"command": "vault status"})
	approvals.may_run with input as object.union(other, {"command": "audit"}) with data.config.approvals.identity.anyone as ["approvals", "audit"]
}
