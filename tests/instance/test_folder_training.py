"""`subic train-instance` (`subic_keras.instance.folder_training`): a code
fine-tuned on a folder, its rules chosen there, a stopped run resumed."""

import numpy as np
import pytest

from subic_keras.cli import main
from subic_keras.instance import instance_code as instance
from subic_keras.serving.export import load_encoder


def test_train_instance_fine_tunes_on_a_folder_and_chooses_its_rules(
    instance_model, photos, tmp_path, capsys
):
    out = tmp_path / "mine.keras"
    argv = ["train-instance", str(photos), "--from", str(instance_model)]
    assert main([*argv, "--output", str(out), "--epochs", "1"]) == 0
    printed = capsys.readouterr().out
    assert "trained on 42 pictures" in printed and str(out) in printed
    assert "None" not in printed, printed
    assert "copies found first (recall@1) of 4 pictures held out" in printed
    assert " before, " in printed and " after" in printed
    rules = printed.splitlines()[-1]
    assert rules.startswith("copies: ") and (
        "precise on" in rules or "none chosen, because" in rules
    ), rules
    tuned = load_encoder(out)
    assert isinstance(tuned, instance.InstanceSubic)
    before = load_encoder(instance_model)
    assert not np.array_equal(
        tuned.model.get_layer("fc0").get_weights()[0],
        before.model.get_layer("fc0").get_weights()[0],
    )
    # The output is not replaced without --overwrite; a class model is no start.
    with pytest.raises(SystemExit):
        main([*argv, "--output", str(out)])
    assert "--overwrite" in capsys.readouterr().err


def test_train_instance_stopped_goes_on_from_its_last_epoch(
    instance_model, photos, tmp_path, capsys, monkeypatch
):
    from subic_keras.trainers import resuming

    out = tmp_path / "mine.keras"
    argv = ["train-instance", str(photos), "--from", str(instance_model)]
    argv += ["--output", str(out), "--epochs", "3"]
    save = resuming.EpochCheckpoints.on_epoch_end

    def stopped_after_two(self, epoch, logs=None):
        save(self, epoch, logs)
        if epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(resuming.EpochCheckpoints, "on_epoch_end", stopped_after_two)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 130
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.glob("mine.keras.*")) == [
        "mine.keras.epoch-2.keras",
        "mine.keras.resume.json",
    ]
    capsys.readouterr()
    monkeypatch.setattr(resuming.EpochCheckpoints, "on_epoch_end", save)
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "resumed after epoch 2 of 3" in captured.err
    assert "Epoch 3/3" in captured.out and "Epoch 1/3" not in captured.out
    # What was measured before the first epoch is the start's, not epoch 2's.
    assert " before, " in captured.out and "None" not in captured.out
    assert out.exists() and not list(tmp_path.glob("mine.keras.*"))
