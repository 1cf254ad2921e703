"""pdlink.vllm.proxy against fake prefill and decode servers (aiohttp apps in the test).

No vLLM: the fakes check what the proxy sends them and answer as vLLM's
OpenAI server does (prefill's kv_transfer_params at the top level of its
JSON, decode's stream as server-sent events). The real servers run it in
python/bench/vllm_pd_bench.py. The module is loaded by its path, since
pdlink.vllm's __init__ imports vLLM and the proxy needs none of it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import time
from pathlib import Path

import pytest

aiohttp = pytest.importorskip("aiohttp", reason="the proxy runs on aiohttp (vLLM's dependency)")
from aiohttp import web  # noqa: E402

_PATH = Path(__file__).resolve().parents[1] / "pdlink" / "vllm" / "proxy.py"
_spec = importlib.util.spec_from_file_location("pdlink_vllm_proxy", _PATH)
proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(proxy)

PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "pdlink_room": 7}
TOKENS = ["w5", " w9", " w11"]


class Fakes:
    """A fake prefill and decode; what each received, and how prefill answers."""

    def __init__(self) -> None:
        self.prefill_bodies: list[dict] = []
        self.decode_bodies: list[dict] = []
        self.prefill_answer: tuple[int, dict] = (200, {"kv_transfer_params": PARAMS})
        self.prefill_delay = 0.0
        self.after_done = 0.0  # decode's stream stays open this long after [DONE]
        # decode answers only after this long (its KV coming), watching its connection.
        self.decode_delay = 0.0
        self.decode_closed = False
        self.arrived: list[tuple[str, float]] = []

    async def prefill(self, request: web.Request) -> web.Response:
        self.prefill_bodies.append(await request.json())
        self.arrived.append(("prefill", time.monotonic()))
        await asyncio.sleep(self.prefill_delay)
        status, body = self.prefill_answer
        return web.json_response(body, status=status)

    async def decode(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.decode_bodies.append(body)
        self.arrived.append(("decode", time.monotonic()))
        end = time.monotonic() + self.decode_delay
        while time.monotonic() < end:
            if request.transport is None or request.transport.is_closing():
                self.decode_closed = True
                return web.Response(status=499)
            await asyncio.sleep(0.02)
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "".join(TOKENS)}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for tok in TOKENS:
            await resp.write(f"data: {json.dumps({'choices': [{'text': tok}]})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await asyncio.sleep(self.after_done)
        await resp.write_eof()
        return resp


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def _scenario(fakes: Fakes, check, *, decode_url: str | None = None, **bounds):
    """Starts both fakes and the proxy, runs check(session, proxy_url), stops all."""
    fake_app = web.Application()
    fake_app.router.add_post("/prefill/v1/completions", fakes.prefill)
    fake_app.router.add_post("/decode/v1/completions", fakes.decode)
    fake_runner, fake_url = await _serve(fake_app)
    app = proxy.build_app(fake_url + "/prefill", decode_url or fake_url + "/decode", **bounds)
    proxy_runner, proxy_url = await _serve(app)
    try:
        async with aiohttp.ClientSession() as session:
            await check(session, proxy_url + "/v1/completions")
    finally:
        await proxy_runner.cleanup()
        await fake_runner.cleanup()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BODY = {"model": "tiny", "prompt": "w3 w4", "max_tokens": 16, "min_tokens": 4, "temperature": 0}


def test_one_request_goes_to_prefill_then_to_decode_with_prefills_params():
    fakes = Fakes()

    async def check(session, url):
        async with session.post(url, json=BODY) as r:
            assert r.status == 200
            assert await r.json() == {"choices": [{"text": "".join(TOKENS)}]}

    asyncio.run(_scenario(fakes, check))
    [pre] = fakes.prefill_bodies
    assert pre["max_tokens"] == 1 and pre["stream"] is False and "min_tokens" not in pre
    assert pre["kv_transfer_params"] == {"do_remote_decode": True}
    [dec] = fakes.decode_bodies
    assert dec == {**BODY, "kv_transfer_params": PARAMS}


def test_a_streamed_answer_comes_through_chunk_by_chunk():
    fakes = Fakes()

    async def check(session, url):
        async with session.post(
            url, json={**BODY, "stream": True, "stream_options": {"include_usage": True}}
        ) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            assert float(r.headers["X-Pdlink-Prefill-Seconds"]) >= 0
            events = [
                line[len(b"data: ") :].strip()
                async for line in r.content
                if line.startswith(b"data: ")
            ]
        assert events[-1] == b"[DONE]"
        assert [json.loads(e)["choices"][0]["text"] for e in events[:-1]] == TOKENS

    asyncio.run(_scenario(fakes, check))
    [pre] = fakes.prefill_bodies
    assert pre["stream"] is False and "stream_options" not in pre
    assert fakes.decode_bodies[0]["stream_options"] == {"include_usage": True}


def test_a_client_that_stops_reading_at_done_is_no_error(caplog):
    fakes = Fakes()
    fakes.after_done = 0.3

    async def check(session, url):
        async with session.post(url, json={**BODY, "stream": True}) as r:
            async for line in r.content:
                if line.startswith(b"data: [DONE]"):
                    break
        r.close()
        await asyncio.sleep(0.6)  # the proxy meets the closed client after [DONE]
        async with session.post(url, json=BODY) as r:
            assert r.status == 200

    with caplog.at_level("INFO"):
        asyncio.run(_scenario(fakes, check))
    assert "client closed the stream" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


def test_an_unreachable_decode_is_a_502_at_once():
    fakes = Fakes()
    t0 = time.monotonic()

    async def check(session, url):
        async with session.post(url, json=BODY) as r:
            assert r.status == 502
            body = await r.json()
        assert "decode unreachable" in body["error"]["message"]

    # A port nothing listens on (bound and closed just now).
    asyncio.run(_scenario(fakes, check, decode_url=f"http://127.0.0.1:{free_port()}"))
    assert time.monotonic() - t0 < 5
    assert len(fakes.prefill_bodies) == 1


def test_prefill_without_params_or_with_an_error_never_reaches_decode():
    fakes = Fakes()

    async def check(session, url):
        # An aborted prefill: vLLM answers 200 with kv_transfer_params null.
        fakes.prefill_answer = (200, {"choices": [], "kv_transfer_params": None})
        async with session.post(url, json=BODY) as r:
            assert r.status == 502
            assert "without kv_transfer_params" in (await r.json())["error"]["message"]
        # prefill's own error comes back unchanged.
        fakes.prefill_answer = (400, {"error": {"message": "prompt too long"}})
        async with session.post(url, json=BODY) as r:
            assert r.status == 400
            assert await r.json() == {"error": {"message": "prompt too long"}}

    asyncio.run(_scenario(fakes, check))
    assert len(fakes.prefill_bodies) == 2 and fakes.decode_bodies == []


def test_a_prefill_slower_than_its_bound_is_a_504():
    fakes = Fakes()
    fakes.prefill_delay = 2.0

    async def check(session, url):
        t0 = time.monotonic()
        async with session.post(url, json=BODY) as r:
            assert r.status == 504
        assert time.monotonic() - t0 < 1.5

    asyncio.run(_scenario(fakes, check, prefill_timeout=0.3))
    assert fakes.decode_bodies == []


CONCURRENT = {"flow": "concurrent", "prefill_bootstrap": "tcp://127.0.0.1:7000"}


def test_the_concurrent_flow_asks_both_at_once_naming_one_room():
    fakes = Fakes()
    fakes.prefill_delay = 0.5

    async def check(session, url):
        async with session.post(url, json=BODY) as r:
            assert r.status == 200
            assert await r.json() == {"choices": [{"text": "".join(TOKENS)}]}

    asyncio.run(_scenario(fakes, check, **CONCURRENT))
    [pre], [dec] = fakes.prefill_bodies, fakes.decode_bodies
    room = pre["kv_transfer_params"]["pdlink_room"]
    assert 0 < room < 2**63
    assert pre["max_tokens"] == 1 and pre["kv_transfer_params"]["do_remote_decode"] is True
    assert dec == {
        **BODY,
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "pdlink_room": room,
            "pdlink_bootstrap": "tcp://127.0.0.1:7000",
            "pdlink_flow": "concurrent",
        },
    }
    # Decode did not wait for prefill's answer (0.5 s).
    (_, t_pre), (_, t_dec) = sorted(fakes.arrived)
    assert abs(t_dec - t_pre) < 0.4


def test_a_failed_prefill_cancels_decode_and_is_the_answer():
    fakes = Fakes()
    fakes.prefill_answer = (400, {"error": {"message": "prompt too long"}})
    fakes.decode_delay = 5.0

    async def check(session, url):
        t0 = time.monotonic()
        async with session.post(url, json=BODY) as r:
            assert r.status == 400
            assert await r.json() == {"error": {"message": "prompt too long"}}
        assert time.monotonic() - t0 < 3
        for _ in range(100):
            if fakes.decode_closed:
                break
            await asyncio.sleep(0.02)

    asyncio.run(_scenario(fakes, check, **CONCURRENT))
    assert fakes.decode_closed, "decode's request was left running"


def test_the_concurrent_flow_needs_prefills_bootstrap_address():
    with pytest.raises(ValueError, match="bootstrap"):
        proxy.build_app("http://a", "http://b", flow="concurrent")
    with pytest.raises(ValueError, match="flow"):
        proxy.build_app("http://a", "http://b", flow="overlapped")
