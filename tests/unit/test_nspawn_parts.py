"""gpu_bridge_lab.sandbox.nspawn without booting anything: where a tree is cached (keyed by its suite and
package list), which mirror debootstrap uses (the machine's own), and the nspawn argv."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.errors import SandboxError
from gpu_bridge_lab.sandbox import nspawn

DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822_skips_security_and_comments(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(DEB822)
    assert nspawn.debian_mirror(tmp_path / "debian.sources", tmp_path / "none") == "http://mirror.example/debian"


def test_mirror_security_first_still_picks_the_main_archive(tmp_path: Path) -> None:
    first, second = DEB822.split("\n\n")
    (tmp_path / "debian.sources").write_text(second + "\n\n" + first)
    assert nspawn.debian_mirror(tmp_path / "debian.sources", tmp_path / "none") == "http://mirror.example/debian"


def test_mirror_from_one_line_sources_list_then_default(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "deb http://sec.example/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://old.example/debian bookworm main\n"
    )
    assert nspawn.debian_mirror(tmp_path / "none", tmp_path / "sources.list") == "http://old.example/debian"
    assert nspawn.debian_mirror(tmp_path / "none", tmp_path / "none2") == nspawn.DEFAULT_MIRROR


def test_tree_key_follows_suite_and_package_set_only() -> None:
    a = nspawn.tree_key("trixie", ["munge", "slurmd"])
    assert a == nspawn.tree_key("trixie", ["slurmd", "munge", "munge"])
    assert a != nspawn.tree_key("trixie", ["munge", "slurmd", "slurmctld"])
    assert a != nspawn.tree_key("bookworm", ["munge", "slurmd"])


def test_tree_path_under_the_cache_dir() -> None:
    env = {"GPU_BRIDGE_CACHE": "/srv/cache"}
    p = nspawn.tree_path("bookworm", environ=env)
    assert p.parent == Path("/srv/cache/trees")
    assert p.name == f"bookworm-{nspawn.tree_key('bookworm', nspawn.TREES['bookworm'])}"
    assert nspawn.cache_dir({}) == Path("/var/cache/gpu-bridge")


def test_unknown_suite_is_refused() -> None:
    with pytest.raises(SandboxError, match="unknown tree 'sid'"):
        nspawn.ensure_tree("sid")


def test_container_argv_and_prefix() -> None:
    c = nspawn.Container(Path("/t"), binds=["/tmp"], ro_binds=["/src:/opt/src"], boot=True)
    argv = c.argv()
    assert argv[:2] == ["systemd-nspawn", "--quiet"]
    for flag in ("--register=no", "--keep-unit", "--volatile=overlay", "--bind=/tmp", "--bind-ro=/src:/opt/src"):
        assert flag in argv
    assert argv[-1] == "--boot"
    assert nspawn.Container(Path("/t")).argv()[-3:] == ["--as-pid2", "/bin/sleep", "infinity"]
    with pytest.raises(SandboxError, match="not started"):
        _ = c.prefix
    c.leader = 4242
    assert c.prefix[:3] == ["nsenter", "-t", "4242"] and c.prefix[-1] == "--"


def test_host_suite_from_os_release(tmp_path: Path) -> None:
    f = tmp_path / "os-release"
    f.write_text('PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nVERSION_CODENAME=trixie\nID=debian\n')
    assert nspawn.host_suite(f) == "trixie"
    f.write_text("ID=debian\n")
    assert nspawn.host_suite(f) is None
    assert nspawn.host_suite(tmp_path / "absent") is None
