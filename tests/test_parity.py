"""The parity arithmetic, against a plain float64 computation (no model, no child process)."""
import math

import pytest
import torch

from cnncompare.core.cell import parity, reference


def _state(gen, scale=1.0):
    """Two losses, then a gradient, weight and buffer per parameter; the first spans several pieces."""
    state = {"loss:1": torch.randn((), generator=gen), "loss:3": torch.randn((), generator=gen)}
    for i, shape in enumerate(((1000, 700), (5,))):
        for kind in ("grad", "weight", "buffer"):
            state[f"step3/{kind}:p{i}"] = torch.randn(shape, generator=gen) * scale
    return state


def _reference(ref64, eager32, perturbed=(), precisions=None, init=None, losses=(2.3, 2.2), drift=(2.3, 2.2)):
    """The reference as ``reference.compute`` saves it, from given states (no model)."""
    return reference.assemble("float64 eager", ref64, init or {}, eager32, list(perturbed), precisions or {},
                              list(losses), [list(drift)])


def test_errors_match_a_plain_float64_computation():
    gen = torch.Generator().manual_seed(0)
    ref = {k: v.double() for k, v in _state(gen).items()}
    got = {k: (v + 1e-3 * torch.randn(v.shape, generator=gen, dtype=torch.float64)).float() for k, v in ref.items()}
    assert got["step3/grad:p0"].numel() > 2 * parity._CHUNK
    start = {k: v * 0.9 for k, v in ref.items() if "/weight:" in k}
    stats = parity.stats(got, ref, start)
    per_tensor, scale = parity.errors(stats)
    for key, r in ref.items():
        d = r - start[key] if key in start else r
        diff = got[key].double() - r
        assert per_tensor[key] == pytest.approx(math.sqrt(float((diff ** 2).sum()) / float((d ** 2).sum())), rel=1e-9)
        assert scale[key] == pytest.approx(abs(float((diff * d).sum())) / float((d ** 2).sum()), rel=1e-6)
    keys = [k for k in ref if "/weight:" in k]
    plain = math.sqrt(sum(float(((got[k].double() - ref[k]) ** 2).sum()) for k in keys)
                      / sum(float(((ref[k] - start[k]) ** 2).sum()) for k in keys))
    assert parity.group_errors(stats)["weight"] == pytest.approx(plain, rel=1e-9)


def test_an_output_is_judged_against_its_spread_not_its_offset():
    """Log-probabilities near initialisation are all about -ln(10): another batch's differ by well
    under 1 % of their norm, but by all of their spread."""
    gen = torch.Generator().manual_seed(7)
    ref = {"step1/output:0": -2.3 + 0.01 * torch.randn(64, 10, generator=gen, dtype=torch.float64)}
    other = {"step1/output:0": (-2.3 + 0.01 * torch.randn(64, 10, generator=gen, dtype=torch.float64)).float()}
    rel, _ = parity.errors(parity.stats(other, ref, {}))
    assert rel["step1/output:0"] > 1  # by the plain norm it would be about 0.006
    result = parity.compare_with_reference(other, _reference(ref, {k: v.float() for k, v in ref.items()}), 1e-2, 1)
    assert not result.passed and result.margin > 50


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


def test_the_limit_scales_with_the_largest_error_of_the_correct_fp32_computations():
    gen = torch.Generator().manual_seed(3)
    ref = {k: v.double() for k, v in _state(gen).items()}
    eager = {k: v.float() for k, v in ref.items()}
    lucky = dict(eager, **{"step3/grad:p1": (ref["step3/grad:p1"] * 1.0001).float()})  # eager 0.01 % off
    perturbed = dict(eager, **{"step3/grad:p1": (ref["step3/grad:p1"] * 1.004).float()})  # a perturbed run 0.4 %
    got = dict(eager, **{"step3/grad:p1": (ref["step3/grad:p1"] * 1.02).float()})  # 2 % < 5 x 0.4 % + 1 %
    assert not parity.compare_with_reference(got, _reference(ref, lucky), 1e-2, 3).passed  # eager alone: 1.05 %
    reference = _reference(ref, lucky, [perturbed])
    assert reference["sens"]["step3/grad:p1"] == pytest.approx(0.004, rel=1e-4)
    result = parity.compare_with_reference(got, reference, 1e-2, 3)
    assert result.passed
    assert parity.compare_with_reference(got, reference, 1e-2, 3).margin == pytest.approx(0.02 / 0.03, rel=1e-3)


