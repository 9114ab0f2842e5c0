"""Typed control messages (pydantic, JSON on the store; never pickle) and the store key layout.

Key layout, all under one ``prefix`` (default ``wb``; ``P`` below). ``S/R`` is a rank
written ``trainer/1`` or ``rollout/3`` (spec numbering). ``E`` is a membership epoch.

================================  =====================  ===============================================
key                               value                  written by / when
================================  =====================  ===============================================
``P/join/S/R``                    :class:`Join`          every rank when it connects (a restart writes
                                                         a new nonce and a later ``started``); deleted
                                                         by ``close()``
``P/leave/S/R``                   :class:`Leave`         ``close()``
``P/hb/S/R``                      int (ASCII)            the rank's heartbeat thread: its own counter
                                                         (``set``; starts at the wall clock in ms)
``P/epoch``                       int (ASCII)            trainer 0: the newest epoch (0 = none yet); it
                                                         sets max(store, its memory) + 1, skipping
                                                         numbers whose members key exists
``P/e{E}/members``                :class:`Membership`    trainer 0, before announcing in epoch ``E``
``P/e{E}/hello/S/R``              :class:`Hello`         every member entering epoch ``E`` (its nonce
                                                         also keys the epoch's data-sender check)
``P/e{E}/fail/S/R``               :class:`Failure`       rank ``S/R``'s latest failure in epoch ``E``
                                                         (a fresh ``id`` each; no counter), naming the
                                                         push (``version``) it failed in
``P/e{E}/failed``                 ``"S/R id"``           whoever failed last in epoch ``E`` (after its
                                                         ``fail`` key): readers rescan when it changes
``P/e{E}/pg/...``                 (transport)            the epoch's bridge-group rendezvous (c10d's
                                                         own keys, sealed by the transport's
                                                         ``SealedStore``, its ``add`` counters excepted;
                                                         the data-sender check covers it too)
``P/ann``                         :class:`Announce`      trainer 0, once per push (latest only)
``P/ack/staged/R``                :class:`Ack`           rollout rank ``R`` (latest), data complete;
                                                         carries the rank's join nonce and the epoch
``P/ack/applied/R``               :class:`Ack`           rollout rank ``R`` (latest), live weights = it
``P/inst/I/S/n/R``                :class:`Offer`         rollout rank ``R`` of instance ``I``, round ``n`` of
                                                         the instance's apply agreement (session ``S``:
                                                         the instance's join nonces); rounds ``n - 2`` and
                                                         older are deleted
================================  =====================  ===============================================

Trainer 0 deletes the keys of an epoch (``P/e{E}/...``: members, hellos, failures, the flag, Gloo's
rendezvous keys) once it opened three newer ones (:data:`weightbridge.sync.board.KEEP_EPOCHS`).

Heartbeats are counters, not timestamps: a waiter notes when it last saw a counter
change, on its own monotonic clock, so clock skew between hosts does not matter.

**Every value is authenticated** (:mod:`.auth`): stored as ``MAC || stamp || body``, the MAC over the
full key, the stamp and the body, so a reader accepts a value only under the key it was written for.
Nothing is a ``store.add`` counter. A store keyed by the job secret keeps a key's value unless a later
sealed one comes (:mod:`weightbridge.transport.store_server`); what a stranger can still do, key by
key and store by store, is in ``docs/trust.md``: at most a typed error or a wait to the deadline.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

PROTOCOL = 1

Side = Literal["trainer", "rollout"]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    protocol: int = PROTOCOL


class Join(_Message):
    """A rank connected (or reconnected: a new ``nonce``)."""

    kind: Literal["join"] = "join"
    side: Side
    rank: int
    instance: int  # rollout instance (0 for trainers)
    nonce: str  # unique per process incarnation
    pid: int
    host: str
    started: int = 0  # when this incarnation's bridge was created (ms, wall clock): a later process has a larger one


class Leave(_Message):
    """A rank closed its bridge on purpose."""

    kind: Literal["leave"] = "leave"
    side: Side
    rank: int
    nonce: str


class Membership(_Message):
    """Who takes part in epoch ``epoch``: every trainer rank and the listed rollout instances.

    ``rollout_ranks`` lists the members' spec rollout ranks in plan order; the epoch's
    :class:`~weightbridge.sync.roster.Roster` (built from this message) translates between numberings.
    """

    kind: Literal["members"] = "members"
    epoch: int
    num_trainers: int
    instances: tuple[int, ...]  # spec instance indices, ascending
    rollout_ranks: tuple[int, ...]  # spec rollout ranks, instance-major
    reason: str  # why this epoch started (first push, join, failure, leave)


class DeviceIdentity(BaseModel):
    """Where a rank's bytes live and how they move (:mod:`weightbridge.transport.identity` builds it).

    ``backend``: the wire backend the rank resolved from ``sync.transport`` and its tensors (``gloo``,
    ``nccl``; ``""``: a data plane that names none). ``host``: equal for the processes of one host and
    network namespace, different across hosts and namespaces. ``device``: ``cpu``, or the GPU's UUID
    (``GPU-...``, ``MIG-...``), the same in every process whatever ``CUDA_VISIBLE_DEVICES`` numbers it;
    ``cuda:<index>`` only where no UUID is known. ``label``: this process's name of the device (messages).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    backend: str
    host: str
    device: str
    label: str = ""

    def where(self) -> str:
        """``cuda:0 (GPU-5f0c...) of host 1a2b3c4d``: the device as errors show it."""
        where = self.label or self.device
        if self.label and self.device not in ("", "cpu", self.label):
            where += f" ({self.device})"
        return f"{where} of host {self.host}"

    def describe(self) -> str:
        """``nccl on cuda:0 (GPU-5f0c...) of host 1a2b3c4d``."""
        return f"{self.backend or 'no backend'} on {self.where()}"


