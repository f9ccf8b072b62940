"""Whether the optional C parts are built, for the tests that run both ways."""

from __future__ import annotations

import shutil
import sysconfig

import pytest


def built_in_c(what: str, built: bool) -> bool:
    """`built`, where the C part `what` was imported; a test fails when a compiler is here but
    it was not built (`make test` builds it), and skips its C half where there is none."""
    if built:
        return True
    if shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc") is None:
        return False
    pytest.fail(f"a C compiler is here but {what} was not built (pip install -e .)")
