"""systemd/gpu-bridge.service under a real systemd (252, Debian 12) booted by systemd-nspawn.

PID 1 on these machines is not systemd, so the unit is run by the systemd of a cached tree of
the host's own Debian release (gpu_bridge_lab.sandbox.nspawn; Debian 12 here; built once by debootstrap,
~80 s) booted with the host's network.
The shipped unit and environment file are installed unmodified (bind mounts) next to a config
for the sandbox that runs on the host (real Slurm 22.05, Prometheus, the Kubernetes API server,
the vLLM simulator); the project and its virtualenv are mounted in read-only. One drop-in runs
the daemon as root: the sandbox's SlurmUser, which the unit's comment names for a cluster
without slurmdbd (draining needs operator rights).

In order, on one daemon: ``systemctl start`` returns only once READY=1 came (Type=notify) and
the daemon leads and lends; journald holds its JSON events; the hardening holds in the running
service (read-only file system, no capabilities, seccomp, no new privileges) and
``systemd-analyze security`` agrees with the offline figure; a SIGSTOPped daemon is killed by
the watchdog within WatchdogSec and restarted, and the new one converges; ``systemctl stop``
releases the Lease and exits 0 within TimeoutStopSec. The timings are printed.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from bridge import wellknown
from gpu_bridge_lab.sandbox import nspawn
from gpu_bridge_lab.sandbox.daemon_config import daemon_identity, sandbox_config, write_config
from gpu_bridge_lab.sandbox.e2e import World, lease_identity, put_load, wait_until
from gpu_bridge_lab.sandbox.serving import serving_sandbox

# the first run builds the Debian 12 tree (about 80 s) inside the fixture
pytestmark = [pytest.mark.integration, pytest.mark.systemd, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "gpu-bridge.service"
ENV_FILE = ROOT / "systemd" / "gpu-bridge.env"
KUBECONFIG = "/etc/gpu-bridge/kubeconfig"  # the shipped environment file's value
NODES = 3
MIN_SERVING = 1
GRACE_S = 5
POD_START_S = 2.0
VENV_SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
OFFLINE_EXPOSURE = re.compile(r"Overall exposure level for gpu-bridge\.service: (\d+\.\d+) (\w+)")


def unit_setting(key: str) -> str:
    for line in UNIT.read_text().splitlines():
        if line.startswith(f"{key}="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{key}= not in the unit")


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(s|min)?", value)
    assert m, value
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1)


@dataclass
class Svc:
    """The booted container and the sandbox the service runs against."""

    box: nspawn.Container
    sb: Any
    world: World
    etc: Path
    shipped_security: str  # `systemd-analyze security gpu-bridge` of the shipped unit, loaded, before the drop-in

    def sh(self, *argv: str, check: bool = True, timeout_s: float = 120.0) -> str:
        return self.box.run(list(argv), check=check, timeout_s=timeout_s).stdout

    def show(self, *props: str) -> dict[str, str]:
        out = self.sh("systemctl", "show", "gpu-bridge", "-p", ",".join(props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def events(self) -> list[dict[str, Any]]:
        """The service's journal as JSON documents (one structlog event a line)."""
        out = []
        for line in self.sh("journalctl", "-u", "gpu-bridge", "-o", "cat", "--no-pager").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def lease_holder(self) -> str | None:
        api = k8s.CoordinationV1Api(self.world.api)
        lease = api.read_namespaced_lease(wellknown.LEASE_NAME, daemon_identity(self.sb)["lease_namespace"], _request_timeout=5)
        return lease.spec.holder_identity or None


def put(box: nspawn.Container, path: str, text: str, mode: str = "0644") -> None:
    box.run(["install", "-D", "-m", mode, "/dev/stdin", path], input=text)


def inline_ca(kubeconfig: Path) -> str:
    """The kubeconfig with its clusters' CA files put inline (certificate-authority-data)."""
    import base64

    import yaml

    doc = yaml.safe_load(kubeconfig.read_text())
    for c in doc.get("clusters") or []:
        path = c["cluster"].pop("certificate-authority", None)
        if path:
            c["cluster"]["certificate-authority-data"] = base64.b64encode(Path(path).read_bytes()).decode()
    return str(yaml.safe_dump(doc, sort_keys=False))


