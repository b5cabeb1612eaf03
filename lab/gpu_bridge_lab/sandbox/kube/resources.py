"""The resource table: every kind the server knows, where it lives in the URL space, and the
discovery documents kubectl and the official client read to find it.

kubectl decides what a command may do from discovery alone (e.g. ``kubectl drain`` only
evicts if ``/api/v1`` lists ``pods/eviction`` as policy/v1 Eviction; ``kubectl scale`` only
works if ``deployments/scale`` says autoscaling/v1 Scale), so these documents are exact."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VERBS_ALL = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True, slots=True)
class Subresource:
    name: str  # "status", "scale", "eviction"
    kind: str
    group: str = ""  # empty: same as the parent resource's
    version: str = ""
    verbs: tuple[str, ...] = ("get", "patch", "update")


@dataclass(frozen=True, slots=True)
class Resource:
    """One REST resource. The flags mirror the real registry strategies."""

    group: str  # "" = core
    version: str
    name: str  # plural, the URL segment
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[Subresource, ...] = ()
    has_status: bool = True  # main-resource writes ignore .status; /status writes only it
    has_generation: bool = False  # metadata.generation bumps on spec changes
    reset_status_on_create: bool = True
    allow_create_on_update: bool = False  # PUT to a missing object creates it (Lease, Event)
    allow_unconditional_update: bool = True  # PUT without metadata.resourceVersion is fine
    categories: tuple[str, ...] = ()
    singular: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Store key: group/resource (the same resource in two versions would share it)."""
        return f"{self.group}/{self.name}"

    def subresource(self, name: str) -> Subresource | None:
        for s in self.subresources:
            if s.name == name:
                return s
        return None


_STATUS = Subresource("status", "")  # kind filled in by the parent
_SCALE = Subresource("scale", "Scale", "autoscaling", "v1")

RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "namespaces", "Namespace", False, ("ns",), (_STATUS,), reset_status_on_create=True),
    Resource("", "v1", "nodes", "Node", False, ("no",), (_STATUS,), reset_status_on_create=False),
    Resource("", "v1", "pods", "Pod", True, ("po",),
             (_STATUS, Subresource("eviction", "Eviction", "policy", "v1", ("create",)),
              Subresource("binding", "Binding", "", "", ("create",))), categories=("all",)),
    Resource("", "v1", "events", "Event", True, ("ev",), (), has_status=False, allow_create_on_update=True),
    Resource("", "v1", "configmaps", "ConfigMap", True, ("cm",), (), has_status=False),
    Resource("", "v1", "services", "Service", True, ("svc",), (_STATUS,), categories=("all",)),
    Resource("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",), (), has_status=False),
    Resource("apps", "v1", "deployments", "Deployment", True, ("deploy",), (_STATUS, _SCALE),
             has_generation=True, categories=("all",)),
    Resource("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), (_STATUS, _SCALE),
             has_generation=True, categories=("all",)),
    Resource("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), (_STATUS, _SCALE),
             has_generation=True, categories=("all",)),
    Resource("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), (_STATUS,),
             has_generation=True, categories=("all",)),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), (_STATUS,),
             has_generation=True),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True, (), (), has_status=False,
             allow_create_on_update=True, allow_unconditional_update=False),
    Resource("events.k8s.io", "v1", "events", "Event", True, ("ev",), (), has_status=False,
             allow_create_on_update=True),
    # RBAC objects are stored and served (so manifests apply); nothing is enforced.
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", True, (), (), has_status=False),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, (), (), has_status=False),
    Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, (), (), has_status=False),
    Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, (), (),
             has_status=False),
)

# A fresh object's status as the real server serialises it: Go ints without omitempty are 0
# (and the official client rejects a status that lacks them).
ZERO_STATUS: dict[str, dict[str, Any]] = {
    "ReplicaSet": {"replicas": 0},
    "StatefulSet": {"replicas": 0, "availableReplicas": 0},
    "DaemonSet": {"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0,
                  "numberReady": 0},
    "PodDisruptionBudget": {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0},
    "Service": {"loadBalancer": {}},
}

# Groups served, in discovery order (the preferred version is the only one).
GROUPS: tuple[str, ...] = ("apps", "policy", "coordination.k8s.io", "events.k8s.io", "rbac.authorization.k8s.io")

_BY_PATH: dict[tuple[str, str, str], Resource] = {(r.group, r.version, r.name): r for r in RESOURCES}
_BY_KIND: dict[tuple[str, str], Resource] = {}
for _r in RESOURCES:
    _BY_KIND.setdefault((_r.api_version, _r.kind), _r)


def lookup(group: str, version: str, name: str) -> Resource | None:
    return _BY_PATH.get((group, version, name))


def by_kind(api_version: str, kind: str) -> Resource | None:
    return _BY_KIND.get((api_version, kind))


def group_versions(group: str) -> list[str]:
    return sorted({r.version for r in RESOURCES if r.group == group})


