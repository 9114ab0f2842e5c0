"""The worker side: SGLang's custom weight loader, run in every TP worker (scheduler) process.

SGLang calls :func:`load` (``LOADER``) with the live model and the payload of an
``update_weights_from_tensor(load_format=LOADER)`` request, in the scheduler thread between
batches and inside a ``begin_weight_update`` / ``end_weight_update`` session (parameters restored
to checkpoint format before, SGLang's post-load processing after). Each payload entry's name is a
:class:`~weightbridge.integrations.sglang.commands.Command`:

``init``     resolve the spec, check it against this engine (mesh; probe of SGLang's own
             ``load_weights``, :mod:`.probing`; pins), join the bridge as rollout rank
             ``instance * tp_size + tp_rank`` over receive buffers in the checkpoint format
``update``   ``RolloutBridge.apply_instance(version)`` on every TP rank (they agree through the
             control store), then write the buffers into the model with SGLang's ``direct``
             loading (``default_weight_loader`` per parameter) and run ``post_load_weights``
``poll`` / ``status`` / ``probed`` / ``buffers`` / ``check`` / ``close``: diagnostics and shutdown

Frames: the receive buffers hold this rank's checkpoint-format shard (``named_parameters()`` of
SGLang's model after ``load_weights`` and before post-processing: fused ``qkv_proj``,
``gate_up_proj``, ``mlp.experts.w13_weight``, vocab-padded shards), i.e. the ``sglang`` preset's
local tensors. Nothing here raises into SGLang: an exception in a custom loader ends the
scheduler process, so every error becomes the reply's ``error`` (typed, as
:func:`weightbridge.errors.error_data`) and is kept as ``last_error``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from weightbridge.errors import BridgeError, error_data
from weightbridge.integrations.sglang.commands import Command, CommandError, decode, reply_path, write_reply

log = logging.getLogger(__name__)

_RECEIVER: Receiver | None = None  # one per SGLang worker process
TEST_HOOKS_ENV = "WEIGHTBRIDGE_SGLANG_TEST_HOOKS"  # "1": accept the pickled on_round test hook


class EngineMismatch(BridgeError):
    """The spec does not describe this SGLang engine (mesh, layout or pinned fingerprint); names the rank."""

    def __init__(self, rank: str, message: str) -> None:
        self.rank = rank
        self.message = message
        super().__init__(f"{rank}: {message}")


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
        if _RECEIVER is not None:  # re-initialised (a new spec or phase): leave the old bridge first
            _RECEIVER.close()
            _RECEIVER = None
        _RECEIVER = Receiver(model, cmd)
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
    """One rollout rank of the bridge inside one SGLang worker."""

    def __init__(self, model: torch.nn.Module, cmd: Command) -> None:
        from weightbridge.bridge import BridgeOptions, RolloutBridge
        from weightbridge.spec.errors import SpecErrors
        from weightbridge.spec.resolve import check_text
        from weightbridge.tensors import empty_like_layout

        self.model = model
        self.par = parallel()
        self.me = f"SGLang worker {self.par['tp_rank']}"
        self.last_error: BaseException | None = None
        self.history: list[int] = []
        self.timings: dict[str, float] = {}
        on_round = None
        if cmd.on_round:  # test hook (the conformance suite's fault injection); see SGLangWeightSync
            import base64
            import os
            import pickle

            # Unpickling runs code, and commands arrive through SGLang's admin API (HTTP too): only
            # an engine started with the hook switched on in its environment accepts one.
            if os.environ.get(TEST_HOOKS_ENV) != "1":
                raise PermissionError(f"{self.me}: init carries an on_round test hook; refused unless the engine's "
                                      f"environment has {TEST_HOOKS_ENV}=1 (tests only: it unpickles)")
            on_round = pickle.loads(base64.b64decode(cmd.on_round))
        if not cmd.spec or cmd.host is None or cmd.port is None:
            raise ValueError("init needs spec, host and port")
        resolved, problems = check_text(cmd.spec, cmd.spec_name, Path(cmd.base_dir) if cmd.base_dir else None)
        if problems or resolved is None:
            raise SpecErrors(problems)
        layout = self._my_layout(resolved, cmd.instance)
        self.me = f"rollout {layout.rank} (instance {cmd.instance}, SGLang TP rank {self.par['tp_rank']})"
        self.device = next(model.parameters()).device
        self.probed: Any = None
        if cmd.probe == "check":
            from weightbridge.integrations.sglang.probing import check_against_engine

            self.probed = check_against_engine(self, resolved, layout, cache_dir=cmd.cache_dir)
        self.timeout_s = float(cmd.timeout_s or resolved.sync.timeout_s)
        params = dict(model.named_parameters())
        self.buffers = empty_like_layout(layout, device=self.device)
        missing = [n for n, t in self.buffers.items() if n not in params or params[n].shape != t.shape]
        if missing:
            raise EngineMismatch(self.me, f"the spec's local tensors {missing[:5]} are not parameters of SGLang's "
                                          f"model with these shapes (probe='check' says why)")
        with torch.no_grad():  # start from what the engine serves: an apply before any push changes nothing
            for name, buf in self.buffers.items():
                buf.copy_(params[name])
        self.bridge = RolloutBridge.from_spec(
            resolved, rank=layout.rank, tensors=self.buffers, host=cmd.host, port=cmd.port, staging=cmd.staging,
            options=BridgeOptions(prefix=cmd.prefix, on_round=on_round),
        )
        log.info("weightbridge: %s joined (%d local tensors, staging=%s)", self.me, len(self.buffers),
                 self.bridge.staging)

    def _my_layout(self, resolved: Any, instance: int) -> Any:
        rollout = resolved.rollout
        if not 0 <= instance < rollout.num_instances:
            raise EngineMismatch(self.me, f"instance {instance} out of range: the spec has {rollout.num_instances}")
        ranks = sorted(rollout.instance_ranks(instance), key=lambda r: r.local_rank)
        mesh = resolved.spec.rollout.mesh
        have = {"tp": int(mesh.get("tp", 1)), "pp": int(mesh.get("pp", 1)), "ep": int(mesh.get("ep", 1))}
        want = {k: self.par[k] for k in have}
        if len(ranks) != self.par["tp"] * self.par["pp"] or want != have:
            raise EngineMismatch(
                self.me, f"the spec's rollout mesh {have} ({len(ranks)} ranks per instance) does not match this "
                f"SGLang engine (tp_size={want['tp']}, pp_size={want['pp']}, ep_size={want['ep']})",
            )
        return ranks[self.par["tp_rank"]]

    # -- ops ------------------------------------------------------------------------------------
    def op_update(self, cmd: Command) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            version = self.bridge.apply_instance(cmd.version, timeout_s=float(cmd.timeout_s or self.timeout_s))
        except BridgeError as exc:
            self.last_error = exc
            raise
        t1 = time.perf_counter()
        if version is not None and (not self.history or self.history[-1] != version):
            self.write_model()
            self.history.append(version)
        t2 = time.perf_counter()
        self.timings = {"wait_s": t1 - t0, "apply_s": self.bridge.last_apply_s, "write_s": t2 - t1}
        return {"version": version, **self.timings}

    def write_model(self) -> None:
        """SGLang's ``direct`` load of the rank's local tensors, then the model's post-load fixups
        (``load_weights`` would run them; SGLang's ``end_weight_update`` then post-processes)."""
        from sglang.srt.model_loader.loader import post_load_weights
        from sglang.srt.model_loader.weight_utils import default_weight_loader

        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in self.buffers.items():
                default_weight_loader(params[name], tensor)
            post_load_weights(self.model)

    def op_poll(self, cmd: Command) -> dict[str, Any]:
        out: dict[str, Any] = {"staged": None, "version": self.bridge.version}
        try:
            self.bridge.poll()
        except BridgeError as exc:
            out["error"] = error_data(exc)
        out["staged"] = self.bridge.staged_version
        return out

    def op_status(self, cmd: Command) -> dict[str, Any]:
        return self.status()

    def status(self) -> dict[str, Any]:
        last, self.last_error = self.last_error, None
        return {"rank": self.me, "version": self.bridge.version if hasattr(self, "bridge") else None,
                "history": list(self.history), "timings": dict(self.timings),
                "last_error": None if last is None else error_data(last)}

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
        bridge = getattr(self, "bridge", None)
        if bridge is not None:
            bridge.close()
            self.bridge = None
