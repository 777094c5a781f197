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
	r == {`the catalog gives tool "k8s_exec" the kubernetes verb "exec", which no Kubernetes runner has (they have: apply, delete, describe, events, get, logs, rollout_history, rollout_restart, rollout_status, rollout_undo, scale, set_image, top)`}
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

needed contains [role, k.group, k.resource, v] if {
	some _, entry in data.config.tools
	entry.runner == "kubectl_change"
	role := scopes.namespaces[_].roles[entry.credential]
	some kind in object.get(object.get(entry.params, "kind", {}), "choices", object.get(object.get(entry.params, "manifest", {}), "kinds", []))
	k := scopes.kinds[kind]
	some v in scopes.kubectl_changes[entry.kubernetes.verb].object
}

needed contains [role, x.group, x.resource, v] if {
	some _, entry in data.config.tools
	entry.runner == "kubectl_change"
	role := scopes.namespaces[_].roles[entry.credential]
	some x in object.get(scopes.kubectl_changes[entry.kubernetes.verb], "also", [])
	some v in x.verbs
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

test_every_kubernetes_tools_role_grants_what_its_verb_asks_for_every_kind_it_lists if {
	count(needed) > 40
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

# --- Changes --------------------------------------------------------------------

test_a_scale_names_the_object_and_the_replicas if {
	o := op("k8s_scale", {"kind": "deployments", "name": "web", "replicas": 3})
	o == {
		"verb": "scale", "namespace": "demo-app", "group": "apps", "version": "v1", "resource": "deployments",
		"kind": "Deployment", "name": "web", "replicas": 3, "container": "", "image": "", "to_revision": 0,
		"manifest": null, "result_bytes": 65536,
	}
}

test_an_apply_takes_its_kind_and_name_from_the_manifest if {
	m := {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web-config"}, "data": {"a": "b"}}
	o := op("k8s_apply", {"manifest": m})
	[o.kind, o.resource, o.group, o.name, o.manifest] == ["ConfigMap", "configmaps", "", "web-config", m]
	d := op("k8s_apply", {"manifest": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}})
	[d.group, d.version] == ["apps", "v1"]
}

manifest_denied(m) := d if {
	d := kubernetes.deny with input as call("k8s_apply", {"manifest": m})
}

cm(meta) := {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}

test_a_hostile_manifest_is_refused_with_its_reason if {
	manifest_denied({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}) == {`the manifest's kind "Namespace" is not one this tool applies (it applies: ConfigMap, Deployment, Service)`}
	manifest_denied({"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "x"}}) == {`the manifest's apiVersion "apps/v1" does not serve kind ConfigMap here (expected "v1")`}
	manifest_denied(cm({})) == {"the manifest needs metadata.name: a DNS name (lowercase letters, digits, '-' and '.', at most 253 characters)"}
	manifest_denied(cm({"name": "x", "namespace": "kube-system"})) == {`the manifest's namespace "kube-system" is not the call's ("demo-app"): an apply stays in its namespace`}
	manifest_denied(cm({"name": "x", "namespace": "demo-app"})) == set()
	manifest_denied(cm({"name": "x", "resourceVersion": "1"})) == {"the manifest sets metadata.resourceVersion, which the server keeps (or which would let another object own and delete it, or keep it from being deleted): leave it out"}
	"the manifest sets metadata.finalizers, which the server keeps (or which would let another object own and delete it, or keep it from being deleted): leave it out" in manifest_denied(cm({"name": "x", "finalizers": ["x"]}))
	manifest_denied({"kind": "ConfigMap", "metadata": {"name": "x"}}) == {`the manifest's apiVersion "null" does not serve kind ConfigMap here (expected "v1")`}
	manifest_denied(object.union(cm({"name": "x"}), {"status": {}})) == {"the manifest sets status, which the server keeps: leave it out"}
	"the manifest sets metadata.generateName: name the object instead (a name the server makes up cannot be approved beforehand)" in manifest_denied(cm({"generateName": "x-"}))
}

test_a_manifest_that_is_not_an_object_is_a_param_violation if {
	v := data.gateway.tools.violations with input as call("k8s_apply", {"manifest": "kind: ConfigMap"})
	{[x.param, x.problem] | some x in v} == {["manifest", "not_an_object"]}
	op("k8s_apply", {"manifest": "kind: ConfigMap"}) == null
}

# --- Signals of a change ---------------------------------------------------------

deployment(replicas, pod) := {"kind": "Deployment", "metadata": {"name": "web", "namespace": "demo-app"},
	"spec": {"replicas": replicas, "template": {"spec": pod}}}

app(image) := {"containers": [{"name": "app", "image": image}]}

k8s_signals(verb, live, planned) := s if {
	s := data.gateway.signals.signals with input as {"tool": "k8s_scale", "params": {}, "kubernetes": {"verb": verb, "live": live, "planned": planned, "changes": []}}
}

kinds_of(s) := {x.kind | some x in s}

test_a_harmless_change_has_no_signal if {
	k8s_signals("scale", deployment(2, app("web@sha256:aa")), deployment(3, app("web@sha256:aa"))) == []
}

test_scaling_to_zero_or_by_more_than_half_is_a_signal if {
	[z] := k8s_signals("scale", deployment(2, app("web:1")), deployment(0, app("web:1")))
	z.kind == "scale_to_zero"
	z.message == "scales Deployment demo-app/web to zero replicas (from 2): it stops serving"
	[h] := k8s_signals("scale", deployment(5, app("web:1")), deployment(2, app("web:1")))
	h.message == "scales Deployment demo-app/web down by more than half (5 to 2 replicas)"
	k8s_signals("scale", deployment(4, app("web:1")), deployment(2, app("web:1"))) == []
}

test_a_mutable_image_is_a_signal_when_it_is_new if {
	kinds_of(k8s_signals("set_image", deployment(1, app("web:1")), deployment(1, app("web:latest")))) == {"mutable_image"}
	kinds_of(k8s_signals("set_image", deployment(1, app("registry:5000/web:1")), deployment(1, app("registry:5000/web")))) == {"mutable_image"}
	k8s_signals("set_image", deployment(1, app("web:1")), deployment(1, app("web:2"))) == []
	k8s_signals("set_image", deployment(1, app("web:latest")), deployment(1, app("web:latest"))) == []
	k8s_signals("set_image", deployment(1, app("web:1")), deployment(1, app(sprintf("web:latest@sha256:%s", [concat("", ["a" | some _ in numbers.range(1, 64)])])))) == []
	kinds_of(k8s_signals("set_image", deployment(1, app("web:1")), deployment(1, app("web@latest")))) == {"mutable_image"}
	kinds_of(k8s_signals("set_image", deployment(1, app("web:1")), deployment(1, app("web:latest@sha256:aa")))) == {"mutable_image"}
	kinds_of(k8s_signals("apply", null, deployment(1, {"containers": [{"name": "new", "image": "x"}]}))) == {"mutable_image"}
	live := deployment(1, app("web:1"))
	kinds_of(k8s_signals("apply", live, deployment(1, {"containers": [{"name": "app", "image": "web:1"}, {"name": "side", "image": "s:latest"}]}))) == {"mutable_image"}
}

test_privilege_gained_is_a_signal_each_way if {
	pod := {"hostNetwork": true, "serviceAccountName": "admin", "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
		"containers": [{"name": "app", "image": "web:1", "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN"]}}}]}
	s := k8s_signals("apply", deployment(1, {"containers": [{"name": "app", "image": "web:1", "resources": {"limits": {"cpu": "1"}}}]}), deployment(1, pod))
	kinds_of(s) == {"privileged", "host_access", "host_path", "capabilities", "limits_removed", "service_account"}
	# Already so before: not a signal of this change.
	k8s_signals("apply", deployment(1, pod), deployment(1, pod)) == []
}

test_deleting_what_holds_data_says_so if {
	sts := {"kind": "StatefulSet", "metadata": {"name": "db", "namespace": "demo-app"}, "spec": {}}
	kinds_of(k8s_signals("delete", sts, null)) == {"delete", "delete_data"}
	kinds_of(k8s_signals("delete", deployment(1, app("web:1")), null)) == {"delete"}
}

test_a_template_change_in_production_is_a_signal if {
	scopes := object.union(data.config.scopes, {"namespaces": {"demo-app": object.union(data.config.scopes.namespaces["demo-app"], {"production": true})}})
	s := data.gateway.signals.signals with data.config.scopes as scopes with input as {"tool": "k8s_set_image", "params": {}, "kubernetes": {"verb": "set_image", "live": deployment(1, app("web:1")), "planned": deployment(1, app("web:2")), "changes": []}}
	kinds_of(s) == {"template_in_production"}
}

test_a_pods_own_spec_is_read_for_a_pod if {
	pod := {"kind": "Pod", "metadata": {"name": "p", "namespace": "demo-app"}, "spec": {"hostPID": true, "containers": []}}
	kinds_of(k8s_signals("apply", null, pod)) == {"host_access"}
}

test_an_image_from_another_repository_is_a_signal if {
	[s] := k8s_signals("set_image", deployment(1, app("registry.example/web:1")), deployment(1, app("evil.example/payload:1")))
	s.kind == "image_repository"
	s.message == `Deployment demo-app/web runs container app from another repository: "evil.example/payload" (was "registry.example/web"): other code, with the workload's credentials`
	k8s_signals("set_image", deployment(1, app("registry.example:5000/web:1")), deployment(1, app("registry.example:5000/web:2"))) == []
}

sts(n) := {"kind": "StatefulSet", "metadata": {"name": "db", "namespace": "demo-app"}, "spec": {"replicas": n}}

svc(spec) := {"kind": "Service", "metadata": {"name": "web", "namespace": "demo-app"}, "spec": spec}

test_any_scale_down_of_what_holds_data_is_a_signal if {
	kinds_of(k8s_signals("scale", sts(3), sts(2))) == {"scale_down_data"}
	k8s_signals("scale", sts(2), sts(3)) == []
}

test_host_ports_root_and_exposure_are_signals if {
	pod := {"securityContext": {"runAsUser": 0}, "containers": [{"name": "app", "image": "web:1", "ports": [{"containerPort": 80, "hostPort": 80}]}]}
	kinds_of(k8s_signals("apply", deployment(1, app("web:1")), deployment(1, pod))) == {"host_port", "run_as_root"}
	kinds_of(k8s_signals("apply", svc({}), svc({"type": "LoadBalancer"}))) == {"exposed"}
	kinds_of(k8s_signals("apply", null, svc({"externalIPs": ["1.2.3.4"]}))) == {"exposed"}
	k8s_signals("apply", svc({"type": "NodePort"}), svc({"type": "NodePort"})) == []
	k8s_signals("apply", null, svc({})) == []
}

test_a_secret_handed_to_pods_is_a_signal_each_way if {
	vol := {"volumes": [{"name": "s", "secret": {"secretName": "db"}}], "containers": [{"name": "app", "image": "web:1"}]}
	from := {"containers": [{"name": "app", "image": "web:1", "envFrom": [{"secretRef": {"name": "api"}}]}]}
	ref := {"containers": [{"name": "app", "image": "web:1", "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "tls", "key": "k"}}}]}]}
	[s] := k8s_signals("apply", deployment(1, app("web:1")), deployment(1, vol))
	s.message == `Deployment demo-app/web gives its pods' code the Secret "db" (a volume or env): whatever runs there can read it`
	kinds_of(k8s_signals("apply", deployment(1, app("web:1")), deployment(1, from))) == {"secret_exposed"}
	kinds_of(k8s_signals("apply", deployment(1, app("web:1")), deployment(1, ref))) == {"secret_exposed"}
	# Already so before: not a signal of this change.
	k8s_signals("apply", deployment(1, vol), deployment(1, vol)) == []
}

# Padding a manifest with changes cannot push a risky field out of the
# approver's sight unannounced: a change whose list of changed fields was
# cut for the page (its last entry names the rest) is a signal.
k8s_signals_with(verb, live, planned, changes) := s if {
	s := data.gateway.signals.signals with input as {"tool": "k8s_apply", "params": {}, "kubernetes": {"verb": verb, "live": live, "planned": planned, "changes": changes}}
}

test_more_changes_than_a_person_is_shown_is_a_signal if {
	live := deployment(1, app("web@sha256:aa"))
	shown := [{"path": sprintf("metadata.annotations.pad-%d", [i]), "before": null, "after": "x"} | some i in numbers.range(1, 64)]
	cut := array.concat(shown, [{"path": "(and 6 more changed attributes: metadata.annotations.pad-65, …)", "before": null, "after": null}])
	[s] := k8s_signals_with("apply", live, live, cut)
	s.kind == "large_change"
	s.message == "changes more fields of Deployment demo-app/web than the approval page shows with their values (it shows 64 and names the rest): read the whole manifest (its params) before approving"
	# All of them shown: no signal; nor for a creation, whose params are
	# the whole object.
	k8s_signals_with("apply", live, live, shown) == []
	not "large_change" in kinds_of(k8s_signals_with("apply", null, live, cut))
}
