"""Agent keys act only for the fleet members they registered (``agent_binding``).

A gateway's or worker's agent registers its member with an ``agent`` key; from then on
only that key may register the member again (an endpoint cannot be overwritten by another
agent), beat for it, poll and ack its commands. An ``admin`` key may act for any member and
binds nothing. A member registered before bindings existed is bound to the first agent key
that acts for it. One key may hold many members (a host's agent).

Example::

    await agents.act_for(session, "worker-0", key_id=principal.key_id, role=principal.role)
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.errors import ForbiddenError
from controlplane.models import FleetMember, KeyRole
from controlplane.models.agent_binding import AgentBinding

__all__ = ["act_for"]


async def act_for(
    session: AsyncSession,
    member_id: str,
    *,
    key_id: uuid.UUID | None,
    role: KeyRole | None,
    now: datetime,
) -> None:
    """Raise :class:`ForbiddenError` unless the key may act for ``member_id`` (binding it
    on first use). Call it once the member exists (after its registration's flush)."""
    if role is not KeyRole.AGENT or key_id is None:
        return  # admin (or the CLI): acts for any member, binds nothing
    binding = await session.get(AgentBinding, member_id)
    if binding is None and await session.get(FleetMember, member_id) is None:
        return  # no such member: nothing to act for (the route answered for that)
    if binding is None:
        session.add(AgentBinding(member_id=member_id, key_id=key_id, created_at=now))
        await session.flush()
        return
    if binding.key_id != key_id:
        raise ForbiddenError(
            f"fleet member {member_id!r} is registered by another agent key; an agent key "
            "acts only for the members it registered"
        )
