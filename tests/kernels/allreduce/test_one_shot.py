"""OneShotAllReduce (kernels/allreduce/one_shot.py): the CUDA kernel run under TRITON_INTERPRET=1 at world size 1
(the peer-pointer tables point at CPU tensors; a rank's only peer is itself, so no flag wait can block): exact
sums inside its buffers, the argument checks, the counters' wrap (int64: an int32 would wrap after 2^31 calls),
an ``out`` of the wrong size refused, an unknown peer memory refused before any allocation."""
from __future__ import annotations

import os

import pytest
import torch

import kernels.allreduce.one_shot as A


INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


needs_interp = pytest.mark.skipif(not INTERP or A.triton is None, reason="runs the kernel in Triton's interpreter")


class _Rank:
    """One rank (W=1) with guard regions around its data halves and its flags, on the CPU."""

    def __init__(self, cap=64, G=2):
        self.cap, self.G = cap, G
        self.big = torch.zeros(6 * cap)
        self.data = self.big[2 * cap: 4 * cap]
        self.flagbig = torch.zeros(8 + 2 * G + 8, dtype=torch.int64)
        self.flags = self.flagbig[8: 8 + 2 * G]
        self.st = A._RankState(0, torch.tensor([self.data.data_ptr()]), torch.tensor([self.flags.data_ptr()]),
                               G, "cpu")

    def guards_clean(self) -> bool:
        return not self.big[: 2 * self.cap].any() and not self.big[4 * self.cap:].any() \
            and not self.flagbig[:8].any() and not self.flagbig[8 + 2 * self.G:].any()


def _fake_ar(r: _Rank, W=1):
    """An OneShotAllReduce over rank r without a process group (the constructor needs torch.distributed)."""
    ar = A.OneShotAllReduce.__new__(A.OneShotAllReduce)
    ar._st, ar.W, ar.G, ar.cap, ar.rank = r.st, W, r.G, r.cap, 0
    ar.chunk = max(1, r.cap // r.G)
    return ar


@needs_interp
def test_world_size_one_sums_exactly_and_stays_in_its_buffers():
    r = _Rank()
    ar = _fake_ar(r)
    for n in (1, 7, 64, 33):
        x = torch.randn(n)
        out = ar.allreduce(x)
        assert torch.equal(out, x) and r.guards_clean(), n
    xt = torch.randn(8, 4).t()  # non-contiguous: copied first; the result keeps x's shape
    assert torch.equal(ar.allreduce(xt), xt)


def test_bad_inputs_are_refused():
    r = _Rank()
    ar = _fake_ar(r)
    with pytest.raises(ValueError):
        ar.allreduce(torch.zeros(4, dtype=torch.float16))
    with pytest.raises(ValueError):
        ar.allreduce(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError):
        ar.allreduce(torch.zeros(r.cap + 1))
    assert ar.allreduce(torch.zeros(0)).numel() == 0
    assert int(r.st.counters.sum()) == 0, "an empty message must not advance the counters (collective no-op)"


@needs_interp
def test_counter_wrap_stays_inside_the_buffers():
    r = _Rank()
    ar = _fake_ar(r)
    r.st.counters.fill_(2**31 - 3)
    x = torch.arange(1.0, 11.0)
    for _ in range(4):
        r.big.zero_()
        out = ar.allreduce(x)
        assert torch.equal(out, x)
        assert r.guards_clean(), f"wrote outside the buffers at counter {int(r.st.counters[0])}"


@needs_interp
def test_out_is_checked():
    r = _Rank()
    ar = _fake_ar(r)
    x = torch.arange(1.0, 11.0)
    backing = torch.zeros(20)
    with pytest.raises(ValueError):
        ar.allreduce(x, out=backing[:5])
    assert not backing[5:].any(), "wrote past the end of out"


def test_unknown_peer_memory_is_refused(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    used = []

    def fake(how):
        def f(nelem, group, device):
            used.append(how)
            buf = torch.zeros(nelem)
            return buf, [buf.data_ptr()], None
        return f

    monkeypatch.setattr(A, "_peer_buffers_symm_mem", fake("symm_mem"))
    monkeypatch.setattr(A, "_peer_buffers_ipc", fake("ipc"))
    with pytest.raises(ValueError):
        A.OneShotAllReduce(group=object(), cap=64, blocks=2, device="cpu", peer_memory="symm-mem")
    assert used == []
