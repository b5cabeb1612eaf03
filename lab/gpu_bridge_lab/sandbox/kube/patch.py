"""The three PATCH flavours of the Kubernetes API on plain JSON objects.

- JSON merge patch (RFC 7386): maps merge, ``null`` deletes, lists are replaced.
- Strategic merge patch: like merge patch, but lists of objects with a merge key
  (containers/env/volumes by name, conditions/addresses by type, ownerReferences by uid...)
  merge element-wise, ``finalizers`` merge as a set, and the ``$patch``
  (replace/delete/merge), ``$retainKeys``, ``$deleteFromPrimitiveList/<f>`` and
  ``$setElementOrder/<f>`` directives apply. Lists without a merge strategy in the real
  API (``taints``, ``tolerations``, ``args``...) are replaced whole, as kubectl expects.
  The merge keys are chosen by field name, which is unambiguous for the kinds served here.
- JSON patch (RFC 6902) incl. ``test``, ``move``, ``copy`` and ``-`` (append).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


class PatchError(ValueError):
    """The patch does not apply; ``code`` is the HTTP status (400 bad patch, 422 failed test)."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


# field name -> merge key (lists of maps with patchStrategy=merge in the real types)
MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "volumes": "name",
    "env": "name", "ports": "containerPort", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "conditions": "type", "addresses": "type", "ownerReferences": "uid", "imagePullSecrets": "name",
    "hostAliases": "ip", "resourceClaims": "name", "resizePolicy": "resourceName",
    "topologySpreadConstraints": "topologyKey",
}
# lists of primitives with patchStrategy=merge: merged as sets
MERGE_PRIMITIVES: frozenset[str] = frozenset({"finalizers"})


def json_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = json_merge_patch(out.get(k), v)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        raise PatchError("strategic merge patch: the patch must be a JSON object", 400)
    return _smp_map(target if isinstance(target, Mapping) else {}, patch)


def _smp_map(target: Mapping[str, Any], patch: Mapping[str, Any]) -> Any:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise PatchError(f"strategic merge patch: unknown $patch directive {directive!r}", 400)
    out = dict(target)
    retain = patch.get("$retainKeys")
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys") or k.startswith("$setElementOrder/"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            drop = set(v or [])
            if isinstance(out.get(field), list):
                out[field] = [x for x in out[field] if x not in drop]
            continue
        if v is None:
            out.pop(k, None)
            continue
        cur = out.get(k)
        if isinstance(v, Mapping):
            merged = _smp_map(cur if isinstance(cur, Mapping) else {}, v)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        elif isinstance(v, list):
            out[k] = _smp_list(k, cur if isinstance(cur, list) else [], v)
        else:
            out[k] = v
    if retain is not None:
        keep = set(retain)
        out = {k: v for k, v in out.items() if k in keep}
    for k, v in patch.items():  # order hint: kubectl's $setElementOrder for merged lists
        if k.startswith("$setElementOrder/"):
            field = k.split("/", 1)[1]
            if isinstance(out.get(field), list) and field in MERGE_KEYS:
                out[field] = _reorder(out[field], v or [], MERGE_KEYS[field])
    return out


def _reorder(items: list[Any], order: list[Any], key: str) -> list[Any]:
    wanted = [o.get(key) if isinstance(o, Mapping) else o for o in order]
    pos = {w: i for i, w in enumerate(wanted)}
    keyed = [(pos.get(x.get(key) if isinstance(x, Mapping) else x, len(pos) + i), x) for i, x in enumerate(items)]
    return [x for _, x in sorted(keyed, key=lambda t: t[0])]


