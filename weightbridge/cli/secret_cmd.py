"""``weightbridge secret [--write FILE]``: print (or write) a fresh random job secret.

Every trainer and rollout process of one job needs the same secret (``docs/trust.md``)::

    export WEIGHTBRIDGE_SECRET=$(weightbridge secret)      # in the launcher; every rank inherits it
    weightbridge secret --write job.secret                 # or a file (mode 0600) named by sync.secret_file
"""

from __future__ import annotations

import argparse
import os

from weightbridge.cli.common import EXIT_OK, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("secret", help="print a fresh random job secret (for WEIGHTBRIDGE_SECRET or sync.secret_file)")
    p.add_argument("--write", metavar="FILE", help="write it to FILE (created with mode 0600; never overwritten)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from weightbridge.sync.auth import new_secret  # lazily: the CLI loads no runtime module to parse arguments

    secret = new_secret()
    if args.write is None:
        print(secret)
        return EXIT_OK
    try:
        fd = os.open(args.write, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UsageError(f"{args.write} exists; remove it first (a job secret is never overwritten)") from None
    except OSError as exc:
        raise UsageError(f"cannot create {args.write}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    print(f"wrote a fresh job secret to {args.write}; name it in the spec as sync.secret_file (relative to the spec)")
    return EXIT_OK
