"""Helpers shared by the embodied tests."""

import json

from wmrl.embodied import stages


def stage_saved_without(stage_dir, config, field: str):
    """A finished `wm` stage of `config` whose done.json lacks `field` (as a stage saved before
    the field existed); returns its folder."""
    stage_dir.mkdir()
    stages.finish_stage(stage_dir, config, {"x": 1})
    saved = json.loads((stage_dir / "done.json").read_text())
    del saved["config"][field]
    (stage_dir / "done.json").write_text(json.dumps(saved))
    return stage_dir
