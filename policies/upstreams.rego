# Upstream MCP servers: other MCP servers the operator puts behind the
# gateway (config/upstreams/data.yaml). Their tools appear to the agent
# under the upstream's name as a prefix (`fs.read_text_file`), and only
# those the operator has locked (config/upstream_lock/data.json, written
# by `gateway upstream lock`): each one's definition (name, description,
# schemas, annotations) is pinned by its digest. A tool the server changed
# since, or added, is hidden and refused until it is locked again.
#
# Each locked tool becomes a catalog entry of tools.rego (runner
# mcp_upstream), so every rule of the catalog, the scopes, approvals and
# sandbox holds for it as for a built-in tool. Its tier comes from the
# upstream's `tiers` patterns (the first that matches the tool's name),
# else its `default_tier`; the server's own annotations are hostile input
# and may only raise it, never lower it: destructiveHint: true makes it
# high, and a tool that does not say readOnlyHint: true is at least medium
# (MCP's default for a tool that says nothing is "not read-only").
package gateway.upstreams

declared := object.get(data.config, "upstreams", {})

locks := object.get(data.config, "upstream_lock", {})

# What the gateway last read of each upstream's tools (their digests), when
# it has read them: input.upstreams[name].tools[tool] = sha256.
live := object.get(input, "upstreams", {})

# Every locked tool of a declared upstream, by its name for the agent.
tools[name] := entry if {
	some u, _ in declared
	some t, _ in object.get(object.get(locks, u, {}), "tools", {})
	name := sprintf("%s.%s", [u, t])
	entry := tool_of(name)
}

# The locked tool `name` (`UPSTREAM.TOOL`) of a declared upstream. A call
# looks up its own tool only: building every upstream's entries made a
# decision about ten times slower with two small servers locked. Neither
# name has a dot (`gateway upstream lock` takes no other), so an upstream
# declared with one offers nothing.
tool_of(name) := {
	"upstream": u,
	"tool": t,
	"definition": entry.definition,
	"definition_json": entry.definition_json,
	"sha256": entry.sha256,
} if {
	is_string(name)
	[u, t] := split(name, ".")
	declared[u]
	entry := locks[u].tools[t]
}

rank := {"low": 0, "medium": 1, "high": 2}

tier_of_rank := ["low", "medium", "high"]

# The tier the operator's patterns give a tool of upstream u.
pattern_tier(u, t) := matches[0] if {
	matches := [r.tier | some r in object.get(declared[u], "tiers", []); is_string(r.match); glob.match(r.match, [], t)]
	count(matches) > 0
} else := object.get(declared[u], "default_tier", "high")

# The server's annotations, as a tier they ask for (they only raise).
annotation_rank(def) := 2 if object.get(def, ["annotations", "destructiveHint"], null) == true

else := 0 if object.get(def, ["annotations", "readOnlyHint"], null) == true

else := 1

tier(u, t, def) := tier_of_rank[max({rank[pattern_tier(u, t)], annotation_rank(def)})]

# Whether what the gateway read of the upstream says the tool is not as
# locked (changed, or gone). Unknown (not read yet): not stale here; the
# call's own sandbox compares the definition before it calls.
stale(entry) if {
	listed := live[entry.upstream].tools
	object.get(listed, entry.tool, "") != entry.sha256
}

# The catalog entries (tools.rego adds them to config/tools).
catalog[name] := e if {
	some name, _ in tools
	e := entry_for(name, tools[name])
}

# The catalog entry of locked tool `name` (undefined when it is stale).
catalog_entry(name) := entry_for(name, tool_of(name))

# The requested tool's catalog entry (a rule: evaluated once a decision,
# where a function is evaluated at every use).
requested_entry := entry_for(input.tool, requested)

# The catalog entry of `entry`, locked tool `name` (undefined when stale).
entry_for(name, entry) := e if {
	not stale(entry)
	tr := tier(entry.upstream, entry.tool, entry.definition)
	e := object.union(
		{
			"title": object.get(entry.definition, "title", object.get(entry.definition, ["annotations", "title"], name)),
			"description": object.get(entry.definition, "description", ""),
			"runner": "mcp_upstream",
			"tier": tr,
			"scope": "upstream",
			"upstream": entry.upstream,
			"params": {"approval_id": {
				"max_length": 64,
				"description": "The id of the approval a person gave for exactly this call (only for a call that needed one).",
			}},
			"input_schema": object.get(entry.definition, "inputSchema", {"type": "object"}),
			"annotations": {
				"readOnlyHint": tr == "low",
				"destructiveHint": tr == "high",
				"idempotentHint": false,
				"openWorldHint": true,
			},
		},
		clients(entry.upstream),
	)
}

clients(u) := {"clients": declared[u].clients} if declared[u].clients

else := {}

