package gateway_test.calls

import data.gateway.calls

call(bytes, user, total, minute) := {
	"tool": "k8s_get_pod_status", "client": "test", "kind": "os_user", "user": "alice", "os_user": "alice", "uid": 1001, "groups": ["alice"],
	"params_bytes": bytes, "running": {"user": user, "total": total}, "last_minute": {"user": minute},
}

test_a_small_call_below_every_limit_is_admitted if {
	calls.verdict == {"admit": true, "reasons": [], "event_bytes": 65536, "plan_retention_seconds": 86400} with input as call(100, 0, 0, 0)
	calls.verdict.admit with input as call(262144, 3, 7, 59)
}

test_large_arguments_are_refused_with_their_size if {
	calls.verdict.reasons == ["the call's arguments are 262145 bytes, more than the 262144 allowed (data.config.calls.params_bytes)"] with input as call(262145, 0, 0, 0)
	not calls.verdict.admit with input as call(262145, 0, 0, 0)
}

test_a_user_at_their_running_limit_waits if {
	calls.verdict.reasons == ["alice already has 4 call(s) running, the most allowed at once (data.config.calls.running_per_user); wait for one to finish"] with input as call(10, 4, 4, 4)
	not calls.verdict.admit with input as call(10, 4, 4, 4)
}

test_the_gateway_at_its_total_refuses_everyone if {
	calls.verdict.reasons == ["the gateway already runs 8 calls, the most allowed at once (data.config.calls.running_total); try again shortly"] with input as call(10, 0, 8, 0)
	not calls.verdict.admit with input as call(10, 0, 8, 0)
}

test_a_user_over_the_rate_is_refused if {
	calls.verdict.reasons == ["alice made 60 calls in the last minute, the most allowed (data.config.calls.per_minute_per_user); try again in a minute"] with input as call(10, 0, 0, 60)
	not calls.verdict.admit with input as call(10, 0, 0, 60)
}

test_every_reason_is_given_at_once if {
	count(calls.verdict.reasons) == 4 with input as call(300000, 4, 8, 60)
}

test_a_named_user_has_their_own_limits if {
	users := {"alice": {"running_per_user": 6, "per_minute_per_user": 600}}
	calls.verdict.admit with input as call(10, 5, 5, 500) with data.config.calls.users as users
	not calls.verdict.admit with input as call(10, 6, 6, 0) with data.config.calls.users as users
	not calls.verdict.admit with input as call(10, 1, 1, 600) with data.config.calls.users as users
}

test_saved_plans_outlive_every_approval if {
	every kind in ["standard", "destructive"] {
		data.config.calls.plan_retention_seconds > data.config.approvals[kind].ttl_seconds
	}
}

tasks(n, user) := {"tool": "terraform_apply", "client": "test", "kind": "os_user", "user": user, "os_user": user, "uid": 1001, "tasks": {"session": n}}

test_a_session_may_hold_up_to_eight_tasks if {
	calls.task_allowed with input as tasks(0, "alice")
	calls.task_allowed with input as tasks(7, "alice")
	not calls.task_allowed with input as tasks(8, "alice")
}

test_a_user_exception_raises_the_task_limit if {
	cfg := object.union(data.config.calls, {"users": {"ci": {"tasks_per_session": 20}}})
	calls.task_allowed with input as tasks(8, "ci") with data.config.calls as cfg
	not calls.task_allowed with input as tasks(20, "ci") with data.config.calls as cfg
}

test_no_count_no_task if {
	not calls.task_allowed with input as {"tool": "terraform_apply"}
}

sso_call(user, running) := {
	"tool": "k8s_get_pod_status", "client": "claude-code", "kind": "sso", "user": user,
	"issuer": "https://idp.example", "groups": ["developers"],
	"params_bytes": 10, "running": {"user": running, "total": running}, "last_minute": {"user": 0},
}

test_an_sso_identity_has_the_same_limits_by_its_username if {
	calls.verdict.admit with input as sso_call("alice@example.com", 3)
	calls.verdict.reasons == ["alice@example.com already has 4 call(s) running, the most allowed at once (data.config.calls.running_per_user); wait for one to finish"] with input as sso_call("alice@example.com", 4)
	calls.verdict.admit with input as sso_call("alice@example.com", 5) with data.config.calls.sso_users as {"alice@example.com": {"running_per_user": 6}}
}

test_an_sso_name_never_takes_an_os_users_exception if {
	# An IdP username that equals an OS user's name ("alice") gets the
	# default, not alice's exception.
	not calls.verdict.admit with input as sso_call("alice", 5) with data.config.calls.users as {"alice": {"running_per_user": 6}}
	calls.verdict.admit with input as call(10, 5, 5, 0) with data.config.calls.users as {"alice": {"running_per_user": 6}}
}
