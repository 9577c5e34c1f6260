"""TensorBoard scalars are on disk when a flush returns (a run killed after it loses none of
the steps its checkpoint has seen), and a resumed run's file hides what earlier files logged
at the steps it redoes."""

from tests.support.run_records import tensorboard_scalars
from wmrl import storage


def test_a_flush_puts_every_scalar_added_before_it_on_disk(tmp_path):
    writer = storage.tensorboard_writer(tmp_path, purge_step=0)
    expected = {("eval/reward", step, float(step) / 8) for step in range(2000)}
    for tag, step, value in sorted(expected, key=lambda s: s[1]):
        writer.add_scalar(tag, value, step)
    writer.flush()  # not closed: as a run killed right after the flush leaves it
    assert set(tensorboard_scalars(tmp_path)) == expected
    writer.close()


def test_a_resumed_writer_hides_the_steps_it_redoes(tmp_path, monkeypatch):
    first = storage.tensorboard_writer(tmp_path, purge_step=0)
    for step in (1, 2, 3):
        first.add_scalar("step/loss", 10.0 + step, step)
    first.flush()
    now = storage.time.time()
    monkeypatch.setattr(storage.time, "time", lambda: now + 5)  # event files are named by second
    import tensorboardX.event_file_writer as efw

    monkeypatch.setattr(efw.time, "time", lambda: now + 5)
    resumed = storage.tensorboard_writer(tmp_path, purge_step=3)
    for step in (3, 4):
        resumed.add_scalar("step/loss", 20.0 + step, step)
    resumed.close()
    assert len(list(tmp_path.iterdir())) == 2
    shown = tensorboard_scalars(tmp_path)
    assert sorted(shown) == [("step/loss", 1, 11.0), ("step/loss", 2, 12.0),
                             ("step/loss", 3, 23.0), ("step/loss", 4, 24.0)]  # fmt: skip
