"""Root test configuration: a job secret for every bridge the tests build (``sync.auth: required``).

Set at import (before any test starts processes), so every spawned rank inherits it; a secret
already in the environment is kept. Tests of the missing-secret path unset it themselves
(``monkeypatch.delenv``).
"""

import os
import secrets

os.environ.setdefault("WEIGHTBRIDGE_SECRET", "tests-" + secrets.token_hex(16))
