"""The fast decode (``load_records``: only the keys the parsers read) against the general one
(``load_json``: the whole document): the same records and the same errors on every recorded
output, and no parser reads a key the fast decode drops."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.adapters.slurm import parse
from bridge.errors import AdapterError

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
RECORDED = sorted(p.name for p in FIX.glob("*.json"))
BAD = ["", "[]", "{", '{"meta": {}}', '{"jobs": {"a": 1}}', '{"jobs": [1]}', '{"nodes": ["x"]}', '{"errors": ["boom"], "jobs": []}',
       '{"jobs": [{"job_id": NaN}]}', '{"sinfo": [{"nodes": {}}]}']


def _outcome(fn: Callable[[str], Any], text: str) -> object:
    try:
        return [dataclasses.astuple(r) for r in fn(text)]
    except AdapterError as e:
        return f"AdapterError: {e}"


@pytest.mark.parametrize("fn", [parse.parse_jobs, parse.parse_nodes], ids=["squeue", "sinfo"])
@pytest.mark.parametrize("text", [*RECORDED, *BAD])
def test_fast_decode_reads_what_the_whole_document_says(
    fn: Callable[[str], Any], text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = (FIX / text).read_text() if text in RECORDED else text
    fast = _outcome(fn, doc)
    monkeypatch.setattr(parse, "load_records", lambda t, what, lists: parse.load_json(t, what))
    assert fast == _outcome(fn, doc)


def test_the_fast_decode_is_taken_on_recorded_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the general path every time: a record keeps only the keys the parsers read."""
    monkeypatch.setattr(parse, "load_json", lambda t, what: pytest.fail("fell back to load_json"))
    doc = parse.load_records((FIX / "squeue-22.05.json").read_text(), "squeue --json", (("jobs", parse.JOB_KEYS),))
    assert doc["jobs"] and all(set(r) <= set(parse.JOB_KEYS) for r in doc["jobs"])
    assert parse.parse_nodes((FIX / "sinfo-24.11.json").read_text())


class _Reads(dict[str, Any]):
    """A record that notes every key a parser asks for."""

    asked: set[str] = set()

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return super().__contains__(key)

    def __getitem__(self, key: str) -> Any:
        self.asked.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)


@pytest.mark.parametrize(
    ("fixture", "list_key", "keys", "parse_list"),
    [
        ("squeue-22.05.json", "jobs", parse.JOB_KEYS, lambda recs: [parse._job(r, i) for i, r in enumerate(recs)]),
        ("squeue-24.11.json", "jobs", parse.JOB_KEYS, lambda recs: [parse._job(r, i) for i, r in enumerate(recs)]),
        ("sinfo-22.05.json", "nodes", parse.NODE_KEYS_22, lambda recs: [parse._node_22(r, i) for i, r in enumerate(recs)]),
        ("sinfo-24.11.json", "sinfo", parse.SINFO_KEYS_24, parse._nodes_24),
    ],
)
def test_parsers_read_only_the_kept_keys(fixture: str, list_key: str, keys: tuple[str, ...], parse_list: Any) -> None:
    _Reads.asked = set()
    recs = [_Reads(r) for r in json.loads((FIX / fixture).read_text())[list_key]]
    parse_list(recs)
    assert _Reads.asked and _Reads.asked <= set(keys), sorted(_Reads.asked - set(keys))
