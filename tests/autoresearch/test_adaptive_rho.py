"""The fidelity-driven anchor fraction in the trainer (`correction.adaptive_rho`, docs/method.md
3.10): a padded anchor set corrects exactly as the unpadded one; the trainer's own rule, count
and routing on synthetic pair streams (a good WM thins the anchors to rho_min, a collapsed one
executes every group) without compiling anything new; routing nested in the count and blind
to the pool's capacity, whose queue runs the anchors it cannot start yet."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.state import Pending
from wmrl.core import routing
from wmrl.core.correct import MODE_SPECS, StepInputs, correct_rewards
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig
from wmrl.core.state import init_correction_state

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

DEBIAS = DebiasConfig(mode="monotone", num_bins=4, min_pairs=4, refit_every=1, min_slope=0.05)
DENOISE = DenoiseConfig(half_life=4.0, warmup_groups=1, target=2.0, w_max=4.0)


def _correct(padded: bool):
    return jax.jit(functools.partial(
        correct_rewards, group_size=3, spec=MODE_SPECS["wmrl"], debias_cfg=DEBIAS,
        denoise_cfg=DENOISE, normalize_std=True, baseline="mean", padded=padded,
    ))  # fmt: skip


def test_padded_anchor_groups_correct_exactly_as_the_unpadded_ones():
    """Anchor groups 1 and 3 of B = 4 (G = 3), over 6 steps, with an ungraded row and a
    statically fixed row: the padded form (index list [1, 3, 4, 4], 4 = padding) gives the
    same state, rewards, advantages and diagnostics as [1, 3]."""
    B, G = 4, 3
    rng = np.random.default_rng(0)
    plain, padded = _correct(False), _correct(True)
    st_a = st_b = init_correction_state(DEBIAS)
    anchors = np.array([1, 3])
    groups = np.zeros(B, bool)
    groups[anchors] = True
    rows = np.repeat(groups, G)
    for step in range(6):
        r_env = rng.uniform(size=B * G).astype(np.float32)
        r_wm = (0.5 * r_env + 0.3 * rng.uniform(size=B * G)).astype(np.float32)
        env_valid = rows.copy()
        env_valid[4] = step != 2  # one ungraded anchor row
        static = np.zeros(B * G, bool)
        static[10] = True  # a statically fixed anchor row: out of the map and the diagnostic
        same = StepInputs(
            r_wm=r_wm, r_env=r_env, env_valid=env_valid, anchor_groups=groups, anchor_index=anchors,
            static_mask=static, static_reward=np.where(static, 0.1, 0.0).astype(np.float32),
        )  # fmt: skip
        a = plain(st_a, same)
        b = padded(st_b, same._replace(anchor_index=np.array([1, 3, B, B])))
        st_a, st_b = a.correction, b.correction
        for x, y in zip(jax.tree.leaves(st_a), jax.tree.leaves(st_b), strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
        for k in ("rewards", "valid", "advantages", "calibrated"):
            np.testing.assert_allclose(getattr(a, k), getattr(b, k), rtol=1e-6, atol=1e-7)
        stats_a, stats_b = a.stats.as_dict(), b.stats.as_dict()
        assert stats_a.keys() == stats_b.keys()
        for k in stats_a:
            if k == "wm_rank_corr" and step == 2:  # plain: the ungraded row enters as a 0
                continue
            np.testing.assert_allclose(stats_a[k], stats_b[k], rtol=1e-5, atol=1e-6)
        # The rule's per-group agreement: the two anchor groups, then NaN for the padding.
        assert a.anchor_agreement is None
        agree = np.asarray(b.anchor_agreement)
        assert agree.shape == (4,) and np.isnan(agree[2:]).all()
    assert bool(st_a.debias.monotone.fitted)  # the map was refitted on these steps


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_anchors_of_a_smaller_count_are_a_subset_of_a_larger_ones(share):
    """One key, counts 0..B: nested anchor sets (uniform and uncertainty routing), so a
    changing fraction changes how many groups are anchors, not which come first; the capacity
    of the sandbox pool is no input of the trainer's routing."""
    B = 12
    cfg = routing.RoutingConfig(rho=0.25, uncertainty_share=share)
    var = jnp.asarray(np.random.default_rng(1).uniform(size=B))
    for seed in range(5):
        key = jax.random.key(seed)
        sets = [
            np.asarray(routing.route_anchors(key, B, cfg, None, var, num_anchors=n)[0])
            for n in range(B + 1)
        ]
        assert [int(s.sum()) for s in sets] == list(range(B + 1))
        for small, large in itertools.pairwise(sets):
            assert not (small & ~large).any()
    # The count at a fraction in force: min_groups stays a floor, rho_max = 1 is every group.
    cfg = routing.RoutingConfig(rho=0.25, min_groups=2)
    assert int(routing.num_anchor_groups(8, 8, cfg, rho=0.05)) == 2
    assert int(routing.num_anchor_groups(8, 8, cfg, rho=0.5)) == 4
    assert int(routing.num_anchor_groups(8, 8, cfg, rho=1.0)) == 8
    assert int(routing.num_anchor_groups(8, 8, cfg, rho=jnp.float32(0.5))) == 4