def _smp_list(field: str, cur: list[Any], patch: list[Any]) -> list[Any]:
    if field in MERGE_PRIMITIVES:
        out = list(cur)
        for x in patch:
            if x not in out:
                out.append(x)
        return out
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(x, Mapping) for x in patch):
        return [x for x in copy.deepcopy(patch) if not (isinstance(x, Mapping) and x.get("$patch"))]
    if any(isinstance(x, Mapping) and x.get("$patch") == "replace" for x in patch):
        return [copy.deepcopy(x) for x in patch if x.get("$patch") != "replace"]
    out = [copy.deepcopy(x) for x in cur]
    for item in patch:
        if item.get("$patch") == "delete":
            out = [x for x in out if not (isinstance(x, Mapping) and x.get(key) == item.get(key))]
            continue
        if key not in item:
            raise PatchError(f"strategic merge patch: {field}: an element lacks the merge key {key!r}", 400)
        for i, x in enumerate(out):
            if isinstance(x, Mapping) and x.get(key) == item[key]:
                out[i] = _smp_map(x, item)
                break
        else:
            out.append(_smp_map({}, item))
    return out


# --- JSON patch ---------------------------------------------------------------------------

def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"json patch: invalid path {pointer!r}", 400)
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _parent(doc: Any, tokens: list[str], pointer: str) -> Any:
    cur = doc
    for t in tokens[:-1]:
        if isinstance(cur, dict):
            if t not in cur:
                raise PatchError(f"json patch: path {pointer!r}: missing key {t!r}")
            cur = cur[t]
        elif isinstance(cur, list):
            try:
                cur = cur[int(t)]
            except (ValueError, IndexError):
                raise PatchError(f"json patch: path {pointer!r}: bad index {t!r}") from None
        else:
            raise PatchError(f"json patch: path {pointer!r}: not a container at {t!r}")
    return cur


def _get(doc: Any, pointer: str) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    try:
        if isinstance(parent, list):
            return parent[int(last)]
        return parent[last]
    except (KeyError, ValueError, IndexError, TypeError):
        raise PatchError(f"json patch: path {pointer!r} does not exist") from None


def _add(doc: Any, pointer: str, value: Any) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return value
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                i = int(last)
            except ValueError:
                raise PatchError(f"json patch: path {pointer!r}: bad index") from None
            if i < 0 or i > len(parent):
                raise PatchError(f"json patch: path {pointer!r}: index out of range")
            parent.insert(i, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise PatchError(f"json patch: path {pointer!r}: parent is not a container")
    return doc


def _remove(doc: Any, pointer: str) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        raise PatchError("json patch: cannot remove the root")
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    try:
        if isinstance(parent, list):
            del parent[int(last)]
        else:
            del parent[last]
    except (KeyError, ValueError, IndexError, TypeError):
        raise PatchError(f"json patch: remove: path {pointer!r} does not exist") from None
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise PatchError("json patch: the patch must be a JSON array of operations", 400)
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, Mapping) or "op" not in op or "path" not in op:
            raise PatchError("json patch: each operation needs 'op' and 'path'", 400)
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _remove(doc, path) if _tokens(path) else doc
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "move":
            value = _get(doc, op["from"])
            doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"json patch: test failed at path {path!r}")
        else:
            raise PatchError(f"json patch: unknown op {kind!r}", 400)
    return doc


def apply(content_type: str, target: Mapping[str, Any], body: Any) -> Any:
    """Apply a PATCH body by its Content-Type; unsupported types raise ``PatchError(415)``."""
    ct = content_type.split(";")[0].strip().lower()
    if ct == "application/strategic-merge-patch+json":
        return strategic_merge_patch(target, body)
    if ct == "application/merge-patch+json":
        if not isinstance(body, Mapping):
            raise PatchError("merge patch: the patch must be a JSON object", 400)
        return json_merge_patch(target, body)
    if ct == "application/json-patch+json":
        return json_patch(target, body)
    if ct == "application/apply-patch+yaml":
        raise PatchError("server-side apply is not supported by this server", 415)
    raise PatchError(f"the body of the request was in an unknown format - accepted media types include: "
                     f"application/json-patch+json, application/merge-patch+json, "
                     f"application/strategic-merge-patch+json (got {ct!r})", 415)
