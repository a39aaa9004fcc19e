"""Mixed-precision backends for cnncompare, through the public plugin contract only.

- ``amp-bf16``: eager under ``torch.autocast(dtype=torch.bfloat16)`` (CPU and CUDA).
- ``amp-fp16``: eager under ``torch.autocast(dtype=torch.float16)`` with a
  ``torch.amp.GradScaler`` (CUDA only: fp16 gradients underflow without loss scaling,
  and the scaler is a CUDA feature).
- ``compile-amp-bf16`` / ``compile-amp-fp16``: the same around ``torch.compile(model)``.

Parity: autocast runs matmuls and convolutions in 16 bits (8 significant bits
for bf16, 11 for fp16), so no step can match float64 to fp32's accuracy. Each
backend declares its ``precision``; cnncompare then holds it to that precision's
own error on every tensor, measured by eager under autocast in the same
precision over the same steps (see cnncompare's docs/parity.md), so the default
relative tolerance applies: no tolerance of its own is needed. Measured at
cnncompare's default config: amp-bf16 passes at 0.2 of its limit; a gradient 10 % too large, twice
the learning rate, a skipped first update and frozen BatchNorm statistics fail.
Other Adam betas are inside bf16's own spread by the parity step and pass.
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
    precision = "bf16"  # % of peak against a bf16 matmul's peak; parity held to bf16 eager's own error
    description = "eager under torch.autocast(bfloat16); parity held to bf16's own error"
    use_it = 'with torch.autocast("{device}", dtype=torch.bfloat16): output = model(x)  # loss and backward outside'


class CompileAmpBf16(AmpBf16):
    name = "compile-amp-bf16"
    compiled = True
    description = "torch.compile(model) under torch.autocast(bfloat16); parity held to bf16's own error"
    use_it = ('model = torch.compile(model); with torch.autocast("{device}", dtype=torch.bfloat16): output = model(x)'
              '  # loss and backward outside')


class AmpFp16(_Autocast):
    name = "amp-fp16"
    dtype = torch.float16
    precision = "fp16"
    description = "eager under torch.autocast(float16) with a GradScaler; parity held to fp16's own error"
    use_it = ('scaler = torch.amp.GradScaler("{device}"); with torch.autocast("{device}", dtype=torch.float16): '
              'loss = loss_fn(model(x), y); scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()')

    def unavailable_reason(self, device):
        if device.type != "cuda":
            return "fp16 autocast with a GradScaler is CUDA-only (use amp-bf16 on the CPU)"
        return super().unavailable_reason(device)

    def make_train_step(self, forward, optimizer, loss_fn, recipe=cnncompare.Recipe(), params=()):
        """The protocol with loss scaling: scaled backward per micro-batch, unscaled gradients
        clipped where the workload's recipe clips, an inf-checked optimizer step."""
        # init_scale 2**10 rather than 2**16: a first step skipped for overflow would be a
        # different computation from eager's first step, and parity compares exactly that step.
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10)
        count, clip = recipe.accumulation_steps, recipe.clip_grad_norm

        def train_step(x, y):
            total = 0
            for i, (xi, yi) in enumerate(recipe.split(x, y)):
                loss = loss_fn(forward(xi), yi) / count
                if i == 0:
                    optimizer.zero_grad()
                scaler.scale(loss).backward()
                total = loss.detach() + total
            if clip is not None:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                torch.nn.utils.clip_grad_norm_(params, clip)
            scaler.step(optimizer)
            scaler.update()
            return total

        return train_step


class CompileAmpFp16(AmpFp16):
    name = "compile-amp-fp16"
    compiled = True
    description = "torch.compile(model) under torch.autocast(float16) with a GradScaler; parity held to fp16's own error"
    use_it = "model = torch.compile(model), then amp-fp16's GradScaler and autocast(float16) step"


@cnncompare.hookimpl
def cnncompare_register_backends(register):
    for backend in (AmpBf16(), CompileAmpBf16(), AmpFp16(), CompileAmpFp16()):
        register(backend)
