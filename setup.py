"""Copies the files weightbridge points users and agents to (weightbridge.shipped.SHIPPED) into
the wheel as package data under weightbridge/_shipped/. Everything else is in pyproject.toml."""

import ast
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _shipped_table():
    # Read the table without importing weightbridge (its dependencies are not in the build env).
    tree = ast.parse((HERE / "weightbridge" / "shipped.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "SHIPPED":
            return ast.literal_eval(node.value)
    raise RuntimeError("weightbridge/shipped.py: SHIPPED table not found")


class BuildPyWithShipped(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads them from the checkout
            return
        out = Path(self.build_lib) / "weightbridge" / "_shipped"
        count = 0
        for directory, patterns in _shipped_table():
            for pattern in patterns:
                for src in sorted((HERE / directory).glob(pattern)):
                    if src.is_file():
                        dest = out / src.relative_to(HERE)
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(src, dest)
                        count += 1
        if count == 0:
            raise RuntimeError("no shipped files found: build from a source checkout")


setup(cmdclass={"build_py": BuildPyWithShipped})
