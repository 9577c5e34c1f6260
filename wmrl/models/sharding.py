"""One table of logical-axis rules, mesh construction, and sharding helpers.

Parameters and activations are annotated with *logical* axis names (`embed`,
`heads`, `mlp`, ...). This module is the only place that says which mesh axis
(`data`, `fsdp`, `tensor`) each logical name lives on, so changing the
parallelism layout is a one-line edit of `LOGICAL_AXIS_RULES`.

We store the logical names as our own `logical_axes` metadata on `nnx.Param`
rather than flax's `out_sharding`: flax shards annotated variables eagerly at
construction, which needs a mesh in scope even on a laptop and binds module
construction to one mesh. Here construction is mesh-free and the jitted init
places parameters through `out_shardings` derived from this table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("layers", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    # Ensemble members are few (M ~ 5) and rarely divide the tensor axis, so
    # they are replicated by default; map to "tensor" when M divides it.
    ("ensemble", None),
    ("classes", None),
)

LogicalAxes = tuple[str | None, ...]


def logical_to_spec(logical_axes: Sequence[str | None], rules=LOGICAL_AXIS_RULES) -> PartitionSpec:
    """Map logical axis names to a `PartitionSpec` over mesh axes.

    A mesh axis is used at most once per spec (the first logical axis that asks
    for it wins), which keeps specs valid when two dims map to the same axis.
    """
    table = dict(rules)
    used: set[str] = set()
    out = []
    for name in logical_axes:
        if name is None:
            out.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no rule in the sharding table")
        target = table[name]
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        targets = tuple(t for t in targets if t not in used)
        used.update(targets)
        out.append(None if not targets else targets[0] if len(targets) == 1 else targets)
    return PartitionSpec(*out)


def resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Resolve a `(data, fsdp, tensor)` shape where one entry may be -1 ("the rest").

    Shorter shapes are padded with 1s. Raises `ValueError` when the product
    does not equal `num_devices`.
    """
    shape = list(mesh_shape) + [1] * (len(MESH_AXES) - len(mesh_shape))
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"mesh_shape {tuple(mesh_shape)} has more than {len(MESH_AXES)} axes")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh_shape {tuple(mesh_shape)}: at most one entry may be -1")
    if any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh_shape {tuple(mesh_shape)}: entries must be positive or -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known != 0:
            raise ValueError(
                f"mesh_shape {tuple(mesh_shape)} does not divide the {num_devices} devices"
            )
        shape[shape.index(-1)] = num_devices // known
    if math.prod(shape) != num_devices:
        raise ValueError(
            f"mesh_shape {tuple(mesh_shape)} needs {math.prod(shape)} devices, "
            f"but {num_devices} are available"
        )
    return tuple(shape)


def make_mesh(mesh_shape: Sequence[int], devices=None) -> jax.sharding.Mesh:
    """Build a mesh with axes `(data, fsdp, tensor)`, all of type `Auto`."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(mesh_shape, len(devices))
    return jax.make_mesh(
        shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )


def param_logical_axes(state: nnx.State) -> dict:
    """Pure-dict tree of logical-axis tuples (one per parameter) read from metadata."""

    def axes(v: nnx.Variable) -> LogicalAxes:
        names = v.get_metadata().get("logical_axes")
        if names is None:
            return (None,) * v.get_value().ndim
        return tuple(names)

    tree = jax.tree.map(axes, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


def param_shardings(state: nnx.State, mesh: jax.sharding.Mesh, rules=LOGICAL_AXIS_RULES) -> dict:
    """Pure-dict tree of `NamedSharding`s for the parameters in `state`."""
    specs = param_logical_axes(state)
    return jax.tree.map(
        lambda names: NamedSharding(mesh, logical_to_spec(names, rules)),
        specs,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def constrain(x: jax.Array, logical_axes: Sequence[str | None], rules=LOGICAL_AXIS_RULES):
    """`with_sharding_constraint` by logical names when a mesh is set, else identity.

    Activations get the same vocabulary as parameters, so one table steers both.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = logical_to_spec(logical_axes, rules)
    spec = PartitionSpec(*[_keep_axes(s, mesh.axis_names) for s in spec])
    return jax.lax.with_sharding_constraint(x, spec)


def _keep_axes(entry, names):
    if entry is None:
        return None
    entries = (entry,) if isinstance(entry, str) else tuple(entry)
    kept = tuple(e for e in entries if e in names)
    return None if not kept else kept[0] if len(kept) == 1 else kept


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int) -> NamedSharding:
    """Shard the leading (batch) dim over the data-parallel axes, replicate the rest."""
    return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1)))
