"""The one user-facing error of the canonical module."""

from __future__ import annotations


class CanonicalSourceError(ValueError):
    """A model source (bundled name, config, safetensors, inline tensors) cannot be used.

    ``key`` names the ``model:`` key at fault (``bundled``, ``config``,
    ``safetensors``, ``tensors``, ``dtype``, ``params`` or ``model`` for the
    mapping itself); ``str(err)`` starts with it, e.g.
    ``model.config: no such file: /x/config.json``.
    """

    def __init__(self, key: str, message: str, hint: str = "") -> None:
        from weightbridge.spec.errors import excerpt  # every echoed user value stays short

        self.key = key
        self.message = excerpt(message, 1000)
        self.hint = excerpt(hint, 500)
        text = f"model.{key}: {self.message}" if key != "model" else f"model: {self.message}"
        super().__init__(f"{text} ({self.hint})" if hint else text)
