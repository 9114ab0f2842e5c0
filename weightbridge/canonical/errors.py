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
        self.key = key
        self.message = message
        self.hint = hint
        text = f"model.{key}: {message}" if key != "model" else f"model: {message}"
        super().__init__(f"{text} ({hint})" if hint else text)
