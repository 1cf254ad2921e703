"""A proxy for vLLM disaggregated serving, in two flows.

    python -m pdlink.vllm.proxy --prefill http://HOST:P1 --decode http://HOST:P2 --port P
    python -m pdlink.vllm.proxy ... --flow concurrent --prefill-bootstrap tcp://HOST:P3

sequential (the default) is the flow vLLM documents for its KV connectors, so
the same proxy serves PdlinkConnector and NixlConnector:

1. The client's request goes to the prefill server with max_tokens 1, stream
   off and kv_transfer_params {"do_remote_decode": true}: prefill computes the
   prompt's KV and keeps it for decode.
2. Prefill's answer carries kv_transfer_params (where decode finds that KV).
3. The client's original request goes to the decode server with those params;
   decode's answer (a stream or one JSON body) is the client's answer.

concurrent (PdlinkConnector only) sends both at once, as SGLang's router does:
the proxy draws the room id and names it, with prefilld's bootstrap address,
to both servers. Decode allocates its blocks and binds the room while prefill
computes, so prefill's pages leave as soon as they are written (per layer
when decode is already bound) instead of after prefill answered.

Failures are the client's, never a hang: an upstream's error status and body
come back unchanged; an upstream that cannot be reached is a 502, one that
does not answer within its bound a 504; a prefill answer without
kv_transfer_params (vLLM returns none for an aborted or failed prefill) is a
502 and decode is not asked (sequential) or cancelled (concurrent), since a
decode without the KV would compute the prompt again or fail.

Standard library and aiohttp only (vLLM's own dependency). The module imports
nothing of pdlink or vLLM, but `python -m pdlink.vllm.proxy` runs the package's
__init__, which imports vLLM: run it in the engine's environment (or run this
file by path elsewhere).

Not done here: a client that goes away during prefill does not abort it (the
decode request is still sent), and a decode that cannot be reached leaves
prefill's blocks held until the connector's bound (pdlink: prefilld's
--bootstrap-timeout; NixlConnector: kv_lease_duration).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import secrets
import time
from typing import Any

import aiohttp
from aiohttp import web

log = logging.getLogger("pdlink.vllm.proxy")

# Bounds of one upstream call. Prefill's is a whole prompt's forward pass on a
# loaded machine; decode's read bound is the longest silence between streamed
# tokens (a non-streamed answer waits for all of them, so it gets the total).
DEFAULT_PREFILL_TIMEOUT = 300.0
DEFAULT_DECODE_TIMEOUT = 600.0
DEFAULT_CONNECT_TIMEOUT = 10.0

ROUTES = ("/v1/completions", "/v1/chat/completions")
# Headers worth passing upstream: who the client is, and its request id (vLLM
# logs it), nothing hop-by-hop.
FORWARDED_HEADERS = ("Authorization", "X-Request-Id")

PREFILL_URL: web.AppKey[str] = web.AppKey("prefill_url", str)
DECODE_URL: web.AppKey[str] = web.AppKey("decode_url", str)
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)
BOUNDS: web.AppKey[dict[str, float]] = web.AppKey("bounds", dict)
BOOTSTRAP_ADDR: web.AppKey[str] = web.AppKey("prefill_bootstrap", str)

# The concurrent flow's kv_transfer_params keys: pdlink.vllm.metadata's ROOM,
# BOOTSTRAP and FLOW (this module imports nothing of pdlink; a test checks they agree).
ROOM = "pdlink_room"
BOOTSTRAP = "pdlink_bootstrap"
FLOW = "pdlink_flow"
FLOWS = ("sequential", "concurrent")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The client's request as prefill must see it: one token, no stream, KV kept for decode."""
    out = copy.deepcopy(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    # min_tokens > 1 contradicts max_tokens 1 (vLLM refuses the request).
    out.pop("min_tokens", None)
    out["kv_transfer_params"] = {"do_remote_decode": True}
    return out


def decode_body(body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["kv_transfer_params"] = params
    return out


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}}, status=status
    )


def _headers(request: web.Request) -> dict[str, str]:
    return {h: request.headers[h] for h in FORWARDED_HEADERS if h in request.headers}


async def _relay(upstream: aiohttp.ClientResponse) -> web.Response:
    """An upstream's non-streamed answer (success or error) as the client's, unchanged."""
    data = await upstream.read()
    return web.Response(
        status=upstream.status,
        body=data,
        content_type=upstream.content_type or "application/json",
    )


async def _read_body(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "request body is not JSON", "invalid_request_error")
    if not isinstance(body, dict):
        return _error(400, "request body is not a JSON object", "invalid_request_error")
    return body


