# Approval requirements.
#
# A call needs a person's approval when its tool is high risk, or when it
# changes something (not read-only) and the plan carries any signal. Signals
# on a read-only tool (terraform_plan) are shown to the agent, not gated:
# nothing is changed by planning. The number of approvers, the approval's
# lifetime and whether a reason is required come from config/approvals/data.yaml.
package gateway.approvals


cfg := data.config.approvals

default required := false

required if data.gateway.tools.tier == "high"

required if {
	not data.gateway.tools.annotations.readOnlyHint
	count(data.gateway.signals.signals) > 0
}

# Destructive (or not understood) plans use the stricter settings.
settings := cfg.destructive if count(data.gateway.signals.signals) > 0

else := cfg.standard

# Distinct identities that approved the approval presented with this call,
# as the gateway proved them again for this decision (SSH signatures
# re-checked against today's allowed signers, OS users' groups looked up
# again): the requester never counts, and neither does an identity the
# policy no longer admits for this call.
approvers := {person(a) |
	ids := object.get(input.approval, "identities", [])
	some a in ids
	counts(a)
	not counted_as_signer(a, ids)
}

# The call's signals now, and those its approvers were shown (a saved plan
# that no longer reads gives none now: what was recorded still counts).
spend_call := call_facts(input.tool, input.params, array.concat(data.gateway.signals.signals, object.get(input.approval, "signals", [])))

# A grant that counts for this call now.
counts(a) if {
	not is_requester(a, requester_names(input.approval))
	admitted(a)
	in_scope(a, spend_call)
	not token_only_on_destructive(a, spend_call)
}

# A bearer token proves whose token it is, not that a person is there: the
# agent holds its person's token. So an SSO verdict alone does not grant a
# destructive change (one with signals) unless identity.sso_destructive
# says it may; a passkey (user verification) or a signed key does.
token_only_on_destructive(id, call) if {
	id.kind == "sso"
	count(call.signal_kinds) > 0
	not object.get(cfg.identity, "sso_destructive", false)
}

# The person an identity is: an OS user is itself; a key's principal is a
# person of that name unless identity.owners names the OS user who holds
# it (so that one person's account and key count once).
person(id) := object.get(object.get(cfg.identity, "owners", {}), id.name, id.name) if id.kind in {"ssh_key", "passkey"}

person(id) := id.name if not id.kind in {"ssh_key", "passkey", "sso"}

# An SSO identity is the person identity.sso_people names for it, else the
# person its e-mail's (or username's) local part names: bob@corp.example
# and the OS user bob count once (two people who share a local part count
# once too: fewer grants, never more).
person(id) := object.get(
	object.get(cfg.identity, "sso_people", {}),
	id.name,
	split(object.get(id, "email", id.name), "@")[0],
) if id.kind == "sso"

# Every name the requester goes by: the identity that requested the call
# (`requested_by`: an OS user's name, or `sso:<issuer>#<subject>`) and, for
# an SSO requester (`requester`), its username, its e-mail, that e-mail's
# local part (an OS user or key principal named like it is taken to be the
# same person: a wrong guess only refuses a grant) and the OS user
# identity.sso_people names for its username.
requester_names(approval) := {n |
	some n in array.concat([object.get(approval, "requested_by", "")], sso_names(object.get(approval, "requester", null)))
	n != ""
}

sso_names(r) := names if {
	is_object(r)
	r.kind == "sso"
	email := object.get(r, "email", "")
	names := [
		r.user, email, split(email, "@")[0],
		object.get(object.get(cfg.identity, "sso_people", {}), r.user, ""),
	]
} else := []

# The requester, by any of its names: its OS user, a key listed under one
# (among any of the key's principals), or a key its OS user owns.
is_requester(id, names) if id.name in names

is_requester(id, names) if {
	some p in object.get(id, ["key", "principals"], [])
	p in names
}

is_requester(id, names) if person(id) in names

# An SSO approver is the requester under its id, its e-mail's local part,
# or the OS user identity.sso_people names for it.
is_requester(id, names) if {
	id.kind == "sso"
	some n in [
		object.get(id, "id", ""),
		split(object.get(id, "email", ""), "@")[0],
		object.get(object.get(cfg.identity, "sso_people", {}), id.name, ""),
	]
	n != ""
	n in names
}