def test_pending_padding_round_trip():
    p = Pending.empty(2, 3).replace(step=np.int64(4), rows=np.array([6, 7], np.int64))
    p = p.replace(r_wm=np.array([0.1, 0.2], np.float32))
    big = p.padded(6)
    assert big.tokens.shape == (6, 3) and list(big.rows) == [6, 7, -1, -1, -1, -1]
    live = big.live()
    assert list(live.rows) == [6, 7] and live.tokens.shape == (2, 3)
    np.testing.assert_array_equal(live.r_wm, p.r_wm)
    assert p.padded(2) is p and p.live() is p


@pytest.fixture(scope="module")
def adaptive_trainer(rl_shared, tmp_path_factory):
    """The real Trainer of the tiny setting (B = 2 groups of G = 2) with the adaptive rule on
    and the static check off; no sandbox pool (nothing is executed here)."""
    from wmrl.autoresearch.experiment import prepare_stages
    from wmrl.autoresearch.trainer import Trainer

    data_dir, init_dir = rl_shared
    wd = tmp_path_factory.mktemp("adaptive")
    config = tiny_config(
        data_dir, init_dir, mode="wmrl", correction__adaptive_rho=True, rl__static_check="off"
    )
    s = prepare_stages(config, wd, progress=False)
    trainer = Trainer(config, s.prepared, s.policy, s.wm, None, wd)
    yield trainer, trainer.initial_state(s.policy_params, s.wm_params)
    trainer.journal.close()
    trainer.eval_journal.close()


def _synthetic_steps(trainer, st, quality: str, steps: int, seed: int):
    """Drive the trainer's route -> correct -> rule phases on synthetic pair streams: the
    anchor groups of each step get real rewards and WM scores of the given quality. Returns
    the rho in force and the anchor count of each step."""
    from wmrl.autoresearch.step import Exchanged, Sampled
    from wmrl.experiment.step import PhaseClock

    B, G = trainer.B, trainer.G
    n = B * G
    rng = np.random.default_rng(seed)
    sampled = Sampled(0, [None] * n, {}, [""] * n)  # routing reads no row (uniform routing)
    rhos, counts = [], []
    for t in range(steps):
        key = jax.random.fold_in(jax.random.key(0), t)
        r = trainer.route(st, sampled, key, PhaseClock())
        rhos.append(r.rho)
        counts.append(int(r.is_anchor.sum()))
        r_env = rng.permutation(np.linspace(0.1, 0.9, n)).astype(np.float32)  # no ties
        r_wm = {"good": r_env + 0.01, "collapsed": np.full(n, 0.5)}[quality].astype(np.float32)
        status = np.where(r.anchor_rows, int(Status.VALID), int(Status.UNGRADED)).astype(np.int32)
        x = Exchanged(
            rows={}, ref_logp=None, r_wm=r_wm, r_env=np.where(r.anchor_rows, r_env, 0.0),
            status=status, origin=None, trained_tasks=None, collected=1, new_executions=0,
            pending=None,
        )  # fmt: skip
        c = trainer._correct_phase(st, r, x)
        st = st.replace(
            correction=c.result.correction, adaptive_rho=trainer._next_rule_state(st, c)
        )
    return np.asarray(rhos), counts


