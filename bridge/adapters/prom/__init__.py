"""Prometheus adapter: ``signals`` (the live reading and the client), ``history`` (the request
history and the daemon's own, pure) and ``types`` (what both share)."""
