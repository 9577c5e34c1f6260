"""Real rollouts in MuJoCo: the scripted expert's demonstrations and the policy's episodes.

Every episode executed here is a *real* episode (it steps the simulator); the world model's
imagined episodes (`wmrl.embodied.world_model.imagine`) never come here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wmrl.embodied import env as scene


@dataclasses.dataclass
class Episodes:
    """A batch of N finished episodes of T actions (numpy)."""

    words: np.ndarray  # [N, 5] int32 instruction tokens
    task: np.ndarray  # [N] int32 index into ALL_TASKS
    obs: np.ndarray  # [N, T + 1, 14] float32
    actions: np.ndarray  # [N, T] int32
    logp: np.ndarray  # [N, T] float32 (sampling log-probs; 0 for the expert)
    success: np.ndarray  # [N] float32 in {0, 1}

    def __len__(self) -> int:
        return len(self.task)

    @staticmethod
    def concat(parts: list[Episodes]) -> Episodes:
        return Episodes(
            **{
                f.name: np.concatenate([getattr(p, f.name) for p in parts])
                for f in dataclasses.fields(Episodes)
            }
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class EnvPool:
    """N MuJoCo scenes reused across batches (building a model costs more than an episode)."""

    def __init__(self, spec: scene.EnvSpec):
        self.spec = spec
        self.envs: list[scene.PushEnv] = []

    def get(self, n: int) -> list[scene.PushEnv]:
        while len(self.envs) < n:
            self.envs.append(scene.PushEnv(self.spec))
        return self.envs[:n]


def task_index(task: scene.Task) -> int:
    return scene.ALL_TASKS.index(task)


def expert_demos(pool: EnvPool, starts: list[scene.StartState]) -> Episodes:
    spec, T = pool.spec, pool.spec.episode_len
    n = len(starts)
    obs = np.zeros((n, T + 1, scene.OBS_DIM), np.float32)
    actions = np.zeros((n, T), np.int32)
    succ = np.zeros(n, np.float32)
    env = pool.get(1)[0]
    for i, s in enumerate(starts):
        obs[i, 0] = env.reset(s)
        for t in range(T):
            actions[i, t] = scene.expert_action(obs[i, t], s.task, spec)
            obs[i, t + 1] = env.step(actions[i, t])
        succ[i] = env.succeeded()
    return Episodes(
        words=np.stack([scene.encode_instruction(s.task) for s in starts]),
        task=np.asarray([task_index(s.task) for s in starts], np.int32),
        obs=obs,
        actions=actions,
        logp=np.zeros((n, T), np.float32),
        success=succ,
    )


def policy_rollouts(pool: EnvPool, starts: list[scene.StartState], act, chunk: int) -> Episodes:
    """Run `act(words [N,5], obs [N,14], chunk_index) -> (actions [N,H], logp [N,H])` in the
    simulator, one call per chunk for the whole batch."""
    _spec, T = pool.spec, pool.spec.episode_len
    n = len(starts)
    envs = pool.get(n)
    words = np.stack([scene.encode_instruction(s.task) for s in starts])
    obs = np.zeros((n, T + 1, scene.OBS_DIM), np.float32)
    actions = np.zeros((n, T), np.int32)
    logp = np.zeros((n, T), np.float32)
    for i, (env, s) in enumerate(zip(envs, starts, strict=False)):
        obs[i, 0] = env.reset(s)
    for c in range(T // chunk):
        t0 = c * chunk
        a, lp = act(words, obs[:, t0], c)
        actions[:, t0 : t0 + chunk], logp[:, t0 : t0 + chunk] = a, lp
        for i, env in enumerate(envs):
            for h in range(chunk):
                obs[i, t0 + h + 1] = env.step(a[i, h])
    succ = np.asarray([env.succeeded() for env in envs], np.float32)
    return Episodes(
        words=words,
        task=np.asarray([task_index(s.task) for s in starts], np.int32),
        obs=obs,
        actions=actions,
        logp=logp,
        success=succ,
    )


def sample_starts(rng: np.random.Generator, tasks, n: int, spec: scene.EnvSpec, repeat: int = 1):
    """n start states drawn over `tasks` (cycled), each repeated `repeat` times (a GRPO group:
    G rollouts of one instruction and layout)."""
    out = []
    for _i in range(n):
        s = scene.sample_start(rng, tasks[int(rng.integers(len(tasks)))], spec)
        out.extend([s] * repeat)
    return out
