"""One default per setting: the settings models hold each default, a profile file only what that
profile changes, and the documentation's defaults tables are exactly the effective defaults."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from qinglong.host.profiles import available_profiles, load_profile
from qinglong.host.settings import (
    ApiSettings, DiagnosticsSettings, ExecutionSettings, HttpSettings, LifecycleSettings, SchedulerSettings,
    SecretsSettings, load_settings,
)
from qinglong.plugins.cluster_postgres.settings import ClusterPostgresSettings
from qinglong.plugins.edge_sqlite.settings import EdgeSqliteSettings

ROOT = Path(__file__).resolve().parents[2]
SECTION_MODELS = {"scheduler": SchedulerSettings, "lifecycle": LifecycleSettings,
                  "execution": ExecutionSettings, "http": HttpSettings, "api": ApiSettings,
                  "diagnostics": DiagnosticsSettings, "secrets": SecretsSettings}
BACKEND_MODELS = {"edge_sqlite": EdgeSqliteSettings, "cluster_postgres": ClusterPostgresSettings}
PROFILES = ("edge", "standalone", "cluster")
#: Where each documented table lives and which profiles it shows.
DOC_TABLES = {"README.md": PROFILES, "docs/cluster.md": ("cluster",)}
BEGIN, END = "<!-- defaults table begins -->", "<!-- defaults table ends -->"


@pytest.fixture(autouse=True)
def _no_environment_overrides(monkeypatch):
    for name in list(os.environ):
        if name.upper().startswith("QINGLONG_"):
            monkeypatch.delenv(name)


def effective_defaults(profile: str) -> dict[str, Any]:
    """``{"section.key": value}`` of a profile with no settings file and no environment."""
    loaded = load_settings(profile=profile)
    values: dict[str, Any] = {}
    for section in SECTION_MODELS:
        for key, value in getattr(loaded.settings, section).model_dump(mode="json").items():
            values[f"{section}.{key}"] = value
    backend = BACKEND_MODELS[loaded.profile.backend].model_validate(loaded.settings.backend)
    for key, value in backend.model_dump(mode="json").items():
        values[f"backend.{key}"] = value
    return values


def _cell(value: Any) -> str:
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def render_table(profiles: tuple[str, ...]) -> str:
    """The defaults table of ``profiles`` as the documentation shows it."""
    columns = {p: effective_defaults(p) for p in profiles}
    keys = []
    for values in columns.values():
        keys += [k for k in values if k not in keys]
    header = "| key | " + " | ".join(profiles) + " |"
    rule = "| --- |" + " --- |" * len(profiles)
    rows = ["| `" + key + "` | " + " | ".join(
        _cell(columns[p][key]) if key in columns[p] else "–" for p in profiles) + " |"
        for key in keys]
    return "\n".join([header, rule, *rows])


def _documented_table(doc: str) -> str:
    text = (ROOT / doc).read_text("utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{doc} must hold one defaults table"
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()


@pytest.mark.parametrize("doc", sorted(DOC_TABLES))
def test_documented_defaults_table_is_the_effective_defaults(doc):
    """An operator reading a default the code does not have sizes a router's memory, a lease or a
    pool by a number that is not the one running."""
    expected = render_table(DOC_TABLES[doc])
    assert _documented_table(doc) == expected, f"replace the table in {doc} with:\n{expected}"


def test_edge_quick_check_bound_is_documented_with_its_default():
    """A start-up check that reads the whole file is bounded; its bound must be findable."""
    assert effective_defaults("edge")["backend.quick_check_ms"] == 10_000
    assert "| `backend.quick_check_ms` | `10000` | `10000` | – |" in _documented_table("README.md")


@pytest.mark.parametrize("profile", available_profiles())
def test_profile_files_hold_only_what_differs_from_the_models(profile):
    """A profile value equal to the model's default is a second copy of it: changing the model would
    silently leave the profile on the old value, with nothing saying which one counts."""
    definition = load_profile(profile)
    backend_model = BACKEND_MODELS[definition.backend]
    models = dict(SECTION_MODELS, backend=backend_model)
    for section, values in definition.defaults.items():
        assert section in models, f"{profile}.toml: unknown section [defaults.{section}]"
        fields = models[section].model_fields
        for key, value in values.items():
            assert key in fields, f"{profile}.toml: unknown key {section}.{key}"
            assert value != fields[key].default, (
                f"{profile}.toml: {section}.{key} = {value!r} repeats the model's default")


def test_documented_example_settings_name_only_real_keys():
    """A key misspelled in a documented example is refused the moment a user copies it."""
    for doc in ("README.md", "docs/cluster.md"):
        text = (ROOT / doc).read_text("utf-8")
        for block in re.findall(r"```toml\n(.*?)```", text, re.S):
            data = tomllib.loads(block)
            backend = BACKEND_MODELS["cluster_postgres" if data.get("profile") == "cluster"
                                     else "edge_sqlite"]
            for section, values in data.items():
                if not isinstance(values, dict) or section == "plugins":
                    continue
                model = backend if section == "backend" else SECTION_MODELS[section]
                assert set(values) <= set(model.model_fields), (doc, section, values)
