"""`last.ds`: the checkpoint of a `--deepspeed` run, DeepSpeed's own files (`engine.save_checkpoint`: the module's
weights and every rank's optimizer partition) under one tag, with the run's `meta`, the loss's state and the sha256
of every file in `extra.pt` beside them. Every rank writes its files to `last.ds.partial`, which rank 0 renames into
place (the replaced `last.ds` becoming `previous.ds`), as a sharded `last.dcp` is written; a full disk at any of
its writes is `DiskFull` (exit status 74). Resuming loads it into an engine of the same ZeRO stage
(`engine.load_checkpoint`); `gradcache eval` reads the full float32 weights back from the partitions without an
engine (DeepSpeed's zero_to_fp32). Both read the files with pickle, which runs whatever code a file carries, so
`screen` first refuses a checkpoint holding a file its save did not list, or one holding anything but tensors,
plain values and the classes DeepSpeed writes (checkpoints/safe_unpickling.py). As a `last.pt`, it leaves the
frozen parameters out (LoRA's base weights: checkpoints/model_state.py): the engine is given the trained
parameters alone, so its optimizer partitions hold their state alone, and the module's weights are saved without
the frozen ones."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gradcache import distributed
from gradcache.train.checkpoints.atomic import (
    EXTRA_FILE, folder_bytes, read_checked, rotate_into_place, save_checkpoint,
)
from gradcache.train.checkpoints.checksum import files_sha256
from gradcache.train.checkpoints.regular_files import PrivateCopy, regular_files
from gradcache.train.checkpoints.model_state import load_saved_state
from gradcache.train.checkpoints.interface import RunCheckpoint
from gradcache.train.checkpoints.safe_unpickling import screen_pickle
from gradcache.train.errors import CheckpointError, DiskFull, out_of_space
from gradcache.train.deepspeed_output import deepspeed_output_to_stderr

TAG = "state"  # DeepSpeed's subfolder of the checkpoint's files
FILES_KEY, LOSS_KEY, MODULE_KEY = "files", "loss", "engine_module"  # extra.pt's entries beside the meta


class DeepSpeedCheckpoint(RunCheckpoint):
    name, previous_name, sharded = "last.ds", "previous.ds", False

    def __init__(self, path: str | os.PathLike, engine: nn.Module | None = None) -> None:
        super().__init__(path)
        self.engine = engine  # the run's engine, for saving; a checkpoint found on disk has none

    def check(self) -> None:
        """Whole and safe to hand to DeepSpeed: `screen` passes."""
        self.screen()

    def screen(self) -> None:
        """Raise CheckpointError, before DeepSpeed reads any of it, unless the checkpoint is a --deepspeed run's,
        holds no link and nothing but folders and regular files, every file under `state/` is one the save listed in
        extra.pt (`files`, required) with the sha256 listed, and each holds tensors, plain values and the classes
        DeepSpeed writes alone (checkpoints/safe_unpickling.py: DeepSpeed's own reads run pickle's code).

        Each file is read once, into a private copy (checkpoints/regular_files.py: a 0700 temporary folder) where it
        is hashed and screened; DeepSpeed and zero_to_fp32 are given that copy, so nothing is read from the run
        folder after the screen (a file renamed over a listed one then is never read). Once per object, until
        `release`."""
        if self.__dict__.get("_copy") is not None:
            return
        present = regular_files(self.path, self.path) if self.path.is_dir() or self.path.is_symlink() else []
        if EXTRA_FILE not in present:
            raise CheckpointError(f"{str(self.path)!r} is not a whole --deepspeed checkpoint: it lacks {EXTRA_FILE}")
        copy = PrivateCopy(self.path)
        try:
            copy.add(self.path, [EXTRA_FILE])
            with open(copy.folder / EXTRA_FILE, "rb") as handle:  # named as the run's file in errors
                extra = read_checked(self.path / EXTRA_FILE, handle)
            listed = self._listed(extra)
            inside = [name[len(TAG) + 1:] for name in present if name.startswith(f"{TAG}/")]
            unlisted = [f"{TAG}/{name}" for name in inside if name not in listed]
            if unlisted:
                raise CheckpointError(f"DeepSpeed checkpoint {str(self.path)!r} holds {', '.join(unlisted[:5])}, "
                                      f"which its {EXTRA_FILE} does not list: its save did not write them, and "
                                      "DeepSpeed would read them; remove them, or resume from another checkpoint "
                                      "(previous.ds)")
            for name in listed:
                if name not in inside:
                    raise CheckpointError(f"DeepSpeed checkpoint {str(self.path)!r} lacks its file {TAG}/{name}")
            copy.add(self.path / TAG, list(listed), under=TAG)
            for name, digest in listed.items():
                if copy.sha256[f"{TAG}/{name}"] != digest:
                    raise CheckpointError(f"DeepSpeed checkpoint {str(self.path)!r} fails the checksum of {name}")
            for name in listed:
                screen_pickle(copy.folder / TAG / name, self.path)
        except BaseException:
            copy.close()
            raise
        self._copy, self._extra_cache = copy, extra

    def release(self) -> None:
        """Remove the private copy that `screen` made (a later `screen` makes another)."""
        copy = self.__dict__.pop("_copy", None)
        if copy is not None:
            copy.close()

    def _listed(self, extra: dict[str, Any]) -> dict[str, str]:
        """The files extra.pt lists, with their sha256, after checking that a --deepspeed run wrote it."""
        if not extra.get("args", {}).get("deepspeed"):
            raise CheckpointError(f"{str(self.path)!r} holds the options of a run without --deepspeed: a "
                                  "--deepspeed run did not write it; move it out of the run folder")
        listed = extra.get(FILES_KEY)
        if not isinstance(listed, dict) or not listed or not all(
                isinstance(name, str) and isinstance(digest, str) and _is_plain_name(name)
                for name, digest in listed.items()):
            raise CheckpointError(f"DeepSpeed checkpoint {str(self.path)!r}: its {EXTRA_FILE} lacks the list of its "
                                  f"files ({FILES_KEY!r}), which every --deepspeed save writes; it was not written "
                                  "by gradcache train and is not read")
        return listed

    def meta(self) -> dict[str, Any]:
        return {k: v for k, v in self._extra().items() if k not in (FILES_KEY, LOSS_KEY, MODULE_KEY)}

    def load(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Without an engine (`gradcache eval`): the full float32 weights gathered from the saved partitions
        into `trained`; the optimizer state is read only by `load_into` (a resume)."""
        if optimizer is not None:
            raise CheckpointError(f"{self.path} is a --deepspeed checkpoint: a run resumes it on a DeepSpeed engine "
                                  "(--resume keeps the run's --deepspeed)")
        self.screen()  # before DeepSpeed's pickle reads a file: it reads the screened copy alone
        extra = self._extra()
        try:
            with deepspeed_output_to_stderr():  # its import's and progress lines: stdout is `gradcache eval`'s JSON
                from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

                state = get_fp32_state_dict_from_zero_checkpoint(str(self._copy.folder), tag=TAG)
        finally:
            self.release()
        module = trained.get_submodule(extra[MODULE_KEY])
        try:
            load_saved_state(module, state)
        except RuntimeError as error:
            raise CheckpointError(f"{self.path} does not hold the parameters of the run's model ({error}): it was "
                                  "saved from another model") from error
        trained["loss"].load_state_dict(extra[LOSS_KEY])

    def load_into(self, engine: nn.Module, trained: nn.ModuleDict) -> None:
        """A resume: the engine's module, its optimizer partitions (saved on as many ranks, at the same ZeRO
        stage) and the loss's state. Call on every rank."""
        self.screen()  # before DeepSpeed's pickle reads a file: it reads the screened copy alone
        extra = self._extra()
        saved_on, stage = extra.get("world_size"), engine.zero_optimization_stage()
        if saved_on != distributed.world_size():
            raise CheckpointError(f"{self.path} was saved by {saved_on} ranks; a --deepspeed checkpoint resumes on as "
                                  f"many (its optimizer partitions are per rank): run torchrun --nproc-per-node "
                                  f"{saved_on}, or export its weights (gradcache export) and start a new run")
        try:
            loaded, _ = engine.load_checkpoint(str(self._copy.folder), tag=TAG, load_optimizer_states=True,
                                               load_lr_scheduler_states=False, custom_load_fn=_load_module)
        except (RuntimeError, KeyError, AssertionError, ValueError) as error:
            reason = str(error).splitlines()[0][:300] if str(error) else ""
            raise CheckpointError(f"{self.path} does not load into this run's DeepSpeed engine "
                                  f"({type(error).__name__}: {reason}); a --deepspeed "
                                  "checkpoint resumes on the same number of ranks and ZeRO stage, with the same "
                                  f"model (this engine: ZeRO-{stage})") from error
        finally:
            self.release()
        if loaded is None:
            raise CheckpointError(f"{self.path} holds no DeepSpeed checkpoint under tag {TAG!r}")
        trained["loss"].load_state_dict(extra[LOSS_KEY])

    def save(self, trained: nn.ModuleDict, optimizer: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
        partial = self.path.with_name(self.path.name + ".partial")
        leader = distributed.rank() == 0
        if leader:
            shutil.rmtree(partial, ignore_errors=True)  # what a crashed save left
        dist.barrier()
        try:
            self.engine.save_checkpoint(str(partial), tag=TAG, save_latest=False, exclude_frozen_parameters=True)
            dist.barrier()  # every rank's files are written
            if leader:
                module = next(name for name, m in trained.named_modules() if m is self.engine.module)
                save_checkpoint({**meta, LOSS_KEY: trained["loss"].state_dict(), MODULE_KEY: module,
                                 "world_size": distributed.world_size(), FILES_KEY: files_sha256(partial / TAG)},
                                partial / EXTRA_FILE)
                if self.path.exists():
                    rotate_into_place(partial, self.path, self.previous_path)
                else:
                    os.replace(partial, self.path)
        except Exception as error:
            needed = max(folder_bytes(partial), folder_bytes(self.path), _bytes_to_save(self.engine))
            full = isinstance(error, DiskFull) or out_of_space(error, self.path.parent, needed)  # before it goes
            if leader:
                shutil.rmtree(partial, ignore_errors=True)
            if full:  # torch's "unexpected pos", an ENOSPC copying zero_to_fp32.py or writing extra.pt: one status
                raise DiskFull(self.path.parent, needed, shutil.disk_usage(self.path.parent).free,
                               resumable=self.path.exists() or self.previous_path.exists()) from error
            raise
        except BaseException:
            if leader:
                shutil.rmtree(partial, ignore_errors=True)
            raise
        dist.barrier()  # nobody reads the folder before it is whole
        self.release()
        self.__dict__.pop("_extra_cache", None)

    def _extra(self) -> dict[str, Any]:
        """extra.pt as `screen` read it (from its private copy)."""
        if "_extra_cache" not in self.__dict__:
            self.screen()
        return self._extra_cache


def _is_plain_name(name: str) -> bool:
    """A file name of DeepSpeed's (`mp_rank_00_model_states.pt`): no folder, no way out of `state/`."""
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..") and "\0" not in name


def _bytes_to_save(engine: nn.Module) -> int:
    """About the bytes a save of `engine` writes, over all ranks: the float32 trained parameters four times (the
    module's weights, ZeRO's float32 partitions and Adam's two moments)."""
    return 4 * sum(getattr(p, "ds_numel", p.numel()) * 4 for p in engine.module.parameters() if p.requires_grad)


def _load_module(src: dict[str, torch.Tensor], dst: nn.Module) -> None:
    """The engine's module state, without the frozen parameters it was saved without, strictly otherwise (a
    RuntimeError for another model, which `load_into` turns into a CheckpointError)."""
    load_saved_state(dst, src)
