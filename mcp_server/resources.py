"""Resources (the spec's JSON Schema, the example specs, the guides, the bundled models) and the
``integrate_framework`` prompt.

Files are read when a client reads the resource, so edits show without a restart; the set of
files is taken when the server starts. Example specs and guides are the files that ship with
weightbridge (:mod:`weightbridge.shipped`): the source checkout's, or the installed wheel's copy,
so both list the same resources under the same names.
"""

from __future__ import annotations

import json

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resources import FileResource, FunctionResource

from weightbridge import shipped
from weightbridge.canonical import bundled_names
from weightbridge.spec.schema import SCHEMA_FILENAME, schema_text

SCHEMA_URI = "weightbridge://spec/schema/" + SCHEMA_FILENAME
MODELS_URI = "weightbridge://models/bundled"


def _files(server: MCPServer, pattern: str, mime: str, what: str) -> None:
    """One resource per shipped file, named by its path in the repository: weightbridge://spec/examples/x.yaml."""
    root = shipped.root()
    for path in sorted(root.glob(pattern)):
        rel = path.relative_to(root).as_posix()
        server.add_resource(FileResource(uri=f"weightbridge://{rel}", name=rel, path=path, mime_type=mime, encoding="utf-8",
                                         description=f"{what}: {rel}"))


def register(server: MCPServer) -> None:
    server.add_resource(FunctionResource.from_function(
        schema_text, uri=SCHEMA_URI, name="spec schema", mime_type="application/schema+json",
        description="JSON Schema of weightbridge spec v1 (what validate_spec checks first; editors use it too).",
    ))
    server.add_resource(FunctionResource.from_function(
        lambda: json.dumps(bundled_names()), uri=MODELS_URI, name="bundled models", mime_type="application/json",
        description="Names usable as model: {bundled: NAME} and as inspect_model's model.",
    ))
    _files(server, "spec/examples/*.yaml", "application/yaml", "Example spec, validated and planned in the tests")
    _files(server, "spec/README.md", "text/markdown", "The spec format and rule vocabulary")
    _files(server, "integration_guides/*.md", "text/markdown", "Integration guide")

    @server.prompt(title="Integrate weightbridge into a framework")
    def integrate_framework(trainer: str, rollout: str) -> str:
        """The step checklist for wiring weightbridge between a trainer and a rollout engine, using this server's tools."""
        return INTEGRATE.format(trainer=trainer, rollout=rollout, schema=SCHEMA_URI)


INTEGRATE = """\
Integrate weightbridge between the trainer `{trainer}` and the rollout engine `{rollout}`.
Work through these steps in order; each names the weightbridge MCP tool to use.

1. Model: `inspect_model` on the model (bundled name, config.json or safetensors) to see its
   canonical tensors. Its `model` field is the spec's `model:` mapping.
2. Spec: `generate_spec` with the trainer framework (megatron, fsdp2, hf) and mesh, the rollout
   engine (vllm, sglang, hf), its mesh and instance count, and the update mode. Read `assumed`.
   The schema is the resource {schema}; example specs are the weightbridge://spec/examples/ resources.
3. Check: `validate_spec` until `valid` is true. Every problem has a JSON path and a line.
4. Layouts: `explain_tensor` on a few ranks of each side (fused qkv / gate_up, experts, the
   padded vocabulary) and compare with the tensors your code actually holds.
5. Ground truth: `probe_layout` with a factory that builds one rank of your engine
   (MODULE:CALLABLE, called as CALLABLE(resolved_spec, side, rank)). `matches_spec` must be
   true; otherwise add `rules:` to the spec for the tensors listed in `differences` and go
   back to step 3.
6. Plan: `plan_transfer`; check `valid`, `sender_balance` against `sender_balance_bound` and
   `top_imbalances`, and `predicted_seconds` against `baseline_seconds`.
7. Wire it: on every trainer rank `TrainerBridge.from_spec(...).push(version)`; on every rollout
   rank `RolloutBridge.from_spec(...)`, then `poll()` and `apply()` between engine steps.
8. Conformance: write a test module for your integration with the weightbridge pytest plugin
   (weightbridge.testing) and run it with `run_conformance`; fix failures by requirement id
   until it passes.
"""
