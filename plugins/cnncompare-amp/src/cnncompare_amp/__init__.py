"""Mixed-precision backends for cnncompare, through the public plugin contract only.

- ``amp-bf16``: eager under ``torch.autocast(dtype=torch.bfloat16)`` (CPU and CUDA).
- ``amp-fp16``: eager under ``torch.autocast(dtype=torch.float16)`` with a
  ``torch.amp.GradScaler`` (CUDA only: fp16 gradients underflow without loss scaling,
  and the scaler is a CUDA feature).
- ``compile-amp-bf16`` / ``compile-amp-fp16``: the same around ``torch.compile(model)``.

Parity: autocast runs matmuls and convolutions in 16 bits (8 significant bits
for bf16, 11 for fp16), so no step can match float64 to fp32's accuracy. Each
backend states its own relative tolerance (``parity_rtol``, see cnncompare's
docs/parity.md): a tensor passes when its norm-relative error against float64
eager is at most 5 x fp32 eager's own + that.

Measured on this model with emulated bf16 on a CPU at 14x14, batch 32 (the
plugin's test config): every gradient is 5-15 % off float64 after step 1 (the
largest weight's: 6.4 %), losses up to 2 %, and after step 3 the worst tensor
is a BatchNorm bias (27 %: Adam's +-lr steps on its noisy gradient). The
bf16 tolerance, 0.6, passes that at under half its limit and still fails a
skipped first update (the loss of step 2 stays at step 1's: ~90 % off) or
frozen BatchNorm statistics (100 % off). It can't catch a gradient 10 % too
large: bf16's own gradient error is that size. At 8x8, batch 4 the model fits
its 4 images in two steps and bf16's gradients of a near-zero loss are noise
(160 % off): judge bf16 at a real batch. fp16 keeps 3 more bits (errors about
8x smaller; CUDA-only, not measured here): 0.1.
"""
from __future__ import annotations

import os

import torch

import cnncompare

__version__ = "0.1.0"

#: Set to 1 to run the bf16 backends on a CPU without native bf16 (emulated: 10-30x slower).
ENV_EMULATED_BF16 = "CNNCOMPARE_AMP_EMULATED_BF16"


def cpu_has_native_bf16() -> bool:
    """oneDNN's own answer; True where the question can't be asked (let the run decide)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return True

#: Relative parity tolerance per tensor for bf16 (8 significant bits) and fp16 (11); see above.
BF16_TOLERANCE = 0.6
FP16_TOLERANCE = 0.1


class _Autocast:
    """Runs the model's forward under torch.autocast; the loss and backward stay outside, as AMP recommends."""

    dtype: torch.dtype
    compiled = False

    def unavailable_reason(self, device):
        if device.type not in ("cpu", "cuda"):
            return f"torch.autocast with {self.dtype} is only wired up for cpu and cuda here, not {device.type}"
        if device.type == "cuda" and self.dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            return f"{torch.cuda.get_device_name(device)} has no bfloat16 support"
        if (device.type == "cpu" and self.dtype == torch.bfloat16 and not cpu_has_native_bf16()
                and os.environ.get(ENV_EMULATED_BF16) != "1"):
            return (f"this CPU has no native bfloat16 (oneDNN: no bf16; torch CPU capability "
                    f"{torch.backends.cpu.get_cpu_capability()}): autocast bf16 is emulated, 10-30x slower per step "
                    f"than fp32; set {ENV_EMULATED_BF16}=1 to run it anyway")
        return None

    def compile(self, model, example, device):
        target = torch.compile(model) if self.compiled else model
        device_type, dtype = device.type, self.dtype

        def forward(x):
            with torch.autocast(device_type=device_type, dtype=dtype):
                out = target(x)
            return out.float()  # the loss in fp32

        # The optimizer must train `model`'s parameters: a plain function makes the
        # harness take them from `model` (see cnncompare.Backend.compile).
        return forward


class AmpBf16(_Autocast):
    name = "amp-bf16"
    dtype = torch.bfloat16
    precision = "bf16"  # % of peak against a bf16 matmul's peak, not fp32's
    parity_rtol = BF16_TOLERANCE
    description = f"eager under torch.autocast(bfloat16); parity tolerance {BF16_TOLERANCE:g} relative (8 significant bits)"


class CompileAmpBf16(AmpBf16):
    name = "compile-amp-bf16"
    compiled = True
    description = f"torch.compile(model) under torch.autocast(bfloat16); parity tolerance {BF16_TOLERANCE:g} relative"


class AmpFp16(_Autocast):
    name = "amp-fp16"
    dtype = torch.float16
    precision = "fp16"
    parity_rtol = FP16_TOLERANCE
    description = f"eager under torch.autocast(float16) with a GradScaler; parity tolerance {FP16_TOLERANCE:g} relative"

    def unavailable_reason(self, device):
        if device.type != "cuda":
            return "fp16 autocast with a GradScaler is CUDA-only (use amp-bf16 on the CPU)"
        return super().unavailable_reason(device)

    def make_train_step(self, forward, optimizer, loss_fn):
        """The protocol with loss scaling: scaled backward, unscaled and inf-checked optimizer step."""
        # init_scale 2**10 rather than 2**16: a first step skipped for overflow would be a
        # different computation from eager's first step, and parity compares exactly that step.
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10)

        def train_step(x, y):
            loss = loss_fn(forward(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            return loss.detach()

        return train_step


class CompileAmpFp16(AmpFp16):
    name = "compile-amp-fp16"
    compiled = True
    description = f"torch.compile(model) under torch.autocast(float16) with a GradScaler; parity tolerance {FP16_TOLERANCE:g} relative"


@cnncompare.hookimpl
def cnncompare_register_backends(register):
    for backend in (AmpBf16(), CompileAmpBf16(), AmpFp16(), CompileAmpFp16()):
        register(backend)
