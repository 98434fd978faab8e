"""A two-player zero-sum duel (Pong-like) for self-play: one shared policy can learn it by playing both seats.

Rules (the defaults of `DuelRules`; every field is an env kwarg):
- The court is x in [0, 1], y in [0, 1]. Agent 0 defends the left goal line (x = 0), agent 1 the right one
  (x = 1), each with a paddle of height 0.2 (its centre +- `paddle_half` = 0.1) whose centre stays in
  [0.1, 0.9]. Actions Discrete(3): 0 = down, 1 = stay, 2 = up, moving the paddle by `paddle_speed` = 0.035.
- Each step both paddles move, then the ball moves by (vx, vy) and reflects off the top and bottom walls.
  A ball that reaches a goal line (its y is taken at the end of that step) is returned if the paddle covers
  that y: it leaves at an angle proportional to where it hit, from flat (the paddle's centre) to 70 degrees
  (`max_angle_deg`, the very edge), upwards off the upper half and downwards off the lower half, and 15%
  faster (`speedup`), up to `max_ball_speed` = 0.1. Otherwise the other agent scores: reward +1 to the
  scorer and -1 to the one who missed, on that step (0 to both on every other step, so the rewards always
  sum to 0), and the ball is served again.
- Serves (also the first one) start from the centre at `ball_speed` = 0.05 towards a random side, at a random
  angle within +-30 degrees (`serve_angle_deg`); the paddles start a game in the middle and stay where
  they are after a point.
- A game is first to `points_to_win` = 3 points (terminated), or is truncated after `max_steps` = 600 steps:
  then the leader wins, a tie is a draw. The last step's info has `winner` (0, 1 or -1 for a draw) and
  `episode_extra_stats` {score_0, score_1, draw (0/1), hits_per_point} for the trainer's episode metrics.
  Self-play rewards average 0 by construction; hits_per_point (how long the rallies get) shows progress.

Why it takes skill: a flat return is easy to catch, but the ball may move vertically almost three times as fast
as a paddle (0.1 * sin 70 deg = 0.094 per step against 0.035), and it speeds up at every hit. A player who
predicts where the ball arrives (bounces included) and meets it with the right part of its paddle sends it
where the opponent cannot get in time.

Observation of each agent, from its own seat (float32, 6 values in [-1, 1]); agent 1 sees the court mirrored
left-right, so both seats look the same and a position and its mirror image give the two seats swapped views:
  [ball distance from own goal line (2 d - 1), ball y (2 y - 1), ball speed towards own goal line
   (vx / max_ball_speed, > 0 when coming), ball vy / max_ball_speed, own paddle y (2 p - 1), opponent paddle y].
y (up is up) is never mirrored, so the actions mean the same in both seats.

The scripted opponent (`scripted_action`, one agent's own observation, either seat): while the ball comes
towards it, it moves its paddle towards the ball's current y at the paddle speed, standing still while the
ball is within 0.06 of its paddle's centre (a dead zone, so it returns off-centre shots too); while the ball
goes away it goes back to the centre. It never predicts the bounces. `aiming_action` is the skill: it predicts
the arrival (bounces included), and of the paddle positions it can reach in time that still cover the ball
picks the hit whose landing on the other goal line is farthest beyond the opponent's reach.

Measured with `evaluate` (games=1000, seed=0; the player alternates seats; a draw is not a win):
- uniformly random actions vs scripted: win rate 1.0% (10 wins, 0 draws, 990 losses);
- scripted vs scripted: 51.5% (0 draws); games last 229 steps on average (at most 421 seen);
- `aiming_action` vs scripted: 98.5% (5 draws, 10 losses); 349 steps on average (truncated at 600 now and then);
- an untrained policy (3 random initialisations of the trainer's default 2x64 MLP, 200 games each): 0-2%.
Self-play (one policy in both seats, against its latest self) on a 2-core CPU, then `evaluate` (200 games) of
the deterministic policy at each checkpoint:
- default flags, `python -m appo.train --env=duel --train_for_seconds=180`: 53%, 78%, 91%, 95% at 45, 90,
  135, 180 s (13M env steps);
- `--gamma=0.995 --exploration_loss_coeff=0.01`: 82% at 120 s, 92% at 150 s, 99% at 240 s (seed 0); 84%,
  93%, 71%, 96% at 45, 90, 135, 180 s (seed 1).
Self-play against the latest self wanders, so one checkpoint can dip (71% above) before the next recovers.
Between two trained players the rallies get long: self-play games end near 450-550 steps.

The game is deterministic given the reset seed and the actions. A step takes about 4 microseconds (Python
floats plus one 2x6 numpy array). The trainer registers it as "duel":

    --env=duel --env_kwargs='{"points_to_win": 5, "paddle_speed": 0.03}'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

DOWN, STAY, UP = 0, 1, 2
OBS_DIM = 6
SCRIPTED_DEAD_ZONE = 0.06  # court units: the scripted paddle does not move while the ball is this close to its centre


@dataclass(frozen=True)
class DuelRules:
    """The game's numbers (lengths in court units, speeds per step); the env's kwargs override them."""

    points_to_win: int = 3
    max_steps: int = 600
    paddle_half: float = 0.1  # a paddle covers its centre +- paddle_half
    paddle_speed: float = 0.035
    ball_speed: float = 0.05  # at every serve
    speedup: float = 0.15  # the ball's speed grows by this fraction at every paddle hit ...
    max_ball_speed: float = 0.1  # ... up to this
    max_angle_deg: float = 70.0  # a hit on a paddle's very edge leaves at this angle from the horizontal
    serve_angle_deg: float = 30.0  # serves leave at a uniform angle within +- this

    def check(self) -> None:
        """Rules the physics relies on (at most one wall bounce and one goal line per step)."""
        if self.points_to_win < 1 or self.max_steps < 1:
            raise ValueError(f"{self}: points_to_win and max_steps must be >= 1")
        if not 0.0 < self.paddle_half < 0.5 or self.paddle_speed <= 0.0:
            raise ValueError(f"{self}: need 0 < paddle_half < 0.5 and paddle_speed > 0")
        if not 0.0 < self.ball_speed <= self.max_ball_speed < 0.5 or self.speedup < 0.0:
            raise ValueError(f"{self}: need 0 < ball_speed <= max_ball_speed < 0.5 and speedup >= 0")
        if not 0.0 <= self.max_angle_deg < 90.0 or not 0.0 <= self.serve_angle_deg < 90.0:
            raise ValueError(f"{self}: angles must be in [0, 90) degrees")


DEFAULT_RULES = DuelRules()
_RULE_NAMES = {f.name for f in dataclasses.fields(DuelRules)}


def _fold(y: float) -> float:
    """A y moved freely, reflected back into [0, 1] off the walls (any number of bounces)."""
    y %= 2.0
    return 2.0 - y if y > 1.0 else y


class DuelEnv(gym.Env):
    """Two paddles and a ball, first to `points_to_win`: agent 0 defends the left goal line, agent 1 the right."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode: str | None = None, **rules: Any):
        unknown = sorted(set(rules) - _RULE_NAMES)
        if unknown:
            raise ValueError(f"unknown duel rules {unknown}; valid: {sorted(_RULE_NAMES)}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r}: only 'rgb_array' (or None)")
        self.rules = DuelRules(**rules)
        self.rules.check()
        self.render_mode = render_mode
        self.num_agents = 2
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self._max_angle = math.radians(self.rules.max_angle_deg)
        self._serve_angle = math.radians(self.rules.serve_angle_deg)
        self._v_scale = 1.0 / self.rules.max_ball_speed
        # The state is plain Python floats: with two paddles and a ball they are much faster than numpy.
        self.bx = self.by = 0.5
        self.vx = self.vy = 0.0
        self.speed = self.rules.ball_speed
        self.paddles = [0.5, 0.5]
        self.scores = [0, 0]
        self.hits = self.t = 0

    def _serve(self) -> None:
        """From the centre, towards a random side, at a random angle."""
        angle = float(self.np_random.uniform(-self._serve_angle, self._serve_angle))
        direction = 1.0 if self.np_random.random() < 0.5 else -1.0
        self.speed = self.rules.ball_speed
        self.bx = self.by = 0.5
        self.vx = direction * self.speed * math.cos(angle)
        self.vy = self.speed * math.sin(angle)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)  # seeds self.np_random when seed is given
        self.paddles = [0.5, 0.5]
        self.scores = [0, 0]
        self.hits = self.t = 0
        self._serve()
        return self._obs(), {}

    def step(self, actions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, bool, dict]:
        acts = actions.tolist() if isinstance(actions, np.ndarray) else list(actions)
        if len(acts) != 2 or any(a not in (DOWN, STAY, UP) for a in acts):
            raise ValueError(f"actions {acts}: expected two actions, each 0 (down), 1 (stay) or 2 (up)")
        r = self.rules
        low, high = r.paddle_half, 1.0 - r.paddle_half
        for i in (0, 1):
            self.paddles[i] = min(high, max(low, self.paddles[i] + (int(acts[i]) - 1) * r.paddle_speed))
        self.t += 1
        bx, by = self.bx + self.vx, self.by + self.vy
        if by < 0.0:
            by, self.vy = -by, -self.vy
        elif by > 1.0:
            by, self.vy = 2.0 - by, -self.vy
        self.bx, self.by = bx, by
        reward_0 = 0.0
        side = 0 if bx <= 0.0 else 1 if bx >= 1.0 else -1  # the goal line the ball reached, if any
        if side >= 0:
            offset = by - self.paddles[side]
            if abs(offset) <= r.paddle_half:  # returned: the farther from the paddle's centre, the steeper
                self.hits += 1
                self.speed = min(self.speed * (1.0 + r.speedup), r.max_ball_speed)
                angle = offset / r.paddle_half * self._max_angle
                self.vx = (1.0 if side == 0 else -1.0) * self.speed * math.cos(angle)
                self.vy = self.speed * math.sin(angle)
                self.bx = -bx if side == 0 else 2.0 - bx  # reflected off the paddle's line
            else:  # missed: the other agent scores
                self.scores[1 - side] += 1
                reward_0 = 1.0 if side == 1 else -1.0
                self._serve()
        terminated = max(self.scores) >= r.points_to_win
        truncated = not terminated and self.t >= r.max_steps
        info: dict[str, Any] = {}
        if terminated or truncated:
            s0, s1 = self.scores
            info["winner"] = 0 if s0 > s1 else 1 if s1 > s0 else -1
            info["episode_extra_stats"] = {"score_0": s0, "score_1": s1, "draw": float(s0 == s1),
                                           "hits_per_point": self.hits / max(s0 + s1, 1)}
        rewards = np.array([reward_0, -reward_0], dtype=np.float32)
        return self._obs(), rewards, terminated, truncated, info

    def _obs(self) -> np.ndarray:
        """Each agent's own view; agent 1's is mirrored left-right (y is never mirrored)."""
        vs = self._v_scale
        y, vy = 2.0 * self.by - 1.0, self.vy * vs
        p0, p1 = 2.0 * self.paddles[0] - 1.0, 2.0 * self.paddles[1] - 1.0
        return np.array([[2.0 * self.bx - 1.0, y, -self.vx * vs, vy, p0, p1],
                         [1.0 - 2.0 * self.bx, y, self.vx * vs, vy, p1, p0]], dtype=np.float32)

    def render(self) -> np.ndarray | None:
        """An rgb_array frame (176x160x3 uint8): the score as small blocks above the court."""
        return render_frame(self) if self.render_mode == "rgb_array" else None


