"""Store and REST semantics of the sandbox Kubernetes API server, without HTTP."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from gpu_bridge_lab.sandbox.kube import resources as R
from gpu_bridge_lab.sandbox.kube.api import Api, Request, Settings, parse_target
from gpu_bridge_lab.sandbox.kube.store import ApiError, Store

NODES = R.core("nodes")
CMS = R.core("configmaps")
DEPLOY = R.get("apps", "deployments")


def call(api: Api, method: str, path: str, body: Any = None, ct: str = "application/json",
         **query: str) -> tuple[int, Any]:
    parts = [p for p in path.split("/") if p]
    _, _, target, _ = parse_target(parts)
    req = Request(method, path, dict(query), {"content-type": ct},
                  json.dumps(body).encode() if body is not None else b"")
    try:
        if method == "GET":
            resp = api.list(target, req) if not target.name else api.get(target, req)
        elif method == "POST":
            resp = api.create(target, req)
        elif method == "PUT":
            resp = api.update(target, req)
        elif method == "PATCH":
            resp = api.patch(target, req)
        else:
            resp = api.delete(target, req)
    except ApiError as exc:
        return exc.code, exc.status()
    return resp.code, json.loads(resp.body)


@pytest.fixture
def api() -> Api:
    return Api(Store(event_log_size=1000), Settings(bookmark_interval_s=0.05))


def test_create_assigns_metadata_and_a_global_rv(api: Api) -> None:
    code, n = call(api, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
    assert code == 201 and n["kind"] == "Node" and n["apiVersion"] == "v1"
    assert n["metadata"]["uid"] and n["metadata"]["creationTimestamp"]
    code, cm = call(api, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"generateName": "x-"}})
    assert code == 201 and cm["metadata"]["name"].startswith("x-")
    assert int(cm["metadata"]["resourceVersion"]) == int(n["metadata"]["resourceVersion"]) + 1
    code, body = call(api, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
    assert code == 409 and body["reason"] == "AlreadyExists"
    code, body = call(api, "POST", "/api/v1/namespaces/nope/configmaps", {"metadata": {"name": "a"}})
    assert code == 404 and body["message"] == 'namespaces "nope" not found'
    code, body = call(api, "POST", "/api/v1/nodes", {"metadata": {"name": "Bad_Name"}})
    assert code == 422 and body["reason"] == "Invalid"


def test_put_conflict_noop_and_status_ignored(api: Api) -> None:
    _, n = call(api, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "1"}}})
    rv = n["metadata"]["resourceVersion"]
    assert n["status"]["capacity"] == {"cpu": "1"}  # node create keeps status, as the real API
    code, same = call(api, "PUT", "/api/v1/nodes/n1", n)
    assert code == 200 and same["metadata"]["resourceVersion"] == rv  # no-op keeps rv
    n["spec"]["unschedulable"] = True
    n["status"] = {"capacity": {"cpu": "99"}}
    code, upd = call(api, "PUT", "/api/v1/nodes/n1", n)
    assert code == 200 and upd["status"]["capacity"] == {"cpu": "1"} and upd["spec"]["unschedulable"] is True
    code, body = call(api, "PUT", "/api/v1/nodes/n1", n)  # n still carries the old rv
    assert code == 409 and body["reason"] == "Conflict"
    code, st = call(api, "PATCH", "/api/v1/nodes/n1/status", {"status": {"capacity": {"cpu": "2"}},
                                                               "spec": {"unschedulable": False}},
                    "application/merge-patch+json")
    assert code == 200 and st["status"]["capacity"] == {"cpu": "2"} and st["spec"]["unschedulable"] is True


def test_generation_bumps_on_spec_changes_only(api: Api) -> None:
    dep = {"metadata": {"name": "d"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                                               "template": {"metadata": {"labels": {"a": "b"}},
                                                            "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    _, d = call(api, "POST", "/apis/apps/v1/namespaces/default/deployments", dep)
    assert d["metadata"]["generation"] == 1 and d["status"] == {}
    _, d = call(api, "PATCH", "/apis/apps/v1/namespaces/default/deployments/d", {"metadata": {"labels": {"x": "1"}}},
                "application/strategic-merge-patch+json")
    assert d["metadata"]["generation"] == 1
    _, d = call(api, "PATCH", "/apis/apps/v1/namespaces/default/deployments/d", {"spec": {"replicas": 3}},
                "application/strategic-merge-patch+json")
    assert d["metadata"]["generation"] == 2
    bad = dict(dep, metadata={"name": "e"})
    bad["spec"] = dict(dep["spec"], selector={"matchLabels": {"a": "other"}})
    code, body = call(api, "POST", "/apis/apps/v1/namespaces/default/deployments", bad)
    assert code == 422 and "selector" in body["message"]


def test_lease_put_rules(api: Api) -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/l"
    code, lease = call(api, "PUT", path, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    assert code == 201
    lease["metadata"].pop("resourceVersion")
    code, body = call(api, "PUT", path, lease)
    assert code == 422 and "resourceVersion" in body["message"]


def test_list_paging_and_selectors(api: Api) -> None:
    for i in range(5):
        call(api, "POST", "/api/v1/namespaces/default/configmaps",
             {"metadata": {"name": f"c{i}", "labels": {"odd": str(i % 2)}}})
    code, page = call(api, "GET", "/api/v1/namespaces/default/configmaps", limit="2", labelSelector="odd=0")
    assert [i["metadata"]["name"] for i in page["items"]] == ["c0", "c2"]
    assert page["kind"] == "ConfigMapList" and page["metadata"]["remainingItemCount"] == 1
    _, page2 = call(api, "GET", "/api/v1/namespaces/default/configmaps", limit="2", labelSelector="odd=0",
                    **{"continue": page["metadata"]["continue"]})
    assert [i["metadata"]["name"] for i in page2["items"]] == ["c4"] and "continue" not in page2["metadata"]
    code, body = call(api, "GET", "/api/v1/namespaces/default/configmaps", fieldSelector="spec.x=1")
    assert code == 400


def test_delete_preconditions_and_namespace_cascade(api: Api) -> None:
    call(api, "POST", "/api/v1/namespaces", {"metadata": {"name": "t"}})
    _, cm = call(api, "POST", "/api/v1/namespaces/t/configmaps", {"metadata": {"name": "a"}})
    code, _ = call(api, "DELETE", "/api/v1/namespaces/t/configmaps/a", {"preconditions": {"resourceVersion": "1"}})
    assert code == 409
    code, body = call(api, "DELETE", "/api/v1/namespaces/t", None)
    assert code == 200 and body["status"] == "Success"
    assert api.store.get_entry(CMS, "t", "a") is None


def _watch(api: Api, path: str, **query: str) -> list[dict[str, Any]]:
    _, _, target, _ = parse_target([p for p in path.split("/") if p])
    req = Request("GET", path, {"watch": "true", **query}, {})
    return [json.loads(c) for c in api.watch(target, req) if c]


def test_watch_replay_rv_semantics_and_timeout(api: Api) -> None:
    _, a = call(api, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "a"}})
    rv = a["metadata"]["resourceVersion"]
    call(api, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "b"}})
    evs = _watch(api, "/api/v1/namespaces/default/configmaps", resourceVersion="0", timeoutSeconds="0.1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [("ADDED", "a"), ("ADDED", "b")]
    evs = _watch(api, "/api/v1/namespaces/default/configmaps", resourceVersion=rv, timeoutSeconds="0.1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [("ADDED", "b")]


def test_watch_of_compacted_rv_is_410_and_bookmarks(api: Api) -> None:
    _, a = call(api, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "a"}})
    rv = a["metadata"]["resourceVersion"]
    call(api, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "b"}})
    api.store.compact()
    evs = _watch(api, "/api/v1/namespaces/default/configmaps", resourceVersion=rv, timeoutSeconds="1")
    assert len(evs) == 1 and evs[0]["type"] == "ERROR" and evs[0]["object"]["code"] == 410
    evs = _watch(api, "/api/v1/namespaces/default/configmaps", resourceVersion=str(api.store.rv),
                 timeoutSeconds="0.3", allowWatchBookmarks="true")
    assert evs and all(e["type"] == "BOOKMARK" for e in evs)
    assert evs[0]["object"]["metadata"]["resourceVersion"] == str(api.store.rv)


def test_event_log_size_compacts_old_events() -> None:
    store = Store(event_log_size=10)
    for i in range(30):
        store.create(CMS, {"metadata": {"name": f"c{i}", "namespace": "default"}})
    assert len(store.log) == 10 and store.compacted_rv == store.rv - 10


def test_watch_selector_transitions(api: Api) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    out: list[dict[str, Any]] = []
    t = threading.Thread(target=lambda: out.extend(_watch(api, path, resourceVersion=str(api.store.rv),
                                                          labelSelector="s=y", timeoutSeconds="0.5")))
    t.start()
    import time
    time.sleep(0.1)
    call(api, "POST", path, {"metadata": {"name": "a", "labels": {"s": "n"}}})
    call(api, "PATCH", path + "/a", {"metadata": {"labels": {"s": "y"}}}, "application/merge-patch+json")
    call(api, "PATCH", path + "/a", {"metadata": {"labels": {"s": "n"}}}, "application/merge-patch+json")
    t.join()
    assert [e["type"] for e in out] == ["ADDED", "DELETED"]
    assert out[1]["object"]["metadata"]["labels"] == {"s": "y"}  # the last state that matched


def test_discovery_documents() -> None:
    core = R.resource_list("", "v1")
    assert core is not None
    ev = next(r for r in core["resources"] if r["name"] == "pods/eviction")
    assert (ev["group"], ev["version"], ev["kind"]) == ("policy", "v1", "Eviction")
    apps = R.resource_list("apps", "v1")
    assert apps is not None
    sc = next(r for r in apps["resources"] if r["name"] == "deployments/scale")
    assert (sc["group"], sc["version"], sc["kind"]) == ("autoscaling", "v1", "Scale")
    groups = {g["name"] for g in R.api_group_list()["groups"]}
    assert {"apps", "policy", "coordination.k8s.io", "events.k8s.io"} <= groups


def _fields(buf: bytes) -> list[tuple[int, bytes]]:
    """Protobuf wire format, length-delimited fields only: [(field number, payload)]."""
    out, i = [], 0
    while i < len(buf):
        key, i = _uvarint(buf, i)
        assert key & 7 == 2, f"wire type {key & 7}"
        n, i = _uvarint(buf, i)
        out.append((key >> 3, buf[i : i + n]))
        i += n
    return out


def _uvarint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def test_openapi_v2_is_an_empty_swagger_document_in_json_and_protobuf() -> None:
    # kubectl before 1.27 (Debian 12: 1.20) validates create -f against /openapi/v2 (protobuf)
    assert R.openapi_v2_json() == {"swagger": "2.0", "info": {"title": R.OPENAPI_V2_TITLE,
                                                              "version": R.OPENAPI_V2_VERSION}, "paths": {}}
    doc = dict(_fields(R.openapi_v2_protobuf()))  # gnostic openapi_v2.Document
    assert doc[1] == b"2.0" and doc[8] == b""  # swagger, paths (empty: no schema, no validation)
    assert dict(_fields(doc[2])) == {1: R.OPENAPI_V2_TITLE.encode(), 2: R.OPENAPI_V2_VERSION.encode()}


def test_noop_write_emits_no_event(api: Api) -> None:
    call(api, "POST", "/api/v1/nodes", {"metadata": {"name": "n1", "labels": {"a": "1"}}})
    rv, n_events = api.store.rv, len(api.store.log)
    code, _ = call(api, "PATCH", "/api/v1/nodes/n1", {"metadata": {"labels": {"a": "1"}}},
                   "application/strategic-merge-patch+json")
    assert code == 200 and api.store.rv == rv and len(api.store.log) == n_events


def test_send_initial_events_ends_with_an_annotated_bookmark(api: Api) -> None:
    call(api, "POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "a"}})
    evs = _watch(api, "/api/v1/namespaces/default/configmaps", sendInitialEvents="true",
                 resourceVersionMatch="NotOlderThan", allowWatchBookmarks="true", timeoutSeconds="0.1")
    assert [e["type"] for e in evs[:2]] == ["ADDED", "BOOKMARK"]
    assert evs[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
