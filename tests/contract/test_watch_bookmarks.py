"""Watch bookmarks: the real apiserver sends a watch's first BOOKMARK about a minute after it
opens (none earlier, whatever the timeout: probed with 3, 5 and 10 s). The watch is opened
when the first contract test starts (``bookmark_watch`` in conftest.py, read in a thread) and
checked here, last of the contract tests, so the suite does not wait that minute."""

from __future__ import annotations

from kube_contract import BookmarkWatch


def test_watch_bookmarks(bookmark_watch: BookmarkWatch) -> None:
    w = bookmark_watch
    w.thread.join(80)
    assert w.error is None, w.error
    marks = [ev for ev in w.events if ev["type"] == "BOOKMARK"]
    assert marks, f"no BOOKMARK in {[ev['type'] for ev in w.events]}"
    assert int(marks[0]["object"]["metadata"]["resourceVersion"]) >= int(w.rv)
    assert marks[0]["object"]["kind"] == "ConfigMap"
