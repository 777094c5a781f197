#!/usr/bin/env bash
# Wait for a Job to finish, whichever way: exits 0 once it is Complete, 1
# once it is Failed (with the reason the Job controller gave), 2 when the
# time runs out first. `kubectl wait --for=condition=complete` waits out its
# whole timeout on a Job that failed (the condition never comes), and one
# `kubectl wait` takes only one condition.
#   scripts/wait-job.sh NAMESPACE JOB [TIMEOUT]   (TIMEOUT: 90, 90s, 15m, 1h; default 15m)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NAMESPACE JOB [TIMEOUT]" >&2; exit 2; }
ns="$1" job="$2" limit="${3:-15m}"
case "$limit" in
  *h) seconds=$(( ${limit%h} * 3600 )) ;;
  *m) seconds=$(( ${limit%m} * 60 )) ;;
  *s) seconds="${limit%s}" ;;
  *) seconds="$limit" ;;
esac
deadline=$(( $(date +%s) + seconds ))
while :; do
  # Each condition that holds, one a line: Type<TAB>Reason<TAB>Message.
  if held="$(kubectl get job -n "$ns" "$job" -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type}{"\t"}{.reason}{"\t"}{.message}{"\n"}{end}' 2>&1)"; then
    if grep -q '^Complete' <<<"$held"; then
      echo "job $ns/$job: Complete"
      exit 0
    fi
    if failed="$(grep '^Failed' <<<"$held")"; then
      echo "job $ns/$job: Failed: $(cut -f2- <<<"$failed" | tr '\t' ' ')" >&2
      exit 1
    fi
  else
    echo "job $ns/$job: $held" >&2
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "job $ns/$job: neither Complete nor Failed after $limit" >&2
    exit 2
  fi
  sleep 2
done