async def _prefill(
    request: web.Request, body: dict[str, Any]
) -> tuple[dict[str, Any] | None, web.Response | None]:
    """Prefill's kv_transfer_params, or the client's answer when prefill failed."""
    app = request.app
    bounds = app[BOUNDS]
    try:
        async with app[SESSION].post(
            app[PREFILL_URL] + request.path,
            json=body,
            headers=_headers(request),
            timeout=aiohttp.ClientTimeout(total=bounds["prefill"], connect=bounds["connect"]),
        ) as pre:
            if pre.status != 200:
                log.warning("prefill answered %d for %s", pre.status, request.path)
                return None, await _relay(pre)
            try:
                answer = await pre.json(content_type=None)
            except (json.JSONDecodeError, UnicodeDecodeError, aiohttp.ContentTypeError):
                return None, _error(
                    502, "prefill answered 200 without a JSON body", "upstream_error"
                )
    except TimeoutError:
        return None, _error(
            504, f"prefill did not answer within {bounds['prefill']:g}s", "upstream_timeout"
        )
    except aiohttp.ClientError as err:
        return None, _error(502, f"prefill unreachable: {err}", "upstream_error")
    params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
    if not isinstance(params, dict) or not params:
        return None, _error(
            502,
            "prefill answered without kv_transfer_params (its KV is not kept for decode; "
            "the request was aborted or the connector is not configured as a producer)",
            "upstream_error",
        )
    return params, None


async def _decode(
    request: web.Request, body: dict[str, Any], prefill_done: Any
) -> web.StreamResponse:
    """Decode's answer (a stream or one body) as the client's.

    prefill_done() is prefill's seconds once it answered, else None; a
    streamed answer's X-Pdlink-Prefill-Seconds header says it.
    """
    app = request.app
    bounds = app[BOUNDS]
    path = request.path
    stream = bool(body.get("stream"))
    timeout = (
        aiohttp.ClientTimeout(total=None, connect=bounds["connect"], sock_read=bounds["decode"])
        if stream
        else aiohttp.ClientTimeout(total=bounds["decode"], connect=bounds["connect"])
    )
    response: web.StreamResponse | None = None
    try:
        async with app[SESSION].post(
            app[DECODE_URL] + path, json=body, headers=_headers(request), timeout=timeout
        ) as dec:
            if dec.status != 200 or not stream:
                if dec.status != 200:
                    log.warning("decode answered %d for %s", dec.status, path)
                return await _relay(dec)
            headers = {
                "Content-Type": dec.headers.get("Content-Type", "text/event-stream"),
                "Cache-Control": "no-cache",
            }
            prefill_seconds = prefill_done()
            if prefill_seconds is not None:
                headers["X-Pdlink-Prefill-Seconds"] = f"{prefill_seconds:.6f}"
            response = web.StreamResponse(status=200, headers=headers)
            await response.prepare(request)
            try:
                async for chunk in dec.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:
                # The client went away (many stop reading at "data: [DONE]"
                # before the stream's last chunk). Leaving the upstream
                # context closes decode's connection: vLLM aborts the request
                # if it was still generating.
                log.info("client closed the stream for %s", path)
            return response
    except TimeoutError:
        if response is not None:
            # Headers are gone: all that is left is to cut the stream short.
            log.warning("decode stream stalled over %gs for %s", bounds["decode"], path)
            raise
        return _error(
            504, f"decode did not answer within {bounds['decode']:g}s", "upstream_timeout"
        )
    except aiohttp.ClientError as err:
        if response is not None:
            log.warning("decode stream broke for %s: %s", path, err)
            raise
        return _error(502, f"decode unreachable: {err}", "upstream_error")


async def handle(request: web.Request) -> web.StreamResponse:
    """The sequential flow: prefill, then decode with the params prefill returned."""
    body = await _read_body(request)
    if isinstance(body, web.Response):
        return body
    started = time.monotonic()
    params, failed = await _prefill(request, prefill_body(body))
    if failed is not None:
        return failed
    prefill_seconds = time.monotonic() - started
    return await _decode(request, decode_body(body, params), lambda: prefill_seconds)


def new_room() -> int:
    """A random non-zero 63-bit pdlink room id (the connector's own are drawn the same way)."""
    return secrets.randbits(63) or 1


