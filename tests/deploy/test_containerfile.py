"""The Containerfile, without a container engine: its build stage's wheel step and its image
stage's install steps, parsed from the file itself, run here in a fresh virtualenv from a copy of
the build context; then every command the Kubernetes manifests give a container must exist in
that environment, and every settings file they name must come from the settings ConfigMap."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "Containerfile"
BASE = REPO / "deploy" / "kubernetes"

pytestmark = pytest.mark.slow


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    joined, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        word, _, rest = current.strip().partition(" ")
        joined.append((word.upper(), rest.strip()))
        current = ""
    return joined


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions(CONTAINERFILE.read_text()):
        if instruction[0] == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    return stages


def _env_pairs(arguments: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in arguments.split())


def _ignored(patterns: list[str]):
    """shutil.copytree's ignore for .dockerignore patterns (the forms the file uses)."""
    def ignore(directory: str, names: list[str]) -> set[str]:
        relative = Path(directory).relative_to(_ignored.root)
        out = set()
        for name in names:
            path = str(relative / name) if str(relative) != "." else name
            for pattern in patterns:
                bare = pattern.removeprefix("**/")
                if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(name, bare):
                    out.add(name)
        return out
    return ignore


def _context(tmp_path: Path) -> Path:
    """The build context as COPY . . sees it: the checkout less .dockerignore's patterns."""
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    _ignored.root = REPO
    target = tmp_path / "src"
    shutil.copytree(REPO, target, ignore=_ignored(patterns), symlinks=True)
    return target


