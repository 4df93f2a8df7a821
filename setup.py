"""Builds pzq's optional compiled hot path (pzq/_zmqfast.pyx); the rest is in setup.cfg.

The extension is optional: when Cython, a C compiler or the Python headers are missing, or the build fails
for any other reason, pzq installs without it and runs its pure-Python send/receive (pzq.zmqio says which
one runs; PZQ_PURE_PYTHON=1 forces the pure one).
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: pzq works without its compiled part."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # (setuptools raises several kinds: a missing compiler, a failed compile)
            self._skipped(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skipped(exc)

    def _skipped(self, exc):
        print(f"WARNING: pzq's compiled hot path was not built ({exc}); pzq runs pure Python", file=sys.stderr)


def extensions():
    if os.environ.get("PZQ_PURE_PYTHON") == "1":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("WARNING: Cython missing: pzq's compiled hot path is not built; pzq runs pure Python", file=sys.stderr)
        return []
    from setuptools import Extension

    try:
        return cythonize([Extension("pzq._zmqfast", ["pzq/_zmqfast.pyx"])], quiet=True)
    except Exception as exc:
        print(f"WARNING: pzq/_zmqfast.pyx did not compile ({exc}); pzq runs pure Python", file=sys.stderr)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
