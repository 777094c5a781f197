# Sandbox limits: CPU, memory, wall-clock deadline and network egress for the
# throwaway sandbox a call runs in. Limits come from config/sandbox/data.yaml
# (per-tool overrides over a default); egress comes from the credential: a
# sandbox may reach only the endpoints its credential is for, and nothing at
# all without one.
package gateway.sandbox


cfg := data.config.sandbox

overrides := object.get(cfg.tools, object.get(input, "tool", ""), {})

merged := object.union(cfg.base, overrides)

limits := {
	"cpu": merged.cpu,
	"memory": merged.memory,
	"deadline_seconds": merged.deadline_seconds,
	"module_copy_bytes": merged.module_copy_bytes,
	"module_copy_files": merged.module_copy_files,
	"file_out_bytes": merged.file_out_bytes,
	"module_wait_seconds": merged.module_wait_seconds,
	"max_processes": merged.max_processes,
	"file_bytes": merged.file_bytes,
	"output_bytes": merged.output_bytes,
	"plan_json_bytes": merged.plan_json_bytes,
	"disk_bytes": merged.disk_bytes,
	"egress": data.gateway.scope.egress,
}
