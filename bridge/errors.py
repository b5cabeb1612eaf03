"""gpu-bridge's own error hierarchy, so callers catch intent, not library exceptions."""

from __future__ import annotations


class BridgeError(Exception):
    """Base of every error gpu-bridge raises on purpose."""


class ConfigError(BridgeError):
    """The configuration is invalid. ``problems`` lists every problem found, each naming
    the file, the key path, the bad value and what was expected."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class AdapterError(BridgeError):
    """An external system (Slurm, Kubernetes, Prometheus) failed or answered garbage.
    Never read as "empty" or "drained": callers fail closed."""

    def __init__(self, system: str, message: str) -> None:
        self.system = system
        super().__init__(f"{system}: {message}")


class SandboxError(BridgeError):
    """The local sandbox could not be started or stopped; the message carries the
    relevant daemon log lines."""