# The requested tool, when it is an upstream's (undefined otherwise).
requested := tool_of(input.tool)

deny contains msg if {
	requested
	stale(requested)
	msg := sprintf("tool %s of upstream %q is not the one locked (the server changed or removed it): hidden and refused until an operator locks it again (gateway upstream diff, gateway upstream lock)", [data.gateway.tools.quoted(input.tool), requested.upstream])
}

# The lock keeps each definition twice: as the server sent it
# (definition_json, exact: what the call is compared with and its digest
# is over) and readable (definition). A lock whose two disagree was edited
# by hand: refused.
deny contains msg if {
	requested
	json.unmarshal(requested.definition_json) != requested.definition
	msg := sprintf("the lock's two copies of %s's definition differ (config/upstream_lock edited by hand?): lock it again", [data.gateway.tools.quoted(input.tool)])
}

# What the mcp_upstream runner does: the upstream's command in a sandbox,
# the paths it may see, and the exact definition the call is made against.
default operation := null

operation := {
	"upstream": requested.upstream,
	"tool": requested.tool,
	"command": object.get(up, "command", []),
	"image": object.get(up, "image", null),
	"url": object.get(up, "url", null),
	"ca_file": object.get(up, "ca_file", null),
	"bearer_token_file": object.get(up, "bearer_token_file", null),
	"oauth": object.get(up, "oauth", null),
	"env": object.get(up, "env", {}),
	"read_only": object.get(up, "read_only", []),
	"writable": object.get(up, "writable", []),
	"definition_json": requested.definition_json,
	"definition_sha256": requested.sha256,
	"max_result_bytes": object.get(up, "max_result_bytes", 1048576),
	"timeout_seconds": object.get(up, "timeout_seconds", 60),
	"egress": egress,
	"credential": credential_use,
	"warm": object.get(up, "warm", false),
} if {
	requested
	up := declared[requested.upstream]
}

# --- Network and credentials ------------------------------------------------

# The endpoints ([endpoints] of gateway.toml, by name) the server may reach:
# those its declaration names and those of the credential minted for the
# call. Nothing else, and no network at all when none is named.
egress := sort({e |
	some e in list_of(object.get(declared[requested.upstream], "egress", []))
} | {e |
	some e in list_of(object.get(data.config.scopes.credential_kinds[credential_kind], "egress", []))
})

list_of(v) := v if is_array(v)

else := []

# The credential kind (config/scopes credential_kinds) a call of this tool
# gets, by its tier: `credential: {tiers: {low: KIND, medium: KIND, high:
# KIND}}`. A read can get a read-only database user and a write another.
credential_kind := k if {
	requested
	c := declared[requested.upstream].credential
	k := c.tiers[data.gateway.tools.tier]
	is_string(k)
}

# What is minted for the call: a user of OpenBao's (Vault's) database
# secrets engine from the kind's mount and role, revoked when the call ends.
default credential := null

credential := {
	"kind": credential_kind,
	"type": kind.type,
	"mount": kind.mount,
	"role": kind.role,
	# Not sent (the engine's role says how long); the gateway refuses and
	# revokes a lease longer than this.
	"params": {"ttl": kind.ttl},
} if {
	kind := data.config.scopes.credential_kinds[credential_kind]
	kind.type in credential_types
}

# The credential types an upstream can be handed: a database user
# (`{{username}}`, `{{password}}`).
credential_types := {"database"}

# How the runner hands the credential to the server (null: it gets none):
# `{{username}}` and `{{password}}` in its command and in
# `credential.env` are filled in inside the sandbox, from the credential's
# file; the secret is never in the decision, the steps or the audit.
default credential_use := null

credential_use := {"env": object.get(declared[requested.upstream].credential, "env", {})} if credential != null

deny contains msg if {
	requested
	c := declared[requested.upstream].credential
	tr := data.gateway.tools.tier
	not is_string(object.get(object.get(c, "tiers", {}), tr, null))
	msg := sprintf("upstream %q: its credential names no kind for tier %s (credential.tiers in config/upstreams); refused rather than run without one", [requested.upstream, tr])
}

deny contains msg if {
	credential_kind
	not object.get(object.get(data.config.scopes.credential_kinds, credential_kind, {}), "type", null) in credential_types
	msg := sprintf("upstream %q: credential kind %q must be a credential_kinds entry of config/scopes of type %s", [requested.upstream, credential_kind, concat(" or ", sort(credential_types))])
}

deny contains msg if {
	credential_kind
	data.config.scopes.credential_kinds[credential_kind].type in credential_types
	some field in ["mount", "role", "ttl"]
	not is_string(object.get(data.config.scopes.credential_kinds[credential_kind], field, null))
	msg := sprintf("credential kind %q (config/scopes) needs a %s for upstream %q", [credential_kind, field, requested.upstream])
}

