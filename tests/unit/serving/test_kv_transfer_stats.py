"""The KV connector's transfer stats and their Prometheus families
(serving.vllm_plugin.kv_transfer)."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters.prometheus import KV_TRANSFER_BUCKETS_S
from serving.vllm_plugin.kv_transfer import KVTransferCollector, KVTransferStats

seconds_st = st.floats(min_value=0.0, max_value=20.0, allow_nan=False)
bytes_st = st.integers(min_value=0, max_value=2**40)
observation_st = st.tuples(st.sampled_from(["load", "save"]), seconds_st, bytes_st)


def recorded(observations: list[tuple[str, float, int]]) -> KVTransferStats:
    stats = KVTransferStats()
    for direction, seconds, num_bytes in observations:
        if direction == "load":
            stats.record_load(seconds, num_bytes)
        else:
            stats.record_save(seconds, num_bytes)
    return stats


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


ENGINE = (("model", "tiny"), ("vantage", "engine"))


def test_a_new_stats_object_is_empty_and_holds_plain_lists() -> None:
    stats = KVTransferStats()
    assert stats.is_empty()
    assert stats.to_dict() == {
        "load_seconds": [], "load_bytes": [], "save_seconds": [], "save_bytes": [],
    }  # fmt: skip
    stats.record_save(0.02, 1000)
    assert not stats.is_empty()
    # It crosses processes as msgpack (engine core -> API server).
    assert msgpack.unpackb(msgpack.packb(stats.to_dict())) == stats.to_dict()


def test_clone_and_reset_hands_over_the_observations() -> None:
    stats = KVTransferStats()
    stats.record_load(0.01, 2048)
    old = stats.clone_and_reset()
    assert old.data["load_seconds"] == [0.01] and old.data["load_bytes"] == [2048]
    assert stats.is_empty()
    stats.record_load(0.5, 1)
    assert old.data["load_seconds"] == [0.01]  # the handed-over lists are not shared


def test_built_from_a_shipped_dict_it_copies_the_lists_and_ignores_other_keys() -> None:
    data = {"load_seconds": [0.1], "load_bytes": [10], "transfer_duration": [3.0]}
    stats = KVTransferStats(data=data)
    stats.aggregate(KVTransferStats(data={"load_seconds": [0.2], "load_bytes": [20]}))
    assert data["load_seconds"] == [0.1]
    assert stats.to_dict() == {
        "load_seconds": [0.1, 0.2], "load_bytes": [10, 20], "save_seconds": [], "save_bytes": [],
    }  # fmt: skip


def test_reduce_summarises_each_direction() -> None:
    stats = recorded([("load", 0.01, 2**20), ("load", 0.03, 2**20), ("save", 0.2, 3 * 2**20)])
    assert stats.reduce() == {
        "Num loads": 2, "Load MB": 2.0, "Avg load time (ms)": 20.0, "Max load time (ms)": 30.0,
        "Num saves": 1, "Save MB": 3.0, "Avg save time (ms)": 200.0, "Max save time (ms)": 200.0,
    }  # fmt: skip
    assert KVTransferStats().reduce()["Avg load time (ms)"] == 0.0


@given(st.lists(observation_st, max_size=40), st.integers(min_value=0, max_value=40))
def test_aggregating_the_parts_equals_recording_the_whole(
    observations: list[tuple[str, float, int]], cut: int
) -> None:
    whole = recorded(observations)
    merged = recorded(observations[:cut]).aggregate(recorded(observations[cut:]))
    assert merged.to_dict() == whole.to_dict()
    assert merged.reduce() == whole.reduce()
    assert merged.is_empty() == (not observations)
    loads = [o for o in observations if o[0] == "load"]
    assert merged.reduce()["Num loads"] == len(loads)
    assert sum(merged.data["load_bytes"]) == sum(b for _, _, b in loads)


def test_the_collector_exports_the_sim_workers_families_with_their_buckets() -> None:
    registry = CollectorRegistry()
    collector = KVTransferCollector("tiny")
    registry.register(collector)
    names = {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert names >= {"goodput_kv_transfer_bytes", "goodput_kv_transfer_seconds"}
    assert not samples(registry)  # no series before a transfer

    collector.observe(recorded([("load", 0.004, 786_432), ("load", 0.2, 1000)]).to_dict())
    collector.observe({"transfer_duration": [1.0]})  # another connector's keys: ignored
    found = samples(registry)
    assert found[("goodput_kv_transfer_bytes_total", ENGINE)] == 787_432
    assert found[("goodput_kv_transfer_seconds_count", ENGINE)] == 2
    assert found[("goodput_kv_transfer_seconds_sum", ENGINE)] == pytest.approx(0.204)
    le = {dict(k[1])["le"]: v for k, v in found.items() if k[0].endswith("_bucket")}
    assert len(le) == len(KV_TRANSFER_BUCKETS_S) + 1
    assert (le["0.0025"], le["0.005"], le["0.1"], le["0.25"], le["+Inf"]) == (0, 1, 1, 2, 2)
    # Only the load direction has series: this instance saved nothing.
    assert not any(name.startswith("goodput_kv_save") for name, _ in found)


def test_saves_go_to_their_own_families() -> None:
    registry = CollectorRegistry()
    collector = KVTransferCollector("tiny")
    registry.register(collector)
    collector.observe(recorded([("save", 0.03, 4096)]).to_dict())
    found = samples(registry)
    assert found[("goodput_kv_save_bytes_total", ENGINE)] == 4096
    assert found[("goodput_kv_save_seconds_count", ENGINE)] == 1
    assert ("goodput_kv_transfer_seconds_count", ENGINE) not in found


@given(st.lists(st.lists(observation_st, max_size=10), max_size=8))
def test_the_histogram_counts_every_observation_once(
    steps: list[list[tuple[str, float, int]]],
) -> None:
    collector = KVTransferCollector("m")
    for step in steps:
        collector.observe(recorded(step).to_dict())
    registry = CollectorRegistry()
    registry.register(collector)
    found = samples(registry)
    flat = [o for step in steps for o in step]
    for direction, prefix in (("load", "goodput_kv_transfer"), ("save", "goodput_kv_save")):
        mine = [o for o in flat if o[0] == direction]
        labels = (("model", "m"), ("vantage", "engine"))
        if not mine:
            assert (f"{prefix}_seconds_count", labels) not in found
            continue
        assert found[(f"{prefix}_seconds_count", labels)] == len(mine)
        assert found[(f"{prefix}_bytes_total", labels)] == sum(b for _, _, b in mine)
        assert math.isclose(
            found[(f"{prefix}_seconds_sum", labels)], sum(s for _, s, _ in mine), abs_tol=1e-9
        )
        buckets = sorted(
            (float(dict(k[1])["le"]), v) for k, v in found.items()
            if k[0] == f"{prefix}_seconds_bucket"
        )  # fmt: skip
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and counts[-1] == len(mine)
        for bound, count in buckets:
            assert count == sum(1 for _, s, _ in mine if s <= bound)
