#!/usr/bin/env bash
# Register the gateway with Claude Code for the current repository.
set -euo pipefail
repo="$(pwd)"
claude mcp add gateway \
  --env GATEWAY_POLICIES="$repo/policies" \
  -- /usr/local/bin/gateway serve --workspace "$repo"
