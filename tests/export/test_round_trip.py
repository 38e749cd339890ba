"""best.yaml from a real search is the user's base YAML as written: comments, quoting, key order and
``false`` / ``no`` stay; tuner's header comes first and only tuner's keys change."""

import yaml
from cli import tuner
from helpers import write_tiny_space

from tuner.inputs.config import load_config


def test_best_yaml_keeps_the_users_comments_and_spelling(tmp_path):
    space = write_tiny_space(tmp_path)
    base = tmp_path / "tiny" / "hb_config.yaml"
    text = base.read_text()
    text = ("# detector config, hand-tuned: keep these notes\n"
            + text.replace("  march: 'bayes-e'\n", "  march: \"bayes-e\"   # RDK X5\n  layer_out_dump: false\n")
                  .replace("  debug: False\n", "  debug: no\n")
                  .replace("compiler_parameters:\n", "# compiler: latency first\ncompiler_parameters:\n"))
    base.write_text(text)
    r = tuner("search", space, "--n-trials", 8, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    best = (tmp_path / "results" / "tiny" / "best.yaml").read_text()
    header, _, body = best.partition("# detector config")
    assert header.startswith("# hb_mapper makertbin config exported by tuner")
    for line in ("  march: \"bayes-e\"   # RDK X5", "  layer_out_dump: false", "  debug: no",
                 "# compiler: latency first", "  optimize_level: 'O3'", "  input_name: 'x'"):
        assert line in body.splitlines(), line
    parsed = yaml.safe_load(best)
    if parsed["calibration_parameters"]["per_channel"] is False:      # not changed: as written
        assert "  per_channel: False" in body.splitlines()
    sections = [ln[:-1] for ln in body.splitlines() if ln.endswith(":") and not ln.startswith((" ", "#"))]
    assert sections == ["model_parameters", "input_parameters", "calibration_parameters", "compiler_parameters"]
    assert parsed["model_parameters"]["layer_out_dump"] is False and parsed["compiler_parameters"]["debug"] is False
    assert load_config(tmp_path / "results" / "tiny" / "best.yaml")     # hb_mapper's schema rules
