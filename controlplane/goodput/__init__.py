"""The live goodput engine: per-SLO windows over request verdicts, in memory."""

from controlplane.goodput.spec import SLOSpec, SpecError

__all__ = ["SLOSpec", "SpecError"]
