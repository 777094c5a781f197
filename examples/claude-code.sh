#!/usr/bin/env bash
# Register the gateway with Claude Code for the current user: the same as
# `gateway client install claude-code`. Claude Code starts the server in the
# project dir, which `gateway serve` takes as the workspace.
set -euo pipefail
claude mcp add --scope user gateway -- /usr/local/bin/gateway serve
