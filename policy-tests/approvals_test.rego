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

key(name) := {"name": name, "kind": "ssh_key", "os_user": "alice", "key": {"fingerprint": "SHA256:x", "type": "ssh-ed25519", "principals": [name]}}

user(name, groups) := {"name": name, "kind": "os_user", "os_user": name, "groups": groups}

presented(status, ids) := object.union(apply, {"plan": create_plan, "approval": {"id": "a1", "status": status, "requested_by": "u", "identities": ids}})

test_an_approved_approval_satisfies_the_requirement if {
	approvals.requirement.satisfied with input as presented("approved", [key("bob")])
	approvals.requirement.satisfied with input as presented("approved", [user("carol", ["carol", "gateway-approvers"])])
}

test_a_pending_approval_does_not_satisfy if {
	not approvals.requirement.satisfied with input as presented("pending", [])
}

test_k_of_n_needs_k_distinct_identities if {
	cfg := object.union(data.config.approvals, {"standard": {"approvers": 2, "ttl_seconds": 600, "reason_required": false}})
	not approvals.requirement.satisfied with data.config.approvals as cfg with input as presented("approved", [key("bob"), key("bob")])
	not approvals.requirement.satisfied with data.config.approvals as cfg with input as presented("approved", [key("bob"), user("bob", ["gateway-approvers"])])
	approvals.requirement.satisfied with data.config.approvals as cfg with input as presented("approved", [key("bob"), key("carol")])
	approvals.requirement.ttl_seconds == 600 with data.config.approvals as cfg with input as presented("approved", [key("bob"), key("carol")])
}

test_unproven_and_unadmitted_identities_never_count if {
	not approvals.requirement.satisfied with input as presented("approved", [{"name": "bob", "kind": "legacy"}])
	not approvals.requirement.satisfied with input as presented("approved", [user("dave", ["dave"])])
	not approvals.requirement.satisfied with input as presented("approved", [key("bob")]) with data.config.approvals.identity.keys as false
	approvals.requirement.satisfied with input as presented("approved", [user("dave", ["dave"])]) with data.config.approvals.identity.users as ["dave"]
}

test_the_requesters_own_grant_never_counts if {
	not approvals.requirement.satisfied with input as presented("approved", [key("u")])
	not approvals.requirement.satisfied with input as presented("approved", [user("u", ["gateway-approvers"])])
	approvals.requirement.satisfied with input as presented("approved", [key("u"), key("bob")])
}

test_a_scope_limits_what_an_identity_approves if {
	only_k8s := {"bob": {"tools": ["k8s_get_pod_status"]}}
	not approvals.requirement.satisfied with input as presented("approved", [key("bob")]) with data.config.approvals.identity.scopes as only_k8s
	offline := {"bob": {"modules": ["terraform/offline-demo"], "tiers": ["high"]}}
	approvals.requirement.satisfied with input as presented("approved", [key("bob")]) with data.config.approvals.identity.scopes as offline
	no_deletes := {"bob": {"signal_kinds": ["replace"]}}
	approvals.requirement.satisfied with input as presented("approved", [key("bob")]) with data.config.approvals.identity.scopes as no_deletes
	deleting := object.union(presented("approved", [key("bob")]), {"plan": delete_plan})
	not approvals.requirement.satisfied with input as deleting with data.config.approvals.identity.scopes as no_deletes
}

stored := {"id": "a1", "tool": "terraform_apply", "params": {"working_dir": "terraform/k8s-demo"}, "requested_by": "alice", "signals": [{"kind": "delete"}], "verdicts": []}

judged(verdict, who, approval) := r if {
	r := approvals.verdict with input as {"verdict": verdict, "approver": who, "approval": approval}
}

test_an_allowed_key_may_approve if {
	judged("grant", key("bob"), stored) == {"allow": true, "reasons": []}
}

test_the_requester_cannot_approve_its_own_call_by_any_identity if {
	r := judged("grant", key("alice"), stored)
	not r.allow
	contains(r.reasons[0], "alice requested this call and cannot approve it")
	not judged("grant", user("alice", ["gateway-approvers"]), stored).allow
}

test_the_requester_may_withdraw_its_own_call if {
	judged("deny", user("alice", ["alice"]), stored).allow
	not judged("deny", user("eve", ["eve"]), stored).allow
}

test_one_identity_approves_once if {
	again := object.union(stored, {"verdicts": [{"approver": "bob", "verdict": "grant"}]})
	r := judged("grant", key("bob"), again)
	r.reasons == ["bob already approved a1; it needs approvals from other people"]
	judged("grant", key("carol"), again).allow
}

