"""The worker side: a vLLM ``WeightTransferEngine`` that receives through a :class:`RolloutBridge`.

One instance per vLLM worker process (created by vLLM's ``Worker.load_model`` when
``weight_transfer_config.backend == "weightbridge"``). vLLM calls, in the worker thread, between
engine steps (each is a ``collective_rpc`` from the driver, so every worker of the engine runs it):

``init_transfer_engine(init)``   check the init command (sealed with the job secret, fresh, data
                                 only: :mod:`weightbridge.integrations._engine.init_command`), resolve
                                 the spec, check it against the engine (mesh, probe of vLLM's own
                                 ``load_weights``, pins), then leave the bridge of a previous init
                                 and join as rollout rank ``instance * world_size + worker rank``
``start_weight_update()``        begin vLLM's layerwise reload (:class:`ReloadSession`)
``update_weights(info)``         every worker calls ``RolloutBridge.apply_instance`` (the bridge's
                                 instance-level apply: the workers agree on one complete version
                                 through the control store, waiting up to ``timeout_s`` for
                                 ``info.version``) with the reload as its sink: each local tensor
                                 is written into the model as soon as it is complete
``finish_weight_update()``       finalise the reload (post-processing of what is left re-runs)

Memory (``docs/memory.md``): in place (``sync`` mode) the worker keeps no copy of its shard: the
bridge streams, receiving inside ``update_weights`` (the engine is paused for it) and handing each
checkpoint-format local tensor to vLLM's layerwise reload the moment its last bytes arrived, which
processes a layer once all of its tensors came; the rounds bring a rank's tensors in canonical
order, so layers complete within a round or two. With staging (``async``), a background thread
receives into one staging copy of the shard (device or host memory: ``sync.staging_memory``)
while the engine keeps generating, and ``update_weights`` writes that copy into the reload. vLLM
cannot serve from checkpoint-format tensors (post-processing: prepacking, quantisation), so
every update goes through the reload. Where the sender quantises, the local tensors include FP8
weights and their scales (``self.fp8`` names the weights; FP8 layers of an engine that quantises
online are written whole, :mod:`.fp8`). With test hooks enabled (``WEIGHTBRIDGE_TEST_HOOKS=1``)
the worker also keeps a CPU copy of every tensor it wrote, in either mode
(:attr:`WeightbridgeEngine.buffers`: the bitwise check of the checkpoint format).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from weightbridge.errors import BridgeError, InitRefused
from weightbridge.integrations._engine.init_command import InitGate
from weightbridge.integrations.vllm.reload import ReloadSession

log = logging.getLogger(__name__)


@dataclass
class WeightbridgeInitInfo(WeightTransferInitInfo):
    """``llm.init_weight_transfer_engine({"init_info": {...}})``: an init command, sealed (the drivers
    build it: :meth:`weightbridge.integrations._engine.init_command.Prepared.sealed`).

    ``payload``: the command's JSON text (spec, control store, instance, ...); ``seal``: the job
    secret's MAC over it. Both are data: the worker checks the seal and parses the text before
    anything of it runs (:class:`~weightbridge.integrations._engine.init_command.InitGate`).
    """

    payload: Any
    seal: Any = None
    unexpected: tuple[str, ...] = ()  # other keys the init_info had (then it is refused)


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
        self.written: dict[str, torch.Tensor] = {}  # test hooks only: CPU copies of what was written
        self.probed: Any = None  # the RankLayout probed from vLLM's loader at init (probe="check")
        self.last_error: BaseException | None = None  # the typed error of the last failed or refused init, or update
        self.session: ReloadSession | None = None
        self.fp8: frozenset[str] = frozenset()  # local FP8 weights this worker receives (quantised at the sender)
        self.names: tuple[str, ...] = ()  # every local tensor this worker receives
        self.stats = _Stats()
        self.me = f"rollout worker {self.parallel_config.rank}"
        self.timeout_s = 300.0
        self.gate = InitGate()  # this worker's checks of init commands (replays refused across inits)

    # -- init ---------------------------------------------------------------------------------
    def parse_init_info(self, init_dict: dict[str, Any]) -> WeightbridgeInitInfo:
        """vLLM's parsing of ``init_info`` (any dict, e.g. an HTTP body); never raises: what does not
        fit is refused by :meth:`init_transfer_engine`."""
        if not isinstance(init_dict, dict):
            return WeightbridgeInitInfo(payload=None, unexpected=(f"<{type(init_dict).__name__}>",))
        return WeightbridgeInitInfo(payload=init_dict.get("payload"), seal=init_dict.get("seal"),
                                    unexpected=tuple(sorted(str(k)[:50] for k in init_dict
                                                            if k not in ("payload", "seal")))[:10])

    def init_transfer_engine(self, init_info: WeightbridgeInitInfo) -> None:
        try:
            if init_info.unexpected:
                raise InitRefused(self.me, f"init_info is not a weightbridge init command (fields: payload, seal; "
                                           f"got also {list(init_info.unexpected)})")
            self._init(init_info)
        except InitRefused as exc:
            # Every worker refuses the same command; only the last one raises. vLLM's multiprocess
            # executor stops reading replies at the first failed worker and hands the later
            # workers' replies to the next call (every later RPC then fails), so a refusal raised
            # by every worker would break the engine for its real driver. The driver fetches the
            # typed error from any worker (WorkerExtension.weightbridge_last_error).
            self.last_error = exc
            log.warning("weightbridge: %s", exc)
            if self.parallel_config.rank == self.parallel_config.world_size - 1:
                raise
        except BridgeError as exc:  # vLLM's RPC (and HTTP) re-raise it untyped; the driver can fetch it typed
            self.last_error = exc
            raise

    def _init(self, init_info: WeightbridgeInitInfo) -> None:
        """Every check first (the running bridge, if any, untouched by a refusal), then the join."""
        from weightbridge.integrations._engine import hooks
        from weightbridge.integrations._engine.joining import admit, open_bridge

        pc = self.parallel_config
        admitted = admit(self.gate, init_info.payload, init_info.seal, me=self.me, engine="vLLM", index=pc.rank,
                         mesh={"tp": pc.tensor_parallel_size, "pp": pc.pipeline_parallel_size},
                         world=pc.world_size, worker=f"vLLM worker {pc.rank}")
        probed = None
        if admitted.cmd.probe == "check":
            from weightbridge.integrations.vllm.probing import check_against_engine

            probed = check_against_engine(self, admitted.me, admitted.resolved, admitted.layout,
                                          cache_dir=admitted.cmd.cache_dir)
        if self.bridge is not None:  # re-initialised (a new spec or phase): leave the old bridge
            self.bridge.close()
            self.bridge = None
        self.me, self.probed, self.timeout_s = admitted.me, probed, admitted.timeout_s
        self.written, self.record = {}, hooks.enabled()
        self.fp8 = frozenset(t.name for t in admitted.layout.tensors if t.dtype == "float8_e4m3fn")
        self.names = tuple(t.name for t in admitted.layout.tensors)  # what every update writes
        self.bridge = open_bridge(admitted, device=self.device)  # streams: no receive buffers

    @property
    def buffers(self) -> dict[str, torch.Tensor]:
        """The rank's checkpoint-format shard as last written into the model (``joining.written_shard``)."""
        from weightbridge.integrations._engine.joining import written_shard

        return written_shard(self.written, self.bridge)

    def _write(self, name: str, tensor: torch.Tensor) -> None:
        """The bridge's sink: one complete local tensor into vLLM's reload (inside an update session)."""
        if self.session is None:
            raise RuntimeError(f"{self.me}: a weight arrived outside start_weight_update / finish_weight_update")
        if self.record:  # before the write: vLLM's parameter may adopt the tensor and post-process it
            self.written[name] = tensor.detach().to("cpu", copy=True)
        self.session.write({name: tensor})

    # -- one update ---------------------------------------------------------------------------
    def start_weight_update(self) -> None:
        self._require_init()
        self.session = ReloadSession(self.model, self.model_config, self.fp8, self.names,
                                     adopt=not self.bridge.staging)  # streamed tensors are handed over
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
            with torch.no_grad():  # in place the receive runs here, writing each tensor as it completes
                version = self.bridge.apply_instance(update_info.version, sink=self._write,
                                                     timeout_s=float(update_info.timeout_s or self.timeout_s))
        except BridgeError as exc:  # vLLM's RPC re-raises it untyped; the driver can fetch it typed
            self.last_error = exc
            raise
        t1 = time.perf_counter()
        if version is not None:
            self.stats.version = version
            self.stats.updates += 1
            self.stats.history.append(version)
        receive = self.bridge.last_receive
        self.stats.wait_s, self.stats.apply_s = t1 - t0, self.bridge.last_apply_s
        self.stats.write_s = receive.transfer_s if receive is not None and not receive.staged else self.stats.apply_s

    def finish_weight_update(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.finish()

    def shutdown(self) -> None:
        if self.bridge is not None:
            self.bridge.close()
            self.bridge = None
        self.written = {}

    def release(self) -> None:
        """Free what the bridge keeps between updates (before the engine sleeps); the staging copy stays."""
        if self.bridge is not None:
            self.bridge.release_buffers()

    def status(self) -> dict[str, Any]:
        return {
            "rank": self.me, "version": self.bridge.version if self.bridge is not None else self.stats.version,
            "updates": self.stats.updates,
            "history": list(self.stats.history), "wait_s": self.stats.wait_s, "apply_s": self.stats.apply_s,
            "write_s": self.stats.write_s, "pid": os.getpid(),
            "memory": self.bridge.memory() if self.bridge is not None else None,
        }

    def _require_init(self) -> None:
        if self.bridge is None:
            raise RuntimeError(
                f"{self.me}: the weightbridge engine is not initialised: call "
                "llm.init_weight_transfer_engine(...) first (VLLMWeightSync does)"
            )
