"""Export a trained policy as ONNX or TorchScript, for use without this trainer.

    python -m appo.export --experiment=cartpole --format=onnx [--out policy.onnx]

The exported model maps a batch of observations (one input per observation key, named after it; `obs`
for a Box space) and, for a recurrent policy, the recurrent state `rnn_states` [batch, state size] to:
- `action_params`: per discrete action part its logits, per continuous part its means (the action box's centre
  included: an untrained policy's mean is the centre) then its log-stds (the trainer clamps log-stds to
  `appo.learning.model.LOG_STD_BOUNDS` when it samples, and clips the actions to the box);
- `values`: the value estimate of each row, in reward units;
- `next_rnn_states` (recurrent policies only): the state to pass with the next step (zeros at an
  episode start).
A policy trained with action masks (`--action_mask`) takes the mask as its `action_mask` input (float32, one 0/1
per choice, as the env gave it): the logits of the actions it does not allow come out as float32's lowest value, so a
softmax or an argmax over them never picks one.
Input normalisation is part of the model. An ONNX export is checked at once: onnxruntime and PyTorch
must agree within 1e-5 on random observations, else the file is removed and the command fails.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from torch import Tensor, nn

from appo.config.cfg import ConfigError
from appo.envs import EnvError
from appo.learning.model import ActorCritic
from appo.learning.trained_policy import PolicyLoadError, TrainedPolicy, command_parser, load_policy, policy_source
from appo.spaces import MASK_KEY, obs_spaces
from appo.utils.process import EXIT_BAD_INPUT

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
TOLERANCE = 1e-5


class ExportedModel(nn.Module):
    """`ActorCritic.forward_step` with positional tensor inputs, which tracing and ONNX need."""

    def __init__(self, model: ActorCritic, obs_keys: list[str]):
        super().__init__()
        self.model, self.obs_keys = model, obs_keys

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        obs = dict(zip(self.obs_keys, inputs))
        if self.model.use_rnn:
            params, values, next_states = self.model.forward_step(obs, inputs[len(self.obs_keys)])
            return params, values, next_states
        states = torch.zeros(inputs[0].shape[0], 0)
        params, values, _ = self.model.forward_step(obs, states)
        return params, values


def example_inputs(policy: TrainedPolicy, batch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random observations within the space (uint8 images over 0..255, floats standard normal; action masks random 0/1
    rows that allow at least one action) and, for a recurrent policy, random states."""
    inputs = []
    for key, space in obs_spaces(policy.obs_space).items():
        if key == MASK_KEY and policy.model.masked:
            masks = rng.integers(0, 2, (batch, *space.shape))
            masks[np.arange(batch), rng.integers(0, space.shape[-1], batch)] = 1
            inputs.append(masks.astype(np.float32))
        elif space.dtype == np.uint8:
            inputs.append(rng.integers(0, 256, (batch, *space.shape), dtype=np.uint8))
        else:
            inputs.append(rng.standard_normal((batch, *space.shape)).astype(np.float32))
    if policy.model.use_rnn:
        inputs.append(rng.standard_normal((batch, policy.model.state_size)).astype(np.float32))
    return inputs


def io_names(policy: TrainedPolicy) -> tuple[list[str], list[str]]:
    inputs = list(obs_spaces(policy.obs_space)) + (["rnn_states"] if policy.model.use_rnn else [])
    outputs = ["action_params", "values"] + (["next_rnn_states"] if policy.model.use_rnn else [])
    return inputs, outputs


def torch_outputs(module: nn.Module, inputs: list[np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        return [out.numpy() for out in module(*[torch.from_numpy(x) for x in inputs])]


def onnx_difference(path: str, module: nn.Module, policy: TrainedPolicy, samples: int = 100, seed: int = 0) -> float:
    """The largest difference between onnxruntime's and PyTorch's outputs on `samples` random rows: absolute for
    outputs within +-1, relative to the output beyond (values in reward units can be in the hundreds)."""
    import onnxruntime

    inputs = example_inputs(policy, samples, np.random.default_rng(seed))
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    ours = session.run(None, dict(zip(names, inputs)))
    return max(float((np.abs(a - b) / np.maximum(1.0, np.abs(b))).max())
               for a, b in zip(ours, torch_outputs(module, inputs)))


def export_policy(policy: TrainedPolicy, fmt: str, out: str) -> str:
    """Write `policy` to `out` in `fmt` (onnx or torchscript) and return the path."""
    module = ExportedModel(policy.model.cpu().eval(), list(obs_spaces(policy.obs_space))).eval()
    example = tuple(torch.from_numpy(x) for x in example_inputs(policy, 2, np.random.default_rng(0)))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.tmp"
    if fmt == "torchscript":
        with torch.no_grad():
            traced = torch.jit.trace(module, example)
        traced.save(tmp)
    else:
        input_names, output_names = io_names(policy)
        torch.onnx.export(module, example, tmp, input_names=input_names, output_names=output_names,
                          dynamic_axes={name: {0: "batch"} for name in input_names + output_names}, dynamo=False)
        import onnx

        onnx.checker.check_model(tmp)
        difference = onnx_difference(tmp, module, policy)
        if difference > TOLERANCE:
            os.remove(tmp)
            raise RuntimeError(f"ONNX export differs from PyTorch by {difference:.2e} (> {TOLERANCE:g}); not written")
    os.replace(tmp, out)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("python -m appo.export", __doc__, "Which policy of a multi-policy run to export.")
    add = parser.add_argument
    add("--format", type=str, default="onnx", choices=sorted(FORMATS), help="File format.")
    add("--out", type=str, default=None,
        help="Output file (default: <experiment dir>/export/policy<K>.onnx or .pt).")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        policy = load_policy(policy_source(args), args.policy)
    except (ConfigError, PolicyLoadError, EnvError) as exc:
        print(f"appo.export: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    out = args.out or os.path.join(policy.exp_dir, "export", f"policy{args.policy}{FORMATS[args.format]}")
    path = export_policy(policy, args.format, out)
    inputs, outputs = io_names(policy)
    print(f"{args.format}: {path} (inputs {', '.join(inputs)}; outputs {', '.join(outputs)}; "
          f"version {policy.version}, {policy.env_steps} env steps)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
