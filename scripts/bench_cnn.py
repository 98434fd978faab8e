"""The Nature CNN model's compute options on this CPU, for inference and for the learner's SGD step, one thread as
inference workers and the learner run by default (docs/PERFORMANCE.md, "The CNN on a CPU").

    python scripts/bench_cnn.py                                   # Breakout- and Doom-sized observations, every option
    python scripts/bench_cnn.py --shapes breakout --options float32,bf16,bf16_cl --rounds 3

Shapes: breakout (4x84x84 uint8 frames, 4 actions), doom (3x72x128 frames and a 15-float measurements vector, the
deathmatch MultiDiscrete action). Per shape every option runs its own copy of one model's weights:
- first its numbers are checked against float32 eager on the same inputs: the action logits and values of a forward
  pass at the largest batch (relative L2 error within TOLERANCE[float32 or bfloat16]), and for a learner option the
  gradient of a PPO-like loss: every weight's finite and non-zero somewhere, the relative L2 error of all of them
  together within GRADIENT_TOLERANCE (the worst single tensor is printed too: a small one, e.g. a bias whose
  gradients mostly cancel, can be off by more);
- the first call at each batch size and the first SGD step are timed apart (torch.compile compiles there,
  jit.freeze traces and freezes there: what a worker pays at start, and jit.freeze again at every weight version);
- then, alternating the options over --rounds, steady state: the inference worker's call (forward_step and action
  sampling under torch.inference_mode) at each of --batches, and the learner's SGD step (appo.learning.ppo.train_step:
  forward, PPO losses, backward, clipped Adam step) on --sgd_batch samples. Medians of the rounds are printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from appo.config.cfg import make_config
from appo.config.hyperparams import Hyperparams
from appo.envs.doom.actions import FULL_BUTTONS, ActionSet
from appo.learning.model import ActorCritic
from appo.learning.policy import make_optimizer
from appo.learning.ppo import forward_trajectories, train_step
from appo.learning.precision import minibatch, observations, seconds_per_call
from appo.memory.buffers import rnn_size

TOLERANCE = {False: 1e-4, True: 3e-2}  # relative L2 error of logits and values: float32, bfloat16 options
GRADIENT_TOLERANCE = {False: 1e-3, True: 1e-1}  # of all the weights' gradients together

SHAPES = {
    "breakout": (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(4)),
    "doom": (gym.spaces.Dict({"obs": gym.spaces.Box(0, 255, (3, 72, 128), np.uint8),
                              "measurements": gym.spaces.Box(-np.inf, np.inf, (15,), np.float32)}),
             ActionSet(FULL_BUTTONS).space),
}


@dataclass(frozen=True)
class Option:
    """One way to run the model, for inference and/or the learner's SGD step."""

    name: str
    about: str
    bf16: bool = False  # image encoders under bfloat16 autocast (ActorCritic.set_bf16_images)
    channels_last: bool = False  # conv weights, so every convolution and its output, in NHWC order
    fpmath: bool = False  # float32 tensors, oneDNN computing convolutions and matmuls in bfloat16
    compile: bool = False  # torch.compile (inductor) of the image encoders
    freeze: bool = False  # torch.jit.trace + freeze + optimize_for_inference (oneDNN conv + ReLU fusion)
    inference: bool = True
    sgd: bool = True

    @property
    def computes_bf16(self) -> bool:
        return self.bf16 or self.fpmath


