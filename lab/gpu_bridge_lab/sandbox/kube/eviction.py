"""The pods/eviction subresource: a delete that honours PodDisruptionBudgets, as the real
API does (429 TooManyRequests with a DisruptionBudget cause when no disruption is allowed;
the PDB's disruptionsAllowed is decremented in the same step, so two concurrent evictions
cannot both pass a budget of one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_bridge_lab.sandbox.kube import resources as res_mod, selectors
from gpu_bridge_lab.sandbox.kube.store import ApiError, Store, deepcopy_json, now_rfc3339

PODS = res_mod.core("pods")
PDBS = res_mod.get("policy", "poddisruptionbudgets")


def _is_ready(pod: Mapping[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def matching_pdbs(store: Store, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    ns = pod["metadata"].get("namespace", "")
    labels = pod["metadata"].get("labels") or {}
    out = []
    for pdb in store.objs(PDBS, ns):
        try:
            reqs = selectors.from_label_selector_object((pdb.get("spec") or {}).get("selector"))
        except selectors.SelectorError:
            continue
        if reqs is None or not reqs:
            continue  # policy/v1: an empty selector matches nothing... null too
        if selectors.labels_match(reqs, labels):
            out.append(pdb)
    return out


def _success(code: int = 201) -> Any:
    from gpu_bridge_lab.sandbox.kube.api import Response  # cycle: api imports this module
    return Response.of(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                              "code": code})


def evict(store: Store, namespace: str, name: str, body: Mapping[str, Any]) -> Any:
    from gpu_bridge_lab.sandbox.kube.api import delete_object, set_condition

    if body.get("kind") not in (None, "Eviction"):
        raise ApiError(400, "BadRequest", f"eviction: the body must be an Eviction, got {body.get('kind')!r}")
    bname = (body.get("metadata") or {}).get("name")
    if bname and bname != name:
        raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
    opts = dict(body.get("deleteOptions") or {})
    with store.lock:
        pod = store.get(PODS, namespace, name)
        meta = pod["metadata"]
        phase = (pod.get("status") or {}).get("phase", "Pending")
        pre = opts.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": Precondition failed')
        skip_pdb = bool(meta.get("deletionTimestamp")) or phase in ("Pending", "Succeeded", "Failed")
        if not skip_pdb:
            pdbs = matching_pdbs(store, pod)
            if len(pdbs) > 1:
                raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the "
                               "eviction subresource does not support.")
            if pdbs:
                _charge(store, pdbs[0], pod)
        if not meta.get("deletionTimestamp"):
            cur = deepcopy_json(pod)
            if set_condition(cur, "DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting"):
                store.update(PODS, cur, subresource="status", namespace=namespace, name=name)
        delete_object(store, PODS, namespace, name, opts)
    return _success()


def _charge(store: Store, pdb: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
    """Take one disruption from the budget or raise 429."""
    st = pdb.get("status") or {}
    pname = pdb["metadata"]["name"]
    if st.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
        raise _too_many(pname, "the PodDisruptionBudget is not yet processed by the controller")
    healthy, desired = int(st.get("currentHealthy", 0)), int(st.get("desiredHealthy", 0))
    if not _is_ready(pod) and healthy >= desired:
        return  # an unhealthy pod may go when the budget is met (IfHealthyBudget)
    allowed = int(st.get("disruptionsAllowed", 0))
    if allowed <= 0:
        raise _too_many(pname, f"The disruption budget {pname} needs {desired} healthy pods and has {healthy} "
                               f"currently")
    new = deepcopy_json(pdb)
    ns_st = new.setdefault("status", {})
    ns_st["disruptionsAllowed"] = allowed - 1
    ns_st.setdefault("disruptedPods", {})[pod["metadata"]["name"]] = now_rfc3339()
    store.update(PDBS, new, subresource="status", namespace=pdb["metadata"]["namespace"], name=pname)


def _too_many(pdb_name: str, message: str) -> ApiError:
    return ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                    {"causes": [{"reason": "DisruptionBudget", "message": message}]})