class Hello(_Message):
    """What a rank believes before the first byte of an epoch; all members must agree (``identity``:
    on the backend; and no two NCCL members on one device)."""

    kind: Literal["hello"] = "hello"
    side: Side
    rank: int
    epoch: int
    spec_hash: str
    plan_hash: str
    dtypes: str  # digest of the rank's real local tensor dtypes, name-sorted
    dtype_diffs: tuple[str, ...] = ()  # "name: spec bfloat16, tensor float32" (first few)
    wire: str = ""  # data-plane options that shape the wire (e.g. "checksums=False")
    nonce: str
    started: int = 0  # the rank process's start (ms), as in its Join: a later join record means it restarted
    identity: DeviceIdentity | None = None  # None: an endpoint that states none (its backend then matches nobody's)


class Announce(_Message):
    """Trainer 0 starts push number ``seq`` (version ``version``) in epoch ``epoch``."""

    kind: Literal["announce"] = "announce"
    seq: int
    version: int
    epoch: int
    started: int = 0  # trainer 0's process start (ms): a restarted trainer 0 announces with a larger one

    @property
    def order(self) -> tuple[int, int, int]:
        """``(epoch, seq, started)``: what rollout ranks compare (:func:`weightbridge.runtime.coordinator.receives`)."""
        return self.epoch, self.seq, self.started


class Ack(_Message):
    """Rollout rank ``rank`` has version ``version`` (push ``seq``) ``staged`` or ``applied``."""

    kind: Literal["ack"] = "ack"
    rank: int
    version: int
    seq: int
    epoch: int
    stage: Literal["staged", "applied"]
    nonce: str = ""  # the writer's join nonce: acks of an earlier incarnation of the rank do not count


