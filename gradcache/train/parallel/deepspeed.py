"""`--deepspeed CONFIG.json`: a DeepSpeed config file read and made to agree with the run's global batch.

GradCache replaces DeepSpeed's gradient accumulation, so the batch keys follow `--batch-size` (the global batch):
`train_batch_size` is the global batch, `train_micro_batch_size_per_gpu` the per-rank batch (global / world size)
and `gradient_accumulation_steps` 1. A key left out or set to "auto" is filled so (as the Hugging Face Trainer fills
its "auto" values); a contradicting value is refused naming both. Any other "auto" is refused: the program fills the
batch keys alone. What the engine could not run exactly with GradCache, or what the program already decides, is
refused before anything is built (`check_program_config`), and the engine again by
`gradcache.deepspeed_engine.check_deepspeed_engine`.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gradcache import distributed
from gradcache.ranges import is_int
from gradcache.train.checkpoints.run_checkpoint import RunCheckpoint
from gradcache.train.config import RunConfig
from gradcache.train.errors import CheckpointError, UsageError
from gradcache.train.deepspeed_output import deepspeed_output_to_stderr
from gradcache.train.parallel.placement import Placement, device_of, one_process_group

AUTO = "auto"


def read_deepspeed_file(path: str | Path) -> dict[str, Any]:
    """The JSON object in the --deepspeed file `path`, as written.

    Raises:
        UsageError: a missing or unreadable file, not valid JSON, or not a JSON object.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--deepspeed {path}: cannot read the file ({error.strerror or error}); give the path of a "
                         "DeepSpeed JSON config.") from None
    _check_nesting(text, path)
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--deepspeed {path}: not valid JSON ({error.msg} at line {error.lineno}, column "
                         f"{error.colno}).") from None
    if not isinstance(config, dict):
        raise UsageError(f"--deepspeed {path}: the config must be a JSON object, got {type(config).__name__}.")
    return config


MAX_NESTING = 8  # levels of objects and arrays: a supported config has 3 (zero_optimization.offload_param)
_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"')
_KEY_BEFORE = re.compile(r'"((?:\\.|[^"\\])*)"\s*:\s*$')


def _check_nesting(text: str, path: Path) -> None:
    """UsageError naming the key under which `text` nests objects or arrays deeper than MAX_NESTING, before the
    parser recurses into them (100,000 levels: a RecursionError)."""
    flat = _STRINGS.sub(lambda match: " " * len(match.group()), text)  # brackets inside strings are no nesting
    opened: list[int] = []  # where each level open now began
    for position, character in enumerate(flat):
        if character in "[{":
            opened.append(position)
            if len(opened) > MAX_NESTING:
                keys = [_KEY_BEFORE.findall(text[max(0, start - 200):start]) for start in opened]
                where = ".".join(found[-1] for found in keys if found) or "the top level"
                raise UsageError(f"--deepspeed {path}: {where} nests objects or arrays deeper than {MAX_NESTING} "
                                 f"levels (line {text.count(chr(10), 0, position) + 1}); a config this program "
                                 "supports nests 3: remove the nesting.")
        elif character in "]}" and opened:
            opened.pop()


