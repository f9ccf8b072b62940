"""The optional C parts of the package: the per-chunk loop (exporter/_internal/shim/_hotloop.c),
a sync call's httpx trace extension (exporter/_internal/shim/_hottrace.c), and a finished
call's derive, per-value appends and bucket grouping (exporter/_internal/record/_hotrecord.c).

`optional=True`: where no compiler is found the build goes on without them, and tokens.py,
sdk_call.py, timeline.py, recorder.py and histogram.py run the same code in Python, so `pip
install` stays one command with no compiler needed. Everything else is configured in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("exporter._internal.shim._hotloop",
                             ["exporter/_internal/shim/_hotloop.c"], optional=True),
                   Extension("exporter._internal.shim._hottrace",
                             ["exporter/_internal/shim/_hottrace.c"], optional=True),
                   Extension("exporter._internal.record._hotrecord",
                             ["exporter/_internal/record/_hotrecord.c"], optional=True)])
