"""Process bodies for ``test_colocated_mp.py``: a trainer that damages its slab, and a stranger without the
job secret that attacks a colocated job through ``/dev/shm`` and the control store. Trainers and rollout
ranks otherwise are ``sync_mp_workers``'."""

from __future__ import annotations

import json
import os
import time

import torch

import sync_mp_workers as W


def damaging_trainer(spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    """``sync_mp_workers.trainer`` whose slab bytes of version ``opts['damage']`` change after their digest was
    taken (what a process that opened the segment could do): flipped in the first bucket it packs. The
    sender's digest function is wrapped in this process only; weightbridge has no hook for it."""
    from weightbridge.transport import local_channel

    pushing = {"v": None, "done": set()}
    real_push = W.TrainerBridge.push
    real_checksum = local_channel.checksum

    def push(self, version, tensors=None):
        pushing["v"] = version
        return real_push(self, version, tensors)

    def checksum_then_damage(view: torch.Tensor):
        digest = real_checksum(view)
        if pushing["v"] == opts["damage"] and pushing["v"] not in pushing["done"] and view.numel():
            pushing["done"].add(pushing["v"])
            view[view.numel() // 2] ^= 0x5A
        return digest

    W.TrainerBridge.push = push  # this process only
    local_channel.checksum = checksum_then_damage
    return W.trainer(spec, rank, port, opts)


def _epoch(store) -> int:
    """The job's newest epoch, read off its sealed value (sealing authenticates, it does not hide)."""
    if not store.check(["wb/epoch"]):
        return 0
    digits = "".join(ch for ch in store.get("wb/epoch")[24:].decode(errors="replace") if ch.isdigit())
    return int(digits or 0)


def stranger(port: int, opts: dict) -> list[tuple]:
    """No job secret. Until the test's ``test/stranger-stop`` key: publishes unsealed records under every
    colocated key of the current epoch (slab offers pointing at a segment of its own, round records with its
    own digests, acks of every round), and opens every weightbridge segment it sees in ``/dev/shm`` to write
    into it (until ``opts['until']`` exists). ``opts['uid']``: first become that user (another user than the job's)."""
    from weightbridge.sync import local_records as lr
    from weightbridge.transport.segment import NAME_RE, SHM_DIR, Segment

    os.environ.pop("WEIGHTBRIDGE_SECRET", None)
    if opts.get("uid") is not None:
        os.setgid(opts["uid"])
        os.setuid(opts["uid"])
    store = W._store(port, 30.0)
    world = opts["world"]
    events: list[tuple] = []
    own = Segment.create("f" * 12, 1 << 16) if opts.get("uid") is None else None  # its bytes, for the offers
    if own is not None:
        own.tensor.fill_(0x5A)
    seen: set[str] = set()
    opened: dict[str, object] = {}
    deadline = time.monotonic() + opts.get("run_s", 60)
    while time.monotonic() < deadline and not store.check(["test/stranger-stop"]):
        prefix = f"wb/e{_epoch(store)}/pg"
        for b in range(world):
            if own is not None:
                offer = lr.SlabOffer(sender=b, size=own.size, region=own.size // 2, readers=tuple(range(world)),
                                     name=own.name)
                store.set(lr.slab_key(prefix, b), offer.model_dump_json())
            for k in (0, 1):
                rec = lr.RoundRecord(sender=b, version=99, round=0, seq=0, region=k,
                                     buckets=tuple(lr.BucketAt(receiver=r, offset=0, nbytes=64, digest=0)
                                                   for r in range(world)))
                store.set(lr.round_key(prefix, b, k), rec.model_dump_json())
            store.set(lr.ack_key(prefix, b), json.dumps({"kind": "shm-ack", "reader": b, "seq": 10**9,
                                                         "version": 99}))
        for name in os.listdir(SHM_DIR):
            if NAME_RE.match(name) and name not in seen and (own is None or name != own.name):
                seen.add(name)
                try:
                    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
                except OSError as exc:
                    events.append(("refused", name, exc.strerror))
                    continue
                opened[name] = fd
                events.append(("opened", name))
        attacking = not opts.get("until") or not store.check([opts["until"]])
        for fd in opened.values() if attacking else ():  # write into whatever it could open
            try:
                os.pwrite(fd, b"\x5a" * 4096, 0)
            except OSError:
                pass
        time.sleep(0.001)
    events.append(("seen", sorted(seen)))
    if own is not None:
        own.close()
    return events


def main(role: str, spec: str, rank: int, port: int, opts: dict) -> list[tuple]:
    if opts.get("after"):  # start once these keys exist (a restarted process, after the survivors reported)
        store = W._store(port, 30.0)
        while not store.check(list(opts["after"])):
            time.sleep(0.01)
    if role == "stranger":
        return stranger(port, opts)
    if role == "damaging-trainer":
        return damaging_trainer(spec, rank, port, opts)
    return W.main(role, spec, rank, port, opts)