OPTIONS = [
    Option("float32", "eager float32 (--learner_bf16=False --inference_bf16=False)"),
    Option("float32_cl", "float32, channels_last weights", channels_last=True),
    Option("jit_freeze", "float32, jit.freeze + optimize_for_inference", freeze=True, sgd=False),
    Option("compile_f32", "float32, torch.compile", compile=True),
    Option("onednn_bf16", "float32 tensors, oneDNN fpmath bf16", fpmath=True),
    Option("bf16", "--learner_bf16/--inference_bf16 (on by default where the start-up timing finds them faster): "
                   "SGD under autocast, inference on a bfloat16 NHWC copy of the weights", bf16=True),
    Option("bf16_cl", "bf16, channels_last weights", bf16=True, channels_last=True),
    # SGD only: inference runs the bfloat16 copy, which is not compiled
    Option("compile_bf16", "bf16's autocast SGD, torch.compile", bf16=True, compile=True, inference=False),
]
REFERENCE = OPTIONS[0]


@contextlib.contextmanager
def onednn_bf16_fpmath() -> Iterator[None]:
    """oneDNN's implicit bfloat16 for float32 convolutions and matmuls (torch.backends.mkldnn.*.fp32_precision)."""
    backends = (torch.backends.mkldnn.conv, torch.backends.mkldnn.matmul)
    saved = [backend.fp32_precision for backend in backends]
    for backend in backends:
        backend.fp32_precision = "bf16"
    try:
        yield
    finally:
        for backend, value in zip(backends, saved):
            backend.fp32_precision = value


def image_encoders(model: ActorCritic) -> list[nn.Module]:
    return [trunk["encoder"].encoders[key] for trunk in model.trunks for key in trunk["encoder"].images]


class _Step(nn.Module):
    """forward_step over positional tensors, for torch.jit.trace."""

    def __init__(self, model: ActorCritic, keys: list[str]):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, states: Tensor, *obs: Tensor) -> tuple[Tensor, Tensor]:
        params, values, _ = self.model.forward_step(dict(zip(self.keys, obs)), states)
        return params, values


class Candidate:
    """A copy of the base model run as `option` says, with its own Adam (the learner's)."""

    def __init__(self, option: Option, base: ActorCritic, cfg):
        self.option, self.cfg = option, cfg
        self.model = copy.deepcopy(base)
        self.model.set_bf16_images(option.bf16)
        if option.channels_last:
            self.model.to(memory_format=torch.channels_last)
        if option.compile:
            for encoder in image_encoders(self.model):
                encoder.compile(dynamic=True)  # one graph for every batch size, as an inference worker needs
        self.optimizer = make_optimizer(self.model, cfg.learning_rate, cfg)
        self.frozen: dict[int, torch.jit.ScriptModule] = {}
        self.generator = torch.Generator().manual_seed(0)

    def context(self) -> contextlib.AbstractContextManager:
        return onednn_bf16_fpmath() if self.option.fpmath else contextlib.nullcontext()

    def outputs(self, obs: dict[str, Tensor], states: Tensor) -> tuple[Tensor, Tensor]:
        """Action params and values of a batch of single steps, as an inference worker computes them."""
        with self.context(), torch.inference_mode():
            if not self.option.freeze:
                return self.model.forward_step(obs, states)[:2]
            n = states.shape[0]
            if n not in self.frozen:  # a frozen graph holds the weights: made per batch size and weight version
                with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # torch.jit's deprecation and tracer warnings
                    traced = torch.jit.trace(_Step(self.model, list(obs)).eval(), (states, *obs.values()))
                    self.frozen[n] = torch.jit.optimize_for_inference(torch.jit.freeze(traced))
            return self.frozen[n](states, *obs.values())

    def act(self, obs: dict[str, Tensor], states: Tensor) -> Tensor:
        """What an inference worker does per batch: the forward pass and sampling the actions."""
        params, _ = self.outputs(obs, states)
        with torch.inference_mode():
            return self.model.distribution(params).sample(self.generator)

    def gradients(self, mb: dict, advantages: Tensor, targets: Tensor) -> dict[str, Tensor | None]:
        """Every weight's gradient of a PPO-like loss (policy gradient, value error, entropy) on `mb`."""
        self.model.zero_grad(set_to_none=True)
        with self.context():
            params, values = forward_trajectories(self.model, self.cfg.recurrence, mb)
            dist = self.model.distribution(params)
            loss = (-(dist.log_prob(mb["actions"]) * advantages).mean() + (values - targets).pow(2).mean()
                    - 0.01 * dist.entropy().mean())
            loss.backward()
        grads = {name: None if p.grad is None else p.grad.detach().float().clone()
                 for name, p in self.model.named_parameters()}
        self.model.zero_grad(set_to_none=True)
        return grads

    def sgd_step(self, mb: dict, hp: Hyperparams, advantages: Tensor, targets: Tensor) -> None:
        with self.context():
            train_step(self.model, self.optimizer, self.cfg, hp, mb, advantages, targets)


