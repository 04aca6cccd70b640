"""ExpertCache with ``read="through"`` (kernels/moe/cache.py): the per-expert address tables the device plan writes
every step against the host path's (the reference) under a routing trace of changing batch shapes, the tables'
addresses reading the right expert's bytes, no staging slots and every step on the device at any miss count;
and the cache's device memory (``device_bytes``) exactly, against the buffers it allocates and against all
experts resident, at the seeds' shapes; and what PyTorch's CUDA caching allocator counts for those buffers
(``allocator_bytes``) at the layer test's shapes."""
from __future__ import annotations

import pytest
import torch

from kernels.moe import ExpertCache, allocator_bytes, device_bytes
from tests.kernels.moe.test_expert_cache import trace

pytestmark = pytest.mark.timeout(300)

MIB_1_5 = 3 * 2048 * 128 * 2  # one expert of the decode benchmark: w13 [256, 2048] + w2 [2048, 128], bf16


def decode(cache: ExpertCache) -> list[list[tuple[str, int]]]:
    """Each table entry as ("slot", s) or ("host", e): which buffer and which expert-sized block it addresses."""
    out = []
    for j, (w, h) in enumerate(zip(cache.weights, cache.host)):
        nb = h[0].numel() * h.element_size()
        sb, hb = w.data_ptr(), h.data_ptr()
        row = []
        for off in cache.table(j).tolist():
            a = sb + off * h.element_size()
            if sb <= a < sb + cache.n_slots * nb:
                assert (a - sb) % nb == 0
                row.append(("slot", (a - sb) // nb))
            else:
                assert hb <= a < hb + cache.E * nb and (a - hb) % nb == 0, (j, a)
                row.append(("host", (a - hb) // nb))
        out.append(row)
    return out


@pytest.mark.parametrize("thresh", [0.99, 0.0], ids=["thresh0.99", "thresh0"])
def test_tables_match_the_host_path_every_step(mode, device, gen, thresh):
    """Device plan and host path on the same trace: equal slot ids, residency, counters and decoded tables after
    every step; a resident expert's entry is its slot, any other's its host block; no staging slot exists and
    every device step planned on the device whatever its misses."""
    E, k, n_slots, max_tokens, steps = (32, 4, 6, 24, 40) if mode == "interp" else (512, 10, 135, 128, 200)
    w13 = torch.randn(E, 16, 8, generator=gen).to(torch.bfloat16)
    w2 = torch.randn(E, 8, 8, generator=gen)
    caches = [ExpertCache([w13, w2], n_slots, max_tokens, k, device=device, insert_thresh=thresh, read="through",
                          device_plan=dp) for dp in (True, False)]
    dev, ref = caches
    assert dev.device_plan and not ref.device_plan
    assert dev.stage_slots == 0 and dev.weights[0].shape[0] == n_slots
    most = 0
    for ids in trace(gen, steps, E, k, max_tokens):
        before = dev.stats.read_through
        plans = [c.prepare(ids.to(device)) for c in caches]
        most = max(most, dev.stats.read_through - before)
        assert plans[0].device and plans[0].chunks == [(0, ids.shape[0])]
        assert torch.equal(plans[0].slot_ids.cpu(), plans[1].slot_ids.cpu())
        assert dev.resident() == ref.resident()
        tab = decode(dev)
        assert tab == decode(ref)
        res = dev.resident()
        for row in tab:
            assert row == [("slot", res[e]) if e in res else ("host", e) for e in range(E)]
        sl = plans[0].slot_ids.cpu()
        assert bool(((sl == -1) | (sl < n_slots)).all())  # a read-through expert has no slot: -1
    assert dev.stats == ref.stats
    assert dev.path_steps == {"device": steps, "host": 0}
    assert most > k * 2  # steps whose misses are more than the old default staging floor would have held
    if thresh == 0.0:
        assert dev.stats.inserts == 0 and dev.stats.read_through == dev.stats.misses


def test_tables_address_the_right_bytes(mode, device, gen):
    """Reading each expert through its table entry (a gather by address) gives the host store's expert, bit for
    bit, for both tensors, after inserts and evictions."""
    E, k, n_slots = 16, 2, 5
    host = [torch.randn(E, 4, 8, generator=gen).to(torch.float16), torch.randn(E, 3, generator=gen)]
    cache = ExpertCache(host, n_slots, 8, k, device=device, read="through")
    cache.fill([3, 1, 4, 0, 9])
    for ids in trace(gen, 12, E, k, 8):
        cache.prepare(ids.to(device))
        for j, (w, h) in enumerate(zip(cache.weights, cache.host)):
            for e, (where, i) in enumerate(decode(cache)[j]):
                got = w[i] if where == "slot" else h[i]
                assert torch.equal(got.cpu(), h[e]), (j, e, where, i)


def test_read_through_arguments_are_checked():
    host = [torch.zeros(8, 4)]
    with pytest.raises(ValueError, match="read must be"):
        ExpertCache(host, 2, 4, 2, read="copy", device_plan=False)
    with pytest.raises(ValueError, match="no staging slots"):
        ExpertCache(host, 2, 4, 2, read="through", stage_slots=2, device_plan=False)
    with pytest.raises(ValueError, match="table\\(\\) is for read='through'"):
        ExpertCache(host, 2, 4, 2, device_plan=False).table(0)
    with pytest.raises(ValueError, match="read must be"):
        device_bytes(8, 2, [16], 4, 2, read="copy")


@pytest.mark.parametrize("read,stage,dp", [("through", None, True), ("through", None, False), ("stage", 3, True),
                                           ("stage", None, False)])
def test_device_bytes_is_what_the_cache_allocates(mode, device, read, stage, dp):
    """device_bytes() equals the bytes of the cache's buffers (its one set), for both read modes and paths."""
    E, k = 24, 3
    host = [torch.zeros(E, 16, 8, dtype=torch.bfloat16), torch.zeros(E, 8, 8), torch.zeros(E, 2, 1)]
    cache = ExpertCache(host, 7, 10, k, device=device, read=read, stage_slots=stage, device_plan=dp)
    assert cache.device_plan == dp
    tb = [h[0].numel() * h.element_size() for h in host]
    assert device_bytes(E, 7, tb, 10, k, stage_slots=stage, read=read, device_plan=dp) == cache.buffer_bytes()


def test_device_bytes_at_the_seeds_shapes():
    """E = 512 experts of 1.5 MiB (bf16 w13 + w2), top-10, 8192 tokens a step at most: read-through at 270 slots
    is 0.528 of all experts resident (<= 0.56), at 135 slots 0.264 (<= 0.3); staging E - slots (the old default)
    holds all 512 experts' room and more."""
    E, k, T = 512, 10, 8192
    tb = [2 * 128 * 2048 * 2, 2048 * 128 * 2]
    assert sum(tb) == MIB_1_5 == 1_572_864
    resident = E * MIB_1_5
    assert resident == 805_306_368
    b270 = device_bytes(E, 270, tb, T, k, read="through")
    # slots + slot ids + map + tables [2, 512] + sources + plan state
    plan = 512 * 4 + 270 * 4 + 270 * 8 + 2 * 512 * 4 + (1 + 1024) * 4 + 16 * 8 + 8
    assert b270 == 270 * MIB_1_5 + T * k * 4 + 512 * 4 + 2 * 512 * 8 + 6 * 8 + plan
    assert b270 == 425_024_868
    assert b270 / resident <= 0.56 and round(b270 / resident, 3) == 0.528
    b135 = device_bytes(E, 135, tb, T, k, read="through")
    assert b135 / resident <= 0.3 and round(b135 / resident, 3) == 0.264
    staged = device_bytes(E, 270, tb, T, k, stage_slots=E - 270, read="stage")
    assert staged > resident


@pytest.mark.parametrize("dp,want", [(True, 197_484), (False, 197_072)], ids=["device-plan", "host-path"])
def test_fp8_layer_bytes_exactly(dp, want):
    """A block-fp8 layer (E = 8, hidden 128, intermediate 128: w13 [256, 128] and w2 [128, 128] e4m3 an expert,
    their 128x128 block scales [2, 1] and [1, 1] fp32) read through at 4 slots, 4 tokens of top-2: every tensor's
    slots, scales included, and the tables of all four, to the byte."""
    E, f8 = 8, torch.float8_e4m3fn
    host = [torch.zeros(E, 256, 128, dtype=f8), torch.zeros(E, 128, 128, dtype=f8), torch.zeros(E, 2, 1),
            torch.zeros(E, 1, 1)]
    cache = ExpertCache(host, 4, 4, 2, read="through", device_plan=dp)
    slots = 4 * (256 * 128 + 128 * 128 + 2 * 4 + 1 * 4)        # 196,656: the scales' slots are 48 B of it
    fixed = 4 * 2 * 4 + E * 4 + 4 * E * 8 + 3 * 4 * 8         # slot ids, map, tables [4, 8], sources [12]
    plan = E * 4 + 4 * 4 + 4 * 8 + 2 * 16 * 4 + (1 + 2 * E) * 4 + 16 * 8 + 8  # slot_of .. step (NSP = 16)
    assert cache.buffer_bytes() == slots + fixed + (plan if dp else 0) == want
    assert device_bytes(E, 4, [32768, 16384, 8, 4], 4, 2, read="through", device_plan=dp) == want
    # the allocator's count of the same buffers: the two weights' slots (multiples of 512 B) and 6 small buffers
    # (8 more for the plan state) of one 512-B block each; none above 1 MiB, so no slack
    small = 512 * (6 + (8 if dp else 0))
    assert allocator_bytes([t.numel() * t.element_size() for t in cache.buffers()]) == \
        (131_072 + 65_536 + small,) * 2


def test_allocator_bytes_at_the_layer_tests_shapes():
    """E = 512, top-10, 8192 tokens, hidden 1024, intermediate 256, read-through at 270 slots (the GPU layer test):
    in block fp8 the slots of w13 are 135 MiB and of w2 67.5 MiB, neither a multiple of the allocator's 2-MiB
    segment rounding, so the allocator may count up to 1 MiB over each (136 MiB and 68 MiB taken whole: 1.5 MiB
    over) besides 3,052 B of 512-B rounding of the small buffers; in bf16 (270 and 135 MiB) only w2's can be over.
    The counts an H100 gave (torch.cuda.memory_allocated across the set-up) lie inside the bounds."""
    E, k, T, H, I = 512, 10, 8192, 1024, 256

    def sizes(tb, slots):
        NT, NSP = len(tb), 512
        return [slots * b for b in tb] + [T * k * 4, E * 4, NT * E * 8, 3 * NT * 8, E * 4, slots * 4, slots * 8,
                                          NSP * 4, NSP * 4, (1 + 2 * E) * 4, 16 * 8, 8]

    fp8 = [2 * I * H, H * I, (2 * I // 128) * (H // 128) * 4, (H // 128) * (I // 128) * 4]
    assert fp8 == [524_288, 262_144, 128, 64]
    b = device_bytes(E, 270, fp8, T, k, read="through")
    assert sum(sizes(fp8, 270)) == b == 212_748_308
    lo, hi = allocator_bytes(sizes(fp8, 270))
    assert (lo - b, hi - lo) == (3_052, 2 * 2**20)
    assert lo + 2**20 + 2**19 == b + 1_575_916 <= hi         # both slot buffers in fresh segments: 1.58 MB over
    assert lo <= 213_799_936 <= hi and 213_799_936 - lo == 2**20  # an H100's count with w2's block split
    assert lo - b + 2**20 + 2**19 > 512 * 16 + 2**20         # over a bound of one MiB and 512 B a buffer
    bf16 = [2 * I * H * 2, H * I * 2]
    b = device_bytes(E, 270, bf16, T, k, read="through")
    lo, hi = allocator_bytes(sizes(bf16, 270))
    assert (b, lo - b, hi - lo) == (425_024_868, 2_716, 2 * 2**20)
    assert 426_076_160 - lo == 2**20                          # an H100's count: 135 MiB of w2 taken as 136 MiB
    # nothing for an empty tensor; 512-B rounding; 1 MiB is the small pool's largest, one byte more the large's
    one = 512 + 512 + 1024 + 2**20 + 2**20 + 512
    assert allocator_bytes([0, 1, 512, 513, 2**20, 2**20 + 1]) == (one, one + 2**20) == (2_099_712, 3_148_288)