def _singular(r: Resource) -> str:
    return r.singular or r.kind.lower()


def resource_list(group: str, version: str) -> dict[str, Any] | None:
    """The APIResourceList of one group version (``/api/v1``, ``/apis/apps/v1``, ...)."""
    rs = [r for r in RESOURCES if r.group == group and r.version == version]
    if not rs:
        return None
    out: list[dict[str, Any]] = []
    for r in rs:
        doc: dict[str, Any] = {
            "name": r.name, "singularName": _singular(r), "namespaced": r.namespaced, "kind": r.kind,
            "verbs": list(VERBS_ALL),
        }
        if r.short_names:
            doc["shortNames"] = list(r.short_names)
        if r.categories:
            doc["categories"] = list(r.categories)
        out.append(doc)
        for s in r.subresources:
            sub: dict[str, Any] = {"name": f"{r.name}/{s.name}", "singularName": "", "namespaced": r.namespaced,
                                   "kind": s.kind or r.kind, "verbs": list(s.verbs)}
            if s.group or s.version:
                sub["group"] = s.group
                sub["version"] = s.version
            out.append(sub)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group_doc(group: str) -> dict[str, Any]:
    versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in group_versions(group)]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def api_group_list() -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group_doc(g) for g in GROUPS]}


def api_group(group: str) -> dict[str, Any] | None:
    if group not in GROUPS:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group)}


def core(name: str) -> Resource:
    """The resource by plural name, preferring the core group (``events`` -> core v1)."""
    for r in RESOURCES:
        if r.name == name:
            return r
    raise KeyError(name)


def get(group: str, name: str) -> Resource:
    for r in RESOURCES:
        if r.group == group and r.name == name:
            return r
    raise KeyError(f"{group}/{name}")


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_v3_root() -> dict[str, Any]:
    """``/openapi/v3``: where each group version's document is."""
    gvs = sorted({(r.group, r.version) for r in RESOURCES})
    return {"paths": {_gv_path(g, v): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}?hash=sandbox1"}
                      for g, v in gvs}}


def openapi_v3_gv(group: str, version: str) -> dict[str, Any] | None:
    """A minimal OpenAPI v3 document of one group version: every resource's PATCH operation
    with its group-version-kind and the ``fieldValidation`` query parameter, which is what
    kubectl checks before leaving validation to the server (``kubectl create/apply``
    without ``--validate=false``). No schemas: kubectl then uses its compiled-in types."""
    rs = [r for r in RESOURCES if r.group == group and r.version == version]
    if not rs:
        return None
    paths: dict[str, Any] = {}
    for r in rs:
        prefix = f"/{_gv_path(group, version)}" + ("/namespaces/{namespace}" if r.namespaced else "")
        gvk = {"group": group, "version": version, "kind": r.kind}
        params = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                  {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                  {"name": "dryRun", "in": "query", "schema": {"type": "string"}}]
        op = {"operationId": f"patch{r.kind}", "parameters": params, "x-kubernetes-group-version-kind": gvk,
              "x-kubernetes-action": "patch", "responses": {"200": {"description": "OK"}}}
        post = {"operationId": f"create{r.kind}", "parameters": params, "x-kubernetes-group-version-kind": gvk,
                "x-kubernetes-action": "post", "responses": {"201": {"description": "Created"}}}
        paths[f"{prefix}/{r.name}/{{name}}"] = {"patch": op}
        paths[f"{prefix}/{r.name}"] = {"post": post}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes (gpu-bridge sandbox)", "version": "v1.32.0"},
            "paths": paths, "components": {"schemas": {}}}


OPENAPI_V2_TITLE = "Kubernetes (gpu-bridge sandbox)"
OPENAPI_V2_VERSION = "v1.32.0"


def openapi_v2_json() -> dict[str, Any]:
    """``/openapi/v2`` as JSON: an empty Swagger 2.0 document (no paths, no definitions)."""
    return {"swagger": "2.0", "info": {"title": OPENAPI_V2_TITLE, "version": OPENAPI_V2_VERSION}, "paths": {}}


def openapi_v2_protobuf() -> bytes:
    """The same document in gnostic's OpenAPI v2 protobuf encoding, which kubectl before 1.27
    (Debian 12 ships 1.20) downloads for client-side validation of ``create/apply -f``. With
    no definitions it finds no schema for any kind and skips validation (the server checks).

    Hand-encoded: ``Document{swagger=1, info=2 {title=1, version=2}, paths=8 {}}``."""

    def field(number: int, payload: bytes) -> bytes:  # wire type 2: length-delimited
        return _varint(number << 3 | 2) + _varint(len(payload)) + payload

    info = field(1, OPENAPI_V2_TITLE.encode()) + field(2, OPENAPI_V2_VERSION.encode())
    return field(1, b"2.0") + field(2, info) + field(8, b"")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
