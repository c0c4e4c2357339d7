"""The package's layers point one way (pyproject.toml's import-linter contracts)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_imports_follow_the_layers_and_have_no_cycles():
    lint_imports = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(lint_imports).exists():
        pytest.fail("lint-imports is not installed: pip install -e '.[test]'")
    result = subprocess.run([lint_imports], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
