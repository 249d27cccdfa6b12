"""Import a trainer package that gradcache does not depend on, or say which extra installs it."""
from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """`importlib.import_module(module)`, or an ImportError naming the extra that installs it.

    The original error is chained (`from`), so a package that is installed but fails to import (a version
    clash, a missing system library) still shows its own message.

    Example:
        >>> lightning = require("lightning", "lightning", "gradcache.integrations.lightning")
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{purpose} needs the `{module}` package, which could not be imported ({error}); install it with "
            f"`pip install \"gradcache[{extra}]\"`."
        ) from error
