"""tuner sensitivity: per calibration method, and a space's gains shared with its study."""

import json

from cli import tuner as run
from helpers import write_tiny_space

from tuner.study.session import StudySession


def test_sensitivity_per_calibration_method(tiny_project):
    r = run("sensitivity", tiny_project, "--calibration", "max,kl,max:0.9999+pc", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    by = data["by_calibration"]
    assert [b["calibration"] for b in by] == ["max", "kl:num_bin=1024,max_num_bin=16384",
                                              "max-percentile:percentile=0.9999,per_channel"]
    gains = [{row["node"]: row["gain"] for row in b["nodes"]} for b in by]
    assert gains[0].keys() == gains[1].keys() == gains[2].keys()
    assert any(abs(gains[0][n] - gains[1][n]) > 1e-6 for n in gains[0])    # the method changes the ranking input
    table = run("sensitivity", tiny_project, "--calibration", "max,kl", "--top", 2)
    assert table.returncode == 0 and "gain max" in table.stdout and "gain kl" in table.stdout
    bad = run("sensitivity", tiny_project, "--calibration", "max,entropy")
    assert bad.returncode == 2 and "'entropy'" in bad.stderr and "Traceback" not in bad.stderr


def test_sensitivity_of_a_space_is_the_studys_cache(tmp_path):
    space = write_tiny_space(tmp_path)
    r = run("sensitivity", space, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cache = tmp_path / "results" / "tiny" / "sensitivity.json"
    stored = json.loads(cache.read_text())
    printed = {row["node"]: {"cpu": row["cpu_gain"], "int16": row["int16_gain"]} for row in json.loads(r.stdout)["nodes"]}
    assert printed == {n: {"cpu": g["cpu"], "int16": g.get("int16")} for n, g in stored["gains"].items()}
    # the search reads the same file instead of recomputing: a marker value comes back
    node = next(iter(stored["gains"]))
    stored["gains"][node]["cpu"] = 123.0
    cache.write_text(json.dumps(stored))
    search = StudySession.open(space, results_dir=tmp_path / "results", quiet=True)
    assert search.problem.sensitivity[node] == 123.0


def test_an_interrupted_ranking_keeps_its_finished_part_and_continues(tmp_path):
    """Ctrl-C in the per-node loop (here: from the progress callback, where a real Ctrl-C
    lands as often as anywhere) writes the finished nodes; the next run computes only the rest."""
    import pytest

    from tuner.sensitivity import best_gain
    from tuner.study.space import load_space
    from tuner.study.warmstart import node_sensitivity
    from tuner.workspace import Workspace

    space = load_space(write_tiny_space(tmp_path))
    ws = Workspace.for_space(space)
    cache = tmp_path / "results" / "tiny" / "sensitivity.json"

    def stop_after_3(i, n):
        if i == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        node_sensitivity(space, ws, cache, stop_after_3)
    partial = json.loads(cache.read_text())
    assert partial["partial"] is True and len(partial["gains"]) == 3
    calls = []
    gains = node_sensitivity(space, ws, cache, lambda i, n: calls.append((i, n)))
    n = calls[-1][1]
    assert calls[0] == (4, n) and len(calls) == n - 3          # only the nodes not done before
    assert {k: gains[k] for k in partial["gains"]} == {k: best_gain(g) for k, g in partial["gains"].items()}
    assert "partial" not in json.loads(cache.read_text())
    fresh = node_sensitivity(space, ws, tmp_path / "fresh.json")
    assert gains == pytest.approx(fresh, abs=1e-12)
    assert node_sensitivity(space, ws, cache, lambda i, n: calls.append("again")) == gains and calls[-1] != "again"


def test_an_interrupted_ranking_of_a_yaml_continues_from_the_cache(tiny_project, tmp_path, monkeypatch):
    import pytest

    from tuner.rank import rank

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    stop = [True]

    def stop_after_3(label):
        def show(i, n):
            calls.append((label, i))
            if label == "leave-one-fixed" and i == 3 and stop[0]:
                stop[0] = False
                raise KeyboardInterrupt
        return show

    with pytest.raises(KeyboardInterrupt):
        rank(tiny_project, progress=stop_after_3)
    (cached,) = (tmp_path / "cache" / "sensitivity").glob("*.json")
    partial = json.loads(cached.read_text())
    assert partial["partial"] is True and len(partial["gains"]) == 3
    calls.clear()
    result = rank(tiny_project, progress=stop_after_3)
    first = [i for label, i in calls if label == "leave-one-fixed"]
    assert first[0] == 4                                            # the three finished nodes are not redone
    gains = {r.node: r.gains for r in result.runs[0].rows}
    assert {k: gains[k] for k in partial["gains"]} == partial["gains"]
    assert "partial" not in json.loads(cached.read_text())


def test_a_rerun_on_the_same_yaml_is_answered_from_the_cache(tiny_project, tmp_path, monkeypatch):
    """Both halves (the per-fix gains and the alone-quantized table) are cached, keyed by the model,
    data, YAML and tuner's version; a changed YAML is ranked again (issue 25 item 8)."""
    import tuner.rank
    import tuner.sensitivity

    calls = {"alone": 0, "gains": 0}
    table, gains = tuner.rank.sensitivity_table, tuner.sensitivity.leave_one_fixed

    def counted_table(*a, **k):
        calls["alone"] += 1
        return table(*a, **k)

    def counted_gains(*a, **k):
        calls["gains"] += 1
        return gains(*a, **k)

    monkeypatch.setattr(tuner.rank, "sensitivity_table", counted_table)
    monkeypatch.setattr(tuner.rank, "leave_one_fixed", counted_gains)
    env = {"TUNER_CACHE_DIR": str(tmp_path / "cache")}
    first = run("sensitivity", tiny_project, env=env)
    assert first.returncode == 0, first.stderr
    assert calls == {"alone": 1, "gains": 1} and "from the cache" not in first.stderr
    again = run("sensitivity", tiny_project, env=env)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert calls == {"alone": 1, "gains": 1} and "node sensitivity: from the cache" in again.stderr
    tiny_project.write_text(tiny_project.read_text().replace("per_channel: False", "per_channel: True"))
    changed = run("sensitivity", tiny_project, env=env)
    assert changed.returncode == 0 and calls == {"alone": 2, "gains": 2} and "from the cache" not in changed.stderr


def test_the_opt_in_integer_kernels_do_not_reuse_a_ranking_made_without_them(tmp_path, monkeypatch):
    """TUNER_INTCONV=1 (tuner.simulate.intconv) changes every simulated gain: a cached ranking of the plain
    simulator is not answered from the file, it is computed again (and the other way round)."""
    from tuner.study.space import load_space
    from tuner.study.warmstart import node_sensitivity
    from tuner.workspace import Workspace

    space = load_space(write_tiny_space(tmp_path))
    cache = tmp_path / "sensitivity.json"
    node_sensitivity(space, Workspace.for_space(space), cache)
    calls: list = []
    node_sensitivity(space, Workspace.for_space(space), cache, lambda i, n: calls.append(i))
    assert calls == []                                        # the same simulator: from the file
    monkeypatch.setenv("TUNER_INTCONV", "1")
    node_sensitivity(space, Workspace.for_space(space), cache, lambda i, n: calls.append(i))
    assert calls                                              # the integer kernels: computed again
