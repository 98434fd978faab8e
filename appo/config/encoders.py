"""The encoders `--encoder` can name, kept here once and torch-free, so that the runner checks the flag and logs the
choice of `--encoder=auto` without the model (appo/learning/model.py, which imports torch and builds each encoder by
these names): the built-in names, and the factories users registered (`appo.learning.model.register_encoder`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

AUTO = "auto"  # one of mlp, nature_cnn and small_cnn, by the observation (appo.spaces.auto_encoder)
MLP, NATURE_CNN, SMALL_CNN, IMPALA_RESNET = "mlp", "nature_cnn", "small_cnn", "impala_resnet"
BUILT_IN_ENCODERS = (MLP, NATURE_CNN, SMALL_CNN, IMPALA_RESNET)

# Names registered by a launcher, each with its factory(space, cfg) -> nn.Module; workers are forked and inherit them.
REGISTERED: dict[str, Callable[..., Any]] = {}
