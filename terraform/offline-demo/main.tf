# The demo module, offline variant: only Terraform's built-in terraform_data
# resources, so it plans and applies with no provider download and touches
# nothing outside its own state. It mirrors terraform/k8s-demo: a "web"
# Deployment whose labels force replacement when they change, and a
# ConfigMap-like "config" that updates in place.
#
# The forces-replacement scenario: edit the `labels` value below (one line)
# and plan again — Terraform plans to destroy and re-create terraform_data.web.

locals {
  app    = "web"
  labels = "app=web"
  image  = "nginx:1.27"
}

resource "terraform_data" "web" {
  input = {
    image    = local.image
    replicas = 2
  }
  # Like a Deployment's selector labels: changing them cannot be done in place.
  triggers_replace = {
    labels = local.labels
  }
}

resource "terraform_data" "config" {
  input = {
    greeting = "hello from ${local.app}"
  }
}

output "web_id" {
  value = terraform_data.web.id
}
