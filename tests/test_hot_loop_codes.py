"""The C loop (shim/_hotloop.c) and the Python around it speak in integer codes: which wire
format an endpoint's hot loop reads (sdk_call.HOT_*) and what the cold callback answers
(tokens.STAY_COLD, GO_HOT, GO_PASS). The C module serves its own enums' values; a code
renumbered on one side alone would read one wire format's events with another's loop."""

from __future__ import annotations

import importlib

import pytest

from exporter._internal.shim import sdk_call, tokens
from tests.support.c_parts import built_in_c

CODES = {"HOT_GENERIC": sdk_call, "HOT_CHAT": sdk_call, "HOT_RESPONSES": sdk_call,
         "HOT_ANTHROPIC": sdk_call, "STAY_COLD": tokens, "GO_HOT": tokens, "GO_PASS": tokens}


def test_the_c_loop_uses_the_python_codes():
    try:
        hotloop = importlib.import_module("exporter._internal.shim._hotloop")
    except ImportError:
        hotloop = None
    if not built_in_c("the C loop", hotloop is not None):
        pytest.skip("no C compiler here: the package runs the Python loop")
    assert {name: getattr(hotloop, name) for name in CODES} == \
        {name: getattr(module, name) for name, module in CODES.items()}
