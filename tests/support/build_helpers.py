"""The build helpers (build_helpers/*.py at the top of the checkout: setup.py's and
CMakeLists.txt's, not part of the installed package), loaded by path as setup.py loads them."""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def path(name: str) -> str:
    return os.path.join(ROOT, "build_helpers", name + ".py")


def load(name: str):
    """build_helpers/<name>.py as a module (loaded once per test process)."""
    key = "_paged_attn_build_" + name
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path(name))
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[key]
