"""The commands the driver sends to SGLang's workers, and their replies (JSON; no torch here).

A command travels as the *name* of the one entry of an ``update_weights_from_tensor`` payload
(``"weightbridge:" + JSON``; the entry's tensor is an empty placeholder): SGLang hands the payload
to the custom weight loader in every TP worker unchanged, and its safe unpickler accepts a name
and an empty CPU tensor. Replies are JSON files ``{reply_dir}/{seq}-{tp_rank}.json`` written by
each worker (SGLang's custom-loader call returns no value): the driver and the workers must share
``reply_dir`` (same host, or a shared filesystem). Without one the driver still learns what every
rank applied from the control store, but not a failure's typed error.

Both directions are hostile input: a command is size-bounded and validated (pydantic, extra
fields forbidden) before anything runs; a bad one is answered with an error, never raised in the
worker (an exception in a custom loader would end SGLang's scheduler process). Commands are data
only (JSON; nothing is unpickled), and ``init`` carries the sealed init command the worker checks
against the job secret of its own environment before anything of it runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

LOADER = "weightbridge.integrations.sglang.worker.load"  # the custom weight loader SGLang calls (load_format)
PREFIX = "weightbridge:"
MAX_COMMAND_BYTES = 4 << 20  # a spec is a few kB; the bound keeps a hostile name from costing much
MAX_REPLY_BYTES = 64 << 20

Op = Literal["init", "update", "poll", "status", "probed", "buffers", "check", "release", "close"]


class Command(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    op: Op
    seq: int = Field(0, ge=0)
    reply_dir: str | None = None
    # update
    version: int | None = Field(None, ge=0)
    timeout_s: float | None = Field(None, gt=0, le=86400)
    # init: the sealed init command every engine integration shares (its JSON text and the job
    # secret's MAC over it; weightbridge.integrations._engine.init_command), checked by the worker
    payload: str | None = None
    seal: str | None = None
    # check
    checkpoint: str | None = None


class CommandError(ValueError):
    """A payload that is not a valid weightbridge command."""


def encode(cmd: Command) -> str:
    return PREFIX + cmd.model_dump_json(exclude_defaults=True)


def decode(name: Any) -> Command:
    if not isinstance(name, str) or not name.startswith(PREFIX):
        raise CommandError(f"not a weightbridge command (names start with {PREFIX!r}): {str(name)[:80]!r}")
    if len(name) > MAX_COMMAND_BYTES:
        raise CommandError(f"command of {len(name)} characters (at most {MAX_COMMAND_BYTES})")
    try:
        return Command.model_validate_json(name[len(PREFIX):])
    except ValidationError as exc:
        raise CommandError(f"invalid weightbridge command: {exc}") from None


def reply_path(reply_dir: str | Path, seq: int, tp_rank: int, suffix: str = "json") -> Path:
    return Path(reply_dir) / f"{seq}-{tp_rank}.{suffix}"


def write_reply(reply_dir: str | Path, seq: int, tp_rank: int, data: dict[str, Any]) -> None:
    """Atomically (the driver never reads half a reply)."""
    path = reply_path(reply_dir, seq, tp_rank)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_reply(reply_dir: str | Path, seq: int, tp_rank: int) -> dict[str, Any] | None:
    path = reply_path(reply_dir, seq, tp_rank)
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_REPLY_BYTES:
        raise CommandError(f"{path}: reply larger than {MAX_REPLY_BYTES} bytes")
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise CommandError(f"{path}: reply is not an object")
    return data
