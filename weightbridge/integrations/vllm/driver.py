"""The driver side: where the user's ``vllm.LLM`` lives. Control calls only; no weights pass here.

::

    sync = VLLMWeightSync(llm, "weightbridge.yaml", host=H, port=P, instance=i)   # once
    v = sync.update()          # async: apply the newest version the workers have complete (no wait)
    v = sync.update(7)         # sync: wait until version 7 arrived, apply it
    sync.version               # last applied version (also llm.get_weight_version())

Each ``update`` is vLLM's weight-update protocol: ``start_weight_update`` /
``update_weights`` / ``finish_weight_update``, each a ``collective_rpc`` the engine core runs
between engine steps, so generation never sees a half-written model. ``update()`` with no
version first reads the workers' ``staged`` acks from the control store and skips the protocol
entirely when nothing new is complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from weightbridge.integrations.vllm import BACKEND


class VLLMWeightSync:
    """Connects one ``vllm.LLM`` (one rollout instance of the spec) to the bridge."""

    def __init__(
        self,
        llm: Any,
        spec: str | Path,
        *,
        host: str,
        port: int,
        instance: int = 0,
        staging: bool | None = None,
        probe: str = "check",
        cache_dir: str | None = None,
        timeout_s: float | None = None,
        prefix: str = "wb",
        heartbeat_s: float = 1.0,
        on_round: Any = None,
    ) -> None:
        """``on_round``: a picklable callable the workers' bridges call after each receive round;
        a test hook (the conformance suite injects faults with it), sent pickled to the workers."""
        from weightbridge.bridge import load_spec

        backend = getattr(getattr(llm.llm_engine.vllm_config, "weight_transfer_config", None), "backend", None)
        if backend != BACKEND:
            raise ValueError(
                f"the LLM's weight_transfer_config.backend is {backend!r}: create it with "
                f"LLM(..., weight_transfer_config=WeightTransferConfig(backend={BACKEND!r}))"
            )
        path = Path(spec)
        is_file = "\n" not in str(spec) and path.is_file()
        text = path.read_text() if is_file else str(spec)
        self.resolved = load_spec(path if is_file else text)  # fails here, with file:line, before any RPC
        self.llm = llm
        self.instance = instance
        self.prefix = prefix
        self.timeout_s = float(timeout_s or self.resolved.sync.timeout_s)
        self.version: int | None = None
        ranks = sorted(self.resolved.rollout.instance_ranks(instance), key=lambda r: r.local_rank)
        self.rollout_ranks = [r.rank for r in ranks]
        self._store = _client_store(host, port, self.timeout_s)
        init_info = {
            "spec": text, "spec_name": str(spec) if is_file else "<spec>",
            "base_dir": str(path.resolve().parent) if is_file else str(Path.cwd()),
            "host": host, "port": int(port), "instance": instance, "staging": staging, "probe": probe,
            "cache_dir": cache_dir, "timeout_s": self.timeout_s, "prefix": prefix, "heartbeat_s": heartbeat_s,
        }
        if on_round is not None:
            import base64
            import pickle

            init_info["on_round"] = base64.b64encode(pickle.dumps(on_round)).decode()
        llm.init_weight_transfer_engine({"init_info": init_info})

    def staged(self) -> int | None:
        """The newest version every worker of this instance has complete (from their acks), or None."""
        versions = self._acked("staged")
        return None if versions is None else min(versions)

    def update(self, version: int | None = None, *, timeout_s: float | None = None) -> int | None:
        """Apply ``version`` (wait for it, up to ``timeout_s``) or, with None, the newest complete one.

        Returns the version now live, or None when ``version`` is None and nothing newer is
        complete. Raises what the workers raise (``DeadlineExceeded``, ``PeerFailed``, ...) wrapped
        by vLLM's RPC; the engine keeps serving the previous weights in that case.
        """
        previous = self.version
        if version is None:
            ready = self.staged()
            if ready is None or (previous is not None and ready <= previous):
                return None
        self.llm.start_weight_update()
        info = {"version": version, "timeout_s": float(timeout_s or self.timeout_s)}
        try:
            self.llm.update_weights({"update_info": info})
        finally:
            applied = self._applied()
            self.llm.finish_weight_update(weight_version=None if applied is None else str(applied))
            self.version = applied
        return applied if (version is not None or applied != previous) else None

    def _applied(self) -> int | None:
        versions = self._acked("applied")
        if versions is None:
            return None
        if len(set(versions)) != 1:
            raise RuntimeError(
                f"rollout instance {self.instance}: workers report different versions {sorted(set(versions))}"
            )
        return versions[0]

    def _acked(self, stage: str) -> list[int] | None:
        """The version each worker of this instance last acked at ``stage``; None if one never did."""
        from weightbridge.sync.messages import Ack, Keys, decode

        keys = [Keys(self.prefix).ack(stage, r) for r in self.rollout_ranks]
        if not self._store.check(keys):
            return None
        return [decode(self._store.get(k), Ack).version for k in keys]


def _client_store(host: str, port: int, timeout_s: float) -> Any:
    from weightbridge.transport.store import open_store

    return open_store(host, port, is_master=False, timeout_s=timeout_s)