def deepspeed_config(path: str | Path, global_batch: int, world_size: int,
                     settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config in `path` (or `settings`: the contents the run stored, `run_settings`), its batch keys set
    from `global_batch` over `world_size` ranks.

    Raises:
        UsageError: a missing or unreadable file, not a JSON object, a global batch that does not split evenly over
            the ranks, a batch key contradicting `--batch-size`, or an "auto" outside the batch keys.
    """
    path = Path(path)
    config = copy.deepcopy(settings) if settings is not None else read_deepspeed_file(path)
    if global_batch % world_size:
        raise UsageError(f"--batch-size {global_batch} does not split over {world_size} ranks; under --deepspeed "
                         "every rank takes the same share (train_micro_batch_size_per_gpu): give a multiple of "
                         f"{world_size}.")
    wanted = {"train_batch_size": (global_batch, f"--batch-size {global_batch}"),
              "train_micro_batch_size_per_gpu": (global_batch // world_size,
                                                 f"--batch-size {global_batch} over {world_size} ranks"),
              "gradient_accumulation_steps": (1, "GradCache, which replaces DeepSpeed's accumulation")}
    for key, (value, source) in wanted.items():
        given = config.get(key, AUTO)
        if given != AUTO and given != value:
            raise UsageError(f"--deepspeed {path}: {key} is {given!r}, but {source} makes it {value}; set it to "
                             f"{value} or \"auto\", or leave it out.")
        config[key] = value
    for where in _autos(config):
        raise UsageError(f"--deepspeed {path}: {where} is \"auto\"; the program fills only the batch keys "
                         f"({', '.join(wanted)}): give {where} a value.")
    return config


def _autos(value: Any, where: str = "") -> Iterator[str]:
    """The dotted key of every "auto" left in `value`."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _autos(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _autos(item, f"{where}[{index}]")
    elif value == AUTO:
        yield where


def check_program_config(config: dict[str, Any], path: str | Path) -> None:
    """Refuse (UsageError, naming the key) a `deepspeed_config` that the program cannot train exactly: ZeRO stage 0
    (or no `zero_optimization.stage`: DeepSpeed's default is 0), fp16 or bf16 weights, an `optimizer` or
    `scheduler` block (the program's --optimizer, --lr and --warmup schedule are the run's), and gradient clipping
    (DeepSpeed clips at 1.0 unless told otherwise; the program clips in no placement, so `gradient_clipping` is
    set to 0 here when left out)."""
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if stage not in (1, 2, 3):
        raise UsageError(f"--deepspeed {path}: zero_optimization.stage is {stage!r}; GradCache needs ZeRO stage 1, "
                         "2 or 3 (stage 0 has no coalesced reduction: without ZeRO, drop --deepspeed and let DDP "
                         'average the gradients): e.g. "zero_optimization": {"stage": 2}.')
    for key, instead in (("fp16", "fp16 loss scaling cannot be exact with GradCache (the scale does not reach the "
                                  "cached gradients)"),
                         ("bf16", "the program keeps float32 weights; --precision bf16 runs the encoder under bf16 "
                                  "autocast instead")):
        block = config.get(key, {})
        if isinstance(block, dict) and block.get("enabled"):
            raise UsageError(f"--deepspeed {path}: {key}.enabled is true; {instead}. Remove the {key} block "
                             f"(or set {key}.enabled to false).")
    autocast = config.get("torch_autocast", {})
    if isinstance(autocast, dict) and autocast.get("enabled"):
        raise UsageError(f"--deepspeed {path}: torch_autocast.enabled is true; the program's --precision decides "
                         "autocast (bf16): remove the torch_autocast block.")
    for key in ("optimizer", "scheduler"):
        if key in config:
            raise UsageError(f"--deepspeed {path}: the config has an {key!r} block; the program builds the "
                             f"optimizer (--optimizer, --lr, --weight-decay) and its warm-up cosine schedule "
                             f"(--warmup) itself and hands them to DeepSpeed: remove the {key!r} block.")
    clipping = config.setdefault("gradient_clipping", 0.0)
    if clipping not in (0, 0.0):
        raise UsageError(f"--deepspeed {path}: gradient_clipping is {clipping!r}; the program does not clip "
                         "gradients in any placement, so a DeepSpeed run would train otherwise than the same run "
                         "under DDP: set gradient_clipping to 0 or leave it out.")
    _check_supported(config, SUPPORTED, "", path, stage)


def _positive_int(value: Any) -> bool:
    return is_int(value, 1)


def _count(value: Any) -> bool:
    return is_int(value, 0)


def _offload(value: Any) -> bool:
    return isinstance(value, dict) and set(value) <= {"device", "pin_memory"} \
        and value.get("device", "none") in ("cpu", "none") and isinstance(value.get("pin_memory", False), bool)


_OFF = (lambda value: value == {"enabled": False}, '{"enabled": false}: the program decides precision (--precision)')
_FLAG = (lambda value: isinstance(value, bool), "true or false")
MAX_BUCKET_ELEMENTS = 2**32  # 16 GiB of float32: 8 times DeepSpeed's largest default (stage3_max_live_parameters)
_SIZE = (lambda value: _positive_int(value) and value <= MAX_BUCKET_ELEMENTS,
         f"a positive integer of elements, at most {MAX_BUCKET_ELEMENTS:,} (16 GiB of float32)")
# The keys of a --deepspeed config the program supports, each honoured as DeepSpeed documents it (tested in
# tests/train/parallel/test_deepspeed_keys.py) and what it may hold; a nested dict is its block's own table. Any
# other key is refused at start naming it: it would change what trains (managed_gradient_accumulation, elasticity,
# amp, quantised ZeRO, tensor or sequence parallelism, progressive layer drop), run what the program already runs
# (its checkpoints: checkpoint.load_universal, a decoupled checkpoint.writer), or is untested here.
SUPPORTED: dict[str, Any] = {
    "train_batch_size": (lambda value: True, "filled from --batch-size"),
    "train_micro_batch_size_per_gpu": (lambda value: True, "filled from --batch-size"),
    "gradient_accumulation_steps": (lambda value: True, "1: GradCache replaces DeepSpeed's accumulation"),
    "gradient_clipping": (lambda value: True, "0"),
    "fp16": _OFF, "bf16": _OFF, "torch_autocast": _OFF,
    "steps_per_print": (_positive_int, "a positive integer (steps between DeepSpeed's log lines, on stderr)"),
    "zero_force_ds_cpu_optimizer": (_FLAG[0], "true or false (false: offload_optimizer with the program's "
                                               "optimizer)"),
    "zero_optimization": {
        "stage": (lambda value: value in (1, 2, 3), "1, 2 or 3"),
        "overlap_comm": _FLAG, "contiguous_gradients": _FLAG, "reduce_scatter": _FLAG,
        "allgather_partitions": _FLAG,
        "reduce_bucket_size": _SIZE, "allgather_bucket_size": _SIZE, "stage3_prefetch_bucket_size": _SIZE,
        "stage3_max_live_parameters": _SIZE, "stage3_max_reuse_distance": _SIZE, "sub_group_size": _SIZE,
        "stage3_param_persistence_threshold": (lambda value: _count(value) and value <= MAX_BUCKET_ELEMENTS,
                                               f"a non-negative integer of elements, at most {MAX_BUCKET_ELEMENTS:,}"),
        "offload_optimizer": (_offload, '{"device": "cpu" or "none", "pin_memory": true or false}'),
        "offload_param": (_offload, '{"device": "cpu" or "none", "pin_memory": true or false}, with stage 3'),
    },
}


def _check_supported(config: dict[str, Any], table: dict[str, Any], where: str, path: str | Path,
                     stage: int) -> None:
    """UsageError naming the first key of `config` outside `table` or holding what `table` does not allow."""
    for key, value in config.items():
        name = f"{where}{key}"
        rule = table.get(key)
        if rule is None:
            supported = ", ".join(f"{where}{k}" for k in table)
            raise UsageError(f"--deepspeed {path}: {name} is not a key this program supports ({supported}); it "
                             "would change what trains, or run what the program runs itself, or is untested "
                             "with GradCache: remove it.")
        if isinstance(rule, dict):
            if not isinstance(value, dict):
                raise UsageError(f"--deepspeed {path}: {name} must be a JSON object, got {value!r}.")
            _check_supported(value, rule, f"{name}.", path, stage)
            continue
        allowed, says = rule
        if not allowed(value):
            raise UsageError(f"--deepspeed {path}: {name} is {json.dumps(value)}; it must be {says}.")
        if name == "zero_optimization.offload_param" and value.get("device", "none") != "none" and stage != 3:
            raise UsageError(f"--deepspeed {path}: zero_optimization.offload_param needs stage 3 (stage {stage} "
                             "keeps whole parameters on every rank): use stage 3, or offload_optimizer.")


def run_settings(config: RunConfig) -> RunConfig:
    """`config` with the contents of its --deepspeed file kept in the run (`deepspeed_settings`), so that a
    resume trains under the file the run started with: a new run reads the file; a resume whose file is gone
    uses the kept contents (said on stderr), one whose file now says otherwise is refused.

    Raises:
        UsageError: the file no longer holds what the run trained under, naming the keys that differ.
    """
    if config.deepspeed is None:
        return config
    kept = config.deepspeed_settings
    if kept is None:  # a new run, or one from before the contents were kept: the file as it is now
        return dataclasses.replace(config, deepspeed_settings=read_deepspeed_file(config.deepspeed))
    if not Path(config.deepspeed).exists():
        if distributed.rank() == 0:
            print(f"gradcache train: --deepspeed {config.deepspeed} is gone; the run resumes under the settings it "
                  "kept from it", file=sys.stderr)
        return config
    now = read_deepspeed_file(config.deepspeed)
    if now != kept:
        changed = sorted(_differences(kept, now))
        raise UsageError(f"--deepspeed {config.deepspeed} has changed since the run started ({', '.join(changed)}): "
                         f"the run trained under {json.dumps(kept, sort_keys=True)}, the file now holds "
                         f"{json.dumps(now, sort_keys=True)}. Restore the file (or delete it: the run then resumes "
                         "under the settings it kept), or start a new run for the new settings.")
    return config


def _differences(old: Any, new: Any, where: str = "") -> Iterator[str]:
    """The dotted keys at which `old` and `new` differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            yield from _differences(old.get(key), new.get(key), f"{where}.{key}" if where else key)
    elif old != new:
        yield where or "the whole config"


class DeepSpeedPlacement(Placement):
    """`--deepspeed`: the one trained encoder wrapped by `deepspeed.initialize` with the program's optimizer; ZeRO
    partitions what its stage partitions, reduces one step's gradient once (gradcache.deepspeed_engine) and
    `engine.step()` steps the optimizer (the program's schedule then steps as in any placement).

    |                  | ZeRO-1 / ZeRO-2                    | ZeRO-3                                           |
    |------------------|------------------------------------|--------------------------------------------------|
    | parameters       | whole on every rank                | a partition per rank, gathered per module        |
    | who evaluates    | rank 0                             | every rank, the parameters gathered              |
    | RUN/model        | rank 0's parameters                | the parameters gathered to every rank, rank 0's  |
    | checkpoint       | `last.ds`: DeepSpeed's own files, every rank writes its optimizer partition       |
    """

    sharded = False

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.engine: nn.Module | None = None

    @contextlib.contextmanager
    def process_group(self) -> Iterator[None]:
        """Without torchrun, a one-process gloo group (DeepSpeed needs one, and LOCAL_RANK: --device's GPU index),
        ended on the way out. On --device cpu DeepSpeed is told to use its CPU accelerator (DS_ACCELERATOR), before
        it is imported. The variables it sets are restored on the way out: a later run in the same process (an
        HF Trainer reads LOCAL_RANK as a launch) starts from the environment it was given. DeepSpeed's prints and
        log lines go to stderr meanwhile (`deepspeed_output_to_stderr`): stdout is the run's JSON summary alone."""
        settings = {}
        if torch.device(self.config.device).type == "cpu":
            settings["DS_ACCELERATOR"] = os.environ.get("DS_ACCELERATOR", "cpu")
        if not distributed.is_distributed():
            device = device_of(self.config.device)
            # the engine trains on cuda:LOCAL_RANK (its _set_distributed_vars)
            settings["LOCAL_RANK"] = str(device.index) if device.type == "cuda" else os.environ.get("LOCAL_RANK", "0")
        with _environment(settings), deepspeed_output_to_stderr():
            if distributed.is_distributed():
                yield
                return
            try:
                with one_process_group(self.config.device):
                    yield
            finally:
                _forget_world_group()

    def place(self, encoders: nn.Module | list[nn.Module], device: torch.device) -> nn.Module | list[nn.Module]:
        return encoders  # wrapped with the optimizer: `with_optimizer`

    def with_optimizer(self, encoders: nn.Module | list[nn.Module], optimizer: torch.optim.Optimizer,
                       trained: nn.Module) -> nn.Module | list[nn.Module]:
        """The one trained encoder replaced by its engine, built over `optimizer`, which must step exactly that
        encoder's parameters (preflight refuses the modes and options that train more)."""
        import deepspeed

        listed = [encoders] if isinstance(encoders, nn.Module) else list(encoders)
        distinct = {id(e): e for e in listed if any(p.requires_grad for p in e.parameters())}
        inside = {id(p) for e in distinct.values() for p in e.parameters() if p.requires_grad}
        outside = [name for name, p in trained.named_parameters() if p.requires_grad and id(p) not in inside]
        if len(distinct) != 1 or outside:
            raise UsageError(f"--deepspeed wraps one trained encoder, but this run trains {len(distinct)} encoders "
                             f"and parameters outside them ({outside[:3]}); use DDP or --fsdp for it")
        (encoder,) = distinct.values()
        config = deepspeed_config(self.config.deepspeed, self.config.batch_size, distributed.world_size(),
                                  self.config.deepspeed_settings)
        check_program_config(config, self.config.deepspeed)
        # DeepSpeed's own list of ZeRO optimizers has Adam and AdamW alone; SGD is elementwise too, so stepping it
        # over ZeRO's flat partitions is exact (preflight refuses the layer-wise LARS and LAMB)
        config["zero_allow_untested_optimizer"] = not isinstance(optimizer, torch.optim.AdamW)
        _forget_world_group(unless_registered=True)
        self.engine, *_ = deepspeed.initialize(model=encoder, optimizer=optimizer, config=config)
        placed = [self.engine if e is encoder else e for e in listed]
        return placed[0] if isinstance(encoders, nn.Module) else placed

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> bool:
        """`engine.step()`: the optimizer over ZeRO's partitions, the gradients cleared. The reduced gradients live
        in the partitions (the parameters' .grad is empty), so the engine's own finding counts: a step it skipped
        for a non-finite gradient norm is reported as non-finite gradients (the run then stops as diverged)."""
        skipped = self.engine.skipped_steps
        self.engine.step()
        return self.engine.skipped_steps == skipped

    def zero3(self) -> bool:
        return self.engine is not None and self.engine.zero_optimization_stage() == 3

    def evaluates(self) -> bool:
        return self.zero3() or distributed.rank() == 0

    def gathered(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """ZeRO-3: every parameter of `model` gathered for the block (a collective: every rank enters it)."""
        if not self.zero3():
            return contextlib.nullcontext()
        from deepspeed.runtime.zero import GatheredParameters

        return GatheredParameters(list(model.parameters()))

    def whole(self, trained: nn.ModuleDict, build: Callable[[], nn.ModuleDict]) -> nn.ModuleDict | None:
        """ZeRO-1/2: rank 0's parameters, which are whole. ZeRO-3: the trained ones gathered on every rank, copied
        on rank 0 into a fresh copy, which is built with the frozen ones (LoRA's base) as the run was."""
        if not self.zero3():
            return trained if distributed.rank() == 0 else None
        from deepspeed.runtime.zero import GatheredParameters

        from gradcache.train.checkpoints.model_state import load_saved_state, saved_state

        with GatheredParameters([p for p in trained.parameters() if p.requires_grad]):
            state = {k: v.detach().cpu().clone() for k, v in saved_state(trained).items()} \
                if distributed.rank() == 0 else None
        if state is None:
            return None
        copy = build()
        load_saved_state(copy, state)
        return copy

    def load(self, saved: RunCheckpoint, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer) -> None:
        from gradcache.train.checkpoints.deepspeed_checkpoint import DeepSpeedCheckpoint

        if not isinstance(saved, DeepSpeedCheckpoint):
            raise CheckpointError(f"{saved.path} was not written by a --deepspeed run; resume it without --deepspeed")
        saved.load_into(self.engine, trained)

    def checkpoint(self, output_dir: str | os.PathLike) -> RunCheckpoint:
        from gradcache.train.checkpoints.deepspeed_checkpoint import DeepSpeedCheckpoint

        return DeepSpeedCheckpoint(Path(output_dir) / DeepSpeedCheckpoint.name, self.engine)


def _forget_world_group(unless_registered: bool = False) -> None:
    """Drop DeepSpeed's clone of the world group (`deepspeed.utils.groups._WORLD_GROUP`, kept for the life of the
    process) and its communication backend (`deepspeed.comm.comm.cdb`, which holds torch.distributed's functions
    as they were when it was built) once the process group they were made for is gone, or, `unless_registered`,
    when the clone belongs to no group of the current one: a second `--deepspeed` run in one process (a sweep, a
    notebook, a rank forked from a process that ran one) would otherwise hand DeepSpeed a destroyed group ("Group
    ... is not registered") and the first run's functions (a wrapper of torch.distributed's made since, a
    profiler's or a test's counter, never sees ZeRO-3's reduce-scatter)."""
    groups = sys.modules.get("deepspeed.utils.groups")  # not imported: nothing cached
    world = getattr(groups, "_WORLD_GROUP", None)
    registered = world is not None and dist.is_initialized() and world in dist.distributed_c10d._world.pg_map
    if unless_registered and (world is None or registered):
        return
    if world is not None:
        groups._WORLD_GROUP = None
    comm = sys.modules.get("deepspeed.comm.comm")
    if comm is not None:
        comm.cdb = None


@contextlib.contextmanager
def _environment(settings: dict[str, str]) -> Iterator[None]:
    """os.environ with `settings` set inside, each variable as it was (or absent) after."""
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
