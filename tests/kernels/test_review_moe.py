"""Review of kernels/moe.py ExpertCache (device path vs host path at edge settings) and the cached-launch wiring
(Launcher.positional). Written in review; the defects it found (non-integer ids, unknown launch meta) are fixed.
"""
from __future__ import annotations

import pytest
import torch

import kernels.moe.cache as moe
from kernels._launch import launcher
from kernels.moe import ExpertCache


def _steps(gen, E, k, max_tokens, n):
    """A trace with empty steps, single tokens, full batches, repeated experts and a hot set."""
    out = []
    for s in range(n):
        T = [0, 1, max_tokens, 2][s % 4] if s % 3 else int(torch.randint(0, max_tokens + 1, (1,), generator=gen))
        logits = torch.randn(T, E, generator=gen)
        logits[:, (torch.arange(3) + s // 4) % E] += 3.0
        out.append(torch.topk(logits, k, dim=-1).indices)
    return out


@pytest.mark.parametrize("E,n_slots,k,thresh,stage", [
    (8, 8, 2, 1.0, 8),      # n_slots == E, every step inserts
    (8, 8, 2, 0.99, 8),     # n_slots == E, a step with all E distinct goes over the threshold
    (10, 4, 2, 0.0, 10),    # thresh 0: nothing is ever inserted, everything reads through
    (10, 4, 3, 1.0, 3),     # stage_slots == k: most steps take the host path on the device state
    (12, 1, 1, 1.0, 12),    # one slot, top-1
], ids=["ns_eq_E_1.0", "ns_eq_E_0.99", "thresh0", "stage_eq_k", "one_slot"])
def test_device_path_equals_host_path_at_edges(mode, device, gen, E, n_slots, k, thresh, stage):
    max_tokens = 4
    w = torch.randn(E, 3, 8, generator=gen)
    kw = dict(n_slots=n_slots, max_tokens=max_tokens, top_k=k, device=device, insert_thresh=thresh,
              stage_slots=stage)
    dev = ExpertCache([w], device_plan=True, **kw)
    ref = ExpertCache(dev.host, device_plan=False, **kw)
    for step, ids in enumerate(_steps(gen, E, k, max_tokens, 24)):
        # int32 ids given as a non-contiguous view every other step
        ids_in = ids.to(torch.int32).t().contiguous().t() if step % 2 else ids
        ids_in = ids_in.to(device)
        pd, pr = dev.prepare(ids_in), ref.prepare(ids_in)
        assert pd.chunks == pr.chunks, step
        for c, (t0, t1) in enumerate(pd.chunks):
            sd = dev.stage(pd, c) if len(pd.chunks) > 1 else pd.slot_ids
            sr = ref.stage(pr, c) if len(pr.chunks) > 1 else pr.slot_ids
            assert torch.equal(sd.cpu(), sr.cpu()), (step, c)
            assert torch.equal(dev.weights[0][sd.reshape(-1).long()].cpu(), w[ids[t0:t1].reshape(-1)]), (step, c)
        if step % 3 == 0:  # stats and resident() read between steps must not disturb the state
            assert dev.stats == ref.stats, step
            assert dev.resident() == ref.resident(), step
    assert dev.stats == ref.stats and dev.resident() == ref.resident()
    if thresh == 0.0:
        assert dev.stats.inserts == 0 and dev.resident() == {}
    dev.reset_stats()
    ref.reset_stats()
    assert dev.stats == ref.stats == moe.CacheStats()


def test_invalid_ids_on_a_host_step_of_a_device_cache_leave_the_state(mode, device):
    """A device-plan cache whose step takes the host path (misses over the staging slots) with an invalid id
    raises, and the device state (read back before, written back after) is unchanged."""
    w = torch.randn(10, 4)
    c = ExpertCache([w], n_slots=4, max_tokens=4, top_k=2, device=device, insert_thresh=1.0, stage_slots=2,
                    device_plan=True)
    c.prepare(torch.tensor([[1, 2]], device=device))
    before, st = c.resident(), c.stats
    with pytest.raises(ValueError):
        c.prepare(torch.tensor([[0, 1], [2, 10]], device=device))
    assert c.resident() == before and c.stats == st


@pytest.mark.parametrize("device_plan", [True, False], ids=["device", "host"])
def test_non_integer_ids_are_refused(mode, device, device_plan):
    c = ExpertCache([torch.randn(8, 4)], n_slots=4, max_tokens=2, top_k=2, device=device, device_plan=device_plan)
    with pytest.raises(ValueError):
        c.prepare(torch.tensor([[1.7, 2.2]], device=device))
    with pytest.raises(ValueError):
        c.prepare(torch.tensor([[True, False]], device=device))


def test_positional_refuses_unknown_meta():
    lau = launcher(moe._plan_kernel)
    meta = dict(E=8, NS=4, K=2, NC=8, BE=16, NSP=16, BT=16, NCP=16, ONE_TILE=True, num_warps=4)
    args, opts = lau.positional([None] * 15, meta)
    assert len(args) == len(lau.names) and opts == {"num_warps": 4}
    with pytest.raises(TypeError):
        lau.positional([None] * 15, dict(meta, num_ctas=2))
