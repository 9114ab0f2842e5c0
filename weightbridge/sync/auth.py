"""The job secret: where it comes from, and the MACs that authenticate control values and data senders.

Every process of one bridge (all trainer ranks, all rollout ranks, a driver reading an instance's
versions) holds the same **job secret**. It is found, first match wins (:func:`signer_for`):

1. ``BridgeOptions(secret=...)`` passed to ``from_spec`` (per process; never printed);
2. the environment variable ``WEIGHTBRIDGE_SECRET``;
3. the file named by the spec's ``sync.secret_file`` (relative to the spec file's directory; the
   secret itself is never in the spec, whose text and hash every rank shares and logs).

With ``sync.auth: required`` (the default) and no secret, ``from_spec`` raises :class:`AuthError`
saying how to provide one (``weightbridge secret`` prints a fresh one). ``sync.auth: off`` turns
authentication off (values are stored bare), for a store nobody else can reach.

What the secret protects (the trust model is ``docs/trust.md``):

* **Control values** (:mod:`.control`): every value written is ``MAC || stamp || body`` with
  ``MAC = HMAC-SHA256(secret, "wb-ctl" || key || stamp || body)[:16]`` over the full store key, so a
  value is only accepted under the key it was written for; a value that does not verify raises
  :class:`ForgedMessage` naming the key and is never decoded. ``stamp`` (8 bytes) is when it was
  sealed (wall clock in ns, strictly increasing within a process): the bounded store keyed by the
  secret keeps a key's value unless the new one is sealed and stamped later (a replayed old value,
  or one without the MAC, never replaces a job value: :mod:`weightbridge.transport.store_server`).
* **Data senders** (:func:`data_token`): before the first byte of an epoch, the two ends of every
  pair of ranks that exchange data prove over the bridge group that they hold the secret and are
  the ranks whose (signed) hellos carry the epoch's nonces (:mod:`weightbridge.transport.peerauth`).

Pure Python (``hmac``, ``hashlib``, ``secrets``): no torch.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets as _secrets
import threading
import time
from pathlib import Path
from typing import Any

from weightbridge.errors import AuthError, ForgedMessage

ENV = "WEIGHTBRIDGE_SECRET"
MAC_BYTES = 16
STAMP_BYTES = 8
HEADER_BYTES = MAC_BYTES + STAMP_BYTES  # what a sealed value carries before its body
MIN_SECRET_CHARS = 16
_CTL = b"wb-ctl\x00"
_DATA = b"wb-data\x00"

__all__ = ["ENV", "HEADER_BYTES", "MAC_BYTES", "Signer", "data_token", "new_secret", "secret_for", "signer_for",
           "signer_from_env"]

_stamp_lock = threading.Lock()
_last_stamp = 0


def stamp_now() -> int:
    """When a value is sealed: the wall clock in ns, strictly increasing within this process (a clock
    stepped back never makes this process's later values look older than its earlier ones)."""
    global _last_stamp
    with _stamp_lock:
        _last_stamp = max(time.time_ns(), _last_stamp + 1)
        return _last_stamp


def new_secret() -> str:
    """A fresh random job secret (256 bits, URL-safe text): what ``weightbridge secret`` prints."""
    return _secrets.token_urlsafe(32)


class Signer:
    """Seals and opens control values with the job secret (``key`` None: ``auth: off``, values bare)."""

    __slots__ = ("_key", "source")

    def __init__(self, secret: bytes | None, source: str = "") -> None:
        self._key = None if secret is None else hashlib.sha256(b"weightbridge job secret\x00" + secret).digest()
        self.source = source  # where the secret came from (for messages; never the secret)

    def __repr__(self) -> str:
        return f"Signer({'off' if self._key is None else 'on, from ' + self.source})"

    def __reduce__(self) -> Any:
        raise TypeError("a Signer holds the job secret and is not pickled; pass the secret through the environment")

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def mac(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 of the length-prefixed ``parts``, truncated to :data:`MAC_BYTES`."""
        assert self._key is not None
        h = hmac.new(self._key, digestmod=hashlib.sha256)
        for p in parts:
            h.update(len(p).to_bytes(8, "big"))
            h.update(p)
        return h.digest()[:MAC_BYTES]

    def seal(self, key: str, body: bytes) -> bytes:
        """The value to store under ``key``: ``MAC || stamp || body`` (``body`` itself with auth off)."""
        if self._key is None:
            return body
        stamp = stamp_now().to_bytes(STAMP_BYTES, "big")
        return self.mac(_CTL, key.encode(), stamp, body) + stamp + body

    def open(self, key: str, value: bytes | str, reader: Any = "?") -> bytes:
        """The body of ``value`` read under ``key``; :class:`ForgedMessage` (on ``reader``) unless it verifies."""
        return self.open_stamped(key, value, reader)[1]

    def open_stamped(self, key: str, value: bytes | str, reader: Any = "?") -> tuple[int, bytes]:
        """``(stamp, body)`` of ``value`` read under ``key`` (stamp 0 with auth off); :class:`ForgedMessage`
        unless it verifies."""
        if isinstance(value, str):
            value = value.encode()
        if self._key is None:
            return 0, value
        if len(value) < HEADER_BYTES:
            raise ForgedMessage(reader, key, f"{len(value)} bytes, shorter than a MAC and its stamp")
        tag, stamp, body = value[:MAC_BYTES], value[MAC_BYTES:HEADER_BYTES], value[HEADER_BYTES:]
        if not hmac.compare_digest(tag, self.mac(_CTL, key.encode(), stamp, body)):
            raise ForgedMessage(reader, key, "MAC mismatch (written without the job secret, or under another key)")
        return int.from_bytes(stamp, "big"), body


def data_token(signer: Signer, epoch: int, src: str, src_nonce: str, dst: str, dst_nonce: str) -> bytes:
    """What rank ``src`` sends rank ``dst`` over the bridge group of ``epoch`` to prove it holds the secret.

    Bound to the epoch, both ranks (spec names) and both ranks' hello nonces of that epoch (fresh per
    process and epoch, published signed), so a token is good for one direction of one pair in one
    epoch only. ``auth: off``: a constant (the exchange still checks that the ends agree on who is who).
    """
    parts = (_DATA, str(epoch).encode(), src.encode(), src_nonce.encode(), dst.encode(), dst_nonce.encode())
    if not signer.enabled:
        return hashlib.sha256(b"\x00".join(parts)).digest()[:MAC_BYTES]
    return signer.mac(*parts)


HOW_TO = (
    "provide the job secret (the same on every trainer and rollout process): set the environment variable "
    f"{ENV} (e.g. `export {ENV}=$(weightbridge secret)` in the launcher, inherited by every rank), or pass "
    "BridgeOptions(secret=...) to from_spec, or name a file holding it in the spec's sync.secret_file "
    "(relative to the spec file); or set sync.auth: off if nobody else can reach the control store "
    "(see `weightbridge docs trust`)"
)


def signer_from_env() -> Signer:
    """The :class:`Signer` of ``$WEIGHTBRIDGE_SECRET`` (a control plane built without one); else :class:`AuthError`."""
    value = os.environ.get(ENV)
    if not value:
        raise AuthError(f"no job secret for this control-plane client; {HOW_TO}")
    return _checked(value.encode(), f"${ENV}")


def _checked(raw: bytes, source: str) -> Signer:
    raw = raw.strip()
    if len(raw) < MIN_SECRET_CHARS:
        raise AuthError(f"the job secret from {source} has {len(raw)} characters; use at least "
                        f"{MIN_SECRET_CHARS} (`weightbridge secret` prints a fresh random one)")
    return Signer(raw, source)


def secret_for(resolved: Any, secret: str | bytes | None = None) -> tuple[bytes | None, str]:
    """The job secret of a bridge process of spec ``resolved`` (a ``ResolvedSpec``) and where it came from;
    ``(None, "auth: off")`` when the spec turns authentication off.

    ``secret``: ``BridgeOptions.secret``. Raises :class:`AuthError` (naming how to provide one) when the
    spec requires authentication and no secret is found, or the secret is shorter than 16 characters.
    """
    sync = resolved.sync
    if getattr(sync, "auth", "required") == "off":
        return None, "auth: off"
    source = ""
    if secret is not None:
        source = "BridgeOptions(secret=...)"
    elif os.environ.get(ENV):
        secret, source = os.environ[ENV], f"${ENV}"
    elif getattr(sync, "secret_file", None):
        path = Path(sync.secret_file).expanduser()
        if not path.is_absolute():
            spec_path = Path(getattr(resolved, "path", "") or "")
            base = spec_path.parent if spec_path.name and spec_path.is_file() else Path.cwd()
            path = base / path
        try:
            secret = path.read_bytes().strip()
        except OSError as exc:
            raise AuthError(f"sync.secret_file {str(path)!r} cannot be read ({exc.strerror or exc}); {HOW_TO}") from exc
        source = f"sync.secret_file {path}"
    if secret is None:
        raise AuthError(f"no job secret: the spec's sync.auth is required; {HOW_TO}")
    raw = (secret.encode() if isinstance(secret, str) else bytes(secret)).strip()
    _checked(raw, source)
    return raw, source


def signer_for(resolved: Any, secret: str | bytes | None = None) -> Signer:
    """The :class:`Signer` of a bridge process of spec ``resolved`` (:func:`secret_for` finds the secret)."""
    raw, source = secret_for(resolved, secret)
    return Signer(raw, source)