deny contains msg if {
	requested
	up := declared[requested.upstream]
	some key, value in {"egress": object.get(up, "egress", []), "credential.env": object.get(object.get(up, "credential", {}), "env", {})}
	not well_formed(key, value)
	msg := sprintf("upstream %q: %s in config/upstreams must be %s; every call is refused until it is", [requested.upstream, key, {"egress": "a list of endpoint names", "credential.env": "a map of names to strings"}[key]])
}

deny contains msg if {
	requested
	c := declared[requested.upstream].credential
	not credential_declaration(c)
	msg := sprintf("upstream %q: credential in config/upstreams must be {tiers: {TIER: KIND}, env: {NAME: TEMPLATE}}; every call is refused until it is", [requested.upstream])
}

credential_declaration(c) if {
	is_object(c)
	every key, _ in c {
		key in {"tiers", "env"}
	}
	is_object(object.get(c, "tiers", {}))
}

well_formed("egress", v) if strings(v)

well_formed("credential.env", v) if {
	is_object(v)
	every x in v {
		is_string(x)
	}
}

# `{{…}}` in the command or env of an upstream that gets no credential
# would reach the server as it is written.
deny contains msg if {
	requested
	credential == null
	up := declared[requested.upstream]
	some text in array.concat(list_of(object.get(up, "command", [])), [v | some v in object.get(up, "env", {})])
	is_string(text)
	contains(text, "{{")
	msg := sprintf("upstream %q: its command or env has a {{…}} placeholder and the call gets no credential to fill it with", [requested.upstream])
}

# Arguments that name files (an upstream's `path_arguments`) must each lie
# under one of its `allowed_paths`, with no `..` part: the server's own
# checks are not what the gateway relies on (and its sandbox shows it only
# its declared paths besides).
deny contains msg if {
	requested
	count(object.get(input, "schema_violations", [])) == 0
	up := declared[requested.upstream]
	some arg in path_arguments(up)
	bad := [v | some v in path_values(object.get(data.gateway.tools.params, arg, [])); not path_allowed(v, allowed_paths(up))]
	count(bad) > 0
	msg := sprintf("%s %s%s is not a path upstream %q may be asked about (under %s, without ..)", [arg, data.gateway.tools.quoted(sprintf("%v", [bad[0]])), more(bad), requested.upstream, concat(", ", allowed_paths(up))])
}

more(bad) := "" if count(bad) == 1

else := sprintf(" (and %d more)", [count(bad) - 1])

# The declaration's path settings: a list of strings each, or the call is
# refused (a misspelt or mis-shaped setting must not turn the rule off).
path_arguments(up) := object.get(up, "path_arguments", [])

allowed_paths(up) := object.get(up, "allowed_paths", [])

deny contains msg if {
	requested
	up := declared[requested.upstream]
	some key in ["path_arguments", "allowed_paths"]
	not strings(object.get(up, key, []))
	msg := sprintf("upstream %q: %s in config/upstreams must be a list of strings; every call is refused until it is", [requested.upstream, key])
}

# Each tier pattern must be {match: a glob, tier: low|medium|high}: one
# that is not would be skipped, and its tools fall to the default tier.
deny contains msg if {
	requested
	up := declared[requested.upstream]
	not tier_patterns(object.get(up, "tiers", []))
	msg := sprintf("upstream %q: tiers in config/upstreams must be a list of {match: GLOB, tier: low|medium|high}; every call is refused until it is", [requested.upstream])
}

deny contains msg if {
	requested
	up := declared[requested.upstream]
	not object.get(up, "default_tier", "high") in object.keys(rank)
	msg := sprintf("upstream %q: default_tier in config/upstreams must be low, medium or high; every call is refused until it is", [requested.upstream])
}

tier_patterns(v) if {
	is_array(v)
	every r in v {
		is_object(r)
		is_string(r.match)
		r.tier in object.keys(rank)
		count(object.keys(r)) == 2
	}
}

deny contains msg if {
	requested
	up := declared[requested.upstream]
	some key, _ in up
	not key in declaration_keys
	msg := sprintf("upstream %q: config/upstreams has an unknown setting %q (a misspelling?); every call is refused until it is fixed", [requested.upstream, key])
}

# A remote server (`url`: MCP's streamable HTTP) is one the gateway does
# not run: it has no command, paths, egress or minted credential; what the
# gateway presents to it is the token in `bearer_token_file`.
remote(up) if "url" in object.keys(up)

deny contains msg if {
	requested
	up := declared[requested.upstream]
	not remote(up)
	not strings(object.get(up, "command", null))
	msg := sprintf("upstream %q: config/upstreams needs a command (a list of strings) or a url; every call is refused until it has one", [requested.upstream])
}

