"""The product's static contracts, run with the suite so CI enforces them: ``mypy --strict``
over the product package (settings in pyproject's [tool.mypy]) and the import contracts
(pyproject's [tool.importlinter]: a pure decision core, adapters as leaves, the product never
importing the lab)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_mypy_strict_is_clean_on_the_product() -> None:
    r = _run([sys.executable, "-m", "mypy", "--no-error-summary"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_fakes_implement_the_adapters_protocols() -> None:
    """The lab's fakes are checked (``--strict``) against ``bridge.adapters.protocols``: a
    signature drifting from the contract (``_conforms`` in each fake) fails here; the behaviour
    is held to the real adapters by tests/contract/test_fake_parity.py."""
    r = _run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "lab/gpu_bridge_lab/fakes"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_contracts_hold() -> None:
    r = _run([str(BIN / "lint-imports"), "--no-cache"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout
