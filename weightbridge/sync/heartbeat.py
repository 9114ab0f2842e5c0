"""Heartbeat bookkeeping on the local monotonic clock: which watched rank stood still too long.

Pure (no store, no torch): :class:`~weightbridge.sync.control.ControlPlane` feeds it the counters it
reads from ``P/hb/<rank>`` and asks who is dead; any rank's control plane owns one.
"""

from __future__ import annotations

from weightbridge.sync.roster import RankId


class HeartbeatMonitor:
    """Tracks, on the local monotonic clock, how long each watched rank's heartbeat stood still.

    A rank counts as silent only while it is *watched continuously*: an observation after a
    gap longer than half of ``dead_after_s`` restarts its clock (the counter may have stopped
    at any time during the gap; a restarted process starts a new, larger counter).
    """

    def __init__(self, dead_after_s: float) -> None:
        self.dead_after_s = dead_after_s
        self._last: dict[RankId, tuple[int, float, float]] = {}  # counter, unchanged since, observed at
        self._dead: dict[RankId, int] = {}  # counter value at which a rank was declared dead

    def observe(self, who: RankId, counter: int, now: float) -> None:
        prev = self._last.get(who)
        if prev is None or prev[0] != counter or now - prev[2] > self.dead_after_s / 2:
            self._last[who] = (counter, now, now)
        else:
            self._last[who] = (counter, prev[1], now)

    def last_counter(self, who: RankId) -> int:
        """The last counter observed for ``who`` (0: never observed)."""
        prev = self._last.get(who)
        return 0 if prev is None else prev[0]

    def silent_for(self, who: RankId, now: float) -> float | None:
        """Seconds ``who``'s counter has stood still while watched; None if it never beat."""
        prev = self._last.get(who)
        if prev is None or prev[0] == 0:
            return None
        return now - prev[1]

    def dead(self, who: RankId, now: float) -> bool:
        silent = self.silent_for(who, now)
        return silent is not None and silent > self.dead_after_s

    def mark_dead(self, who: RankId) -> None:
        """Remember ``who`` as dead until its counter moves again (a restart)."""
        if who in self._last:
            self._dead[who] = self._last[who][0]

    def known_dead(self, who: RankId, counter: int) -> bool:
        return self._dead.get(who) == counter
