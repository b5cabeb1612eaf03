"""A scripted Slurm for unit tests of CliSlurm (bridge/adapters/slurm/cli.py): a CommandRunner
that records every argv (and its timeout) and answers each command by the newest rule matching
it. A rule matches by a prefix of the argv, or by a test of it; it answers with a result, or with
a function of the argv (a test's own small model of the cluster). ``on`` scripts a command's
answer or failure over what was scripted before; a command no rule matches fails the test,
unless the runner was given an ``otherwise`` answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bridge.adapters.slurm.cli import CommandResult

Answer = CommandResult | Callable[[list[str]], CommandResult]
Match = Sequence[str] | Callable[[list[str]], bool]

# the read-only commands CliSlurm runs: whole argvs, or their first two words
_READS: tuple[list[str], ...] = (["sinfo", "--json", "--Node"], ["squeue", "--json"], ["scontrol", "ping"],
                                 ["scontrol", "--oneliner"], ["squeue", "--noheader"], ["sdiag"])


class ScriptedSlurm:
    def __init__(self, *, otherwise: Answer | None = None) -> None:
        self.calls: list[list[str]] = []
        self.timeouts: list[float] = []
        self.otherwise = otherwise
        self._rules: list[tuple[Match, Answer]] = []

    def on(self, match: Match, answer: Answer) -> ScriptedSlurm:
        """Answer the commands ``match`` matches with ``answer``, over the rules given before."""
        self._rules.insert(0, (match, answer))
        return self

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        args = list(argv)
        self.calls.append(args)
        self.timeouts.append(timeout_s)
        answer = next((a for m, a in self._rules if (m(list(args)) if callable(m) else args[:len(m)] == list(m))),
                      self.otherwise)
        if answer is None:
            raise AssertionError(f"unexpected {args}")
        return answer(list(args)) if callable(answer) else answer

    def writes(self) -> list[list[str]]:
        """The calls that are not one of the reads CliSlurm makes."""
        return [c for c in self.calls if c[:2] not in _READS and c not in _READS]
