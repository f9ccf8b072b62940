"""The optional C part of the package: the per-chunk loop (exporter/_internal/shim/_hotloop.c).

`optional=True`: where no compiler is found the build goes on without it, and tokens.py runs
the same loop in Python, so `pip install` stays one command with no compiler needed. Everything
else is configured in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("exporter._internal.shim._hotloop",
                             ["exporter/_internal/shim/_hotloop.c"], optional=True)])
