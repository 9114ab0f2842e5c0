"""weightbridge's own test harnesses (private: no stability promise; product code never imports them).

The vLLM, SGLang and Megatron-Core self-checks, the soak and hostile-client harnesses, the optional-
dependency gate of the test modules, an external store process, synthetic layouts. The public
conformance suite is :mod:`weightbridge.testing`.
"""
