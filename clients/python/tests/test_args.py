"""What each option puts on the wire (no server needed)."""

from redis_lock_module._common import acquire_args, holder_ttl, parse_grant, parse_info


def test_acquire_arguments():
    assert acquire_args("k", b"t", 1.5, None, False, None, None) == [
        "LOCK.ACQUIRE", "k", "PX", 1500, "TOKEN", b"t"]
    assert acquire_args("k", b"t", None, "me", True, None, 0) == [
        "LOCK.ACQUIRE", "k", "SHARED", "TOKEN", b"t", "OWNER", "me", "BLOCK", 0]
    assert acquire_args("k", b"t", 0.0004, None, False, 3, 250) == [
        "LOCK.ACQUIRE", "k", "LIMIT", 3, "PX", 1, "TOKEN", b"t", "BLOCK", 250]
    # In a session: its lease, never a PX of the lock's own.
    assert acquire_args("k", b"t", None, "me", True, None, 0, "sid") == [
        "LOCK.ACQUIRE", "k", "SHARED", "SESSION", "sid", "TOKEN", b"t", "OWNER", "me", "BLOCK", 0]


def test_replies():
    big = 1883234272951664640  # a fence above 2^53 stays exact
    assert parse_grant([b"t", big], b"t") == big
    assert parse_grant(None, b"t") is None
    info = parse_info([b"fence", big, b"ttl", 500, b"owner", None])
    assert holder_ttl(info, big) == 500 and holder_ttl(info, big + 1) is None
    shared = parse_info({"mode": "shared", "holder-list": [
        {"fence": 7, "ttl": 100}, [b"fence", 9, b"ttl", 200]]})
    assert holder_ttl(shared, 9) == 200 and holder_ttl(shared, 8) is None
