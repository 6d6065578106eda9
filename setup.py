"""Builds the optional native record walk (commitlog/_scan.c). Metadata lives in setup.cfg.

The extension is optional: when no C compiler is present the install still succeeds and
commitlog.scan falls back to its pure-Python walk (same results, slower)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("commitlog._scan", sources=["commitlog/_scan.c"], optional=True, extra_compile_args=["-O2"]),
    ]
)
