"""The parity arithmetic, against a plain float64 computation (no model, no child process)."""
import math

import pytest
import torch

from cnncompare.core.cell import parity as measure


def _state(gen, scale=1.0, shapes=((1000, 700), (5,), ())):
    """A loss, gradients and weights; the first tensor spans several comparison pieces."""
    state = {"loss": torch.randn(shapes[2], generator=gen)}
    for i, shape in enumerate(shapes[:2]):
        state[f"grad:p{i}"] = torch.randn(shape, generator=gen) * scale
        state[f"weight:p{i}"] = torch.randn(shape, generator=gen) * scale
    return state


def _plain_ref_sq(ref64):
    """Each group's squared norm, computed plainly (what reference_state stores)."""
    return {g: sum(float((v.double() ** 2).sum()) for k, v in ref64.items() if k.startswith(g)) for g in measure._GROUPS}


def _reference(ref64, eager32):
    ref_sq = _plain_ref_sq(ref64)
    rmse, rel = measure._errors(eager32, ref64, ref_sq)
    return {"name": "float64 eager", "ref": ref64, "ref_sq": ref_sq, "eager_rmse": rmse, "eager_rel": rel}


def test_errors_match_a_plain_float64_computation():
    gen = torch.Generator().manual_seed(0)
    ref = {k: v.double() for k, v in _state(gen).items()}
    got = {k: (v + 1e-3 * torch.randn(v.shape, generator=gen, dtype=torch.float64)).float() for k, v in ref.items()}
    assert got["grad:p0"].numel() > 2 * measure._CHUNK
    rmse, rel = measure._errors(got, ref, _plain_ref_sq(ref))
    for key, r in ref.items():
        plain = math.sqrt(float(((got[key].double() - r) ** 2).mean()))
        assert rmse[key] == pytest.approx(plain, rel=1e-9)
    keys = [k for k in ref if k.startswith("weight:")]
    plain = math.sqrt(sum(float(((got[k].double() - ref[k]) ** 2).sum()) for k in keys)
                      / sum(float((ref[k] ** 2).sum()) for k in keys))
    assert rel["weight:"] == pytest.approx(plain, rel=1e-9)
    for group, plain_sq in _plain_ref_sq(ref).items():  # the stored norms, computed in pieces
        assert sum(measure._sq_error(v) for k, v in ref.items() if k.startswith(group)) == pytest.approx(plain_sq, rel=1e-9)


def test_a_tensor_outside_its_limit_fails_by_name_and_a_close_one_passes():
    gen = torch.Generator().manual_seed(1)
    ref = {k: v.double() for k, v in _state(gen).items()}
    eager = {k: v.float() for k, v in ref.items()}  # fp32 rounding only
    reference = _reference(ref, eager)
    assert measure.compare_with_reference(eager, reference, 1e-4).passed
    wrong = dict(eager, **{"weight:p0": eager["weight:p0"] * 1.05})
    parity = measure.compare_with_reference(wrong, reference, 1e-4)
    assert not parity.passed and parity.worst_tensor == "weight:p0" and "weight:p0: RMSE" in parity.detail
    nan = dict(eager, loss=torch.tensor(float("nan")))
    assert not measure.compare_with_reference(nan, reference, 1e-4).passed


def test_a_missing_or_misshapen_tensor_fails_with_what_was_found():
    gen = torch.Generator().manual_seed(2)
    ref = {k: v.double() for k, v in _state(gen).items()}
    reference = _reference(ref, {k: v.float() for k, v in ref.items()})
    got = {k: v.float() for k, v in ref.items() if k != "grad:p1"}
    parity = measure.compare_with_reference(got, reference, 1e-4)
    assert not parity.passed and parity.detail == "grad:p1 is missing, expected shape (5,)"
    got["grad:p1"] = torch.zeros(6)
    assert measure.compare_with_reference(got, reference, 1e-4).detail == "grad:p1 is (6,), expected shape (5,)"
