"""Run as a script by test_mcp_generate_live_fsdp2.py: a real vLLM engine (CPU, TP 1, dummy weights from
the config) joins a spec's rollout side with ``probe="check"``, which probes vLLM's own loader at init
and refuses a spec whose rollout layout differs; writes the probed layout of rank 0 to OUT.

    python _vllm_probed.py SPEC MODEL_DIR OUT
"""

from __future__ import annotations

import json
import sys

if __name__ == "__main__":  # vLLM may spawn: only the main module runs this
    spec, model, out = sys.argv[1:4]
    from weightbridge.integrations.vllm.cpu_engine import make_llm
    from weightbridge.integrations.vllm.driver import VLLMWeightSync
    from weightbridge.transport.store import open_store

    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=60)
    llm = make_llm(model, 1, in_process=True, load_format="dummy")
    VLLMWeightSync(llm, spec, host="127.0.0.1", port=master.port, probe="check")  # raises on a mismatch
    with open(out, "w") as f:
        json.dump(llm.collective_rpc("weightbridge_probed_layout")[0], f)
