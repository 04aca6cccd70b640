"""The seeds' traffic generator (vllm_moe_case.SeedTraffic) and the torch stand-ins for vLLM's compiled MoE ops
(vllm_moe_stand_ins.py), on the CPU without vLLM: the routing statistics the issue states (E = 512, top-k 10, 32
tokens a step: ~150 distinct experts a step, 90% of the routed pairs on 216-365 experts), and each stand-in against
a plain definition."""
from __future__ import annotations

import pytest
import torch

from tests.kernels.moe import vllm_moe_stand_ins as si
from tests.kernels.moe.vllm_moe_case import DecodeTraffic, SeedTraffic, routed_mass_experts

pytestmark = pytest.mark.timeout(300)


def test_seed_traffic_statistics():
    t = SeedTraffic(E=512, k=10, requests=8, seed=0)
    steps = [t.step() for _ in range(64)]
    ids = [s[0] for s in steps]
    assert all(i.shape == (32, 10) and i.dtype == torch.int32 for i in ids)
    assert all(i.unique().numel() == 10 for row in ids for i in row)  # k distinct experts a token
    distinct = sum(i.unique().numel() for i in ids) / len(ids)
    assert 130 <= distinct <= 170, distinct
    n90 = routed_mass_experts(ids, 512)
    assert 216 <= n90 <= 365, n90
    w = steps[0][1]
    assert torch.allclose(w.sum(1), torch.ones(32)) and (w > 0).all()
    again = SeedTraffic(E=512, k=10, requests=8, seed=0)
    assert torch.equal(again.step()[0], ids[0])  # seeded: the same steps


def _lru_hit_rate(traffic, slots: int, warm: int, steps: int) -> tuple[float, float]:
    """(hit rate, distinct experts a step) of an ExpertCache (host path, 0.99 threshold) of ``slots`` slots over
    ``steps`` steps of ``traffic`` after ``warm`` steps."""
    from kernels.moe import ExpertCache

    c = ExpertCache([torch.zeros(traffic.E, 1)], slots, traffic.tokens, traffic.k, device_plan=False, pin=False)
    for _ in range(warm):
        c.prepare(traffic.step()[0])
    c.reset_stats()
    for _ in range(steps):
        c.prepare(traffic.step()[0])
    return c.stats.hit_rate, c.stats.distinct / c.stats.steps


def test_decode_traffic_statistics():
    """Seed 0, E = 512, top-10, 8 requests x 4 tokens over 300 steps: 154 distinct experts a step, 90 % of the
    routed pairs on 222 experts, requests leaving at ~1/256 a step, consecutive steps sharing 0.64 of their experts
    (SeedTraffic: 0.50), and a 270-slot LRU hitting 0.859 (the seeds: 84-88 %) where SeedTraffic's fresh draw
    hits 0.721."""
    t = DecodeTraffic(E=512, k=10, requests=8, seed=0)
    steps = [t.step() for _ in range(300)]
    ids = [s[0] for s in steps]
    assert all(i.shape == (32, 10) and i.dtype == torch.int32 for i in ids)
    assert all(row.unique().numel() == 10 for i in ids[:20] for row in i)
    distinct = sum(i.unique().numel() for i in ids) / len(ids)
    assert 145 <= distinct <= 160, distinct
    n90 = routed_mass_experts(ids, 512)
    assert 216 <= n90 <= 240, n90
    overlap = [len(set(a.unique().tolist()) & set(b.unique().tolist())) / b.unique().numel()
               for a, b in zip(ids[:-1], ids[1:])]
    assert sum(overlap) / len(overlap) > 0.6  # a decode batch's next step reuses most of its experts
    fresh = SeedTraffic(E=512, k=10, requests=8, seed=0)
    fids = [fresh.step()[0] for _ in range(60)]
    f_overlap = [len(set(a.unique().tolist()) & set(b.unique().tolist())) / b.unique().numel()
                 for a, b in zip(fids[:-1], fids[1:])]
    assert sum(f_overlap) / len(f_overlap) < sum(overlap) / len(overlap) - 0.1
    assert 3 <= len(t.ended) <= 20  # 2,400 request-steps at 1/256: ~9 requests left the batch
    hit, _ = _lru_hit_rate(DecodeTraffic(E=512, k=10, requests=8, seed=0), 270, 200, 400)
    assert 0.84 <= hit <= 0.88, hit
    fhit, _ = _lru_hit_rate(SeedTraffic(E=512, k=10, requests=8, seed=0), 270, 200, 400)
    assert fhit < hit - 0.08, (fhit, hit)
    again = DecodeTraffic(E=512, k=10, requests=8, seed=0)
    assert torch.equal(again.step()[0], ids[0])  # seeded: the same steps
    with pytest.raises(ValueError, match="DecodeTraffic"):
        DecodeTraffic(requests=0)


def test_stand_in_align_block_size():
    g = torch.Generator().manual_seed(0)
    E, bs = 12, 4
    ids = torch.stack([torch.randperm(E, generator=g)[:3] for _ in range(7)]).int()
    n = ids.numel()
    P = n + E * (bs - 1)
    sti, eid, ntp = torch.empty(P, dtype=torch.int32), torch.empty(-(-P // bs), dtype=torch.int32), \
        torch.empty(1, dtype=torch.int32)
    si.moe_align_block_size(ids, E, bs, sti, eid, ntp)
    total = int(ntp)
    flat = ids.reshape(-1)
    assert total == sum(-(-int((flat == e).sum()) // bs) * bs for e in range(E))
    for b in range(total // bs):
        rows = sti[b * bs:(b + 1) * bs]
        real = rows[rows < n]
        assert len(real) and (flat[real.long()] == eid[b]).all()
    assert (eid[total // bs:] == -1).all()
    assert sorted(sti[sti < n].tolist()) == list(range(n))


def test_stand_in_activation_sum_and_quant():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2 * 256, generator=g).bfloat16()
    out = torch.empty(5, 256, dtype=torch.bfloat16)
    si.silu_and_mul(out, x)
    want = (torch.nn.functional.silu(x[:, :256].float()).bfloat16().float() * x[:, 256:].float()).bfloat16()
    assert torch.equal(out, want)
    y = torch.randn(5, 3, 64, generator=g)
    s = torch.empty(5, 64)
    si.moe_sum(y, s)
    assert torch.allclose(s, y.sum(1))
    q, sc = torch.empty(5, 256, dtype=torch.float8_e4m3fn), torch.empty(5, 2)
    si.per_token_group_fp8_quant(out.float(), q, sc, 128, 1e-10, -448.0, 448.0, False, False, False)
    deq = (q.float().reshape(5, 2, 128) * sc[..., None]).reshape(5, 256)
    assert ((deq - out.float()).norm() / out.float().norm()) < 0.05
    q2, sc2 = torch.empty_like(q), torch.empty(5, 2)
    si.silu_and_mul_per_block_quant(q2, x, sc2, 128)
    assert torch.equal(q2.float(), q.float()) and torch.equal(sc2, sc)


def test_stand_ins_refuse_what_they_do_not_serve():
    with pytest.raises(NotImplementedError):
        si.moe_sum(torch.zeros(1, 1, 1), torch.zeros(1, 1), expert_map=torch.zeros(1))
