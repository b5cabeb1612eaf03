"""``slurm.command_prefix`` through a remote shell: ``ssh`` joins the arguments after the host
with spaces and the far side runs that line with the user's shell (``$SHELL -c "<line>"``).
A fake ``ssh`` does exactly that with a real ``sh -c``; the Slurm commands behind it are
recorders printing the argv they received. Every argument must arrive intact (spaces, ``|``,
``;``, quotes, ``$(...)``) and nothing may run that the adapter did not ask for."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from bridge.adapters.slurm.cli import CliSlurm, SubprocessRunner

FAKE_SSH = """#!/bin/sh
# like ssh + sshd: options, the host, then the rest joined with spaces for the remote shell
while [ $# -gt 0 ]; do
  case "$1" in -o|-i|-p|-l) shift 2 ;; -*) shift ;; *) break ;; esac
done
shift
exec sh -c "$*"
"""

RECORDER = """#!{python}
import json, os, sys
print(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]))
if os.path.basename(sys.argv[0]) == "squeue":
    print("4242|slurm|gpu-bridge-hold:gpu-node-01")
"""


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture()
def remote(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """(prefix, env, marker): a fake ssh and recorders named scontrol/squeue/sbatch on PATH;
    ``marker`` exists afterwards only if something was injected."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = _exe(bin_dir / "ssh", FAKE_SSH)
    for name in ("scontrol", "squeue", "sbatch"):
        _exe(bin_dir / name, RECORDER.format(python=sys.executable))
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    return [str(ssh), "-o", "BatchMode=yes", "login1"], env, tmp_path / "PWNED"


def _hostile(marker: Path) -> list[str]:
    m = str(marker)
    return [
        f"$(touch {m})", f"`touch {m}`", f"a; touch {m}", f"a && touch {m}", f"a | tee {m}",
        f"a > {m}", "it's", 'say "hi"', "back\\slash", "*", "~", "", "  two  spaces ", "%i|%u", "#comment",
    ]


def test_every_argument_arrives_intact_through_ssh_and_a_real_shell(remote: tuple[list[str], dict[str, str], Path]) -> None:
    prefix, env, marker = remote
    runner = SubprocessRunner(env, prefix=prefix)
    argvs = [
        ["scontrol", "update", "NodeName=gpu-node-01", "State=DRAIN", "Reason=gpu-bridge: lent to Slurm (idle 900 s)"],
        ["squeue", "--noheader", "--states", "PENDING,RUNNING", "--format", "%i|%u"],
        ["sbatch", "--parsable", "--comment", "gpu-bridge hold: keeps this node for serving", "--wrap", "exec sleep infinity"],
        ["scontrol", "update", "NodeName=gpu-node-01", *[f"Reason={h}" for h in _hostile(marker)], *_hostile(marker)],
    ]
    for argv in argvs:
        res = runner(argv, 10)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout.splitlines()[0]) == argv
    assert not marker.exists(), "a shell metacharacter in an argument ran a command"


def test_the_adapter_reads_hold_jobs_through_ssh(remote: tuple[list[str], dict[str, str], Path]) -> None:
    # squeue --format %i|%u|%j: unquoted, the remote shell pipes squeue into a command "%u"
    prefix, env, _ = remote
    slurm = CliSlurm(command_prefix=prefix, env=env, timeout_s=10, hold_user="slurm")
    assert slurm._hold_ids(["gpu-node-01", "gpu-node-02"]) == {"gpu-node-01": ("4242",), "gpu-node-02": ()}


def test_a_local_prefix_gets_the_arguments_unquoted(tmp_path: Path) -> None:
    # no remote shell (nsenter, sudo, env): the argv goes straight to execve, quoting would corrupt it
    show = "import json, sys; print(json.dumps(sys.argv[1:]))"
    runner = SubprocessRunner({"PATH": "/usr/bin:/bin"}, prefix=[sys.executable, "-c", show])
    argv = ["scontrol", "update", "Reason=a b; it's"]
    assert json.loads(runner(argv, 10).stdout) == argv