class Offer(_Message):
    """Rollout rank ``rank``'s state in round ``round`` of its instance's apply agreement.

    ``staged``: the complete version it holds for ``apply()`` (kept until the round's decision),
    None when it holds none; ``live``: the version its live weights hold; ``late``: its deadline
    passed; ``error``: ``"Type: message"`` of a failed receive, else None; ``want``: the version its
    ``apply_instance`` call asked for (None: whatever every rank has). The decision reads the
    wanted version from the offers, never from the deciding rank, so every rank decides alike.
    """

    kind: Literal["offer"] = "offer"
    rank: int
    round: int
    staged: int | None
    live: int | None
    late: bool = False
    error: str | None = None
    want: int | None = None


class Failure(_Message):
    """Rank ``side rank`` failed; every member waiting in the epoch raises ``PeerFailed`` with this."""

    kind: Literal["failure"] = "failure"
    side: Side
    rank: int
    epoch: int
    error: str  # exception type name
    message: str
    id: str = ""  # fresh per published failure (readers tell a new failure from one already seen)
    version: int | None = None  # the push it failed in (trainer: push(version); rollout: the announced version)


AnyMessage = Annotated[
    Union[Join, Leave, Membership, Hello, Announce, Ack, Offer, Failure], Field(discriminator="kind")
]
_ADAPTER: TypeAdapter[AnyMessage] = TypeAdapter(AnyMessage)

M = TypeVar("M", bound=_Message)


def encode(msg: _Message) -> bytes:
    return msg.model_dump_json().encode()


# Control messages are a few hundred bytes; anything far larger is not one (and is not parsed).
MAX_MESSAGE_BYTES = 1 << 20


def decode(data: bytes | str, cls: type[M]) -> M:
    """Parse ``data`` as ``cls``; :class:`~weightbridge.errors.BadMessage` on a foreign, corrupt or
    oversized value (never a bare ``ValidationError``: readers run in threads and must report it)."""
    from weightbridge.errors import BadMessage

    if len(data) > MAX_MESSAGE_BYTES:
        raise BadMessage("control store", f"a {len(data)}-byte value is not a {cls.__name__} message "
                         f"(limit {MAX_MESSAGE_BYTES} bytes)")
    try:
        msg = _ADAPTER.validate_json(data)
    except ValueError as exc:  # pydantic.ValidationError; its text quotes at most a little of the input
        first = str(exc).splitlines()[1:2] or [type(exc).__name__]
        raise BadMessage("control store", f"not a valid {cls.__name__} message ({first[0].strip()[:200]})") from None
    if not isinstance(msg, cls):
        raise BadMessage("control store", f"expected a {cls.__name__} message, got {type(msg).__name__}")
    return msg


class Keys:
    """The key layout above, as functions. ``who`` is a ``RankId.key`` such as ``rollout/3``."""

    def __init__(self, prefix: str = "wb") -> None:
        self.prefix = prefix.rstrip("/")

    def join(self, who: str) -> str:
        return f"{self.prefix}/join/{who}"

    def leave(self, who: str) -> str:
        return f"{self.prefix}/leave/{who}"

    def heartbeat(self, who: str) -> str:
        return f"{self.prefix}/hb/{who}"

    @property
    def epoch(self) -> str:
        return f"{self.prefix}/epoch"

    def members(self, epoch: int) -> str:
        return f"{self.prefix}/e{epoch}/members"

    def hello(self, epoch: int, who: str) -> str:
        return f"{self.prefix}/e{epoch}/hello/{who}"

    def failure(self, epoch: int, who: str) -> str:
        return f"{self.prefix}/e{epoch}/fail/{who}"

    def failed(self, epoch: int) -> str:
        return f"{self.prefix}/e{epoch}/failed"

    def group_prefix(self, epoch: int) -> str:
        return f"{self.prefix}/e{epoch}/pg"

    @property
    def announce(self) -> str:
        return f"{self.prefix}/ann"

    def ack(self, stage: str, rollout_rank: int) -> str:
        return f"{self.prefix}/ack/{stage}/{rollout_rank}"

    def offer(self, instance: int, session: str, round: int, rollout_rank: int) -> str:
        return f"{self.prefix}/inst/{instance}/{session}/{round}/{rollout_rank}"
