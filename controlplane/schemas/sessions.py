"""Wire models of one-time console sign-in links (``/api/v1/sessions/links``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field

from controlplane.schemas.common import WireModel

__all__ = ["SignInLinkCreate", "SignInLinkPublic"]


class SignInLinkCreate(WireModel):
    ttl_s: Annotated[float, Field(gt=0, le=86_400)] = 600.0


class SignInLinkPublic(BaseModel):
    path: str
    expires_at: datetime
