"""The fidelity suite's order check: near-ties of the real tool are one tie on both sides."""

from tuner.toolchain.compare import spearman
from tuner.toolchain.fidelity import tie_near


def test_configs_within_the_tie_of_each_other_rank_as_one():
    real = [0.9097, 0.9102, 0.9100, 0.9945, 0.9946, 0.9998, 0.9075]
    sim = [0.9097, 0.9096, 0.9102, 0.9946, 0.9945, 0.9998, 0.9076]    # near-ties ordered the other way round
    assert spearman(sim, real) < 0.9
    s, r = tie_near(sim, real, 0.001)
    assert r[0] == r[1] == r[2] and s[0] == s[1] == s[2] and r[3] == r[4]
    assert r[6] != r[0] and r[5] != r[3]                 # 0.0022 and 0.005 apart: not tied
    assert spearman(s, r) == 1.0
    # a real order the simulation gets wrong across the tie is still caught
    wrong = [0.9097, 0.9096, 0.9102, 0.9946, 0.9945, 0.9900, 0.9076]
    assert spearman(*tie_near(wrong, real, 0.001)) < 0.9


def test_a_chain_of_small_steps_is_one_group():
    s, r = tie_near([1.0, 2.0, 3.0], [0.9000, 0.9008, 0.9016], 0.001)
    assert r == [r[0]] * 3 and s == [2.0, 2.0, 2.0]
