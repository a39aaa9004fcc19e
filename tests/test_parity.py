"""The parity arithmetic, against a plain float64 computation (no model, no child process)."""
import math

import pytest
import torch

from cnncompare.core.cell import parity


def _state(gen, scale=1.0):
    """Two losses, then a gradient, weight and buffer per parameter; the first spans several pieces."""
    state = {"loss:1": torch.randn((), generator=gen), "loss:3": torch.randn((), generator=gen)}
    for i, shape in enumerate(((1000, 700), (5,))):
        for kind in ("grad", "weight", "buffer"):
            state[f"step3/{kind}:p{i}"] = torch.randn(shape, generator=gen) * scale
    return state


def _reference(ref64, eager32, noise=()):
    ref_sq = {k: float((v.double() ** 2).sum()) for k, v in ref64.items()}
    eager_rel, groups = parity._relative_errors(eager32, ref64, ref_sq, frozenset(noise))
    return {"name": "float64 eager", "ref": ref64, "ref_sq": ref_sq, "eager_rel": eager_rel, "eager_groups": groups,
            "noise": list(noise), "seconds": 0.0}


def test_errors_match_a_plain_float64_computation():
    gen = torch.Generator().manual_seed(0)
    ref = {k: v.double() for k, v in _state(gen).items()}
    got = {k: (v + 1e-3 * torch.randn(v.shape, generator=gen, dtype=torch.float64)).float() for k, v in ref.items()}
    assert got["step3/grad:p0"].numel() > 2 * parity._CHUNK
    ref_sq = {k: float((v ** 2).sum()) for k, v in ref.items()}
    per_tensor, groups = parity._relative_errors(got, ref, ref_sq)
    for key, r in ref.items():
        plain = math.sqrt(float(((got[key].double() - r) ** 2).sum()) / float((r ** 2).sum()))
        assert per_tensor[key] == pytest.approx(plain, rel=1e-9)
        assert parity._sq_norm(r) == pytest.approx(ref_sq[key], rel=1e-9)  # computed in pieces
    keys = [k for k in ref if "/weight:" in k]
    plain = math.sqrt(sum(float(((got[k].double() - ref[k]) ** 2).sum()) for k in keys)
                      / sum(float((ref[k] ** 2).sum()) for k in keys))
    assert groups["weight"] == pytest.approx(plain, rel=1e-9)


def test_a_tensor_outside_its_limit_fails_by_name_and_a_close_one_passes():
    gen = torch.Generator().manual_seed(1)
    ref = {k: v.double() for k, v in _state(gen).items()}
    eager = {k: v.float() for k, v in ref.items()}  # fp32 rounding only
    reference = _reference(ref, eager)
    ok = parity.compare_with_reference(eager, reference, 1e-2, 3)
    assert ok.passed and ok.margin < 0.01 and ok.step == 3 and ok.tensors == len(ref)
    # 0.5 % off passes a 1 % tolerance at half its limit; 2 % off fails it, named.
    close = dict(eager, **{"step3/weight:p0": eager["step3/weight:p0"] * 1.005})
    assert parity.compare_with_reference(close, reference, 1e-2, 3).margin == pytest.approx(0.5, rel=1e-3)
    wrong = dict(eager, **{"step3/weight:p0": eager["step3/weight:p0"] * 1.02})
    result = parity.compare_with_reference(wrong, reference, 1e-2, 3)
    assert not result.passed and result.worst_tensor == "step3/weight:p0" and result.margin == pytest.approx(2, rel=1e-3)
    assert result.detail.startswith("step3/weight:p0 after step 3: relative error 0.02 vs float64 eager exceeds 5 x")
    nan = dict(eager, **{"loss:3": torch.tensor(float("nan"))})
    assert not parity.compare_with_reference(nan, reference, 1e-2, 3).passed


