"""Label and field selectors of the sandbox Kubernetes API server."""

from __future__ import annotations

import pytest

from gpu_bridge_lab.sandbox.kube.selectors import (SelectorError, fields_match, from_label_selector_object, labels_match,
                                           parse_field_selector, parse_label_selector)


@pytest.mark.parametrize("sel,labels,expected", [
    ("app=vllm", {"app": "vllm"}, True),
    ("app==vllm", {"app": "vllm"}, True),
    ("app=vllm", {"app": "x"}, False),
    ("app!=vllm", {}, True),
    ("app!=vllm", {"app": "vllm"}, False),
    ("env in (a, b)", {"env": "b"}, True),
    ("env in (a,b)", {}, False),
    ("env notin (a,b)", {}, True),
    ("env notin (a,b)", {"env": "a"}, False),
    ("gpu", {"gpu": ""}, True),
    ("!gpu", {"gpu": "1"}, False),
    ("!gpu", {}, True),
    ("app=vllm,env in (a,b),!legacy", {"app": "vllm", "env": "a"}, True),
    ("gpu-bridge.io/phase in (serving,returning)", {"gpu-bridge.io/phase": "returning"}, True),
    ("", {"x": "y"}, True),
])
def test_label_selector(sel: str, labels: dict[str, str], expected: bool) -> None:
    assert labels_match(parse_label_selector(sel), labels) is expected


@pytest.mark.parametrize("bad", ["app=(", "in (a)", "a,,b", "!a in (x)"])
def test_bad_label_selector_is_an_error(bad: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(bad)


def test_label_selector_object_match_labels_and_expressions() -> None:
    reqs = from_label_selector_object({"matchLabels": {"app": "vllm"},
                                       "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]})
    assert reqs is not None
    assert labels_match(reqs, {"app": "vllm"}) and not labels_match(reqs, {"app": "vllm", "tier": "x"})
    assert from_label_selector_object(None) is None
    assert from_label_selector_object({}) == ()


def test_field_selector_on_pods_and_events() -> None:
    pod = {"metadata": {"name": "p", "namespace": "serving"}, "spec": {"nodeName": "gpu-node-01"},
           "status": {"phase": "Running"}}
    assert fields_match(parse_field_selector("spec.nodeName=gpu-node-01", "/pods", "Pod"), pod)
    assert not fields_match(parse_field_selector("spec.nodeName!=gpu-node-01", "/pods", "Pod"), pod)
    assert fields_match(parse_field_selector("metadata.name==p,status.phase=Running", "/pods", "Pod"), pod)
    ev = {"metadata": {"name": "e"}, "involvedObject": {"kind": "Node", "name": "n1"}}
    assert fields_match(parse_field_selector("involvedObject.kind=Node,involvedObject.name=n1", "/events", "Event"), ev)
    node = {"metadata": {"name": "n"}, "spec": {"unschedulable": True}}
    assert fields_match(parse_field_selector("spec.unschedulable=true", "/nodes", "Node"), node)


def test_unsupported_field_is_the_real_message() -> None:
    with pytest.raises(SelectorError, match="field label not supported: spec.nodeName"):
        parse_field_selector("spec.nodeName=x", "/nodes", "Node")
