"""What the installed packages must be for the program to start, checked before anything else: torchvision
built for the installed torch. A CPU torch beside a CUDA torchvision (pip's result when the CPU index could not be
reached) fails inside `import torchvision` ("operator torchvision::nms does not exist"), which every command
imports; the command says so in one line naming both versions and the fix instead of a traceback."""
from __future__ import annotations

import importlib
import importlib.metadata

__all__ = ["torchvision_mismatch"]


def torchvision_mismatch() -> str | None:
    """The one-line message when torchvision's compiled operators do not load into the installed torch, else None
    (torchvision absent: the `train` extra's check in cli.py names it)."""
    try:
        importlib.import_module("torchvision")
    except ModuleNotFoundError:
        return None
    except RuntimeError as error:  # its C++ operators were built for another torch
        import torch

        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (f"torchvision {_installed('torchvision')} does not match torch {torch.__version__} (its operators "
                f"fail to load: {cause}); install the pair built together, from one index: pip install "
                "--force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cpu (or the CUDA "
                "index your torch comes from)")
    return None


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"
