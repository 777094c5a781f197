# Sandbox limits.
package gateway_test.sandbox

import data.gateway.sandbox

call(tool, params) := {"tool": tool, "params": params, "principal": {"client": "c", "os_user": "u"}}

test_default_limits_apply_to_tools_without_overrides if {
	l := sandbox.limits with input as call("k8s_get_pod_status", {"namespace": "demo-app"})
	l == {"cpu": "500m", "memory": "512Mi", "deadline_seconds": 120, "module_copy_bytes": 67108864, "module_copy_files": 10000, "file_out_bytes": 67108864, "module_wait_seconds": 30, "max_processes": 256, "file_bytes": 268435456, "output_bytes": 1048576, "plan_json_bytes": 16777216, "disk_bytes": 1073741824, "egress": ["kube-apiserver"]}
}

test_per_tool_overrides_merge_over_the_default if {
	l := sandbox.limits with input as call("terraform_apply", {"working_dir": "terraform/offline-demo"})
	l == {"cpu": "500m", "memory": "512Mi", "deadline_seconds": 600, "module_copy_bytes": 67108864, "module_copy_files": 10000, "file_out_bytes": 67108864, "module_wait_seconds": 30, "max_processes": 256, "file_bytes": 268435456, "output_bytes": 1048576, "plan_json_bytes": 16777216, "disk_bytes": 1073741824, "egress": []}
}

test_unknown_tools_get_the_default_limits_and_no_egress if {
	l := sandbox.limits with input as call("mystery", {})
	l.deadline_seconds == 120
	l.egress == []
}