def env_file_for(sb: Any) -> str:
    """The shipped environment file with the sandbox's slurm.conf, as an operator edits it
    (KUBECONFIG stays the shipped /etc/gpu-bridge/kubeconfig)."""
    out = []
    for line in ENV_FILE.read_text().splitlines():
        if line.startswith("#SLURM_CONF="):
            line = f"SLURM_CONF={sb.slurm.slurm_conf}"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def svc() -> Iterator[Svc]:
    # the host's own Debian release: its python3 runs the venv, its Slurm clients match the
    # sandbox's controller (Debian 12 here: systemd 252, Python 3.11, Slurm 22.05)
    suite = nspawn.host_suite()
    tree = nspawn.ensure_tree(suite if suite in nspawn.TREES else "bookworm")
    run_dir = nspawn.cache_dir() / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o755)
    # not under /tmp: the unit's PrivateTmp= would hide it from the daemon
    d = Path(tempfile.mkdtemp(prefix="sd-", dir=run_dir))
    etc = Path(tempfile.mkdtemp(prefix="etc-", dir=run_dir))
    sb = serving_sandbox(d, nodes=NODES, grace_s=GRACE_S, pod_start_delay_s=POD_START_S, pod_grace_s=2,
                         shutdown_timeout_s=1)
    box = None
    world = None
    try:
        sb.up()
        world = World(sb)
        assert sb.vllm_url
        put_load(sb.vllm_url, {"rate": 2.0, "cv": 1.0})  # low load: lend down to MIN_SERVING
        etc.chmod(0o750)
        # the daemon's ServiceAccount (bound token), with the CA inline as an operator installs
        # it: the shipped unit's user cannot read the sandbox's PKI directory
        ident = daemon_identity(sb)
        (etc / "kubeconfig").write_text(inline_ca(Path(ident["kubeconfig"])))
        (etc / "kubeconfig").chmod(0o640)
        cfg = sandbox_config(prometheus_url=sb.prometheus_url, kubeconfig=KUBECONFIG, slurm_conf=sb.slurm.slurm_conf,
                             lease_namespace=ident["lease_namespace"],
                             grace_s=GRACE_S, cold_start_s=POD_START_S, min_serving=MIN_SERVING, scale_down_window_s=4,
                             min_lend_s=5)
        write_config(etc / "gpu-bridge.yaml", cfg).chmod(0o640)  # as the operator guide installs it
        (etc / "gpu-bridge.env").write_text(env_file_for(sb))
        (etc / "gpu-bridge.env").chmod(0o640)
        ro = [str(ROOT), f"{UNIT}:/etc/systemd/system/gpu-bridge.service", f"{etc}:/etc/gpu-bridge"]
        if not str(sys.prefix).startswith(str(ROOT) + "/"):
            ro.append(sys.prefix)
        box = nspawn.Container(tree, boot=True, binds=[str(d)], ro_binds=ro, log_path=d / "log" / "nspawn.log").start()
        tree_py = box.run(["python3", "-c", "import sys; print(*sys.version_info[:2])"]).stdout.split()
        assert tree_py == [str(sys.version_info.major), str(sys.version_info.minor)], (
            f"the tree's python3 ({'.'.join(tree_py)}) must match the project venv's minor version to use its packages"
        )
        # /opt/gpu-bridge/.venv as the unit expects it: the tree's python3 plus the project's
        # virtualenv packages (mounted read-only) and the console script.
        box.run(["python3", "-m", "venv", "--without-pip", "/opt/gpu-bridge/.venv"])
        site = box.run(["/opt/gpu-bridge/.venv/bin/python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
        put(box, f"{site.stdout.strip()}/gpu-bridge-project.pth", f"import site; site.addsitedir({str(VENV_SITE)!r})\n")
        put(box, "/opt/gpu-bridge/.venv/bin/gpu-bridge",
            "#!/opt/gpu-bridge/.venv/bin/python\nimport sys\nfrom bridge.cli import main\nsys.exit(main())\n", "0755")
        # the unit's own install steps: its user, and /etc/gpu-bridge root:gpu-bridge 0750/0640
        box.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "gpu-bridge"])
        gid = int(box.run(["id", "-g", "gpu-bridge"]).stdout)
        for f in (etc, *etc.iterdir()):
            os.chown(f, 0, gid)
        box.run(["systemctl", "daemon-reload"])
        shipped = box.run(["systemd-analyze", "security", "--no-pager", "gpu-bridge"]).stdout
        # a checkout (or venv) under /tmp is hidden by the unit's PrivateTmp=: a drop-in of its
        # own binds it back in (the test's install, kept when step 6 runs the unit as shipped)
        under_tmp = sorted({p for p in (str(ROOT), sys.prefix) if p == "/tmp" or p.startswith("/tmp/")})
        if under_tmp:
            put(box, "/etc/systemd/system/gpu-bridge.service.d/checkout.conf",
                "[Service]\n" + "".join(f"BindReadOnlyPaths={p}\n" for p in under_tmp))
        put(box, "/etc/systemd/system/gpu-bridge.service.d/sandbox.conf",
            "# The sandbox's SlurmUser is root; without slurmdbd the daemon runs as SlurmUser (see the unit).\n"
            "[Service]\nUser=root\nGroup=root\n")
        box.run(["systemctl", "daemon-reload"])
        yield Svc(box, sb, world, etc, shipped)
    finally:
        if box is not None:
            try:
                print(box.run(["journalctl", "-u", "gpu-bridge", "--no-pager", "-n", "40"], check=False).stdout[-4000:])
            except Exception:  # noqa: BLE001 - diagnostics only
                pass
            box.stop()
        if world is not None:
            world.close()
        sb.down()
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(etc, ignore_errors=True)