def relative_error(x: Tensor, reference: Tensor) -> float:
    return float((x.float() - reference).norm() / reference.norm().clamp_min(1e-12))


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_shape(name: str, options: list[Option], args) -> None:
    obs_space, action_space = SHAPES[name]
    cfg = make_config(env="unused")
    hp = Hyperparams.from_cfg(cfg)
    torch.manual_seed(0)
    base = ActorCritic(obs_space, action_space, cfg)
    generator = torch.Generator().manual_seed(0)
    batches = {n: (observations(obs_space, (n,), generator), torch.zeros(n, rnn_size(cfg))) for n in args.batches}
    mb, advantages, targets = minibatch(base, obs_space, args.sgd_batch, cfg)
    reference = Candidate(REFERENCE, base, cfg)
    ref_outputs = reference.outputs(*batches[max(args.batches)])
    ref_grads = reference.gradients(mb, advantages, targets)

    print(f"\n## {name}: numbers against float32 eager, and first calls (compile / freeze / warm-up)", flush=True)
    candidates = []
    for option in options:
        try:
            candidate = Candidate(option, base, cfg)
            line, ok = check(candidate, batches, ref_outputs, ref_grads, (mb, advantages, targets))
        except Exception as error:  # an option this torch or CPU cannot run is reported and left out
            print(f"{option.name:16s} unavailable: {type(error).__name__}: {error}", flush=True)
            continue
        if option.sgd:
            candidate.sgd_step(mb, hp, advantages, targets)  # Adam's state made before the measured steps
        print(f"{option.name:16s} {line}: {'ok' if ok else 'OUT OF TOLERANCE'}", flush=True)
        candidates.append(candidate)

    infer: dict[tuple[str, int], list[float]] = {}
    sgd: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        for candidate in candidates:
            option = candidate.option
            line = f"round {round_ + 1} {name} {option.name:16s}"
            if option.inference:
                line += " us per observation"
                for n, batch in batches.items():
                    dt = seconds_per_call(partial(candidate.act, *batch), args.min_seconds)
                    infer.setdefault((option.name, n), []).append(dt * 1e6 / n)
                    line += f" {n}: {dt * 1e6 / n:5.0f}"
            if option.sgd:
                dt = seconds_per_call(partial(candidate.sgd_step, mb, hp, advantages, targets), args.min_seconds)
                sgd.setdefault(option.name, []).append(args.sgd_batch / dt)
                line += f"; SGD {args.sgd_batch / dt:5.0f} samples/s"
            print(line, flush=True)
    print_medians(name, [c.option for c in candidates], infer, sgd, args)


