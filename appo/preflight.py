"""What must hold on this machine before a run touches its experiment dir: an x86-64 CPU, a writable --train_dir,
the CUDA device asked for, room in /dev/shm and on disk, a Ray head that answers, and budget left for a finished run
that is extended.

The flags are valid by then (appo/config/checks.py judges them on their own); these checks look at the machine and
the experiment. Each problem is a `ConfigError` of one line: exit code 2, nothing written. Torch-free: the runner
forks the workers from this process; the model is built only in a short-lived child (`check_room`).
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import platform
import socket
import tempfile

from appo.config.cfg import Config, ConfigError
from appo.config.topology import group_port, num_acting_ids
from appo.envs import EnvInfo
from appo.utils.resources import SHM_DIR, cuda_device_count, free_bytes, mb, shm_room

ROOM_CHECK_BELOW = 2**30  # with this much free in both places, no run of this trainer comes near: no check
CHECKPOINT_OVERHEAD = 16 * 2**10  # a checkpoint's bytes besides its tensors (names, counters, the zip archive)


def check_machine(cfg: Config, info: EnvInfo) -> None:
    """Everything the run needs of this machine, once the flags and the env are known."""
    check_train_dir(cfg.train_dir)
    check_device_visible(cfg.device)
    check_rank_gpus_and_ports(cfg)
    check_room(cfg, info)
    if cfg.backend == "ray":
        check_ray_address(cfg.ray_address)


def check_platform() -> None:
    """Only x86-64. The shared-memory request/answer counters and the weights seqlock are plain stores read by
    other processes; they rely on x86-64 making stores visible in program order (TSO). A weakly ordered CPU
    (ARM64) may show a counter before the data it publishes (docs/ARCHITECTURE.md, "Memory order")."""
    machine = platform.machine()
    if machine.lower() not in ("x86_64", "amd64"):
        raise ConfigError(f"this CPU ({machine or 'unknown'}) is not x86-64: appo's shared-memory counters rely on "
                          "x86-64 store order, which weakly ordered CPUs such as ARM64 do not give, so it runs only "
                          "on x86-64 for now")


def check_train_dir(train_dir: str) -> None:
    """The experiment folder can be created: --train_dir is a folder, or can be made. Probed by making and
    removing an empty folder in the nearest existing one: permission bits do not tell (root passes them, yet
    cannot write to a read-only mount or to /proc)."""
    if os.path.exists(train_dir) and not os.path.isdir(train_dir):
        raise ConfigError(f"--train_dir={train_dir}: exists and is not a folder; give a folder")
    existing = os.path.abspath(train_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".appo_probe_", dir=existing))
    except OSError as exc:
        raise ConfigError(f"--train_dir={train_dir}: {existing} is not a writable folder ({exc.strerror}); "
                          "give one that is") from exc


def check_device_visible(device: str) -> None:
    """An explicit CUDA device exists (its spelling is checked with the other flags: checks.check_device)."""
    if not device.startswith("cuda"):
        return
    index = int(device.split(":")[1]) if ":" in device else 0
    count = cuda_device_count()
    if index >= count:
        raise ConfigError(f"--device={device}: this machine has {count} CUDA device(s) visible to torch; use "
                          f"{'--device=cuda:0 to cuda:' + str(count - 1) + ', ' if count else ''}--device=cpu or auto")


def check_rank_gpus_and_ports(cfg: Config) -> None:
    """--learner_processes_per_policy > 1 on this machine: one GPU per rank on CUDA, and with a pinned
    --learner_master_port each policy's rendezvous port free on this host (a port on another host is that host's
    business; with 0, rank 0 takes a free port when it starts, so there is nothing to check). What the flags must be
    for ranks, on their own, is checks.check_learner_ranks."""
    ranks = cfg.learner_processes_per_policy
    if ranks == 1:
        return
    count = cuda_device_count() if cfg.device != "cpu" else 0
    if (cfg.device.startswith("cuda") or (cfg.device == "auto" and count)) and ranks > count:
        raise ConfigError(f"--learner_processes_per_policy={ranks}: each rank on CUDA needs a GPU of its own and "
                          f"{count} are visible; use at most {count}, or --device=cpu")
    for policy in range(cfg.num_policies if cfg.learner_master_port else 0):
        port = group_port(cfg, policy)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the rendezvous does: a listener counts
            try:
                probe.bind((cfg.learner_master_addr, port))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:  # not an address of this host: rank 0 listens elsewhere
                    return
                raise ConfigError(f"--learner_master_port={cfg.learner_master_port}: port {port} of "
                                  f"{cfg.learner_master_addr}, where policy {policy}'s learner ranks meet, is taken "
                                  f"({exc.strerror}); choose another port") from exc


def check_room(cfg: Config, info: EnvInfo) -> None:
    """Before anything is created: can /dev/shm hold the run's weights segments (one per policy and self-play
    snapshot; a container gets 64 MB by default) and what its envs keep there (EnvInfo.shm_bytes_per_env), and
    --train_dir's filesystem its checkpoints (weights, Adam's two moments, the snapshot pool)? When either has less
    than ROOM_CHECK_BELOW free, the model is built once in a short-lived child (torch stays out of this process) to
    know its size; a run that cannot fit is a ConfigError naming both numbers and the fix (exit code 2, nothing
    written)."""
    shm_free, disk_free = free_bytes(SHM_DIR), free_bytes(cfg.train_dir)
    if min(shm_free, disk_free) >= ROOM_CHECK_BELOW:
        return
    nbytes = weights_bytes_in_child((info.obs_space, info.action_space), cfg)
    acting = num_acting_ids(cfg)
    envs = cfg.num_workers * cfg.num_envs_per_worker
    shm_need = acting * nbytes + envs * info.shm_bytes_per_env
    if shm_need > shm_free:
        games = (f" and {envs} env{'s' * (envs > 1)} ({mb(info.shm_bytes_per_env)} each: the env's engines)"
                 if info.shm_bytes_per_env else "")
        raise ConfigError(f"/dev/shm is too small for this run: {acting} weights segment{'s' * (acting > 1)} (one "
                          f"per policy and self-play snapshot, {mb(nbytes)} each){games} need {mb(shm_need)}, "
                          f"{shm_room()}")
    # Weights and Adam's two moments, plus the snapshot pool; --keep_checkpoints of them and the one being written.
    checkpoint = (3 + cfg.self_play_opponents) * nbytes + CHECKPOINT_OVERHEAD
    disk_need = cfg.num_policies * (cfg.keep_checkpoints + 1) * checkpoint
    if disk_need > disk_free:
        raise ConfigError(f"--train_dir={cfg.train_dir}: --keep_checkpoints={cfg.keep_checkpoints} for "
                          f"{cfg.num_policies} {'policy' if cfg.num_policies == 1 else 'policies'} needs about "
                          f"{mb(disk_need)}, {mb(disk_free)} free there; use another --train_dir or a lower "
                          "--keep_checkpoints")


def weights_bytes_in_child(spaces: tuple, cfg: Config) -> int:
    """appo.learning.weights.weights_bytes, computed in a forked child that imports torch and exits."""
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_send_weights_bytes, args=(send, spaces, cfg),
                                                        daemon=True)
    child.start()
    send.close()
    try:
        return receive.recv()
    finally:
        child.join()


def _send_weights_bytes(send, spaces: tuple, cfg: Config) -> None:
    from appo.learning.weights import weights_bytes

    send.send(weights_bytes(spaces, cfg))


def check_ray_address(address: str) -> None:
    """A host:port address answers on that port (Ray itself would retry for minutes before it gives up). Empty
    (a private instance) and auto (found by Ray on this machine) are not checked."""
    if address in ("", "auto"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray_address={address}: use host:port of the cluster's head (ray start --head prints "
                          "it), auto, or leave it empty for a Ray instance on this machine")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ConfigError(f"--ray_address={address}: nothing answers there ({exc.strerror or exc}); is the head "
                          "started with 'ray start --head'?") from exc


def check_extension(cfg: Config, exp_dir: str, env_steps: int, finished: bool) -> None:
    """A resumed run given a new --train_for_env_steps must have steps left to train: one at or below the env steps
    it already has would stop it at once, and mark it done."""
    if env_steps >= cfg.train_for_env_steps:
        raise ConfigError(f"--train_for_env_steps={cfg.train_for_env_steps}: the {'finished ' if finished else ''}"
                          f"experiment {exp_dir} already has {env_steps} env steps; to train it further give "
                          f"--train_for_env_steps above {env_steps}")
