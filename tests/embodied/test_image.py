"""The image-observation variant (`obs = "image"`): the top-down drawing by hand, its frames
under the instruction frame's rotations, the policy reading blocks only through pixels, the
config errors, the stage fingerprint, and a tiny run end to end."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from configs import embodied_push
from wmrl.config_errors import ConfigError
from wmrl.embodied import config as econfig
from wmrl.embodied import experiment, render, stages
from wmrl.embodied import policy as pol
from wmrl.embodied.env import BLOCK_HALF, RGBA

SPEC = render.ImageSpec(pixels=32, patch=8, extent=0.3)
PX = 0.6 / 32


def obs_of(pusher, blocks, starts):
    return np.concatenate([pusher, np.ravel(blocks), np.ravel(starts)]).astype(np.float32)


def test_coverage_is_the_exact_overlap_for_pixels_wider_than_a_block():
    coarse = render.ImageSpec(pixels=8, patch=4, extent=0.3)  # 7.5 cm pixels, a 4 cm cube
    obs = obs_of([5.0, 5.0], [[0.0375, 0.0375], [5.0, 5.0], [-5.0, -5.0]], [[9.0, 9.0]] * 3)
    img = np.asarray(render.frames(jnp.asarray(obs), coarse))[..., 3]  # red, current frame
    # pixel 4 spans [0, 7.5] cm; the cube [1.75, 5.75] cm lies inside: (4 / 7.5)^2 of it
    np.testing.assert_allclose(img[4, 4], 0.9 * (0.04 / 0.075) ** 2, rtol=1e-5)
    np.testing.assert_allclose(img.sum(), 0.9 * (0.04 / 0.075) ** 2, rtol=1e-5)


def test_a_block_covers_its_area_in_its_colour_and_its_centre_pixel_fully():
    far = [0.29, 0.29]  # the pusher in a corner pixel, away from the block
    blocks = [[0.0, 0.0], [5.0, 5.0], [-5.0, -5.0]]  # green and blue off the canvas
    img = np.asarray(render.frames(jnp.asarray(obs_of(far, blocks, blocks)), SPEC))
    red = np.asarray([float(v) for v in RGBA["red"].split()[:3]])
    for frame in (img[..., :3], img[..., 3:]):
        cover = frame[:, :-2, :] / red  # the pusher's corner rows left out
        # a 4 cm cube over 1.875 cm pixels: (0.04 / 0.01875)^2 pixels' worth of colour
        np.testing.assert_allclose(cover.sum() / 3, (2 * BLOCK_HALF / PX) ** 2, rtol=1e-5)
        # (0, 0) is the corner of pixels 15 and 16: four pixels each wholly inside the cube
        np.testing.assert_allclose(frame[15:17, 15:17], np.broadcast_to(red, (2, 2, 3)), atol=1e-6)
        # pixel 17 spans [1.875, 3.75] cm in x: the cube's last 0.125 cm of it
        np.testing.assert_allclose(frame[16, 17], red * (0.02 - PX) / PX, atol=1e-5)


def test_the_first_frame_has_the_blocks_at_their_start_and_no_pusher():
    pusher = [0.1, -0.1]
    starts = [[-0.1, 0.1], [0.0, 0.0], [0.1, 0.1]]
    now = [[-0.1, 0.2], [0.0, 0.0], [0.1, 0.1]]  # red moved 10 cm forward
    img = np.asarray(render.frames(jnp.asarray(obs_of(pusher, now, starts)), SPEC))
    first, cur = img[..., :3], img[..., 3:]
    row = lambda y: int((y + 0.3) / PX)
    col = row
    assert first[row(0.1), col(-0.1), 0] > 0.8 and cur[row(0.1), col(-0.1), 0] == 0
    assert cur[row(0.2), col(-0.1), 0] > 0.8 and first[row(0.2), col(-0.1), 0] == 0
    # the pusher (grey 0.3) in the current frame only
    np.testing.assert_allclose(cur[row(-0.1), col(0.1)], 0.3, atol=1e-6)
    assert first[row(-0.1), col(0.1)].max() == 0


def test_drawing_the_rotated_scene_rotates_the_image():
    """What the canonical frame relies on: the scene rotated by a frame rotation draws as the
    image with its pixels moved by that rotation (pixel centres mapped by hand)."""
    rng = np.random.default_rng(0)
    obs = obs_of(
        rng.uniform(-0.2, 0.2, 2), rng.uniform(-0.2, 0.2, (3, 2)), rng.uniform(-0.2, 0.2, (3, 2))
    )
    img = np.asarray(render.frames(jnp.asarray(obs), SPEC))
    c = SPEC.centres()
    rots, _ = pol.frame_tables(25)
    for m in rots:
        got = np.asarray(
            render.frames(pol.to_frame(jnp.asarray(obs[None]), jnp.asarray(m[None]))[0], SPEC)
        )
        want = np.zeros_like(img)
        for i in range(32):  # row: y
            for j in range(32):  # col: x
                x, y = m.T @ np.asarray([c[j], c[i]])  # the world point drawn at (i, j)
                want[i, j] = img[np.argmin(np.abs(c - y)), np.argmin(np.abs(c - x))]
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_patches_are_row_major_squares_of_the_image():
    img = jnp.asarray(np.random.default_rng(1).uniform(size=(2, 32, 32, 6)).astype(np.float32))
    p = np.asarray(render.patches(img, 8))
    assert p.shape == (2, 16, 8 * 8 * 6)
    np.testing.assert_array_equal(p[1, 0], np.asarray(img[1, :8, :8]).ravel())
    np.testing.assert_array_equal(p[0, 6], np.asarray(img[0, 8:16, 16:24]).ravel())


def _logits(obs_kind, obs):
    spec = pol.PolicySpec(
        num_actions=25, chunk=4, d_model=32, num_layers=1, mlp_dim=64, obs=obs_kind
    )
    g, params = pol.init_policy(spec, 0)
    words = jnp.asarray([[1, 2, 4, 3, 7]] * len(obs), jnp.int32)
    return np.asarray(pol.apply(g, params, words, jnp.asarray(np.stack(obs))))


def test_the_image_policy_sees_the_blocks_only_through_pixels():
    pusher, starts = [0.0, -0.1], [[-0.1, 0.1], [0.0, 0.1], [0.1, 0.1]]
    off_a = [[-0.1, 0.1], [0.0, 0.1], [2.0, 2.0]]  # blue off the canvas ...
    off_b = [[-0.1, 0.1], [0.0, 0.1], [-3.0, 1.0]]  # ... somewhere else off it
    on = [[-0.1, 0.1], [0.0, 0.1], [0.12, 0.1]]  # blue moved 2 cm on the canvas
    obs = [obs_of(pusher, b, starts) for b in (off_a, off_b, on)]
    img = _logits("image", obs)
    np.testing.assert_allclose(img[0], img[1], atol=1e-6)  # the same pixels, the same action
    assert np.abs(img[2] - img[0]).max() > 1e-4
    state = _logits("state", obs)
    assert np.abs(state[0] - state[1]).max() > 1e-4  # the state policy reads the xy


def test_bad_image_settings_name_the_field():
    def check(field, **kv):
        c = embodied_push.get_config("tiny")
        for k, v in kv.items():
            node, *path = c, *k.split("__")
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = v
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            econfig.validate_embodied_config(c)

    check("config.obs", obs="depth")
    check("config.image.patch", obs="image", image__patch=5)
    check("config.image.pixels", obs="image", image__pixels=0)
    check("config.image.extent", obs="image", image__extent=0.0)
    check("config.image.extent", obs="image", image__extent=float("nan"))
    check("config.image.bc_shift", obs="image", image__bc_shift=-0.01)
    check("config.image.bc_shift", obs="image", image__bc_shift=0.5)
    # A state run does not read the images, but a bad image setting is refused there too:
    # every section of the typed config is valid or named, whatever reads it.
    check("config.image.patch", image__patch=5)


def test_a_state_stage_is_not_reused_for_images(tmp_path):
    c = embodied_push.get_config("tiny")
    bc = tmp_path / "bc"
    bc.mkdir()
    report = stages.finish_stage(bc, c, {})
    assert "image" not in report["config"] and report["config"]["obs"] == "state"
    c.image.patch, c.image.pixels = 8, 64  # not read with state observations: the same stage
    assert stages.stage_done(bc, c) is not None
    # a stage saved before the field was made with state observations
    legacy = {k: v for k, v in report["config"].items() if k != "obs"}
    (bc / "done.json").write_text(json.dumps({"config": legacy}))
    assert stages.stage_done(bc, c) is not None
    c.obs = "image"
    image = ", ".join(f"image.{f}" for f in ("bc_shift", "extent", "film", "patch", "pixels"))
    with pytest.raises(ConfigError, match=f"fields: {image}, obs"):
        stages.stage_done(bc, c)


@pytest.mark.real
def test_a_tiny_image_run_end_to_end(tmp_path):
    c = embodied_push.get_config("tiny")
    c.obs = "image"
    c.rl.steps = 1
    s = experiment.run(c, tmp_path / "run")
    assert s["observations"] == "image" and s["steps"] == 1
    assert s["real_executions"] == 8 and s["wm_episodes"] == 8  # 2 anchor groups of 4, 2 WM
    saved = json.loads((tmp_path / "run" / "init" / "bc" / "done.json").read_text())["config"]
    assert saved["obs"] == "image" and saved["image"] == {
        "pixels": 32,
        "patch": 4,
        "extent": 0.3,
        "film": True,
        "bc_shift": 0.05,
    }
    assert 0.0 <= s["final_heldout_success"] <= 1.0


def test_the_bc_shift_moves_every_point_of_a_row_by_its_offset():
    obs = np.arange(28, dtype=np.float32).reshape(2, 14) / 100
    got = stages.shift_scene(obs, np.asarray([[0.01, -0.02], [0.0, 0.03]]))
    want = obs.copy()
    want[0, 0::2] += 0.01
    want[0, 1::2] -= 0.02
    want[1, 1::2] += 0.03
    np.testing.assert_allclose(got, want, atol=1e-7)
    assert got.dtype == np.float32


def test_a_run_compares_the_image_fields_only_where_the_policy_reads_images():
    old = embodied_push.get_config()
    saved = json.loads(old.to_json_best_effort())
    del saved["image"]  # a state run saved before the fields
    now = embodied_push.get_config()
    now.image.patch = 8  # not read with state observations
    assert econfig.HISTORY.differences(saved, now) == []
    now.obs = "image"
    assert "obs" in econfig.HISTORY.differences(saved, now)  # a state run is not an image one
    img = embodied_push.get_config()
    img.obs = "image"
    saved_img = json.loads(img.to_json_best_effort())
    assert econfig.HISTORY.differences(saved_img, now) == ["image.patch"]