def check(candidate: Candidate, batches: dict, ref_outputs: tuple[Tensor, Tensor], ref_grads: dict,
          sgd_inputs: tuple) -> tuple[str, bool]:
    """The first calls (timed: compile or freeze happen there) and the numbers against float32 eager's: a line to
    print, and whether they are within tolerance."""
    option, parts, ok = candidate.option, [], True
    if option.inference:
        first = {n: timed(partial(candidate.act, *batch)) for n, batch in batches.items()}
        params, values = candidate.outputs(*batches[max(batches)])
        errors = [relative_error(params, ref_outputs[0]), relative_error(values, ref_outputs[1])]
        ok = max(errors) <= TOLERANCE[option.computes_bf16]
        parts.append(f"logits {errors[0]:.1e} values {errors[1]:.1e} (tolerance {TOLERANCE[option.computes_bf16]:.0e});"
                     f" first calls " + " ".join(f"{n}: {s:.2f} s" for n, s in first.items()))
    if option.sgd:
        started = time.perf_counter()
        grads = candidate.gradients(*sgd_inputs)  # from the same weights as the reference's
        first_backward = time.perf_counter() - started
        reached = all(g is not None and bool(torch.isfinite(g).all()) and bool(g.abs().sum() > 0)
                      for g in grads.values())
        if reached:
            error = relative_error(torch.cat([g.flatten() for g in grads.values()]),
                                   torch.cat([g.flatten() for g in ref_grads.values()]))
            worst = max(ref_grads, key=lambda k: relative_error(grads[k], ref_grads[k]))
            tolerance = GRADIENT_TOLERANCE[option.computes_bf16]
            ok = ok and error <= tolerance
            parts.append(f"gradients reach every weight, all together {error:.1e} (tolerance {tolerance:.0e}), worst "
                         f"tensor {worst} {relative_error(grads[worst], ref_grads[worst]):.1e}")
        else:
            ok = False
            parts.append("gradients MISSING or non-finite")
        parts.append(f"first backward pass {first_backward:.2f} s")
    return "; ".join(parts), ok


def print_medians(name: str, options: list[Option], infer: dict, sgd: dict, args) -> None:
    """The medians of the rounds as a markdown table, each with its ratio to float32 eager's."""
    print(f"\n## {name}: medians of {args.rounds} rounds (x: against float32)\n")
    print("| option | " + " | ".join(f"inference, batch {n} (us/obs)" for n in args.batches)
          + f" | SGD step of {args.sgd_batch} (samples/s) |")
    print("| --- " * (len(args.batches) + 2) + "|")
    for option in options:
        cells = []
        for n in args.batches:
            if option.inference:
                us, base_us = statistics.median(infer[option.name, n]), statistics.median(infer[REFERENCE.name, n])
                cells.append(f"{us:.0f} ({base_us / us:.2f}x)")
            else:
                cells.append("-")
        if option.sgd:
            rate, base_rate = statistics.median(sgd[option.name]), statistics.median(sgd[REFERENCE.name])
            cells.append(f"{rate:,.0f} ({rate / base_rate:.2f}x)")
        else:
            cells.append("-")
        print(f"| {option.name}: {option.about} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="breakout,doom", help=f"Comma-separated, of {', '.join(SHAPES)}.")
    parser.add_argument("--options", default=",".join(o.name for o in OPTIONS),
                        help="Comma-separated, of: " + "; ".join(f"{o.name} ({o.about})" for o in OPTIONS)
                        + f". {REFERENCE.name} always runs (the reference).")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="8,32,128", help="Comma-separated inference batch sizes.")
    parser.add_argument("--sgd_batch", type=int, default=256, help="Samples per SGD step (--batch_size's default).")
    parser.add_argument("--min_seconds", type=float, default=0.3, help="Measured time per option, size and round.")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (inference workers run 1, the learner --learner_torch_threads=1).")
    args = parser.parse_args()
    args.batches = [int(n) for n in args.batches.split(",")]
    by_name = {o.name: o for o in OPTIONS}
    unknown = [n for n in args.options.split(",") if n not in by_name]
    if unknown:
        parser.error(f"--options: unknown {', '.join(unknown)}")
    options = [REFERENCE] + [by_name[n] for n in args.options.split(",") if n != REFERENCE.name]
    if args.sgd_batch % 32:
        parser.error("--sgd_batch: a multiple of 32 (whole trajectories of --rollout=32 steps)")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds", flush=True)
    for name in args.shapes.split(","):
        bench_shape(name, options, args)


if __name__ == "__main__":
    main()
