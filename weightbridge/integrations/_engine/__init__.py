"""What weightbridge's rollout-engine integrations (vLLM, SGLang) share: one implementation each.

* :mod:`.init_command`: the init command a driver sends every worker of an engine (the spec, the
  store, the instance, ...), sealed with the job secret; the worker's checks before anything of it
  runs (:class:`~.init_command.InitGate`).
* :mod:`.hooks`: test hooks (the conformance suite's fault injection) that reach engine workers
  by name from a fixed registry, with plain JSON parameters, never as code.
* :mod:`.joining`: the worker's join: the spec resolved, this worker's rank of the spec checked
  against the engine's mesh, the bridge opened over the receive buffers; its poll report.
* :mod:`.driver`: the driver's engine-independent state (the checked spec, the instance's view).
* :mod:`.probing`: the cached probe of the engine's own ``load_weights`` and its comparison with
  the spec's layout (and pins).
* :mod:`.verify`: the bitwise comparison of a worker against the engine's own load of a checkpoint.
* :mod:`.conformance`: the conformance suite's rollout unit, around an engine-specific part.

Private to :mod:`weightbridge.integrations`: users import ``weightbridge.integrations.vllm`` or
``weightbridge.integrations.sglang``; the errors live in :mod:`weightbridge.errors`
(``EngineMismatch``, ``InitRefused``).
"""
