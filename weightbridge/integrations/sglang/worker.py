"""The worker side: SGLang's custom weight loader, run in every TP worker (scheduler) process.

SGLang calls :func:`load` (``LOADER``) with the live model and the payload of an
``update_weights_from_tensor(load_format=LOADER)`` request, in the scheduler thread between
batches and inside a ``begin_weight_update`` / ``end_weight_update`` session (parameters restored
to checkpoint format before, SGLang's post-load processing after). Each payload entry's name is a
:class:`~weightbridge.integrations.sglang.commands.Command`:

``init``     check the sealed init command (:mod:`weightbridge.integrations._engine.init_command`),
             resolve the spec, check it against this engine (mesh; probe of SGLang's own
             ``load_weights``, :mod:`.probing`; pins), then leave the bridge of a previous init
             and join as rollout rank ``instance * tp_size + tp_rank`` over receive buffers in
             the checkpoint format (a refused init leaves the running bridge as it was)
``update``   ``RolloutBridge.apply_instance(version)`` on every TP rank (they agree through the
             control store) with the model as its sink: each local tensor is written with SGLang's
             ``direct`` loading (``default_weight_loader`` into its parameter) as soon as it is
             complete (in place: during the receive; with staging: from the staging copy), then
             ``post_load_weights`` runs
``release``  free what the bridge keeps between updates (the driver's ``sleep`` sends it first)
``poll`` / ``status`` / ``probed`` / ``buffers`` / ``check`` / ``close``: diagnostics and shutdown

Frames: the local tensors are this rank's checkpoint-format shard (``named_parameters()`` of
SGLang's model after ``load_weights`` and before post-processing: fused ``qkv_proj``,
``gate_up_proj``, ``mlp.experts.w13_weight``, vocab-padded shards), i.e. the ``sglang`` preset's
local tensors. In place the worker keeps no copy of them (``docs/memory.md``); with staging, one
(device or host memory: ``sync.staging_memory``); with test hooks enabled
(``WEIGHTBRIDGE_TEST_HOOKS=1``) a CPU copy of what it wrote (:attr:`Receiver.buffers`, for the
bitwise check). Nothing here raises into SGLang: an exception in a custom loader ends the
scheduler process, so every error becomes the reply's ``error`` (typed, as
:func:`weightbridge.errors.error_data`) and is kept as ``last_error``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from weightbridge.errors import BridgeError, EngineMismatch, error_data
from weightbridge.integrations._engine.init_command import InitGate
from weightbridge.integrations.sglang.commands import Command, CommandError, decode, reply_path, write_reply

log = logging.getLogger(__name__)

_RECEIVER: Receiver | None = None  # one per SGLang worker process
_GATE = InitGate()  # this worker's checks of init commands (replays refused across inits)


def parallel() -> dict[str, int]:
    """This worker's parallel coordinates from SGLang's runtime context."""
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()

    def size(name: str) -> int:
        try:
            return int(getattr(p, name) or 1)
        except (AttributeError, ValueError, TypeError):
            return 1

    return {"tp_rank": int(p.tp_rank), "tp": size("tp_size"), "pp": size("pp_size"), "ep": size("ep_size")}


def load(model: torch.nn.Module, named_tensors: list[tuple[str, Any]]) -> None:
    """SGLang's custom-weight-loader entry point (``load_format=LOADER``): run each command."""
    global _RECEIVER
    rank = parallel()["tp_rank"]
    for name, _ in named_tensors:
        try:
            cmd = decode(name)
        except CommandError as exc:  # nothing to answer to: log it, never raise into SGLang
            log.error("weightbridge: SGLang worker %d: %s", rank, exc)
            continue
        t0 = time.perf_counter()
        try:
            reply = _run(model, cmd, rank)
        except Exception as exc:  # noqa: BLE001 - reported to the driver, never raised into SGLang
            log.error("weightbridge: SGLang worker %d: %s failed: %s: %s", rank, cmd.op, type(exc).__name__, exc)
            if _RECEIVER is not None:
                _RECEIVER.last_error = exc
            reply = {"error": error_data(exc)}
        reply.setdefault("error", None)
        reply.update(op=cmd.op, seq=cmd.seq, tp_rank=rank, elapsed_s=time.perf_counter() - t0)
        if cmd.reply_dir:
            try:
                write_reply(cmd.reply_dir, cmd.seq, rank, reply)
            except OSError as exc:
                log.error("weightbridge: SGLang worker %d: cannot write reply to %s: %s", rank, cmd.reply_dir, exc)


def _run(model: torch.nn.Module, cmd: Command, rank: int) -> dict[str, Any]:
    global _RECEIVER
    if cmd.op == "init":
        # every check; raises (naming the running rank, if any) before the running bridge is touched
        joining = Receiver(model, cmd, me=None if _RECEIVER is None else _RECEIVER.me)
        if _RECEIVER is not None:  # re-initialised (a new spec or phase): leave the old bridge
            _RECEIVER.close()
            _RECEIVER = None
        joining.join()
        _RECEIVER = joining
        return _RECEIVER.status()
    if cmd.op == "close":
        receiver, _RECEIVER = _RECEIVER, None
        if receiver is not None:
            receiver.close()
        return {}
    if _RECEIVER is None:
        raise RuntimeError(f"SGLang worker {rank}: weightbridge is not initialised (SGLangWeightSync sends init)")
    return getattr(_RECEIVER, "op_" + cmd.op)(cmd)


