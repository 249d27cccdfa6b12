"""One import name, `gradcache`: the library imports with torch alone, the encoders live at gradcache.models,
and a user's own `models` package neither shadows nor is shadowed by them. (.ci/run checks the other half in a
fresh virtual environment: `pip install .` brings torch and none of the program's packages.)"""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
USER_MODELS = "raise ImportError('the user\\'s own models package was imported')\n"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"gradcache." + ".".join(p.parent.relative_to(ROOT / "gradcache").parts) if p.parent != ROOT / "gradcache"
               else "gradcache" for p in (ROOT / "gradcache").rglob("*.py") if "__pycache__" not in p.parts}
    folders |= {"gradcache.models" + "".join("." + part for part in p.parent.relative_to(ROOT / "models").parts)
                for p in (ROOT / "models").rglob("*.py") if "__pycache__" not in p.parts}
    assert folders == set(setuptools["packages"])
    assert setuptools["package-dir"] == {"gradcache.models": "models"}


def test_the_library_imports_nothing_beyond_torch(tmp_path):
    result = _python("import sys, torch\nbefore = set(sys.modules)\nimport gradcache\n"
                     "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
                     "print(sorted(new - {'gradcache'} - set(sys.stdlib_module_names)))", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_folder_with_its_own_models_package(tmp_path):
    """`python -m gradcache train` from a project with a `models/` of its own, and a script that imports both."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("MINE = True\n")
    script = ("import models\nimport gradcache.models, gradcache.train.loop\n"
              "assert models.MINE and gradcache.models.IMAGE_ENCODER_PRESETS\n"
              f"assert models.__file__.startswith({str(tmp_path)!r})\n"
              f"assert not gradcache.models.__file__.startswith({str(tmp_path)!r}), gradcache.models.__file__\n")
    result = _python(script, tmp_path)
    assert result.returncode == 0, result.stderr
    (tmp_path / "models" / "__init__.py").write_text(USER_MODELS)  # any import of it now fails loudly
    run = subprocess.run(
        [sys.executable, "-m", "gradcache", "train", "simclr", "--steps", "1", "--train-size", "32", "--test-size",
         "16", "--image-size", "16", "--batch-size", "8", "--chunk-size", "4", "--width", "8", "--hidden-dim", "16",
         "--projection-dim", "8", "--knn-k", "3", "--warmup", "0", "--quiet", "--workers", "0",
         "--output-dir", str(tmp_path / "run")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "run" / "last.pt").is_file()
