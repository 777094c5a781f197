# Allowlists and credential scope derivation.
package gateway_test.scope

import data.gateway.scope

call(tool, params) := {"tool": tool, "params": params, "principal": {"client": "c", "os_user": "u"}}

plan(wd) := call("terraform_plan", {"working_dir": wd})

test_working_dir_with_dotdot_is_denied if {
	r := scope.deny with input as plan("../../etc")
	`working_dir "../../etc" contains '..': paths may not leave the allowed module dirs` in r
}

test_working_dir_escaping_from_an_allowed_prefix_is_denied if {
	r := scope.deny with input as plan("terraform/k8s-demo/../../secrets")
	`working_dir "terraform/k8s-demo/../../secrets" contains '..': paths may not leave the allowed module dirs` in r
	scope.credential == null with input as plan("terraform/k8s-demo/../../secrets")
}

test_working_dir_with_backslash_dotdot_is_denied if {
	r := scope.deny with input as plan(`terraform\..\..\etc`)
	count(r) == 2
}

test_absolute_working_dir_is_denied if {
	r := scope.deny with input as plan("/work/main/terraform/k8s-demo")
	`working_dir "/work/main/terraform/k8s-demo" is absolute: name an allowed module dir relative to the repository` in r
}

test_unlisted_working_dir_is_denied if {
	r := scope.deny with input as plan("terraform")
	r == {`working_dir "terraform" is not an allowed module dir (allowed: terraform/k8s-demo, terraform/offline-demo)`}
}

test_trailing_slash_is_not_the_same_dir if {
	r := scope.deny with input as plan("terraform/k8s-demo/")
	count(r) == 1
}

test_allowed_working_dir_has_no_deny if {
	r := scope.deny with input as plan("terraform/k8s-demo")
	r == set()
}

test_the_namespace_comes_from_policy_data_not_from_the_agent if {
	c := scope.credential with input as call("terraform_apply", {"working_dir": "terraform/k8s-demo", "namespace": "kube-system"})
	c.params.kubernetes_namespace == "demo-app"
}

test_target_without_a_role_for_the_tool_has_no_scope if {
	modules := {"terraform/k8s-demo": {"namespace": "demo-app", "roles": {"terraform_plan": "p"}}}
	r := scope.deny with data.config.scopes as with_scopes("modules", modules) with input as call("terraform_apply", {"working_dir": "terraform/k8s-demo"})
	r == {`no credential scope: the policy has no "terraform_apply" role for this target`}
}

test_namespace_without_a_role_has_no_scope if {
	r := scope.deny with data.config.scopes as with_scopes("namespaces", {"demo-app": {"roles": {}}}) with input as call("k8s_get_pod_status", {"namespace": "demo-app"})
	r == {`no credential scope: the policy has no "pod_reader" role for this target`}
}

test_module_marked_credential_none_needs_no_scope if {
	r := scope.deny with input as call("terraform_apply", {"working_dir": "terraform/offline-demo"})
	r == set()
	scope.credential == null with input as call("terraform_apply", {"working_dir": "terraform/offline-demo"})
}

test_egress_follows_the_credential if {
	scope.egress == ["kube-apiserver"] with input as call("k8s_get_pod_status", {"namespace": "demo-app"})
	scope.egress == [] with input as call("k8s_get_pod_status", {"namespace": "other"})
}

test_a_second_namespace_added_to_data_is_allowed_with_its_own_role if {
	namespaces := object.union(data.config.scopes.namespaces, {"staging": {"roles": {"pod_reader": "gateway-pod-reader-staging"}}})
	c := scope.credential with data.config.scopes.namespaces as namespaces with input as call("k8s_get_pod_status", {"namespace": "staging"})
	c.role == "gateway-pod-reader-staging"
	c.params.kubernetes_namespace == "staging"
}

test_a_module_whose_configuration_keeps_state_elsewhere_is_denied if {
	base := {"tool": "terraform_apply", "params": {"working_dir": "terraform/offline-demo"}, "principal": {"client": "c", "os_user": "u"}}
	d := data.gateway.decision with input as object.union(base, {"plan_config_files": {"m-/backend.tf": {"terraform": {"backend": {"local": {"path": "elsewhere.tfstate"}}}}}})
	not d.allow
	some r in d.deny_reasons
	startswith(r, "\"m-/backend.tf\" declares a backend block")
	c := data.gateway.decision with input as object.union(base, {"plan_config_files": {"m-/c.tf.json": {"terraform": [{"required_version": ">= 1"}, {"cloud": {}}]}}})
	not c.allow
	# A value that merely says "backend" is no backend block.
	ok := data.gateway.decision with input as object.union(base, {"plan_config_files": {"m-/main.tf": {"resource": {"kubernetes_ingress": {"i": {"backend": {"service": "x"}}}}, "terraform": {"required_version": ">= 1"}}}})
	ok.allow
}

# The scopes table with one key replaced. The whole document is replaced
# (`with data.config.scopes as …`), not one key of it: OPA does not apply
# `with data.config.scopes.namespaces` to rules that read data.config.scopes.
with_scopes(key, value) := object.union(object.remove(data.config.scopes, [key]), {key: value})

test_a_working_dir_that_is_too_long_is_not_echoed_by_the_allowlist_rules if {
	wd := concat("", ["/" | some _ in numbers.range(1, 300)])
	r := scope.deny with input as call("terraform_plan", {"working_dir": wd})
	r == set()
}
