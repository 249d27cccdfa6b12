"""One import name, `gradcache`: the library imports with torch alone, the encoders live at gradcache.models,
and a user's own `models` package neither shadows nor is shadowed by them. (.ci/run checks the other half in a
fresh virtual environment: `pip install .` brings torch and none of the program's packages, and the wheel with
[train] trains from a folder whose own models/ raises on import.)"""
from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# One fresh interpreter, started in a folder that holds a `models` package of its own: what importing gradcache
# brings beyond torch, and which file each of the two `models` names comes from.
FRESH = """
import json, sys, torch
before = set(sys.modules)
import gradcache
new = {m.split('.')[0] for m in set(sys.modules) - before}
library = sorted(new - {'gradcache'} - set(sys.stdlib_module_names))
import models
import gradcache.models, gradcache.train.loop
print(json.dumps({"library_imports": library, "mine": models.MINE, "user_models": models.__file__,
                  "gradcache_models": gradcache.models.__file__,
                  "presets": sorted(gradcache.models.IMAGE_ENCODER_PRESETS)}))
"""


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("project")
    (folder / "models").mkdir()
    (folder / "models" / "__init__.py").write_text("MINE = True\n")
    result = subprocess.run([sys.executable, "-c", FRESH], cwd=folder, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), folder


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"gradcache." + ".".join(p.parent.relative_to(ROOT / "gradcache").parts) if p.parent != ROOT / "gradcache"
               else "gradcache" for p in (ROOT / "gradcache").rglob("*.py") if "__pycache__" not in p.parts}
    folders |= {"gradcache.models" + "".join("." + part for part in p.parent.relative_to(ROOT / "models").parts)
                for p in (ROOT / "models").rglob("*.py") if "__pycache__" not in p.parts}
    assert folders == set(setuptools["packages"])
    assert setuptools["package-dir"] == {"gradcache.models": "models"}


@pytest.mark.slow
def test_the_library_imports_nothing_beyond_torch(fresh):
    assert fresh[0]["library_imports"] == []  # a user's `models` on the path was not imported either


@pytest.mark.slow
def test_a_folder_with_its_own_models_package(fresh):
    """A script in a project with a `models/` of its own imports both: its own, and the encoders."""
    found, folder = fresh
    assert found["mine"] is True and found["presets"]
    assert Path(found["user_models"]).is_relative_to(folder)
    assert not Path(found["gradcache_models"]).is_relative_to(folder), found["gradcache_models"]


# `python -m gradcache train --help` where only the library is installed: every package of the `train` extra fails
# to import, as if absent (torch is imported first, as the library brings it).
WITHOUT_TRAIN_EXTRA = """
import runpy, sys
import gradcache
from gradcache.train.cli import TRAIN_EXTRA
for name in TRAIN_EXTRA:
    sys.modules[name] = None
sys.argv = ["gradcache", "train", "--help"]
runpy.run_module("gradcache", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_the_command_without_the_train_extra_exits_2_naming_it():
    """The command's modules import with the library alone, and a missing program package names the extra
    (.ci/run checks the same on a wheel installed without it)."""
    result = subprocess.run([sys.executable, "-c", WITHOUT_TRAIN_EXTRA], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "pip install 'gradcache[train]'" in result.stderr and "Traceback" not in result.stderr


def test_the_console_script_and_the_old_import_path_reach_the_command():
    from gradcache.cli import main
    from gradcache.train.cli import main as program_main

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["gradcache"].partition(":")
    assert main is program_main is getattr(importlib.import_module(module), name)


def _imported_names(path: Path) -> list[str]:
    """Every absolute module name an import statement of `path` names, wherever it sits (functions included)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module)
    return names


def test_no_source_file_imports_a_top_level_models_package():
    """The program (every mode, every lazy import) reaches the encoders as gradcache.models only, so a user's
    `models` is never imported: checked on every import statement of the sources, in place of a training run
    from such a folder (.ci/run trains the installed wheel from one, whose models/ raises on import)."""
    sources = [*(ROOT / "gradcache").rglob("*.py"), *(ROOT / "models").rglob("*.py")]
    assert len(sources) > 20
    offending = [f"{path.relative_to(ROOT)}: import {name}" for path in sources for name in _imported_names(path)
                 if name == "models" or name.startswith("models.")]
    dynamic = [str(path.relative_to(ROOT)) for path in sources
               if any(f"import_module({quote}models" in path.read_text() for quote in "'\"")]
    assert offending == [] and dynamic == []


def test_the_open_clip_extra_allows_no_release_without_local_dir_loading():
    """An export is loaded as open_clip.create_model("local-dir:RUN/model"); an older open_clip cannot."""
    from gradcache.train.commands.model import OPEN_CLIP_LOCAL_DIR

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("open-clip", "peers"):
        floor = next(r for r in extras[extra] if r.startswith("open-clip-torch")).split(">=")[1]
        assert tuple(int(part) for part in floor.split(".")) >= OPEN_CLIP_LOCAL_DIR, extra


def test_the_readme_says_how_to_install_on_a_machine_without_a_gpu():
    install = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "--index-url https://download.pytorch.org/whl/cpu" in install