test_only_admitted_identities_decide if {
	r := judged("grant", user("dave", ["dave"]), stored)
	contains(r.reasons[0], "dave (os_user) is not an approver")
	judged("grant", user("carol", ["carol", "gateway-approvers"]), stored).allow
	not judged("grant", key("bob"), stored).allow with data.config.approvals.identity.keys as false
	not judged("grant", {"name": "bob", "kind": "legacy"}, stored).allow
}

test_a_scope_limits_verdicts_by_namespace_and_signal_kind if {
	judged("grant", key("bob"), stored).allow with data.config.approvals.identity.scopes as {"bob": {"namespaces": ["demo-app"]}}
	r := judged("grant", key("bob"), stored) with data.config.approvals.identity.scopes as {"bob": {"namespaces": ["prod"]}}
	contains(r.reasons[0], "outside its scope")
	not judged("grant", key("bob"), stored).allow with data.config.approvals.identity.scopes as {"bob": {"signal_kinds": ["replace"]}}
}

test_who_may_read_everything_is_the_configured_users_and_groups if {
	approvals.may_approve with input as {"os_user": "carol", "uid": 1002, "groups": ["carol", "gateway-approvers"], "channel": "daemon"}
	approvals.may_approve with input as {"os_user": "dave", "uid": 1003, "groups": ["dave"], "channel": "daemon"} with data.config.approvals.identity.users as ["dave"]
	not approvals.may_approve with input as {"os_user": "alice", "uid": 1001, "groups": ["alice", "gateway"], "channel": "daemon"}
	approvals.may_approve with input as {"os_user": "alice", "uid": 1001, "groups": ["alice"], "channel": "direct"}
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

test_signers_and_notifiers_come_from_data if {
	approvals.allowed_signers == "" with data.config.approvers as {}
	approvals.allowed_signers == "bob ssh-ed25519 AAAA" with data.config.approvers.allowed_signers as "bob ssh-ed25519 AAAA"
	approvals.notifiers == []
	approvals.notifiers == [{"webhook": "http://x", "timeout_seconds": 10}] with data.config.approvals.notifiers as [{"webhook": "http://x"}]
	approvals.notifiers == [{"command": ["x"], "timeout_seconds": 2}] with data.config.approvals.notifiers as [{"command": ["x"], "timeout_seconds": 2}]
}

test_a_key_listing_the_requester_among_its_principals_is_the_requesters_own if {
	shared := {"name": "operator", "kind": "ssh_key", "os_user": "u", "key": {"fingerprint": "SHA256:x", "type": "ssh-ed25519", "principals": ["operator", "u"]}}
	not approvals.requirement.satisfied with input as presented("approved", [shared])
	r := judged("grant", object.union(shared, {"key": {"principals": ["operator", "alice"]}}), stored)
	contains(r.reasons[0], "alice requested this call")
}

test_one_person_with_a_key_and_an_account_counts_once if {
	cfg := object.union(data.config.approvals, {"standard": {"approvers": 2, "ttl_seconds": 600, "reason_required": false}})
	carol_key := {"name": "operator", "kind": "ssh_key", "os_user": "carol", "key": {"fingerprint": "SHA256:x", "type": "ssh-ed25519", "principals": ["operator"]}}
	carol := user("carol", ["carol", "gateway-approvers"])
	not approvals.requirement.satisfied with data.config.approvals as cfg with input as presented("approved", [carol, carol_key])
	approvals.requirement.satisfied with data.config.approvals as cfg with input as presented("approved", [carol, key("bob")])
	after_key := object.union(stored, {"verdicts": [{"approver": "operator", "verdict": "grant", "kind": "ssh_key", "os_user": "carol"}]})
	contains(judged("grant", carol, after_key).reasons[0], "carol already submitted a grant")
	after_self := object.union(stored, {"verdicts": [{"approver": "carol", "verdict": "grant", "kind": "os_user", "os_user": "carol"}]})
	contains(judged("grant", carol_key, after_self).reasons[0], "carol already approved a1 as itself")
	judged("grant", key("bob"), after_self).allow
}

test_owners_tie_a_key_to_its_holders_account if {
	cfg := object.union(data.config.approvals, {"standard": {"approvers": 2, "ttl_seconds": 600, "reason_required": false}})
	owned := object.union(cfg, {"identity": object.union(cfg.identity, {"owners": {"bobkey": "bob"}})})
	bob_key := {"name": "bobkey", "kind": "ssh_key", "os_user": "alice", "key": {"fingerprint": "SHA256:x", "type": "ssh-ed25519", "principals": ["bobkey"]}}
	bob := user("bob", ["bob", "gateway-approvers"])
	approvals.requirement.satisfied with data.config.approvals as cfg with input as presented("approved", [bob, bob_key])
	not approvals.requirement.satisfied with data.config.approvals as owned with input as presented("approved", [bob, bob_key])
	after := object.union(stored, {"verdicts": [{"approver": "bob", "verdict": "grant", "kind": "os_user", "os_user": "bob"}]})
	contains(judged("grant", bob_key, after).reasons[0], "bob already approved") with data.config.approvals as owned
	alices := object.union(data.config.approvals.identity, {"owners": {"bobkey": "alice"}})
	not judged("grant", bob_key, stored).allow with data.config.approvals.identity as alices
}

test_a_signers_grant_that_does_not_count_does_not_swallow_its_submitters if {
	carol_key := {"name": "operator", "kind": "ssh_key", "os_user": "carol", "key": {"fingerprint": "SHA256:x", "type": "ssh-ed25519", "principals": ["operator"]}}
	carol := user("carol", ["carol", "gateway-approvers"])
	approvals.requirement.satisfied with input as presented("approved", [carol, carol_key]) with data.config.approvals.identity.keys as false
}

sso_approval(approver) := {
	"id": "ap-sso", "tool": "terraform_apply", "params": {"working_dir": "terraform/offline-demo"},
	"requested_by": "sso:https://idp.example#00u1abc", "signals": [], "verdicts": [], "state": "pending",
	"requester": {"kind": "sso", "user": "alice@example.com", "email": "alice@example.com", "issuer": "https://idp.example", "subject": "00u1abc"},
}

os_approver(name) := {"name": name, "kind": "os_user", "os_user": name, "groups": [name, "gateway-approvers"]}

test_an_sso_requester_never_approves_its_own_call_as_its_os_user if {
	# alice requested over HTTPS as alice@example.com; her OS user alice
	# (an approver) is taken to be her.
	r := approvals.verdict with input as {"verdict": "grant", "channel": "daemon", "approver": os_approver("alice"), "approval": sso_approval("alice")}
	not r.allow
	contains(r.reasons[0], "requested this call and cannot approve it")
	# Another person may.
	approvals.verdict.allow with input as {"verdict": "grant", "channel": "daemon", "approver": os_approver("carol"), "approval": sso_approval("carol")}
}

test_an_sso_requester_linked_by_sso_people_is_refused_under_any_os_name if {
	r := approvals.verdict with input as {"verdict": "grant", "channel": "daemon", "approver": os_approver("al"), "approval": sso_approval("al")}
		with data.config.approvals.identity.sso_people as {"alice@example.com": "al"}
	not r.allow
	approvals.verdict.allow with input as {"verdict": "grant", "channel": "daemon", "approver": os_approver("al"), "approval": sso_approval("al")}
}

test_an_sso_requester_may_withdraw_its_call_as_its_os_user if {
	approvals.verdict.allow with input as {"verdict": "deny", "channel": "daemon", "approver": {"name": "alice", "kind": "os_user", "os_user": "alice", "groups": ["alice"]}, "approval": sso_approval("alice")}
}

test_a_key_under_the_sso_requesters_email_does_not_count if {
	key := {"name": "alice@example.com", "kind": "ssh_key", "os_user": "bob", "key": {"principals": ["alice@example.com"], "fingerprint": "SHA256:x", "type": "ssh-ed25519"}}
	r := approvals.verdict with input as {"verdict": "grant", "channel": "daemon", "approver": key, "approval": sso_approval("x")}
	not r.allow
}

sso_approver(name, email, groups) := {
	"name": name, "kind": "sso", "os_user": "", "id": sprintf("sso:https://idp.example#%s", [name]),
	"issuer": "https://idp.example", "subject": name, "email": email, "groups": groups,
	"client_id": "gateway-cli",
}

test_an_sso_approver_is_admitted_by_its_own_lists_only if {
	bob := sso_approver("bob@example.com", "bob@example.com", ["gateway-approvers"])
	# An IdP group named like the OS approvers' group is not that group.
	r := approvals.verdict with input as {"verdict": "grant", "channel": "http", "approver": bob, "approval": sso_approval("x")}
	not r.allow
	approvals.verdict.allow with input as {"verdict": "grant", "channel": "http", "approver": bob, "approval": sso_approval("x")}
		with data.config.approvals.identity.sso_groups as ["gateway-approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	approvals.verdict.allow with input as {"verdict": "grant", "channel": "http", "approver": bob, "approval": sso_approval("x")}
		with data.config.approvals.identity.sso_users as ["bob@example.com"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
}

test_an_sso_approver_never_approves_a_call_of_its_own_under_any_name if {
	# alice over SSO, her own call (requested over SSO, or as OS user alice).
	alice := sso_approver("alice@example.com", "alice@example.com", ["approvers"])
	mine := object.union(sso_approval("x"), {"requested_by": "sso:https://idp.example#alice@example.com"})
	r := approvals.verdict with input as {"verdict": "grant", "channel": "http", "approver": alice, "approval": mine}
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	contains(r.reasons[0], "cannot approve it")
	os_call := object.union(stored, {"requested_by": "alice", "requester": null})
	r2 := approvals.verdict with input as {"verdict": "grant", "channel": "http", "approver": alice, "approval": os_call}
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	contains(concat(" ", r2.reasons), "cannot approve it")
	# Named in sso_people: the OS user it also is.
	al := sso_approver("al@corp.example", "al@corp.example", ["approvers"])
	r3 := approvals.verdict with input as {"verdict": "grant", "channel": "http", "approver": al, "approval": os_call}
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
		with data.config.approvals.identity.sso_people as {"al@corp.example": "alice"}
	contains(concat(" ", r3.reasons), "cannot approve it")
}

test_an_sso_caller_may_approve_by_its_own_lists if {
	approvals.may_approve with input as {"kind": "sso", "user": "bob@example.com", "groups": ["approvers"], "channel": "http", "client_id": "gateway-cli"}
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	approvals.may_approve with input as {"kind": "sso", "user": "bob@example.com", "groups": [], "channel": "http", "client_id": "gateway-cli"}
		with data.config.approvals.identity.sso_users as ["bob@example.com"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	# An agent's token (another client) is no approver's.
	not approvals.may_approve with input as {"kind": "sso", "user": "bob@example.com", "groups": ["approvers"], "channel": "http", "client_id": "claude-code"}
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	not approvals.may_approve with input as {"kind": "sso", "user": "bob@example.com", "os_user": "bob", "groups": ["gateway-approvers"], "channel": "http"}
		with data.config.approvals.identity.users as ["bob"]
}

test_an_agents_mcp_token_never_approves_even_its_approvers if {
	bob := object.union(sso_approver("bob@example.com", "bob@example.com", ["approvers"]), {"client_id": "agent-cli"})
	r := approvals.verdict with input as {"verdict": "grant", "channel": "http", "approver": bob, "approval": sso_approval("x")}
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	not r.allow
	contains(r.reasons[0], "is not an approver")
}

test_one_person_over_the_socket_and_over_sso_counts_once if {
	# bob granted as OS user bob and again as bob@corp.example over HTTPS.
	ids := [
		{"name": "bob", "kind": "os_user", "os_user": "bob", "groups": ["gateway-approvers"]},
		object.union(sso_approver("bob@corp.example", "bob@corp.example", ["approvers"]), {}),
	]
	a := {"id": "a1", "status": "approved", "requested_by": "alice", "identities": ids}
	c := {"tool": "terraform_apply", "params": {"working_dir": "terraform/offline-demo"}, "principal": {"client": "c", "os_user": "alice"}, "approval": a}
	approvals.approvers == {"bob"} with input as c
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	# Named otherwise, sso_people says who it is.
	ids2 := [ids[0], object.union(sso_approver("rob@corp.example", "rob@corp.example", ["approvers"]), {})]
	approvals.approvers == {"bob"} with input as object.union(c, {"approval": object.union(a, {"identities": ids2})})
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
		with data.config.approvals.identity.sso_people as {"rob@corp.example": "bob"}
}

test_over_https_anyone_lists_only_their_own_and_runs_nothing_else if {
	approvals.may_run with input as {"kind": "sso", "user": "carol@example.com", "groups": [], "channel": "http", "command": "approvals"}
	not approvals.may_run with input as {"kind": "sso", "user": "carol@example.com", "groups": [], "channel": "http", "command": "audit"}
		with data.config.approvals.identity.anyone as ["approvals", "audit"]
}

passkey_approver(name) := {"name": name, "kind": "passkey", "os_user": "", "key": {"fingerprint": "webauthn:AAAA", "type": "webauthn", "principals": [name], "user_presence": true}}

destructive_sso_approval := object.union(sso_approval("x"), {"signals": [{"address": "terraform_data.web", "kind": "replace", "actions": ["delete", "create"], "reason": null, "paths": [], "message": "replaced"}]})

test_a_token_alone_does_not_grant_a_destructive_change if {
	bob := sso_approver("bob@example.com", "bob@example.com", ["approvers"])
	r := approvals.verdict with input as {"verdict": "grant", "channel": "http", "approver": bob, "approval": destructive_sso_approval}
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	not r.allow
	contains(concat(" ", r.reasons), "approve it with a passkey")
	# Unless the policy says tokens may.
	approvals.verdict.allow with input as {"verdict": "grant", "channel": "http", "approver": bob, "approval": destructive_sso_approval}
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
		with data.config.approvals.identity.sso_destructive as true
	# A non-destructive one, a token grants.
	approvals.verdict.allow with input as {"verdict": "grant", "channel": "http", "approver": bob, "approval": sso_approval("x")}
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	# A passkey grants it.
	approvals.verdict.allow with input as {"verdict": "grant", "channel": "web", "approver": passkey_approver("bob"), "approval": destructive_sso_approval}
}

test_a_token_grant_counts_nothing_when_the_recorded_plan_was_destructive if {
	# The saved plan no longer reads (no signals now): what the approvers
	# were shown still makes it destructive.
	bob := sso_approver("bob@example.com", "bob@example.com", ["approvers"])
	sigs := [{"address": "terraform_data.web", "kind": "replace", "actions": ["delete", "create"], "reason": null, "paths": [], "message": "replaced"}]
	not approvals.counts(bob) with input as {"tool": "terraform_apply", "params": {"working_dir": "terraform/offline-demo"}, "approval": object.union(sso_approval("x"), {"signals": sigs})}
		with data.gateway.signals.signals as []
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	# With no signal now or recorded, the same token grant counts.
	approvals.counts(bob) with input as {"tool": "terraform_apply", "params": {"working_dir": "terraform/offline-demo"}, "approval": object.union(sso_approval("x"), {"signals": []})}
		with data.gateway.signals.signals as []
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
}

test_an_owned_passkey_never_approves_its_owners_calls if {
	r := approvals.verdict with input as {"verdict": "grant", "channel": "web", "approver": passkey_approver("alice-phone"), "approval": object.union(stored, {"requested_by": "alice"})}
		with data.config.approvals.identity.owners as {"alice-phone": "alice"}
	not r.allow
	contains(concat(" ", r.reasons), "cannot approve it")
}

test_a_token_grant_of_a_destructive_change_does_not_count_at_the_spend if {
	bob := sso_approver("bob@example.com", "bob@example.com", ["approvers"])
	sigs := [{"address": "terraform_data.web", "kind": "replace", "actions": ["delete", "create"], "reason": null, "paths": [], "message": "replaced"}]
	not approvals.counts(bob) with input as {"tool": "terraform_apply", "params": {"working_dir": "terraform/offline-demo"}, "approval": sso_approval("x")}
		with data.gateway.signals.signals as sigs
		with data.config.approvals.identity.sso_groups as ["approvers"]
		with data.config.approvals.identity.sso_clients as ["gateway-cli"]
	approvals.counts(passkey_approver("bob")) with input as {"tool": "terraform_apply", "params": {"working_dir": "terraform/offline-demo"}, "approval": sso_approval("x")}
		with data.gateway.signals.signals as sigs
}

test_a_passkey_is_its_listed_names_and_never_the_requesters if {
	# Listed under the requester's name: the requester's own passkey.
	r := approvals.verdict with input as {"verdict": "grant", "channel": "web", "approver": passkey_approver("alice"), "approval": object.union(stored, {"requested_by": "alice"})}
	not r.allow
	contains(r.reasons[0], "cannot approve it")
	# Off: not an approver.
	r2 := approvals.verdict with input as {"verdict": "grant", "channel": "web", "approver": passkey_approver("bob"), "approval": stored}
		with data.config.approvals.identity.passkeys as false
	contains(r2.reasons[0], "passkey approvals are off")
	# A page session may read every approval when passkeys are on.
	approvals.may_approve with input as {"kind": "passkey", "user": "bob", "groups": [], "channel": "web", "command": "approvals"}
	not approvals.may_approve with input as {"kind": "passkey", "user": "bob", "groups": [], "channel": "web", "command": "approvals"}
		with data.config.approvals.identity.passkeys as false
	# One person's key and passkey count once (owners).
	approvals.person(passkey_approver("bob-phone")) == "bob" with data.config.approvals.identity.owners as {"bob-phone": "bob"}
}