def test_trainer_thins_anchors_for_a_good_wm_and_executes_every_group_for_a_collapsed_one(
    adaptive_trainer,
):
    trainer, st = adaptive_trainer
    rule = trainer.rule
    assert (rule.rho, rule.rho_min, rule.rho_max) == (0.25, 0.125, 1.0)  # the schema's
    assert trainer.max_anchor_groups == 2 and trainer.no_pending.rows.shape == (4,)
    rhos, counts = _synthetic_steps(trainer, st, "good", 14, seed=0)
    # Warm-up: correction.rho (1 of 2 groups) until 8 groups were measured (1 a step).
    np.testing.assert_allclose(rhos[:8], 0.25)
    np.testing.assert_allclose(rhos[8:], rule.rho_min)  # agreement 1: the thinnest
    assert counts == [1] * 14  # min_groups = 1 is the floor: round(0.125 * 2) = 0
    rhos, counts = _synthetic_steps(trainer, st, "collapsed", 14, seed=1)
    np.testing.assert_allclose(rhos[:8], 0.25)
    np.testing.assert_allclose(rhos[8:], rule.rho_max)  # no agreement: every group executed
    assert counts == [1] * 8 + [2] * 6
    # The count changed (1 -> 2 groups) without compiling the correction again.
    assert trainer._correct._cache_size() == 1 and trainer._rho_update._cache_size() == 1


def _read(path):
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# The rho in force per step for the end-to-end runs: 1, 2, 1 anchor groups of B = 2. The
# tiny run's scripts rarely give a group two different real rewards, so the rule itself would
# hold correction.rho for 3 steps; the rule on its measurements is tested above through the
# trainer's own phases, this schedule drives the changing count through everything else
# (padded pending anchors, positions under the lag, the journal, checkpoints, resume).
SCHEDULE = (0.25, 1.0, 0.25)


def _scheduled_rho(monkeypatch):
    from wmrl.autoresearch.trainer import Trainer

    monkeypatch.setattr(Trainer, "rho_in_force", lambda self, st: SCHEDULE[st.step])


ADAPTIVE = dict(
    mode="wmrl", correction__adaptive_rho=True, rl__static_check="off", rl__steps=3,
    rl__eval_every=3, rl__keep_checkpoints=5,
)  # fmt: skip


@pytest.fixture(scope="module")
def straight_run(rl_shared, tmp_path_factory):
    from wmrl.autoresearch.experiment import run

    mp = pytest.MonkeyPatch()
    _scheduled_rho(mp)
    try:
        wd = tmp_path_factory.mktemp("adaptive_e2e") / "straight"
        run(tiny_config(*rl_shared, **ADAPTIVE), wd, progress=False)
    finally:
        mp.undo()
    return wd


def _steps(wd):
    return [r for r in _read(wd / "metrics.jsonl") if r["kind"] == "step"]


