"""SGLang's general-plugin entry point: register() makes `pdlink` a transfer backend.

SGLang's load_plugins() calls register() in each of its processes (the HTTP
server's, every scheduler's) and then HookRegistry.apply_hooks(), which also
rewrites the stale `from ... import` bindings in modules already loaded.
register() adds three things through the hook registry:

- `pdlink` to DISAGG_TRANSFER_BACKEND_CHOICES (the argparse choices);
- a TransferBackend enum with SGLang's members plus PDLINK (REPLACE: the
  scheduler converts the option with TransferBackend(value));
- an AROUND hook on get_kv_class that answers pdlink's classes for PDLINK
  (compared by value: enum identity changes under REPLACE) and calls
  through otherwise;
- an AFTER hook on ServerArgs.check_server_args: the start-up refusals.

load_plugins() logs and swallows an exception from register(), so the
version gate does not raise here: it lets the option parse and refuses in
get_kv_class and the manager, where SGLang stops the server with the message.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from pdlink.sglang import BACKEND_NAME, checks

logger = logging.getLogger(__name__)

_UTILS = "sglang.srt.disaggregation.utils"


def _transfer_backend_with_pdlink(original: type[enum.Enum]) -> type[enum.Enum]:
    members = {m.name: m.value for m in original}
    if BACKEND_NAME not in members.values():
        members["PDLINK"] = BACKEND_NAME
    return enum.Enum(original.__name__, members, module=original.__module__)


def _get_kv_class(original_fn: Any, transfer_backend: Any, class_type: Any) -> Any:
    if getattr(transfer_backend, "value", transfer_backend) != BACKEND_NAME:
        return original_fn(transfer_backend, class_type)
    checks.check_version(checks.installed_sglang_version())
    from pdlink.sglang import conn

    return conn.kv_class(class_type)


def _check_server_args(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    if getattr(server_args, "disaggregation_transfer_backend", None) == BACKEND_NAME:
        checks.check_version(checks.installed_sglang_version())
        checks.check_server_args(server_args)


def register() -> None:
    """Register the pdlink transfer backend with SGLang's hook registry."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.disaggregation import utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    try:
        checks.check_version(checks.installed_sglang_version())
    except checks.UnsupportedSGLang as err:
        # Still registered, so the option parses and the refusal below
        # names the tested version instead of argparse's "invalid choice".
        logger.error("pdlink sglang plugin refused: %s", err)

    if BACKEND_NAME not in choices.DISAGG_TRANSFER_BACKEND_CHOICES:
        # The adder is the list's extend: a bare string would add its letters.
        choices.add_disagg_transfer_backend_choices([BACKEND_NAME])
    HookRegistry.register(
        f"{_UTILS}.TransferBackend",
        _transfer_backend_with_pdlink(utils.TransferBackend),
        HookType.REPLACE,
    )
    HookRegistry.register(f"{_UTILS}.get_kv_class", _get_kv_class, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.server_args.ServerArgs.check_server_args",
        _check_server_args,
        HookType.AFTER,
    )
