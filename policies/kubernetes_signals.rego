# Destructive signals of a Kubernetes change, read from its plan
# (input.kubernetes: the live object and what the API server's dry run said
# it would become). Each says in plain words what a person should know
# before approving. Adding one is a rule here (and, where it names kinds or
# tags, a line of data): no recompiling.
package gateway.kubernetes_signals

# (A package of its own: signals.rego takes these into its `found`.
# regorus evaluates a rule with `else` wrongly under `with` when its package
# spans two files, so the two files do not share one.)

k8s := input.kubernetes

k8s_cfg := data.config.signals.kubernetes

k8s_live := k8s.live if is_object(k8s.live)

k8s_planned := k8s.planned if is_object(k8s.planned)

# The object the change is about: what it was, or what it will be.
subject := k8s_live

subject := k8s_planned if not k8s_live

k8s_address := sprintf("%s %s/%s", [object.get(subject, "kind", "?"), object.get(subject.metadata, "namespace", ""), object.get(subject.metadata, "name", "?")])

k8s_signal(kind, actions, message) := {
	"address": k8s_address,
	"kind": kind,
	"actions": actions,
	"reason": null,
	"paths": [],
	"message": message,
}

# --- More changes than a person is shown --------------------------------------

# The approval page shows an object's changed fields with their values up
# to a cap, then only names the rest (`changes` is that list, made by the
# same code that renders the page, its last entry "(and N more changed
# attributes: …)"). A change past the cap is a signal, so that padding a
# manifest cannot push a risky field out of sight unannounced.
found contains k8s_signal("large_change", ["update"], msg) if {
	k8s_live
	k8s_planned
	some c in k8s.changes
	startswith(c.path, "(and ")
	msg := sprintf("changes more fields of %s than the approval page shows with their values (it shows %d and names the rest): read the whole manifest (its params) before approving", [k8s_address, count(k8s.changes) - 1])
}

# --- Deleting what holds data -------------------------------------------------

found contains k8s_signal("delete_data", ["delete"], msg) if {
	k8s.verb == "delete"
	some k in data.config.scopes.kinds
	k.kind == k8s_live.kind
	k.holds_data
	msg := sprintf("deletes %s, a %s: the data it holds may be lost for good", [k8s_address, k8s_live.kind])
}

found contains k8s_signal("delete", ["delete"], msg) if {
	k8s.verb == "delete"
	msg := sprintf("deletes %s", [k8s_address])
}

# --- Scaling down hard ----------------------------------------------------------

replicas(o) := object.get(object.get(o, "spec", {}), "replicas", 1)

found contains k8s_signal("scale_to_zero", ["update"], msg) if {
	replicas(k8s_planned) == 0
	replicas(k8s_live) > 0
	msg := sprintf("scales %s to zero replicas (from %d): it stops serving", [k8s_address, replicas(k8s_live)])
}

# Any scale-down of a kind that holds data: a StatefulSet's PVCs may go
# with its pods (persistentVolumeClaimRetentionPolicy.whenScaled: Delete).
found contains k8s_signal("scale_down_data", ["update"], msg) if {
	replicas(k8s_planned) < replicas(k8s_live)
	some k in data.config.scopes.kinds
	k.kind == k8s_live.kind
	k.holds_data
	msg := sprintf("scales %s, a %s, down (%d to %d replicas): the storage of the pods it removes may go with them", [k8s_address, k8s_live.kind, replicas(k8s_live), replicas(k8s_planned)])
}

found contains k8s_signal("scale_down", ["update"], msg) if {
	replicas(k8s_planned) > 0
	replicas(k8s_planned) * 2 < replicas(k8s_live)
	msg := sprintf("scales %s down by more than half (%d to %d replicas)", [k8s_address, replicas(k8s_live), replicas(k8s_planned)])
}

# --- The pod template --------------------------------------------------------

# A workload's pod spec (a Pod's own spec).
pod_spec(o) := o.spec.template.spec if o.spec.template.spec

else := o.spec if o.kind == "Pod"

