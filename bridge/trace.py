"""Load traces: request arrival rate per fixed window (the ServeGen CSV format).

Used by the vLLM simulator (arrivals in the sandbox) and the offline simulator. The
shipped trace is ``bridge/data/traces/servegen-m-large.csv`` (see its README for source
and licence).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from bridge.errors import ConfigError

COLUMNS = ("window_start_s", "rate_req_per_s", "cv", "clients_active")


def default_trace_path() -> Path:
    """The trace shipped inside the package."""
    return Path(str(resources.files("bridge") / "data" / "traces" / "servegen-m-large.csv"))


@dataclass(frozen=True, slots=True)
class Trace:
    """A piecewise-constant arrival rate: window ``i`` starts at ``starts_s[i]``.

    ``cv`` is the coefficient of variation of inter-arrival times inside each window
    (burstiness); 1.0 is Poisson.
    """

    starts_s: tuple[float, ...]
    rates: tuple[float, ...]
    cvs: tuple[float, ...]
    window_s: float
    source: str = ""

    @property
    def duration_s(self) -> float:
        return self.starts_s[-1] + self.window_s - self.starts_s[0]

    @property
    def peak_rate(self) -> float:
        return max(self.rates)

    def index_at(self, t_s: float) -> int:
        """Window index at trace time ``t_s`` (clamped; wraps around past the end)."""
        rel = (t_s - self.starts_s[0]) % self.duration_s
        return min(int(rel // self.window_s), len(self.rates) - 1)

    def rate_at(self, t_s: float) -> float:
        return self.rates[self.index_at(t_s)]

    def cv_at(self, t_s: float) -> float:
        return self.cvs[self.index_at(t_s)]

    def scaled(self, factor: float) -> "Trace":
        """The same shape with every rate multiplied by ``factor``."""
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"trace scale factor must be a positive number, got {factor!r}")
        return Trace(self.starts_s, tuple(r * factor for r in self.rates), self.cvs, self.window_s, self.source)


MAX_TRACE_BYTES = 256 * 1024 * 1024


def load_trace(path: str | Path | None = None) -> Trace:
    """Read a trace CSV; every problem is reported with file, line and column."""
    p = Path(path) if path is not None else default_trace_path()
    problems: list[str] = []
    starts: list[float] = []
    rates: list[float] = []
    cvs: list[float] = []
    try:
        with p.open("rb") as fh:  # bounded: /dev/zero was read until memory ran out (MemoryError)
            data = fh.read(MAX_TRACE_BYTES + 1)
        if len(data) > MAX_TRACE_BYTES:
            raise ConfigError([f"{p}: larger than {MAX_TRACE_BYTES // 1024 // 1024} MiB; expected a CSV trace "
                               "(a year of 1-minute windows is about 25 MiB)"])
        text = data.decode("utf-8-sig")  # a byte-order mark (a spreadsheet's export) is not part of the header
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read trace: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{p}: not a UTF-8 text file (byte {exc.start}: {exc.reason}); expected a CSV trace"]) from None
    reader = csv.DictReader(text.splitlines(), skipinitialspace=True)  # "a, b" as "a,b"
    missing = [c for c in COLUMNS[:2] if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError([f"{p}: missing column(s) {', '.join(missing)}; expected header {','.join(COLUMNS)}"])
    for lineno, row in enumerate(reader, start=2):
        values: dict[str, float] = {}
        for col, default in (("window_start_s", None), ("rate_req_per_s", None), ("cv", 1.0)):
            raw = row.get(col)
            if raw in (None, "") and default is not None:
                values[col] = default
                continue
            try:
                v = float(raw)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                problems.append(f"{p}:{lineno}: {col}: expected a number, got {raw!r}")
                continue
            if not math.isfinite(v) or v < 0:
                problems.append(f"{p}:{lineno}: {col}: expected a finite number >= 0, got {raw!r}")
                continue
            values[col] = v
        if len(values) == 3:
            starts.append(values["window_start_s"])
            rates.append(values["rate_req_per_s"])
            cvs.append(values["cv"])
    if not problems and len(starts) < 2:
        problems.append(f"{p}: need at least 2 windows, got {len(starts)}")
    if not problems:
        window = starts[1] - starts[0]
        if window <= 0:
            problems.append(f"{p}: window_start_s must increase, got {starts[0]} then {starts[1]}")
        else:
            for i in range(1, len(starts)):
                if not math.isclose(starts[i] - starts[i - 1], window, rel_tol=1e-6):
                    problems.append(
                        f"{p}:{i + 2}: window_start_s: windows must be evenly spaced ({window:g} s), "
                        f"got {starts[i - 1]:g} then {starts[i]:g}"
                    )
                    break
    if problems:
        raise ConfigError(problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else []))
    return Trace(tuple(starts), tuple(rates), tuple(cvs), starts[1] - starts[0], str(p))
