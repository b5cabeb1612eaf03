"""The sandbox component that runs the real control plane (``Sandbox(kube=True)``).

Start order: PKI (openssl) -> etcd (healthy) -> kube-apiserver (``/readyz``) ->
kube-controller-manager, kube-scheduler, kwok -> through the API: the daemon's RBAC
(``deploy/kubernetes/rbac.yaml``, its per-namespace RoleBinding put in the serving
namespace), its ServiceAccount token (TokenRequest) and kubeconfig, the serving side (GPU
nodes, namespace, vLLM Deployment, PDB). Every process is spawned through ``sb.spawn`` so
``down`` stops it and its sweep finds anything left."""

from __future__ import annotations

import argparse
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from bridge import wellknown
from bridge.errors import SandboxError
from gpu_bridge_lab.sandbox.cluster import procs
from gpu_bridge_lab.sandbox.realkube import pki as pki_mod
from gpu_bridge_lab.sandbox.realkube.binaries import ROOT, Binaries, find_binaries
from gpu_bridge_lab.sandbox.realkube.serving_model import ServingModel, seed_serving

if TYPE_CHECKING:
    from gpu_bridge_lab.sandbox.cluster.sandbox import Sandbox

RBAC_MANIFEST = ROOT / "deploy" / "kubernetes" / "rbac.yaml"
# the fields the daemon may change (ValidatingAdmissionPolicy): applied wherever rbac.yaml is
ADMISSION_POLICY_MANIFEST = ROOT / "deploy" / "kubernetes" / "admission-policy.yaml"
WEB_RBAC_MANIFEST = ROOT / "deploy" / "kubernetes" / "web-rbac.yaml"  # gpu-bridge web's read-only identity
RBAC_EXAMPLE_NAMESPACE = "llm-serving"  # rbac.yaml's per-serving-namespace RoleBinding is written for this one
DAEMON_SA = ("gpu-bridge", "gpu-bridge")  # (namespace, name) in rbac.yaml
WEB_SA = ("gpu-bridge", "gpu-bridge-web")  # (namespace, name) in web-rbac.yaml
SERVICE_CIDR = "10.0.0.0/24"
# Pod IPs (kwok --cidr): loopback addresses, every one of them local on Linux (127.0.0.0/8), so
# a lab process can answer at a pod's own IP as the pod's server would (the vLLM simulator's
# --pod-port: warm lending reaches each replica at http://<pod IP>:<vllm_port>). No Service
# selects the pods, so no Endpoints carries them (its validation refuses loopback addresses).
POD_CIDR = "127.1.0.0/16"
# kwok stage selector (jq): how many of a pod's readiness gates are not True (0 without gates)
GATES_CLOSED = ('[(.spec.readinessGates // [])[] | .conditionType] - '
                '[(.status.conditions // [])[] | select(.status == "True") | .type] | length')
TOKEN_TTL_S = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class KubeArgs:
    """The serving side to create (``Sandbox(kube_args=...)``)."""

    seed_serving: bool = False
    nodes: int = 4
    spare_nodes: int = 0
    replicas: int | None = None
    pool: str = "default"
    model: str = "meta-llama/Llama-3.1-70B-Instruct"
    grace_s: int = 30
    pod_start_delay_s: float = 2.0
    node_heartbeat_s: float = 10.0
    readiness_gates: tuple[str, ...] = ()  # the Deployment's pods declare these condition types


