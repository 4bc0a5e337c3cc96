"""A job's closing speed (coreecg.train.run_speed): totals over this command's epochs, the first
epoch apart, and the seconds from the command to the first step, from metrics.jsonl."""
import json

from coreecg.train.run_speed import run_speed, speed_line


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "epo')   # a line cut by a kill


def test_totals_not_medians_with_the_first_epoch_apart(tmp_path):
    _write(tmp_path / "metrics.jsonl", [
        {"kind": "epoch", "epoch": 1, "seconds": 50.0, "samples_per_s": 10.0, "time": 90.0},    # an earlier command
        {"event": "first_step", "step": 1, "time": 112.5},
        {"kind": "epoch", "epoch": 2, "seconds": 40.0, "samples_per_s": 100.0, "time": 150.0},  # compiles: slow
        {"kind": "step", "step": 5, "samples_per_s": 9999.0, "time": 151.0},                    # not an epoch
        {"kind": "epoch", "epoch": 3, "seconds": 10.0, "samples_per_s": 800.0, "time": 160.0},
        {"kind": "epoch", "epoch": 4, "seconds": 10.0, "samples_per_s": 1000.0, "time": 170.0},
    ])
    s = run_speed(tmp_path, since=100.0)
    assert s["epochs"] == 3 and s["samples"] == 4000 + 8000 + 10000 and s["seconds"] == 60.0
    assert s["samples_per_s"] == 22000 / 60                     # not the mean of the epochs' rates (633)
    assert s["samples_per_s_after_first_epoch"] == 18000 / 20
    assert s["first_step_s"] == 12.5
    line = speed_line(s)
    assert "366.7 samples/s over 3 epoch(s)" in line and "900.0 after the first" in line and "12.5 s" in line


def test_one_epoch_or_none(tmp_path):
    _write(tmp_path / "metrics.jsonl", [{"kind": "epoch", "seconds": 4.0, "samples_per_s": 2.0, "time": 5.0}])
    one = run_speed(tmp_path, since=0.0)
    assert one["samples_per_s"] == 2.0 and one["samples_per_s_after_first_epoch"] is None
    assert one["first_step_s"] is None
    none = run_speed(tmp_path / "missing", since=0.0)
    assert none["epochs"] == 0 and speed_line(none) == "speed: no epoch trained in this command"


def test_the_first_step_is_broken_down_into_start_up_phases(tmp_path, monkeypatch):
    """Where the seconds before the first step went: the driver's marks (this process) and rank 0's
    startup events, each phase from the end of the one before; a phase of an earlier command is not
    this command's."""
    from coreecg.train import run_speed as rs

    monkeypatch.setattr(rs, "_MARKS", {"ray": 104.0, "data": 110.5})
    _write(tmp_path / "metrics.jsonl", [
        {"event": "startup", "phase": "workers", "time": 50.0},             # an earlier command's
        {"event": "startup", "phase": "task", "time": 121.5},              # written before "workers"'s line
        {"event": "startup", "phase": "workers", "time": 121.0},
        {"event": "startup", "phase": "model", "time": 123.0},
        {"event": "startup", "phase": "start", "time": 123.5},
        {"event": "startup", "phase": "batch", "time": 124.0},
        {"event": "first_step", "step": 1, "time": 150.0},
        {"kind": "epoch", "epoch": 1, "seconds": 40.0, "samples_per_s": 100.0, "time": 160.0},
    ])
    s = run_speed(tmp_path, since=100.0)
    assert s["startup_s"] == {"ray": 4.0, "data": 6.5, "workers": 10.5, "task": 0.5, "model": 1.5, "start": 0.5,
                              "batch": 0.5, "first step": 26.0}
    assert sum(s["startup_s"].values()) == s["first_step_s"] == 50.0
    assert speed_line(s).endswith("first step 50.0 s after the command (ray 4.0, data 6.5, workers 10.5, task 0.5, "
                                  "model 1.5, start 0.5, batch 0.5, first step 26.0)")
    monkeypatch.setattr(rs, "_MARKS", {})          # no driver marks (Ray was up): the first phase holds them
    assert run_speed(tmp_path, since=100.0)["startup_s"] == {"workers": 21.0, "task": 0.5, "model": 1.5,
                                                             "start": 0.5, "batch": 0.5, "first step": 26.0}
    # a mark of a later fit in this process (after the workers' records): left out, never negative
    monkeypatch.setattr(rs, "_MARKS", {"ray": 104.0, "data": 130.0})
    phases = run_speed(tmp_path, since=100.0)["startup_s"]
    assert "data" not in phases and min(phases.values()) >= 0 and phases["workers"] == 17.0


