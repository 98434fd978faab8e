"""How observation and action spaces map onto shared-memory arrays (numpy only: actors import it).

Observations are handled as a dict of arrays everywhere: a Box space becomes `{"obs": box}`, a Dict space
keeps its keys (each a Box). `uint8` images stay `uint8` in shared memory; the model normalises them.

Actions are stored as one flat vector per agent, with the parts of the space one after the other:
Discrete and MultiDiscrete as integers (int64), Box as floats; a Tuple mixing both is stored as float32
(integers are exact in float32 far beyond any action count). `action_spec` lists the parts for the model.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from appo.config.encoders import AUTO, IMPALA_RESNET, MLP, NATURE_CNN, SMALL_CNN

SINGLE_KEY = "obs"
# The observation key that holds which actions are allowed (PettingZoo's classic games, `--action_mask`): stored with
# the observation, so a trajectory keeps the mask each action was taken under. It is encoded like any key too: in a
# turn-based game it is what tells a seat whether it is its turn (appo/envs/pettingzoo_turns.py).
MASK_KEY = "action_mask"


class SpaceError(TypeError):
    """A space the trainer cannot represent; the message names it and what is supported, on one line (the launch's
    one error line), though a space holding a numpy array of two axes prints over several: MultiDiscrete([[2 3] [4 5]])
    here."""

    def __init__(self, message: str):
        super().__init__(" ".join(message.split()))


def obs_spaces(space: gym.Space) -> dict[str, gym.spaces.Box]:
    if isinstance(space, gym.spaces.Box):
        return {SINGLE_KEY: space}
    if isinstance(space, gym.spaces.Dict) and all(isinstance(s, gym.spaces.Box) for s in space.spaces.values()):
        return dict(space.spaces)
    raise SpaceError(f"unsupported observation space {space}; use Box or a Dict of Box spaces")


def masks_actions(action_mask: str, obs_space: gym.Space) -> bool:
    """Whether a model masks its actions: `--action_mask` is not none and the observation holds a mask (make_env puts
    it there, appo/envs/action_masks.py)."""
    return action_mask != "none" and MASK_KEY in obs_spaces(obs_space)


def mask_size(space: gym.Space) -> int:
    """Entries of an action mask for `space`: one per choice of a Discrete space, one per choice of each part of a
    MultiDiscrete, the parts one after the other (the layout of the model's logits)."""
    spec = action_spec(space)
    if any(kind != "discrete" for kind, _ in spec) or isinstance(space, (gym.spaces.Tuple, gym.spaces.MultiBinary)):
        raise SpaceError(f"action masks need a Discrete or MultiDiscrete action space, not {space}")
    return sum(n for _, n in spec)


# The Nature CNN's 8x8/4, 4x4/2 and 3x3/1 convolutions need images of at least this many pixels a side.
NATURE_CNN_MIN_SIZE = 36


def is_image(space: gym.Space) -> bool:
    """Whether a space is a Box of images, which `--encoder=auto` gives a CNN: three axes, the channels at one end
    (`channels_last`). Two axes are a vector for the MLP, as stable-baselines3 and Sample Factory read them, uint8
    ones too: on Catch drawn as grey frames of 10x5, 40x20 and 80x40 pixels the MLP reached a mean of 9 sooner than
    the CNN (docs/performance_log.md). A CNN named by `--encoder` takes a grey [H, W] frame as one channel."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image's shape is [H, W, C] rather than [C, H, W]. A space does not say, so the sides do:
    - at most 4 at one end and more at the other: that end holds the channels (grey, RGB or stacked frames; connect
      four's 2 planes);
    - else two equal sides next to each other are the image: a square board with its planes last (MinAtar's 10x10xC,
      chess's 8x8x111, go's 19x19x17) or first; all three equal is taken as gymnasium's usual [H, W, C];
    - else the smaller end holds the channels.
    """
    if len(shape) != 3:
        return False
    first, middle, last = shape
    if (first <= 4) != (last <= 4):
        return last <= 4
    if first == middle or middle == last:
        return first == middle
    return last < first


def image_side(shape: tuple[int, ...]) -> int:
    """An image's shorter side in pixels (its height or width, whichever end holds the channels; a grey [H, W]
    frame's two sides)."""
    return min(shape[:2] if len(shape) == 2 or channels_last(shape) else shape[1:])


def auto_encoder(space: gym.spaces.Box) -> tuple[str, str]:
    """The encoder `--encoder=auto` picks for one observation key, and why: mlp for vectors; for images (`is_image`:
    [C, H, W] or [H, W, C] as `channels_last` reads them), nature_cnn when both sides are at least
    NATURE_CNN_MIN_SIZE, else small_cnn."""
    shape = tuple(space.shape)
    if not is_image(space):
        return MLP, f"{'x'.join(map(str, shape))} vector"
    last = channels_last(shape)
    height, width, channels = shape if last else (*shape[1:], shape[0])
    images = f"{height}x{width} images, {channels} channels {'last' if last else 'first'}"
    if image_side(shape) >= NATURE_CNN_MIN_SIZE:
        return NATURE_CNN, images
    return SMALL_CNN, f"{images}, smaller than the {NATURE_CNN_MIN_SIZE}x{NATURE_CNN_MIN_SIZE} nature_cnn needs"


# The encoders that take images; named by `--encoder`, they take a Dict's vector keys as auto does, with the MLP.
CNNS = (NATURE_CNN, SMALL_CNN, IMPALA_RESNET)


def key_encoder(encoder: str, space: gym.spaces.Box) -> str:
    """The encoder one observation key gets from `--encoder`: auto's choice (`auto_encoder`); a named CNN for images
    and grey [H, W] frames (one channel) and the MLP for vectors, so that a Dict of a board and its action mask can
    name its CNN; any other name for every key."""
    if encoder == AUTO:
        return auto_encoder(space)[0]
    if encoder in CNNS and len(space.shape) < 2:
        return MLP
    return encoder


def check_encoder_fits(encoder: str, obs_space: gym.Space) -> None:
    """SpaceError where a CNN that `--encoder` names has nothing it can take: no key of two or three axes, a key of
    more, or an image under NATURE_CNN_MIN_SIZE pixels a side for nature_cnn."""
    if encoder not in CNNS:
        return
    spaces = obs_spaces(obs_space)
    for key, space in spaces.items():
        shape = tuple(space.shape)
        if len(shape) > 3:
            raise SpaceError(f"--encoder={encoder}: the observation {key!r} of shape {shape} has more axes than an "
                             "image's three; --encoder=auto gives it the MLP")
        if len(shape) < 2:
            continue
        if encoder == NATURE_CNN and image_side(shape) < NATURE_CNN_MIN_SIZE:
            raise SpaceError(f"--encoder=nature_cnn: the observation {key!r} of shape {shape} is under "
                             f"{NATURE_CNN_MIN_SIZE} pixels a side; small_cnn takes any size")
    if all(key_encoder(encoder, space) == MLP for space in spaces.values()):
        shapes = [f"the observation {key!r} of shape {tuple(space.shape)}" for key, space in spaces.items()]
        raise SpaceError(f"--encoder={encoder}: {' and '.join(shapes)} {'is' if len(shapes) == 1 else 'are'} no "
                         "image; --encoder=auto gives images a CNN and vectors an MLP")


def mirror_axes(obs_space: gym.Space, action_space: gym.Space) -> dict[str, int]:
    """`--mirror_symmetry`: for each observation key, the axis of its space that the left-right mirror reverses (an
    image's width, the action mask's one axis). The action must be Discrete with one choice per column of the images,
    the mirror of column i being column n - 1 - i (connect four's moves). SpaceError for any other spaces."""
    need = "--mirror_symmetry needs images whose width is the count of a Discrete action (connect four's 6x7 board)"
    if not isinstance(action_space, gym.spaces.Discrete):
        raise SpaceError(f"{need}, not the action space {action_space}")
    axes = {}
    for key, space in obs_spaces(obs_space).items():
        shape = tuple(space.shape)
        if key == MASK_KEY and shape == (action_space.n,):
            axes[key] = 0
        elif is_image(space):
            axes[key] = 1 if channels_last(shape) else 2
            if shape[axes[key]] != action_space.n:
                raise SpaceError(f"{need}: {key!r} is {'x'.join(map(str, shape))}, {shape[axes[key]]} wide, "
                                 f"for {action_space.n} actions")
        else:
            raise SpaceError(f"{need}; the observation {key!r} of shape {shape} is no image")
    return axes


def obs_dtype(space: gym.spaces.Box) -> np.dtype:
    return np.dtype(np.uint8) if space.dtype == np.uint8 else np.dtype(np.float32)


def obs_as_dict(obs) -> dict[str, np.ndarray]:
    return obs if isinstance(obs, dict) else {SINGLE_KEY: obs}


def action_spec(space: gym.Space) -> list[tuple[str, int]]:
    """The parts of an action: ("discrete", number of choices) or ("gaussian", dimensions)."""
    if isinstance(space, gym.spaces.Discrete):
        return [("discrete", int(space.n))]
    if isinstance(space, gym.spaces.MultiDiscrete):  # of any shape: its parts in numpy's order
        return [("discrete", int(n)) for n in space.nvec.ravel()]
    if isinstance(space, gym.spaces.MultiBinary):  # a game pad's buttons (stable-retro): a choice of 2 per button
        return [("discrete", 2)] * int(math.prod(space.shape))
    if isinstance(space, gym.spaces.Box):
        return [("gaussian", int(math.prod(space.shape)))]
    if isinstance(space, gym.spaces.Tuple):
        return [part for sub in space.spaces for part in action_spec(sub)]
    raise SpaceError(f"unsupported action space {space}; use Discrete, MultiDiscrete, MultiBinary, Box or a Tuple of "
                     "them")


def gaussian_box(space: gym.Space) -> tuple[np.ndarray, np.ndarray]:
    """The centre and half width of each Gaussian dimension of an action (its Box parts flattened, in the order of
    `action_spec`), where the model places its Gaussian: the centre is 0 and the half width inf along a dimension
    with an infinite bound. float32 bounds are read as the shortest decimals that round to them (Humanoid's 0.4, not
    0.4000000059604645), so a std taken from a half width is the number the env declared."""
    if isinstance(space, gym.spaces.Tuple):
        parts = [gaussian_box(part) for part in space.spaces]
        return (np.concatenate([centre for centre, _ in parts] or [np.zeros(0)]),
                np.concatenate([half_width for _, half_width in parts] or [np.zeros(0)]))
    if not isinstance(space, gym.spaces.Box):
        return np.zeros(0), np.zeros(0)
    low, high = (np.broadcast_to(bound, space.shape).astype(np.float32).astype(str).astype(np.float64).ravel()
                 for bound in (space.low, space.high))
    finite = np.isfinite(low) & np.isfinite(high)
    with np.errstate(invalid="ignore"):  # inf - inf where both bounds are infinite: not used
        return np.where(finite, (low + high) / 2, 0.0), np.where(finite, (high - low) / 2, np.inf)


MIN_STD = 0.01  # --initial_stddev's lowest value; the model clamps log-stds at -5 (0.0067), where no gradient passes


def initial_stds(stddev: float, half_width: np.ndarray) -> np.ndarray:
    """Each Gaussian dimension's std before training: the scalar `stddev` (--initial_stddev or its auto rule), at most
    the dimension's half width where that is finite and above 0 (not below MIN_STD). Sampled actions are clipped to
    the box, and std 1 on [-1, 1] puts 32% of the samples on a bound; a std of the half width keeps that share on any
    narrower box, where a wider std would pile samples on the bounds. A dimension of zero width cannot vary: it keeps
    `stddev`, and its samples clip to its one value."""
    capped = (half_width > 0) & (half_width < stddev)
    return np.where(capped, np.maximum(half_width, MIN_STD), stddev)


def action_layout(space: gym.Space) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one agent's action in the trajectory buffers."""
    spec = action_spec(space)
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    size = sum(1 if kind == "discrete" else n for kind, n in spec)
    all_discrete = all(kind == "discrete" for kind, _ in spec)
    return (size,), np.dtype(np.int64 if all_discrete else np.float32)


def to_env_action(space: gym.Space, action: np.ndarray):
    """A stored action vector as the env expects it: choice i of a Discrete or MultiDiscrete part is the env's
    `start + i` (the model numbers choices from 0), Box parts clipped to their bounds."""
    if isinstance(space, gym.spaces.Discrete):
        return int(action) + int(space.start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (action.reshape(space.shape) + space.start).astype(space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return action.reshape(space.shape).astype(space.dtype)
    if isinstance(space, gym.spaces.Box):
        return np.clip(action.reshape(space.shape), space.low, space.high).astype(space.dtype)
    parts, offset = [], 0
    for sub in space.spaces:
        shape = action_layout(sub)[0]
        size = shape[0] if shape else 1
        chunk = action[offset:offset + size]
        parts.append(to_env_action(sub, chunk[0] if isinstance(sub, gym.spaces.Discrete) else chunk))
        offset += size
    return tuple(parts)
