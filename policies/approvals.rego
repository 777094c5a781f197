# Approval requirements.
#
# A call needs a person's approval when its tool is high risk, or when it
# changes something (not read-only) and the plan carries any signal. Signals
# on a read-only tool (terraform_plan) are shown to the agent, not gated:
# nothing is changed by planning. The number of approvers, the approval's
# lifetime and whether a reason is required come from config/approvals/data.yaml.
package gateway.approvals

import data.gateway.signals
import data.gateway.tools

cfg := data.config.approvals

default required := false

required if tools.tier == "high"

required if {
	not tools.annotations.readOnlyHint
	count(signals.signals) > 0
}

# Destructive (or not understood) plans use the stricter settings.
settings := cfg.destructive if count(signals.signals) > 0

else := cfg.standard

# Distinct people who approved the approval presented with this call; the
# person who requested the call never counts for it.
approvers := {a |
	some a in input.approval.approvers
	a != object.get(input.approval, "requested_by", "")
}

# True when no approval is needed, or the presented approval is granted by
# enough distinct people.
default satisfied := false

satisfied if not required

satisfied if {
	input.approval.status == "approved"
	count(approvers) >= settings.approvers
}

requirement := {
	"required": required,
	"approvers": settings.approvers,
	"ttl_seconds": settings.ttl_seconds,
	"reason_required": settings.reason_required,
	"satisfied": satisfied,
}

# The identity an approval or denial is recorded under, asked by the CLI
# with input {"os_user", "uid", "groups", "channel", "named"}: the OS user
# the kernel named on the daemon's socket (channel "daemon"), or the user of
# a direct command on a private state dir (channel "direct"). Undefined
# (refused) when that user may not approve, or --as is used and not allowed.
approver := input.os_user if {
	not input.named
	may_approve
}

approver := input.named if {
	input.named
	input.channel == "direct"
	cfg.identity.allow_as
}

# Who may approve and deny calls, and read every user's approvals and the
# audit log through the daemon: the users and groups the configuration
# names. Everyone else sees only their own approvals. A direct command
# works on a state dir its user owns, so it is that user's.
default may_approve := false

may_approve if input.channel == "direct"

may_approve if input.os_user in cfg.identity.users

may_approve if {
	some g in input.groups
	g in cfg.identity.groups
}

# Which operator command a caller may run through the daemon (input as for
# `approver`, plus "command": "approvals", "audit" or "vault status"):
# approvers may run every one; anyone in the socket's group may run those
# listed in `anyone` (with `approvals`, a caller who is not an approver sees
# only their own).
default may_run := false

may_run if may_approve

may_run if input.command in cfg.identity.anyone