COURT_PIXELS, SCORE_STRIP = 160, 16  # 176x160 frames: video encoders want sides divisible by 16
_COLOURS = ((80, 160, 255), (255, 110, 90))  # agent 0 blue, agent 1 red


def render_frame(env: DuelEnv) -> np.ndarray:
    """The court seen from above with y up: paddles, ball, centre line; each point is a block in the top strip."""
    size, strip = COURT_PIXELS, SCORE_STRIP
    frame = np.zeros((size + strip, size, 3), dtype=np.uint8)
    frame[strip:] = (16, 24, 32)
    frame[strip::4, size // 2] = 70

    def row(y: float) -> int:
        return strip + round((1.0 - min(max(y, 0.0), 1.0)) * (size - 1))

    half = env.rules.paddle_half
    for i, x0 in ((0, 0), (1, size - 3)):
        p = env.paddles[i]
        frame[row(p + half):row(p - half) + 1, x0:x0 + 3] = _COLOURS[i]
        for k in range(min(env.scores[i], 9)):
            cx = 4 + 8 * k if i == 0 else size - 10 - 8 * k
            frame[5:11, cx:cx + 6] = _COLOURS[i]
    bx, by = round(min(max(env.bx, 0.0), 1.0) * (size - 1)), row(env.by)
    frame[max(strip, by - 2):by + 2, max(0, bx - 2):bx + 2] = 255
    return frame


# ---------------------------------------------------------------- scripted players (from one agent's own view)
def _move_towards(target: float, own: float, dead_zone: float) -> int:
    if target > own + dead_zone:
        return UP
    if target < own - dead_zone:
        return DOWN
    return STAY


def scripted_action(obs: np.ndarray, dead_zone: float = SCRIPTED_DEAD_ZONE) -> int:
    """The fixed opponent: chases the ball's current y while it comes (never predicting bounces), otherwise
    goes back to the centre; `dead_zone` (court units) is how far off its paddle's centre it lets the ball be."""
    target = float(obs[1]) if obs[2] > 0.0 else 0.0
    return _move_towards(target, float(obs[4]), 2.0 * dead_zone)  # observations are 2x court units


def aiming_action(obs: np.ndarray, rules: DuelRules = DEFAULT_RULES) -> int:
    """What skill looks like: predict where the ball arrives (bounces included), then of the paddle positions
    reachable in time that still return it, take the one whose shot lands farthest beyond the opponent's reach
    (the distance from the opponent's paddle less what that paddle can move before the ball arrives)."""
    own = (float(obs[4]) + 1.0) / 2.0
    target = 0.5  # while the ball goes away: wait in the centre
    if obs[2] > 0.0:
        v, vy = float(obs[2]) * rules.max_ball_speed, float(obs[3]) * rules.max_ball_speed
        steps = max(1, math.ceil((float(obs[0]) + 1.0) / 2.0 / v - 1e-9))
        arrival = _fold((float(obs[1]) + 1.0) / 2.0 + steps * vy)
        opponent = (float(obs[5]) + 1.0) / 2.0
        speed = min(math.hypot(v, vy) * (1.0 + rules.speedup), rules.max_ball_speed)
        reach, best = steps * rules.paddle_speed, -math.inf
        target = arrival
        for k in range(-9, 10):  # where on the paddle to meet the ball, from edge to edge
            rel = k / 10.0
            paddle = arrival - rel * rules.paddle_half
            if not rules.paddle_half <= paddle <= 1.0 - rules.paddle_half or abs(paddle - own) > reach:
                continue
            angle = rel * math.radians(rules.max_angle_deg)
            flight = math.ceil(1.0 / (speed * math.cos(angle)))
            landing = _fold(arrival + flight * speed * math.sin(angle))
            margin = abs(landing - opponent) - flight * rules.paddle_speed
            if margin > best:
                best, target = margin, paddle
    return _move_towards(target, own, rules.paddle_speed / 2.0)


def evaluate(act_fn: Callable[[np.ndarray], Sequence[int] | np.ndarray], games: int = 200, seed: int = 0,
             opponent: Callable[[np.ndarray], int] = scripted_action, **rules: Any) -> dict[str, float]:
    """Plays `games` games of a policy against `opponent` (the scripted player), all at once, and counts them.

    Game g is reset with seed `seed + g`; the policy plays the left seat in even games and the right seat in odd
    ones. `act_fn` gets the policy's observations of every game [games, 6] at every step (a game that is over
    keeps its last row, and its action is ignored), so row g is always game g: a recurrent policy may keep its
    state per row. `rules` are env kwargs. Returns wins, draws, losses, win_rate (wins / games) and games.
    """
    envs = [DuelEnv(**rules) for _ in range(games)]
    obs = [env.reset(seed=seed + g)[0] for g, env in enumerate(envs)]
    results: list[int | None] = [None] * games  # +1 win, 0 draw, -1 loss
    while any(result is None for result in results):
        actions = act_fn(np.stack([obs[g][g % 2] for g in range(games)]))
        for g, env in enumerate(envs):
            if results[g] is not None:
                continue
            seat = g % 2
            pair = [int(actions[g]), opponent(obs[g][1])] if seat == 0 else [opponent(obs[g][0]), int(actions[g])]
            obs[g], _, terminated, truncated, info = env.step(pair)
            if terminated or truncated:
                winner = info["winner"]
                results[g] = 0 if winner == -1 else 1 if winner == seat else -1
    wins, draws = results.count(1), results.count(0)
    return {"wins": wins, "draws": draws, "losses": results.count(-1), "win_rate": wins / games, "games": games}


def make_duel_env(**kwargs: Any) -> gym.Env:
    """A new `DuelEnv(**kwargs)` (kwargs: render_mode and the `DuelRules` fields); registered as "duel"."""
    return DuelEnv(**kwargs)
