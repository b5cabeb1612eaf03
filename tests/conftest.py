"""Shared pytest set-up. Integration tests are marked ``integration`` and start real daemons."""
