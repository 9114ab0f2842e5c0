"""Every error the runtime raises on purpose (catch ``weightbridge.BridgeError``); the one home of their names.

::

    BridgeError                      base of everything the runtime raises on purpose
      PeerFailed(rank, peer, message)      another rank failed (its own message) or died (no heartbeat)
      DeadlineExceeded(rank, waiting_for)  a wait ran past ``sync.timeout_s``
      HandshakeMismatch(rank, field, ...)  ranks disagree on spec hash, plan hash, backend or dtypes
        DeviceConflict(rank, first, ...)   two members of one NCCL group on one device
      TornModelError(rank, version, ...)   an in-place update was interrupted; live weights are mixed
      NothingToApply(rank)                 apply() before any version was received
      ProtocolError(rank, message)         a runtime invariant does not hold (a bad value on the store)
        BadMessage(rank, message)          a control-store value is garbage, another kind or too large
      AuthError(message)                   no usable job secret (how to provide one: the message)
      ForgedMessage(rank, key, reason)     a control value that does not carry the job secret's MAC
      StoreUnreachable(rank, address, ...) the control store is gone (or restarted empty) past the deadline
      EngineMismatch(rank, message)        the spec does not describe the rollout engine (mesh, layout, pins)
      InitRefused(rank, reason)            an engine refused an init (unsealed, stale, malformed, a test hook)
      TransportError(rank, peer, round, message)   the data plane (:mod:`weightbridge.transport.errors`):
        PeerTimeout, PeerDisconnected, ChecksumError

Ranks are written ``"trainer 1"`` / ``"rollout 3"`` (:class:`weightbridge.sync.roster.RankId`),
always in spec numbering (rollout ranks instance-major as in the spec), never in the numbering
of an epoch's plan or bridge group (:class:`~weightbridge.sync.roster.Roster` translates).

Every error pickles as the same type with the same fields (multiprocessing, vLLM's RPC), however
it was built: :func:`error_from_data` rebuilds one from plain data, and that copy pickles again.
"""

from __future__ import annotations

import pkgutil
from typing import Any


class BridgeError(RuntimeError):
    """Base class of the runtime's errors; each subclass names the rank that raised it and the peer.

    Pickled by state (type, ``args``, attributes), so an error raised in a rank process reaches its
    launcher (multiprocessing, vLLM's RPC) as the same type with the same fields.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(vars(self))))


def _restore(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    exc = cls.__new__(cls)
    exc.args = args
    vars(exc).update(state)
    return exc


class PeerFailed(BridgeError):
    """``peer`` failed (and published ``message``) or stopped heart-beating while ``rank`` waited."""

    def __init__(self, rank: Any, peer: Any, message: str) -> None:
        self.rank = str(rank)
        self.peer = str(peer)
        self.message = message
        super().__init__(f"{self.rank}: peer {self.peer} failed: {message}")


class DeadlineExceeded(BridgeError):
    """A wait on ``rank`` ran past its deadline (``sync.timeout_s``)."""

    def __init__(self, rank: Any, waiting_for: str, timeout_s: float) -> None:
        self.rank = str(rank)
        self.waiting_for = waiting_for
        self.timeout_s = timeout_s
        super().__init__(f"{self.rank}: no progress after {timeout_s:g}s waiting for {waiting_for}")


class HandshakeMismatch(BridgeError):
    """Two ranks disagree on ``field`` (spec_hash, plan_hash, backend, dtypes, ...); raised on every rank.
    ``hint``: what to change, where one is known."""

    def __init__(self, rank: Any, field: str, value: str, peer: Any, peer_value: str, hint: str = "") -> None:
        self.rank = str(rank)
        self.field = field
        self.value = value
        self.peer = str(peer)
        self.peer_value = peer_value
        self.hint = hint
        super().__init__(
            f"{self.rank}: handshake mismatch on {field}: {self.rank} has {value}, {self.peer} has {peer_value}"
            + (f" ({hint})" if hint else "")
        )


class DeviceConflict(HandshakeMismatch):
    """Members ``first`` and ``peer`` of one NCCL bridge group are on one device (``device``), which NCCL does
    not support (an error or a hang in its first call); raised on every rank, before any NCCL call."""

    def __init__(self, rank: Any, first: Any, peer: Any, device: str) -> None:
        BridgeError.__init__(
            self, f"{rank}: handshake refused: {first} and {peer} are both on {device}, and NCCL does not support "
            "two members of one communicator on one device (place them on different GPUs, or set sync.transport: "
            "gloo in the spec)")
        self.rank, self.field, self.first, self.peer = str(rank), "device", str(first), str(peer)
        self.value = self.peer_value = device
        self.hint = ""


class TornModelError(BridgeError):
    """The live weights of ``rank`` are a mix of two versions (an in-place update was interrupted)."""

    def __init__(self, rank: Any, version: int, previous: int | None, cause: str) -> None:
        self.rank = str(rank)
        self.version = version
        self.previous = previous
        self.cause = cause
        super().__init__(
            f"{self.rank}: weights are torn between version {previous} and {version} ({cause}); "
            "do not serve them; the next complete push heals them"
        )


class NothingToApply(BridgeError):
    """``apply()`` was called before any version was received."""

    def __init__(self, rank: Any) -> None:
        self.rank = str(rank)
        super().__init__(f"{self.rank}: no version received yet; call apply() after poll() returned True")


class StoreUnreachable(BridgeError):
    """``rank`` cannot reach the control store at ``address`` (``host:port``) within its deadline.

    Raised by every store call of a bridge (``from_spec`` included) once reconnecting failed for
    ``sync.timeout_s`` (:mod:`weightbridge.transport.store_client`). ``restarted``: the store came
    back empty (a restarted ``weightbridge store`` process lost every key): the bridge's state is
    gone, so rebuild the bridge with ``from_spec``; the next push heals the rollouts.
    """

    def __init__(self, rank: Any, address: str, message: str, restarted: bool = False) -> None:
        self.rank = str(rank)
        self.address = str(address)
        self.message = message
        self.restarted = bool(restarted)
        super().__init__(f"{self.rank}: control store {self.address} unreachable: {message}")


class ProtocolError(BridgeError):
    """A runtime invariant does not hold on ``rank`` (a bug, or ranks driven out of the documented order)."""

    def __init__(self, rank: Any, message: str) -> None:
        self.rank = str(rank)
        self.message = message
        super().__init__(f"{self.rank}: {message}")


class AuthError(BridgeError):
    """No usable job secret for a spec with ``sync.auth: required``; the message says how to provide one."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class ForgedMessage(BridgeError):
    """The value ``rank`` read under store key ``key`` is not authenticated by the job secret (never decoded).

    Someone without the secret wrote it (or a process with a different secret, or it was copied
    from another key). See ``docs/trust.md``.
    """

    def __init__(self, rank: Any, key: str, reason: str) -> None:
        self.rank = str(rank)
        self.key = key
        self.reason = reason
        super().__init__(f"{self.rank}: the value under {key!r} is not authenticated by the job secret ({reason}); "
                         "ignored: is another process with a different WEIGHTBRIDGE_SECRET (or none) using this store?")


