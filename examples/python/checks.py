"""The examples' self-checks, not what they show: `make test-examples` runs each example
and fails on a non-zero exit."""

import sys

import redis

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run_checks(url, r, body):
    """``body(r)`` once ``r`` answers, then exit: 2 if it cannot be reached, 1 if a check
    failed, 0 if every check passed."""
    try:
        r.ping()
    except redis.exceptions.ConnectionError as e:
        print(f"cannot reach {url}: {e}", file=sys.stderr)
        sys.exit(2)
    body(r)
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("all checks passed")
    sys.exit(0)
