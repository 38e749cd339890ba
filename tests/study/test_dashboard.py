"""optuna-dashboard, the real one (the version the test extra installs), agrees with tuner: its
API's per-trial constraints give the feasible trials ``tuner status`` counts, the front its Pareto
plot draws from them is ``tuner status``'s front, and repeats of a scored candidate are not
completed trials that would crowd its list of best trials."""

import json
import threading
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import pytest
from cli import tuner
from helpers import write_tiny_space
from optuna.trial import TrialState

from tuner.study.results import rows
from tuner.study.storage import StudyPaths, make_storage


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):   # noqa: A002 (the base class's name)
        pass


@pytest.fixture
def dashboard():
    """``open(storage) -> get(path)``: optuna-dashboard's WSGI app served on 127.0.0.1, port 0."""
    import optuna_dashboard

    servers = []

    def open_(storage):
        server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(storage), handler_class=_Quiet)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)

        def get(path):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}{path}", timeout=60) as resp:
                return json.load(resp)
        return get

    yield open_
    for s in servers:
        s.shutdown()
        s.server_close()


def _dashboard_front(trials):
    """The Pareto front optuna-dashboard's plot draws: completed trials whose constraints are all
    <= 0, not dominated (accuracy up, latency down); equal points are both kept, as it keeps them."""
    feas = [t for t in trials if t["state"] == "Complete" and all(c <= 0 for c in t["constraints"])]
    return sorted(t["number"] for t in feas
                  if not any(o["values"] != t["values"] and o["values"][0] >= t["values"][0]
                             and o["values"][1] <= t["values"][1] for o in feas))


def test_the_dashboard_shows_tuners_feasible_trials_and_front(tmp_path, dashboard):
    space = write_tiny_space(tmp_path)
    # a floor the all-int8 baselines miss and the int16 plans meet, a ceiling some plans miss
    space.write_text(space.read_text().replace("  mode: pareto\n", "  mode: pareto\n  min_accuracy: 0.999\n"
                                                                    "  max_latency_ms: 0.9\n"))
    code = tuner("search", space, "--n-trials", 16, cwd=tmp_path)
    assert code.returncode == 0, code.stderr
    storage = make_storage(None, StudyPaths(tmp_path / "results" / "tiny"))
    study = optuna.load_study(study_name="tiny", storage=storage)
    mine = {r.number: r.feasible for r in rows(study)}
    assert any(mine.values()) and not all(mine.values())    # the floor cuts
    status = json.loads(tuner("status", "tiny", "--json", cwd=tmp_path).stdout)

    get = dashboard(storage)
    (summary,) = get("/api/studies")["study_summaries"]
    detail = get(f"/api/studies/{summary['study_id']}?after=0")
    complete = [t for t in detail["trials"] if t["state"] == "Complete"]
    assert {t["number"]: all(c <= 0 for c in t["constraints"]) for t in complete} == mine
    assert all(t["constraints"] for t in complete)           # the dashboard sees every trial's constraints
    assert _dashboard_front(detail["trials"]) == sorted(r["trial"] for r in status["front"])
    # its list of best trials (the front of all completed trials, feasible or not) holds tuner's
    # front and, besides it, only trials it marks infeasible: no repeat of a front trial
    best = {t["number"]: t for t in detail["best_trials"]}
    assert {n for n, t in best.items() if all(c <= 0 for c in t["constraints"])} == {r["trial"] for r in status["front"]}
    assert sum(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)) == len(complete)