def test_a_gradient_ten_percent_too_large_fails_the_scale_test_where_the_norm_test_cant_see_it():
    """bf16's own error on the tensor is 30 %: the norm can't tell 10 % more; its size along the
    reference moves 10 % where bf16's rounding moves it by under 1 %."""
    gen = torch.Generator().manual_seed(5)
    ref = {k: v.double() for k, v in _state(gen).items()}
    eager = {k: v.float() for k, v in ref.items()}
    noisy = {k: (v + 0.3 * v.std() * torch.randn(v.shape, generator=gen, dtype=torch.float64)).float()
             if v.numel() > 1000 else v.float() for k, v in ref.items()}  # unbiased rounding-like error, 30 %
    reference = _reference(ref, eager, precisions={"bf16": (noisy, [2.3, 2.2], True, [])})
    assert reference["precisions"]["bf16"]["scale"]["step3/grad:p0"] < 0.01
    assert parity.compare_with_reference(noisy, reference, 1e-2, 3, "bf16").passed
    wrong = dict(noisy, **{"step3/grad:p0": noisy["step3/grad:p0"] * 1.1})
    result = parity.compare_with_reference(wrong, reference, 1e-2, 3, "bf16")
    assert not result.passed and result.worst_tensor == "scale of step3/grad:p0" and result.margin > 2
    assert "raised to eager bf16's own error" in result.detail
    # held as fp32, the bf16 row fails on the norm: fp32 resolves it
    assert not parity.compare_with_reference(noisy, reference, 1e-2, 3).passed


def test_a_weight_is_judged_by_its_last_update():
    gen = torch.Generator().manual_seed(6)
    ref = {k: v.double() for k, v in _state(gen).items()}
    before = {k: v - 1e-3 * torch.randn(v.shape, generator=gen, dtype=torch.float64)
              for k, v in ref.items() if "/weight:" in k}
    earlier = {k.replace("step3/", "step2/"): v.float() for k, v in before.items()}  # the weights after step 2
    reference = _reference(ref, {**{k: v.float() for k, v in ref.items()}, **earlier}, init=before)
    # the update 20 % larger: a tiny fraction of the weight, all of the check (and of the update's)
    got = {k: (before[k] + 1.2 * (v - before[k])).float() if k in before else v.float() for k, v in ref.items()}
    result = parity.compare_with_reference({**got, **earlier}, reference, 1e-2, 3)
    assert not result.passed and result.worst_error == pytest.approx(0.2, rel=1e-3)
    assert "weight:" in result.worst_tensor or "update:" in result.worst_tensor


def test_noise_tensors_are_named_and_not_judged():
    gen = torch.Generator().manual_seed(4)
    ref = {k: v.double() for k, v in _state(gen).items()}
    eager = {k: v.float() for k, v in ref.items()}
    eager["step3/grad:p1"] = torch.zeros(5)  # fp32 itself 100 % off: rounding noise
    reference = _reference(ref, eager)
    got = dict(eager, **{"step3/grad:p1": torch.ones(5)})
    result = parity.compare_with_reference(got, reference, 1e-2, 3)
    assert result.passed and result.not_judged == ["step3/grad:p1"] and result.tensors == len(ref) - 1


def _orthogonal_noise(ref: torch.Tensor, size: float, gen) -> torch.Tensor:
    """Noise of ``size`` times ``ref``'s norm, orthogonal to ``ref``: it moves the norm, not the scale."""
    noise = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    noise -= (noise * ref).sum() / (ref * ref).sum() * ref
    return noise * (size * ref.norm() / noise.norm())


def test_a_tensor_whose_norm_fp32_cannot_resolve_is_still_judged_by_its_scale():
    """Measured at batch 16, 14x14: fp32 perturbed by 256 ulps put the largest weight's step-1
    gradient 1.35 % off in norm (beyond what fp32 resolves) and 7.5e-5 in scale. The scale check
    alone then judges it: a gradient 10 % too large fails, another draw of the noise passes."""
    gen = torch.Generator().manual_seed(5)
    ref = {k: v.double() for k, v in _state(gen).items()}
    key = "step3/grad:p0"
    eager = {k: v.float() for k, v in ref.items()}
    eager[key] = (ref[key] + _orthogonal_noise(ref[key], 0.05, gen)).float()
    reference = _reference(ref, eager)
    assert reference["sens"][key] > parity.NOISE_REL > reference["sens_scale"][key]
    noisy = dict(eager, **{key: (ref[key] + _orthogonal_noise(ref[key], 0.05, gen)).float()})
    result = parity.compare_with_reference(noisy, reference, 1e-2, 3)
    assert result.passed and result.not_judged == [] and result.tensors == len(ref)
    wrong = dict(eager, **{key: (1.1 * ref[key]).float()})
    result = parity.compare_with_reference(wrong, reference, 1e-2, 3)
    assert not result.passed and result.worst_tensor == f"scale of {key}"
    assert result.worst_error == pytest.approx(0.1, rel=1e-3)


