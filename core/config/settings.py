"""Service settings from ``WEIR_*`` environment variables (pydantic-settings), for what belongs
to the process rather than to the config file: logging, the grace period of a drain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class WeirSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WEIR_", extra="ignore", frozen=True)

    config: Path | None = Field(None, description="config file when --config is not given")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    shutdown_grace: float = Field(30.0, gt=0, description="seconds a drain may take on SIGTERM")
