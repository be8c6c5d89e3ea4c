"""The seed's regime (issue 13): CodeLlama-34B at tensor parallelism 4 on PCIe L20s, priced
from the A100 Llama-3-8B measurements by weights per GPU and the GPU's bandwidth/FLOPs, plus
the NCCL ring all-reduces over PCIe; the numbers the profile must come to, by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tokenyard.services.worker.sim.latency import PROFILES, profile

TP4 = "l20-codellama34b-tp4"


def allreduce_ms(tokens: int) -> float:
    # 2 per layer × 48 layers × (18 µs + T × 8192 × 2 B / algbw), algbw = 11 GB/s × 4 / 6
    return 96 * (0.018 + tokens * 16384 / (11e9 * 4 / 6) * 1000.0)


@pytest.mark.parametrize(("tokens", "gpu_ratio"), [(1, 2.36), (64, 2.36), (2048, 2.611), (8192, 2.611)])
def test_linear_ops_are_the_a100_rows_rescaled_plus_the_all_reduce(tokens, gpu_ratio):
    a100, tp4 = profile("a100-llama3-8b"), profile(TP4)
    per_layer = a100.linear(tokens) / 32  # Llama-3-8B's 32 layers
    expected = per_layer * 0.7936 * gpu_ratio * 48 + allreduce_ms(tokens)
    assert tp4.linear(tokens) == pytest.approx(expected, rel=1e-9)


def test_a_full_chunk_spends_about_half_its_time_in_the_all_reduce():
    """PCIe without NVLink: at 2,048 tokens the all-reduces (≈ 441 ms) cost as much as the
    matrix multiplies — what the seed's TP optimisations (fused all-reduce, overlap) attack."""
    tp4 = profile(TP4)
    assert allreduce_ms(2048) == pytest.approx(441.0, rel=0.01)
    assert 0.4 < allreduce_ms(2048) / tp4.linear(2048) < 0.6


def test_memory_and_links_of_four_gpus():
    p = profile(TP4)
    assert p.tp == 4
    # 4 × 48 GiB × 0.9 − 67.4 GB of weights, at 192 KiB per token
    assert p.kv_capacity_tokens == int((4 * 51539607552 * 0.9 - 67.4e9) // 196608)
    assert p.host_link_bytes_per_s == 4 * 25e9
    assert p.network_s(10_000) == pytest.approx(10_000 * 196608 / 12.5e9)  # 100 Gbps Ethernet
    assert (p.max_num_batched_tokens, p.max_num_seqs) == (2048, 256)


def test_tp1_profiles_are_unchanged_by_the_tp_terms():
    assert all(PROFILES[n].tp == 1 for n in ("a100-llama3-8b", "h100-llama3-8b", "h200-llama3-8b"))


def test_sim_help_lists_the_tp4_profile():
    code = "from tokenyard.cli import main; main(['sim', '--help'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert TP4 in out.stdout
