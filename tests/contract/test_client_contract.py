"""The official ``kubernetes`` client against the API: the semantics the daemon relies on."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kube_contract import Kube, Serving, make_node, settled, wait_for


def _core(kube: Kube) -> tuple[Any, Any]:
    client, api = kube.client()
    return client, client.CoreV1Api(api)


def _raw(api_call: Any, *args: Any, **kw: Any) -> Any:
    resp = api_call(*args, _preload_content=False, **kw)
    return json.loads(resp.data)


def raw_request(api: Any, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> tuple[int, Any]:
    """One request through the client's own transport and auth; (status, decoded body)."""
    m, url, headers, b, post = api.param_serialize(method, path, header_params={
        "Content-Type": content_type, "Accept": "application/json"}, body=body, auth_settings=["BearerToken"])
    resp = api.call_api(m, url, headers, b, post)
    data = resp.read()
    return resp.status, json.loads(data) if data else None


def _ns(kube: Kube, core: Any, base: str = "ns") -> str:
    ns = kube.name(base)
    core.create_namespace({"metadata": {"name": ns}})
    return ns


def _cm(name: str, data: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": data or {"k": "v"}}


def test_conflicts_on_stale_put_and_patch(kube: Kube) -> None:
    client, core = _core(kube)
    ApiException = client.exceptions.ApiException
    name = kube.name("node-409")
    make_node(core, client, name)
    try:
        node = settled(core, name)
        stale = node.metadata.resource_version
        core.patch_node(name, {"metadata": {"labels": {"a": "1"}}})
        node.metadata.labels["b"] = "2"
        with pytest.raises(ApiException) as exc:
            core.replace_node(name, node)
        assert exc.value.status == 409
        body = json.loads(exc.value.body)
        assert body["kind"] == "Status" and body["reason"] == "Conflict"
        with pytest.raises(ApiException) as exc:
            core.patch_node(name, {"metadata": {"resourceVersion": stale, "labels": {"c": "3"}}})
        assert exc.value.status == 409
        fresh = core.read_node(name)
        assert core.patch_node(name, {"metadata": {"resourceVersion": fresh.metadata.resource_version,
                                                   "labels": {"c": "3"}}}).metadata.labels["c"] == "3"
    finally:
        core.delete_node(name)


def test_noop_patch_keeps_the_resource_version(kube: Kube) -> None:
    client, core = _core(kube)
    name = kube.name("node-noop")
    make_node(core, client, name, {"x": "1"})
    try:
        settled(core, name)
        rv = core.read_node(name).metadata.resource_version
        assert core.patch_node(name, {"metadata": {"labels": {"x": "1"}}}).metadata.resource_version == rv
    finally:
        core.delete_node(name)


def test_status_is_ignored_on_the_main_resource(kube: Kube) -> None:
    client, core = _core(kube)
    name = kube.name("node-status")
    make_node(core, client, name)
    try:
        core.patch_node(name, {"status": {"allocatable": {"nvidia.com/gpu": "99"}}, "metadata": {"labels": {"y": "1"}}})
        n = core.read_node(name)
        assert n.status.allocatable["nvidia.com/gpu"] == "4" and n.metadata.labels["y"] == "1"
    finally:
        core.delete_node(name)


def test_json_patch_test_failure_is_422_and_list_patch_is_json_patch(kube: Kube) -> None:
    client, core = _core(kube)
    name = kube.name("node-jsonpatch")
    make_node(core, client, name, {"phase": "serving"})
    try:
        with pytest.raises(client.exceptions.ApiException) as exc:
            core.patch_node(name, [{"op": "test", "path": "/metadata/labels/phase", "value": "lent"},
                                   {"op": "replace", "path": "/metadata/labels/phase", "value": "x"}])
        assert exc.value.status == 422
        n = core.patch_node(name, [{"op": "test", "path": "/metadata/labels/phase", "value": "serving"},
                                   {"op": "replace", "path": "/metadata/labels/phase", "value": "lending"}])
        assert n.metadata.labels["phase"] == "lending"
    finally:
        core.delete_node(name)


def test_merge_patch_null_deletes_a_key(kube: Kube) -> None:
    client, core = _core(kube)
    ns = _ns(kube, core)
    core.create_namespaced_config_map(ns, _cm("m", {"a": "1", "b": "2"}))
    status, obj = raw_request(core.api_client, "PATCH", f"/api/v1/namespaces/{ns}/configmaps/m",
                              {"data": {"a": None}}, "application/merge-patch+json")
    assert status == 200 and obj["data"] == {"b": "2"}
    core.delete_namespace(ns)


def test_not_found_already_exists_and_delete_preconditions(kube: Kube) -> None:
    client, core = _core(kube)
    ApiException = client.exceptions.ApiException
    ns = _ns(kube, core)
    cm = core.create_namespaced_config_map(ns, _cm("a"))
    assert cm.metadata.uid and cm.metadata.creation_timestamp and cm.metadata.resource_version
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(ns, _cm("a"))
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("nope", ns)
    assert exc.value.status == 404 and json.loads(exc.value.body)["reason"] == "NotFound"
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_config_map("a", ns, body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid="00000000-0000-0000-0000-000000000000")))
    assert exc.value.status == 409
    core.delete_namespaced_config_map("a", ns, body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=cm.metadata.uid)))
    gen = core.create_namespaced_config_map(ns, {"metadata": {"generateName": "gen-"}, "data": {}})
    assert gen.metadata.name.startswith("gen-") and len(gen.metadata.name) == 9
    core.delete_namespace(ns)