def test_the_limit_scales_with_fp32_eagers_own_error():
    gen = torch.Generator().manual_seed(3)
    ref = {k: v.double() for k, v in _state(gen).items()}
    eager = dict({k: v.float() for k, v in ref.items()})
    eager["step3/grad:p1"] = (ref["step3/grad:p1"] * 1.004).float()  # fp32 eager itself 0.4 % off here
    reference = _reference(ref, eager)
    assert reference["eager_rel"]["step3/grad:p1"] == pytest.approx(0.004, rel=1e-4)
    got = dict(eager, **{"step3/grad:p1": (ref["step3/grad:p1"] * 1.02).float()})  # 2 % < 5 x 0.4 % + 1 %
    result = parity.compare_with_reference(got, reference, 1e-2, 3)
    assert result.passed and result.worst_limit == pytest.approx(0.03, rel=1e-3)


def test_noise_tensors_are_named_and_not_judged():
    gen = torch.Generator().manual_seed(4)
    ref = {k: v.double() for k, v in _state(gen).items()}
    eager = {k: v.float() for k, v in ref.items()}
    reference = _reference(ref, eager, noise=["step3/grad:p1"])
    got = dict(eager, **{"step3/grad:p1": torch.zeros(5)})  # 100 % off, but rounding noise by fp32 eager's measure
    result = parity.compare_with_reference(got, reference, 1e-2, 3)
    assert result.passed and result.not_judged == ["step3/grad:p1"] and result.tensors == len(ref) - 1


def test_a_reduced_precision_gets_the_room_its_precision_needs_on_ill_conditioned_tensors_only():
    gen = torch.Generator().manual_seed(5)
    ref = {k: v.double() for k, v in _state(gen).items()}
    eager = {k: v.float() for k, v in ref.items()}
    eager["step3/grad:p1"] = (ref["step3/grad:p1"] * (1 + 3.4e-5)).float()  # ill-conditioned: bf16 x 65536 = 2.2
    reference = _reference(ref, eager)
    assert parity.limit(3.4e-5, 0.6, "bf16") == pytest.approx(5 * 3.4e-5 + 0.6 + 65535 * 3.4e-5)
    got = dict(eager, **{"step3/grad:p1": (ref["step3/grad:p1"] * 2.6).float()})  # 160 % off, as bf16 was
    bf16 = parity.compare_with_reference(got, reference, 0.6, 3, "bf16")
    assert bf16.passed and bf16.not_judged == [] and bf16.tensors == len(ref)  # judged, within its room
    fp32 = parity.compare_with_reference(got, reference, 1e-2, 3)  # fp32 resolves it: wrong
    assert not fp32.passed and fp32.worst_tensor == "step3/grad:p1"
    # A well-conditioned tensor gets almost nothing more: 100 % off fails in bf16 too, and says why.
    wrong = dict(eager, **{"step3/weight:p0": (ref["step3/weight:p0"] * 2).float()})
    result = parity.compare_with_reference(wrong, reference, 0.6, 3, "bf16")
    assert not result.passed and result.worst_tensor == "step3/weight:p0" and "bf16's expected" in result.detail


def test_integer_buffers_compare_as_numbers():
    ref = {"step3/buffer:count": torch.tensor(3)}
    reference = _reference({k: v for k, v in ref.items()}, ref)
    assert parity.compare_with_reference({"step3/buffer:count": torch.tensor(3)}, reference, 1e-2, 3).passed
    result = parity.compare_with_reference({"step3/buffer:count": torch.tensor(8)}, reference, 1e-2, 3)
    assert not result.passed and result.worst_error == pytest.approx(5 / 3)


def test_a_missing_or_misshapen_tensor_fails_with_what_was_found():
    gen = torch.Generator().manual_seed(2)
    ref = {k: v.double() for k, v in _state(gen).items()}
    reference = _reference(ref, {k: v.float() for k, v in ref.items()})
    got = {k: v.float() for k, v in ref.items() if k != "step3/grad:p1"}
    result = parity.compare_with_reference(got, reference, 1e-2, 3)
    assert not result.passed and result.detail == "step3/grad:p1 is missing, expected shape (5,)"
    got["step3/grad:p1"] = torch.zeros(6)
    assert parity.compare_with_reference(got, reference, 1e-2, 3).detail == "step3/grad:p1 is (6,), expected shape (5,)"


def test_the_parity_step_follows_the_backends_warm_up():
    assert parity.parity_step(0) == 3 and parity.parity_step(2) == 3 and parity.parity_step(4) == 5