else := {}

template(o) := object.get(object.get(o, "spec", {}), "template", null)

found contains k8s_signal("template_in_production", ["update"], msg) if {
	k8s_live
	data.config.scopes.namespaces[k8s_live.metadata.namespace].production
	template(k8s_planned) != template(k8s_live)
	msg := sprintf("replaces the pod template of %s in namespace %s, marked production: every pod is replaced", [k8s_address, k8s_live.metadata.namespace])
}

containers(spec) := array.concat(object.get(spec, "containers", []), object.get(spec, "initContainers", []))

# A container's image, when it is new or changed by this plan.
new_image(c) if not k8s_live

new_image(c) if {
	some old in containers(pod_spec(k8s_live))
	old.name == c.name
	old.image != c.image
}

new_image(c) if {
	k8s_live
	not c.name in {old.name | some old in containers(pod_spec(k8s_live))}
}

# An image without a digest (a sha256 one: `name@sha256:<64 hex>`), with a
# tag that moves (latest) or none at all.
mutable_image(image) if {
	not regex.match(`@sha256:[a-f0-9]{64}$`, image)
	tag := image_tag(image)
	tag in k8s_cfg.mutable_tags
}

# An image pinned by nothing a registry can honour (`name@latest`).
mutable_image(image) if {
	contains(image, "@")
	not regex.match(`@sha256:[a-f0-9]{64}$`, image)
}

# The repository of an image (registry and name, without tag or digest).
repository(image) := r if {
	no_digest := split(image, "@")[0]
	parts := split(no_digest, "/")
	last := parts[count(parts) - 1]
	name := split(last, ":")[0]
	r := concat("/", array.concat(array.slice(parts, 0, count(parts) - 1), [name]))
}

# A container that runs code from another repository than before: other
# code, with the workload's ServiceAccount, Secrets and network.
found contains k8s_signal("image_repository", ["update"], msg) if {
	some c in containers(pod_spec(k8s_planned))
	some old in containers(pod_spec(k8s_live))
	old.name == c.name
	repository(old.image) != repository(c.image)
	msg := sprintf("%s runs container %s from another repository: %q (was %q): other code, with the workload's credentials", [k8s_address, c.name, repository(c.image), repository(old.image)])
}

image_tag(image) := t if {
	last := regex.split("/", image)[count(regex.split("/", image)) - 1]
	contains(last, ":")
	t := split(last, ":")[1]
} else := ""

found contains k8s_signal("mutable_image", ["update"], msg) if {
	some c in containers(pod_spec(k8s_planned))
	new_image(c)
	mutable_image(c.image)
	msg := sprintf("%s runs image %q in container %s: a tag that can point at other code tomorrow (pin a digest, name@sha256:…)", [k8s_address, c.image, c.name])
}

# --- Privilege -------------------------------------------------------------------

privileged(spec) := {c.name |
	some c in containers(spec)
	c.securityContext.privileged == true
}

found contains k8s_signal("privileged", ["update"], msg) if {
	some name in privileged(pod_spec(k8s_planned)) - privileged(pod_spec(object.get(k8s, "live", {})))
	msg := sprintf("%s makes container %s privileged: it can take over its node", [k8s_address, name])
}

found contains k8s_signal("host_access", ["update"], msg) if {
	some field in k8s_cfg.host_fields
	object.get(pod_spec(k8s_planned), field, false) == true
	object.get(pod_spec(object.get(k8s, "live", {})), field, false) != true
	msg := sprintf("%s sets %s: its pods share the node's %s", [k8s_address, field, trim_prefix(field, "host")])
}

host_paths(spec) := {v.hostPath.path |
	some v in object.get(spec, "volumes", [])
	v.hostPath
}

found contains k8s_signal("host_path", ["update"], msg) if {
	some path in host_paths(pod_spec(k8s_planned)) - host_paths(pod_spec(object.get(k8s, "live", {})))
	msg := sprintf("%s mounts the node's %s (hostPath)", [k8s_address, path])
}