# An OS user who also submitted a signed grant that counts, counts once:
# as the signer.
counted_as_signer(id, ids) if {
	id.kind == "os_user"
	some other in ids
	other.kind == "ssh_key"
	other.os_user == id.name
	counts(other)
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

# --- Who may give a verdict on which call ----------------------------------
#
# An approver is an identity the gateway proved, never a name anyone gave:
#   {"name", "kind": "ssh_key", "os_user", "key": {"fingerprint", "type",
#    "principals", "user_presence"}}   a signature by a key of the allowed
#                                      signers below; name = its principal
#   {"name", "kind": "os_user", "os_user", "groups"}
#                                      the OS user the kernel named
#   {"name", "kind": "passkey", "os_user": "", "key": {"fingerprint":
#    "webauthn:<credential id>", "type": "webauthn", "principals",
#    "user_presence": <user verified>}}
#                                      a passkey of the list below signed
#                                      the verdict's statement on the
#                                      approval page, with user verification
#   {"name", "kind": "sso", "id", "issuer", "subject", "email", "groups"}
#                                      a bearer token the HTTP transport
#                                      verified (name = its username; groups
#                                      as the token gave them when the
#                                      verdict was given)
# The keys whose signatures identify approvers (git's allowed_signers
# format). The gateway checks signatures against exactly this text.
allowed_signers := object.get(data.config, ["approvers", "allowed_signers"], "")

# The passkeys that identify approvers on the approval page: a list of
# {"name": APPROVER, "credential": {...}} as the page's registration
# prints them. The gateway checks assertions against exactly this list.
passkeys := object.get(data.config, ["approvers", "passkeys"], [])

# Which identities count at all.
admitted(id) if {
	id.kind == "ssh_key"
	cfg.identity.keys
}

admitted(id) if {
	id.kind == "passkey"
	object.get(cfg.identity, "passkeys", false)
}

admitted(id) if {
	id.kind == "os_user"
	id.name in cfg.identity.users
}

admitted(id) if {
	id.kind == "os_user"
	some g in id.groups
	g in cfg.identity.groups
}

# SSO identities by their own lists: an IdP group never stands for an OS
# group of the same name.
admitted(id) if {
	sso_client_may_approve(id)
	id.name in object.get(cfg.identity, "sso_users", [])
}

admitted(id) if {
	sso_client_may_approve(id)
	some g in id.groups
	g in object.get(cfg.identity, "sso_groups", [])
}

# An SSO verdict counts only from a token issued to a client listed in
# identity.sso_clients (the approvers' command, e.g. gateway login's
# client): an agent's MCP token, issued to the agent's client, never
# approves, even its person's.
sso_client_may_approve(id) if {
	id.kind == "sso"
	object.get(id, "client_id", "") in object.get(cfg.identity, "sso_clients", [])
}

# A tool's tier as the catalog gives it ("unknown" for a tool it lacks).
tier_of(tool) := t if {
	t := data.gateway.tools.entry_of(tool).tier
} else := "unknown"

# What an approver's scope is matched against.
call_facts(tool, params, sigs) := {
	"tool": tool,
	"tier": tier_of(tool),
	"module": object.get(params, "working_dir", ""),
	"namespace": object.get(params, "namespace", object.get(data.config.scopes.modules, [object.get(params, "working_dir", ""), "namespace"], "")),
	"signal_kinds": {s.kind | some s in sigs},
}

# An identity without a scope may approve every call; one with a scope only
# calls it covers (each list it gives must hold the call's value; every
# signal kind of the call must be in its signal_kinds).
in_scope(id, _) if not cfg.identity.scopes[id.name]

in_scope(id, call) if {
	s := cfg.identity.scopes[id.name]
	every field, key in {"tools": "tool", "tiers": "tier", "namespaces": "namespace", "modules": "module"} {
		call[key] in object.get(s, field, [call[key]])
	}
	every k in call.signal_kinds {
		k in object.get(s, "signal_kinds", [k])
	}
}

# A verdict on a stored approval, asked by `gateway approve` / `gateway deny`
# with input {"verdict": "grant"|"deny", "approver": identity, "approval":
# {"id", "tool", "params", "requested_by", "requester", "signals", "verdicts": [{"approver",
# "verdict", "kind", "os_user"}]}}. Allowed when no rule below refuses it.
verdict_call := call_facts(input.approval.tool, input.approval.params, input.approval.signals)

verdict_refusals contains msg if {
	not admitted(input.approver)
	not own_withdrawal
	msg := sprintf("%s (%s) is not an approver: %s", [object.get(input.approver, "name", "?"), object.get(input.approver, "kind", "?"), object.get(not_admitted_hint, object.get(input.approver, "kind", ""), "an identity nobody proved never counts")])
}

not_admitted_hint := {
	"ssh_key": "signed approvals are off (data.config.approvals.identity.keys)",
	"passkey": "passkey approvals are off (data.config.approvals.identity.passkeys)",
	"os_user": "the user is not in data.config.approvals.identity users or groups; sign with an allowed key (gateway approve --key)",
}

verdict_refusals contains msg if {
	input.verdict == "grant"
	is_requester(input.approver, requester_names(input.approval))
	msg := sprintf("%s requested this call and cannot approve it (an approval needs someone the requester cannot act as)", [input.approval.requested_by])
}

verdict_refusals contains msg if {
	input.verdict == "grant"
	some v in input.approval.verdicts
	v.verdict == "grant"
	person({"name": v.approver, "kind": object.get(v, "kind", "")}) == person(input.approver)
	msg := sprintf("%s already approved %s; it needs approvals from other people", [person(input.approver), input.approval.id])
}

verdict_refusals contains msg if {
	input.verdict == "grant"
	token_only_on_destructive(input.approver, verdict_call)
	msg := sprintf("%s approves with a token alone, and this change is destructive: approve it with a passkey on the approval page, or a signed key (data.config.approvals.identity.sso_destructive allows tokens)", [input.approver.name])
}

verdict_refusals contains msg if {
	admitted(input.approver)
	not in_scope(input.approver, verdict_call)
	msg := sprintf("%s may not decide on this call (%s, tier %s, namespace %q, module %q): outside its scope in data.config.approvals.identity.scopes", [input.approver.name, verdict_call.tool, verdict_call.tier, verdict_call.namespace, verdict_call.module])
}

# One person, two kinds of identity: an OS user who already submitted a
# grant (its own, or a signature) grants no more as itself, and a
# signature submitted by an OS user who granted as itself does not count
# again.
verdict_refusals contains msg if {
	input.verdict == "grant"
	input.approver.kind == "os_user"
	some v in input.approval.verdicts
	v.verdict == "grant"
	v.os_user == input.approver.name
	msg := sprintf("%s already submitted a grant of %s (as %s); one person counts once", [input.approver.name, input.approval.id, v.approver])
}

verdict_refusals contains msg if {
	input.verdict == "grant"
	input.approver.kind == "ssh_key"
	some v in input.approval.verdicts
	v.verdict == "grant"
	v.kind == "os_user"
	v.approver == input.approver.os_user
	msg := sprintf("%s already approved %s as itself; its signature would count the same person twice", [input.approver.os_user, input.approval.id])
}

# The requester may always deny (withdraw) its own call.
own_withdrawal if {
	input.verdict == "deny"
	is_requester(input.approver, requester_names(input.approval))
}

# Allowed only with no refusal and an identity that is admitted (or the
# requester withdrawing): a refusal whose message failed to build cannot
# turn into an allow.
default verdict_allowed := false

verdict_allowed if {
	count(verdict_refusals) == 0
	admitted(input.approver)
}

verdict_allowed if {
	count(verdict_refusals) == 0
	own_withdrawal
}

verdict := {"allow": verdict_allowed, "reasons": sort(verdict_refusals)}

# Who may read every user's approvals and the audit log through the daemon
# (input {"os_user", "uid", "groups", "channel", "command"}): the OS users
# and groups the configuration names. Everyone else sees only their own
# approvals. A direct command works on a state dir its user owns, so it is
# that user's.
default may_approve := false

may_approve if input.channel == "direct"

may_approve if {
	object.get(input, "kind", "os_user") != "sso"
	input.os_user in cfg.identity.users
}

may_approve if {
	object.get(input, "kind", "os_user") != "sso"
	some g in input.groups
	g in cfg.identity.groups
}

may_approve if {
	sso_client_may_approve(input)
	input.user in object.get(cfg.identity, "sso_users", [])
}

# A session of the approval page, opened with a listed passkey.
may_approve if {
	input.kind == "passkey"
	object.get(cfg.identity, "passkeys", false)
}

may_approve if {
	sso_client_may_approve(input)
	some g in input.groups
	g in object.get(cfg.identity, "sso_groups", [])
}

# Which operator command a caller may run through the daemon (input as for
# `may_approve`, plus "command": "approvals", "audit" or "vault status"):
# the users and groups above may run every one; anyone in the socket's
# group may run those listed in `anyone` (with `approvals`, a caller who is
# not one of them sees only their own).
default may_run := false

may_run if may_approve

may_run if {
	object.get(input, "kind", "os_user") != "sso"
	input.command in cfg.identity.anyone
}

# Over HTTPS, anyone with a valid token may list the approvals they asked
# for (and only those); the other operator commands are the approvers'.
may_run if {
	input.kind == "sso"
	input.command == "approvals"
}

# Who is told when an approval is requested (data.config.approvals.notifiers):
# a list of {"webhook": URL} (a JSON body with a Slack-compatible "text"),
# {"webhook_file": PATH} (the URL kept in a file only its owner reads) and
# {"command": [ARGV...]} (the same JSON on stdin). A notifier that fails is
# audited and never holds up the call.
# Each may take timeout_seconds (default notify_timeout_seconds).
notifiers := [object.union({"timeout_seconds": object.get(cfg, "notify_timeout_seconds", 10)}, n) |
	some n in object.get(cfg, "notifiers", [])
]
