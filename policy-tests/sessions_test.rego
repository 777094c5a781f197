package gateway_test.sessions

import data.gateway.sessions

caller(user, total) := {"os_user": "alice", "uid": 1001, "groups": ["alice"], "open": {"user": user, "total": total}}

test_a_user_below_both_limits_is_admitted if {
	sessions.admit with input as caller(0, 0)
	sessions.admit with input as caller(15, 255)
}

test_a_user_at_their_limit_is_refused_and_told_why if {
	not sessions.admit with input as caller(16, 20)
	sessions.reason == "alice already holds 16 connection(s) to the daemon, the most allowed (data.config.sessions)" with input as caller(16, 20)
}

test_the_daemon_at_its_total_refuses_everyone if {
	not sessions.admit with input as caller(1, 256)
	sessions.reason == "the daemon already holds 256 connections, the most allowed (data.config.sessions.total)" with input as caller(1, 256)
}

test_a_named_user_has_their_own_limit if {
	sessions.admit with input as caller(20, 30) with data.config.sessions.users as {"alice": 32}
	not sessions.admit with input as caller(32, 40) with data.config.sessions.users as {"alice": 32}
}
