"""`gpu-bridge demo`: the whole story on a local sandbox in a few minutes.

``shape`` (which day of the trace, how it is scaled: pure), ``jobs`` (the research job
stream), ``watch`` (samples both schedulers and the simulator; the daemon's JSON log),
``timeline`` (live progress line and event lines), ``report`` (summary and PNG),
``run`` (orchestration), ``cli`` (argparse).
"""
