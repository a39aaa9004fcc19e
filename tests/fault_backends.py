"""Misbehaving backends for the isolation tests (importable, so the child can unpickle them)."""
import ctypes
import os
import signal
import time

import torch

import cnncompare


class RaiseInCompile:
    name = "raise-compile"

    def compile(self, model, example, device):
        raise RuntimeError("deliberate failure in compile")


class RaiseAtFourthStep:
    name = "raise-step4"

    def compile(self, model, example, device):
        calls = {"n": 0}

        def forward(x):
            calls["n"] += 1
            if calls["n"] == 4:
                raise RuntimeError("deliberate failure in step 4")
            return model(x)

        return forward


class Hang:
    name = "hang"

    def compile(self, model, example, device):
        pid_file = os.environ.get("CNNCOMPARE_TEST_PID_FILE")
        if pid_file:
            with open(pid_file, "w") as f:
                f.write(str(os.getpid()))
        time.sleep(3600)


class Abort:
    name = "abort"

    def compile(self, model, example, device):
        os.abort()


class Segfault:
    name = "segfault"

    def compile(self, model, example, device):
        ctypes.string_at(0)


class NanLoss:
    name = "nan-loss"

    def compile(self, model, example, device):
        return lambda x: model(x) * float("nan")


class WrongNumbers:
    """Trains the right parameters but computes a slightly different function (outputs 5 % off:
    parity's 1 % relative tolerance is for rounding, not for this)."""

    name = "wrong-numbers"

    def compile(self, model, example, device):
        return lambda x: model(x) * 1.05


class Scaled:
    """Takes ``--backend-option scaled:factor=F`` and multiplies the outputs by it (1 by default:
    correct), so a wrong factor failing parity proves the option reached the cell."""

    name = "scaled"
    factor = 1.0

    def configure(self, options):
        unknown = set(options) - {"factor"}
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(sorted(unknown))}; scaled takes factor")
        self.factor = float(options["factor"])

    def compile(self, model, example, device):
        return lambda x: model(x) * self.factor


class Planted:
    """Eager's step, then ``slowdown`` times that step's own time again of busy work on the core
    (``--backend-option planted:slowdown=0.3``: eager plus 30 % more work; 0 by default, which is
    eager): a regression planted for the gate's tests."""

    name = "planted"
    slowdown = 0.0

    def configure(self, options):
        self.slowdown = float(options.get("slowdown", 0.0))

    def compile(self, model, example, device):
        return model

    def compile_step(self, step, example, device):
        def slowed(x, y):
            start = time.perf_counter()
            loss = step(x, y)
            until = time.perf_counter() + self.slowdown * (time.perf_counter() - start)
            while time.perf_counter() < until:  # busy, as a slower kernel would be
                pass
            return loss

        return slowed


class MemoryHog:
    name = "memory-hog"

    def compile(self, model, example, device):
        blocks = []
        for _ in range(120):  # stops at ~6 GB so a broken watchdog fails the test, not the machine
            blocks.append(b"x" * (50 * 1024 * 1024))
            time.sleep(0.01)
        time.sleep(3600)


class SwellInSteps:
    """From its second measured step (calls 1-3 are the first step and warm-up, 4 the first
    measured: ``raise-step4``) each step holds 3 GB for 2 s, then frees it and goes on: over
    ``--max-memory`` only while the parent drives the cell's warm pairs, so only its look during
    the pairs sees it (afterwards the memory is gone and the cell would end ``ok``)."""
    name = "swell-in-steps"

    def compile(self, model, example, device):
        calls = {"n": 0}

        def forward(x):
            calls["n"] += 1
            if calls["n"] >= 5:
                blocks = [b"x" * (50 * 1024 * 1024) for _ in range(60)]
                time.sleep(2)
                del blocks
            return model(x)

        return forward


class Minimal:
    """Only the two required members."""

    name = "minimal"

    def compile(self, model, example, device):
        return model


def _on_rank1(model, at_call, action):
    """A module like ``model`` whose forward runs ``action`` on rank 1 at call ``at_call``."""
    calls = {"n": 0}

    def forward(x):
        calls["n"] += 1
        if calls["n"] == at_call and os.environ.get("RANK") == "1":
            action()
        return model(x)

    return _Wrapped(model, forward)


class RaiseOnRank1:
    """Under torchrun, rank 1 raises at its third step while rank 0 waits in the gradient all-reduce."""

    name = "raise-rank1"

    def compile(self, model, example, device):
        def fail():
            raise RuntimeError("deliberate failure on rank 1")

        return _on_rank1(model, 3, fail)


class KillRank1:
    """Under torchrun, rank 1 dies by SIGKILL at its second step (no result, no traceback)."""

    name = "kill-rank1"

    def compile(self, model, example, device):
        return _on_rank1(model, 2, lambda: os.kill(os.getpid(), signal.SIGKILL))


class _Wrapped(torch.nn.Module):
    """A module (DDP wraps modules only) whose forward is ``forward``, training ``model``'s parameters."""

    def __init__(self, model, forward):
        super().__init__()
        self.model = model
        self._forward = forward

    def forward(self, x):
        return self._forward(x)


class Unpicklable:
    """Holds a lambda, so the child must find it again through the plugins."""

    name = "unpicklable"

    def __init__(self):
        self.wrap = lambda model: model

    def compile(self, model, example, device):
        return self.wrap(model)


ALL = [RaiseInCompile, RaiseAtFourthStep, Hang, Abort, Segfault, NanLoss, WrongNumbers, MemoryHog, SwellInSteps, Minimal, Scaled,
       RaiseOnRank1, KillRank1, Planted]


@cnncompare.hookimpl
def cnncompare_register_backends(register):
    for cls in ALL:
        register(cls())