def test_unit_under_real_systemd(svc: Svc) -> None:
    w = svc.world
    watchdog_s = seconds(unit_setting("WatchdogSec"))
    restart_s = seconds(unit_setting("RestartSec"))
    stop_budget_s = seconds(unit_setting("TimeoutStopSec"))

    # 1. start returns only after READY=1 (Type=notify): the unit is active when it returns
    t0 = time.monotonic()
    svc.sh("systemctl", "start", "gpu-bridge", timeout_s=seconds(unit_setting("TimeoutStartSec")) + 10)
    start_s = time.monotonic() - t0
    st = svc.show("ActiveState", "SubState", "MainPID", "Type", "ExecMainStartTimestampMonotonic",
                  "ActiveEnterTimestampMonotonic", "StatusText", "NRestarts")
    assert (st["ActiveState"], st["SubState"], st["Type"]) == ("active", "running", "notify"), st
    ready_s = (int(st["ActiveEnterTimestampMonotonic"]) - int(st["ExecMainStartTimestampMonotonic"])) / 1e6
    assert 0 < ready_s <= start_s
    assert st["StatusText"] == "leading", st  # READY=1 came with the first tick's STATUS=
    system_log = svc.sh("journalctl", "-b", "--no-pager", "-o", "cat")
    complaints = [ln for ln in system_log.splitlines() if re.search(r"gpu-bridge\.service(\.d/\S+)?:\d+:", ln)]
    assert complaints == [], complaints  # systemd accepted every line of the unit
    pid1 = int(st["MainPID"])
    events = svc.events()
    names = [e.get("event") for e in events]
    assert "starting" in names, names[:20]

    # 2. it leads and acts: nodes are lent; its structured events are in the journal
    wait_until(lambda: list(w.phases().values()).count("lent") == NODES - MIN_SERVING, 90, "nodes to be lent")
    holder = svc.lease_holder()
    assert holder is not None
    events = svc.events()
    steps = [e for e in events if e.get("node") and e.get("phase")]
    assert steps, "journald holds events with node and phase"
    assert all("timestamp" in e and "level" in e for e in events)
    assert any(e.get("phase") == "lent" for e in steps)

    # 3. hardening holds in the running service
    status = svc.sh("cat", f"/proc/{pid1}/status")
    fields = dict(re.split(r":\s*", line, maxsplit=1) for line in status.splitlines() if ":" in line)
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2", fields
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0, fields
    # the service's view: its mount namespace, its uid, no capabilities (as the unit sets them)
    as_service = ["nsenter", "-t", str(pid1), "-m", "--", "setpriv", "--reuid=0", "--regid=0", "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    for target in ("/etc/gpu-bridge/x", "/opt/gpu-bridge/x", "/var/lib/x", "/usr/x", f"{svc.sb.dir}/x", "/x"):
        res = svc.box.run([*as_service, "touch", target], check=False)
        assert res.returncode != 0 and "Read-only file system" in res.stderr, (target, res.stderr)
    for hidden in ("/root", "/home"):
        res = svc.box.run([*as_service, "ls", hidden], check=False)
        assert res.returncode != 0 and "Permission denied" in res.stderr, (hidden, res)
    # its /tmp is private: a file made there is not in the container's /tmp
    svc.box.run([*as_service, "touch", "/tmp/gb-private-probe"])
    assert svc.box.run(["test", "-e", "/tmp/gb-private-probe"], check=False).returncode != 0
    # systemd-analyze security on the loaded unit agrees with the offline figure of the file:
    # the shipped unit as such (User=gpu-bridge), and as it runs here (the root drop-in)
    host_offline = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(UNIT)],
                                  capture_output=True, text=True, timeout=60, check=False).stdout
    m_ship, m_host = OFFLINE_EXPOSURE.search(svc.shipped_security), OFFLINE_EXPOSURE.search(host_offline)
    assert m_ship and m_host, (svc.shipped_security[-300:], host_offline[-300:])
    assert m_ship.group(1, 2) == m_host.group(1, 2) and m_ship.group(2) == "OK", (m_ship.group(0), m_host.group(0))
    security = svc.sh("systemd-analyze", "security", "--no-pager", "gpu-bridge")
    m = OFFLINE_EXPOSURE.search(security)
    assert m, security[-500:]
    live_exposure = float(m.group(1))
    offline = svc.sh("systemd-analyze", "security", "--offline=yes", "--no-pager", "/etc/systemd/system/gpu-bridge.service")
    m_off = OFFLINE_EXPOSURE.search(offline)
    assert m_off, offline[-500:]
    assert live_exposure == float(m_off.group(1)) and m.group(2) == "OK", (m.group(0), m_off.group(0))

    # 4. a stalled daemon: the watchdog kills it within WatchdogSec and it is restarted
    svc.sh("systemctl", "kill", "--kill-who=main", "--signal=SIGSTOP", "gpu-bridge")
    stopped_at = time.monotonic()

    def restarted() -> bool:
        s = svc.show("MainPID", "NRestarts", "ActiveState")
        return s["ActiveState"] == "active" and int(s["MainPID"]) not in (0, pid1) and int(s["NRestarts"]) >= 1

    wait_until(restarted, watchdog_s + restart_s + 60, "the watchdog to restart the daemon", poll_s=0.2)
    restart_total_s = time.monotonic() - stopped_at
    log = svc.sh("journalctl", "-u", "gpu-bridge", "--no-pager", "-o", "short-monotonic")
    assert "Watchdog timeout" in log, log[-2000:]
    kill_line = next(ln for ln in log.splitlines() if "Watchdog timeout" in ln)
    # short-monotonic stamps are CLOCK_MONOTONIC, the clock of time.monotonic() (one kernel)
    kill_after_s = float(kill_line.split("]")[0].strip("[ ")) - stopped_at
    assert 0 < kill_after_s <= watchdog_s + 1, kill_after_s  # killed within WatchdogSec of the stall
    assert "code=killed, status=6/ABRT" in log
    st2 = svc.show("MainPID", "NRestarts", "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    assert restart_total_s <= watchdog_s + restart_s + ready_s + 15, restart_total_s
    pid2 = int(st2["MainPID"])
    # the new daemon converges: it leads again and the pool stays lent down to MIN_SERVING
    # identity: hostname-pid-suffix (bridge.adapters.kube.lease.default_identity): the new process holds it
    ident = lease_identity(holder)
    assert ident is not None and ident[1] == pid1, holder
    wait_until(lambda: lease_identity(svc.lease_holder() or "") == (ident[0], pid2), 30, "the new daemon to take the Lease")
    wait_until(lambda: list(w.phases().values()).count("lent") == NODES - MIN_SERVING
               and all(p in ("lent", "serving") for p in w.phases().values()), 60, "phases to settle")
    ticks_after = [e for e in svc.events() if e.get("event") == "starting"]
    assert len(ticks_after) >= 2

    # 5. stop: SIGTERM, the Lease is released, exit 0 within TimeoutStopSec
    t1 = time.monotonic()
    svc.sh("systemctl", "stop", "gpu-bridge", timeout_s=stop_budget_s + 10)
    stop_s = time.monotonic() - t1
    st3 = svc.show("ActiveState", "Result", "ExecMainStatus", "ExecMainCode")
    assert st3["ActiveState"] == "inactive" and st3["Result"] == "success", st3
    assert st3["ExecMainStatus"] == "0", st3
    assert stop_s < stop_budget_s
    assert svc.lease_holder() is None, "the Lease is released on stop"
    assert any(e.get("event") == "lease_released" for e in svc.events())
    # 6. the unit exactly as shipped (User=gpu-bridge, no drop-in), in a dry run (that user has
    # no Slurm operator rights here): it starts, runs as that user and stops cleanly
    phases_before = w.phases()
    svc.sh("rm", "/etc/systemd/system/gpu-bridge.service.d/sandbox.conf")
    env = (svc.etc / "gpu-bridge.env").read_text().replace("\nGPU_BRIDGE_OPTS=\n", "\nGPU_BRIDGE_OPTS=--dry-run\n")
    assert "GPU_BRIDGE_OPTS=--dry-run" in env
    (svc.etc / "gpu-bridge.env").write_text(env)
    svc.sh("systemctl", "daemon-reload")
    svc.sh("systemctl", "start", "gpu-bridge", timeout_s=seconds(unit_setting("TimeoutStartSec")) + 10)
    st4 = svc.show("ActiveState", "MainPID", "StatusText", "User")
    assert st4["ActiveState"] == "active" and st4["User"] == "gpu-bridge", st4
    assert not st4["StatusText"].startswith("tick failed"), st4
    uid = svc.sh("id", "-u", "gpu-bridge").strip()
    status4 = svc.sh("cat", f"/proc/{st4['MainPID']}/status")
    assert re.search(rf"^Uid:\s+{uid}\s+{uid}\s+{uid}\s+{uid}$", status4, re.M), status4
    assert any(e.get("event") == "dry_run_mode" for e in svc.events())
    svc.sh("systemctl", "stop", "gpu-bridge", timeout_s=stop_budget_s + 10)
    st5 = svc.show("ActiveState", "Result", "ExecMainStatus")
    assert (st5["ActiveState"], st5["Result"], st5["ExecMainStatus"]) == ("inactive", "success", "0"), st5
    assert w.phases() == phases_before  # a dry run writes nothing
    print(f"\nsystemd {svc.sh('systemctl', '--version').split()[1]}: start-to-READY {ready_s:.2f} s "
          f"(systemctl start returned after {start_s:.2f} s); watchdog: SIGSTOP to restarted and READY "
          f"{restart_total_s:.1f} s, killed {kill_after_s:.1f} s after the stall (WatchdogSec {watchdog_s:g} s, "
          f"RestartSec {restart_s:g} s; pid {pid1} -> {pid2}); stop {stop_s:.2f} s (TimeoutStopSec {stop_budget_s:g} s); "
          f"security exposure at run time {live_exposure} {m.group(2)} as run (root drop-in; offline "
          f"{m_off.group(1)}), {m_ship.group(1)} {m_ship.group(2)} for the shipped unit (offline on the host {m_host.group(1)})")
