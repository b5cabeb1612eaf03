"""Slurm's text answers derived from recorded JSON, for fake command runners: what
`scontrol --oneliner show node NAME` and filtered `squeue --noheader` print for the same
cluster state (the Slurm adapter's cheap single-node reads before each write)."""

from __future__ import annotations

from collections.abc import Sequence

from bridge.adapters.slurm.parse import REQUEUE_CHECK_FORMAT, parse_jobs, parse_nodes


def scontrol_node(sinfo_json: str, name: str) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of `scontrol --oneliner show node NAME`."""
    nodes = {n.name: n for n in parse_nodes(sinfo_json)}
    n = nodes.get(name)
    if n is None:
        return 1, "", f"Node {name} not found\n"
    state = n.state.upper() + ("*" if not n.responding else "")
    state += "".join(f"+{f}" for f in sorted(n.flags - {"NOT_RESPONDING"}))
    line = f"NodeName={n.name} Arch=x86_64 CoresPerSocket=1 Gres=gpu:{n.gpus} State={state} Partitions=preempt"
    if n.reason:
        line += f" Reason={n.reason} [{n.reason_user or 'root'}@2026-12-02T12:00:00]"
    return 0, line + "\n", ""


def squeue_filtered(squeue_json: str, argv: Sequence[str]) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of `squeue --noheader --name N --partition P ... --format %i|%u`:
    unlike its JSON, squeue's text output honours the filters."""
    args = list(argv[2:])
    opts = {args[i][2:]: args[i + 1] for i in range(0, len(args) - 1, 2) if args[i].startswith("--")}
    if "jobs" in opts:  # the requeue's re-read of one job: --jobs ID --Format REQUEUE_CHECK_FORMAT
        assert opts.get("Format") == REQUEUE_CHECK_FORMAT, argv
        job = {j.job_id: j for j in parse_jobs(squeue_json, active_only=False)}.get(opts["jobs"])
        if job is None:
            return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
        preempt = "2026-12-02T12:00:00" if job.preempt_time is not None else "N/A"
        return 0, f"{job.job_id}|{job.state.upper()}|{job.partition}|{preempt}|{job.restart_count}|\n", ""
    jobs = parse_jobs(squeue_json)
    out = [f"{j.job_id}|{j.user}" for j in jobs
           if j.name == opts.get("name", j.name) and j.partition == opts.get("partition", j.partition)]
    return 0, "".join(f"{x}\n" for x in out), ""


def sdiag(t: float) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of `sdiag` at slurmctld's time ``t`` (its first lines, as
    Slurm 22.05.8 prints them)."""
    head = "*" * 55
    return 0, (f"{head}\nsdiag output at Fri Dec 04 15:57:34 2026 ({int(t)})\n"
               f"Data since      Thu Jan 01 00:00:00 1970 (0)\n{head}\nServer thread count:  3\n"), ""
