"""The Kubernetes base in deploy/kubernetes: valid against the Kubernetes schemas, rendered by
kustomize with Secrets generated from the operator's files (none shipped), and in agreement with
the settings models (ports, probe paths, env and Secret names, the workers' drain); the replicas'
init container waits for the migration Job's schema on a real PostgreSQL, the replica then starts
and its httpGet probes, sent as the kubelet sends them (no token), answer while /metrics and the
status page refuse a request without the token; a worker started as its container is runs Runs."""

from __future__ import annotations

import http.client
import json
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



#: The workloads of the base: (kind, name) -> the component label they carry.
WORKLOADS = {("Deployment", "qinglong"): "scheduler", ("Deployment", "qinglong-worker"): "worker",
             ("Deployment", "qinglong-api"): "api", ("Job", "qinglong-migrate"): "migrate"}
#: Values standing in for the operator's Secret files (secrets/README.md).
SECRET_FILES = {"runtime_dsn": "host=postgres dbname=qinglong user=qinglong_runtime password=rt-secret",
                "owner_dsn": "host=postgres dbname=qinglong user=qinglong_owner password=ow-secret",
                "http_token": TOKEN,
                "worker_dsn": "host=postgres dbname=qinglong user=qinglong_gateway password=wk-secret",
                "admin_dsn": "host=postgres dbname=qinglong user=qinglong_admin password=ad-secret",
                "api_tls.crt": "-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n",
                "api_tls.key": "-----BEGIN PRIVATE KEY-----\nstand-in\n-----END PRIVATE KEY-----\n",
                "secrets_key": "q6hZzvQTJvOnBw0mnD0mF1ck8hdyYnFvOQGBXdBAqT4="}


def _kustomization() -> dict:
    return yaml.safe_load((BASE / "kustomization.yaml").read_text())


def _manifest_files() -> list[Path]:
    return [BASE / name for name in _kustomization()["resources"]]


def _generated_secrets(files: dict[str, str]) -> dict[tuple[str, str], str]:
    """(Secret name, key) -> value, as the kustomization's secretGenerator makes them from the
    files under the base (here: ``files``, by path relative to the base)."""
    found = {}
    for generator in _kustomization()["secretGenerator"]:
        for item in generator["files"]:
            key, _, path = item.partition("=")
            found[(generator["name"], key)] = files[path]
    return found


def _documents(paths) -> list[dict]:
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def _by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def _kustomize(base: Path) -> subprocess.CompletedProcess:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed: the kustomization cannot be rendered here"
    return subprocess.run([kubectl, "kustomize", str(base)], capture_output=True, text=True, timeout=60)


