# The Kubernetes toolbox: the operation kubectl_read carries out, and the
# roles behind the read tools.
package gateway_test.kubernetes

import data.gateway.kubernetes

call(tool, params) := {"tool": tool, "params": object.union({"namespace": "demo-app"}, params), "principal": {"client": "c", "os_user": "u"}}

op(tool, params) := o if {
	o := kubernetes.operation with input as call(tool, params)
}

deny(tool, params) := d if {
	d := kubernetes.deny with input as call(tool, params)
}

test_a_get_resolves_the_kind_from_the_scopes_table if {
	o := op("k8s_get", {"kind": "deployments", "name": "web"})
	o == {
		"verb": "get", "namespace": "demo-app", "group": "apps", "resource": "deployments", "kind": "Deployment",
		"name": "web", "container": "", "tail_lines": 200, "since_seconds": 0, "previous": false,
		"values": "shown", "result_bytes": 65536,
	}
}

test_secrets_are_read_with_their_values_hidden if {
	op("k8s_get", {"kind": "secrets"}).values == "hidden"
}

test_logs_are_a_pods_with_the_calls_limits if {
	o := op("k8s_logs", {"name": "web-1", "container": "app", "tail_lines": 20, "since_seconds": 60, "previous": true})
	[o.verb, o.resource, o.kind, o.container, o.tail_lines, o.since_seconds, o.previous] == ["logs", "pods", "Pod", "app", 20, 60, true]
}

test_events_of_a_namespace_name_no_kind if {
	o := op("k8s_events", {})
	[o.verb, o.resource, o.kind, o.name] == ["events", "", "", ""]
	op("k8s_events", {"kind": "deployments", "name": "web"}).kind == "Deployment"
}

test_events_of_one_object_need_its_kind_and_its_name if {
	deny("k8s_events", {"kind": "pods"}) == {"name the object the events are about with both kind and name, or neither for the whole namespace"}
	deny("k8s_events", {"name": "web"}) == {"name the object the events are about with both kind and name, or neither for the whole namespace"}
	op("k8s_events", {"name": "web"}) == null
}

test_a_call_with_bad_params_has_no_operation if {
	op("k8s_logs", {"name": "web-1", "tail_lines": "all"}) == null
	op("k8s_get", {"kind": "nodes"}) == null
}

test_other_tools_have_no_operation if {
	op("k8s_get_pod_status", {}) == null
	kubernetes.operation == null with input as {"tool": "terraform_plan", "params": {"working_dir": "terraform/offline-demo"}, "principal": {"client": "c", "os_user": "u"}}
}

catalog_with(name, entry) := object.union(data.config.tools, {name: entry})

test_a_kind_listed_by_a_tool_but_not_defined_is_refused if {
	kinds := object.remove(data.config.scopes.kinds, ["configmaps"])
	r := kubernetes.deny with data.config.scopes.kinds as kinds with input as call("k8s_get", {"kind": "configmaps"})
	r == {`kind "configmaps" is not defined in config/scopes (kinds)`}
}

test_a_verb_kubectl_read_lacks_is_refused if {
	entry := object.union(data.config.tools.k8s_get, {"kubernetes": {"verb": "exec"}})
	r := kubernetes.deny with data.config.tools as catalog_with("k8s_exec", entry) with input as call("k8s_exec", {"kind": "pods"})
	r == {`the catalog gives tool "k8s_exec" the kubernetes verb "exec", which kubectl_read does not have (it has: describe, events, get, logs, rollout_history, rollout_status)`}
	o := kubernetes.operation with data.config.tools as catalog_with("k8s_exec", entry) with input as call("k8s_exec", {"kind": "pods"})
	o == null
}

test_a_kubernetes_tool_must_be_scoped_to_a_namespace if {
	entry := object.union(data.config.tools.k8s_get, {"scope": "module"})
	r := kubernetes.deny with data.config.tools as catalog_with("k8s_x", entry) with input as call("k8s_x", {"kind": "pods"})
	r == {concat("", [`tool "k8s_x" is a Kubernetes tool but its scope is not `, "`namespace`"])}
}

# --- The roles behind the read tools grant what their verb asks -------------

scopes := data.config.scopes

roles := data.config.vault_roles.roles

# Every (role, group, resource, verb) a read tool's verb needs for a kind
# its `kind` param lists (or, for a tool without one, pods).
needed contains [role, k.group, k.resource, v] if {
	some _, entry in data.config.tools
	entry.runner == "kubectl_read"
	role := scopes.namespaces[_].roles[entry.credential]
	some kind in object.get(object.get(entry.params, "kind", {}), "choices", ["pods"])
	k := scopes.kinds[kind]
	some v in scopes.kubectl_reads[entry.kubernetes.verb].object
}

needed contains [role, x.group, x.resource, v] if {
	some _, entry in data.config.tools
	entry.runner == "kubectl_read"
	role := scopes.namespaces[_].roles[entry.credential]
	some x in object.get(scopes.kubectl_reads[entry.kubernetes.verb], "also", [])
	some v in x.verbs
}

granted(role, group, resource, verb) if {
	some rule in roles[role].rules
	group in rule.apiGroups
	resource in rule.resources
	verb in rule.verbs
}

missing contains n if {
	some n in needed
	not granted(n[0], n[1], n[2], n[3])
}

test_every_read_tools_role_grants_what_its_verb_asks_for_every_kind_it_lists if {
	count(needed) > 20
	missing == set()
}

test_the_grant_check_finds_a_role_missing_a_rule if {
	fewer := object.union(roles, {"gateway-k8s-logs-demo-app": object.union(roles["gateway-k8s-logs-demo-app"], {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})})
	m := missing with data.config.vault_roles.roles as fewer
	m == {["gateway-k8s-logs-demo-app", "", "pods/log", "get"]}
}

# Reads never get a verb that changes anything.
test_no_read_tools_role_can_change_anything if {
	every _, entry in data.config.tools {
		read_role_is_read_only(entry)
	}
}

read_role_is_read_only(entry) if entry.runner != "kubectl_read"

read_role_is_read_only(entry) if {
	entry.runner == "kubectl_read"
	every role in {r | r := scopes.namespaces[_].roles[entry.credential]} {
		every rule in roles[role].rules {
			every v in rule.verbs {
				v in {"get", "list", "watch"}
			}
		}
	}
}
