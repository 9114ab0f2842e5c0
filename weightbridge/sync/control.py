"""The control plane: typed messages on a key-value store, deadlines on every wait, failure fan-out.

One :class:`ControlPlane` per rank and thread (a store client is not shared between
threads; :meth:`ControlPlane.clone` opens another connection). It needs only the
store operations ``set``, ``check``, ``delete_key`` and ``compare_set`` (every read is one
``compare_set`` that never matches, or the client's ``peek``: it never blocks on a missing key),
which ``torch.distributed.TCPStore`` (between processes) and ``HashStore`` (threads, tests)
both provide. It never calls ``store.add``: a stranger writing a non-integer under a key
that is ``add``-ed makes the TCPStore server drop every client that adds to it.

Contracts:

1. **Every wait has a deadline.** :meth:`ControlPlane.wait_for` is the only waiting
   loop. It returns when every key exists (and ``ready`` accepts the values), and
   otherwise raises :class:`PeerFailed` as soon as any rank publishes a failure in the
   watched epoch or a watched rank's heartbeat stops, or :class:`DeadlineExceeded` at
   the deadline. Nothing blocks in ``store.get`` on a key that may never come.
2. **A failure reaches everyone.** A rank that fails for its own reason calls
   :meth:`ControlPlane.publish_failure` before raising; every other member waiting in
   that epoch raises ``PeerFailed`` carrying that rank's message. ``PeerFailed`` itself
   is never re-published (the original message stays the one everyone sees).
3. **Handshake before the first byte.** :func:`weightbridge.sync.handshake.handshake` (on
   a control plane) publishes this rank's :class:`Hello` and waits for every member's; a
   disagreement on spec hash, plan hash, backend or dtypes raises :class:`HandshakeMismatch` on
   every member, naming both ranks and values, and two NCCL members on one device
   :class:`~weightbridge.errors.DeviceConflict`, before any bridge group exists.
4. **Heartbeats.** A daemon thread sets ``P/hb/<rank>`` to its own counter every
   ``heartbeat_s`` (started from the wall clock in ms, so a restarted process never
   repeats its predecessor's values) until :meth:`ControlPlane.stop_heartbeat`; a store error
   skips one beat (logged once per outage), never ends the thread. A watched rank whose counter
   was read standing still for ``dead_after_s`` is reported dead (a killed process, or one stuck
   holding the GIL); an unreadable or replayed older counter is no reading.
5. **Authenticated values.** Every value is written sealed (``MAC || stamp || body``,
   :class:`~weightbridge.sync.auth.Signer`, bound to its key) and every read opens it:
   a value without the job secret's MAC raises :class:`ForgedMessage` naming the key and
   is never decoded; a sealed value that is not the expected message raises
   :class:`ProtocolError`. ``wait_for`` returns opened bodies.
6. **Failures without counters.** A failing rank writes ``P/e{E}/fail/<rank>`` (its
   latest failure in epoch ``E``, with a fresh id) and then ``P/e{E}/failed`` (who
   failed last: the readers' cue to rescan). A reader numbers the failures it has seen
   per epoch in the order it first saw them; ``since`` counts in that numbering, which
   is the same control plane's :meth:`ControlPlane.failure_count`. A failure names the push it
   happened in (``version``), so a wait can ignore a late failure of an earlier push (``only``).
7. **Restarts end waits on the predecessor.** A restarted rank beats under the same heartbeat
   key, hiding its predecessor's death; a wait given the ``joins`` its members joined with
   raises ``PeerFailed`` once a member's join record is a later process's
   (:meth:`ControlPlane.check_restarts`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from weightbridge.errors import DeadlineExceeded, ForgedMessage, HandshakeMismatch, PeerFailed, ProtocolError, StoreUnreachable
from weightbridge.sync.auth import Signer
from weightbridge.sync.batch import batch, read_many
from weightbridge.sync.heartbeat import HeartbeatMonitor
from weightbridge.sync.messages import Failure, Hello, Join, Keys, M, decode, encode
from weightbridge.sync.roster import RankId

log = logging.getLogger(__name__)

RESCAN_S = 1.0  # with a failure flag present, every failure key is re-read at least this often
GRACE_S = 0.5  # a wait's store calls end by its deadline plus this (the last check before raising)
FAIL_S = 1.0  # the most a failure path spends on the store (publishing, or finding a peer's cause)
_ABSENT = b"\x00weightbridge: no such key\x00"  # a compare_set expecting this never writes: a non-blocking read


def clone_store(store: Any) -> Any:
    """A second client of the same store for another thread (TCPStore.clone), else the store itself."""
    try:
        return store.clone() if hasattr(store, "clone") else store
    except RuntimeError:  # stores that cannot clone are thread-safe in-process maps (HashStore)
        return store


class ControlPlane:
    """One rank's view of the control store. See the module docstring for the contracts."""

    def __init__(
        self,
        store: Any,
        *,
        me: RankId,
        keys: Keys,
        timeout_s: float,
        heartbeat_s: float = 1.0,
        dead_after_s: float | None = None,
        monitor: HeartbeatMonitor | None = None,
        auth: Signer | None = None,
        ranks: Sequence[RankId] = (),
    ) -> None:
        """``auth``: the job secret's :class:`Signer` (None: ``$WEIGHTBRIDGE_SECRET``, else
        :class:`~weightbridge.errors.AuthError`); ``ranks``: every rank of the spec (whose failure
        keys a reader scans; ranks named by failure flags are scanned too)."""
        if auth is None:
            from weightbridge.sync.auth import signer_from_env

            auth = signer_from_env()
        self.auth = auth
        self.ranks = tuple(ranks)
        self.store = store
        self.me = me
        self.keys = keys
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = dead_after_s if dead_after_s is not None else max(10 * heartbeat_s, 3.0)
        self.monitor = monitor or HeartbeatMonitor(self.dead_after_s)
        self._hb_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()
        # failures seen, per epoch: ids in the order first seen; the flag value and time of the last scan
        self._seen: dict[int, list[str]] = {}
        self._failed: dict[str, Failure] = {}  # id -> failure (of any epoch)
        self._scan: dict[int, tuple[bytes, float]] = {}
        self._extra: dict[int, set[RankId]] = {}  # ranks named by failure flags, per epoch
        self._ignored: set[tuple[str, str]] = set()  # bad failure values already logged
        # Set by another thread: every wait on this control plane ends at once (RolloutBridge.close() ends
        # its receive thread's waits with it; that thread's control plane is a clone of its own).
        self.stop: threading.Event | None = None
        self.snapshot: dict[str, bytes | None] | None = None  # raw values read at once (sync/batch.py)

    def clone(self) -> ControlPlane:
        """A control plane on a new store connection, for another thread (shares nothing mutable)."""
        return ControlPlane(clone_store(self.store), me=self.me, keys=self.keys, timeout_s=self.timeout_s,
                            heartbeat_s=self.heartbeat_s, dead_after_s=self.dead_after_s, auth=self.auth,
                            ranks=self.ranks)

    # -- store access -------------------------------------------------------------------------
    def store_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the store; a store error is :class:`StoreUnreachable` naming this rank and the
        store (never a peer: the store may be external, and no read here blocks on a missing key)."""
        try:
            return fn(*args)
        except StoreUnreachable:
            raise  # typed already (store_client.py): the store is gone past the deadline, or restarted empty
        except RuntimeError as exc:  # DistStoreError / DistNetworkError subclass RuntimeError
            where = getattr(self.store, "address", None) or type(self.store).__name__
            raise StoreUnreachable(self.me, where, f"{getattr(fn, '__name__', 'call')} failed "
                                   f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})") from exc

    def bounded(self, until: float) -> Any:
        """A context in which every store call returns or raises by ``until`` (a ``time.monotonic()``
        value; :meth:`~weightbridge.transport.store_client.ReconnectingStore.bound`): a store that stops
        answering ends a wait at its deadline, not a store timeout later."""
        bound = getattr(self.store, "bound", None)
        return bound(until) if bound is not None else contextlib.nullcontext()

    def set(self, key: str, msg: Any) -> None:
        self.set_raw(key, encode(msg))

    def set_raw(self, key: str, body: bytes) -> None:
        """Write ``body`` sealed under ``key``."""
        self.store_call(self.store.set, key, self.auth.seal(key, body))

    def open(self, key: str, value: bytes | str) -> bytes:
        """The body of ``value`` read under ``key``; :class:`ForgedMessage` unless authenticated."""
        return self.auth.open(key, value, self.me)

    def get_raw(self, key: str) -> bytes | None:
        """The authenticated body at ``key``, or None if the key does not exist (never blocks)."""
        value = self.peek_raw(key)
        return None if value is None else self.open(key, value)

    def peek_raw(self, key: str) -> bytes | None:
        """The raw value at ``key`` or None, in one non-blocking call: a ``check`` then ``get`` blocks until
        the store's timeout when the key is deleted in between (a rank's ``close()`` deletes its join
        record while a peer reads it; a stranger may delete any key). Inside a
        :func:`~weightbridge.sync.batch.batch` of ``key``: the value read then."""
        if self.snapshot is not None and key in self.snapshot:
            return self.snapshot[key]
        peek = getattr(self.store, "peek", None)  # ReconnectingStore
        if peek is not None:
            return self.store_call(peek, key)
        value = self.store_call(self.store.compare_set, key, _ABSENT, _ABSENT)  # never matches, so never writes
        return None if value == _ABSENT else value

    def get(self, key: str, cls: type[M]) -> M | None:
        """The message at ``key``, or None if the key does not exist (never blocks)."""
        body = self.get_raw(key)
        return None if body is None else self.parse(key, body, cls)

    def parse(self, key: str, body: bytes, cls: type[M]) -> M:
        """``body`` (opened) as a ``cls``; :class:`ProtocolError` naming ``key`` if it is not one."""
        try:
            return decode(body, cls)
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            raise ProtocolError(self.me, f"the value under {key!r} is not a valid {cls.__name__} message "
                                f"({type(exc).__name__}: {str(exc)[:200]})") from None

    def exists(self, keys: Sequence[str]) -> bool:
        snap = self.snapshot
        if snap is not None and all(k in snap for k in keys):
            return all(snap[k] is not None for k in keys)
        return bool(self.store_call(self.store.check, list(keys)))

    def counter(self, key: str) -> int:
        """An authenticated integer (a heartbeat, the epoch number) at ``key``; 0 when absent."""
        body = self.get_raw(key)
        if body is None:
            return 0
        try:
            return int(body.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise ProtocolError(self.me, f"the value under {key!r} is not an integer") from None

    def set_counter(self, key: str, value: int) -> None:
        self.set_raw(key, str(int(value)).encode())

    def delete(self, key: str) -> None:
        self.store_call(self.store.delete_key, key)

    # -- deadlines ------------------------------------------------------------------------
    def deadline(self, timeout_s: float | None = None) -> float:
        return time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)

    def wait_for(
        self,
        keys: Sequence[str],
        deadline: float,
        what: str,
        *,
        ready: Callable[[list[bytes]], bool] | None = None,
        epoch: int | None = None,
        since: int = 0,
        watch: Iterable[RankId] = (),
        progress: Callable[[], None] | None = None,
        only: Callable[[Failure], bool] | None = None,
        joins: Mapping[RankId, Join | Hello] | None = None,
        budget_s: float | None = None,
    ) -> list[bytes]:
        """Wait until all ``keys`` exist (and ``ready(values)`` holds); return their authenticated bodies.

        Raises :class:`PeerFailed` when a rank publishes a failure in ``epoch`` (the
        ``since``-th and earlier are ignored: they concern an earlier push; with ``only``, just
        the failures it accepts count), a rank in ``watch`` stops heart-beating, or a rank in
        ``joins`` (its join record or hello in the wait's epoch) joined again (it restarted);
        :class:`DeadlineExceeded` past ``deadline`` (a ``time.monotonic()`` value), or at once when
        :attr:`stop` is set (another thread closing this rank).
        ``progress()``, if given, runs once per iteration (work the waiter must keep doing so that
        its peers can get here). ``budget_s``: the length of the deadline as the error reports it
        (default ``timeout_s``; a caller whose deadline is longer says so).
        """
        if self.snapshot is not None:
            raise RuntimeError("wait_for inside a batch of reads would see the same values until its deadline")
        return self._wait(keys, deadline, what, ready, epoch, since, tuple(w for w in watch if w != self.me),
                          progress, only, joins, self.timeout_s if budget_s is None else budget_s)

    def _wait(self, keys, deadline, what, ready, epoch, since, watch, progress, only, joins, budget_s) -> list[bytes]:
        sleep_s = 0.001
        # heartbeats from half a period on: a wait that ends sooner costs no heartbeat reads
        next_beat = time.monotonic() + self.heartbeat_s / 2
        while True:
            # the wait's own store calls end by its deadline (plus GRACE_S): a store that stops answering
            # cannot hold it longer; progress() is other work with deadlines of its own
            with self.bounded(deadline + GRACE_S):
                if epoch is not None:
                    self.raise_failures(epoch, since, only)
                # one key: one non-blocking read (no window between a check and a read for a deletion);
                # more: one check of them all, then one multi_get (sync/batch.py); a key deleted
                # meanwhile reads as missing, never blocks
                if len(keys) == 1:
                    raw = [self.peek_raw(keys[0])]
                else:
                    got = read_many(self, keys, all_or_none=True)
                    raw = [None] if got is None else [got[k] for k in keys]
                if all(v is not None for v in raw):
                    values = [self.open(k, v) for k, v in zip(keys, raw)]
                    if ready is None or ready(values):
                        return values
            if progress is not None:
                progress()
            now = time.monotonic()
            with self.bounded(deadline + GRACE_S):
                if (watch or joins) and now >= next_beat:
                    next_beat = now + self.heartbeat_s / 2
                    beats = [self.keys.heartbeat(w.key) for w in watch] + [self.keys.join(w.key) for w in joins or ()]
                    with batch(self, beats):  # every member's heartbeat and join record: one snapshot
                        self.check_heartbeats(watch, now)
                        if joins:
                            self.check_restarts(joins)
                if now > deadline or (self.stop is not None and self.stop.is_set()):
                    missing = [k for k in keys if not self.store_call(self.store.check, [k])]
                    if missing:
                        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
                        what = f"{what} (missing {', '.join(missing[:3])}{more})"
                    raise DeadlineExceeded(self.me, what, budget_s)
            time.sleep(sleep_s)
            sleep_s = min(sleep_s * 2, 0.02)

    def heartbeat(self, who: RankId) -> int | None:
        """``who``'s heartbeat counter (0: none yet), or None when the value is unreadable (without the secret,
        not an integer): no reading at all, so a forger can fake neither life nor a death
        (:class:`~weightbridge.sync.heartbeat.HeartbeatMonitor` also ignores a replayed older counter)."""
        try:
            return self.counter(self.keys.heartbeat(who.key))
        except (ForgedMessage, ProtocolError):
            return None

    def check_heartbeats(self, watch: Iterable[RankId], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for who in watch:
            self.monitor.observe(who, self.heartbeat(who), now)
            if self.monitor.dead(who, now):
                silent = self.monitor.silent_for(who, now) or 0.0
                self.monitor.mark_dead(who)
                raise PeerFailed(self.me, who, f"no heartbeat for {silent:.1f}s (process died or hung)")

    def check_restarts(self, joins: Mapping[RankId, Join | Hello]) -> None:
        """:class:`PeerFailed` when a rank of ``joins`` (rank -> its join record, or its hello, in the epoch
        being waited in) has joined again as a *later* process (another nonce, a later ``started``): the process
        that was a member is gone, and its successor's heartbeat (same key) hides that from
        :meth:`check_heartbeats`. A missing or unreadable record, or a replayed older one, proves
        nothing (a stranger may delete, overwrite or replay it) and is skipped."""
        for who, was in joins.items():
            if who == self.me:
                continue
            try:
                join = self.get(self.keys.join(who.key), Join)
            except (ForgedMessage, ProtocolError):
                continue
            if (join is not None and join.nonce != was.nonce and join.started > was.started
                    and (join.side, join.rank) == (who.side, who.rank)):
                raise PeerFailed(self.me, who, "restarted: a new process joined in its place, so the one "
                                 "that was a member of this epoch is gone")

    def epoch_watch(self, epoch: int, members: Sequence[RankId],
                    joins: Mapping[RankId, Join | Hello]) -> Callable[[], None]:
        """A check for a rank blocked outside :meth:`wait_for` in ``epoch`` (the bridge group's
        rendezvous): it raises :class:`PeerFailed` as :meth:`wait_for` would (a failure published in
        ``epoch``, a silent member, a member of ``joins`` that restarted since).
        Cheap to call often: it reads the store at most every ``min(heartbeat_s / 2, 0.1)`` s."""
        watch = tuple(m for m in members if m != self.me)
        last = [0.0]

        def check() -> None:
            now = time.monotonic()
            if now - last[0] < min(self.heartbeat_s / 2, 0.1):
                return
            last[0] = now
            if self.stop is not None and self.stop.is_set():
                raise DeadlineExceeded(self.me, f"the bridge group of epoch {epoch} (this rank is closing)",
                                       self.timeout_s)
            self.raise_failures(epoch)
            self.check_heartbeats(watch, now)
            self.check_restarts(joins)

        return check

    # -- failures -------------------------------------------------------------------------
    def publish_failure(self, epoch: int, exc: BaseException, version: int | None = None) -> None:
        """Tell every member of ``epoch`` that this rank failed with ``exc`` in push ``version`` (best effort)."""
        if isinstance(exc, (PeerFailed, HandshakeMismatch, StoreUnreachable)):
            return  # originated elsewhere, seen by everyone already, or nowhere to publish it
        if getattr(self.store, "down", False):  # the last call found the store gone: no second wait on it
            log.warning("%s: not publishing %s: %s (the control store is unreachable)", self.me, type(exc).__name__,
                        str(exc)[:200])
            return
        fid = uuid.uuid4().hex
        msg = Failure(side=self.me.side, rank=self.me.rank, epoch=epoch, error=type(exc).__name__,
                      message=str(exc)[:4000], id=fid, version=version)
        try:
            with self.bounded(time.monotonic() + self.fail_s):  # best effort: never a second deadline
                self.set(self.keys.failure(epoch, self.me.key), msg)
                self.set_raw(self.keys.failed(epoch), f"{self.me.key} {fid}".encode())  # after the failure itself
        except Exception:  # noqa: BLE001 - the store may be gone (StoreUnreachable): best effort
            log.warning("%s: could not publish failure %s (store unreachable)", self.me, msg)

    @property
    def fail_s(self) -> float:
        """The most a failure path spends on the store: ``min(FAIL_S, timeout_s / 4)``."""
        return min(FAIL_S, self.timeout_s / 4)

    def _refresh_failures(self, epoch: int) -> list[str]:
        """Read the failures of ``epoch`` (when its flag changed, or every ``RESCAN_S``); the ids seen, in order."""
        seen = self._seen.setdefault(epoch, [])
        flag_key = self.keys.failed(epoch)
        raw = self.peek_raw(flag_key)
        if raw is None:
            return seen
        now = time.monotonic()
        last = self._scan.get(epoch)
        if last is not None and last[0] == raw and now - last[1] < RESCAN_S:
            return seen
        self._scan[epoch] = (raw, now)
        try:
            body = self.open(flag_key, raw)
        except ForgedMessage as exc:  # only a cue to rescan: every rank's (sealed) failure key is read anyway
            self._ignore(flag_key, raw, exc)
            body = b""
        extra = self._extra.setdefault(epoch, set())
        side, _, rank = body.decode("ascii", "replace").partition(" ")[0].partition("/")
        if side in ("trainer", "rollout") and rank.isdigit() and len(rank) < 7:
            extra.add(RankId(side, int(rank)))  # type: ignore[arg-type]
        for who in (*self.ranks, *sorted(extra - set(self.ranks), key=str)):
            key = self.keys.failure(epoch, who.key)
            try:
                f = self.get(key, Failure)
                if f is not None and (f.side, f.rank, f.epoch) != (who.side, who.rank, epoch):
                    raise ProtocolError(self.me, f"the failure under {key!r} is {f.side} {f.rank}'s of epoch {f.epoch}")
            except (ForgedMessage, ProtocolError) as exc:
                # Not a failure anyone published: ignored (raising here would fail every later push of
                # a rank still watching this epoch); a real failure it replaced still shows through the
                # failing rank's heartbeat, its dropped sockets and the deadline.
                self._ignore(key, None, exc)
                continue
            if f is None:
                continue
            if f.id not in self._failed:
                self._failed[f.id] = f
                seen.append(f.id)
        return seen

    def _ignore(self, key: str, raw: bytes | None, exc: BaseException) -> None:
        """Log a bad value under a failure key once per key and error."""
        note = (key, str(exc)[:200])
        if note not in self._ignored:
            self._ignored.add(note)
            log.warning("%s: ignoring the value under %r: %s", self.me, key, exc)

    def failure_count(self, epoch: int) -> int:
        """How many failures of ``epoch`` this control plane has seen (read now): the ``since`` of later waits."""
        return len(self._refresh_failures(epoch))

    def failures(self, epoch: int, since: int = 0) -> list[Failure]:
        """Failures published in ``epoch`` after the first ``since`` this control plane saw."""
        return [self._failed[i] for i in self._refresh_failures(epoch)[since:]]

    def raise_failures(self, epoch: int, since: int = 0, only: Callable[[Failure], bool] | None = None) -> None:
        for f in self.failures(epoch, since):
            who = RankId(f.side, f.rank)
            if who != self.me and (only is None or only(f)):
                raise PeerFailed(self.me, who, f"{f.error}: {f.message}")

    # -- heartbeat thread -----------------------------------------------------------------
    def start_heartbeat(self) -> None:
        if self._hb_thread is not None:
            return
        store = clone_store(self.store)
        key = self.keys.heartbeat(self.me.key)
        self._hb_stop.clear()
        seal = self.auth.seal
        start = time.time_ns() // 1_000_000  # a restarted process's counter starts above its predecessor's

        def beat() -> None:
            n, failing = start, False
            while not self._hb_stop.is_set():
                n += 1
                try:
                    store.set(key, seal(key, str(n).encode()))
                    if failing:
                        log.warning("%s: heartbeats reach the control store again", self.me)
                    failing = False
                except Exception as exc:  # noqa: BLE001 - the store is unreachable: this beat is lost, not
                    # the next ones (returning here made this rank look dead for good once the store was back)
                    if not failing:
                        log.warning("%s: heartbeat not written (%s: %s); retrying every %gs", self.me,
                                    type(exc).__name__, str(exc)[:200], self.heartbeat_s)
                    failing = True
                self._hb_stop.wait(self.heartbeat_s)

        self._hb_thread = threading.Thread(target=beat, name=f"weightbridge-heartbeat-{self.me.key}", daemon=True)
        self._hb_thread.start()

    def stop_heartbeat(self) -> None:
        self._hb_stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=2 * self.heartbeat_s + 1)
            self._hb_thread = None