deny contains msg if {
	requested
	up := declared[requested.upstream]
	remote(up)
	some key in ["command", "image", "read_only", "writable", "egress", "credential", "env", "warm"]
	key in object.keys(up)
	msg := sprintf("upstream %q is remote (url): %s is for a server the gateway runs; every call is refused until it is removed", [requested.upstream, key])
}

# `warm: true`: the server is kept running between calls, in one sandbox
# of its own, on the backends that can (local); each call is still checked
# against the lock. It then serves the calls of every principal and keeps
# what it likes between them, so it is never handed a per-call credential.
deny contains msg if {
	requested
	up := declared[requested.upstream]
	not is_boolean(object.get(up, "warm", false))
	msg := sprintf("upstream %q: warm in config/upstreams must be true or false; every call is refused until it is", [requested.upstream])
}

deny contains msg if {
	requested
	up := declared[requested.upstream]
	object.get(up, "warm", false) == true
	"credential" in object.keys(up)
	msg := sprintf("upstream %q is warm: a warm server serves the calls of many and is never handed a per-call credential; declare it without warm or without credential", [requested.upstream])
}

# `image`: what a stdio server runs from on the kubernetes sandbox backend,
# pinned by its digest (a tag can be moved to another server after the
# approval was given). It sees its image's files, never a host path.
deny contains msg if {
	requested
	up := declared[requested.upstream]
	"image" in object.keys(up)
	not pinned_image(up.image)
	msg := sprintf("upstream %q: image in config/upstreams must be pinned by its digest (NAME@sha256: and 64 hex digits); every call is refused until it is", [requested.upstream])
}

deny contains msg if {
	requested
	up := declared[requested.upstream]
	"image" in object.keys(up)
	some key in ["read_only", "writable"]
	key in object.keys(up)
	msg := sprintf("upstream %q runs from an image: %s (host paths) cannot be shown to it; every call is refused until it is removed", [requested.upstream, key])
}

pinned_image(image) if {
	is_string(image)
	regex.match(`^[a-z0-9._/:-]{1,255}@sha256:[0-9a-f]{64}$`, image)
}

deny contains msg if {
	requested
	up := declared[requested.upstream]
	remote(up)
	some key in ["url", "ca_file", "bearer_token_file"]
	key in object.keys(up)
	not is_string(up[key])
	msg := sprintf("upstream %q: %s in config/upstreams must be a string; every call is refused until it is", [requested.upstream, key])
}

deny contains msg if {
	requested
	up := declared[requested.upstream]
	not remote(up)
	some key in ["ca_file", "bearer_token_file", "oauth"]
	key in object.keys(up)
	msg := sprintf("upstream %q: %s is for a remote server (url); every call is refused until it is removed", [requested.upstream, key])
}

# oauth: the client-credentials grant the gateway makes for each exchange.
deny contains msg if {
	requested
	up := declared[requested.upstream]
	"oauth" in object.keys(up)
	not oauth_client(up.oauth)
	msg := sprintf("upstream %q: oauth in config/upstreams must be {token_url, client_id, client_secret_file, and optionally scope, resource, revocation_url, ca_file}, each a string; every call is refused until it is", [requested.upstream])
}

oauth_client(o) if {
	is_object(o)
	every key, value in o {
		key in {"token_url", "client_id", "client_secret_file", "scope", "resource", "revocation_url", "ca_file"}
		is_string(value)
	}
	every key in ["token_url", "client_id", "client_secret_file"] {
		is_string(o[key])
	}
}

# What a server may send in a call (read, checked and redacted in the
# gateway's memory) and how long it may take: bounded whatever is declared.
limits := {"max_result_bytes": 16777216, "timeout_seconds": 900}

deny contains msg if {
	requested
	up := declared[requested.upstream]
	some key, most in limits
	v := object.get(up, key, 1)
	not within(v, most)
	msg := sprintf("upstream %q: %s in config/upstreams must be a whole number from 1 to %d; every call is refused until it is", [requested.upstream, key, most])
}

within(v, most) if {
	is_number(v)
	v >= 1
	v <= most
	round(v) == v
}

declaration_keys := {
	"command", "env", "read_only", "writable", "tiers", "default_tier", "max_result_bytes",
	"timeout_seconds", "clients", "path_arguments", "allowed_paths", "check_seconds",
	"egress", "credential", "url", "ca_file", "bearer_token_file", "oauth", "image", "warm",
}

strings(v) if {
	is_array(v)
	every x in v {
		is_string(x)
	}
}

path_values(v) := [v] if is_string(v)

else := v if is_array(v)

else := [v]

path_allowed(v, roots) if {
	is_string(v)
	not dotted(v)
	some r in roots
	under(v, r)
}

dotted(v) if {
	some part in split(v, "/")
	part in {"..", "."}
}

under(v, r) if v == r

under(v, r) if startswith(v, concat("", [trim_suffix(r, "/"), "/"]))