def test_the_data_materialised_beside_the_workers_is_shown_within_their_phase(tmp_path, monkeypatch):
    """The split materialised while the worker group starts (coreecg.train.data_handoff) is no
    phase of its own: its seconds (from the "data" mark) are named inside "workers", and the
    phases still add up to the first step."""
    from coreecg.train import run_speed as rs

    monkeypatch.setattr(rs, "_MARKS", {})
    rs.mark("ray", 104.0)
    rs.mark("data", 105.0)
    rs.mark("materialised", None)                 # a fit without the handoff: nothing is marked
    assert "materialised" not in rs._MARKS
    rs.mark("materialised", 111.5)
    _write(tmp_path / "metrics.jsonl", [
        {"event": "startup", "phase": "workers", "time": 113.0},
        {"event": "first_step", "step": 1, "time": 120.0},
        {"kind": "epoch", "epoch": 1, "seconds": 10.0, "samples_per_s": 100.0, "time": 125.0},
    ])
    s = run_speed(tmp_path, since=100.0)
    assert s["startup_s"] == {"ray": 4.0, "data": 1.0, "workers": 8.0, "first step": 7.0}
    assert s["beside_s"] == {"materialised": 6.5}
    assert "(ray 4.0, data 1.0, workers 8.0 (data materialised beside them in 6.5), first step 7.0)" in speed_line(s)
    rs.mark("ray", 200.0)                         # the next fit in this process starts afresh
    assert rs._MARKS == {"ray": 200.0}


def test_a_new_fit_drops_the_last_fits_marks(monkeypatch):
    from coreecg.train import run_speed as rs

    monkeypatch.setattr(rs, "_MARKS", {"ray": 1.0, "data": 2.0})
    rs.mark("ray")
    assert list(rs._MARKS) == ["ray"] and rs._MARKS["ray"] > 2.0


def test_graphs_built_after_the_first_step_add_up_over_restarted_sessions(tmp_path):
    """A compiled run's count: each session's (a worker group restarted after a failure starts its
    count afresh, and compiles again at its own first step) summed; None for an eager run."""
    _write(tmp_path / "metrics.jsonl", [
        {"event": "first_step", "step": 1, "compiled": True, "graphs": 3, "time": 10.0},
        {"kind": "epoch", "seconds": 5.0, "samples_per_s": 10.0, "graphs_compiled_after_first_step": 1, "time": 20.0},
        {"kind": "epoch", "seconds": 5.0, "samples_per_s": 10.0, "graphs_compiled_after_first_step": 2, "time": 30.0},
        {"event": "first_step", "step": 3, "compiled": True, "graphs": 3, "time": 40.0},      # the restart
        {"kind": "epoch", "seconds": 5.0, "samples_per_s": 10.0, "graphs_compiled_after_first_step": 0, "time": 50.0},
    ])
    s = run_speed(tmp_path, since=0.0)
    assert s["graphs_compiled_after_first_step"] == 2
    assert "compiled: 2 graph(s) built after the first step" in speed_line(s)
    _write(tmp_path / "metrics.jsonl", [{"event": "first_step", "step": 1, "compiled": False, "time": 1.0},
                                        {"kind": "epoch", "seconds": 5.0, "samples_per_s": 10.0,
                                         "graphs_compiled_after_first_step": 0, "time": 2.0}])
    eager = run_speed(tmp_path, since=0.0)
    assert eager["graphs_compiled_after_first_step"] is None and "compiled" not in speed_line(eager)
