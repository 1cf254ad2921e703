"""Every error code the daemons give, as the typed exception an engine handles."""

from __future__ import annotations

import grpc
import pytest
from conftest import LAYOUT, open_bound, settle, state_of

import pdlink
from pdlink import DecodeClient, PrefillClient, Region, RegionLayout


def test_bad_pages_are_invalid_argument_naming_the_field(env):
    env.decode.open(1, env.bootstrap)
    with pytest.raises(pdlink.InvalidArgument) as e:
        env.decode.send_metadata(1, [LAYOUT.buffers[0].pages])  # one past the end
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.method == "SendMetadata"
    assert e.value.field.startswith("dst_pages")
    with pytest.raises(pdlink.InvalidArgument):
        env.decode.send_metadata(1, [3, 3])  # a page twice


def test_a_bad_layout_is_invalid_argument(env):
    short = RegionLayout.uniform(buffers=1, pages=4, item_len=64)
    path = env.src.path
    big = RegionLayout.uniform(buffers=1, pages=1 << 20, item_len=4096)
    with pytest.raises(pdlink.InvalidArgument):
        env.prefill.register_region(path, big)  # the file does not hold it
    assert env.prefill.register_region(path, short).generation == 2


def test_unknown_room_is_not_found(env):
    with pytest.raises(pdlink.NotFound) as e:
        env.prefill.send(999, [0], last=True)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(pdlink.NotFound):
        env.decode.send_metadata(999, [0])


def test_duplicate_room_is_already_exists(env):
    env.decode.open(2, env.bootstrap)
    with pytest.raises(pdlink.AlreadyExists):
        env.decode.open(2, env.bootstrap)
    env.prefill.open(2)
    with pytest.raises(pdlink.AlreadyExists):
        env.prefill.open(2)


def test_other_metadata_on_a_room_is_already_exists(env):
    open_bound(env, 3, [0])
    with pytest.raises(pdlink.AlreadyExists):
        env.decode.send_metadata(3, [1])
    env.decode.send_metadata(3, [0])  # the same again is a retry: OK


def test_region_outside_the_region_dir_is_permission_denied(env, tmp_path):
    outside = tmp_path / "elsewhere"
    region = Region.create(str(outside), LAYOUT)
    try:
        with pytest.raises(pdlink.PermissionDenied) as e:
            env.decode.register_region(region)
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    finally:
        region.close()


def test_send_before_bound_and_on_a_failed_room_is_failed_precondition_with_the_reason(env):
    env.prefill.open(4)
    with pytest.raises(pdlink.FailedPrecondition) as e:
        env.prefill.send(4, [0], last=True)  # still Bootstrapping
    assert e.value.reason == ""
    open_bound(env, 5, [0])
    env.decode.abort(5, "test")
    settle(lambda: state_of(env.prefill, 5) == pdlink.RoomState.FAILED, "prefill failed")
    with pytest.raises(pdlink.FailedPrecondition) as e:
        env.prefill.send(5, [0], last=True)
    assert e.value.state == pdlink.RoomState.FAILED
    assert e.value.reason == "aborted:remote"
    assert e.value.peer_reason == "aborted:local"


def test_no_region_is_failed_precondition(pair):
    with DecodeClient(pair.decode.address, watch=False) as dec:
        with pytest.raises(pdlink.FailedPrecondition) as e:
            dec.open(1, pair.prefill.bootstrap)
        assert "RegisterRegion" in e.value.details


@pytest.mark.parametrize("pair", [{"decode": ["--max-rooms=2"]}], indirect=True)
def test_over_max_rooms_is_resource_exhausted(env):
    env.decode.open(1, env.bootstrap)
    env.decode.open(2, env.bootstrap)
    with pytest.raises(pdlink.ResourceExhausted):
        env.decode.open(3, env.bootstrap)


class _Counting:
    """Counts the calls of one stub method, to see how often the client tried."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.fn(*a, **kw)


def test_unavailable_is_retried_bounded_only_where_the_proto_says_it_is_safe(pair):
    pair.prefill.kill()
    with PrefillClient(pair.prefill.address, watch=False, retries=3, backoff=0.01) as pre:
        poll = pre._stub.Poll = _Counting(pre._stub.Poll)
        with pytest.raises(pdlink.Unavailable) as e:
            pre.poll([1])
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert poll.calls == 4  # the first try and 3 retries
        send = pre._stub.Send = _Counting(pre._stub.Send)
        with pytest.raises(pdlink.Unavailable):
            pre.send(1, [0], last=True)
        assert send.calls == 4
        opener = pre._stub.OpenSender = _Counting(pre._stub.OpenSender)
        with pytest.raises(pdlink.Unavailable):
            pre.open(1)
        assert opener.calls == 1  # a repeat could answer AlreadyExists for its own room


def test_a_retry_reaches_a_daemon_that_comes_back(pair):
    with DecodeClient(pair.decode.address, watch=False, retries=8, backoff=0.05) as dec:
        assert dec.poll([1])[0].found is False
        pair.decode.kill()
        real = dec._stub.Poll

        def poll_then_restart(*a, **kw):
            # The first retry finds the daemon back: the call succeeds.
            if poll_then_restart.calls == 1:
                pair.decode.start()
            poll_then_restart.calls += 1
            return real(*a, **kw)

        poll_then_restart.calls = 0
        dec._stub.Poll = poll_then_restart
        assert dec.poll([1])[0].found is False
        assert poll_then_restart.calls >= 2
