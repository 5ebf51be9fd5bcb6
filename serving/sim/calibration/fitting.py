"""Least-squares fits of step-time curves to profile points (numpy only, deterministic).

Every fit minimises the sum of squared *relative* errors (rows weighted by ``1 / measured``),
since the errors we report and care about are relative. Points carry a configuration id
(repeats of one configuration share it); every fifth distinct configuration, in sorted
order from the third, is held out of the fit and only scored (:func:`held_out`).

The hinge of a :class:`~serving.sim.coefficients.StepCurve` is found by a grid search: for a
fixed knee the curve is linear in its coefficients, so each candidate knee is one weighted
``lstsq``; the best candidate whose slopes keep the curve monotone wins (ties: the first).
Coefficients are rounded to :data:`SIGNIFICANT_DIGITS` so the committed table does not
depend on the last bits of a BLAS.

Example::

    samples = Samples.of(x=[1, 2, 3], w=[0, 0, 0], y=[1.0, 1.5, 2.0])
    curve, error = fit_curve(samples, attention_s=0.0, max_knees=0)
    curve.per_unit_s  # 0.5
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from serving.sim.coefficients import FitError, StepCurve

__all__ = [
    "HOLD_OUT_EVERY",
    "SIGNIFICANT_DIGITS",
    "FitFailedError",
    "Samples",
    "fit_curve",
    "fit_error",
    "fit_shared_attention",
    "held_out",
    "significant",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

SIGNIFICANT_DIGITS = 6
HOLD_OUT_EVERY = 5
_HOLD_OUT_PHASE = 2
_ERROR_DECIMALS = 5


class FitFailedError(ValueError):
    """No candidate fit keeps every slope non-negative (the points fall as work grows)."""


def significant(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """``value`` rounded to ``digits`` significant digits."""
    return float(f"{value:.{digits}g}")


@dataclass(frozen=True, slots=True)
class Samples:
    """Profile points, columnar: ``x`` (tokens or sequences), ``w`` (attention units), ``y``
    (measured seconds, > 0) and ``config`` (an id shared by repeats of one configuration)."""

    x: F64
    w: F64
    y: F64
    config: I64

    def __post_init__(self) -> None:
        n = len(self.y)
        for name in ("x", "w", "config"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, y has {n}")
        if n == 0:
            raise ValueError("samples must hold at least one point")
        if not np.all(self.y > 0):
            raise ValueError(f"y must be > 0 seconds, got min {float(np.min(self.y))!r}")
        if np.any(self.x < 0) or np.any(self.w < 0):
            raise ValueError("x and w must be >= 0")

    @classmethod
    def of(
        cls,
        x: Sequence[float] | F64,
        w: Sequence[float] | F64,
        y: Sequence[float] | F64,
        config: Sequence[int] | I64 | None = None,
    ) -> Samples:
        """Samples from sequences; without ``config`` each distinct ``(x, w)`` is one."""
        xa = np.asarray(x, dtype=np.float64)
        wa = np.asarray(w, dtype=np.float64)
        if config is None:
            keys = np.stack([xa, wa], axis=1)
            config_a = np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1)
        else:
            config_a = np.asarray(config)
        return cls(xa, wa, np.asarray(y, dtype=np.float64), config_a.astype(np.int64))

    def select(self, mask: Bools) -> Samples:
        return Samples(self.x[mask], self.w[mask], self.y[mask], self.config[mask])


def held_out(config: I64) -> Bools:
    """True for points whose configuration is held out: ranks 2, 7, 12, … of the sorted
    distinct ids. Fewer than five configurations: nothing is held out."""
    ids, rank = np.unique(config, return_inverse=True)
    if len(ids) < HOLD_OUT_EVERY:
        return np.zeros(len(config), dtype=np.bool_)
    out: Bools = rank.reshape(-1) % HOLD_OUT_EVERY == _HOLD_OUT_PHASE
    return out


def _relative(model: F64, measured: F64) -> F64:
    out: F64 = np.abs(model - measured) / measured
    return out


def fit_error(model: F64, measured: F64, holdout: Bools) -> FitError:
    """Relative errors of ``model`` against ``measured``, split by the ``holdout`` mask."""
    rel = _relative(model, measured)
    train, test = rel[~holdout], rel[holdout]

    def stat(values: F64, fn: str) -> float:
        if len(values) == 0:
            return 0.0
        return round(float(getattr(np, fn)(values)), _ERROR_DECIMALS)

    return FitError(
        num_points=len(train),
        mape=stat(train, "mean"),
        max_error=stat(train, "max"),
        num_held_out=len(test),
        held_out_mape=stat(test, "mean"),
        held_out_max_error=stat(test, "max"),
    )


def _knee_candidates(x: F64, max_knees: int) -> list[int | None]:
    """``None`` (no knee) then up to ``max_knees`` interior distinct values of ``x``."""
    interior = np.unique(x)[1:-1]
    if max_knees <= 0 or len(interior) == 0:
        return [None]
    step = max(1, -(-len(interior) // max_knees))
    return [None, *(int(v) for v in interior[::step])]


def fit_curve(
    samples: Samples, *, attention_s: float | None = None, max_knees: int = 128
) -> tuple[StepCurve, FitError]:
    """The best monotone :class:`StepCurve` through ``samples`` and its fit error.

    ``attention_s`` fixes the attention coefficient (seconds per unit of ``w``) instead of
    fitting it, for profiles whose points do not vary ``w`` independently. ``max_knees``
    bounds the knee grid (0: a straight line). Raises :class:`FitFailedError` when no
    candidate is monotone.
    """
    holdout = held_out(samples.config)
    train = samples.select(~holdout)
    weight = 1.0 / train.y
    offset = np.zeros_like(train.y) if attention_s is None else attention_s * train.w
    target = (train.y - offset) * weight
    best: tuple[float, StepCurve] | None = None
    for knee in _knee_candidates(train.x, max_knees):
        columns = [np.ones_like(train.x), train.x]
        if knee is not None:
            columns.append(np.maximum(train.x - knee, 0.0))
        if attention_s is None:
            columns.append(train.w)
        design = np.stack(columns, axis=1) * weight[:, None]
        coef = [float(c) for c in np.linalg.lstsq(design, target, rcond=None)[0]]
        base, per_unit = coef[0], coef[1]
        above = coef[2] if knee is not None else 0.0
        attention = coef[-1] if attention_s is None else attention_s
        # Convex only (above >= 0): past the knee a step turns compute-bound, and the time
        # per unit can only grow; a concave knee would be fitting noise.
        if min(base, per_unit, above, attention) < 0:
            continue
        curve = StepCurve(
            base_s=significant(base),
            per_unit_s=significant(per_unit),
            knee=knee or 0,
            per_unit_above_knee_s=significant(above),
            per_attention_unit_s=significant(attention),
        )
        loss = float(np.sum(np.square(_relative(curve.seconds(train.x, train.w), train.y))))
        if best is None or loss < best[0]:
            best = (loss, curve)
    if best is None:
        raise FitFailedError(
            f"no monotone fit through {len(samples.y)} points "
            f"(x in [{float(samples.x.min())}, {float(samples.x.max())}])"
        )
    curve = best[1]
    return curve, fit_error(curve.seconds(samples.x, samples.w), samples.y, holdout)


def fit_shared_attention(
    groups: Sequence[tuple[Samples, float]],
) -> tuple[float, tuple[StepCurve, ...], FitError]:
    """One bandwidth shared by several groups of decode points, each with its own line.

    Each group is ``(samples, bytes_per_unit)``: its points' time is ``a_g + b_g·x +
    bytes_per_unit·w / bandwidth``. Returns the bandwidth (bytes/s), each group's curve (no
    knee) and the error over all points. Used where one group alone cannot tell the batch
    size from the context (they grow together) but the groups share the hardware.
    """
    masks = [held_out(samples.config) for samples, _ in groups]
    num_groups = len(groups)
    rows: list[F64] = []
    targets: list[F64] = []
    for g, ((samples, bytes_per_unit), holdout) in enumerate(zip(groups, masks, strict=True)):
        train = samples.select(~holdout)
        block = np.zeros((len(train.y), 2 * num_groups + 1))
        block[:, 2 * g] = 1.0
        block[:, 2 * g + 1] = train.x
        block[:, -1] = train.w * bytes_per_unit
        rows.append(block / train.y[:, None])
        targets.append(np.ones_like(train.y))
    coef = np.linalg.lstsq(np.concatenate(rows), np.concatenate(targets), rcond=None)[0]
    if not np.all(coef >= 0):
        raise FitFailedError(f"shared-attention fit has a negative coefficient: {coef.tolist()}")
    bytes_per_s = significant(1.0 / float(coef[-1]))
    curves = tuple(
        StepCurve(
            base_s=significant(float(coef[2 * g])),
            per_unit_s=significant(float(coef[2 * g + 1])),
            knee=0,
            per_unit_above_knee_s=0.0,
            per_attention_unit_s=significant(bytes_per_unit / bytes_per_s),
        )
        for g, (_, bytes_per_unit) in enumerate(groups)
    )
    model = np.concatenate([c.seconds(s.x, s.w) for c, (s, _) in zip(curves, groups, strict=True)])
    measured = np.concatenate([s.y for s, _ in groups])
    return bytes_per_s, curves, fit_error(model, measured, np.concatenate(masks))
