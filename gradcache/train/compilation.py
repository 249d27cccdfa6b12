"""`--compile`: the encoders the strategy runs, each compiled in place by torch.compile, and what the user gets
when a backend cannot compile them.

Each distinct encoder gets `nn.Module.compile` (its `__call__` compiled, the module itself kept): its parameter
names, its type and every wrapper placed around it (DDP, FSDP2, a DeepSpeed engine) are those of an eager run, so
checkpoints, exports and resumes do not know it was compiled. Compilation is `fullgraph=False`, `dynamic=None`:
a graph break runs its region eagerly, a new chunk shape recompiles once with dynamic shapes, and past torch's
recompile limit that frame runs eagerly (torch's warning says so). Inductor draws its random numbers with torch's
own ops (`fallback_random`), so dropout draws the eager run's masks from the generator GradCache replays.

A backend that cannot run here (an unknown name; inductor without a C++ compiler on the CPU or without Triton on
CUDA) is refused before the run writes anything (`check_compile`); one that fails on the encoders at a step stops
the run with exit 2 (`compile_failed`), naming the cause: a resume without `--compile` continues eagerly.
"""
from __future__ import annotations

import torch
from torch import nn

from gradcache.train.config import RunConfig
from gradcache.train.errors import UsageError

OTHER_BACKENDS = "aot_eager (no C++ compiler needed)"  # what to offer when inductor cannot run


def check_compile(config: RunConfig) -> None:
    """Refuse a `--compile-backend` that cannot compile here (UsageError), cheaply: no encoder is compiled."""
    if not config.compile:
        return
    backend = config.compile_backend
    known = torch.compiler.list_backends(exclude_tags=())
    if backend not in known:
        raise UsageError(f"--compile-backend {backend!r} is not a torch.compile backend; choose one of "
                         f"{', '.join(torch.compiler.list_backends())} or {OTHER_BACKENDS}")
    if backend != "inductor":
        return
    device = torch.device(config.device)
    if device.type == "cpu" and not _has_cpp_compiler():
        raise UsageError("--compile-backend inductor on the CPU needs a C++ compiler (g++, or the one $CXX names), "
                         f"and none runs here; install one (apt-get install g++), or give --compile-backend "
                         f"{OTHER_BACKENDS}, or drop --compile")
    if device.type == "cuda" and not _has_triton():
        raise UsageError(f"--compile-backend inductor on --device {config.device} needs Triton, which is not "
                         f"installed; pip install triton, or give --compile-backend {OTHER_BACKENDS}, or drop "
                         "--compile")


def compile_encoders(encoders: nn.Module | list[nn.Module], config: RunConfig) -> nn.Module | list[nn.Module]:
    """`encoders` as they are, each distinct one compiled in place when `--compile` is given."""
    if not config.compile:
        return encoders
    options = {"options": {"fallback_random": True}} if config.compile_backend == "inductor" else {}
    distinct = {id(e): e for e in ([encoders] if isinstance(encoders, nn.Module) else encoders)}
    for encoder in distinct.values():
        encoder.compile(backend=config.compile_backend, fullgraph=False, dynamic=None, **options)
    return encoders


def compile_errors(config: RunConfig) -> tuple[type[BaseException], ...]:
    """The errors of a backend that failed to compile (torch._dynamo's, inductor's among them) when `--compile` is
    given; none otherwise (torch._dynamo is imported only for a compiled run: it takes a second)."""
    if not config.compile:
        return ()
    from torch._dynamo.exc import TorchDynamoException

    return (TorchDynamoException,)


def compile_failed(error: BaseException, config: RunConfig, step: int) -> UsageError:
    """The error that stops a run whose backend failed on its encoders at `step` (0-based), naming the cause."""
    cause = getattr(error, "inner_exception", None) or error  # a backend's own error, inside dynamo's
    lines = str(cause).strip().splitlines()
    return UsageError(f"--compile-backend {config.compile_backend} failed to compile the encoders at step "
                      f"{step + 1}: {type(cause).__name__}: {lines[0] if lines else ''}. Give another "
                      f"--compile-backend (e.g. {OTHER_BACKENDS}), or drop --compile; a resume without --compile "
                      "continues this run eagerly from its last checkpoint")


def _has_cpp_compiler() -> bool:
    """Whether inductor finds the C++ compiler it builds CPU kernels with (its own search: $CXX, then g++)."""
    from torch._inductor import cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        cpp_builder.get_cpp_compiler()
    except InvalidCxxCompiler:
        return False
    return True


def _has_triton() -> bool:
    from torch.utils._triton import has_triton

    return has_triton()