class Receiver:
    """One rollout rank of the bridge inside one SGLang worker: built from an init command (every
    check), then :meth:`join` (the bridge)."""

    def __init__(self, model: torch.nn.Module, cmd: Command, me: str | None = None) -> None:
        """``me``: how errors name this worker until the init is admitted (the rank it runs)."""
        from weightbridge.integrations._engine.joining import admit

        self.model = model
        self.par = parallel()
        self.last_error: BaseException | None = None
        self.history: list[int] = []
        self.timings: dict[str, float] = {}
        self.bridge: Any = None
        tp_rank = self.par["tp_rank"]
        self.admitted = admit(_GATE, cmd.payload, cmd.seal, me=me or f"SGLang worker {tp_rank}", engine="SGLang",
                              index=tp_rank, mesh={k: self.par[k] for k in ("tp", "pp", "ep")},
                              world=self.par["tp"] * self.par["pp"], worker=f"SGLang TP rank {tp_rank}")
        self.me = self.admitted.me
        self.timeout_s = self.admitted.timeout_s
        self.device = next(model.parameters()).device
        self.probed: Any = None
        if self.admitted.cmd.probe == "check":
            from weightbridge.integrations.sglang.probing import check_against_engine

            self.probed = check_against_engine(model, self.par, self.me, self.admitted.resolved, self.admitted.layout,
                                               cache_dir=self.admitted.cmd.cache_dir)
        params = dict(model.named_parameters())
        missing = [t.name for t in self.admitted.layout.tensors
                   if t.name not in params or tuple(params[t.name].shape) != tuple(t.shape)]
        if missing:
            raise EngineMismatch(self.me, f"the spec's local tensors {missing[:5]} are not parameters of SGLang's "
                                          f"model with these shapes (probe='check' says why)")
        self.written: dict[str, torch.Tensor] = {}  # test hooks only: CPU copies of what was written
        self._params: dict[str, torch.Tensor] = {}  # the model's parameters during one update
        self._wrote = 0

    def join(self) -> None:
        """Open the bridge, streaming: no receive buffers (each update writes into the model)."""
        from weightbridge.integrations._engine import hooks
        from weightbridge.integrations._engine.joining import open_bridge

        self.record = hooks.enabled()
        self.bridge = open_bridge(self.admitted, device=self.device)

    @property
    def buffers(self) -> dict[str, torch.Tensor]:
        """The rank's checkpoint-format shard as last written into the model (``joining.written_shard``)."""
        from weightbridge.integrations._engine.joining import written_shard

        return written_shard(self.written, self.bridge)

    # -- ops ------------------------------------------------------------------------------------
    def op_update(self, cmd: Command) -> dict[str, Any]:
        from sglang.srt.model_loader.loader import post_load_weights

        t0 = time.perf_counter()
        self._params, self._wrote = dict(self.model.named_parameters()), 0
        try:
            with torch.no_grad():
                version = self.bridge.apply_instance(cmd.version, timeout_s=float(cmd.timeout_s or self.timeout_s),
                                                     sink=self._write)
        except BridgeError as exc:
            self.last_error = exc
            raise
        finally:
            if self._wrote:  # the model's post-load fixups (load_weights would run them), torn or not
                with torch.no_grad():
                    post_load_weights(self.model)
            self._params = {}
        t1 = time.perf_counter()
        if version is not None and (not self.history or self.history[-1] != version):
            self.history.append(version)
        receive = self.bridge.last_receive
        self.timings = {"wait_s": t1 - t0, "apply_s": self.bridge.last_apply_s,
                        "write_s": receive.transfer_s if receive is not None and not receive.staged
                        else self.bridge.last_apply_s}
        return {"version": version, **self.timings}

    def _write(self, name: str, tensor: torch.Tensor) -> None:
        """The bridge's sink: SGLang's ``direct`` load of one complete local tensor."""
        from sglang.srt.model_loader.weight_utils import default_weight_loader

        default_weight_loader(self._params[name], tensor)
        self._wrote += 1
        if self.record:
            self.written[name] = tensor.detach().to("cpu", copy=True)

    def op_release(self, cmd: Command) -> dict[str, Any]:
        self.bridge.release_buffers()
        return {}

    def op_poll(self, cmd: Command) -> dict[str, Any]:
        from weightbridge.integrations._engine.joining import poll_report

        return poll_report(self.bridge)

    def op_status(self, cmd: Command) -> dict[str, Any]:
        return self.status()

    def status(self) -> dict[str, Any]:
        last, self.last_error = self.last_error, None
        return {"rank": self.me, "version": self.bridge.version if self.bridge is not None else None,
                "history": list(self.history), "timings": dict(self.timings),
                "last_error": None if last is None else error_data(last), "pid": os.getpid(),
                "memory": self.bridge.memory() if self.bridge is not None else None}

    def op_probed(self, cmd: Command) -> dict[str, Any]:
        return {"layout": None if self.probed is None else self.probed.to_json()}

    def op_buffers(self, cmd: Command) -> dict[str, Any]:
        """The receive buffers as a safetensors file next to the reply (bit-exact)."""
        from safetensors.torch import save_file

        if not cmd.reply_dir:
            raise ValueError("buffers needs a reply_dir")
        path = reply_path(cmd.reply_dir, cmd.seq, self.par["tp_rank"], "safetensors")
        save_file({n: t.detach().cpu().contiguous() for n, t in self.buffers.items()}, str(path))
        return {"path": str(path)}

    def op_check(self, cmd: Command) -> dict[str, Any]:
        from weightbridge.integrations.sglang.verify import check_worker

        if not cmd.checkpoint:
            raise ValueError("check needs a checkpoint directory")
        return {"problems": check_worker(self, cmd.checkpoint)}

    def close(self) -> None:
        bridge, self.bridge = self.bridge, None
        if bridge is not None:
            bridge.close()
