"""Backends that compute something else, written only from the documented backend contract
(training's, then inference's).

Each must end ``fail_accuracy``: the parity check exists to catch exactly these.
Importable (the cell's child unpickles them) and registered as a plugin module.
"""
import dataclasses

import torch
from torch import nn

import cnncompare
from cnncompare.core.cell.training import make_train_step


def _largest_weight(model: nn.Module) -> nn.Parameter:
    return max((p for p in model.parameters() if p.dim() > 1), key=lambda p: p.numel())


class GradTimes1_1:
    """The largest weight's gradient 10 % too large (Adam's update can't show it: it is scale-blind)."""

    name = "wrong-grad-x1.1"

    def compile(self, model, example, device):
        _largest_weight(model).register_hook(lambda g: g * 1.1)
        return model


class OtherBetas:
    """Adam with betas (0.8, 0.99) instead of the default (0.9, 0.999)."""

    name = "wrong-adam-betas"

    def compile(self, model, example, device):
        return model

    def make_optimizer(self, params, lr):
        return torch.optim.Adam(params, lr=lr, betas=(0.8, 0.99))


class StaleAfterStep2:
    """Trains for two steps, then replays its last loss without training (a stale graph replay)."""

    name = "wrong-stale-after-2"

    def compile(self, model, example, device):
        return model

    def make_train_step(self, forward, optimizer, loss_fn):
        real = make_train_step(forward, optimizer, loss_fn)
        state = {"calls": 0, "last": None}

        def step(x, y):
            state["calls"] += 1
            if state["calls"] <= 2:
                state["last"] = real(x, y)
            return state["last"]

        return step


class FrozenBatchNorm:
    """BatchNorm normalises with the batch but never updates its running statistics."""

    name = "wrong-frozen-bn"

    def compile(self, model, example, device):
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.momentum = 0.0  # running stat = 1 x old + 0 x batch's: never moves
        return model


class SkipFirstUpdate:
    """The first step computes loss and gradients but skips the optimizer's update."""

    name = "wrong-skip-first-update"

    def compile(self, model, example, device):
        return model

    def make_train_step(self, forward, optimizer, loss_fn):
        real = make_train_step(forward, optimizer, loss_fn)
        state = {"calls": 0}

        def step(x, y):
            state["calls"] += 1
            if state["calls"] == 1:
                loss = loss_fn(forward(x), y)
                optimizer.zero_grad()
                loss.backward()
                return loss.detach()
            return real(x, y)

        return step


class ReplaysItsExample:
    """Runs the model on the example it was compiled with, whatever batch it is given (a graph
    replay that never copies the new input in)."""

    name = "wrong-ignores-input"

    def compile(self, model, example, device):
        captured = example.clone()
        return lambda x: model(captured)


class StopsTrainingAfterParityStep:
    """Right up to the parity step (3) and the step after it, then replays its forward without
    training (a re-recorded graph that lost the update): only the later steps show it."""

    name = "wrong-stale-after-4"

    def compile(self, model, example, device):
        return model

    def make_train_step(self, forward, optimizer, loss_fn):
        real = make_train_step(forward, optimizer, loss_fn)
        calls = []

        def step(x, y):
            calls.append(1)
            if len(calls) <= 4:
                return real(x, y)
            return loss_fn(forward(x), y).detach()

        return step


class IgnoresScheduler:
    """Keeps the first learning rate: every step puts it back before the optimizer steps."""

    name = "wrong-ignores-scheduler"

    def compile(self, model, example, device):
        return model

    def make_train_step(self, forward, optimizer, loss_fn, recipe, params):
        first = [group["lr"] for group in optimizer.param_groups]
        real = make_train_step(forward, optimizer, loss_fn, recipe, params)

        def step(x, y):
            for group, lr in zip(optimizer.param_groups, first):
                group["lr"] = lr
            return real(x, y)

        return step


class SkipsClipping:
    """Follows the recipe but never clips the gradients."""

    name = "wrong-skips-clipping"

    def compile(self, model, example, device):
        return model

    def make_train_step(self, forward, optimizer, loss_fn, recipe, params):
        return make_train_step(forward, optimizer, loss_fn, dataclasses.replace(recipe, clip_grad_norm=None), params)


#: Wrong only under a recipe of the workload's own (a scheduler, clipping): the recipe tests.
WRONG_RECIPE = (IgnoresScheduler, SkipsClipping)

WRONG = (GradTimes1_1, OtherBetas, StaleAfterStep2, FrozenBatchNorm, SkipFirstUpdate, ReplaysItsExample,
         StopsTrainingAfterParityStep)


# Inference (--mode inference): forwards that compute something else.

class ScaledOutput:
    """Outputs 10 % too large: a wrong deploy path."""

    name = "wrong-output-x1.1"

    def compile(self, model, example, device):
        return lambda x: model(x) * 1.1


class RunsInTrainMode:
    """Forgets model.eval(): BatchNorm normalises with the batch and moves its running statistics."""

    name = "wrong-train-mode"

    def compile(self, model, example, device):
        return model.train()


class StaleOutput:
    """Replays its first output from the second step on, unchanged (a stale graph replay)."""

    name = "wrong-stale-output"

    def compile(self, model, example, device):
        first = {}

        def forward(x):
            if "out" not in first:
                first["out"] = model(x)
            return first["out"]

        return forward


class IgnoresInput:
    """Runs on the example it was compiled with, whatever batch it is given."""

    name = "wrong-ignores-input-inference"

    def compile(self, model, example, device):
        captured = example.clone()
        return lambda x: model(captured)


class FoldsBatchNormWrong:
    """Folds eval-mode BatchNorm into a scale and shift, dividing by the variance instead of its
    square root: identical on a never-trained BatchNorm (variance 1), wrong on a real one."""

    name = "wrong-bn-fold"

    def compile(self, model, example, device):
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                scale = module.weight / (module.running_var + module.eps)
                shift = module.bias - module.running_mean * scale
                shape = (1, -1) + (1,) * (example.dim() - 2)
                module.forward = lambda x, scale=scale.detach(), shift=shift.detach(), shape=shape: \
                    x * scale.reshape(shape) + shift.reshape(shape)
        return model


class WrongAfterParityStep:
    """Right for the first four forwards, then 10 % too large (a recompiled graph gone wrong)."""

    name = "wrong-output-after-4"

    def compile(self, model, example, device):
        calls = []

        def forward(x):
            calls.append(1)
            return model(x) * (1.1 if len(calls) > 4 else 1.0)

        return forward


WRONG_INFERENCE = (ScaledOutput, RunsInTrainMode, StaleOutput, IgnoresInput, FoldsBatchNormWrong,
                   WrongAfterParityStep)


@cnncompare.hookimpl
def cnncompare_register_backends(register):
    for cls in WRONG + WRONG_INFERENCE + WRONG_RECIPE:
        register(cls())
