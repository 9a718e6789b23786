"""ruri.ray without Ray (the default venv has none): importing it says what to install, and
the rest of the package does not need it. With Ray installed, tools/test-ray.sh tests it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed")
def test_import_without_ray_names_the_extra():
    code = ("import ruri\n"
            "try:\n"
            "    import ruri.ray\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n"
            "else:\n"
            "    print('imported')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("ImportError:"), out
    assert "pip install 'ruri[ray]'" in out
