"""Prefill on one worker, decode on the other: the KV crosses through the shared folder."""

from __future__ import annotations

import pytest

from exporters.records import Vantage
from serving.model import kv_bytes_per_token
from serving.workers import KVFolder, metric_sum

from .conftest import ControlPlane, PDPair, complete, metrics_text, token_prompt

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

HITS = "vllm:external_prefix_cache_hits_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def test_prompt_prefilled_on_a_is_decoded_on_b(
    pd_pair: PDPair, control_plane: ControlPlane
) -> None:
    prompt = token_prompt(300, seed=300)
    transferred = (300 - 1) // 128 * 128  # whole 128-token blocks before the last token
    hits_before = metric_sum(metrics_text(pd_pair.decode.url), HITS)
    by_source_before = metric_sum(
        metrics_text(pd_pair.decode.url), BY_SOURCE, source="external_kv_transfer"
    )

    complete(pd_pair.prefill.url, prompt, max_tokens=1, request_id="pd-300:prefill")
    decoded = complete(pd_pair.decode.url, prompt, max_tokens=8, request_id="pd-300")
    reference = complete(pd_pair.prefill.url, prompt, max_tokens=8)

    decode_metrics = metrics_text(pd_pair.decode.url)
    assert metric_sum(decode_metrics, HITS) - hits_before == transferred
    by_source = metric_sum(decode_metrics, BY_SOURCE, source="external_kv_transfer")
    assert by_source - by_source_before == transferred
    # Greedy decoding from the transferred KV gives the tokens a local prefill gives.
    assert decoded["choices"][0]["text"] == reference["choices"][0]["text"]
    # Only complete, published prompt folders are in the shared folder.
    folders = KVFolder.for_model(pd_pair.kv_dir, pd_pair.model_dir).scan()
    assert folders
    assert all(f.complete and not f.staging for f in folders), folders

    # The decode leg's engine record carries the transferred KV.
    (record,) = control_plane.wait_for_records(
        lambda found: len(found) == 1, vantage=Vantage.ENGINE, request_id="pd-300"
    )
    config = {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64}
    config |= {"hidden_size": 256, "num_hidden_layers": 2}
    assert record.kv_bytes == transferred * kv_bytes_per_token(config)
    assert record.cached_tokens >= transferred
    assert record.prompt_tokens == 300
