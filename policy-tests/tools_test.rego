# The tool catalog: params, tiers, annotations, per-client visibility.
package gateway_test.tools

import data.gateway.tools

call(tool, params) := {"tool": tool, "params": params, "principal": {"client": "c", "os_user": "u"}}

test_tiers_come_from_the_catalog if {
	tools.tier == "low" with input as call("k8s_get_pod_status", {})
	tools.tier == "low" with input as call("terraform_plan", {})
	tools.tier == "high" with input as call("terraform_apply", {})
}

test_unknown_tool_is_high_tier if {
	tools.tier == "high" with input as call("rm_rf", {})
}

test_annotations_come_from_the_catalog if {
	a := tools.annotations with input as call("terraform_plan", {})
	a == {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": true}
}

test_missing_required_param_is_denied if {
	r := tools.deny with input as call("k8s_get_pod_status", {})
	r == {`missing required param "namespace"`}
}

test_optional_param_may_be_left_out if {
	r := tools.deny with input as call("terraform_apply", {"working_dir": "terraform/offline-demo"})
	r == set()
}

test_optional_param_may_be_given if {
	r := tools.deny with input as call("terraform_apply", {"working_dir": "terraform/offline-demo", "approval_id": "ap-1"})
	r == set()
}

test_unknown_param_is_denied if {
	r := tools.deny with input as call("k8s_get_pod_status", {"namespace": "demo-app", "role": "admin"})
	r == {`unknown param "role" for tool "k8s_get_pod_status"`}
}

test_non_string_param_is_denied if {
	r := tools.deny with input as call("k8s_get_pod_status", {"namespace": ["demo-app"]})
	r == {`param "namespace" must be a string`}
}

test_overlong_param_is_denied if {
	r := tools.deny with input as call("k8s_get_pod_status", {"namespace": concat("", [x | some _ in numbers.range(1, 64); x := "a"])})
	r == {`param "namespace" is longer than 63 characters`}
}

test_params_that_are_not_an_object_are_denied if {
	r := tools.deny with input as call("terraform_plan", "working_dir=x")
	`params must be an object` in r
}

test_missing_params_count_as_empty if {
	r := tools.deny with input as {"tool": "terraform_plan"}
	r == {`missing required param "working_dir"`}
}

test_tool_restricted_to_some_clients_is_hidden_and_denied_for_others if {
	catalog := object.union(data.config.tools, {"terraform_apply": object.union(data.config.tools.terraform_apply, {"clients": ["ops-console"]})})
	l := tools.visible with data.config.tools as catalog with input as call("terraform_plan", {})
	not l.terraform_apply
	l.terraform_plan
	r := tools.deny with data.config.tools as catalog with input as call("terraform_apply", {"working_dir": "terraform/offline-demo"})
	r == {`tool "terraform_apply" is not available to client "c"`}
}

test_tool_restricted_to_some_clients_is_allowed_for_them if {
	catalog := object.union(data.config.tools, {"terraform_apply": object.union(data.config.tools.terraform_apply, {"clients": ["ops-console"]})})
	inp := object.union(call("terraform_apply", {"working_dir": "terraform/offline-demo"}), {"principal": {"client": "ops-console"}})
	r := tools.deny with data.config.tools as catalog with input as inp
	r == set()
}

test_an_empty_catalog_has_no_tools if {
	r := tools.deny with data.config.tools as {} with input as call("k8s_get_pod_status", {"namespace": "demo-app"})
	r == {`unknown tool "k8s_get_pod_status": the policy's tool catalog does not list it`}
}

# --- Lengths are characters, under OPA and regorus alike --------------------

emoji(n) := concat("", ["😀" | some _ in numbers.range(1, n)])

test_a_namespace_of_63_emoji_is_not_too_long if {
	v := tools.violations with input as {"tool": "k8s_get_pod_status", "params": {"namespace": emoji(63)}, "principal": {"client": "c", "os_user": "u"}}
	v == set()
}

test_a_namespace_of_64_emoji_is_too_long if {
	v := tools.violations with input as {"tool": "k8s_get_pod_status", "params": {"namespace": emoji(64)}, "principal": {"client": "c", "os_user": "u"}}
	[x.problem | some x in v] == ["too_long"]
}

test_a_namespace_of_200_emoji_is_too_long if {
	v := tools.violations with input as {"tool": "k8s_get_pod_status", "params": {"namespace": emoji(200)}, "principal": {"client": "c", "os_user": "u"}}
	[x.problem | some x in v] == ["too_long"]
}

test_a_long_unknown_param_name_is_quoted_short if {
	name := concat("", ["é" | some _ in numbers.range(1, 500)])
	v := tools.violations with input as {"tool": "terraform_plan", "params": {"working_dir": "terraform/offline-demo", name: "x"}, "principal": {"client": "c", "os_user": "u"}}
	[x] := [y | some y in v]
	x.problem == "unknown"
	x.param == concat("", [substring(name, 0, 64), "…"])
	x.message == sprintf("unknown param %q for tool \"terraform_plan\"", [x.param])
}

# A catalog line that gives the apply runner to a low tier or read-only tool
# would apply without a person's approval: the catalog never does.
test_every_tool_run_by_the_apply_runner_is_high_tier_and_destructive if {
	appliers := {n: e | some n, e in data.config.tools; e.runner == "terraform_apply"}
	count(appliers) > 0
	every _, e in appliers {
		e.tier == "high"
		e.annotations.destructiveHint
		not e.annotations.readOnlyHint
	}
}

test_every_catalog_param_is_bounded if {
	every _, entry in data.config.tools {
		every _, spec in entry.params {
			bounded(spec)
		}
	}
}

bounded(spec) if {
	tools.param_type(spec) == "string"
	is_number(spec.max_length)
}

bounded(spec) if {
	tools.param_type(spec) == "integer"
	is_number(spec.minimum)
	is_number(spec.maximum)
}

bounded(spec) if tools.param_type(spec) == "boolean"

# An object param (a manifest) is bounded by the call's arguments' size
# (calls.rego) and must name the kinds it takes.
bounded(spec) if {
	tools.param_type(spec) == "object"
	count(spec.kinds) > 0
}

# --- Typed params: integers, booleans, patterns, listed choices -------------

logs(params) := call("k8s_logs", object.union({"namespace": "demo-app", "name": "web-1"}, params))

problems(params) := p if {
	v := tools.violations with input as logs(params)
	p := {[x.param, x.problem] | some x in v}
}

test_an_integer_param_takes_whole_numbers_in_its_range if {
	problems({"tail_lines": 1}) == set()
	problems({"tail_lines": 2000}) == set()
	problems({"tail_lines": 5.0}) == set()
	problems({"tail_lines": 2.5}) == {["tail_lines", "not_an_integer"]}
	problems({"tail_lines": "10"}) == {["tail_lines", "not_an_integer"]}
	problems({"tail_lines": 0}) == {["tail_lines", "out_of_range"]}
	problems({"tail_lines": 2001}) == {["tail_lines", "out_of_range"]}
}

test_an_out_of_range_message_names_the_range if {
	r := tools.deny with input as logs({"tail_lines": 0})
	r == {`param "tail_lines" must be between 1 and 2000`}
}

test_a_range_with_one_bound_says_that_bound if {
	catalog := {"t": {"title": "t", "description": "d", "tier": "low", "runner": "r", "annotations": {}, "params": {
		"lo": {"type": "integer", "minimum": 3, "description": "d"},
		"hi": {"type": "integer", "maximum": 3, "description": "d"},
	}}}
	r := tools.deny with data.config.tools as catalog with input as call("t", {"lo": 2, "hi": 4})
	r == {`param "lo" must be at least 3`, `param "hi" must be at most 3`}
}

test_a_boolean_param_takes_true_or_false_only if {
	problems({"previous": true}) == set()
	problems({"previous": false}) == set()
	problems({"previous": "true"}) == {["previous", "not_a_boolean"]}
	problems({"previous": 1}) == {["previous", "not_a_boolean"]}
}

test_a_string_param_with_a_pattern_must_match_it if {
	problems({"name": "web-5c4b.x"}) == set()
	problems({"name": "--raw=/api"}) == {["name", "no_match"]}
	problems({"name": "Web"}) == {["name", "no_match"]}
	problems({"name": "web-"}) == {["name", "no_match"]}
	problems({"name": "a b"}) == {["name", "no_match"]}
}

test_a_string_too_long_for_its_pattern_is_only_too_long if {
	problems({"name": concat("", ["a" | some _ in numbers.range(1, 254)])}) == {["name", "too_long"]}
}

test_a_param_with_listed_choices_takes_only_those if {
	v := {[x.param, x.problem] | some x in tools.violations} with input as call("k8s_get", {"namespace": "demo-app", "kind": "nodes"})
	v == {["kind", "not_allowed"]}
	r := tools.deny with input as call("k8s_rollout_status", {"namespace": "demo-app", "kind": "pods", "name": "x"})
	r == {`param "kind" must be one of: deployments, statefulsets, daemonsets`}
}

test_tools_list_shows_listed_choices_as_the_enum if {
	l := tools.visible with input as call("k8s_get", {})
	l.k8s_rollout_status.params.kind.enum == ["deployments", "statefulsets", "daemonsets"]
	l.k8s_logs.params.tail_lines.type == "integer"
	l.k8s_get.params.namespace.enum == ["demo-app"]
}

test_every_catalog_param_has_a_description if {
	every _, entry in data.config.tools {
		every _, spec in entry.params {
			is_string(spec.description)
			spec.description != ""
		}
	}
}

# --- What tools/list shows of the params ------------------------------------

test_tools_list_shows_the_allowed_namespaces_and_modules_as_choices if {
	l := tools.visible with input as call("terraform_plan", {})
	l.k8s_get_pod_status.params.namespace.enum == ["demo-app"]
	l.terraform_plan.params.working_dir.enum == ["terraform/k8s-demo", "terraform/offline-demo"]
	l.terraform_apply.params.working_dir.enum == ["terraform/k8s-demo", "terraform/offline-demo"]
	not l.terraform_apply.params.approval_id.enum
	l.terraform_apply.runner == "terraform_apply"
	l.terraform_apply.task == true
	l.k8s_get_pod_status.task == false
}

test_choices_follow_the_scopes_tables if {
	l := tools.visible with data.config.scopes as {"namespaces": {"b": {}, "a": {}}, "modules": {"m": {}}} with input as call("terraform_plan", {})
	l.k8s_get_pod_status.params.namespace.enum == ["a", "b"]
	l.terraform_plan.params.working_dir.enum == ["m"]
}

test_choices_naming_no_table_show_no_allowed_value if {
	catalog := {"t": {"title": "t", "description": "d", "tier": "low", "runner": "r", "annotations": {}, "params": {"x": {"max_length": 3, "choices": "nope"}}}}
	l := tools.visible with data.config.tools as catalog with input as call("t", {})
	l.t.params.x.enum == []
}

test_a_tool_kept_from_a_client_says_nothing_of_its_params if {
	catalog := object.union(data.config.tools, {"terraform_apply": object.union(data.config.tools.terraform_apply, {"clients": ["ops-console"]})})
	r := tools.deny with data.config.tools as catalog with input as call("terraform_apply", {"nope": 1})
	r == {`tool "terraform_apply" is not available to client "c"`}
}