def test_adaptive_rho_end_to_end(straight_run):
    """3 steps with adaptive rho (lag 1, B = 2 groups of G = 2) and a count that grows and
    shrinks: each step executes round(rho * B) groups, trains on the previous step's, logs
    every graded outcome but the last step's as a pair, and journals every execution once;
    the pending anchors are checkpointed padded to rho_max's count; the rule's state counts
    the groups that measured the WM (recomputed here from pairs.jsonl)."""
    from wmrl.autoresearch.checkpoint import Checkpointer

    wd, B, G = straight_run, 2, 2
    steps, pairs = _steps(wd), _read(wd / "pairs.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert [r["rho"] for r in steps] == list(SCHEDULE)
    counts = [max(int(np.floor(rho * B + 0.5)), 1) for rho in SCHEDULE]
    assert counts == [1, 2, 1]
    assert [r["anchor_fraction"] for r in steps] == [n / B for n in counts]
    assert [r["real_executions_step"] for r in steps] == [n * G for n in counts]
    assert [r["anchor_outcomes_from_step"] for r in steps] == [None, 1, 2]
    journal = _read(wd / "anchors.jsonl")
    assert len(journal) == G * sum(counts) == steps[-1]["real_executions"]
    assert len({(j["step"], j["row"]) for j in journal}) == len(journal)
    assert [sum(j["step"] == k for j in journal) for k in range(3)] == [n * G for n in counts]
    # Every outcome but the last step's (still pending) was trained on: its pair is logged.
    graded = {(j["step"] + 1, j["row"]) for j in journal
              if j["step"] < 2 and j["reward"] is not None}  # fmt: skip
    assert {(p["step"], p["row"]) for p in pairs} == graded
    ckpt = Checkpointer(wd, keep=5)
    tree, _ = ckpt.read_raw()
    ckpt.close()
    rows = np.asarray(tree["pending"]["rows"])  # sized to rho_max: 2 groups, padded with -1
    assert int(tree["pending"]["step"]) == 2 and rows.shape == (B * G,)
    assert list(rows[G:]) == [-1] * G and (rows[:G] >= 0).all()
    # A group measures the WM when its two rows got different real rewards.
    measured = sum(
        len({p["r_env"] for p in pairs if (p["step"], p["row"] // G) == key}) == G
        for key in {(p["step"], p["row"] // G) for p in pairs}
    )
    assert int(tree["adaptive_rho"]["groups"]) == measured


@pytest.mark.slow  # a third tiny run; the fast suite keeps the 3-step end-to-end run
def test_adaptive_rho_resumed_run_equals_the_uninterrupted_one(
    straight_run, rl_shared, tmp_path, monkeypatch
):
    """Cut after the checkpoint of step 1 (a 1-step run, its summary removed: its pending
    anchors are 1 group padded to 2), resumed to 3 steps in a fresh trainer: every step's
    rho, anchor count, rewards and pairs are the uninterrupted run's, the rule's state is
    restored, and no execution is repeated (the pending anchors are resubmitted and taken
    from the journal)."""
    from wmrl.autoresearch.experiment import run

    _scheduled_rho(monkeypatch)
    wd = tmp_path / "cut"
    run(tiny_config(*rl_shared, **{**ADAPTIVE, "rl__steps": 1}), wd, progress=False)
    (wd / "summary.json").unlink()
    summary = run(tiny_config(*rl_shared, **ADAPTIVE), wd, progress=False)
    same = lambda r: (r["step"], r["rho"], r["anchor_fraction"], round(r["train_reward"], 6),
                      round(r["anchor_weight"], 6), r["anchor_outcomes_from_step"])  # fmt: skip
    assert [same(r) for r in _steps(wd)] == [same(r) for r in _steps(straight_run)]
    keys = lambda w: [(j["step"], j["row"]) for j in _read(w / "anchors.jsonl")]
    assert sorted(keys(wd)) == sorted(keys(straight_run))  # nothing executed twice or lost
    pair = lambda p: (p["step"], p["row"], p["r_env"], round(p["r_cal"], 6))
    assert [pair(p) for p in _read(wd / "pairs.jsonl")] == [
        pair(p) for p in _read(straight_run / "pairs.jsonl")
    ]
    import json

    straight = json.loads((straight_run / "summary.json").read_text())
    assert summary["final_heldout_reward"] == straight["final_heldout_reward"]
    assert summary["real_executions"] == straight["real_executions"]
    from wmrl.autoresearch.checkpoint import Checkpointer

    states = []
    for w in (wd, straight_run):
        ckpt = Checkpointer(w, keep=5)
        states.append(ckpt.read_raw()[0]["adaptive_rho"])
        ckpt.close()
    for k in states[0]:
        np.testing.assert_array_equal(np.asarray(states[0][k]), np.asarray(states[1][k]))


def test_a_full_sandbox_pool_queues_the_anchors_and_never_changes_which_they_are(
    adaptive_trainer, tmp_path
):
    """1 sandbox slot for 4 anchor rows (the rule's state says collapsed: rho_max, both
    groups): routing picks the same groups with the pool full as before, all four are
    submitted at once (queued: no free slot), and all four execute and are journalled."""
    from wmrl.autoresearch.anchors import AnchorJournal, AnchorQueue
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.step import Sampled
    from wmrl.core.fidelity import AdaptiveRhoState
    from wmrl.experiment.step import PhaseClock

    trainer, st = adaptive_trainer
    collapsed = AdaptiveRhoState(ema=jnp.float32(0.0), norm=jnp.float32(1.0), groups=jnp.int32(8))
    st = st.replace(adaptive_rho=collapsed)
    B, G = trainer.B, trainer.G
    scripts = [f"print({i})\n" for i in range(B * G)]
    sampled = Sampled(0, [trainer.train[0]] * (B * G), {}, scripts)
    key = jax.random.key(3)
    journal = AnchorJournal(tmp_path / "anchors.jsonl")
    pool = SandboxPool(1, time_limit_cap_s=10.0)
    saved, trainer.anchors = trainer.anchors, AnchorQueue(journal, pool, lag=0)
    try:
        routed = trainer.route(st, sampled, key, PhaseClock())
        assert routed.rho == 1.0 and list(routed.submit_idx) == [0, 1, 2, 3]
        sub = trainer._submit(sampled, routed)
        assert pool.free_slots() == 0  # more anchors than slots: the pool queues them
        again = trainer.route(st, sampled, key, PhaseClock())
        np.testing.assert_array_equal(again.is_anchor, routed.is_anchor)
        out = trainer.anchors.collect(sub)
        assert (out.status != int(Status.UNGRADED)).all() and out.new == 4
        assert sorted(journal.done) == [(0, i) for i in range(4)]
    finally:
        trainer.anchors = saved
        journal.close()
        pool.close()