def _base_with_secret_files(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    """A copy of the base with the operator's Secret files written (``files``: path -> value)."""
    base = tmp_path / "kubernetes"
    shutil.copytree(BASE, base, ignore=shutil.ignore_patterns(*SECRET_FILES))
    for path, value in (SECRET_FILES if files is None else files).items():
        (base / path).parent.mkdir(parents=True, exist_ok=True)
        (base / path).write_text(value)
    return base


def _rendered(tmp_path: Path) -> list[dict]:
    files = {f"secrets/{name}": value for name, value in SECRET_FILES.items()}
    result = _kustomize(_base_with_secret_files(tmp_path, files))
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _workload(docs: list[dict], kind: str, name: str) -> dict:
    (workload,) = [d for d in _by_kind(docs, kind) if d["metadata"]["name"] == name]
    return workload


def _container(docs: list[dict], kind: str, name: str | None = None, *, init: str | None = None) -> dict:
    """The main container of workload ``name`` (default: the scheduler Deployment or the Job), or
    its init container ``init``."""
    name = name or {"Deployment": "qinglong", "Job": "qinglong-migrate"}[kind]
    pod = _workload(docs, kind, name)["spec"]["template"]["spec"]
    if init is not None:
        (container,) = [c for c in pod["initContainers"] if c["name"] == init]
        return container
    (container,) = pod["containers"]
    return container


def _secret_values(docs: list[dict]) -> dict[tuple[str, str], str]:
    """The Secrets' values the tests stand in with, as generated from the operator's files."""
    assert not _by_kind(docs, "Secret"), "the base must not ship a Secret object"
    return _generated_secrets({f"secrets/{name}": value for name, value in SECRET_FILES.items()})


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


def _settings_text(name: str = "qinglong.toml") -> str:
    (generator,) = _kustomization()["configMapGenerator"]
    assert name in generator["files"]
    return (BASE / name).read_text()


def _load_as_container(env: dict[str, str], tmp_path: Path, command: list[str]):
    """Settings as the container's process builds them: the ConfigMap's file named by its
    QINGLONG_SETTINGS, under exactly the container's QINGLONG_* environment."""
    assert env["QINGLONG_SETTINGS"].startswith("/etc/qinglong/")
    name = Path(env["QINGLONG_SETTINGS"]).name
    settings = tmp_path / name
    settings.write_text(_settings_text(name))
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
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Job", "Deployment", "Service", "PodDisruptionBudget"}
    assert {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in ("Deployment", "Job")} == set(WORKLOADS)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_renders_and_the_rendered_objects_validate(tmp_path):
    """The base is applied as `kubectl apply -k`: a kustomization that does not render, or
    renders objects the API refuses, cannot be deployed at all; a pod referring to a Secret or
    ConfigMap by the name before kustomize's hash suffix waits forever for one that never
    exists."""
    rendered = _rendered(tmp_path)
    for doc in rendered:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (config_map,) = _by_kind(rendered, "ConfigMap")
    assert config_map["data"]["qinglong.toml"] == _settings_text()
    assert config_map["data"]["worker.toml"] == _settings_text("worker.toml")
    assert config_map["data"]["api.toml"] == _settings_text("api.toml")
    secrets = {s["metadata"]["name"]: s for s in _by_kind(rendered, "Secret")}
    import base64

    values = {(s["metadata"]["name"].rsplit("-", 1)[0], key): base64.b64decode(v).decode()
              for s in secrets.values() for key, v in s["data"].items()}
    assert values == _secret_values(_documents(_manifest_files()))
    for (kind, name) in WORKLOADS:
        pod = _workload(rendered, kind, name)["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        # the generated, hash-suffixed names are the ones the pods mount and read
        assert volumes["settings"]["configMap"]["name"] == config_map["metadata"]["name"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            for item in container["env"]:
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets and ref["key"] in secrets[ref["name"]]["data"], (name, ref)


def test_applying_the_base_never_overwrites_a_real_secret_with_a_placeholder(tmp_path):
    """A base shipping Secret objects with placeholder values replaces the operator's real
    Secrets at every `kubectl apply -k`: the replicas then start with a password no role has
    (or a published token). The base ships none, and without the operator's files it does not
    render at all, naming the missing file, so nothing is applied."""
    docs = _documents(_manifest_files())
    assert not _by_kind(docs, "Secret")
    assert "REPLACE-ME" not in "".join(path.read_text() for path in BASE.rglob("*") if path.is_file())
    shipped = {path.name for path in (BASE / "secrets").iterdir()}
    assert shipped == {".gitignore", "README.md"}, f"a Secret value is committed: {shipped}"
    missing = _kustomize(_base_with_secret_files(tmp_path, {}))
    assert missing.returncode != 0
    assert "secrets/" in missing.stderr and "no such file" in missing.stderr.lower(), missing.stderr
    readme = (BASE / "secrets" / "README.md").read_text()
    for generator in _kustomization()["secretGenerator"]:
        for item in generator["files"]:
            key, _, path = item.partition("=")
            assert f"`{Path(path).name}` | `{generator['name']}`, `{key}`" in readme, item


def test_deployment_runs_the_cluster_profile_as_non_root_on_a_read_only_root():
    """A replica running as root, or able to write its image, turns any code execution through
    a task or a dependency into a persistent foothold in the cluster."""
    docs = _documents(_manifest_files())
    for (kind, name), component in WORKLOADS.items():
        workload = _workload(docs, kind, name)
        assert workload["metadata"]["labels"]["app.kubernetes.io/component"] == component
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        for container in pod.get("initContainers", []) + pod["containers"]:
            context = container["securityContext"]
            assert context == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                               "capabilities": {"drop": ["ALL"]}}, (name, container["name"])
            assert {"requests", "limits"} <= set(container["resources"]), (name, container["name"])
    assert _container(docs, "Deployment")["command"] == ["qinglong", "run", "--profile", "cluster"]
    assert _container(docs, "Job")["command"] == ["qinglong", "db", "migrate", "--profile", "cluster"]
    assert _container(docs, "Deployment", "qinglong-worker")["command"] == ["qinglong", "worker", "--profile",
                                                                           "cluster"]
    assert _container(docs, "Deployment", "qinglong-api")["command"] == ["qinglong", "api", "--profile", "cluster"]
    pdbs = {pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]: pdb
            for pdb in _by_kind(docs, "PodDisruptionBudget")}
    assert set(pdbs) == {"scheduler", "worker", "api"}
    for (kind, name), component in WORKLOADS.items():
        if kind == "Deployment":
            deployment = _workload(docs, kind, name)
            assert pdbs[component]["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
            assert deployment["spec"]["replicas"] > pdbs[component]["spec"]["maxUnavailable"]


def _http_get(container: dict, name: str, scheme: str = "HTTP") -> tuple[str, int]:
    """The path and container port of the probe ``name``, which must be a plain httpGet: no
    headers (the kubelet cannot take one from a Secret), no host (the pod's IP), ``scheme``."""
    probe = container[name]
    assert set(probe) - PROBE_TIMING == {"httpGet"}, f"{name} is not an httpGet probe: {sorted(probe)}"
    get = probe["httpGet"]
    assert set(get) <= {"path", "port", "scheme"}, f"{name}: {sorted(get)}"
    assert get.get("scheme", "HTTP") == scheme
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
    services = {s["metadata"]["name"]: s for s in _by_kind(docs, "Service")}
    assert set(services) == {"qinglong", "qinglong-api"}
    assert services["qinglong"]["spec"]["ports"][0]["targetPort"] == container_port["name"]
    assert services["qinglong"]["spec"]["selector"] == _workload(docs, "Deployment", "qinglong")["spec"]["selector"][
        "matchLabels"]


def test_the_api_pods_serve_https_on_the_port_their_probes_and_service_use(tmp_path):
    """API pods whose probes miss their port or scheme are restarted forever or never get
    traffic; a Service selecting the scheduler replicas would send API calls to pods that do not
    serve /api/v1; plain HTTP off loopback is refused at start (exit 3), a crash loop."""
    docs = _documents(_manifest_files())
    container = _container(docs, "Deployment", "qinglong-api")
    secrets = _secret_values(docs)
    loaded = _load_as_container(_env(container, secrets), tmp_path, container["command"])
    host, port = split_listen(loaded.settings.http.listen)
    assert host == "0.0.0.0"
    api = loaded.settings.api
    pod = _workload(docs, "Deployment", "qinglong-api")["spec"]["template"]["spec"]
    (tls,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "qinglong-api"
    (mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "tls"]
    files = {f"{mount}/{item['path']}": item["key"] for item in tls["secret"]["items"]}
    assert files == {api.tls_cert_file: "tls.crt", api.tls_key_file: "tls.key"}
    assert {key for name, key in secrets if name == "qinglong-api"} >= {"tls.crt", "tls.key"}
    (container_port,) = container["ports"]
    assert container_port == {"name": "https", "containerPort": port, "protocol": "TCP"}
    assert {name: _http_get(container, name, "HTTPS") for name in PROBE_PATHS} == {
        name: (path, port) for name, path in PROBE_PATHS.items()}
    service = _workload(docs, "Service", "qinglong-api")
    assert service["spec"]["selector"] == _workload(docs, "Deployment", "qinglong-api")["spec"]["selector"][
        "matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "https"
    assert pod["terminationGracePeriodSeconds"] >= loaded.settings.lifecycle.stop_timeout_ms / 1000


def test_env_and_secret_names_resolve_to_real_settings_keys(tmp_path):
    """An env name that matches no key (QINGLONG_BACKEND_RUNTIME_DSN with one underscore) is
    ignored: the replica would start without its DSN, or the Job without the owner's, and the
    Secret's value would never be used."""
    docs = _documents(_manifest_files())
    secrets = _secret_values(docs)
    # the admin DSN is in the API's own Secret, mounted by the API pods alone
    assert {key for name, key in secrets if name == "qinglong-dsn"} == {"runtime_dsn", "owner_dsn"}
    assert {key for name, key in secrets if name == "qinglong-api"} == {"admin_dsn", "tls.crt", "tls.key"}
    assert {key for key in ClusterPostgresSettings.model_fields if key.endswith("_dsn")} >= {"runtime_dsn",
                                                                                              "owner_dsn"}
    assert {key for name, key in secrets if name == "qinglong-http"} == {"token"}
    assert "token" in QinglongSettings.model_fields["http"].annotation.model_fields
    expected = {("Deployment", None): {"runtime_dsn"}, ("Job", None): {"owner_dsn", "runtime_dsn"},
                ("Deployment", "wait-for-schema"): {"runtime_dsn"}, ("api", None): {"runtime_dsn", "admin_dsn"}}
    secrets_by_key = {key: value for (_, key), value in secrets.items() if key.endswith("_dsn")}
    for (kind, init), dsn_keys in expected.items():
        container = (_container(docs, "Deployment", "qinglong-api") if kind == "api"
                     else _container(docs, kind, init=init))
        env = _env(container, secrets)
        loaded = _load_as_container(env, tmp_path, container["command"])
        assert loaded.settings.profile == "cluster"
        backend = ClusterPostgresSettings.model_validate(loaded.settings.backend)
        for key in ClusterPostgresSettings.model_fields:
            if key.endswith("_dsn"):
                value = getattr(backend, key)
                if key in dsn_keys:
                    assert value.get_secret_value() == secrets_by_key[key], (kind, key)
                else:
                    assert value is None, f"the {kind} gets {key}, which it does not need"
        if (kind, init) in (("Deployment", None), ("api", None)):
            assert loaded.settings.http.token == TOKEN
        else:
            assert loaded.settings.http.token is None, f"{kind} {init} gets the HTTP token"
    # exactly the API pods hold the admin DSN: no other container of any workload refers to it
    holders = {(name, c["name"]) for (kind, name) in WORKLOADS
               for c in _workload(docs, kind, name)["spec"]["template"]["spec"].get("initContainers", [])
               + _workload(docs, kind, name)["spec"]["template"]["spec"]["containers"]
               for item in c["env"]
               if item.get("valueFrom", {}).get("secretKeyRef", {}).get("key") == "admin_dsn"
               or item["name"] == "QINGLONG_BACKEND__ADMIN_DSN"}
    assert holders == {("qinglong-api", "qinglong")}
    # the secrets key: the replicas and the API pods, which seal and open env values, alone
    key_holders = {(name, c["name"]) for (kind, name) in WORKLOADS
                   for c in _workload(docs, kind, name)["spec"]["template"]["spec"].get("initContainers", [])
                   + _workload(docs, kind, name)["spec"]["template"]["spec"]["containers"]
                   for item in c["env"]
                   if item.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "qinglong-secrets"}
    assert key_holders == {("qinglong", "qinglong"), ("qinglong-api", "qinglong")}
    assert QinglongSettings.model_fields["secrets"].annotation.model_fields["key_env"].default == \
        "QINGLONG_SECRETS_KEY"


def test_the_replicas_wait_for_the_schema_in_an_init_container_bounded_by_the_jobs_deadline():
    """The Job and the replicas are applied together: without a wait the replicas exit 4 on
    the pending schema and crash-loop until the Job ends; a wait without a bound (or one shorter
    than the Job may take) would hide a failed Job behind a pod stuck in Init, or give up on a
    Job still running."""
    docs = _documents(_manifest_files())
    init = _container(docs, "Deployment", init="wait-for-schema")
    command = init["command"]
    assert command[:5] == ["qinglong", "db", "wait", "--profile", "cluster"]
    from qinglong.host.cli.parsing import parse_duration_ms

    timeout_s = parse_duration_ms("--timeout", command[command.index("--timeout") + 1]) / 1000
    job = _workload(docs, "Job", "qinglong-migrate")
    assert timeout_s >= job["spec"]["activeDeadlineSeconds"]
    main = _container(docs, "Deployment")
    assert init["image"] == main["image"]
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]} == {
        m["name"]: m["mountPath"] for m in main["volumeMounts"]}


# ---- the workers ----------------------------------------------------------------------------


def test_worker_env_resolves_to_worker_settings_and_its_drain_fits_the_grace_period(tmp_path):
    """A worker pod killed before its drain ends loses its jobs' outcomes (they end `lost` a
    lease later) at every rollout; an env name that matches no key would start workers without
    their DSN, and two pods sharing a worker id would fence each other in turn."""
    docs = _documents(_manifest_files())
    secrets = _secret_values(docs)
    container = _container(docs, "Deployment", "qinglong-worker")
    env_items = {item["name"]: item for item in container["env"]}
    assert env_items["QINGLONG_WORKER__WORKER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    env = {k: v for k, v in _env({"env": [i for i in container["env"] if "fieldRef" not in i.get("valueFrom", {})]},
                                  secrets).items()}
    env["QINGLONG_WORKER__WORKER_ID"] = "qinglong-worker-5d8f9c7b6-x2x7q"
    loaded = _load_as_container(env, tmp_path, container["command"])
    worker = loaded.settings.worker
    assert loaded.settings.profile == "cluster"
    assert worker.dsn.get_secret_value() == secrets[("qinglong-worker", "dsn")]
    assert worker.worker_id == env["QINGLONG_WORKER__WORKER_ID"]
    assert loaded.settings.http.token is None
    backend = ClusterPostgresSettings.model_validate(loaded.settings.backend)
    assert all(getattr(backend, key) is None for key in ClusterPostgresSettings.model_fields if key.endswith("_dsn"))
    pod = _workload(docs, "Deployment", "qinglong-worker")["spec"]["template"]["spec"]
    drain_s = (worker.drain_timeout_ms + worker.kill_grace_ms) / 1000
    assert pod["terminationGracePeriodSeconds"] >= drain_s + 10, (pod["terminationGracePeriodSeconds"], drain_s)
    # the Attempt directories are on a writable volume (the root file system is read-only)
    mounts = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert any(Path(worker.log_dir).is_relative_to(m) for m in mounts), worker.log_dir
    assert Path(env["HOME"]) in {Path(m) for m in mounts}
    # no HTTP surface, so no probe pretending to check one
    assert not {"livenessProbe", "readinessProbe", "startupProbe", "ports"} & set(container)


# ---- the manifests' commands and environment against a real PostgreSQL ------------------------


@pytest.fixture(scope="module")
def postgres():
    from tests.support.pg import create_database, create_roles, start_server

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
    postgres: object
    secrets: dict
    docs: list
    tmp_path: Path
    process_env: object

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
    """Applied together, as `kubectl apply -k` does: the replicas' init container (its command
    and env alone) waits, without exiting, while the schema is missing; the Job's command and env
    alone (the owner and runtime DSNs) migrate; the init container then ends 0 and the replica's
    own command and env (the runtime DSN, the token) start it and pass its readiness probe. The
    replica listens on the settings' own host (every interface, off loopback, so the token is
    required), on a free port standing in for the container port on a shared machine."""
    from tests.support.pg import ROLE_PASSWORDS, free_port

    tmp_path = tmp_path_factory.mktemp("replica")
    docs = _documents(_manifest_files())
    secrets = _secret_values(docs)
    for key in ("runtime_dsn", "owner_dsn"):
        user = f"qinglong_{key.removesuffix('_dsn')}"
        secrets[("qinglong-dsn", key)] = postgres.dsn(user, ROLE_PASSWORDS[user], "qinglong")
    secrets[("qinglong-worker", "dsn")] = postgres.dsn(
        "qinglong_gateway", ROLE_PASSWORDS["qinglong_gateway"], "qinglong")
    for name in ("qinglong.toml", "worker.toml"):
        (tmp_path / name).write_text(_settings_text(name))
    port = free_port()
    container = _container(docs, "Deployment")
    host, _ = split_listen(_load_as_container(_env(container, secrets), tmp_path, container["command"])
                           .settings.http.listen)

    def process_env(of: dict) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
        env.update(_env({"env": [i for i in of["env"] if "fieldRef" not in i.get("valueFrom", {})]}, secrets))
        # the ConfigMap's file, mounted elsewhere here
        env["QINGLONG_SETTINGS"] = str(tmp_path / Path(env["QINGLONG_SETTINGS"]).name)
        env["QINGLONG_HTTP__LISTEN"] = f"{host}:{port}"  # a free port on a shared machine
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    init = _container(docs, "Deployment", init="wait-for-schema")
    waiting = subprocess.Popen(init["command"], env=process_env(init), cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        first = waiting.stderr.readline()  # written once its first check found no schema
        assert first.startswith("qinglong: waiting: "), first
        assert waiting.poll() is None, "the init container exited instead of waiting"
        job = _container(docs, "Job")
        migrated = subprocess.run(job["command"], env=process_env(job), cwd=tmp_path, capture_output=True,
                                  text=True, timeout=120)
        assert migrated.returncode == 0, migrated.stderr
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, first + err
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert ROLE_PASSWORDS["qinglong_runtime"] not in first + err

    env = process_env(container)
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as err:
        process = subprocess.Popen(container["command"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                   stderr=err)
    try:
        replica = Replica(container, env, port, (0, ""), stderr, postgres, secrets, docs, tmp_path,
                          process_env)
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


def _settings_worker_dir(container: dict) -> str:
    (mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "work"]
    return mount


def test_a_worker_started_as_its_container_runs_the_runs_the_replica_admits(replica):
    """Without a worker Deployment every Run the replicas admit stays queued forever; a worker
    whose command or env does not work (a DSN key it does not read, a settings file it cannot
    find) leaves them queued just the same. Its SIGTERM (the kubelet's stop) must drain and exit 0
    within the pod's grace period."""
    from tests.support.pg import ROLE_PASSWORDS

    admin = replica.tmp_path / "admin.toml"
    admin.write_text('profile = "cluster"\n[backend]\nruntime_dsn = "%s"\nadmin_dsn = "%s"\n' % (
        replica.secrets[("qinglong-dsn", "runtime_dsn")],
        replica.postgres.dsn("qinglong_admin", ROLE_PASSWORDS["qinglong_admin"], "qinglong")))
    cli_env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    cli_env["QINGLONG_SETTINGS"] = str(admin)

    def cli(*args: str) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, "-m", "qinglong", *args], env=cli_env, cwd=replica.tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (args, result.stderr)
        return result

    cli("project", "create", "k8s")
    cli("task", "put", "k8s", "hello", "--", "/bin/sh", "-c", "echo hello from the worker")
    cli("trigger", "add", "k8s", "every-second", "--task", "hello", "--cron", "* * * * * *")
    container = _container(replica.docs, "Deployment", "qinglong-worker")
    env = replica.process_env(container)
    env["QINGLONG_WORKER__WORKER_ID"] = "qinglong-worker-test-pod"  # the pod's name (fieldRef)
    pod = _workload(replica.docs, "Deployment", "qinglong-worker")["spec"]["template"]["spec"]
    log_dir = replica.tmp_path / "worker-logs"
    env["QINGLONG_WORKER__LOG_DIR"] = str(log_dir)  # the emptyDir, elsewhere here
    assert Path(env["HOME"]) == Path(_settings_worker_dir(container))
    env["HOME"] = str(replica.tmp_path)  # ... and the jobs' HOME on it
    stderr = replica.tmp_path / "worker.stderr"
    with open(stderr, "w") as err:
        worker = subprocess.Popen(container["command"], env=env, cwd=replica.tmp_path, stdout=subprocess.DEVNULL,
                                  stderr=err)
    try:
        deadline = time.monotonic() + 120
        while True:
            runs = [r for r in json.loads(cli("runs", "--json").stdout)
                    if r["state"] not in ("queued", "dispatching", "running", "retry_wait")]
            if runs:
                assert runs[0]["state"] == "succeeded", (runs[0], stderr.read_text())
                break
            assert worker.poll() is None, f"the worker exited ({worker.returncode}): {stderr.read_text()}"
            assert time.monotonic() < deadline, f"no Run succeeded within 120 s: {stderr.read_text()}"
            time.sleep(0.5)
        shown = cli("logs", runs[0]["run_id"]).stdout
        assert shown == "hello from the worker\n"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=pod["terminationGracePeriodSeconds"]) == 0, stderr.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        cli("trigger", "disable", "k8s", "every-second")
    logged = stderr.read_text()
    assert ROLE_PASSWORDS["qinglong_gateway"] not in logged


def test_an_api_pod_started_as_its_container_serves_https_probes_and_holds_the_admin_dsn(replica):
    """An API container whose command, env or mounted TLS files do not work never becomes ready
    (no remote management at all); its probes must answer over HTTPS without a token while the
    API refuses a request without one, and its SIGTERM (the kubelet's stop) must exit 0 within
    the pod's grace period without the admin password reaching its log."""
    import ssl

    from tests.support.pg import ROLE_PASSWORDS, free_port

    docs = replica.docs
    container = _container(docs, "Deployment", "qinglong-api")
    secrets = dict(replica.secrets)
    secrets[("qinglong-api", "admin_dsn")] = replica.postgres.dsn(
        "qinglong_admin", ROLE_PASSWORDS["qinglong_admin"], "qinglong")
    (replica.tmp_path / "api.toml").write_text(_settings_text("api.toml"))
    tls = replica.tmp_path / "tls"
    tls.mkdir()
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                           "/CN=127.0.0.1", "-keyout", str(tls / "tls.key"), "-out", str(tls / "tls.crt")],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("QINGLONG_")}
    env.update(_env(container, secrets))
    env["QINGLONG_SETTINGS"] = str(replica.tmp_path / "api.toml")
    port = free_port()
    env["QINGLONG_HTTP__LISTEN"] = f"0.0.0.0:{port}"
    env["QINGLONG_API__TLS_CERT_FILE"] = str(tls / "tls.crt")  # the Secret's mount, elsewhere here
    env["QINGLONG_API__TLS_KEY_FILE"] = str(tls / "tls.key")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE  # as the kubelet's HTTPS probes

    def get(path: str) -> tuple[int, str]:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=unverified)
        try:
            conn.request("GET", path, headers={"User-Agent": "kube-probe/1.32", "Connection": "close"})
            answer = conn.getresponse()
            return answer.status, answer.read(10 * 1024).decode("utf-8", "replace")
        finally:
            conn.close()

    stderr = replica.tmp_path / "api.stderr"
    with open(stderr, "w") as err:
        process = subprocess.Popen(container["command"], env=env, cwd=replica.tmp_path, stdout=subprocess.DEVNULL,
                                   stderr=err)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                ready = get(_http_get(container, "readinessProbe", "HTTPS")[0])
            except OSError as exc:
                ready = (0, str(exc))
            if ready[0] == 200:
                break
            assert process.poll() is None, f"the API exited ({process.returncode}): {stderr.read_text()}"
            assert time.monotonic() < deadline, f"not ready within 60 s: {ready}"
            time.sleep(0.2)
        assert get(_http_get(container, "livenessProbe", "HTTPS")[0])[0] == 200
        assert get("/api/v1/projects")[0] == 401
        process.send_signal(signal.SIGTERM)
        pod = _workload(docs, "Deployment", "qinglong-api")["spec"]["template"]["spec"]
        assert process.wait(timeout=pod["terminationGracePeriodSeconds"]) == 0, stderr.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    logged = stderr.read_text()
    assert ROLE_PASSWORDS["qinglong_admin"] not in logged and TOKEN not in logged