def parse_kube_args(argv: Sequence[str]) -> KubeArgs:
    p = argparse.ArgumentParser(prog="kube_args", add_help=False)
    p.add_argument("--seed-serving", action="store_true")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--spare-nodes", type=int, default=0)
    p.add_argument("--replicas", type=int, default=None)
    p.add_argument("--pool", default="default")
    p.add_argument("--model", default=KubeArgs.model)
    p.add_argument("--grace-s", type=int, default=30)
    p.add_argument("--pod-start-delay-s", type=float, default=2.0)
    # kwok renews each node's Lease every this many seconds (Kubernetes' default is 10 s); the
    # node lifecycle controller's grace is 5x that. Thousands of simulated nodes on 2 shared
    # cores fall behind 10 s and would go NotReady, which real kubelets on their own machines
    # would not: bench_scale raises it.
    p.add_argument("--node-heartbeat-s", type=float, default=10.0)
    # a readiness gate of the vLLM pods (repeatable): a pod is Ready once its condition is True
    # (warm lending's gpu-bridge.io/awake, which the daemon opens)
    p.add_argument("--readiness-gate", action="append", default=[])
    try:
        a = p.parse_args(list(argv))
    except SystemExit:
        raise SandboxError(f"kube_args: cannot parse {list(argv)!r}") from None
    for flag, value in (("--nodes", a.nodes), ("--spare-nodes", a.spare_nodes), ("--grace-s", a.grace_s),
                        ("--pod-start-delay-s", a.pod_start_delay_s)):
        if value < 0:
            raise SandboxError(f"kube_args: {flag}: must be >= 0, got {value}")
    if a.node_heartbeat_s <= 0:
        raise SandboxError(f"kube_args: --node-heartbeat-s: must be > 0, got {a.node_heartbeat_s}")
    return KubeArgs(a.seed_serving, a.nodes, a.spare_nodes, a.replicas, a.pool, a.model, a.grace_s,
                    a.pod_start_delay_s, a.node_heartbeat_s, tuple(a.readiness_gate))


def stages_yaml(pod_ready_ms: int, node_heartbeat_s: float = 10.0) -> str:
    """kwok's configuration: node status and Lease heartbeats, pods Running then Ready
    ``pod_ready_ms`` after their creation on a node (per pod: annotation
    ``pod-ready.stage.kwok.x-k8s.io/delay``), and a deleted pod gone when its grace period
    ends (its deletionTimestamp): the vLLM drain."""
    tpl = (Path(__file__).parent / "kwok-stages.yaml").read_text()
    # kwok renews a node's Lease at a quarter of its duration (as kubelet does)
    return (tpl.replace("__POD_READY_MS__", str(int(pod_ready_ms)))
            .replace("__GATES_CLOSED__", GATES_CLOSED)
            .replace("__NODE_LEASE_S__", str(max(4, round(4 * node_heartbeat_s)))))


def _kubeconfig(server: str, ca: Path, user: str, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "sandbox", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": user}}],
        "current-context": "sandbox",
    }


def _write_private(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


class RealKubeComponent:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok."""

    name = "kube"
    # start() returns with the apiserver serving and the objects created, which is all the
    # vLLM simulator (it watches the pods) needs; readiness (nodes, replicas) is awaited last.
    ready_before_next = False

    def __init__(self, kube_args: Sequence[str] = ()) -> None:
        self.args = parse_kube_args(kube_args)
        self.bins: Binaries | None = None
        self.timings: dict[str, float] = {}

    # ---- paths -----------------------------------------------------------------------
    @staticmethod
    def kdir(sb: Sandbox) -> Path:
        return sb.dir / "kube"

    def url(self, sb: Sandbox) -> str:
        return f"https://127.0.0.1:{sb.ports['kube']}"

    def daemon_kubeconfig(self, sb: Sandbox) -> Path:
        return self.kdir(sb) / "kubeconfig-daemon"

    def web_kubeconfig(self, sb: Sandbox) -> Path:
        return self.kdir(sb) / "kubeconfig-web"

    # ---- start -----------------------------------------------------------------------
    def start(self, sb: Sandbox) -> None:
        t0 = time.monotonic()
        self.bins = b = find_binaries()
        kd = self.kdir(sb)
        kd.mkdir(parents=True, exist_ok=True)
        pki = pki_mod.make(kd / "pki")
        tokens = pki_mod.write_tokens(pki, {
            "admin": ("gpu-bridge-sandbox-admin", "system:masters"),
            "controller-manager": ("system:kube-controller-manager", ""),
            "scheduler": ("system:kube-scheduler", ""),
            "kwok": ("kwok", "system:masters"),
        })
        self.timings["pki_s"] = time.monotonic() - t0
        server = self.url(sb)
        kcs = {}
        for key, user in (("admin", "admin"), ("controller-manager", "system:kube-controller-manager"),
                          ("scheduler", "system:kube-scheduler"), ("kwok", "kwok")):
            path = sb.kubeconfig if key == "admin" else kd / f"kubeconfig-{key}"
            _write_private(path, yaml.safe_dump(_kubeconfig(server, pki.ca_crt, user, tokens[key]), sort_keys=False))
            kcs[key] = path
        self._admin_token = tokens["admin"]
        # etcd
        etcd_url = f"http://127.0.0.1:{sb.ports['etcd']}"
        peer_url = f"http://127.0.0.1:{sb.ports['etcd-peer']}"
        sb.spawn("etcd", [
            str(b.etcd), "--name=sandbox", f"--data-dir={kd / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=sandbox={peer_url}", "--unsafe-no-fsync=true",
            "--quota-backend-bytes=4294967296", "--log-level=warn",
        ], sb.log_dir / "etcd.log")
        sb.wait(lambda: _http_json(etcd_url + "/health").get("health") == "true", 30, "etcd to be healthy", "etcd")
        self.timings["etcd_s"] = time.monotonic() - t0
        # kube-apiserver
        sb.spawn("kube-apiserver", [
            str(b.kube_apiserver),
            f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={sb.ports['kube']}",
            f"--tls-cert-file={pki.server_crt}", f"--tls-private-key-file={pki.server_key}",
            f"--client-ca-file={pki.ca_crt}", f"--token-auth-file={pki.tokens_csv}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
            "--authorization-mode=Node,RBAC", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--enable-priority-and-fairness=false",  # one client of each kind: APF only queues the tests
            "--profiling=false", "--v=1",
        ], sb.log_dir / "kube-apiserver.log")
        sb.wait(lambda: self._readyz(sb, pki.ca_crt), 60, "kube-apiserver /readyz", "kube-apiserver")
        self.timings["apiserver_s"] = time.monotonic() - t0
        common = ["--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false", "--profiling=false", "--v=1"]
        sb.spawn("kube-controller-manager", [
            str(b.kube_controller_manager), f"--kubeconfig={kcs['controller-manager']}", *common,
            f"--service-account-private-key-file={pki.sa_key}", f"--root-ca-file={pki.ca_crt}",
            "--use-service-account-credentials=true", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--concurrent-deployment-syncs=5", "--concurrent-replicaset-syncs=5",
            # the default 20 requests/s makes a large Deployment (bench_scale) take minutes
            "--kube-api-qps=200", "--kube-api-burst=400",
            f"--node-monitor-grace-period={round(5 * self.args.node_heartbeat_s)}s",
            # how often the node lifecycle controller looks at the nodes (default 5 s): a new
            # node keeps its not-ready taint, and gets no pod, until it does
            f"--node-monitor-period={max(1, round(self.args.node_heartbeat_s / 10))}s",
        ], sb.log_dir / "kube-controller-manager.log")
        sb.spawn("kube-scheduler", [str(b.kube_scheduler), f"--kubeconfig={kcs['scheduler']}", *common],
                 sb.log_dir / "kube-scheduler.log")
        stages = kd / "kwok.yaml"
        stages.write_text(stages_yaml(round(self.args.pod_start_delay_s * 1000), self.args.node_heartbeat_s))
        sb.spawn("kwok", [
            str(b.kwok), f"--kubeconfig={kcs['kwok']}", "--manage-all-nodes=true", f"--config={stages}",
            "--node-ip=10.0.1.1", f"--cidr={POD_CIDR}", "--v=INFO",
        ], sb.log_dir / "kwok.log")
        self._bootstrap(sb, pki)
        self.timings["bootstrap_s"] = time.monotonic() - t0

    def _readyz(self, sb: Sandbox, ca: Path) -> bool:
        ctx = ssl.create_default_context(cafile=str(ca))
        req = urllib.request.Request(self.url(sb) + "/readyz",
                                     headers={"Authorization": f"Bearer {self._admin_token}"})
        try:
            with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:  # noqa: S310 - loopback only
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    # ---- objects through the API -------------------------------------------------------
    def _bootstrap(self, sb: Sandbox, pki: pki_mod.Pki) -> None:
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        api = k8s_config.new_client_from_config(config_file=str(sb.kubeconfig))
        try:
            core = k8s.CoreV1Api(api)
            namespaces = ["serving"] if self.args.seed_serving else []
            for ns in namespaces:
                _create(lambda ns=ns: core.create_namespace({"metadata": {"name": ns}}))
            apply_rbac(api, RBAC_MANIFEST, serving_namespaces=namespaces or ["default"])
            apply_rbac(api, ADMISSION_POLICY_MANIFEST, serving_namespaces=[])
            apply_rbac(api, WEB_RBAC_MANIFEST, serving_namespaces=namespaces or ["default"])
            self._write_daemon_kubeconfig(sb, core, pki)
            if self.args.seed_serving:
                self._seed_serving(api)
        finally:
            api.close()

    def _write_daemon_kubeconfig(self, sb: Sandbox, core: Any, pki: pki_mod.Pki) -> None:
        """The daemon's kubeconfig (rbac.yaml's ServiceAccount) and the web view's (web-rbac.yaml's)."""
        for (ns, name), path in ((DAEMON_SA, self.daemon_kubeconfig(sb)), (WEB_SA, self.web_kubeconfig(sb))):
            tr = core.create_namespaced_service_account_token(
                name, ns, {"spec": {"expirationSeconds": TOKEN_TTL_S}}, _request_timeout=10)
            doc = _kubeconfig(self.url(sb), pki.ca_crt, f"system:serviceaccount:{ns}:{name}", tr.status.token)
            _write_private(path, yaml.safe_dump(doc, sort_keys=False))

    def _seed_serving(self, api: Any) -> None:
        a = self.args
        seed_serving(api, self.model(), spare_nodes=a.spare_nodes)

    def model(self) -> ServingModel:
        a = self.args
        return ServingModel(nodes=a.nodes, pool=a.pool, model=a.model, replicas=a.replicas, termination_grace_s=a.grace_s,
                            readiness_gates=a.readiness_gates)

    # ---- the Component protocol -------------------------------------------------------
    def wait_ready(self, sb: Sandbox, timeout_s: float) -> None:
        """Every seeded node Ready, and the vLLM Deployment's replicas all available (so a
        sandbox is up with its serving capacity, as it would be on a site). With readiness
        gates, every replica started instead (Running, its containers ready): it is Ready only
        once someone opens its gates (the daemon, for gpu-bridge.io/awake)."""
        t0 = time.monotonic()
        want = self.args.nodes + self.args.spare_nodes if self.args.seed_serving else 0
        sb.wait(lambda: self._nodes_ready(sb) >= want, timeout_s, f"{want} Kubernetes nodes Ready (kwok)", "kwok")
        if self.args.seed_serving:
            replicas = self.args.nodes if self.args.replicas is None else self.args.replicas
            left = max(1.0, timeout_s - (time.monotonic() - t0))
            if self.args.readiness_gates:
                sb.wait(lambda: self._started(sb) >= replicas, left,
                        f"{replicas} vLLM replicas started (cold start {self.args.pod_start_delay_s:g} s; "
                        f"Ready once their gates {', '.join(self.args.readiness_gates)} are True)", "kwok")
                return
            sb.wait(lambda: self._available(sb) >= replicas, left,
                    f"{replicas} vLLM replicas available (cold start {self.args.pod_start_delay_s:g} s)",
                    "kube-controller-manager")

    def _started(self, sb: Sandbox) -> int:
        from gpu_bridge_lab.sandbox.realkube.serving_model import started_replicas

        return self._replicas(sb, started_replicas)

    def _available(self, sb: Sandbox) -> int:
        from gpu_bridge_lab.sandbox.realkube.serving_model import available_replicas

        return self._replicas(sb, available_replicas)

    def _replicas(self, sb: Sandbox, count: Callable[[Any, ServingModel], int]) -> int:
        """``count(api, model)`` over a fresh client; -1 while the API cannot be reached."""
        from kubernetes import config as k8s_config

        try:
            api = k8s_config.new_client_from_config(config_file=str(sb.kubeconfig))
        except Exception:  # noqa: BLE001
            return -1
        try:
            return count(api, self.model())
        finally:
            api.close()

    def _nodes_ready(self, sb: Sandbox) -> int:
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        try:
            api = k8s_config.new_client_from_config(config_file=str(sb.kubeconfig))
        except Exception:  # noqa: BLE001 - not written yet
            return -1
        try:
            n = 0
            for node in k8s.CoreV1Api(api).list_node(_request_timeout=5).items:
                for c in node.status.conditions or []:
                    if c.type == "Ready" and c.status == "True":
                        n += 1
            return n
        except Exception:  # noqa: BLE001 - the apiserver still starting: poll again
            return -1
        finally:
            api.close()

    def before_down(self, sb: Sandbox) -> None:
        """Clients first, then kube-apiserver at once: on SIGTERM it stops listening but waits
        for its in-flight watches to time out (about a minute); a sandbox has nothing to drain."""
        for names, wait_s in ((("kwok", "kube-scheduler", "kube-controller-manager"), 5.0), (("kube-apiserver",), 0.5)):
            recs = {sb.records[n].pid: sb.records[n].start_ticks for n in names if n in sb.records}
            procs.terminate(recs, wait_s)

    def env(self, sb: Sandbox) -> dict[str, str]:
        out = {"KUBECONFIG": str(sb.kubeconfig), "GPU_BRIDGE_DAEMON_KUBECONFIG": str(self.daemon_kubeconfig(sb)),
               "GPU_BRIDGE_WEB_KUBECONFIG": str(self.web_kubeconfig(sb))}
        if self.bins is not None:
            out["GPU_BRIDGE_KUBECTL"] = str(self.bins.kubectl)
        return out

    def logs(self, sb: Sandbox) -> dict[str, Path]:
        return {n: sb.log_dir / f"{n}.log" for n in
                ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")}


def _http_json(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback only
            doc = json.loads(resp.read())
            return doc if isinstance(doc, dict) else {}
    except (urllib.error.URLError, OSError, ValueError):
        return {}


def _create(fn: Any) -> Any:
    """Create, treating 409 AlreadyExists as done (idempotent bootstrap)."""
    from kubernetes.client.exceptions import ApiException

    try:
        return fn()
    except ApiException as e:
        if e.status == 409:
            return None
        raise SandboxError(f"kube bootstrap: {e.status} {e.reason}: {(e.body or '')[:300]}") from None


def rbac_documents(manifest: Path, serving_namespaces: Sequence[str]) -> list[dict[str, Any]]:
    """rbac.yaml's objects, with its per-serving-namespace RoleBinding (written for
    ``llm-serving``) copied into each of ``serving_namespaces``, as the manifest says to."""
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(manifest.read_text()):
        if not doc:
            continue
        meta = doc.get("metadata") or {}
        if doc.get("kind") == "RoleBinding" and meta.get("namespace") == RBAC_EXAMPLE_NAMESPACE:
            for ns in serving_namespaces:
                out.append({**doc, "metadata": {**meta, "namespace": ns}})
        else:
            out.append(doc)
    return out


def apply_rbac(api: Any, manifest: Path, serving_namespaces: Sequence[str]) -> list[str]:
    """Create the manifest's objects (rbac.yaml's, admission-policy.yaml's: exactly those,
    nothing added); returns "Kind/ns/name" of each."""
    from kubernetes import client as k8s

    core, rbac, adm = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api), k8s.AdmissionregistrationV1Api(api)
    made = []
    for doc in rbac_documents(manifest, serving_namespaces):
        kind, meta = doc["kind"], doc["metadata"]
        ns = meta.get("namespace")
        create = {
            "Namespace": lambda d: core.create_namespace(d),
            "ServiceAccount": lambda d: core.create_namespaced_service_account(ns, d),
            "ClusterRole": lambda d: rbac.create_cluster_role(d),
            "ClusterRoleBinding": lambda d: rbac.create_cluster_role_binding(d),
            "Role": lambda d: rbac.create_namespaced_role(ns, d),
            "RoleBinding": lambda d: rbac.create_namespaced_role_binding(ns, d),
            "ValidatingAdmissionPolicy": lambda d: adm.create_validating_admission_policy(d),
            "ValidatingAdmissionPolicyBinding": lambda d: adm.create_validating_admission_policy_binding(d),
        }.get(kind)
        if create is None:
            raise SandboxError(f"{manifest}: kind {kind!r} is not one the sandbox applies")
        _create(lambda create=create, doc=doc: create(doc))
        made.append(f"{kind}/{ns or ''}/{meta['name']}")
    return made


__all__ = ["ADMISSION_POLICY_MANIFEST", "KubeArgs", "RealKubeComponent", "apply_rbac", "parse_kube_args", "rbac_documents", "stages_yaml",
           "wellknown"]
