"""toyrl passes the weightbridge conformance suite: `python -m pytest examples/toy_integration`."""

from weightbridge.testing import ConformanceSuite


class TestToyRLConformance(ConformanceSuite):
    timeout_s = 3.0  # sync.timeout_s of the suite's runs: every fault must surface within it
    startup_s = 10.0  # ToyTrainer and ToyEngine start in milliseconds