class EngineMismatch(BridgeError):
    """The spec does not describe the rollout engine ``rank`` runs in (its mesh, the layout its own
    loader makes, or a pinned fingerprint); raised in the engine's worker at init (vLLM, SGLang)."""

    def __init__(self, rank: Any, message: str) -> None:
        self.rank = str(rank)
        self.message = message
        super().__init__(f"{self.rank}: {message}")


class InitRefused(BridgeError):
    """An engine worker (``rank``) refused an init command; nothing of it ran and the bridge it was
    running (if any) runs on untouched.

    ``reason``: not sealed with the job secret of the engine's environment, a seal that does not
    verify, an init older than the one running (a replay) or outside the freshness window, a
    malformed command, or a test hook the engine's environment does not enable. See
    ``docs/trust.md`` (what the engine routes accept).
    """

    def __init__(self, rank: Any, reason: str) -> None:
        self.rank = str(rank)
        self.reason = reason
        super().__init__(f"{self.rank}: init refused: {reason}")


class StaleParameters(BridgeError):
    """Trainer ``rank`` was asked to push while its data-parallel replicas may hold stale parameter
    copies (Megatron's distributed optimizer with ``overlap_param_gather``: the all-gather of the new
    parameters waits for the next forward). Nothing was sent; gather first
    (:func:`weightbridge.integrations.megatron.gather_params`)."""

    def __init__(self, rank: Any, message: str) -> None:
        self.rank = str(rank)
        self.message = message
        super().__init__(f"{self.rank}: {message}")


class BadMessage(ProtocolError, ValueError):
    """A value read from the control store is not a valid message of the kind its key holds
    (garbage, another message kind, over the size bound). ``rank``: who read it (``control store``
    when raised by the decoder itself). Also a ``ValueError``, so that readers that re-raise a
    decoding error naming the key (``ControlPlane.parse``) keep doing so."""


def error_data(exc: BaseException) -> dict[str, Any]:
    """A typed error as msgpack-able data (e.g. vLLM's RPC replies): class path, attributes, message."""
    attrs = {k: v for k, v in vars(exc).items() if isinstance(v, (str, int, float, bool, type(None)))}
    return {"type": f"{type(exc).__module__}:{type(exc).__qualname__}", "attrs": attrs, "message": str(exc)}


def error_from_data(data: dict[str, Any]) -> BaseException:
    """Re-create the error :func:`error_data` described (same class, attributes and message; picklable)."""
    cls = pkgutil.resolve_name(data["type"])
    return _restore(cls, (data["message"],), dict(data["attrs"]))
