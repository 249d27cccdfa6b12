"""The trainers are imported by their integration module only, and a missing one names its extra."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gradcache.integrations.optional import require


def test_a_missing_trainer_names_the_extra_and_keeps_its_own_error():
    with pytest.raises(ImportError, match=r'pip install "gradcache\[lightning\]"') as caught:
        require("gradcache_no_such_trainer", "lightning", "gradcache.integrations.lightning")
    assert isinstance(caught.value.__cause__, ImportError)
    assert "gradcache_no_such_trainer" in str(caught.value)


@pytest.mark.slow
def test_importing_gradcache_imports_no_trainer():
    code = ("import sys, gradcache, gradcache.integrations; "
            "print(sorted(m for m in ('lightning', 'transformers', 'sentence_transformers', 'open_clip') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
