"""Every field `load_task` reads from task.json and leaderboard.json is checked, and a bad one
is a TaskError naming the file and the field: a NaN reference score used to load (it counts
as better than every submission, so no percentile could reach 1), a list as `split` loaded,
and a string `provenance` raised a bare ValueError from `dict()`."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from tests.support.autoresearch_fixtures import make_tiny_task
from wmrl.autoresearch.env.metrics import percentile
from wmrl.autoresearch.env.task import TaskError, load_task


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return make_tiny_task(tmp_path_factory.mktemp("good") / "good").root


def copy_of(good, tmp_path):
    d = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
    shutil.copytree(good, d)
    return d


def refused(d) -> str:
    with pytest.raises(TaskError) as e:
        load_task(d)
    message = str(e.value)
    assert "\n" not in message  # one line
    return message


def with_meta(good, tmp_path, **fields):
    d = copy_of(good, tmp_path)
    meta = json.loads((d / "task.json").read_text())
    meta.update(fields)
    (d / "task.json").write_text(json.dumps(meta))  # NaN and Infinity as JSON allows
    return d


def with_board(good, tmp_path, text: str):
    d = copy_of(good, tmp_path)
    (d / "leaderboard.json").write_text(text)
    return d


def test_the_good_task_loads_as_written(good):
    task = load_task(good)
    assert task.reference_scores == (0.5, 0.7, 0.9) and task.split == "train"
    assert task.provenance == {"source": "user CSV", "licence": "unknown"}


NON_FINITE = [float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_non_finite_reference_scores_are_refused(good, tmp_path, bad):
    # What a NaN reference did to the reward: an exact copy of the best baseline (0.9, top
    # of the board) stays below the 0.5 + 0.5 * 5/6 it has among the finite references.
    assert percentile(0.9, [0.5, 0.7, 0.9, math.nan], True) == 2.5 / 4
    board = json.dumps({"metric": "accuracy", "scores": [0.5, 0.7, bad]})
    message = refused(with_board(good, tmp_path, board))
    assert "leaderboard.json" in message and "scores" in message and "finite" in message


@pytest.mark.parametrize(
    "scores,needle",
    [
        ([0.5, "0.7"], "number"),  # float("0.7") used to accept it
        ([0.5, True], "number"),
        ([0.5, None], "number"),
        ([0.5, [0.7]], "number"),
        ("0.5", "list"),
        ({"a": 0.5}, "list"),
        (None, "list"),
        ([0.5, 1.5], "between 0 and 1"),  # no accuracy is above 1
        ([-0.25, 0.5], "between 0 and 1"),
    ],
)
def test_reference_scores_must_be_numbers_the_metric_can_give(good, tmp_path, scores, needle):
    message = refused(with_board(good, tmp_path, json.dumps({"scores": scores})))
    assert "leaderboard.json" in message and "scores" in message and needle in message


def test_the_leaderboard_file_itself(good, tmp_path):
    assert "leaderboard.json" in refused(with_board(good, tmp_path, "[0.5, 0.7]"))
    assert "leaderboard.json" in refused(with_board(good, tmp_path, '{"scores": [0.5'))
    assert "leaderboard.json" in refused(with_board(good, tmp_path, "[" * 100_000))
    d = copy_of(good, tmp_path)
    (d / "leaderboard.json").write_bytes(b'{"scores": [0.5], "x": "\xff"}')
    assert "leaderboard.json is not valid JSON" in refused(d)
    message = refused(with_board(good, tmp_path, json.dumps({"metric": "rmse", "scores": [1]})))
    assert "leaderboard.json" in message and "'rmse'" in message and "accuracy" in message
    empty = load_task(with_board(good, tmp_path, json.dumps({"scores": []})))
    assert empty.reference_scores == ()  # a task whose baselines have not run yet


def test_regression_scores_have_the_metric_s_range(tmp_path):
    from tests.support.autoresearch_fixtures import tiny_classification_df
    from wmrl.autoresearch.env.make_task import write_task

    df = tiny_classification_df().assign(label=lambda f: f["a"] * 2.0)
    root = write_task(df, tmp_path / "reg", task_id="reg", target="label", metric="rmse")
    (root / "leaderboard.json").write_text(json.dumps({"scores": [0.1, 2.5e3]}))
    assert load_task(root).reference_scores == (0.1, 2500.0)
    (root / "leaderboard.json").write_text(json.dumps({"scores": [0.1, -1.0]}))
    assert "at least 0" in refused(root)


@pytest.mark.parametrize("bad", [["train"], "test", "", 3, None, {"train": 1}])
def test_split_must_be_train_or_heldout(good, tmp_path, bad):
    message = refused(with_meta(good, tmp_path, split=bad))
    assert "split" in message and "'train'" in message and "'heldout'" in message


def test_split_heldout_loads(good, tmp_path):
    assert load_task(with_meta(good, tmp_path, split="heldout")).split == "heldout"


@pytest.mark.parametrize("bad", ["CC-BY", ["source", "licence"], [["source", "x"]], 7, None])
def test_provenance_must_be_an_object(good, tmp_path, bad):
    message = refused(with_meta(good, tmp_path, provenance=bad))
    assert "provenance" in message and "object" in message


@pytest.mark.parametrize("field", ["source", "licence", "notes"])
def test_provenance_texts_are_texts(good, tmp_path, field):
    message = refused(with_meta(good, tmp_path, provenance={field: ["x"]}))
    assert f"provenance.{field}" in message


@pytest.mark.parametrize("text", ["[]", '"id type metric target id_column time_limit_s memory_mb"',
                                  "7", "null"])  # fmt: skip
def test_task_json_must_be_an_object(good, tmp_path, text):
    d = copy_of(good, tmp_path)
    (d / "task.json").write_text(text)
    message = refused(d)
    assert "task.json" in message and "object" in message


def test_task_json_that_cannot_be_read(good, tmp_path):
    d = copy_of(good, tmp_path)
    (d / "task.json").write_bytes(b'{"id": "\xff"}')
    assert "task.json is not valid JSON" in refused(d)


@pytest.mark.parametrize("field", ["type", "metric"])
@pytest.mark.parametrize("bad", [["accuracy"], {"a": 1}, 3, None])
def test_type_and_metric_of_the_wrong_kind(good, tmp_path, field, bad):
    message = refused(with_meta(good, tmp_path, **{field: bad}))
    assert field in message


def test_target_of_the_wrong_kind(good, tmp_path):
    assert "target must be a column name" in refused(with_meta(good, tmp_path, target=["label"]))


@pytest.mark.parametrize(
    "text", ['"a competition"', '["competition"]', "[" * 100_000 + "]" * 100_000]
)
def test_a_task_json_that_is_no_object_is_one_task_error(good, tmp_path, text):
    """Not handed to the competition loader because its text holds the word (a string or a
    list), nor a traceback from the nesting depth: one TaskError naming task.json."""
    d = copy_of(good, tmp_path)
    (d / "task.json").write_text(text)
    assert "task.json" in refused(d)
