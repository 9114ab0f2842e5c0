"""A raising stand-in for SGLang's ``sgl_kernel`` on CPU-only test machines (CI, developers).

SGLang imports ``sgl_kernel`` (and submodules such as ``sgl_kernel.kvcacheio``) at module level
even when it runs with ``SGLANG_USE_CPU_ENGINE=1``; the CPU build of sgl-kernel is not on PyPI.
Every attribute here is a callable that raises if it is ever called, so a code path that really
needs a kernel fails loudly instead of computing something wrong; on the tiny torch_native /
pytorch-sampling CPU configuration the tests use, none is called.

This is a test shim only: ``.ci/sglang_venv.sh`` copies it into the SGLang test venv. It is not
part of the ``weightbridge`` package, and nothing under ``weightbridge/`` imports it; on a real
machine the real ``sgl_kernel`` is installed and this file is absent.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+weightbridge-cpu-shim"
WEIGHTBRIDGE_CPU_SHIM = True


class _Missing:
    """Stands for any kernel or constant: calling it raises, attributes are more of the same."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._name} is a CPU test shim (weightbridge .ci/sglang_cpu_shim): the real sgl_kernel "
            "is not installed, and this SGLang code path needs it"
        )

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._name}.{name}")

    def __repr__(self):
        return f"<sgl_kernel CPU shim {self._name}>"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(f"sgl_kernel.{name}")


class _ShimModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self.__name__}.{name}")


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every ``sgl_kernel.<sub>`` import succeed with a shim module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _ShimModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleFinder())