def test_list_kind_rv_and_paging(kube: Kube) -> None:
    client, core = _core(kube)
    ns = _ns(kube, core)
    for i in range(7):
        core.create_namespaced_config_map(ns, _cm(f"cm-{i}"))
    first = _raw(core.list_namespaced_config_map, ns, limit=3)
    assert first["kind"] == "ConfigMapList" and first["metadata"]["resourceVersion"]
    names = [i["metadata"]["name"] for i in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = _raw(core.list_namespaced_config_map, ns, limit=3, _continue=token)
        names += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
    # the root-CA publisher puts kube-root-ca.crt into every new namespace, sooner or later
    assert [n for n in names if n != "kube-root-ca.crt"] == [f"cm-{i}" for i in range(7)]
    core.delete_namespace(ns)


def test_label_and_field_selectors(kube: Kube, serving: Serving) -> None:
    client, core = _core(kube)
    node = sorted(set(serving.node_of().values()))[0]
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    assert len(pods) == 1 and pods[0].spec.node_name == node
    assert len(core.list_namespaced_pod(serving.ns, label_selector="app in (vllm,other),!nope").items) == 3
    assert core.list_namespaced_pod(serving.ns, label_selector="app notin (vllm)").items == []
    nodes = core.list_node(field_selector=f"metadata.name={serving.nodes[0]}").items
    assert [n.metadata.name for n in nodes] == [serving.nodes[0]]
    with pytest.raises(client.exceptions.ApiException) as exc:
        core.list_node(field_selector="spec.bogus=1")
    assert exc.value.status == 400 and "field label not supported" in json.loads(exc.value.body)["message"]


def test_events_core_and_events_k8s_io_with_field_selectors(kube: Kube) -> None:
    client, core = _core(kube)
    _, api = kube.client()
    events_v1 = client.EventsV1Api(api)
    ApiException = client.exceptions.ApiException
    ns = _ns(kube, core)
    n7, n8 = kube.name("gpu-node-07"), kube.name("gpu-node-08")
    e1, e2, n1 = kube.name("e1"), kube.name("e2"), kube.name("n1")
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # An event about a cluster-scoped object (a Node) lives in "default": the real apiserver
    # refuses it anywhere else (the adapter writes node events there).
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_event(ns, {"metadata": {"name": "bad"}, "involvedObject": {
            "kind": "Node", "name": n7}, "reason": "NodeLent", "message": "lent", "type": "Normal"})
    assert exc.value.status == 422 and "involvedObject.namespace" in exc.value.body
    ev_ns = "default"
    core.create_namespaced_event(ev_ns, {"metadata": {"name": e1}, "involvedObject": {
        "kind": "Node", "name": n7, "apiVersion": "v1"}, "reason": "NodeLent", "message": "lent",
        "type": "Normal", "firstTimestamp": ts, "lastTimestamp": ts, "source": {"component": "gpu-bridge"}})
    try:
        core.create_namespaced_event(ev_ns, {"metadata": {"name": e2}, "involvedObject": {
            "kind": "Node", "name": n8}, "reason": "NodeLent", "message": "lent", "type": "Normal"})
        got = core.list_namespaced_event(ev_ns, field_selector=f"involvedObject.name={n7},involvedObject.kind=Node")
        assert [e.metadata.name for e in got.items] == [e1]
        # (not .000000: the generated client re-serializes a zero-microsecond MicroTime without
        # its fraction, which a real apiserver refuses; see calls.send_json)
        now = time.strftime("%Y-%m-%dT%H:%M:%S.123456Z", time.gmtime())
        events_v1.create_namespaced_event(ev_ns, {"metadata": {"name": n1}, "eventTime": now, "action": "Lend",
                                                  "reason": "NodeLent", "reportingController": "gpu-bridge.io/daemon",
                                                  "reportingInstance": "a", "type": "Normal", "note": "lent",
                                                  "regarding": {"kind": "Node", "name": n7}})
        # raw JSON: a core/v1 event without eventTime has eventTime null in events.k8s.io/v1 (the
        # real apiserver does not fill it in), which the generated client's model refuses
        got = json.loads(events_v1.list_namespaced_event(ev_ns, field_selector=f"regarding.name={n7}",
                                                         _preload_content=False).data)
        assert sorted(e["metadata"]["name"] for e in got["items"]) == sorted([e1, n1])  # one store, two APIs
        ev1 = json.loads(events_v1.read_namespaced_event(e1, ev_ns, _preload_content=False).data)
        assert (ev1["note"], ev1["deprecatedSource"]["component"], ev1["regarding"]["name"]) == ("lent", "gpu-bridge", n7)
        # nor is reportingController derived from source (the adapter writes reportingComponent)
        assert ev1.get("eventTime") is None and not ev1.get("reportingController")
        nv1 = core.read_namespaced_event(n1, ev_ns)
        assert (nv1.message, nv1.reporting_component, nv1.involved_object.name) == ("lent", "gpu-bridge.io/daemon", n7)
        got = core.list_namespaced_event(ev_ns, field_selector=f"involvedObject.name={n7}")
        assert sorted(e.metadata.name for e in got.items) == sorted([e1, n1])
    finally:
        for name in (e1, e2, n1):
            try:
                core.delete_namespaced_event(name, ev_ns)
            except ApiException:
                pass
        core.delete_namespace(ns)


def test_lease_semantics(kube: Kube) -> None:
    client, api = kube.client()
    coord = client.CoordinationV1Api(api)
    core = client.CoreV1Api(api)
    ApiException = client.exceptions.ApiException
    ns = _ns(kube, core)
    body = {"metadata": {"name": "gpu-bridge"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    lease = coord.create_namespaced_lease(ns, body)
    with pytest.raises(ApiException) as exc:
        coord.create_namespaced_lease(ns, body)
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"
    lease.spec.holder_identity = "b"
    lease = coord.replace_namespaced_lease("gpu-bridge", ns, lease)
    stale = lease.metadata.resource_version
    lease.spec.holder_identity = "c"
    coord.replace_namespaced_lease("gpu-bridge", ns, lease)
    lease.metadata.resource_version = stale
    with pytest.raises(ApiException) as exc:
        coord.replace_namespaced_lease("gpu-bridge", ns, lease)
    assert exc.value.status == 409
    lease.metadata.resource_version = None
    with pytest.raises(ApiException) as exc:
        coord.replace_namespaced_lease("gpu-bridge", ns, lease)
    assert exc.value.status == 422
    status, obj = raw_request(api, "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/fresh",
                              {"metadata": {"name": "fresh"}, "spec": {"holderIdentity": "z"}})
    assert status == 201 and obj["spec"]["holderIdentity"] == "z"
    core.delete_namespace(ns)


def test_eviction_respects_the_pdb(kube: Kube, serving: Serving) -> None:
    client = serving.client
    ApiException = client.exceptions.ApiException
    pods = sorted(serving.ready_pods(), key=lambda p: p.metadata.name)

    def evict(name: str) -> None:
        serving.core.create_namespaced_pod_eviction(name, serving.ns, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=serving.ns)))

    kube.kubectl("cordon", *serving.nodes)  # replacements stay Pending: the budget stays used
    evict(pods[0].metadata.name)
    evicted = serving.core.read_namespaced_pod(pods[0].metadata.name, serving.ns)
    assert evicted.metadata.deletion_timestamp is not None
    assert any(c.type == "DisruptionTarget" and c.status == "True" for c in evicted.status.conditions)
    with pytest.raises(ApiException) as exc:
        evict(pods[1].metadata.name)
    assert exc.value.status == 429
    body = json.loads(exc.value.body)
    assert body["reason"] == "TooManyRequests"
    assert [c["reason"] for c in body["details"]["causes"]] == ["DisruptionBudget"]
    with pytest.raises(ApiException) as exc:
        evict("no-such-pod")
    assert exc.value.status == 404
    wait_for(lambda: pods[0].metadata.name not in serving.node_of(), 15, "the evicted pod to be gone")


def test_scale_subresource(kube: Kube, serving: Serving) -> None:
    client, api = kube.client()
    apps = client.AppsV1Api(api)
    scale = apps.read_namespaced_deployment_scale("vllm", serving.ns)
    assert scale.spec.replicas == 3 and scale.status.replicas == 3 and "app=vllm" in scale.status.selector
    dep = apps.read_namespaced_deployment("vllm", serving.ns)
    assert scale.metadata.resource_version == dep.metadata.resource_version
    out = apps.patch_namespaced_deployment_scale("vllm", serving.ns, {"spec": {"replicas": 2}})
    assert out.kind == "Scale" and out.spec.replicas == 2
    dep2 = apps.read_namespaced_deployment("vllm", serving.ns)
    assert dep2.spec.replicas == 2 and dep2.metadata.generation == dep.metadata.generation + 1
    wait_for(lambda: len(serving.pods()) == 2, 10, "scale-down to 2 pods")


def test_replicaset_scale_down_removes_the_pod_with_the_lowest_deletion_cost(kube: Kube, serving: Serving) -> None:
    pods = sorted(serving.ready_pods(), key=lambda p: p.metadata.name)
    chosen = pods[1].metadata.name
    for p in pods:
        cost = "-100" if p.metadata.name == chosen else "100"
        serving.core.patch_namespaced_pod(p.metadata.name, serving.ns, {"metadata": {"annotations": {
            "controller.kubernetes.io/pod-deletion-cost": cost}}})
    serving.apps.patch_namespaced_deployment_scale("vllm", serving.ns, {"spec": {"replicas": 2}})
    wait_for(lambda: chosen not in serving.node_of(), 10, "the lowest-cost pod to go")
    assert {p.metadata.name for p in serving.pods()} == {p.metadata.name for p in pods} - {chosen}


def test_watch_from_zero_replays_then_live_and_selector_moves(kube: Kube) -> None:
    client, api = kube.client()
    core = client.CoreV1Api(api)
    ns = _ns(kube, core)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "a", "labels": {"sel": "yes"}}, "data": {}})
    from kubernetes import watch
    seen: list[tuple[str, str]] = []
    w = watch.Watch()

    def run() -> None:
        for ev in w.stream(core.list_namespaced_config_map, ns, label_selector="sel=yes", resource_version="0",
                           timeout_seconds=1):
            seen.append((ev["type"], ev["object"].metadata.name))
    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: ("ADDED", "a") in seen, 5, "the replayed ADDED")
    core.patch_namespaced_config_map("a", ns, {"metadata": {"labels": {"sel": "no"}}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "b", "labels": {"sel": "no"}}, "data": {}})
    core.patch_namespaced_config_map("b", ns, {"metadata": {"labels": {"sel": "yes"}}})
    core.patch_namespaced_config_map("b", ns, {"data": {"x": "1"}})
    t.join(timeout=10)
    assert seen == [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "b"), ("MODIFIED", "b")]
    core.delete_namespace(ns)


