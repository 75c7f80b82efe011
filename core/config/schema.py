"""``config/weir.schema.json``: the JSON Schema of the config file, generated from the models,
for editors and CI checks of users' files. ``python -m core.config.schema`` rewrites it, and the
key reference of docs/configuration.md (core/config/reference.py).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from core.config import reference
from core.config.base import duration_text
from core.config.model import WeirConfig

PATH = Path(__file__).parents[2] / "config" / "weir.schema.json"


class _AsWritten(GenerateJsonSchema):
    """Defaults as a config file writes them: a duration ``10s``, not ISO 8601's ``PT10S``."""

    def encode_default(self, dft: Any) -> Any:
        return duration_text(dft) if isinstance(dft, timedelta) else super().encode_default(dft)


def schema() -> dict[str, Any]:
    doc = WeirConfig.model_json_schema(by_alias=True, schema_generator=_AsWritten)
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "Weir config file"
    return doc


def render() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    reference.PAGE.write_text(reference.rewrite(reference.PAGE.read_text()))
    print(f"wrote {PATH} and {reference.PAGE}")
