# Who may hold how many connections to the daemon at once.
#
# Asked by the daemon for every connection on its socket (an MCP session or
# one operator command) with input {"os_user", "uid", "groups", "open":
# {"user", "total"}}: the caller as the kernel named it and the connections
# already open, for that user and in all. A connection that is not admitted
# is refused (`session.refused`) before anything runs, with the reason.
package gateway.sessions

cfg := data.config.sessions

# The most connections one user may hold, by name, else the default.
per_user := n if {
	n := cfg.users[input.os_user]
} else := cfg.per_user

default admit := false

admit if {
	input.open.user < per_user
	input.open.total < cfg.total
}

reason := sprintf("%s already holds %d connection(s) to the daemon, the most allowed (data.config.sessions)", [input.os_user, input.open.user]) if {
	input.open.user >= per_user
}

else := sprintf("the daemon already holds %d connections, the most allowed (data.config.sessions.total)", [input.open.total]) if {
	not admit
}
