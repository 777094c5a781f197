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

# A lock entry as `gateway upstream lock` writes it.
entry(sha, d) := {"sha256": sha, "definition": d, "definition_json": json.marshal(d)}

def(name, extra) := object.union({"name": name, "description": sprintf("does %s", [name]), "inputSchema": {"type": "object"}}, extra)

lock := {
	"fs": {"tools": {
		"read_text_file": entry("aaa", def("read_text_file", {"annotations": {"readOnlyHint": true}})),
		"read_sneaky": entry("bbb", def("read_sneaky", {"annotations": {"destructiveHint": true}})),
		"list_directory": entry("ccc", def("list_directory", {"annotations": {"readOnlyHint": false}})),
		"write_file": entry("ddd", def("write_file", {"title": "Write a file", "annotations": {"readOnlyHint": true, "destructiveHint": false}})),
	}},
	"team": {"tools": {"lookup": entry("eee", {"name": "lookup", "annotations": {"title": "Look up"}})}},
	# Locked once, no longer declared: offers nothing.
	"gone": {"tools": {"x": entry("fff", def("x", {}))}},
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
	json.unmarshal(d.operation.definition_json).name == "read_text_file"
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

test_a_list_of_paths_is_one_message_with_a_count if {
	d := decide("fs.read_text_file", {"paths": ["/etc/a", "/etc/b", "/srv/data/ok", "/etc/c"]})
	count(d.deny_reasons) == 1
	some r in d.deny_reasons
	contains(r, "\"/etc/a\" (and 2 more)")
}

test_a_tool_that_does_not_say_it_only_reads_is_at_least_medium if {
	# read_* would make it low; without readOnlyHint: true it is medium.
	d := gateway.decision with input as call("fs.read_plain", {"path": "/srv/data/a"})
		with data.config.upstreams as declared
		with data.config.upstream_lock as {"fs": {"tools": {"read_plain": entry("x", def("read_plain", {}))}}}
	d.tier == "medium"
}

test_a_misshapen_or_misspelt_declaration_refuses_every_call if {
	bad := object.union(declared, {"fs": object.union(declared.fs, {"path_arguments": {"path": true}})})
	d := gateway.decision with input as call("fs.read_text_file", {"path": "/srv/data/a"})
		with data.config.upstreams as bad
		with data.config.upstream_lock as lock
	not d.allow
	some r in d.deny_reasons
	contains(r, "path_arguments in config/upstreams must be a list of strings")
	typo := object.union(declared, {"fs": object.union(declared.fs, {"path_argument": ["path"]})})
	t := gateway.decision with input as call("fs.read_text_file", {"path": "/etc/passwd"})
		with data.config.upstreams as typo
		with data.config.upstream_lock as lock
	some m in t.deny_reasons
	contains(m, "unknown setting \"path_argument\"")
}

test_a_lock_whose_two_copies_differ_is_refused if {
	e := lock.fs.tools.read_text_file
	changed := object.union(e, {"definition": object.union(e.definition, {"description": "something else"})})
	edited := object.union(lock, {"fs": {"tools": object.union(lock.fs.tools, {"read_text_file": changed})}})
	d := gateway.decision with input as call("fs.read_text_file", {"path": "/srv/data/a"})
		with data.config.upstreams as declared
		with data.config.upstream_lock as edited
	not d.allow
	some r in d.deny_reasons
	contains(r, "two copies")
}

test_an_upstream_calls_sandbox_outlasts_its_timeout_and_holds_its_answer if {
	d := decide("fs.read_text_file", {"path": "/srv/data/a"})
	d.sandbox.deadline_seconds == 90
	d.sandbox.output_bytes == (2 * 1048576) + 65536
	# Not an upstream's tool: the table's limits.
	k := decide("k8s_get_pod_status", {"namespace": "demo-app"})
	k.sandbox.deadline_seconds == 120
}

test_a_misshapen_tier_pattern_refuses_every_call if {
	every tiers in [
		[{"match": "read_*", "teir": "low"}],
		[{"match": ["read_*"], "tier": "low"}],
		{"read_*": "low"},
		[{"match": "read_*", "tier": "none"}],
	] {
		bad := object.union(declared, {"fs": object.union(declared.fs, {"tiers": tiers})})
		d := gateway.decision with input as call("fs.read_text_file", {"path": "/srv/data/a"})
			with data.config.upstreams as bad
			with data.config.upstream_lock as lock
		not d.allow
	}
	bad := object.union(declared, {"fs": object.union(declared.fs, {"default_tier": "lowest"})})
	d := gateway.decision with input as call("fs.read_text_file", {"path": "/srv/data/a"})
		with data.config.upstreams as bad
		with data.config.upstream_lock as lock
	some r in d.deny_reasons
	contains(r, "default_tier")
}

# --- Network and per-call credentials ---------------------------------------

db_declared := object.union(declared, {
	"pg": {
		"command": ["/usr/bin/node", "/opt/pg/index.js", "postgresql://{{username}}:{{password}}@postgres:5432/app"],
		"egress": ["metrics"],
		"credential": {"tiers": {"low": "pg_read", "medium": "pg_read", "high": "pg_write"}, "env": {"PGUSER": "{{username}}"}},
		"tiers": [{"match": "query", "tier": "low"}],
	},
	"net": {"command": ["/opt/net"], "egress": ["api"], "default_tier": "low"},
})

db_lock := object.union(lock, {
	"pg": {"tools": {
		"query": entry("p1", def("query", {"annotations": {"readOnlyHint": true}})),
		"execute": entry("p2", def("execute", {})),
	}},
	"net": {"tools": {"fetch": entry("n1", def("fetch", {"annotations": {"readOnlyHint": true}}))}},
})

db_kinds := {
	"pg_read": {"type": "database", "mount": "database", "role": "app-read", "ttl": "5m", "egress": ["postgres"]},
	"pg_write": {"type": "database", "mount": "database", "role": "app-write", "ttl": "5m", "egress": ["postgres"]},
	"pod_reader": {"type": "kubernetes", "mount": "kubernetes", "ttl": "10m", "egress": ["kube-apiserver"]},
}

decide_db(tool, decl, kinds) := d if {
	d := gateway.decision with input as call(tool, {})
		with data.config.upstreams as decl
		with data.config.upstream_lock as db_lock
		with data.config.scopes.credential_kinds as kinds
}

test_a_read_gets_the_read_role_and_a_write_the_write_role if {
	r := decide_db("pg.query", db_declared, db_kinds)
	r.allow
	r.credential == {"kind": "pg_read", "type": "database", "mount": "database", "role": "app-read", "params": {"ttl": "5m"}}
	r.sandbox.egress == ["metrics", "postgres"]
	r.operation.egress == ["metrics", "postgres"]
	r.operation.credential == {"env": {"PGUSER": "{{username}}"}}
	# Unannotated: at least medium, with the pattern; here no pattern: high.
	w := decide_db("pg.execute", db_declared, db_kinds)
	w.tier == "high"
	w.credential.role == "app-write"
	w.approval.required
}

test_an_upstream_without_a_credential_reaches_only_its_declared_endpoints if {
	d := decide_db("net.fetch", db_declared, db_kinds)
	d.allow
	d.credential == null
	d.sandbox.egress == ["api"]
	d.operation.credential == null
	# Declares none: no network at all.
	decide("fs.read_text_file", {"path": "/srv/data/a"}).sandbox.egress == []
}

refused_db(tool, decl, kinds, fragment) if {
	d := decide_db(tool, decl, kinds)
	not d.allow
	some r in d.deny_reasons
	contains(r, fragment)
}

# (object.union merges objects deeply: the keys set are removed first.)
with_pg(x) := object.union(object.remove(db_declared, ["pg"]), {"pg": object.union(object.remove(db_declared.pg, [k | some k, _ in x]), x)})

test_a_credential_declared_wrong_refuses_every_call if {
	# A tier with no kind: refused, never run without one.
	refused_db("pg.execute", with_pg({"credential": {"tiers": {"low": "pg_read"}}}), db_kinds, "names no kind for tier high")
	# A kind that is not in config/scopes, or not a database one.
	refused_db("pg.query", with_pg({"credential": {"tiers": {"low": "nope"}}}), db_kinds, "must be a credential_kinds entry")
	refused_db("pg.query", with_pg({"credential": {"tiers": {"low": "pod_reader"}}}), db_kinds, "must be a credential_kinds entry")
	# A kind without a role.
	refused_db("pg.query", db_declared, object.union(object.remove(db_kinds, ["pg_read"]), {"pg_read": {"type": "database", "mount": "database", "ttl": "5m"}}), "needs a role")
	refused_db("pg.query", db_declared, object.union(object.remove(db_kinds, ["pg_read"]), {"pg_read": {"type": "database", "mount": "database", "role": "r"}}), "needs a ttl")
	# Misspelt or misshapen settings.
	refused_db("pg.query", with_pg({"credential": {"tier": {"low": "pg_read"}}}), db_kinds, "credential in config/upstreams must be")
	refused_db("pg.query", with_pg({"credential": {"tiers": {"low": "pg_read"}, "env": {"A": 1}}}), db_kinds, "credential.env in config/upstreams")
	refused_db("pg.query", with_pg({"egress": "postgres"}), db_kinds, "egress in config/upstreams")
}

test_a_placeholder_without_a_credential_is_refused if {
	decl := object.union(db_declared, {"net": {"command": ["/opt/net"], "env": {"TOKEN": "{{password}}"}, "default_tier": "low"}})
	refused_db("net.fetch", decl, db_kinds, "has a {{…}} placeholder")
}

# --- Remote servers ---------------------------------------------------------

remote_declared := object.union(declared, {"api": {
	"url": "https://mcp.example.com/mcp",
	"bearer_token_file": "/etc/gateway/api.token",
	"default_tier": "low",
}})

remote_lock := object.union(lock, {"api": {"tools": {"lookup": entry("r1", def("lookup", {"annotations": {"readOnlyHint": true}}))}}})

decide_remote(decl) := d if {
	d := gateway.decision with input as call("api.lookup", {})
		with data.config.upstreams as decl
		with data.config.upstream_lock as remote_lock
}

test_a_remote_servers_call_is_decided_like_any_other if {
	d := decide_remote(remote_declared)
	d.allow
	d.operation.url == "https://mcp.example.com/mcp"
	d.operation.bearer_token_file == "/etc/gateway/api.token"
	d.operation.command == []
	d.credential == null
	d.sandbox.egress == []
}

test_a_remote_server_declared_with_what_only_a_run_server_has_is_refused if {
	every key, value in {"command": ["/bin/x"], "image": kit_image, "read_only": ["/usr"], "egress": ["postgres"], "credential": {"tiers": {}}, "env": {"A": "b"}} {
		d := decide_remote(object.union(remote_declared, {"api": object.union(remote_declared.api, {key: value})}))
		not d.allow
		some r in d.deny_reasons
		contains(r, sprintf("is remote (url): %s is for a server the gateway runs", [key]))
	}
	d := decide_remote(object.union(remote_declared, {"api": object.union(remote_declared.api, {"ca_file": 7})}))
	not d.allow
}

# --- A warm server (kept running between calls) -----------------------------

test_a_warm_server_is_named_so_in_the_operation_and_cold_by_default if {
	cold := decide_kit(kit)
	cold.operation.warm == false
	d := decide_kit(object.union(kit, {"warm": true}))
	d.allow
	d.operation.warm == true
	d.credential == null
}

test_a_warm_server_is_never_handed_a_credential_and_warm_is_a_boolean if {
	d := gateway.decision with input as call("pg.query", {"sql": "select 1"})
		with data.config.upstreams as object.union(db_declared, {"pg": object.union(db_declared.pg, {"warm": true})})
		with data.config.upstream_lock as db_lock
		with data.config.scopes.credential_kinds as db_kinds
	not d.allow
	some r in d.deny_reasons
	contains(r, "is never handed a per-call credential")
	bad := decide_kit(object.union(kit, {"warm": "yes"}))
	not bad.allow
	some r2 in bad.deny_reasons
	contains(r2, "warm in config/upstreams must be true or false")
	remote := decide_remote(object.union(remote_declared, {"api": object.union(remote_declared.api, {"warm": true})}))
	not remote.allow
	some r3 in remote.deny_reasons
	contains(r3, "is remote (url): warm is for a server the gateway runs")
}

# --- A stdio server run from an image (the kubernetes backend) -------------

kit_image := "registry.example.com/mcp/kit@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

decide_kit(kit) := d if {
	d := gateway.decision with input as call("kit.ping", {})
		with data.config.upstreams as object.union(declared, {"kit": kit})
		with data.config.upstream_lock as object.union(lock, {"kit": {"tools": {"ping": entry("k1", def("ping", {"annotations": {"readOnlyHint": true}}))}}})
}

kit := {"command": ["/usr/local/bin/kit-server"], "image": kit_image, "default_tier": "low"}

test_a_stdio_server_run_from_an_image_names_it_pinned_by_digest if {
	d := decide_kit(kit)
	d.allow
	d.operation.image == kit_image
	d.operation.command == ["/usr/local/bin/kit-server"]
	every bad in ["registry.example.com/mcp/kit:1.2", "registry.example.com/mcp/kit@sha256:0123", 7, concat("", ["Registry.example.com/kit@sha256:", substring(kit_image, count(kit_image) - 64, 64)])] {
		refused := decide_kit(object.union(kit, {"image": bad}))
		not refused.allow
		some r in refused.deny_reasons
		contains(r, "must be pinned by its digest")
	}
}

test_a_server_run_from_an_image_is_shown_no_host_path if {
	every key in ["read_only", "writable"] {
		d := decide_kit(object.union(kit, {key: ["/srv/data"]}))
		not d.allow
		some r in d.deny_reasons
		contains(r, sprintf("runs from an image: %s (host paths)", [key]))
	}
}

test_a_declaration_without_command_or_url_is_refused if {
	d := decide_remote(object.union(declared, {"api": {"default_tier": "low"}}))
	not d.allow
	some r in d.deny_reasons
	contains(r, "needs a command (a list of strings) or a url")
}

test_the_credential_follows_the_calls_tier_where_config_tools_sets_it if {
	d := gateway.decision with input as call("pg.execute", {})
		with data.config.upstreams as db_declared
		with data.config.upstream_lock as db_lock
		with data.config.scopes.credential_kinds as db_kinds
		with data.config.tools["pg.execute"] as {"tier": "medium"}
	d.tier == "medium"
	d.credential.role == "app-read"
	# Merged over the upstream's entry, not instead of it.
	d.runner == "mcp_upstream"
	d.operation.tool == "execute"
}

# What config/tools says of an upstream's tool is merged over its entry:
# the upstream's runner, schema and clients stay unless it says otherwise.
test_config_tools_is_merged_over_an_upstreams_tool if {
	d := gateway.decision with input as call("fs.write_file", {"path": "/srv/data/a"})
		with data.config.upstreams as declared
		with data.config.upstream_lock as lock
		with data.config.tools["fs.write_file"] as {"tier": "low", "title": "Write"}
	d.allow
	d.tier == "low"
	d.runner == "mcp_upstream"
	# team's tools are for claude-code only, whatever config/tools adds.
	t := gateway.decision with input as call("team.lookup", {})
		with data.config.upstreams as declared
		with data.config.upstream_lock as lock
		with data.config.tools["team.lookup"] as {"tier": "low"}
	not t.allow
	some r in t.deny_reasons
	contains(r, "not available to client")
	e := gateway.tools.entry_of("team.lookup") with data.config.upstreams as declared
		with data.config.upstream_lock as lock
		with data.config.tools["team.lookup"] as {"tier": "low"}
	c := gateway.tools.catalog with data.config.upstreams as declared
		with data.config.upstream_lock as lock
		with data.config.tools["team.lookup"] as {"tier": "low"}
	e == c["team.lookup"]
	e.clients == ["claude-code"]
	e.tier == "low"
}

test_a_built_in_tool_never_gets_a_credential_of_another_type if {
	d := gateway.decision with input as call("k8s_get_pod_status", {"namespace": "demo-app"})
		with data.config.scopes.credential_kinds.pod_reader.type as "database"
	not d.allow
	some r in d.deny_reasons
	contains(r, "must be of type kubernetes")
}

test_an_oauth_client_is_checked_and_only_for_a_remote_server if {
	oauth := {"token_url": "https://idp.example.com/token", "client_id": "gateway", "client_secret_file": "/etc/gateway/idp.secret"}
	ok := decide_remote(object.union(remote_declared, {"api": object.union(object.remove(remote_declared.api, ["bearer_token_file"]), {"oauth": oauth})}))
	ok.allow
	ok.operation.oauth == oauth
	every bad in [{"token_url": "x"}, object.union(oauth, {"scope": 7}), object.union(oauth, {"audiences": "x"}), "oauth"] {
		d := decide_remote(object.union(remote_declared, {"api": object.union(object.remove(remote_declared.api, ["bearer_token_file"]), {"oauth": bad})}))
		not d.allow
	}
	d := gateway.decision with input as call("fs.read_text_file", {"path": "/srv/data/a"})
		with data.config.upstreams as object.union(declared, {"fs": object.union(declared.fs, {"oauth": oauth})})
		with data.config.upstream_lock as lock
	not d.allow
	some r in d.deny_reasons
	contains(r, "oauth is for a remote server")
}

test_result_size_and_time_are_bounded_whatever_is_declared if {
	every bad in [{"max_result_bytes": 33554432}, {"max_result_bytes": 0}, {"timeout_seconds": 3600}, {"timeout_seconds": "60"}, {"timeout_seconds": 1.5}] {
		d := decide_remote(object.union(remote_declared, {"api": object.union(remote_declared.api, bad)}))
		not d.allow
		some r in d.deny_reasons
		contains(r, "must be a whole number from 1 to")
	}
	decide_remote(object.union(remote_declared, {"api": object.union(remote_declared.api, {"max_result_bytes": 16777216, "timeout_seconds": 900})})).allow
}

# One tool's entry, as the decision and the approvers' scopes look it up,
# is the catalog's entry for it (a stale or unknown tool has none).
entries_and_catalog(names) := [[gateway.tools.entry_of(n) | some n in names], gateway.tools.catalog]

test_one_tools_entry_is_its_catalog_entry if {
	# read_text_file changed, read_sneaky gone from the server's list.
	live := {"fs": {"tools": {"read_text_file": "changed", "write_file": "ddd", "list_directory": "ccc"}}}
	names := ["fs.write_file", "fs.list_directory", "team.lookup"]
	got := entries_and_catalog(names) with input as {"upstreams": live}
		with data.config.upstreams as declared
		with data.config.upstream_lock as lock
	got[0] == [got[1][n] | some n in names]
	count(got[0]) == 3
	none := [n |
		some n in ["fs.read_text_file", "fs.read_sneaky", "gone.x", "fs.nothing", "nodots", "team.lookup.x", "a.b.t"]
		gateway.tools.entry_of(n)
	] with input as {"upstreams": live}
		with data.config.upstreams as declared
		with data.config.upstream_lock as lock
	none == []
	# An upstream declared with a dot in its name offers nothing.
	dotted := [n |
		some n in ["a.b.t", "a.b"]
		gateway.tools.entry_of(n)
	] with data.config.upstreams as object.union(declared, {"a.b": {"command": ["/x"]}})
		with data.config.upstream_lock as object.union(lock, {"a.b": {"tools": {"t": entry("ggg", def("t", {}))}}})
	dotted == []
	not gateway.tools.catalog["a.b.t"] with data.config.upstreams as object.union(declared, {"a.b": {"command": ["/x"]}})
		with data.config.upstream_lock as object.union(lock, {"a.b": {"tools": {"t": entry("ggg", def("t", {}))}}})
	gateway.approvals.tier_of("fs.write_file") == "high" with data.config.upstreams as declared
		with data.config.upstream_lock as lock
	gateway.approvals.tier_of("fs.nothing") == "unknown" with data.config.upstreams as declared
		with data.config.upstream_lock as lock
}
