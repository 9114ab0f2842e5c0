"""The worker side: a vLLM ``WeightTransferEngine`` that receives through a :class:`RolloutBridge`.

One instance per vLLM worker process (created by vLLM's ``Worker.load_model`` when
``weight_transfer_config.backend == "weightbridge"``). vLLM calls, in the worker thread, between
engine steps (each is a ``collective_rpc`` from the driver, so every worker of the engine runs it):

``init_transfer_engine(init)``   resolve the spec, check it against the engine (mesh, probe of
                                 vLLM's own ``load_weights``, pins), join the bridge as rollout rank
                                 ``instance * world_size + worker rank``
``start_weight_update()``        begin vLLM's layerwise reload (:class:`ReloadSession`)
``update_weights(info)``         every worker calls ``RolloutBridge.apply_instance`` (the bridge's
                                 instance-level apply: the workers agree on one complete version
                                 through the control store, waiting up to ``timeout_s`` for
                                 ``info.version``), then writes the receive buffers into the model
``finish_weight_update()``       finalise the reload (post-processing re-runs)

Receive buffers: one copy of the rank's checkpoint-format shard (``sync`` mode: received in place,
the engine is paused for it) or two (``async``: a background thread receives into a staging copy
while the engine keeps generating). vLLM cannot serve from them: post-processing (prepacking,
quantisation) consumes checkpoint-format tensors, so every update goes through the reload.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from weightbridge.integrations.vllm.probing import EngineMismatch
from weightbridge.integrations.vllm.reload import ReloadSession
from weightbridge.errors import BridgeError

log = logging.getLogger(__name__)


@dataclass
class WeightbridgeInitInfo(WeightTransferInitInfo):
    """``llm.init_weight_transfer_engine({"init_info": {...}})`` fields (the driver fills them)."""

    spec: str  # spec YAML text
    host: str  # control store (hosted by trainer rank 0)
    port: int
    spec_name: str = "<spec>"  # for error messages
    base_dir: str | None = None  # relative model paths in the spec resolve against this
    instance: int = 0  # which rollout instance of the spec this engine is
    staging: bool | None = None  # None: the spec's sync.staging (default: True in async mode, else False)
    probe: str = "check"  # "check": probe vLLM's load_weights (cached) and require the spec's layout; "off"
    cache_dir: str | None = None  # probe cache (default ~/.cache/weightbridge/vllm-probe)
    timeout_s: float | None = None  # update_weights' default wait (default: the spec's sync.timeout_s)
    prefix: str = "wb"  # the bridge's store key prefix (BridgeOptions.prefix)
    # Test hook only (the conformance suite's fault injection): a pickled ``on_round`` callable,
    # base64 text because vLLM sends init_info as msgpack. Unpickling runs code: never set it from
    # untrusted input. None (the default) in production.
    on_round: str | None = None


@dataclass
class WeightbridgeUpdateInfo(WeightTransferUpdateInfo):
    """``llm.update_weights({"update_info": {...}})`` fields.

    ``version`` None: apply the newest version every worker has complete, if any (never waits).
    ``version`` v: wait (up to ``timeout_s``) until every worker has v or newer, then apply it.
    """

    version: int | None = None
    timeout_s: float | None = None


@dataclass
class _Stats:
    version: int | None = None
    wait_s: float = 0.0
    apply_s: float = 0.0
    write_s: float = 0.0
    updates: int = 0
    history: list[int] = field(default_factory=list)


class WeightbridgeEngine(WeightTransferEngine[WeightbridgeInitInfo, WeightbridgeUpdateInfo]):
    init_info_cls = WeightbridgeInitInfo
    update_info_cls = WeightbridgeUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.bridge: Any = None
        self.buffers: dict[str, torch.Tensor] = {}
        self.probed: Any = None  # the RankLayout probed from vLLM's loader at init (probe="check")
        self.last_error: BaseException | None = None  # the typed error of the last failed update
        self.session: ReloadSession | None = None
        self.stats = _Stats()
        self.me = f"rollout worker {self.parallel_config.rank}"
        self.timeout_s = 300.0

    # -- init ---------------------------------------------------------------------------------
    def init_transfer_engine(self, init_info: WeightbridgeInitInfo) -> None:
        try:
            self._init(init_info)
        except BridgeError as exc:  # vLLM's RPC (and HTTP) re-raise it untyped; the driver can fetch it typed
            self.last_error = exc
            raise

    def _init(self, init_info: WeightbridgeInitInfo) -> None:
        from weightbridge.bridge import BridgeOptions, RolloutBridge
        from weightbridge.spec.errors import SpecErrors
        from weightbridge.spec.resolve import check_text
        from weightbridge.tensors import empty_like_layout

        if self.bridge is not None:  # re-initialised (a new spec or phase): leave the old bridge
            self.bridge.close()
            self.bridge = None
        base = Path(init_info.base_dir) if init_info.base_dir else None
        resolved, problems = check_text(init_info.spec, init_info.spec_name, base)
        if problems or resolved is None:
            raise SpecErrors(problems)
        layout = self._my_layout(resolved, init_info.instance)
        self.me = f"rollout {layout.rank} (instance {init_info.instance}, vLLM worker {self.parallel_config.rank})"
        if init_info.probe == "check":
            from weightbridge.integrations.vllm.probing import check_against_engine

            self.probed = check_against_engine(self, resolved, layout, cache_dir=init_info.cache_dir)
        elif init_info.probe != "off":
            raise ValueError(f"init_info.probe must be 'check' or 'off', got {init_info.probe!r}")
        self.timeout_s = float(init_info.timeout_s or resolved.sync.timeout_s)
        self.buffers = empty_like_layout(layout, device=self.device)
        on_round = None
        if init_info.on_round:  # test hook (see WeightbridgeInitInfo.on_round)
            import base64
            import pickle

            on_round = pickle.loads(base64.b64decode(init_info.on_round))
        self.bridge = RolloutBridge.from_spec(
            resolved, rank=layout.rank, tensors=self.buffers, host=init_info.host, port=init_info.port,
            staging=init_info.staging, options=BridgeOptions(prefix=init_info.prefix, on_round=on_round),
        )
        log.info("weightbridge: %s joined (%d local tensors, staging=%s)", self.me, len(self.buffers),
                 self.bridge.staging)

    def _my_layout(self, resolved: Any, instance: int) -> Any:
        pc = self.parallel_config
        rollout = resolved.rollout
        if not 0 <= instance < rollout.num_instances:
            raise EngineMismatch(self.me, f"instance {instance} out of range: the spec has {rollout.num_instances}")
        ranks = sorted(rollout.instance_ranks(instance), key=lambda r: r.local_rank)
        mesh = resolved.spec.rollout.mesh
        want = {"tp": pc.tensor_parallel_size, "pp": pc.pipeline_parallel_size}
        have = {"tp": mesh.get("tp", 1), "pp": mesh.get("pp", 1)}
        if len(ranks) != pc.world_size or want != have:
            raise EngineMismatch(
                self.me,
                f"the spec's rollout mesh {have} ({len(ranks)} ranks per instance) does not match this engine "
                f"(tensor_parallel_size={want['tp']}, pipeline_parallel_size={want['pp']}, world {pc.world_size})",
            )
        return ranks[pc.rank]

    # -- one update ---------------------------------------------------------------------------
    def start_weight_update(self) -> None:
        self._require_init()
        self.session = ReloadSession(self.model, self.model_config)
        self.session.begin()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises on the CPU build.
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: WeightbridgeUpdateInfo) -> None:
        self._require_init()
        if self.session is None:
            raise RuntimeError(f"{self.me}: update_weights before start_weight_update")
        t0 = time.perf_counter()
        try:
            version = self.bridge.apply_instance(update_info.version,
                                                 timeout_s=float(update_info.timeout_s or self.timeout_s))
        except BridgeError as exc:  # vLLM's RPC re-raises it untyped; the driver can fetch it typed
            self.last_error = exc
            raise
        t1 = time.perf_counter()
        if version is not None:
            with torch.no_grad():
                self.session.write(self.buffers)
            self.stats.version = version
            self.stats.updates += 1
            self.stats.history.append(version)
        t2 = time.perf_counter()
        self.stats.wait_s, self.stats.apply_s, self.stats.write_s = t1 - t0, self.bridge.last_apply_s, t2 - t1

    def finish_weight_update(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.finish()

    def shutdown(self) -> None:
        if self.bridge is not None:
            self.bridge.close()
            self.bridge = None

    def status(self) -> dict[str, Any]:
        return {
            "rank": self.me, "version": self.bridge.version if self.bridge is not None else self.stats.version,
            "updates": self.stats.updates,
            "history": list(self.stats.history), "wait_s": self.stats.wait_s, "apply_s": self.stats.apply_s,
            "write_s": self.stats.write_s,
        }

    def _require_init(self) -> None:
        if self.bridge is None:
            raise RuntimeError(
                f"{self.me}: the weightbridge engine is not initialised: call "
                "llm.init_weight_transfer_engine(...) first (VLLMWeightSync does)"
            )