def test_watch_from_a_resource_version_gives_only_newer_events(kube: Kube) -> None:
    client, api = kube.client()
    core = client.CoreV1Api(api)
    ns = _ns(kube, core)
    core.create_namespaced_config_map(ns, _cm("old"))
    rv = _raw(core.list_namespaced_config_map, ns)["metadata"]["resourceVersion"]
    core.create_namespaced_config_map(ns, _cm("new"))
    core.delete_namespaced_config_map("old", ns)
    from kubernetes import watch
    evs = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=1)]
    # a real controller-manager also publishes kube-root-ca.crt into every new namespace
    assert [e for e in evs if e[1] != "kube-root-ca.crt"] == [("ADDED", "new"), ("DELETED", "old")]
    core.delete_namespace(ns)


def test_a_wrong_bearer_token_is_401_and_kubectl_works_with_the_right_one(tmp_path: Any, kube: Kube) -> None:
    """The plane's kube-apiserver authenticates bearer tokens (--token-auth-file, ServiceAccount
    tokens): a wrong one is refused with 401 Unauthorized before any authorisation."""
    if not kube.sandbox:
        pytest.skip("needs the sandbox plane's admin token")
    import ssl
    import urllib.error
    import urllib.request

    import yaml

    doc = yaml.safe_load(kube.kubeconfig.read_text())
    server = doc["clusters"][0]["cluster"]["server"]
    assert server.startswith("https://")  # kubectl sends a token only over TLS
    ctx = ssl.create_default_context(cafile=doc["clusters"][0]["cluster"]["certificate-authority"])
    token = doc["users"][0]["user"]["token"]
    req = urllib.request.Request(server + "/api/v1/nodes", headers={"Authorization": "Bearer wrong-" + token})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=5, context=ctx)  # noqa: S310 - loopback only
    assert exc.value.code == 401
    assert json.loads(exc.value.read())["reason"] == "Unauthorized"
    assert kube.kubectl("get", "namespaces", "-o", "name").stdout.split()

