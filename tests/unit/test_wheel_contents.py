"""The wheel an operator installs holds the product only (daemon, policy, lifecycle, adapters,
simulator, CLI): no sandbox, demo, fakes or fault injection, no plotting library unless asked
for; and ``gpu-bridge --help`` works in a fresh virtualenv that has only that wheel (and its
dependencies), listing no lab command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB_PATHS = ("bridge/sandbox/", "bridge/demo/", "bridge/faults.py", "bridge/adapters/fakes.py", "bridge/adapters/slurm/fake.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # from the tracked files only: a stale build/ directory in a work tree would leak old modules
    src = tmp_path_factory.mktemp("src")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                   check=True, timeout=300, capture_output=True)
    (whl,) = out.glob("gpu_bridge-*.whl")
    return whl


def test_the_wheel_holds_only_the_product(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"bridge", next(t for t in tops if t.endswith(".dist-info"))}, tops
    assert not [n for n in names if n.startswith(LAB_PATHS)]
    for must in ("bridge/daemon.py", "bridge/policy/plan.py", "bridge/lifecycle.py", "bridge/adapters/slurm/cli.py",
                 "bridge/simulate/engine.py", "bridge/cli/__init__.py", "bridge/data/traces/servegen-m-large.csv"):
        assert must in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    mpl = [line for line in meta.splitlines() if line.startswith("Requires-Dist: matplotlib")]
    assert mpl and all('extra == "plot"' in line for line in mpl), mpl


@pytest.mark.slow
def test_help_works_from_the_wheel_alone_and_lists_no_lab_command(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    # without PYTHONPATH: a checkout on it (its egg-info) makes pip see the project installed already
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=600, env=alone)
    assert pip.returncode == 0, pip.stderr[-2000:]
    r = subprocess.run([str(env_dir / "bin" / "gpu-bridge"), "--help"], capture_output=True, text=True, timeout=60, env=alone)
    assert r.returncode == 0, r.stderr
    commands = r.stdout.split("positional arguments:")[1].split("options:")[0]
    for cmd in ("run", "status", "simulate", "check-config", "plan"):
        assert f"\n    {cmd} " in commands or f"\n    {cmd}\n" in commands, cmd
    assert "sandbox" not in commands and "demo" not in commands
    # the lab's modules are not importable there
    probe = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import gpu_bridge_lab"], capture_output=True, text=True,
                           timeout=60, env=alone)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr
