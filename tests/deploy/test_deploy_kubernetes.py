"""The Kubernetes base in deploy/kubernetes: valid against the Kubernetes schemas, rendered by
kustomize, and in agreement with the settings models (ports, probe paths, env and Secret names);
its migration Job and replica command, with their env, migrate a real PostgreSQL and run a replica
whose httpGet probes, sent as the kubelet sends them (no token), answer while /metrics and the
status page refuse a request without the token."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from qinglong.contracts.errors import SettingsError
from qinglong.contracts.observe import METRICS
from qinglong.host.settings import QinglongSettings, load_settings, split_listen
from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "kubernetes"
#: The Kubernetes release the manifests are validated against (schemas shipped by
#: kubernetes-validate; the kubectl used to render them is of the same minor release).
K8S_VERSION = "1.32.0"
SETTINGS_PATH = "/etc/qinglong/qinglong.toml"
TOKEN = "deploy-test-token-0123456789abcdef"
#: promtool's lint findings on a scrape that are known and accepted: the gauge
#: qinglong_schedules_total keeps the name the contract fixed (docs/operations.md says so).
KNOWN_LINT = {'qinglong_schedules_total non-counter metrics should not have "_total" suffix'}

#: The probes of the replicas' container and the path each one GETs.
PROBE_PATHS = {"startupProbe": "/livez", "livenessProbe": "/livez", "readinessProbe": "/readyz"}
#: The fields of a probe besides its handler (all timing).
PROBE_TIMING = {"initialDelaySeconds", "periodSeconds", "timeoutSeconds", "successThreshold",
                "failureThreshold", "terminationGracePeriodSeconds"}

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _manifest_files() -> list[Path]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    return [BASE / name for name in kustomization["resources"]]


def _documents(paths) -> list[dict]:
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def _by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def _rendered() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomization cannot be rendered here")
    result = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _container(docs: list[dict], kind: str) -> dict:
    (workload,) = _by_kind(docs, kind)
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def _secret_values(docs: list[dict]) -> dict[tuple[str, str], str]:
    return {(s["metadata"]["name"], key): value for s in _by_kind(docs, "Secret")
            for key, value in s["stringData"].items()}


def _env(container: dict, secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it from values and secretKeyRefs."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) in secrets, f"{item['name']}: no Secret {ref['name']} key {ref['key']}"
            env[item["name"]] = secrets[(ref["name"], ref["key"])]
    return env


def _settings_text() -> str:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    (generator,) = kustomization["configMapGenerator"]
    (name,) = generator["files"]
    return (BASE / name).read_text()


def _load_as_container(env: dict[str, str], tmp_path: Path, command: list[str]):
    """Settings as the container's process builds them: the ConfigMap's file named by its
    QINGLONG_SETTINGS, under exactly the container's QINGLONG_* environment."""
    settings = tmp_path / "qinglong.toml"
    settings.write_text(_settings_text())
    assert env["QINGLONG_SETTINGS"] == SETTINGS_PATH
    profile = command[command.index("--profile") + 1]
    saved = {k: v for k, v in os.environ.items() if k.startswith("QINGLONG_")}
    for key in saved:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k.startswith("QINGLONG_")})
    os.environ["QINGLONG_SETTINGS"] = str(settings)
    try:
        return load_settings(profile=profile)
    finally:
        for key in [k for k in os.environ if k.startswith("QINGLONG_")]:
            del os.environ[key]
        os.environ.update(saved)


def test_every_manifest_validates_against_the_kubernetes_schemas():
    """A manifest the API server refuses (a misspelled field, a wrong type) fails the deploy,
    and an unknown field it merely drops (a securityContext key) would silently not apply:
    strict validation catches both, offline."""
    docs = _documents(_manifest_files())
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Secret", "Job", "Deployment", "Service",
                                         "PodDisruptionBudget"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_renders_and_the_rendered_objects_validate():
    """The base is applied as `kubectl apply -k`: a kustomization that does not render, or
    renders objects the API refuses, cannot be deployed at all."""
    rendered = _rendered()
    for doc in rendered:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (config_map,) = _by_kind(rendered, "ConfigMap")
    assert config_map["data"]["qinglong.toml"] == _settings_text()
    for kind in ("Deployment", "Job"):
        (workload,) = _by_kind(rendered, kind)
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        # the generated, hash-suffixed name is the one the pods mount
        assert volumes["settings"]["configMap"]["name"] == config_map["metadata"]["name"]


def test_deployment_runs_the_cluster_profile_as_non_root_on_a_read_only_root():
    """A replica running as root, or able to write its image, turns any code execution through
    a task or a dependency into a persistent foothold in the cluster."""
    docs = _documents(_manifest_files())
    for kind in ("Deployment", "Job"):
        (workload,) = _by_kind(docs, kind)
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        (container,) = pod["containers"]
        context = container["securityContext"]
        assert context == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                           "capabilities": {"drop": ["ALL"]}}
        assert {"requests", "limits"} <= set(container["resources"])
    assert _container(docs, "Deployment")["command"] == ["qinglong", "run", "--profile", "cluster"]
    assert _container(docs, "Job")["command"] == ["qinglong", "db", "migrate", "--profile", "cluster"]
    (pdb,) = _by_kind(docs, "PodDisruptionBudget")
    (deployment,) = _by_kind(docs, "Deployment")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["replicas"] > pdb["spec"]["maxUnavailable"]


def _http_get(container: dict, name: str) -> tuple[str, int]:
    """The path and container port of the probe ``name``, which must be a plain httpGet: no
    headers (the kubelet cannot take one from a Secret), no host (the pod's IP), plain HTTP."""
    probe = container[name]
    assert set(probe) - PROBE_TIMING == {"httpGet"}, f"{name} is not an httpGet probe: {sorted(probe)}"
    get = probe["httpGet"]
    assert set(get) <= {"path", "port", "scheme"}, f"{name}: {sorted(get)}"
    assert get.get("scheme", "HTTP") == "HTTP"
    port = get["port"]
    if isinstance(port, str):  # a named port of the container
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return get["path"], port


def test_probes_and_ports_agree_with_the_http_settings(tmp_path):
    """Probes on another port or path than the one the process serves would restart healthy
    replicas forever (liveness) or keep them out of service (readiness)."""
    docs = _documents(_manifest_files())
    container = _container(docs, "Deployment")
    secrets = _secret_values(docs)
    secrets[("qinglong-http", "token")] = TOKEN
    loaded = _load_as_container(_env(container, secrets), tmp_path, container["command"])
    host, port = split_listen(loaded.settings.http.listen)
    assert host == "0.0.0.0"  # the kubelet probes the pod's IP, not its loopback
    (container_port,) = container["ports"]
    assert container_port == {"name": "http", "containerPort": port, "protocol": "TCP"}
    assert {name: _http_get(container, name) for name in PROBE_PATHS} == {
        name: (path, port) for name, path in PROBE_PATHS.items()}
    (service,) = _by_kind(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == container_port["name"]


def test_env_and_secret_names_resolve_to_real_settings_keys(tmp_path):
    """An env name that matches no key (QINGLONG_BACKEND_RUNTIME_DSN with one underscore) is
    ignored: the replica would start without its DSN, or the Job without the owner's, and the
    Secret's value would never be used."""
    docs = _documents(_manifest_files())
    secrets = _secret_values(docs)
    assert {key for name, key in secrets if name == "qinglong-dsn"} == {
        key for key in ClusterPostgresSettings.model_fields if key.endswith("_dsn")}
    assert {key for name, key in secrets if name == "qinglong-http"} == {"token"}
    assert "token" in QinglongSettings.model_fields["http"].annotation.model_fields
    secrets[("qinglong-http", "token")] = TOKEN
    expected = {"Deployment": {"runtime_dsn"}, "Job": {"owner_dsn", "runtime_dsn"}}
    for kind, dsn_keys in expected.items():
        container = _container(docs, kind)
        env = _env(container, secrets)
        loaded = _load_as_container(env, tmp_path, container["command"])
        assert loaded.settings.profile == "cluster"
        backend = ClusterPostgresSettings.model_validate(loaded.settings.backend)
        for key in ClusterPostgresSettings.model_fields:
            if key.endswith("_dsn"):
                value = getattr(backend, key)
                if key in dsn_keys:
                    assert value.get_secret_value() == secrets[("qinglong-dsn", key)], (kind, key)
                else:
                    assert value is None, f"the {kind} gets {key}, which it does not need"
        if kind == "Deployment":
            assert loaded.settings.http.token == TOKEN


def test_the_shipped_placeholder_token_is_refused_so_it_is_never_served(tmp_path):
    """A replica started with the base's placeholder Secret would otherwise serve its metrics and
    status page behind a token published in this repository."""
    docs = _documents(_manifest_files())
    container = _container(docs, "Deployment")
    with pytest.raises(SettingsError) as refused:
        _load_as_container(_env(container, _secret_values(docs)), tmp_path, container["command"])
    assert "http.token" in str(refused.value)
    assert "REPLACE-ME" not in str(refused.value)


# ---- the manifests' commands and environment against a real PostgreSQL ------------------------


@pytest.fixture(scope="module")
def postgres():
    from tests.pg import create_database, create_roles, start_server

    server = start_server("pg18")
    try:
        create_roles(server)
        create_database(server, "qinglong")
        yield server
    finally:
        server.destroy()


def _kubelet_get(port: int, path: str, timeout: float) -> tuple[int, str]:
    """A GET as the kubelet's httpGet probe sends it (its headers, never a token); the kubelet
    counts 200 to 399 as success."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"User-Agent": "kube-probe/1.32", "Accept": "*/*",
                                           "Connection": "close"})
        response = conn.getresponse()
        return response.status, response.read(10 * 1024).decode("utf-8", "replace")
    finally:
        conn.close()


@dataclass
class Replica:
    """A replica started exactly as the Deployment's container (command, env from its Secrets),
    after the migration Job's command, on a real PostgreSQL; ``port`` is its HTTP port here."""

    container: dict
    env: dict[str, str]
    port: int
    first_ready: tuple[int, str]
    stderr: Path

    def probe(self, name: str) -> tuple[int, str]:
        """The probe ``name`` as the kubelet runs it: its path, on the port standing in here for
        its container port, with the probe's own timeout."""
        path, _ = _http_get(self.container, name)
        return _kubelet_get(self.port, path, self.container[name].get("timeoutSeconds", 1))

    def get(self, path: str) -> str:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read().decode()


@pytest.fixture(scope="module")
def replica(postgres, tmp_path_factory):
    """The Job's command and env alone (the owner and runtime DSNs) must migrate, and the
    replica's alone (the runtime DSN, the token) must start and pass its readiness probe. The
    replica listens on the settings' own host (every interface, off loopback, so the token is
    required), on a free port standing in for the container port on a shared machine."""
    from tests.pg import ROLE_PASSWORDS, free_port

    tmp_path = tmp_path_factory.mktemp("replica")
    docs = _documents(_manifest_files())
    secrets = _secret_values(docs)
    for key in ("runtime_dsn", "owner_dsn", "admin_dsn"):
        user = f"qinglong_{key.removesuffix('_dsn')}"
        secrets[("qinglong-dsn", key)] = postgres.dsn(user, ROLE_PASSWORDS[user], "qinglong")
    secrets[("qinglong-http", "token")] = TOKEN
    settings = tmp_path / "qinglong.toml"
    settings.write_text(_settings_text())
    port = free_port()
    container = _container(docs, "Deployment")
    host, _ = split_listen(_load_as_container(_env(container, secrets), tmp_path, container["command"])
                           .settings.http.listen)

    def process_env(kind: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env.update(_env(_container(docs, kind), secrets))
        env["QINGLONG_SETTINGS"] = str(settings)  # the ConfigMap's file, mounted elsewhere here
        env["QINGLONG_HTTP__LISTEN"] = f"{host}:{port}"  # a free port on a shared machine
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    job = _container(docs, "Job")
    migrated = subprocess.run(job["command"], env=process_env("Job"), cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr

    env = process_env("Deployment")
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as err:
        process = subprocess.Popen(container["command"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                   stderr=err)
    try:
        replica = Replica(container, env, port, (0, ""), stderr)
        deadline = time.monotonic() + 60
        while True:
            try:
                ready = replica.probe("readinessProbe")
            except OSError as exc:  # nothing listens before the admission phase opens
                ready = (0, str(exc))
            if ready[0] == 200:
                break
            assert process.poll() is None, f"the replica exited ({process.returncode}): {stderr.read_text()}"
            assert time.monotonic() < deadline, f"not ready within 60 s: {ready}"
            time.sleep(0.2)
        replica.first_ready = ready
        yield replica
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    logged = stderr.read_text()
    assert process.returncode == 0, logged
    assert TOKEN not in logged and ROLE_PASSWORDS["qinglong_runtime"] not in logged


def test_migration_job_then_replica_pass_the_http_get_probes(replica):
    """A fresh install whose Job cannot migrate with its own env, or whose replica cannot start
    with its own, or whose probes do not reach the process, never gets a ready pod."""
    assert replica.first_ready == (200, "ready\n")
    for name in ("startupProbe", "livenessProbe"):
        assert replica.probe(name) == (200, "alive\n")


def test_probes_are_plain_http_gets_that_answer_without_the_token_while_metrics_refuse(replica):
    """The kubelet's httpGet probes send no token: if /livez or /readyz wanted it every replica
    would stay unready and be restarted forever (or each pod would pay an interpreter per probe
    again); and if /metrics or the status page answered without it, anyone reaching a pod's IP
    would read what runs when."""
    host, _ = split_listen(replica.env["QINGLONG_HTTP__LISTEN"])
    assert host == "0.0.0.0", "the replica must listen off loopback, as in the pod, for this to hold"
    for name, path in PROBE_PATHS.items():
        assert _http_get(replica.container, name)[0] == path
        status, body = replica.probe(name)
        assert 200 <= status < 400, (name, status, body)  # the kubelet's success
        assert body in ("alive\n", "ready\n") and TOKEN not in body
    for path in ("/metrics", "/"):
        status, body = _kubelet_get(replica.port, path, 30)
        assert status == 401, (path, status)
        assert "qinglong_" not in body and "<html" not in body.lower()
    assert "qinglong_build_info" in replica.get("/metrics")  # with the token it answers


def test_a_real_scrape_passes_promtool_check_metrics_and_has_every_metric(replica):
    """A scrape promtool finds fault with (a bad name, a histogram without +Inf, a duplicate
    series) may be rejected by Prometheus whole, and a metric missing from it leaves its alert
    rule matching nothing."""
    promtool = shutil.which("promtool")
    assert promtool, ("promtool is not installed (.ci/install-system-deps installs Debian's "
                      "prometheus package, which ships it)")
    text = replica.get("/metrics")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=60)
    # promtool exits 1 when the text does not parse and 3 when it parses but lints: the one
    # accepted lint finding is the fixed name of a gauge ending in _total (observe.METRICS).
    assert checked.returncode in (0, 3), checked.stdout + checked.stderr
    findings = set((checked.stdout + checked.stderr).strip().splitlines())
    assert findings <= KNOWN_LINT, sorted(findings - KNOWN_LINT)
    typed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    exported = {spec.name for spec in METRICS}
    assert exported <= typed, f"missing from a cluster replica's scrape: {sorted(exported - typed)}"
