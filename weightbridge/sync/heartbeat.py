"""Heartbeat bookkeeping on the local monotonic clock: which watched rank stood still too long.

Pure (no store, no torch): :class:`~weightbridge.sync.control.ControlPlane` feeds it the counters it
reads from ``P/hb/<rank>`` and asks who is dead; any rank's control plane owns one.
"""

from __future__ import annotations

from weightbridge.sync.roster import RankId


class HeartbeatMonitor:
    """Tracks, on the local monotonic clock, how long each watched rank's heartbeat was *seen* standing still.

    Only fresh readings count: ``None`` (the value was unreadable: garbage, forged) and a counter below
    the highest seen (a replayed older beat) are no observation at all, so a stranger who writes
    under a rank's heartbeat key can delay the verdict on a dead rank (its waits then end at their
    deadline) but never make a live one look dead. A rank counts as silent only for as long as the
    same counter was read again and again: silence is measured between readings, and a reading
    after a gap longer than half of ``dead_after_s`` restarts the clock (the counter may have stopped
    at any time during the gap; a restarted process starts a new, larger counter).
    """

    def __init__(self, dead_after_s: float) -> None:
        self.dead_after_s = dead_after_s
        self._last: dict[RankId, tuple[int, float, float]] = {}  # counter, first read at, last read at
        self._dead: dict[RankId, int] = {}  # counter value at which a rank was declared dead

    def observe(self, who: RankId, counter: int | None, now: float) -> None:
        prev = self._last.get(who)
        if counter is None or (prev is not None and counter < prev[0]):
            return  # unreadable, or a replayed older beat: nothing learned
        if prev is None or prev[0] != counter or now - prev[2] > self.dead_after_s / 2:
            self._last[who] = (counter, now, now)
        else:
            self._last[who] = (counter, prev[1], now)

    def last_counter(self, who: RankId) -> int:
        """The highest counter read for ``who`` (0: none yet)."""
        prev = self._last.get(who)
        return 0 if prev is None else prev[0]

    def silent_for(self, who: RankId, now: float) -> float | None:
        """Seconds ``who``'s counter was read standing still (between its first and last reading); None if
        it never beat. ``now`` is accepted for callers' symmetry and unused: an unread stretch proves nothing."""
        prev = self._last.get(who)
        if prev is None or prev[0] == 0:
            return None
        return prev[2] - prev[1]

    def dead(self, who: RankId, now: float) -> bool:
        silent = self.silent_for(who, now)
        return silent is not None and silent > self.dead_after_s

    def mark_dead(self, who: RankId) -> None:
        """Remember ``who`` as dead until its counter moves again (a restart)."""
        if who in self._last:
            self._dead[who] = self._last[who][0]

    def known_dead(self, who: RankId, counter: int | None) -> bool:
        return counter is not None and self._dead.get(who) == counter