added_caps(spec) := {[c.name, cap] |
	some c in containers(spec)
	some cap in c.securityContext.capabilities.add
}

found contains k8s_signal("capabilities", ["update"], msg) if {
	some pair in added_caps(pod_spec(k8s_planned)) - added_caps(pod_spec(object.get(k8s, "live", {})))
	msg := sprintf("%s gives container %s the capability %s", [k8s_address, pair[0], pair[1]])
}

limited(spec) := {c.name |
	some c in containers(spec)
	count(object.get(object.get(c, "resources", {}), "limits", {})) > 0
}

found contains k8s_signal("limits_removed", ["update"], msg) if {
	k8s_planned
	some name in limited(pod_spec(k8s_live)) - limited(pod_spec(k8s_planned))
	name in {c.name | some c in containers(pod_spec(k8s_planned))}
	msg := sprintf("%s removes container %s's resource limits: it may take its node's CPU and memory", [k8s_address, name])
}

# A container listening on a port of its node.
host_ports(spec) := {[c.name, p.hostPort] |
	some c in containers(spec)
	some p in object.get(c, "ports", [])
	p.hostPort
}

found contains k8s_signal("host_port", ["update"], msg) if {
	some pair in host_ports(pod_spec(k8s_planned)) - host_ports(pod_spec(object.get(k8s, "live", {})))
	msg := sprintf("%s opens port %d of its node for container %s (hostPort)", [k8s_address, pair[1], pair[0]])
}

# A container (or the whole pod) that runs as root.
as_root(spec) := {c.name |
	some c in containers(spec)
	object.get(object.get(c, "securityContext", {}), "runAsUser", object.get(object.get(spec, "securityContext", {}), "runAsUser", -1)) == 0
}

found contains k8s_signal("run_as_root", ["update"], msg) if {
	some name in as_root(pod_spec(k8s_planned)) - as_root(pod_spec(object.get(k8s, "live", {})))
	msg := sprintf("%s runs container %s as root (runAsUser 0)", [k8s_address, name])
}

# A Service that reaches outside the cluster.
exposed(svc) := t if {
	svc.kind == "Service"
	t := object.get(svc.spec, "type", "ClusterIP")
	t in {"LoadBalancer", "NodePort", "ExternalName"}
} else := "externalIPs" if {
	svc.kind == "Service"
	count(object.get(svc.spec, "externalIPs", [])) > 0
}

# How the Service was reachable before ("" when it was not, or is new).
exposed_before := h if {
	h := exposed(k8s_live)
} else := ""

found contains k8s_signal("exposed", ["update"], msg) if {
	how := exposed(k8s_planned)
	how != exposed_before
	msg := sprintf("%s is reachable from outside the cluster (%s)", [k8s_address, how])
}

# The Secrets a pod spec hands its containers: as volumes, whole as env
# (envFrom), or key by key (secretKeyRef).
secrets_used(spec) := {name |
	some v in object.get(spec, "volumes", [])
	name := v.secret.secretName
} | {name |
	some c in containers(spec)
	some e in object.get(c, "envFrom", [])
	name := e.secretRef.name
} | {name |
	some c in containers(spec)
	some e in object.get(c, "env", [])
	name := e.valueFrom.secretKeyRef.name
}

found contains k8s_signal("secret_exposed", ["update"], msg) if {
	some name in secrets_used(pod_spec(k8s_planned)) - secrets_used(pod_spec(object.get(k8s, "live", {})))
	msg := sprintf("%s gives its pods' code the Secret %q (a volume or env): whatever runs there can read it", [k8s_address, name])
}

service_account(spec) := object.get(spec, "serviceAccountName", "default")

found contains k8s_signal("service_account", ["update"], msg) if {
	k8s_live
	k8s_planned
	service_account(pod_spec(k8s_planned)) != service_account(pod_spec(k8s_live))
	msg := sprintf("%s changes its pods' ServiceAccount from %s to %s: they act with other rights", [k8s_address, service_account(pod_spec(k8s_live)), service_account(pod_spec(k8s_planned))])
}
