"""A tabletop pushing scene on plain MuJoCo (CPU physics; the scene is built in code, no asset
files), its instructions, its success test and a scripted waypoint expert.

Scene: a floor, a cylindrical pusher on two velocity-actuated slide joints (it never touches
the floor, only the blocks) and three free 4 cm cubes, red, green and blue. An instruction is
"push the {colour} block {direction}"; its goal is the named block's start position moved
`push_distance` in that direction. Success (sparse, end of episode): the named block within
`success_radius` (3 cm) of its goal while each other block moved less than `success_radius`.

Actions are discrete: the pusher's planar velocity on a `bins x bins` grid over
[-max_speed, max_speed]^2 (one token per action), held for `action_dt` seconds.

Observation (state-only variant, 14 floats): pusher xy, the three blocks' current xy, the
three blocks' start xy (the goal is relative to the start, so the policy needs it).
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np

from wmrl.config_errors import ConfigError

COLOURS = ("red", "green", "blue")
DIRECTIONS = ("left", "right", "forward", "back")
DIRECTION_VECTORS = {
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
    "forward": (0.0, 1.0),
    "back": (0.0, -1.0),
}
RGBA = {"red": "0.9 0.1 0.1 1", "green": "0.1 0.8 0.1 1", "blue": "0.1 0.2 0.9 1"}
# Instruction vocabulary: token ids of the words (0 is padding).
VOCAB = ("<pad>", "push", "the", "block", *COLOURS, *DIRECTIONS)
WORD_ID = {w: i for i, w in enumerate(VOCAB)}
INSTRUCTION_LEN = 5
OBS_DIM = 14
BLOCK_HALF = 0.02
PUSHER_RADIUS = 0.015


@dataclasses.dataclass(frozen=True)
class Task:
    colour: str
    direction: str

    @property
    def text(self) -> str:
        return f"push the {self.colour} block {self.direction}"

    @property
    def block(self) -> int:
        return COLOURS.index(self.colour)

    @property
    def vector(self) -> np.ndarray:
        return np.asarray(DIRECTION_VECTORS[self.direction])


ALL_TASKS = tuple(Task(c, d) for c in COLOURS for d in DIRECTIONS)


def parse_instruction(text: str, field: str = "instruction", colours=COLOURS) -> Task:
    """`"push the red block left"` -> Task; a colour not in the scene or an unknown word is an
    error naming the field."""
    words = str(text).strip().split()
    shaped = len(words) == 5 and words[:2] == ["push", "the"] and words[3] == "block"
    if shaped and words[2] not in colours:
        raise ConfigError(
            field, f"block colour {words[2]!r} is not in the scene {list(colours)} ({text!r})"
        )
    unknown = [w for w in words if w not in WORD_ID]
    if unknown:
        raise ConfigError(field, f"unknown instruction word(s) {unknown} in {text!r}")
    if len(words) != 5 or words[:2] != ["push", "the"] or words[3] != "block":
        raise ConfigError(field, f"expected 'push the <colour> block <direction>', got {text!r}")
    colour, direction = words[2], words[4]
    if direction not in DIRECTIONS:
        raise ConfigError(field, f"{direction!r} is not a direction {list(DIRECTIONS)}")
    return Task(colour, direction)


def encode_instruction(task: Task) -> np.ndarray:
    return np.asarray([WORD_ID[w] for w in task.text.split()], np.int32)


def scene_xml(timestep: float) -> str:
    """The MJCF of the scene. Collision bits: floor 1, blocks 1|2, pusher 2 (no floor contact)."""
    blocks = "".join(
        f"""
    <body name="{c}" pos="{0.1 * i - 0.1} 0 {BLOCK_HALF}">
      <freejoint/>
      <geom type="box" size="{BLOCK_HALF} {BLOCK_HALF} {BLOCK_HALF}" mass="0.05" rgba="{RGBA[c]}"
            contype="3" conaffinity="3" friction="0.6 0.005 0.0001"/>
    </body>"""
        for i, c in enumerate(COLOURS)
    )
    return f"""
