# Sandbox limits: CPU, memory, wall-clock deadline and network egress for the
# throwaway sandbox a call runs in. Limits come from config/sandbox/data.yaml
# (per-tool overrides over a default); egress comes from the credential: a
# sandbox may reach only the endpoints its credential is for, and nothing at
# all without one.
package gateway.sandbox


cfg := data.config.sandbox

overrides := object.get(cfg.tools, object.get(input, "tool", ""), {})

# An upstream MCP server's call: a deadline past its own timeout (so that
# the runner's clear "timeout" comes first) and room in the output for
# everything it may write, twice over (the report re-encodes it). A
# per-tool override still wins.
default upstream_limits := {}

upstream_limits := {
	"deadline_seconds": op.timeout_seconds + 30,
	"output_bytes": max([cfg.base.output_bytes, (2 * op.max_result_bytes) + 65536]),
} if {
	op := data.gateway.upstreams.operation
	op != null
	# (Not numbers: upstreams.rego refuses the call.)
	is_number(op.timeout_seconds)
	is_number(op.max_result_bytes)
}

merged := object.union(object.union(cfg.base, upstream_limits), overrides)

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
