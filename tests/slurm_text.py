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
    """(returncode, stdout, stderr) of `squeue --noheader --name N[,N...] --partition P ... --format
    %i|%u[|%j]`: unlike its JSON, squeue's text output honours the filters."""
    args = [a for arg in argv[2:] for a in (arg.split("=", 1) if arg.startswith("--jobs=") else (arg,))]
    opts = {args[i][2:]: args[i + 1] for i in range(0, len(args) - 1, 2) if args[i].startswith("--")}
    if "jobs" in opts:  # the requeue's re-read: --jobs=ID,ID... --Format REQUEUE_CHECK_FORMAT
        assert opts.get("Format") == REQUEUE_CHECK_FORMAT, argv
        asked = opts["jobs"].split(",")
        every = {j.job_id: j for j in parse_jobs(squeue_json, active_only=False)}
        if len(asked) == 1 and asked[0] not in every:  # squeue fails only when the one job asked is unknown
            return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
        lines = [f"{j.job_id}|{j.state.upper()}|{j.partition}|{'2026-12-02T12:00:00' if j.preempt_time is not None else 'N/A'}|"
                 f"{j.restart_count}|\n" for j in every.values() if j.job_id in asked]
        return 0, "".join(lines), ""
    jobs = parse_jobs(squeue_json)
    fields = {"%i": "job_id", "%u": "user", "%j": "name"}
    out = ["|".join(getattr(j, fields[f]) for f in opts["format"].split("|")) for j in jobs
           if j.name in opts.get("name", j.name).split(",") and j.partition == opts.get("partition", j.partition)]
    return 0, "".join(f"{x}\n" for x in out), ""


def sdiag(t: float) -> tuple[int, str, str]:
    """(returncode, stdout, stderr) of `sdiag` at slurmctld's time ``t`` (its first lines, as
    Slurm 22.05.8 prints them)."""
    head = "*" * 55
    return 0, (f"{head}\nsdiag output at Fri Dec 04 15:57:34 2026 ({int(t)})\n"
               f"Data since      Thu Jan 01 00:00:00 1970 (0)\n{head}\nServer thread count:  3\n"), ""
