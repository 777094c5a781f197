#!/usr/bin/env python3
"""How long one durable audit append's flush takes on a filesystem.

Appends the three lines a denied call writes to the audit log (434, 1478
and 366 bytes, the sizes of `tool.request`, `policy.decision` and
`tool.result` in `pipeline/denied_call`) and calls fdatasync, as the
gateway's audit writer does once per denied call; prints the median and
90th percentile of the fdatasync alone. Run it in the directory that holds
(or will hold) the gateway's home:

    python3 scripts/fsync-latency.py [DIR] [ROUNDS]
"""
import os
import sys
import tempfile
import time


def main() -> int:
    where = sys.argv[1] if len(sys.argv) > 1 else "."
    rounds = max(1, int(sys.argv[2])) if len(sys.argv) > 2 else 2000
    lines = [b"a" * 433 + b"\n", b"b" * 1477 + b"\n", b"c" * 365 + b"\n"]
    with tempfile.TemporaryDirectory(dir=where) as d:
        fd = os.open(os.path.join(d, "audit.jsonl"), os.O_RDWR | os.O_CREAT, 0o600)
        took = []
        try:
            for _ in range(rounds):
                os.lseek(fd, 0, os.SEEK_END)
                for line in lines:
                    os.write(fd, line)
                started = time.perf_counter()
                os.fdatasync(fd)
                took.append(time.perf_counter() - started)
        finally:
            os.close(fd)
    took.sort()
    p50 = took[len(took) // 2] * 1e6
    p90 = took[int(len(took) * 0.9)] * 1e6
    print(f"fdatasync after a denied call's three lines, {rounds} rounds in {where}: p50 {p50:.0f} µs, p90 {p90:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
