"""``config/weir.schema.json``: the JSON Schema of the config file, generated from the models,
for editors and CI checks of users' files. ``python -m core.config.schema`` rewrites it, and the
key reference of docs/configuration.md (core/config/reference.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.config import reference
from core.config.model import WeirConfig

PATH = Path(__file__).parents[2] / "config" / "weir.schema.json"


def schema() -> dict[str, Any]:
    doc = WeirConfig.model_json_schema(by_alias=True)
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "Weir config file"
    return doc


def render() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    reference.PAGE.write_text(reference.rewrite(reference.PAGE.read_text()))
    print(f"wrote {PATH} and {reference.PAGE}")
