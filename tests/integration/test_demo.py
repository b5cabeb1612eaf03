"""`gpu-bridge demo --minutes 2` as a newcomer runs it (a subprocess), checked on its summary:
nodes were lent, jobs ran, at least one reclaim preempted jobs with requeue, requeued jobs ran
again, the PNG was written, and the sandbox was torn down with nothing left running."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


def _procs_naming(d: str) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if d in cmd:
            out.append(f"{pid}: {cmd[:120]}")
    return out


def test_demo_short_run_lends_reclaims_requeues_and_cleans_up() -> None:
    d = Path(tempfile.mkdtemp(prefix="gbdemo-", dir="/tmp"))
    d.chmod(0o755)  # munged (user munge) must reach the sandbox dir below it
    summary_path = d / "summary.json"
    png = d / "day.png"
    try:
        res = subprocess.run(
            [sys.executable, "-m", "bridge", "demo", "--dir", str(d / "sb"), "--minutes", "2",
             "--plot", str(png), "--summary-json", str(summary_path)],
            capture_output=True, text=True, timeout=280, check=False,
        )
        print(res.stdout[-6000:])
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        s = json.loads(summary_path.read_text())
        assert s["lends"] >= 1 and s["lent_gpu_hours_demo"] > 0, s
        assert s["jobs_started"] >= 2 and s["jobs_finished"] >= 1, s
        assert s["reclaims"] >= 1 and s["reclaims_with_jobs"] >= 1, s
        assert s["jobs_requeued"] >= 1, s
        assert s["jobs_requeued_resumed"] >= 1, s
        assert s["min_ready"] >= s["min_serving"], s
        assert s["latency_s"]["total_s"] is not None
        assert png.exists() and png.stat().st_size > 10_000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        for line in ("GPU-hours lent to Slurm", "jobs requeued", "reclaim: total", "SLO-violation minutes"):
            assert line in res.stdout
        assert "RECLAIM started" in res.stdout and "requeued (not lost)" in res.stdout
        # it ends with the research view's URL (gpu-bridge web, started with the daemon)
        assert res.stdout.rstrip().splitlines()[-1].startswith("look at: http://127.0.0.1:"), res.stdout[-500:]
        assert '"event": "web_listening"' in (d / "sb" / "web.log").read_text()
        state = json.loads((d / "sb" / "sandbox.json").read_text())
        assert state["status"] == "stopped"
        assert not (d / "sb" / "env").exists()
        assert _procs_naming(str(d / "sb")) == []
    finally:
        shutil.rmtree(d, ignore_errors=True)