def concurrent_bodies(
    body: dict[str, Any], room: int, bootstrap: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Prefill's and decode's requests of the concurrent flow: both name the room the proxy
    drew, so decode opens it (and allocates its blocks) while prefill still computes."""
    pre = prefill_body(body)
    pre["kv_transfer_params"] = {"do_remote_decode": True, ROOM: room}
    dec = decode_body(
        body, {"do_remote_prefill": True, ROOM: room, BOOTSTRAP: bootstrap, FLOW: "concurrent"}
    )
    return pre, dec


async def handle_concurrent(request: web.Request) -> web.StreamResponse:
    """The concurrent flow (PdlinkConnector only): prefill and decode at once.

    Decode's answer is the client's. A prefill that fails before decode
    answered cancels decode (vLLM aborts its request, the connector its
    room) and its own error is the answer: it says more than decode's
    failed load. Once decode answered, prefill's outcome is only logged:
    decode reports a load only after pdlink's Success, so its tokens were
    computed over prefill's KV.
    """
    body = await _read_body(request)
    if isinstance(body, web.Response):
        return body
    started = time.monotonic()
    pre_body, dec_body = concurrent_bodies(body, new_room(), request.app[BOOTSTRAP_ADDR])
    prefill = asyncio.ensure_future(_prefill(request, pre_body))
    prefill_seconds: list[float] = []
    prefill.add_done_callback(lambda _: prefill_seconds.append(time.monotonic() - started))
    decode = asyncio.ensure_future(
        _decode(request, dec_body, lambda: prefill_seconds[0] if prefill_seconds else None)
    )
    try:
        await asyncio.wait((prefill, decode), return_when=asyncio.FIRST_COMPLETED)
        if not decode.done():
            _, failed = prefill.result()
            if failed is not None:
                log.warning("prefill failed for %s: decode cancelled", request.path)
                decode.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await decode
                return failed
        answer = await decode
        if prefill.done() and prefill.result()[1] is not None:
            log.warning("prefill failed after decode answered for %s", request.path)
        return answer
    finally:
        for task in (prefill, decode):
            task.cancel()


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def models(request: web.Request) -> web.Response:
    """The decode server's model list (clients ask it before their first request)."""
    app = request.app
    try:
        async with app[SESSION].get(
            app[DECODE_URL] + "/v1/models",
            timeout=aiohttp.ClientTimeout(total=app[BOUNDS]["connect"] * 3),
        ) as up:
            return await _relay(up)
    except TimeoutError:
        return _error(504, "decode did not answer /v1/models", "upstream_timeout")
    except aiohttp.ClientError as err:
        return _error(502, f"decode unreachable: {err}", "upstream_error")


def build_app(
    prefill_url: str,
    decode_url: str,
    *,
    prefill_timeout: float = DEFAULT_PREFILL_TIMEOUT,
    decode_timeout: float = DEFAULT_DECODE_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    flow: str = "sequential",
    prefill_bootstrap: str = "",
) -> web.Application:
    if flow not in FLOWS:
        raise ValueError(f"flow {flow!r}: one of {', '.join(FLOWS)}")
    if flow == "concurrent" and not prefill_bootstrap.startswith("tcp://"):
        raise ValueError(
            "the concurrent flow needs prefilld's bootstrap address (tcp://HOST:PORT, "
            f"its --bootstrap-listen), got {prefill_bootstrap!r}"
        )
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[BOOTSTRAP_ADDR] = prefill_bootstrap
    app[PREFILL_URL] = prefill_url.rstrip("/")
    app[DECODE_URL] = decode_url.rstrip("/")
    app[BOUNDS] = {
        "prefill": prefill_timeout,
        "decode": decode_timeout,
        "connect": connect_timeout,
    }

    async def session_ctx(app: web.Application):
        # No connection cap: the engines bound their own concurrency.
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session_ctx)
    for route in ROUTES:
        app.router.add_post(route, handle_concurrent if flow == "concurrent" else handle)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m pdlink.vllm.proxy", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--prefill", required=True, help="prefill server URL, e.g. http://127.0.0.1:8100"
    )
    ap.add_argument("--decode", required=True, help="decode server URL, e.g. http://127.0.0.1:8200")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument(
        "--prefill-timeout",
        type=float,
        default=DEFAULT_PREFILL_TIMEOUT,
        help="seconds prefill may take to answer (default %(default)s)",
    )
    ap.add_argument(
        "--decode-timeout",
        type=float,
        default=DEFAULT_DECODE_TIMEOUT,
        help="seconds decode may take to answer, or stay silent inside a stream "
        "(default %(default)s)",
    )
    ap.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT)
    ap.add_argument(
        "--flow",
        choices=FLOWS,
        default="sequential",
        help="sequential: prefill, then decode with prefill's params (any connector); "
        "concurrent: both at once, decode opening the room while prefill computes "
        "(PdlinkConnector only; needs --prefill-bootstrap)",
    )
    ap.add_argument(
        "--prefill-bootstrap",
        default="",
        help="prefilld's --bootstrap-listen as tcp://HOST:PORT (the concurrent flow)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = build_app(
        args.prefill,
        args.decode,
        prefill_timeout=args.prefill_timeout,
        decode_timeout=args.decode_timeout,
        connect_timeout=args.connect_timeout,
        flow=args.flow,
        prefill_bootstrap=args.prefill_bootstrap,
    )
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
