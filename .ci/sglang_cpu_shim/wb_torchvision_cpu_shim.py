"""CPU test shim: let PyPI's CUDA torchvision wheel import next to torch 2.13.0+cpu (test venv only).

SGLang imports ``torchvision.transforms`` at module level (multimodal helpers). PyPI's torchvision
wheel is a CUDA build whose C extension cannot load against the CPU torch, and its Python side then
fails registering fake kernels for ``torchvision::nms``/``qnms`` ("operator does not exist").
Declaring those two op schemas first is enough for the import; nothing on the text-only test path
calls them. ``.ci/sglang_venv.sh`` installs this module with a ``.pth`` line that only adds an import
hook: torch is imported (and the schemas declared) when, and only when, torchvision is imported.
Not part of the ``weightbridge`` package; never present on a real GPU machine.
"""

import importlib.abc
import sys

_LIB = None  # the torch.library.Library must stay alive, or the schemas are dropped


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        global _LIB
        if fullname == "torchvision" and _LIB is None:
            import torch

            _LIB = torch.library.Library("torchvision", "FRAGMENT")
            _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        return None  # the normal finders import torchvision itself


def install():
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
