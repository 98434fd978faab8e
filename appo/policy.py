"""A policy as one object: weights, optimizer state, hyper-parameters, version and counters.

The learner process holds one `Policy` and trains it; population-based training acts on it through two
operations only: `set_hyperparams` (a new learning rate, loss coefficients, ...; applied from the next
training iteration) and `adopt` (take over another policy's weights and optimizer state while keeping
this policy's own hyper-parameters and an ever-increasing version).
"""

from __future__ import annotations

import argparse

import torch

from appo.model import ActorCritic


class Policy:
    def __init__(self, policy_id: int, cfg: argparse.Namespace, spaces, device: torch.device,
                 hyperparams: dict[str, float] | None = None):
        self.policy_id, self.device = policy_id, device
        # The run's flags with this policy's hyper-parameters on top; the PPO update reads everything from here.
        self.cfg = argparse.Namespace(**vars(cfg))
        self.model = ActorCritic(*spaces, cfg).to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps,
                                          betas=(cfg.adam_beta1, cfg.adam_beta2))
        self.hyperparams: dict[str, float] = {}
        self.set_hyperparams(hyperparams or {})
        self.version = 0  # of the weights; +1 per training iteration and per adoption
        self.env_steps = 0  # this policy took (counted by the learner, so it survives resume)
        self.train_steps = 0
        # Trajectories with a step sampled by an older version were collected by weights this policy has
        # replaced (`adopt`); the learner drops them.
        self.min_version = 0

    def set_hyperparams(self, hyperparams: dict[str, float]) -> None:
        for name, value in hyperparams.items():
            if not hasattr(self.cfg, name):
                raise ValueError(f"policy {self.policy_id}: unknown hyper-parameter {name!r}")
            setattr(self.cfg, name, value)
        self.hyperparams.update(hyperparams)
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.learning_rate

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Everything a checkpoint or another policy needs."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "version": self.version, "env_steps": self.env_steps, "train_steps": self.train_steps,
                "min_version": self.min_version, "hyperparams": dict(self.hyperparams)}

    def load_state_dict(self, state: dict) -> None:
        """Resume this policy from its own checkpoint. Hyper-parameters are not taken from it: with PBT the
        population file holds them, without PBT the flags do."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.env_steps, self.train_steps = state["version"], state["env_steps"], state["train_steps"]
        self.min_version = state.get("min_version", 0)
        self.set_hyperparams(self.hyperparams)  # the optimizer state carried the saved learning rate

    def adopt(self, donor_state: dict) -> None:
        """Take over another policy's weights (normalisation statistics included) and optimizer state.

        The version moves past every version this policy published, so inference picks the new weights up
        and lag accounting stays monotonic; trajectories from before are dropped (`min_version`). Env-step
        and train-step counters stay this policy's own."""
        self.model.load_state_dict(donor_state["model"])
        self.optimizer.load_state_dict(donor_state["optimizer"])
        self.set_hyperparams(self.hyperparams)
        self.version += 1
        self.min_version = self.version
