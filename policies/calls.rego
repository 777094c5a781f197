# Whether a call may start now: the size of its arguments, the calls its
# user (an OS user as the kernel names it, or an SSO identity as its token
# proves it: a client's name proves nothing) and everyone together have
# running, and the calls its user made in the last minute (admitted or not:
# a refused call costs audit lines too). Limits are in
# config/calls/data.yaml.
#
# Asked for every tools/call before anything is decided about it (a refusal
# is recorded after the call's `tool.request`), with input
#   {"tool", "client", "kind": "os_user"|"sso", "user", "os_user", "uid",
#    "issuer", "groups", "params_bytes", "running": {"user", "total"},
#    "last_minute": {"user"}}
# where the counts do not include this call and are kept per identity (an
# OS user and an SSO identity never share one). A call not admitted is refused
# with the reasons (its `tool.result` says so); nothing of it runs.
package gateway.calls

cfg := data.config.calls

# A per-user exception (OS users in `users`, SSO identities by their
# username in `sso_users`: an SSO name never takes an OS user's exception),
# else the default.
limit(name) := n if {
	input.kind != "sso"
	n := cfg.users[input.user][name]
} else := n if {
	input.kind == "sso"
	n := cfg.sso_users[input.user][name]
} else := cfg[name]

reasons contains msg if {
	input.params_bytes > cfg.params_bytes
	msg := sprintf("the call's arguments are %d bytes, more than the %d allowed (data.config.calls.params_bytes)", [input.params_bytes, cfg.params_bytes])
}

reasons contains msg if {
	input.running.user >= limit("running_per_user")
	msg := sprintf("%s already has %d call(s) running, the most allowed at once (data.config.calls.running_per_user); wait for one to finish", [input.user, input.running.user])
}

reasons contains msg if {
	input.running.total >= cfg.running_total
	msg := sprintf("the gateway already runs %d calls, the most allowed at once (data.config.calls.running_total); try again shortly", [input.running.total])
}

reasons contains msg if {
	input.last_minute.user >= limit("per_minute_per_user")
	msg := sprintf("%s made %d calls in the last minute, the most allowed (data.config.calls.per_minute_per_user); try again in a minute", [input.user, input.last_minute.user])
}

# The gateway reads this one value (and caps every audit line at event_bytes).
verdict := {
	"admit": count(reasons) == 0,
	"reasons": sort(reasons),
	"event_bytes": cfg.event_bytes,
	"plan_retention_seconds": cfg.plan_retention_seconds,
}

# Whether a call may run as an MCP task (a client with the Tasks extension,
# a catalog tool with `task: true`). Asked with input {"tool", "client",
# "kind", "user", "os_user", "uid", "tasks": {"session"}}, the tasks the session holds
# (running, waiting for a person's approval, or finished and kept for
# polling), not counting this one. A
# call that may not is answered in its own response, as for a client
# without tasks: a waiting task holds no sandbox, but each one reads its
# approval's state until it ends, so a session may not pile them up.
default task_allowed := false

task_allowed if input.tasks.session < limit("tasks_per_session")
