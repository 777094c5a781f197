#!/usr/bin/env bash
# Regenerates policy-tests/plans/*/data.json: real `terraform show -json` output of
# real plans, made offline with built-in `terraform_data` resources only (no
# provider download). Each case applies a "before" config, edits it, and saves
# the plan of the "after" config as JSON.
#   scripts/make-plan-fixtures.sh            # all cases
#   TERRAFORM=/path/to/terraform scripts/make-plan-fixtures.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/policy-tests/plans"
TERRAFORM="${TERRAFORM:-$root/.tools/bin/terraform}"
if [ ! -x "$TERRAFORM" ]; then
  echo "make-plan-fixtures: $TERRAFORM not found; run scripts/install-tools.sh terraform" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# An empty CLI config: no credentials, no provider installation from the network.
: > "$work/terraformrc"
export TF_CLI_CONFIG_FILE="$work/terraformrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1
mkdir -p "$out"

tf() { "$TERRAFORM" -chdir="$dir" "$@" >/dev/null; }

# case NAME BEFORE_CONFIG AFTER_CONFIG [extra plan args...]
# BEFORE_CONFIG empty => nothing is applied first.
case_() {
  local name="$1" before="$2" after="$3"; shift 3
  dir="$work/$name"
  mkdir -p "$dir"
  if [ -n "$before" ]; then
    printf '%s\n' "$before" > "$dir/main.tf"
    tf init -input=false
    tf apply -input=false -auto-approve
  fi
  printf '%s\n' "$after" > "$dir/main.tf"
  mkdir -p "$out/$name"
  tf init -input=false
  tf plan -input=false -out=plan.bin "$@"
  "$TERRAFORM" -chdir="$dir" show -json plan.bin > "$out/$name/data.json"
  echo "make-plan-fixtures: $name.json"
}

web_v1='resource "terraform_data" "web" {
  input            = { image = "nginx:1.27" }
  triggers_replace = { labels = "app=web" }
}
resource "terraform_data" "db" {
  input = "postgres"
}'

case_ create "" "$web_v1"

case_ update "$web_v1" 'resource "terraform_data" "web" {
  input            = { image = "nginx:1.28" }
  triggers_replace = { labels = "app=web" }
}
resource "terraform_data" "db" {
  input = "postgres"
}'

case_ delete "$web_v1" 'resource "terraform_data" "web" {
  input            = { image = "nginx:1.27" }
  triggers_replace = { labels = "app=web" }
}'

# The forces-replacement scenario: a one-line label edit.
case_ replace "$web_v1" 'resource "terraform_data" "web" {
  input            = { image = "nginx:1.27" }
  triggers_replace = { labels = "app=web,tier=frontend" }
}
resource "terraform_data" "db" {
  input = "postgres"
}'

cbd_v1='resource "terraform_data" "web" {
  input            = { image = "nginx:1.27" }
  triggers_replace = { labels = "app=web" }
  lifecycle {
    create_before_destroy = true
  }
}'
case_ replace-create-before-destroy "$cbd_v1" 'resource "terraform_data" "web" {
  input            = { image = "nginx:1.27" }
  triggers_replace = { labels = "app=web,tier=frontend" }
  lifecycle {
    create_before_destroy = true
  }
}'

case_ forget "$web_v1" 'resource "terraform_data" "web" {
  input            = { image = "nginx:1.27" }
  triggers_replace = { labels = "app=web" }
}
removed {
  from = terraform_data.db
  lifecycle {
    destroy = false
  }
}'

case_ no-changes "$web_v1" "$web_v1"

case_ empty "" '# no resources'

case_ replace-by-request "$web_v1" "$web_v1" -replace=terraform_data.db

case_ delete-count-index 'resource "terraform_data" "worker" {
  count = 3
  input = count.index
}' 'resource "terraform_data" "worker" {
  count = 2
  input = count.index
}'

# -target makes an incomplete plan ("complete": false).
case_ targeted-incomplete "" "$web_v1" -target=terraform_data.web

# Only a data-source style read and an output: nothing destructive.
case_ destroy-all "$web_v1" "$web_v1" -destroy
