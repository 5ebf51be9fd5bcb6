"""``python -m dashboards [--check]``: regenerate ``dashboards/generated/`` for the demo SLO
(``examples/demo-slo.yaml``); ``--check`` writes nothing and exits 1 when a file differs."""

from __future__ import annotations

import sys

from controlplane import openslo
from dashboards.export import (
    EXAMPLE_BASE_URL,
    EXAMPLE_DIR,
    EXAMPLE_SLO_FILE,
    example_slos,
    generated_files,
)


def main(argv: list[str]) -> int:
    slos = example_slos(openslo.parse_documents(EXAMPLE_SLO_FILE.read_text(encoding="utf-8")))
    files = generated_files(slos, base_url=EXAMPLE_BASE_URL)
    if "--check" in argv:
        stale = [
            name
            for name, text in files.items()
            if not (EXAMPLE_DIR / name).is_file()
            or (EXAMPLE_DIR / name).read_text(encoding="utf-8") != text
        ]
        for name in stale:
            print(f"stale: dashboards/generated/{name} (run python -m dashboards)")
        return 1 if stale else 0
    for name, text in files.items():
        path = EXAMPLE_DIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote dashboards/generated/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