<mujoco model="tabletop_push">
  <option timestep="{timestep}" integrator="implicitfast"/>
  <worldbody>
    <geom name="floor" type="plane" size="0.5 0.5 0.01" contype="1" conaffinity="1"
          friction="0.6 0.005 0.0001"/>
    <body name="pusher" pos="0 0 {BLOCK_HALF}">
      <joint name="px" type="slide" axis="1 0 0" damping="0"/>
      <joint name="py" type="slide" axis="0 1 0" damping="0"/>
      <geom type="cylinder" size="{PUSHER_RADIUS} {BLOCK_HALF * 0.8}" mass="1.0"
            contype="2" conaffinity="2" rgba="0.3 0.3 0.3 1"/>
    </body>{blocks}
  </worldbody>
  <actuator>
    <velocity joint="px" kv="200" ctrlrange="-1 1"/>
    <velocity joint="py" kv="200" ctrlrange="-1 1"/>
  </actuator>
</mujoco>"""


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """The static settings of the scene (from `config.env`)."""

    episode_len: int = 40  # actions per episode
    action_bins: int = 5  # per axis; num_actions = bins ** 2
    max_speed: float = 0.2  # m/s
    action_dt: float = 0.1  # s per action
    timestep: float = 0.005  # physics step
    push_distance: float = 0.10
    success_radius: float = 0.03
    workspace: float = 0.15  # blocks start in [-w, w]^2
    min_separation: float = 0.08

    @property
    def num_actions(self) -> int:
        return self.action_bins**2

    @property
    def substeps(self) -> int:
        return max(round(self.action_dt / self.timestep), 1)

    def velocities(self) -> np.ndarray:
        """[num_actions, 2] pusher velocity of each action token (x fastest... y slowest)."""
        axis = np.linspace(-self.max_speed, self.max_speed, self.action_bins)
        vx, vy = np.meshgrid(axis, axis, indexing="xy")
        return np.stack([vx.ravel(), vy.ravel()], -1).astype(np.float32)

    def quantise(self, v: np.ndarray) -> np.ndarray:
        """Nearest action token for desired velocities v [..., 2]."""
        axis = np.linspace(-self.max_speed, self.max_speed, self.action_bins)
        ix = np.abs(v[..., 0:1] - axis).argmin(-1)
        iy = np.abs(v[..., 1:2] - axis).argmin(-1)
        return (iy * self.action_bins + ix).astype(np.int32)


def env_spec_from_config(env) -> EnvSpec:
    return EnvSpec(**{f.name: env[f.name] for f in dataclasses.fields(EnvSpec) if f.name in env})


@dataclasses.dataclass(frozen=True)
class StartState:
    """One episode's start: the task, the pusher xy [2] and the blocks' xy [3, 2]."""

    task: Task
    pusher: np.ndarray
    blocks: np.ndarray


def sample_start(rng: np.random.Generator, task: Task, spec: EnvSpec) -> StartState:
    """A layout where the blocks are apart, the goal is in reach and the pusher starts clear."""
    w = spec.workspace
    while True:
        blocks = rng.uniform(-w, w, (3, 2))
        d = np.linalg.norm(blocks[:, None] - blocks[None], axis=-1) + np.eye(3)
        if d.min() < spec.min_separation:
            continue
        goal = blocks[task.block] + spec.push_distance * task.vector
        if np.linalg.norm(goal[None] - np.delete(blocks, task.block, 0), axis=-1).min() < 0.06:
            continue
        pusher = rng.uniform(-w - 0.03, w + 0.03, 2)
        if np.linalg.norm(blocks - pusher, axis=-1).min() < 0.05:
            continue
        return StartState(task, pusher.astype(np.float32), blocks.astype(np.float32))


def goal_of(start: StartState, spec: EnvSpec) -> np.ndarray:
    return start.blocks[start.task.block] + spec.push_distance * start.task.vector


def success(start: StartState, final_blocks: np.ndarray, spec: EnvSpec) -> bool:
    """The sparse task reward: named block at its goal, the others (nearly) unmoved."""
    b = start.task.block
    at_goal = np.linalg.norm(final_blocks[b] - goal_of(start, spec)) < spec.success_radius
    others = [i for i in range(3) if i != b]
    moved = np.linalg.norm(final_blocks[others] - start.blocks[others], axis=-1)
    return bool(at_goal and (moved < spec.success_radius).all())


class PushEnv:
    """One MuJoCo model and data; `reset(start)` then `step(action)` `episode_len` times."""

    def __init__(self, spec: EnvSpec):
        self.spec = spec
        self.model = mujoco.MjModel.from_xml_string(scene_xml(spec.timestep))
        self.data = mujoco.MjData(self.model)
        self.velocities = spec.velocities()  # ctrl = target velocity, m/s
        self.start: StartState | None = None

    def reset(self, start: StartState) -> np.ndarray:
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[0:2] = start.pusher
        for i in range(3):
            q = 2 + 7 * i
            self.data.qpos[q : q + 3] = (*start.blocks[i], BLOCK_HALF)
            self.data.qpos[q + 3 : q + 7] = (1.0, 0.0, 0.0, 0.0)
        mujoco.mj_forward(self.model, self.data)
        self.start = start
        return self.observe()

    def positions(self) -> tuple[np.ndarray, np.ndarray]:
        q = self.data.qpos
        blocks = np.stack([q[2 + 7 * i : 4 + 7 * i] for i in range(3)])
        return q[0:2].astype(np.float32), blocks.astype(np.float32)

    def observe(self) -> np.ndarray:
        pusher, blocks = self.positions()
        return np.concatenate([pusher, blocks.ravel(), self.start.blocks.ravel()]).astype(
            np.float32
        )

    def step(self, action: int) -> np.ndarray:
        self.data.ctrl[:] = self.velocities[int(action)]
        mujoco.mj_step(self.model, self.data, nstep=self.spec.substeps)
        return self.observe()

    def succeeded(self) -> bool:
        return success(self.start, self.positions()[1], self.spec)


def make_obs(start: StartState) -> np.ndarray:
    return np.concatenate([start.pusher, start.blocks.ravel(), start.blocks.ravel()]).astype(
        np.float32
    )


def expert_action(obs: np.ndarray, task: Task, spec: EnvSpec) -> int:
    """A stateless waypoint controller: go around the block to its far side, line up behind
    it, push along the instruction's direction until the block reaches its goal."""
    pusher, blocks, starts = obs[0:2], obs[2:8].reshape(3, 2), obs[8:14].reshape(3, 2)
    b, d = task.block, task.vector
    perp = np.asarray([-d[1], d[0]])
    p = blocks[b]
    goal = starts[b] + spec.push_distance * d
    e = pusher - p
    along, lat = float(e @ d), float(e @ perp)
    contact = BLOCK_HALF + PUSHER_RADIUS
    side = 1.0 if lat >= 0 else -1.0
    remaining = float((goal - p) @ d)
    if remaining < 0.004:
        return spec.quantise(np.zeros(2))[()]  # at the goal: stop
    if along > -contact + 0.004:  # on the wrong side: go around
        if abs(lat) < contact + 0.02:
            target = p + side * perp * (contact + 0.035)  # sideways first
        else:
            target = p + side * perp * (contact + 0.035) - d * (contact + 0.02)
    elif abs(lat) > 0.006 or along < -contact - 0.02:
        target = p - d * (contact + 0.003)  # line up behind the block
        if abs(lat) > 0.006 and along > -contact - 0.008:
            target = target - d * 0.015  # back off a little while correcting sideways
    else:  # push, nudging the pusher back onto the line through the block
        speed = min(spec.max_speed, 2.0 * remaining / spec.action_dt + 0.02)
        return spec.quantise(d * speed - perp * lat * 4.0)[()]
    v = (target - pusher) / spec.action_dt
    n = np.linalg.norm(v)
    if n > spec.max_speed:
        v = v * spec.max_speed / n
    return spec.quantise(v)[()]