def _sh(command: str, env: dict[str, str], cwd: Path) -> None:
    result = subprocess.run(["/bin/sh", "-c", command], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """The image's virtualenv, made by the Containerfile's own steps with its paths moved into a
    temporary directory: ``/wheels`` and ``$VIRTUAL_ENV`` (``/opt/qinglong``) are the only paths
    they write."""
    tmp = tmp_path_factory.mktemp("image")
    build, final = _stages()
    assert build[0][1].endswith(" AS build")
    context = _context(tmp)
    wheels = tmp / "wheels"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QINGLONG_", "PIP_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # the build stage's python
    runs = [arguments for word, arguments in build if word == "RUN"]
    assert runs, "the build stage has no RUN step"
    for command in runs:
        _sh(command.replace("/wheels", str(wheels)), env, context)
    (wheel,) = wheels.glob("qinglong-*.whl")

    args = {}
    for word, arguments in final:
        if word == "ARG" and "=" in arguments:
            key, value = arguments.split("=", 1)
            args[key] = value
    venv = tmp / "opt-qinglong"
    image_env = dict(env, **args)
    declared_env: dict[str, str] = {}
    installs = []
    for word, arguments in final:
        if word == "ENV":
            declared_env.update(_env_pairs(arguments))
        elif word == "RUN" and ("groupadd" in arguments or "useradd" in arguments):
            continue  # the image's user: checked against the manifests, not made on this machine
        elif word == "RUN":
            installs.append(arguments)
    assert declared_env["VIRTUAL_ENV"] == "/opt/qinglong"
    image_env["VIRTUAL_ENV"] = str(venv)
    # a plain `python` as on the base image, not this test's virtualenv
    image_env["PATH"] = os.defpath
    python = shutil.which("python3", path=os.defpath)
    shim = tmp / "base-bin"
    shim.mkdir()
    (shim / "python").symlink_to(python)
    image_env["PATH"] = f"{shim}:{os.defpath}"
    assert installs, "the image stage installs nothing"
    for command in installs:
        _sh(command.replace("/wheels", str(wheels)), image_env, tmp)
    path = declared_env["PATH"].replace("/opt/qinglong", str(venv)).replace("$PATH", os.defpath)
    return {"venv": venv, "path": path, "final": final, "wheel": wheel, "extras": args["EXTRAS"]}


def _workload_containers() -> list[tuple[str, dict]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    found = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            if doc and doc["kind"] in ("Deployment", "Job"):
                pod = doc["spec"]["template"]["spec"]
                for container in pod.get("initContainers", []) + pod["containers"]:
                    found.append((f"{doc['metadata']['name']}/{container['name']}", container, pod))
    return found


def test_the_image_installs_the_wheel_with_the_cluster_extras_and_boots_the_cluster_profile(image):
    """An image whose install step fails, or installs without the extra its roles need
    (psycopg for the cluster), builds a container that exits at its first command."""
    assert image["extras"] == "cluster"
    qinglong = image["venv"] / "bin" / "qinglong"
    assert qinglong.exists()
    checked = subprocess.run([str(qinglong), "check", "closure", "--profile", "cluster", "--installed"],
                             capture_output=True, text=True, timeout=300, env={"PATH": image["path"]},
                             cwd=image["venv"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the installed package is the wheel's, not this checkout's
    version = subprocess.run([str(image["venv"] / "bin" / "python"), "-c",
                              "import qinglong, sys; print(qinglong.__file__)"],
                             capture_output=True, text=True, timeout=60, cwd=image["venv"])
    assert str(image["venv"]) in version.stdout, version.stdout + version.stderr


def test_every_manifest_command_exists_in_the_image(image):
    """A manifest naming a command the image does not have (a renamed subcommand, a missing
    entry point, an option it does not know) never starts its pod: the container exits 2 or
    127 on every restart."""
    containers = _workload_containers()
    assert {name for name, _, _ in containers} >= {
        "qinglong/wait-for-schema", "qinglong/qinglong", "qinglong-worker/worker", "qinglong-migrate/migrate"}
    for name, container, _ in containers:
        assert container["image"] == "qinglong", name
        command = container["command"] + container.get("args", [])
        program = shutil.which(command[0], path=image["path"])
        assert program is not None, f"{name}: {command[0]} is not on the image's PATH"
        assert Path(program).is_relative_to(image["venv"]), program
        helped = subprocess.run([program, *command[1:], "--help"], capture_output=True, text=True, timeout=120,
                                env={"PATH": image["path"]}, cwd=image["venv"])
        assert helped.returncode == 0, f"{name}: {command}: {helped.stderr}"


def test_every_settings_file_a_manifest_names_comes_from_the_settings_config_map():
    """QINGLONG_SETTINGS naming a file the ConfigMap does not hold is refused at start (exit 3,
    "settings file not found") on every pod that names it."""
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    (generator,) = kustomization["configMapGenerator"]
    files = set(generator["files"])
    for name, container, pod in _workload_containers():
        env = {item["name"]: item.get("value") for item in container["env"]}
        settings = Path(env["QINGLONG_SETTINGS"])
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == settings.parent]
        assert volumes[mount["name"]]["configMap"]["name"] == generator["name"], name
        assert settings.name in files, f"{name}: {settings.name} is not in the ConfigMap"
        assert (BASE / settings.name).exists()


def test_the_image_runs_as_the_manifests_non_root_user():
    """A Containerfile user other than the manifests' runAsUser leaves the pods' files (the
    virtualenv, the home) owned by someone else, and root would make every job root."""
    (_, final) = _stages()
    users = [arguments for word, arguments in final if word == "USER"]
    assert users == ["10001:10001"]
    (create,) = [arguments for word, arguments in final if word == "RUN" and "useradd" in arguments]
    assert "--uid 10001" in create and "--gid 10001" in create
    for name, _, pod in _workload_containers():
        context = pod["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"]) == (10001, 10001), name


def test_the_kustomization_names_the_image_tag_the_containerfile_documents():
    """The base deploys qinglong:<version>; a Containerfile documenting another tag builds an
    image the pods never find (ErrImagePull)."""
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert (image["name"], image["newTag"]) == ("qinglong", version)
    assert f"-t {image['newName']}:{version} ." in CONTAINERFILE.read_text()
    base = [arguments for word, arguments in _instructions(CONTAINERFILE.read_text()) if word == "FROM"]
    for arguments in base:
        tag = re.match(r"python:(\d+)\.(\d+)-slim", arguments)
        assert tag, arguments
        assert (int(tag.group(1)), int(tag.group(2))) == sys.version_info[:2], (
            "the image's Python differs from the one this test installs with")
