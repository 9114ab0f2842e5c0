"""SGLang as a weightbridge rollout engine: a receiver inside SGLang's TP worker processes.

Install: ``pip install 'weightbridge-rl[sglang]'`` (GPU machines). On a CPU-only machine SGLang
installs only with ``--no-deps`` plus shims (``.ci/sglang_venv.sh`` builds that environment).

The hook is SGLang's *custom weight loader*: the engine is started with
``custom_weight_loader=[LOADER]`` (``--custom-weight-loader`` for ``python -m sglang.launch_server``),
and every weightbridge command reaches every TP worker as an ``update_weights_from_tensor`` call
with ``load_format=LOADER``, between ``begin_weight_update`` and ``end_weight_update``. SGLang runs
it in each worker's scheduler thread between batches, with the model; weightbridge's function
(:func:`weightbridge.integrations.sglang.worker.load`) receives the rank's checkpoint-format shard
through a :class:`~weightbridge.bridge.RolloutBridge` and writes it with SGLang's own ``direct``
loading (``default_weight_loader`` per parameter, then the model's ``post_load_weights``); SGLang's
``end_weight_update`` then runs its post-load processing. ``integration_guides/sglang.md`` says why
this hook and not another. A user writes::

    import sglang
    from weightbridge.integrations.sglang import LOADER, SGLangWeightSync

    engine = sglang.Engine(model_path=model_dir, tp_size=2, custom_weight_loader=[LOADER])
    sync = SGLangWeightSync(engine, "weightbridge.yaml", host=trainer0_host, port=port, instance=0)
    sync.update(version)                 # between generate() calls; SGLang's weight_version = str(version)

    # or an HTTP server started with --custom-weight-loader weightbridge.integrations.sglang.worker.load
    sync = SGLangWeightSync("http://127.0.0.1:30000", "weightbridge.yaml", host=..., port=...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from weightbridge.integrations.sglang.commands import LOADER  # defined beside the wire format (no cycle)

INSTALL_HINT = (
    "SGLang is not installed: pip install 'weightbridge-rl[sglang]' (GPU machines); on a CPU-only machine "
    "build the test environment with .ci/sglang_venv.sh (SGLang --no-deps, torch CPU, shims)"
)

if TYPE_CHECKING:
    from weightbridge.integrations.sglang.driver import SGLangWeightSync

__all__ = ["INSTALL_HINT", "LOADER", "SGLangWeightSync", "engine_kwargs"]


def engine_kwargs() -> dict[str, Any]:
    """What ``sglang.Engine(...)`` / ``ServerArgs`` need for weightbridge: the custom weight loader."""
    return {"custom_weight_loader": [LOADER]}


def __getattr__(name: str) -> Any:
    if name == "SGLangWeightSync":
        from weightbridge.integrations.sglang.driver import SGLangWeightSync

        return SGLangWeightSync
    raise AttributeError(name)
