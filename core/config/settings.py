"""Service settings from ``WEIR_*`` environment variables (pydantic-settings), for what belongs
to the process rather than to the config file: logging, the grace period of a drain.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class WeirSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WEIR_", extra="ignore", frozen=True)

    config: Path | None = Field(None, description="config file when --config is not given")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    shutdown_grace: float = Field(30.0, gt=0, description="seconds a drain may take on SIGTERM")

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v


def settings_or_exit() -> WeirSettings:
    """The settings, or exit 2 with a line per wrong variable, naming it."""
    try:
        return WeirSettings()
    except ValidationError as e:
        for err in e.errors():
            name = "WEIR_" + "_".join(map(str, err["loc"])).upper()
            print(f"weir: {name}={err.get('input')!s}: {err['msg']}", file=sys.stderr)
        raise SystemExit(2) from None
