"""Write the dashboards, the rule file and Grafana provisioning files into a folder.

Layout (what ``goodput dashboards export DIR`` writes; ``dashboards/generated/`` holds it
for the demo SLO, checked by a test)::

    DIR/dashboards/<uid>.json                      one per dashboard (classic JSON)
    DIR/provisioning/datasources/goodput.yaml      a Prometheus datasource
    DIR/provisioning/dashboards/goodput.yaml       a file provider for DIR/dashboards
    DIR/rules/goodput.rules.yaml                   the rules of the SLOs given

Grafana loads the provisioning folder with ``GF_PATHS_PROVISIONING`` (or by copying both
files into ``/etc/grafana/provisioning``); the provider's ``path`` must point at where the
JSON files are mounted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import yaml

from controlplane.schemas.slo import SLOCreate, SLOPublic
from dashboards.panels import DASHBOARDS, dashboard_json
from dashboards.rules import SLORuleSource
from dashboards.shared_rules import render_shared_rules

__all__ = [
    "EXAMPLE_BASE_URL",
    "EXAMPLE_DIR",
    "EXAMPLE_SLO_FILE",
    "RULES_FILE",
    "example_slos",
    "export",
    "generated_files",
    "provisioning_files",
]

EXAMPLE_DIR = Path(__file__).resolve().parent / "generated"
EXAMPLE_SLO_FILE = Path(__file__).resolve().parents[1] / "examples" / "demo-slo.yaml"
EXAMPLE_BASE_URL = "http://127.0.0.1:8000"
RULES_FILE = "rules/goodput.rules.yaml"
_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


def provisioning_files(
    *,
    prometheus_url: str = "http://127.0.0.1:9090",
    dashboards_path: str = "/var/lib/grafana/dashboards/goodput",
) -> dict[str, str]:
    """Grafana provisioning YAML: the datasource (uid ``prometheus``) and a file provider."""
    datasource = {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Prometheus",
                "type": "prometheus",
                "uid": "prometheus",
                "access": "proxy",
                "url": prometheus_url,
                "isDefault": True,
                "jsonData": {"timeInterval": "15s"},
            }
        ],
    }
    provider = {
        "apiVersion": 1,
        "providers": [
            {
                "name": "goodput",
                "folder": "Goodput",
                "type": "file",
                "disableDeletion": False,
                "updateIntervalSeconds": 30,
                "allowUiUpdates": False,
                "options": {"path": dashboards_path, "foldersFromFilesStructure": False},
            }
        ],
    }
    return {
        "provisioning/datasources/goodput.yaml": yaml.safe_dump(datasource, sort_keys=False),
        "provisioning/dashboards/goodput.yaml": yaml.safe_dump(provider, sort_keys=False),
    }


def generated_files(slos: Sequence[SLORuleSource], *, base_url: str) -> dict[str, str]:
    """Every file of the layout above, by relative path (the dashboards, the provisioning
    files and, for ``slos``, the rule file). :class:`~dashboards.rules.RulesError` when an
    SLO's rules cannot be expressed."""
    files = {
        f"dashboards/{spec.uid}.json": json.dumps(dashboard_json(spec), indent=2) + "\n"
        for spec in DASHBOARDS
    }
    files.update(provisioning_files())
    files[RULES_FILE] = render_shared_rules(slos, base_url=base_url)
    return files


def export(directory: Path, slos: Sequence[SLORuleSource], *, base_url: str) -> list[Path]:
    """Write :func:`generated_files` under ``directory``; returns the paths written."""
    written = []
    for relative, text in generated_files(slos, base_url=base_url).items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def example_slos(definitions: Sequence[SLOCreate]) -> list[SLOPublic]:
    """Registry-like SLOs (version 1, an id derived from the name) for files generated
    without a database, e.g. the committed examples."""
    return [
        SLOPublic.model_validate(
            {
                **d.model_dump(mode="json"),
                "selector": d.selector.model_dump(exclude_none=True),
                "id": uuid.uuid5(uuid.NAMESPACE_URL, f"goodput-slo:{d.name}"),
                "version": 1,
                "created_at": _EPOCH,
                "updated_at": _EPOCH,
                "deleted_at": None,
            }
        )
        for d in definitions
    ]
