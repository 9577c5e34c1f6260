"""Top-down images of the scene drawn from its state (the `obs = "image"` variant).

A camera straight above the table, orthographic: `pixels x pixels` RGB over the square
[-extent, extent]^2 (metres, the table's centre at the origin), drawn from the 14-float
observation by coverage, not by MuJoCo's renderer: a pixel's value is the fraction of it each
object covers times the object's colour (the scene's RGBA), summed and clipped to [0, 1]. The
cubes are drawn axis-aligned (their yaw is not in the state) and their coverage is exact for
an axis-aligned square; the pusher's disc is antialiased over one pixel. Objects outside the
square are cut off (at the defaults, a block pushed 10 cm from the workspace's edge and then
shifted 5 cm by BC's augmentation can lose up to 2 cm of itself at the border). Pure
`jax.numpy`, so the policy draws what it reads inside jit: from the simulator's state for a real
episode, from the world model's imagined state for an imagined one (the same drawing, so the
policy cannot tell them apart by their look).

Layout: image[row, col, channel], row = y index (increasing y), col = x index (increasing x).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from wmrl.embodied.env import BLOCK_HALF, COLOURS, PUSHER_RADIUS, RGBA

BLOCK_RGB = np.asarray([[float(v) for v in RGBA[c].split()[:3]] for c in COLOURS], np.float32)
PUSHER_RGB = np.asarray([0.3, 0.3, 0.3], np.float32)  # the scene's pusher geom


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    pixels: int = 32  # side of the square image
    patch: int = 4  # side of a patch token (pixels % patch == 0)
    extent: float = 0.3  # half-width of the drawn square (m)
    # FiLM (RT-1's instruction conditioning of the image encoder): the patch embeddings are
    # scaled and shifted by a function of the instruction's words.
    film: bool = True
    # Behaviour cloning sees each demo step with the whole scene translated by a uniform offset
    # up to this (m) per axis (DrQ's random shifts, done in the world; the floor is uniform).
    bc_shift: float = 0.05

    @property
    def pixel_size(self) -> float:
        return 2.0 * self.extent / self.pixels

    @property
    def num_patches(self) -> int:
        return (self.pixels // self.patch) ** 2

    def centres(self) -> np.ndarray:
        """[pixels] pixel-centre coordinates along either axis."""
        return -self.extent + (np.arange(self.pixels, dtype=np.float32) + 0.5) * self.pixel_size


def _box_cover(c: jnp.ndarray, centre: jnp.ndarray, half: float, px: float) -> jnp.ndarray:
    """Fraction of the pixels [.., P] centred at `c` that the interval centre +- half covers
    (the exact overlap, for pixels of any size)."""
    lo = jnp.maximum(c - px / 2, centre - half)
    hi = jnp.minimum(c + px / 2, centre + half)
    return jnp.clip(hi - lo, 0.0, None) / px


def draw(points: jnp.ndarray, spec: ImageSpec, pusher: bool) -> jnp.ndarray:
    """points [..., 4, 2] (pusher, then the blocks in COLOURS order) -> [..., P, P, 3] RGB;
    `pusher=False` leaves the pusher out (the start frame: its start is not in the state)."""
    c = jnp.asarray(spec.centres())
    px = spec.pixel_size
    blocks = points[..., 1:, :]  # [..., 3, 2]
    cx = _box_cover(c, blocks[..., 0:1], BLOCK_HALF, px)  # [..., 3, P]
    cy = _box_cover(c, blocks[..., 1:2], BLOCK_HALF, px)
    cover = cy[..., :, None] * cx[..., None, :]  # [..., 3, P(y), P(x)]
    img = jnp.einsum("...kyx,kc->...yxc", cover, jnp.asarray(BLOCK_RGB))
    if pusher:
        p = points[..., 0, :]
        dx = c - p[..., 0:1]  # [..., P]
        dy = c - p[..., 1:2]
        dist = jnp.sqrt(dy[..., :, None] ** 2 + dx[..., None, :] ** 2)
        disc = jnp.clip((PUSHER_RADIUS + px / 2 - dist) / px, 0.0, 1.0)
        img = img + disc[..., None] * jnp.asarray(PUSHER_RGB)
    return jnp.clip(img, 0.0, 1.0)


def frames(obs: jnp.ndarray, spec: ImageSpec) -> jnp.ndarray:
    """obs [..., 14] -> [..., P, P, 6]: the start frame (blocks at their start) and the current
    frame (pusher and blocks now), RGB each: what a camera saw at the episode's first step and
    sees now."""
    pusher = obs[..., 0:2]
    cur = obs[..., 2:8].reshape(*obs.shape[:-1], 3, 2)
    start = obs[..., 8:14].reshape(*obs.shape[:-1], 3, 2)
    now = draw(jnp.concatenate([pusher[..., None, :], cur], -2), spec, pusher=True)
    first = draw(jnp.concatenate([pusher[..., None, :], start], -2), spec, pusher=False)
    return jnp.concatenate([first, now], -1)


def patches(images: jnp.ndarray, patch: int) -> jnp.ndarray:
    """[B, P, P, C] -> [B, (P/patch)^2, patch * patch * C], row-major over the patch grid."""
    b, p, _, ch = images.shape
    n = p // patch
    x = images.reshape(b, n, patch, n, patch, ch).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, n * n, patch * patch * ch)
