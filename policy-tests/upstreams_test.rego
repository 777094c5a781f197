# Upstream MCP servers: their locked tools as catalog entries, tiers the
# server's annotations may only raise, the lock against a changed tool,
# path arguments, and the operation the mcp_upstream runner carries out.
package gateway_test.upstreams

import data.gateway

declared := {
	"fs": {
		"command": ["/usr/bin/node", "/opt/fs/index.js", "/srv/data"],
		"read_only": ["/usr"],
		"writable": ["/srv/data"],
		"path_arguments": ["path", "paths"],
		"allowed_paths": ["/srv/data"],
		"tiers": [{"match": "read_*", "tier": "low"}, {"match": "list_*", "tier": "medium"}],
		"default_tier": "high",
	},
	"team": {
		"command": ["/opt/team/server"],
		"clients": ["claude-code"],
	},
}

def(name, extra) := object.union({"name": name, "description": sprintf("does %s", [name]), "inputSchema": {"type": "object"}}, extra)

lock := {
	"fs": {"tools": {
		"read_text_file": {"sha256": "aaa", "definition": def("read_text_file", {"annotations": {"readOnlyHint": true}})},
		"read_sneaky": {"sha256": "bbb", "definition": def("read_sneaky", {"annotations": {"destructiveHint": true}})},
		"list_directory": {"sha256": "ccc", "definition": def("list_directory", {"annotations": {"readOnlyHint": false}})},
		"write_file": {"sha256": "ddd", "definition": def("write_file", {"title": "Write a file", "annotations": {"readOnlyHint": true, "destructiveHint": false}})},
	}},
	"team": {"tools": {"lookup": {"sha256": "eee", "definition": {"name": "lookup", "annotations": {"title": "Look up"}}}}},
	# Locked once, no longer declared: offers nothing.
	"gone": {"tools": {"x": {"sha256": "fff", "definition": def("x", {})}}},
}

call(tool, params) := {"tool": tool, "params": params, "principal": {"client": "c", "os_user": "u", "groups": []}}

decide(tool, params) := d if {
	d := gateway.decision with input as call(tool, params)
		with data.config.upstreams as declared
		with data.config.upstream_lock as lock
}

decide_with(inp) := d if {
	d := gateway.decision with input as inp
		with data.config.upstreams as declared
		with data.config.upstream_lock as lock
}

listed(client, live) := l if {
	l := gateway.tool_list with input as {"principal": {"client": client}, "upstreams": live}
		with data.config.upstreams as declared
		with data.config.upstream_lock as lock
}

test_a_locked_read_runs_on_the_upstream_runner_at_its_patterns_tier if {
	d := decide("fs.read_text_file", {"path": "/srv/data/a.txt"})
	d.allow
	d.runner == "mcp_upstream"
	d.tier == "low"
	not d.approval.required
	d.operation.upstream == "fs"
	d.operation.tool == "read_text_file"
	d.operation.definition_sha256 == "aaa"
	d.operation.command == ["/usr/bin/node", "/opt/fs/index.js", "/srv/data"]
	d.operation.writable == ["/srv/data"]
	d.operation.max_result_bytes == 1048576
	d.operation.timeout_seconds == 60
}

test_the_servers_annotations_raise_a_tier_and_never_lower_it if {
	decide("fs.read_sneaky", {}).tier == "high"
	decide("fs.list_directory", {"path": "/srv/data"}).tier == "medium"
	# Claims read-only and not destructive: the default tier stands.
	w := decide("fs.write_file", {"path": "/srv/data/b", "content": "x"})
	w.tier == "high"
	w.approval.required
	w.annotations.destructiveHint
}

test_a_tool_no_pattern_matches_is_high_without_a_default if {
	decide("team.lookup", {}).tier == "high"
}

test_an_unlocked_or_undeclared_tool_does_not_exist if {
	d := decide("fs.delete_everything", {})
	not d.allow
	some r in d.deny_reasons
	startswith(r, "unknown tool")
	not decide("gone.x", {}).allow
}

test_a_tool_not_as_locked_is_hidden_and_refused if {
	live := {"fs": {"tools": {"read_text_file": "changed", "write_file": "ddd"}}}
	d := decide_with(object.union(call("fs.read_text_file", {"path": "/srv/data/a"}), {"upstreams": live}))
	not d.allow
	some r in d.deny_reasons
	contains(r, "is not the one locked")
	l := listed("c", live)
	not l["fs.read_text_file"]
	l["fs.write_file"]
	# Gone from the server's list: hidden too.
	not l["fs.read_sneaky"]
	# An upstream not read yet is not judged here (the call's sandbox compares).
	listed("claude-code", live)["team.lookup"]
}

test_an_upstreams_clients_only_see_its_tools if {
	not listed("c", {})["team.lookup"]
	l := listed("claude-code", {})
	l["team.lookup"].title == "Look up"
	l["team.lookup"].input_schema == {"type": "object"}
	l["fs.write_file"].title == "Write a file"
	l["fs.read_text_file"].title == "fs.read_text_file"
}

test_path_arguments_must_lie_under_the_allowed_paths if {
	decide("fs.read_text_file", {"path": "/srv/data"}).allow
	decide("fs.read_text_file", {"path": "/srv/data/x/y"}).allow
	every p in ["/etc/passwd", "/srv/data/../../etc/passwd", "/srv/database", "/srv/data/./x", "relative"] {
		d := decide("fs.read_text_file", {"path": p})
		not d.allow
		some r in d.deny_reasons
		contains(r, "is not a path upstream \"fs\" may be asked about")
	}
	# A list of paths: each one.
	not decide("fs.read_text_file", {"paths": ["/srv/data/a", "/etc/shadow"]}).allow
	decide("fs.read_text_file", {"paths": ["/srv/data/a", "/srv/data/b"]}).allow
	# Not a string: refused.
	not decide("fs.read_text_file", {"path": {"p": "/srv/data/a"}}).allow
}

test_schema_violations_are_the_calls_violations if {
	inp := object.union(call("fs.read_text_file", {"path": 7}), {"schema_violations": [{"param": "path", "message": "/path: 7 is not of type \"string\""}]})
	d := decide_with(inp)
	not d.allow
	d.violations == [{"param": "path", "problem": "schema", "message": "/path: 7 is not of type \"string\""}]
	# The path rule waits for arguments of the right shape.
	count(d.deny_reasons) == 1
}

test_an_upstream_tool_takes_an_approval_id_and_any_argument_its_schema_allows if {
	d := decide("fs.write_file", {"path": "/srv/data/b", "content": "x", "approval_id": "apr-1"})
	d.allow
	d.violations == []
}
