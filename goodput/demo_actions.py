"""What the control plane does, as lines a person reads: the demo's action feed.

:class:`ActionFeed` polls the control plane's REST API (viewer key) and turns what is new
into lines: each admission policy a gateway acknowledged whose rules changed (its version,
the SLO's allowance and what each class is refused above), the first refusal the client
received (the gateway's own words), and each planner move as it goes through its states
(with the planner's reason, then the effect observed after it). Private to
goodput/demo_scenario.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["ActionFeed", "describe_move", "describe_policy", "pools"]


def describe_policy(policy: Mapping[str, Any], slo: str) -> tuple[str, str]:
    """``(rules, line)``: what the policy refuses for ``slo`` (a key that changes only when
    an allowance moves by 10 ms or more) and one line about it."""
    rule = (policy.get("slos") or {}).get(slo)
    classes = policy.get("classes") or {}
    if not rule or rule.get("ttft_s") is None:
        text = f"no TTFT objective for {slo!r}: only the decode batch limit applies"
        return text, text
    margin = float(rule.get("margin_ratio", 1.0))
    base = float(rule["ttft_s"]) * margin
    parts = []
    for name, cls in sorted(classes.items(), key=lambda kv: -int(kv[1].get("shed_order", 0))):
        if not cls.get("sheddable", True):
            parts.append(f"{name} never")
        else:
            parts.append(f"{name} above {base * float(cls.get('headroom_ratio', 1.0)):.2f} s")
    rules = f"refuses {', '.join(parts)} of predicted TTFT"
    model = policy.get("model") or {}
    rate = model.get("prefill_tokens_per_s")
    line = (
        f"{slo}: TTFT objective {float(rule['ttft_s']):g} s x burn-rate margin {margin:.2f} "
        f"(burn rate {float(rule.get('burn_rate', 0.0)):.1f}); {rules}"
        + ("" if rate is None else f"; learned prefill rate {float(rate):,.0f} tokens/s")
    )
    return rules, line


def describe_move(move: Mapping[str, Any]) -> str:
    """The planner's reason for ``move``, from its stored prediction."""
    predicted = move.get("predicted_effect") or {}
    before, after = predicted.get("before") or {}, predicted.get("after") or {}
    if "goodput_rps" in before and "goodput_rps" in after:
        split = f"{after.get('num_prefill', 0):g}P:{after.get('num_decode', 0):g}D"
        if max(before["goodput_rps"], after["goodput_rps"]) <= 0 and "headroom_ratio" in after:
            return (
                f"no split meets the SLO at this load: most headroom at {split} "
                f"({before.get('headroom_ratio', 0.0):.2f} → {after['headroom_ratio']:.2f})"
            )
        return (
            f"predicted goodput {before['goodput_rps']:.2f} → {after['goodput_rps']:.2f} req/s "
            f"at {split}"
        )
    return str(move.get("detail") or move.get("source", ""))


def pools(members: list[Mapping[str, Any]]) -> str:
    """``1P:2D`` from fleet members (ready ones; a draining one is named apart)."""
    ready = [m for m in members if m.get("state") == "ready"]
    count = {r: sum(m.get("role") == r for m in ready) for r in ("prefill", "decode")}
    text = f"{count['prefill']}P:{count['decode']}D"
    moving = sum(m.get("state") in ("draining", "drained") for m in members)
    return text + (f" +{moving} draining" if moving else "")


@dataclass
class ActionFeed:
    """New control actions since the last :meth:`poll`, as lines."""

    client: httpx.Client  # on the control plane, with the viewer key
    gateway_id: str
    slo: str
    policies: int = 0  # acknowledged policy versions seen
    moves_done: int = 0
    rules: str = ""  # the rules of the last policy printed
    _seen_versions: set[int] = field(default_factory=set)
    _move_states: dict[str, str] = field(default_factory=dict)
    _observed: set[str] = field(default_factory=set)

    def poll(self, *, policies: bool = True) -> list[str]:
        """New lines; ``policies=False`` takes note of new policies without a line."""
        lines: list[str] = []
        try:
            news = self._poll_policies()
            lines += news if policies else []
            lines += self._poll_moves()
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            lines.append(f"  (control plane not answering: {type(exc).__name__})")
        return lines

    def _poll_policies(self) -> list[str]:
        response = self.client.get(
            "/api/v1/commands",
            params={"target": self.gateway_id, "kind": "set_admission_policy", "limit": 20},
        )
        response.raise_for_status()
        lines = []
        for command in sorted(response.json()["data"], key=lambda c: c.get("version") or 0):
            version = int(command.get("version") or 0)
            if command["state"] != "acked" or version in self._seen_versions:
                continue
            self._seen_versions.add(version)
            self.policies += 1
            rules, line = describe_policy(command["payload"]["policy"], self.slo)
            if rules != self.rules:
                self.rules = rules
                lines.append(f"  >> admission policy v{version} acked by {self.gateway_id}: {line}")
        return lines

    def _poll_moves(self) -> list[str]:
        response = self.client.get("/api/v1/automation/moves", params={"limit": 20})
        response.raise_for_status()
        lines = []
        for move in reversed(response.json()["data"]):
            key, state = str(move["id"]), str(move["state"])
            head = f"  >> move {move['member_id']} {move['from_role']} → {move['to_role']}"
            if self._move_states.get(key) != state:
                if key not in self._move_states:
                    lines.append(f"{head} ({move['source']}): {describe_move(move)}")
                self._move_states[key] = state
                what = {
                    "draining": "drain sent: no new requests, the ones in flight finish",
                    "switching": "drained: set_role and resume sent",
                    "done": "done: drain, set_role, resume acknowledged",
                }.get(state, state)
                lines.append(f"{head}: {what}")
                self.moves_done += state == "done"
            observed = move.get("observed_effect")
            if observed and key not in self._observed:
                self._observed.add(key)
                p = observed.get("pools", {})
                predicted = observed.get("predicted_goodput_rps")
                lines.append(
                    f"{head}: observed over the last minute: goodput "
                    f"{observed.get('observed_goodput_rps', 0.0):.2f} req/s (predicted "
                    f"{'-' if predicted is None else f'{predicted:.2f}'}), pools "
                    f"{p.get('prefill', 0)}P:{p.get('decode', 0)}D"
                )
        return lines
