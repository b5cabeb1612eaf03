"""``gpu-bridge web``: the researchers' read-only view of the pool, the outlook, their jobs and
the history (docs/researcher-guide.md). An entry point like ``cli.daemon``: it reads through the
same adapters and computes with the same pure functions as ``status`` and ``forecast``, under
an identity of its own that can read and never write."""
