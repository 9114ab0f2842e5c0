"""toyrl: a tiny stand-in RL framework (its own trainer, its own inference engine) wired to weightbridge.

``model`` (the model's tensors), ``trainer`` (ToyTrainer), ``engine`` (ToyEngine) know nothing of
weightbridge; ``weightsync`` is the whole integration; ``conformance`` builds it for the suite.
"""
