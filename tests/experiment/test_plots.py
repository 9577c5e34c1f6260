"""The held-out curve plot every run writes, from evaluations with and without standard
errors (an ungraded evaluation is left out)."""

import matplotlib.image

from wmrl.experiment.plots import plot_heldout_curve


def test_the_heldout_curve_is_a_png_with_or_without_standard_errors(tmp_path):
    evals = [
        {"wall_time_s": 0.0, "heldout_reward": 0.4, "heldout_reward_se": 0.03},
        {"wall_time_s": 50.0, "heldout_reward": None, "heldout_reward_se": None},
        {"wall_time_s": 90.0, "heldout_reward": 0.55, "heldout_reward_se": 0.02},
    ]
    for name, rows in (("se.png", evals), ("no_se.png", [{**e, "heldout_reward_se": None}
                                                         for e in evals])):  # fmt: skip
        path = tmp_path / name
        plot_heldout_curve(path, rows, "wall_time_s", "heldout_reward", 0.5, "s", "reward",
                           dpi=50)  # fmt: skip
        assert path.read_bytes().startswith(b"\x89PNG")
        assert matplotlib.image.imread(path).shape[:2] == (200, 300)  # 6 x 4 in at 50 dpi
