"""No shell anywhere in bridge/ or scripts/: subprocesses are argv lists (the Slurm adapter's
rule, enforced for the whole tree). Checked on the syntax tree, so a comment or a string that
mentions ``shell=True`` does not count, and an alias (``import os as o; o.system``) does."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_CALLS = {
    ("os", "system"),
    ("os", "popen"),
    ("os", "spawnl"), ("os", "spawnlp"), ("os", "spawnv"), ("os", "spawnvp"),
    ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"),
    ("commands", "getoutput"),
    ("commands", "getstatusoutput"),
}


def python_files() -> list[Path]:
    files = [f for top in ("bridge", "lab", "scripts") for f in sorted((ROOT / top).rglob("*.py"))]
    return [f for f in files if "__pycache__" not in f.parts]


def _aliases(tree: ast.AST) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """Module aliases (``import os as o`` -> o: os) and imported names
    (``from os import system as run`` -> run: (os, system))."""
    modules: dict[str, str] = {}
    names: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                modules[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = (node.module, a.name)
    return modules, names


def violations(source: str, filename: str = "<src>") -> list[str]:
    tree = ast.parse(source, filename=filename)
    modules, names = _aliases(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        where = f"{filename}:{node.lineno}"
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                found.append(f"{where}: shell={ast.unparse(kw.value)}")
        target: tuple[str, str] | None = None
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            target = (modules.get(f.value.id, f.value.id), f.attr)
        elif isinstance(f, ast.Name) and f.id in names:
            target = names[f.id]
        if target in FORBIDDEN_CALLS:
            found.append(f"{where}: {target[0]}.{target[1]}()")
    return found


def test_the_scan_sees_files() -> None:
    files = python_files()
    assert any(f.name == "cli.py" and "slurm" in f.parts for f in files)
    assert any(f.parent.name == "scripts" for f in files)


def test_no_shell_in_bridge_or_scripts() -> None:
    found: list[str] = []
    for path in python_files():
        found += violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not found, "shell use found:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "src",
    [
        "import subprocess\nsubprocess.run('ls', shell=True)\n",
        "import subprocess as sp\nsp.Popen(['ls'], shell=1)\n",
        "import subprocess\nflag = True\nsubprocess.call('ls', shell=flag)\n",
        "import os\nos.system('ls')\n",
        "import os as o\no.popen('ls')\n",
        "from os import system as run\nrun('ls')\n",
        "from subprocess import getoutput\ngetoutput('ls')\n",
        "import subprocess\nsubprocess.getstatusoutput('ls')\n",
    ],
)
def test_the_scan_catches(src: str) -> None:
    assert violations(src)


@pytest.mark.parametrize(
    "src",
    [
        "# subprocess.run('ls', shell=True)\n",
        "doc = 'never os.system() or shell=True'\n",
        "import subprocess\nsubprocess.run(['ls'], shell=False, timeout=5)\n",
    ],
)
def test_comments_strings_and_shell_false_do_not_count(src: str) -> None:
    assert not violations(src)
