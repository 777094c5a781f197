# The policies and the Vault setup (config/vault_roles/data.yaml, what
# `gateway vault setup` creates) cannot drift apart.
package gateway_test.vault_roles

import data.gateway.scope

scopes := data.config.scopes

roles := data.config.vault_roles.roles

# Every (role, mount, namespace) any tool can derive for any allowed target.
derivable contains [role, scopes.credential_kinds[kind].mount, ns] if {
	some kind, role
	scopes.namespaces[ns].roles[kind] = role
}

derivable contains [role, scopes.credential_kinds[kind].mount, entry.namespace] if {
	some kind, role
	entry := scopes.modules[_]
	entry.roles[kind] = role
}

undefined contains d if {
	some d in derivable
	not roles[d[0]]
}

undefined contains d if {
	some d in derivable
	[roles[d[0]].mount, roles[d[0]].namespace] != [d[1], d[2]]
}

test_every_role_the_policies_can_derive_is_defined_by_the_vault_setup if {
	count(derivable) >= 3
	undefined == set()
}

test_the_drift_check_finds_a_role_the_setup_lacks if {
	fewer := object.remove(roles, ["gateway-pod-reader-demo-app"])
	u := undefined with data.config.vault_roles.roles as fewer
	u == {["gateway-pod-reader-demo-app", "kubernetes", "demo-app"]}
}

test_the_drift_check_finds_a_role_set_up_for_another_namespace if {
	moved := object.union(roles, {"gateway-tf-apply-demo-app": object.union(roles["gateway-tf-apply-demo-app"], {"namespace": "prod"})})
	u := undefined with data.config.vault_roles.roles as moved
	u == {["gateway-tf-apply-demo-app", "kubernetes", "demo-app"]}
}

call(tool, params) := {"tool": tool, "params": params, "principal": {"client": "c", "os_user": "u"}}

pods := call("k8s_get_pod_status", {"namespace": "demo-app"})

test_a_derived_role_the_setup_does_not_define_is_refused if {
	r := scope.deny with data.config.vault_roles.roles as {} with input as pods
	r == {`credential role "gateway-pod-reader-demo-app" is not defined by the Vault setup (config/vault_roles/data.yaml)`}
}

test_a_role_set_up_for_another_namespace_is_refused if {
	other := {"gateway-pod-reader-demo-app": object.union(roles["gateway-pod-reader-demo-app"], {"namespace": "kube-system"})}
	r := scope.deny with data.config.vault_roles.roles as other with input as pods
	r == {`credential role "gateway-pod-reader-demo-app" is set up for namespace "kube-system", not "demo-app"`}
}

test_a_role_set_up_on_another_mount_is_refused if {
	other := {"gateway-pod-reader-demo-app": object.union(roles["gateway-pod-reader-demo-app"], {"mount": "k8s-prod"})}
	r := scope.deny with data.config.vault_roles.roles as other with input as pods
	r == {`credential role "gateway-pod-reader-demo-app" is set up for mount "k8s-prod", not "kubernetes"`}
}

test_the_defined_role_has_no_deny if {
	scope.deny == set() with input as pods
}

# A credential kind may not ask for a longer TTL than its role's max_ttl
# (Vault would cap it silently).
too_long contains [role, kind] if {
	some kind, role
	scopes.namespaces[_].roles[kind] = role
	time.parse_duration_ns(scopes.credential_kinds[kind].ttl) > time.parse_duration_ns(roles[role].max_ttl)
}

too_long contains [role, kind] if {
	some kind, role
	scopes.modules[_].roles[kind] = role
	time.parse_duration_ns(scopes.credential_kinds[kind].ttl) > time.parse_duration_ns(roles[role].max_ttl)
}

test_no_credential_kind_asks_for_more_than_its_roles_max_ttl if {
	count(derivable) >= 3
	too_long == set()
}

test_the_ttl_check_finds_a_kind_asking_too_much if {
	longer := object.union(scopes.credential_kinds, {"pod_reader": object.union(scopes.credential_kinds.pod_reader, {"ttl": "2h"})})
	t := too_long with data.config.scopes.credential_kinds as longer
	t == {["gateway-pod-reader-demo-app", "pod_reader"]}
}
