# The demo module against a real cluster: a Deployment in demo-app whose
# one-line label edit forces replacement (the selector of a Deployment is
# immutable), and a ConfigMap that updates in place.
#
# Credentials come from the gateway: the sandbox gets a kubeconfig around a
# token minted by Vault for this one call (KUBE_CONFIG_PATH). The provider
# comes from a local filesystem mirror, never the network.

terraform {
  required_version = ">= 1.5"
  required_providers {
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.35"
    }
  }
}

provider "kubernetes" {
  # KUBE_CONFIG_PATH is set by the gateway inside the sandbox.
}

locals {
  namespace = "demo-app"
  labels = {
    app = "web"
  }
}

resource "kubernetes_config_map_v1" "config" {
  metadata {
    name      = "web-config"
    namespace = local.namespace
  }
  data = {
    greeting = "hello from web"
  }
}

resource "kubernetes_deployment_v1" "web" {
  metadata {
    name      = "web"
    namespace = local.namespace
    labels    = local.labels
  }
  spec {
    replicas = 2
    selector {
      match_labels = local.labels
    }
    template {
      metadata {
        labels = local.labels
      }
      spec {
        container {
          name  = "web"
          image = "nginx:1.27"
        }
      }
    }
  }
}
