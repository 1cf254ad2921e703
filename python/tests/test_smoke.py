from pdlink import RoomState
from pdlink.client import wait_for


def test_one_room_moves_bytes(env):
    env.src.pages(0)[3] = 7
    env.src.pages(1)[3] = 9
    env.src.aux()[0] = 5
    d = env.decode.open(1, env.bootstrap)
    env.prefill.open(1)
    env.decode.send_metadata(1, [10], aux_index=2)
    wait_for(lambda: env.prefill.status(1).state == RoomState.WAITING_FOR_INPUT, 10)
    env.prefill.send(1, [3], last=True, aux_index=0)
    wait_for(lambda: env.decode.status(1).state == RoomState.SUCCESS, 10)
    wait_for(lambda: env.prefill.status(1).state == RoomState.SUCCESS, 10)
    assert (env.dst.pages(0)[10] == 7).all()
    assert (env.dst.pages(1)[10] == 9).all()
    assert (env.dst.aux()[2] == 5).all()
    assert env.decode.status(1).nonce == d.nonce