def test_the_last_update_is_judged_apart_from_the_drift_before_it():
    """Where the weights drift by about an update before the parity step, along the update too
    (bf16 at batch 16, 14x14), the weight check can't see the update itself (other Adam betas
    passed it there). The update check compares the row's own last update with the reference's:
    a correct row's weights may drift as eager's do, an update 10 % too large fails by its scale."""
    gen = torch.Generator().manual_seed(9)
    before = torch.randn(4000, generator=gen, dtype=torch.float64)
    delta = 1e-3 * torch.randn(4000, generator=gen, dtype=torch.float64)
    ref, init = {"step3/weight:w": before + delta}, {"step3/weight:w": before}

    def trained(along: float, update: float) -> dict[str, torch.Tensor]:
        drift = along * delta + _orthogonal_noise(delta, 0.8, gen)  # the steps before: an update's worth
        return {"step2/weight:w": (before + drift).float(), "step3/weight:w": (before + drift + update * delta).float()}

    reference = _reference(ref, trained(0.3, 1.0), init=init)
    assert parity.judged_keys(ref, init) == ["step3/weight:w", "step3/update:w"]
    assert reference["sens_scale"]["step3/weight:w"] > 0.25 > 1e-3 > reference["sens_scale"]["step3/update:w"]
    result = parity.compare_with_reference(trained(0.35, 1.0), reference, 1e-2, 3)
    # the weights' drift is beyond resolution at this size; the update is not
    assert result.passed and result.not_judged == ["step3/weight:w"] and result.tensors == 1, result.worst_tensor
    result = parity.compare_with_reference(trained(0.35, 1.1), reference, 1e-2, 3)
    assert not result.passed and result.worst_tensor == "scale of step3/update:w", result.worst_tensor
    assert result.worst_error == pytest.approx(0.1, rel=1e-2)
    missing = parity.compare_with_reference({"step3/weight:w": ref["step3/weight:w"].float()}, reference, 1e-2, 3)
    assert not missing.passed and missing.worst_tensor == "step2/weight:w" and "missing" in missing.detail


def test_the_trajectory_holds_every_later_step_within_fp32s_own_drift():
    gen = torch.Generator().manual_seed(8)
    ref = {k: v.double() for k, v in _state(gen).items()}
    eager = {k: v.float() for k, v in ref.items()}
    losses = [2.30, 2.28, 2.25, 2.27, 2.26, 2.24]
    drifted = [2.30, 2.28, 2.25, 2.27 * 1.001, 2.26 * 1.002, 2.24 * 1.004]  # the perturbed run
    reference = _reference(ref, eager, losses=losses, drift=drifted)
    assert reference["drift"][-1] == pytest.approx(0.004, rel=1e-2)
    ok = [v * 1.01 for v in losses]  # 1 % off at every step: within 5 x 0.4 % + 1 % by the last
    assert parity.compare_with_reference(eager, reference, 1e-2, 3, losses=ok).trajectory_steps == 6
    late = losses[:4] + [2.26 * 1.05, 2.24 * 1.3]  # right through step 4, then off
    result = parity.compare_with_reference(eager, reference, 1e-2, 3, losses=late)
    assert not result.passed and result.worst_tensor == "trajectory:6" and "step 6" in result.detail


def test_the_measured_precision_is_the_reference_its_first_step_errors_match():
    gen = torch.Generator().manual_seed(9)
    ref = {k.replace("step3", "step1"): v.double() for k, v in _state(gen).items() if not k.startswith("loss")}

    def off(scale):
        return {k: (v * (1 + scale * torch.randn(v.shape, generator=gen, dtype=torch.float64))).float()
                for k, v in ref.items()}

    eager, bf16 = off(1e-7), off(3e-3)
    reference = _reference(ref, eager, precisions={"bf16": (bf16, [], False, [])})
    assert parity.compare_with_reference(off(2e-7), reference, 1e-2, 1).precision == "fp32"
    assert parity.compare_with_reference(off(2e-3), reference, 1e-2, 1).precision == "bf16"


def test_integer_buffers_compare_as_numbers():
    ref = {"step3/buffer:count": torch.tensor(3)}
    reference = _reference({k: v for k, v in ref.items()}, ref, losses=(), drift=())
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
