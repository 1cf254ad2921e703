"""pdlink.vllm.layerwise's logic against a scripted daemon: which Sends leave when.

No vLLM server (vLLM is imported: the metadata subclasses its classes): a
fake side records every Send and answers each Poll with the state the test
scripts. The real engines run it in test_vllm_concurrent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdlink import PdlinkError, RoomState, RoomStatus
from pdlink.sglang.staging import SlotPool
from pdlink.vllm.layerwise import StagedSends
from pdlink.vllm.metadata import StageJob

LAYERS = {"l0": [0, 1], "l1": [2, 3], "l2": [4, 5]}
ROOM = 77


@dataclass
class Sent:
    start: int
    pages: list[int]
    buffers: list[int]
    last: bool


@dataclass
class FakeSide:
    state: RoomState = RoomState.BOOTSTRAPPING
    prefix: int = 0
    refuse: str = ""
    sends: list[Sent] = field(default_factory=list)
    staged: list[tuple[list[int], list[int], list[int]]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    polls: int = 0

    def __post_init__(self) -> None:
        self.pool = SlotPool(8)
        self.client = self
        self.staging = self

    # client
    def send(self, room, pages, *, rank, start_position, buffers, last, timeout):
        if self.refuse:
            raise PdlinkError(self.refuse)
        self.sends.append(Sent(start_position, [int(p) for p in pages], list(buffers), last))

    def abort(self, room, reason, timeout):
        self.aborted.append(reason)

    def open(self, *a, **k):
        pass

    # staging
    def stage_out(self, blocks, slots, buffers=None):
        self.staged.append((list(blocks), [int(s) for s in slots], list(buffers)))

    # _Side
    def poll(self, rooms, lost_timeout):
        self.polls += 1
        return [
            RoomStatus(room_id=r, found=True, state=self.state, prefix_len=self.prefix)
            for r in rooms
        ]

    def release(self, room):
        self.released.append(room)
        self.pool.give_back(room)


def job(end_page: int, pages: int = 4, done: bool = True) -> StageJob:
    return StageJob("req", ROOM, [10 + i for i in range(end_page)], end_page, pages, done)


def run_step(sends: StagedSends, j: StageJob) -> None:
    sends.begin_step([j])
    for layer in LAYERS:
        sends.save_layer(layer, [j])
    sends.end_step([j])


def test_bound_before_the_forward_sends_each_layer_as_it_ran_and_the_last_closes():
    side = FakeSide(state=RoomState.WAITING_FOR_INPUT)
    sends = StagedSends(side, (0, 1), LAYERS, 5.0)
    run_step(sends, job(4))
    slots = [int(s) for s in side.pool.held(ROOM)]
    assert side.sends == [
        Sent(0, slots, [0, 1], False),
        Sent(0, slots, [2, 3], False),
        Sent(0, slots, [4, 5], True),
    ]
    assert side.staged == [([10, 11, 12, 13], slots, b) for b in LAYERS.values()]
    assert sends.rooms[ROOM].layer_sends == 3 and sends.rooms[ROOM].late_sends == 0


def test_unbound_during_the_forward_stages_only_and_sends_once_decode_bound_past_its_prefix():
    side = FakeSide(state=RoomState.BOOTSTRAPPING)
    sends = StagedSends(side, (0, 1), LAYERS, 5.0)
    run_step(sends, job(4))
    assert side.sends == [] and len(side.staged) == 3
    side.state, side.prefix = RoomState.WAITING_FOR_INPUT, 1
    assert sends.poll() == []
    slots = [int(s) for s in side.pool.held(ROOM)]
    assert side.sends == [Sent(1, slots[1:], [0, 1, 2, 3, 4, 5], True)]
    assert sends.rooms[ROOM].late_sends == 1


def test_a_chunked_prompt_closes_the_room_only_with_its_last_chunk():
    side = FakeSide(state=RoomState.WAITING_FOR_INPUT)
    sends = StagedSends(side, (0, 1), LAYERS, 5.0)
    run_step(sends, job(2, done=False))
    assert [(s.start, len(s.pages), s.last) for s in side.sends] == [(0, 2, False)] * 3
    side.sends.clear()
    run_step(sends, job(4))
    assert [(s.start, len(s.pages), s.last) for s in side.sends] == [
        (2, 2, False),
        (2, 2, False),
        (2, 2, True),
    ]


def test_decode_holding_every_page_gets_an_empty_last_send():
    side = FakeSide(state=RoomState.WAITING_FOR_INPUT, prefix=4)
    sends = StagedSends(side, (0, 1), LAYERS, 5.0)
    run_step(sends, job(4))
    assert side.sends == [Sent(4, [], [], True)]


def test_a_refused_send_aborts_the_room_and_its_end_is_reported_with_the_reason():
    side = FakeSide(state=RoomState.WAITING_FOR_INPUT, refuse="last Send short of decode's pages")
    sends = StagedSends(side, (0, 1), LAYERS, 5.0)
    run_step(sends, job(4))
    assert side.aborted == ["send_failed"] and side.sends == []
    side.state = RoomState.FAILED
    [(req, room, reason)] = sends.poll()
    assert (req, room) == ("req", ROOM) and "last Send short" in reason
    assert side.released == [ROOM] and sends.ended == [ROOM] and not sends.rooms


def test_success_gives_the_slots_back_and_reports_the_room_ended():
    side = FakeSide(state=RoomState.WAITING_FOR_INPUT)
    sends = StagedSends(side, (0, 1), LAYERS, 5.0)
    run_step(sends, job(4))
    side.state = RoomState.SUCCESS
    assert sends.poll() == []
    assert side.released == [ROOM] and sends.ended == [ROOM]
    assert side.pool.held(ROOM) is None


def test_too_few_staging_slots_fail_the_room_not_the_engine():
    side = FakeSide(state=RoomState.WAITING_FOR_INPUT)
    sends = StagedSends(side, (0, 1), LAYERS, 5.0)
    run_step(sends, job(4, pages=9))
    assert side.sends == [] and side.staged == []
    assert side.aborted and side.aborted[0].startswith("staging_full")


def test_the_proxy_names_the_params_keys_the_connector_reads():
    import importlib.util
    from pathlib import Path

    from pdlink.vllm import metadata

    path = Path(metadata.__file__).with_name("proxy.py")
    spec = importlib.util.spec_from_file_location("pdlink_vllm_proxy_keys", path)
    proxy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(proxy)
    assert (proxy.ROOM, proxy.BOOTSTRAP, proxy.FLOW) == (
        metadata.ROOM,
        metadata.BOOTSTRAP,
        metadata.FLOW,
    )
    _, dec = proxy.concurrent_bodies({"prompt": "x"}, 5, "tcp://h:1")
    assert dec["kv_transfer_params"][metadata.FLOW] == metadata.CONCURRENT
