# End-to-end tests of data.gateway.decision: one per tool, allow and deny,
# and the contract's shape.
package gateway_test.decision

import data.gateway

principal := {"client": "test-client", "os_user": "alice"}

call(tool, params) := {
	"tool": tool,
	"params": params,
	"request_id": "req-test",
	"now": "2026-11-29T10:00:00Z",
	"principal": principal,
}

decide(tool, params) := d if {
	d := gateway.decision with input as call(tool, params)
}

test_pod_status_in_allowed_namespace_is_allowed_with_a_pod_reader_credential if {
	d := decide("k8s_get_pod_status", {"namespace": "demo-app"})
	d.allow
	d.deny_reasons == []
	d.tier == "low"
	d.credential == {
		"kind": "pod_reader",
		"type": "kubernetes",
		"mount": "kubernetes",
		"role": "gateway-pod-reader-demo-app",
		"params": {"kubernetes_namespace": "demo-app", "ttl": "10m"},
	}
	d.sandbox.egress == ["kube-apiserver"]
	not d.approval.required
}

test_pod_status_outside_the_allowlist_is_denied_without_credential if {
	d := decide("k8s_get_pod_status", {"namespace": "kube-system"})
	not d.allow
	d.credential == null
	d.deny_reasons == [`namespace "kube-system" is not in the allowlist (allowed: demo-app)`]
}

test_plan_of_the_offline_module_needs_no_credential_and_no_network if {
	d := decide("terraform_plan", {"working_dir": "terraform/offline-demo"})
	d.allow
	d.credential == null
	d.sandbox.egress == []
	d.sandbox.deadline_seconds == 300
	not d.approval.required
}

test_plan_of_the_cluster_module_gets_a_plan_credential if {
	d := decide("terraform_plan", {"working_dir": "terraform/k8s-demo"})
	d.allow
	d.credential.role == "gateway-tf-plan-demo-app"
	d.credential.params.kubernetes_namespace == "demo-app"
}

test_apply_is_high_tier_and_always_needs_approval if {
	d := decide("terraform_apply", {"working_dir": "terraform/k8s-demo"})
	d.allow
	d.tier == "high"
	d.approval.required
	not d.approval.satisfied
	d.annotations.destructiveHint
	d.credential.role == "gateway-tf-apply-demo-app"
	d.credential.params.ttl == "15m"
}

test_unknown_tool_is_denied_with_cautious_defaults if {
	d := decide("kubectl_delete_namespace", {"namespace": "demo-app"})
	not d.allow
	d.deny_reasons == [`unknown tool "kubectl_delete_namespace": the policy's tool catalog does not list it`]
	d.tier == "high"
	d.annotations.destructiveHint
	d.credential == null
	d.approval.required
}

test_missing_tool_is_denied if {
	d := gateway.decision with input as {"params": {}}
	not d.allow
	d.deny_reasons == [`unknown tool "": the policy's tool catalog does not list it`]
}

test_every_field_of_the_contract_is_present if {
	d := decide("nope", {})
	object.keys(d) == {"allow", "deny_reasons", "violations", "runner", "tier", "annotations", "credential", "sandbox", "signals", "approval", "operation"}
	d.operation == null
	object.keys(d.approval) == {"required", "approvers", "ttl_seconds", "reason_required", "satisfied"}
	object.keys(d.sandbox) == {"cpu", "memory", "deadline_seconds", "module_copy_bytes", "module_copy_files", "file_out_bytes", "module_wait_seconds", "max_processes", "file_bytes", "output_bytes", "plan_json_bytes", "disk_bytes", "egress"}
}

test_deny_reasons_are_sorted_and_all_reported if {
	d := decide("terraform_plan", {"working_dir": "/etc/../x", "extra": "1"})
	not d.allow
	count(d.deny_reasons) == 4
	d.deny_reasons == sort(d.deny_reasons)
}

test_param_problems_are_data_and_reasons if {
	d := decide("terraform_apply", {"working_dir": 7, "extra": "1"})
	not d.allow
	d.violations == [
		{"param": "working_dir", "problem": "not_a_string", "message": `param "working_dir" must be a string`},
		{"param": "extra", "problem": "unknown", "message": `unknown param "extra" for tool "terraform_apply"`},
	]
	every v in d.violations {
		v.message in d.deny_reasons
	}
}

test_the_catalog_names_each_tools_runner if {
	decide("k8s_get_pod_status", {"namespace": "demo-app"}).runner == "kubectl_get_pods"
	decide("terraform_apply", {"working_dir": "terraform/offline-demo"}).runner == "terraform_apply"
	decide("nope", {}).runner == null
}

test_a_call_with_good_params_has_no_violations if {
	decide("terraform_plan", {"working_dir": "/etc"}).violations == []
}

test_tool_list_shows_catalog_tools_to_every_client_by_default if {
	l := gateway.tool_list with input as {"principal": principal}
	object.keys(l) == object.keys(data.config.tools)
	{"k8s_get_pod_status", "terraform_plan", "terraform_apply", "k8s_logs"} - object.keys(l) == set()
	l.terraform_apply.tier == "high"
	l.k8s_get_pod_status.annotations.readOnlyHint
}
