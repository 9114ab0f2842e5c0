"""The init command: what a driver sends every worker of one engine to join the bridge, sealed.

It reaches the workers through the engine's own routes (vLLM: ``init_weight_transfer_engine``,
over ``collective_rpc`` or ``vllm serve``'s HTTP route; SGLang: an ``update_weights_from_tensor``
command, over its admin API), which anyone who can reach the engine can call too. So:

* **Data only.** The command is JSON text (:class:`InitPayload`: the spec text, the control store,
  the instance, ...), parsed with every field typed and nothing extra; a test hook is a registered
  name with JSON parameters (:mod:`.hooks`). Nothing is unpickled.
* **Sealed.** ``{"payload": text, "seal": hex}``: ``seal`` is the job secret's MAC
  (:meth:`weightbridge.sync.auth.Signer.mac`, HMAC-SHA256, 16 bytes) over a domain tag of its own
  and the exact payload text (:meth:`Prepared.sealed`, fresh for every send).
* **Checked before anything runs** (:class:`InitGate`, one per worker process): an engine whose
  environment has the job secret (``WEIGHTBRIDGE_SECRET``, as the guides start engines) refuses a
  command that is not sealed with it; then the payload is parsed, and refused when it was issued
  more than :data:`MAX_AGE_S` from now (the driver's clock against the engine's) or not after the
  init this worker accepted last (a replay of a genuine init, even one captured on the wire).
  Every refusal is :class:`~weightbridge.errors.InitRefused` naming the worker, and the bridge the
  worker runs (if any) is left as it was.

The secret that verifies comes from the engine's own environment, never from the command: the
spec it carries could say ``sync.auth: off`` or name any ``secret_file``. An engine started without
``WEIGHTBRIDGE_SECRET`` cannot tell its driver from a stranger; it accepts unsealed commands and
logs that once (``docs/trust.md``).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from weightbridge.errors import InitRefused
from weightbridge.integrations._engine.hooks import HookRef, describe

if TYPE_CHECKING:
    from weightbridge.runtime.options import BridgeOptions

log = logging.getLogger(__name__)

MAX_PAYLOAD_CHARS = 4 << 20  # a spec is a few kB; the bound keeps a hostile command cheap
MAX_AGE_S = 300.0  # how far the issue time may be from the engine's clock, either way
_DOMAIN = b"wb-engine-init\x00"  # seals of init commands are never valid as anything else


class InitPayload(BaseModel):
    """The fields of an init command (every engine's the same)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    spec: str  # spec YAML text
    spec_name: str = "<spec>"  # for error messages
    base_dir: str | None = None  # relative model paths in the spec resolve against this
    host: str  # control store
    port: int = Field(ge=0, le=65535)
    instance: int = Field(0, ge=0)  # which rollout instance of the spec this engine is
    staging: bool | None = None  # None: the spec's sync.staging
    probe: Literal["check", "off"] = "check"  # "check": probe the engine's load_weights and require the spec's layout
    cache_dir: str | None = None  # probe cache
    timeout_s: float | None = Field(None, gt=0, le=86400)  # the update's default wait (None: the spec's)
    prefix: str = Field("wb", min_length=1, max_length=200)  # the bridge's store key prefix
    test_hook: HookRef | None = None  # the conformance suite's fault injection (:mod:`.hooks`)
    nonce: str = Field(pattern=r"^[0-9a-f]{32}$")  # makes every command distinct
    issued_at: float  # the driver's time.time() when it sealed the command


@dataclass(frozen=True)
class Prepared:
    """A spec checked in the driver and the fields of the init command every worker receives."""

    resolved: Any
    fields: dict[str, Any]  # InitPayload's fields but nonce / issued_at
    timeout_s: float
    prefix: str
    signer: Any  # weightbridge.sync.auth.Signer, or None: nothing to seal with (sync.auth: off, no secret)

    def sealed(self, **override: Any) -> dict[str, str | None]:
        """The command for one send (``override``: e.g. ``instance``): fresh nonce and issue time."""
        payload = InitPayload(**{**self.fields, **override}, nonce=secrets.token_hex(16), issued_at=time.time())
        text = payload.model_dump_json()
        return {"payload": text, "seal": None if self.signer is None else self.signer.mac(_DOMAIN, text.encode()).hex()}


def prepare(spec: str | Path, *, host: str, port: int, instance: int = 0, staging: bool | None = None,
            probe: str = "check", cache_dir: str | None = None, options: BridgeOptions | None = None,
            where: str = "prepare", moved: Mapping[str, Any] | None = None) -> Prepared:
    """Validate ``spec`` (a path or YAML text) here, before any call to the engine, and build the
    init command's fields. ``moved``: keyword arguments the driver ``where`` got that moved (``timeout_s``:
    the spec's ``sync.timeout_s``, as in ``from_spec``; a call's own wait is ``update(timeout_s=)``):
    ``TypeError`` saying where each went.

    Raises the spec's errors (``file:line: $.path: message``), ``ValueError`` for options the
    workers cannot take (a ``data_plane``; an ``on_round`` that is not a registered test hook) and
    :class:`~weightbridge.errors.AuthError` when the spec requires a job secret and none is found.
    """
    from weightbridge.bridge import BridgeOptions, load_spec
    from weightbridge.runtime.options import reject_moved

    reject_moved(where, moved or {})
    options = options if options is not None else BridgeOptions()
    if options.data_plane is not None:
        raise ValueError("BridgeOptions.data_plane cannot reach the engine's worker processes")
    if probe not in ("check", "off"):
        raise ValueError(f"probe must be 'check' or 'off', got {probe!r}")
    path = Path(spec)
    is_file = "\n" not in str(spec) and path.is_file()
    text = path.read_text() if is_file else str(spec)
    resolved = load_spec(path if is_file else text)
    if not 0 <= instance < resolved.rollout.num_instances:
        raise ValueError(f"instance {instance} outside [0, {resolved.rollout.num_instances}) of the spec")
    wait = float(resolved.sync.timeout_s)
    fields = {
        "spec": text, "spec_name": str(spec) if is_file else "<spec>",
        "base_dir": str(path.resolve().parent) if is_file else str(Path.cwd()),
        "host": host, "port": int(port), "instance": instance, "staging": staging, "probe": probe,
        "cache_dir": cache_dir, "timeout_s": wait, "prefix": options.prefix, "test_hook": describe(options.on_round),
    }
    InitPayload(**fields, nonce="0" * 32, issued_at=0.0)  # every field fits, checked here rather than in the workers
    return Prepared(resolved, fields, wait, options.prefix, _driver_signer(resolved, options.secret))


def _driver_signer(resolved: Any, secret: Any) -> Any:
    """The job secret's :class:`~weightbridge.sync.auth.Signer` as the driver's bridge finds it (with
    ``sync.auth: off``: the environment's secret if any, for engines that have one), or None."""
    from weightbridge.sync.auth import ENV, signer_for, signer_from_env

    if resolved.sync.auth != "off":
        return signer_for(resolved, secret)
    return signer_from_env() if os.environ.get(ENV) else None


class InitGate:
    """A worker's checks of the init commands it receives (one per worker process, kept across inits)."""

    def __init__(self) -> None:
        self.last_issued_at: float | None = None  # of the last command accepted
        self._warned = False

    def open(self, payload: Any, seal: Any, me: str) -> InitPayload:
        """The payload of a command that passes every check (see the module doc), else
        :class:`~weightbridge.errors.InitRefused`. Accepting it makes older commands replays."""
        from weightbridge.sync.auth import ENV, signer_from_env

        if not isinstance(payload, str) or len(payload) > MAX_PAYLOAD_CHARS:
            raise InitRefused(me, f"the payload must be text of at most {MAX_PAYLOAD_CHARS} characters, got "
                                  f"{type(payload).__name__} ({len(payload) if isinstance(payload, str) else '-'})")
        if os.environ.get(ENV):
            signer = signer_from_env()
            if not isinstance(seal, str) or not seal:
                raise InitRefused(me, "not sealed with the job secret (this engine's environment has one: the "
                                      "driver's process needs the same WEIGHTBRIDGE_SECRET or secret_file)")
            if not hmac.compare_digest(seal.encode(), signer.mac(_DOMAIN, payload.encode()).hex().encode()):
                raise InitRefused(me, "the seal does not verify with this engine's job secret (sent without it, "
                                      "with another secret, or the payload was changed)")
        elif not self._warned:
            self._warned = True
            log.warning("weightbridge: %s: accepting init commands unverified: this engine's environment has no "
                        "%s, so anyone who can reach its routes can re-initialise it (docs/trust.md)", me, ENV)
        try:
            cmd = InitPayload.model_validate_json(payload)
        except ValidationError as exc:
            raise InitRefused(me, f"malformed init command: {_first_errors(exc)}") from None
        age = time.time() - cmd.issued_at
        if abs(age) > MAX_AGE_S:
            raise InitRefused(me, f"issued {age:+.0f} s from now by the driver's clock (at most {MAX_AGE_S:.0f} s "
                                  "either way: a replay, or the driver's and engine's clocks differ)")
        if self.last_issued_at is not None and cmd.issued_at <= self.last_issued_at:
            raise InitRefused(me, "not newer than the init this worker accepted last (a replay)")
        self.last_issued_at = cmd.issued_at
        return cmd


def _first_errors(exc: ValidationError, limit: int = 3) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    text = "; ".join(f"{'.'.join(map(str, e['loc'])) or '$'}: {e['msg']}" for e in errors[:limit])
    return text + (f" (+{len(errors) - limit} more)" if len(errors) > limit else "")
