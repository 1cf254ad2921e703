"""A proxy for vLLM disaggregated serving: prefill first, then decode with what prefill returned.

    python -m pdlink.vllm.proxy --prefill http://HOST:P1 --decode http://HOST:P2 --port P

The flow vLLM documents for its KV connectors, so the same proxy serves
PdlinkConnector and NixlConnector (nothing here names a connector):

1. The client's request goes to the prefill server with max_tokens 1, stream
   off and kv_transfer_params {"do_remote_decode": true}: prefill computes the
   prompt's KV and keeps it for decode.
2. Prefill's answer carries kv_transfer_params (where decode finds that KV).
3. The client's original request goes to the decode server with those params;
   decode's answer (a stream or one JSON body) is the client's answer.

Failures are the client's, never a hang: an upstream's error status and body
come back unchanged; an upstream that cannot be reached is a 502, one that
does not answer within its bound a 504; a prefill answer without
kv_transfer_params (vLLM returns none for an aborted or failed prefill) is a
502 and decode is not asked, since a decode without the KV would compute the
prompt again or fail.

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
import copy
import json
import logging
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


async def handle(request: web.Request) -> web.StreamResponse:
    app = request.app
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "request body is not JSON", "invalid_request_error")
    if not isinstance(body, dict):
        return _error(400, "request body is not a JSON object", "invalid_request_error")
    session = app[SESSION]
    bounds = app[BOUNDS]
    headers = _headers(request)
    path = request.path
    started = time.monotonic()

    # 1. Prefill.
    try:
        async with session.post(
            app[PREFILL_URL] + path,
            json=prefill_body(body),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=bounds["prefill"], connect=bounds["connect"]),
        ) as pre:
            if pre.status != 200:
                log.warning("prefill answered %d for %s", pre.status, path)
                return await _relay(pre)
            try:
                answer = await pre.json(content_type=None)
            except (json.JSONDecodeError, UnicodeDecodeError, aiohttp.ContentTypeError):
                return _error(502, "prefill answered 200 without a JSON body", "upstream_error")
    except TimeoutError:
        return _error(
            504, f"prefill did not answer within {bounds['prefill']:g}s", "upstream_timeout"
        )
    except aiohttp.ClientError as err:
        return _error(502, f"prefill unreachable: {err}", "upstream_error")

    params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
    if not isinstance(params, dict) or not params:
        return _error(
            502,
            "prefill answered without kv_transfer_params (its KV is not kept for decode; "
            "the request was aborted or the connector is not configured as a producer)",
            "upstream_error",
        )
    prefill_seconds = time.monotonic() - started

    # 2. Decode with what prefill returned.
    stream = bool(body.get("stream"))
    timeout = (
        aiohttp.ClientTimeout(total=None, connect=bounds["connect"], sock_read=bounds["decode"])
        if stream
        else aiohttp.ClientTimeout(total=bounds["decode"], connect=bounds["connect"])
    )
    response: web.StreamResponse | None = None
    try:
        async with session.post(
            app[DECODE_URL] + path,
            json=decode_body(body, params),
            headers=headers,
            timeout=timeout,
        ) as dec:
            if dec.status != 200 or not stream:
                if dec.status != 200:
                    log.warning("decode answered %d for %s", dec.status, path)
                return await _relay(dec)
            response = web.StreamResponse(
                status=200,
                headers={
                    "Content-Type": dec.headers.get("Content-Type", "text/event-stream"),
                    "Cache-Control": "no-cache",
                    "X-Pdlink-Prefill-Seconds": f"{prefill_seconds:.6f}",
                },
            )
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
) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
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
        app.router.add_post(route, handle)
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
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = build_app(
        args.prefill,
        args.decode,
        prefill_timeout=args.prefill_timeout,
        decode_timeout=args.decode_timeout,
        connect_timeout=args.connect_timeout,
    )
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
