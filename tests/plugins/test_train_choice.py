"""aiacc.plugins.train_choice: the measured choice between aiacc's step and the framework compiler's, on
stand-in steps (no framework): the faster is kept only past the margin, a failing or numerically different
alternative is left out with a warning, the settings True/False skip measuring."""
import time
import warnings

import numpy as np
import pytest

from aiacc.errors import AiaccNotice, OptionError
from aiacc.plugins.train_choice import (FAILED, GRADIENT_DIFFERS, LOSS_DIFFERS, NOISE_EPS, attach, choose, compare,
                                        noise_floor, option, perturb, same_results)


class Model:
    def __init__(self, seconds, result=1.0, fail=False):
        self.seconds, self.result, self.fail = seconds, result, fail


def step_of(m):
    def step():
        if m.fail:
            raise RuntimeError("compiler refused the graph")
        time.sleep(m.seconds)
        return [np.array(m.result)]
    return step


def run(base, compiled, setting="auto", more=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = choose("aiacc graph", lambda: compiled, step_of, base, setting, "the compiler", rounds=3,
                     to_arrays=lambda r: r, more=more)
    return out, [str(w.message) for w in caught if issubclass(w.category, AiaccNotice)]


def test_a_clearly_faster_compiled_step_is_chosen_and_said():
    base, fast = Model(0.02), Model(0.002)
    (chosen, choice), said = run(base, fast)
    assert chosen is fast and choice.path == "aiacc graph + the compiler"
    assert choice.ms["aiacc graph"] > choice.ms["aiacc graph + the compiler"]
    assert any("runs the step as aiacc graph + the compiler" in s for s in said)


def test_a_slower_compiled_step_is_not_chosen():
    base, slow = Model(0.002), Model(0.02)
    (chosen, choice), said = run(base, slow)
    assert chosen is base and "no faster" in choice.reason and not said


def test_failing_or_different_alternatives_are_left_out_with_a_warning():
    base = Model(0.01)
    (chosen, choice), said = run(base, Model(0.0, fail=True), more={"other": lambda: Model(0.0, result=2.0)})
    assert chosen is base
    assert "compiler refused the graph" in choice.reason and "the loss differs" in choice.reason
    assert len(said) == 2
    # the same, as codes a plugin reads without matching the reason's text
    assert choice.left_out == {"aiacc graph + the compiler": FAILED, "other": LOSS_DIFFERS}
    assert choice.refused(LOSS_DIFFERS) == ["other"] and choice.refused(FAILED, "compiler") == [
        "aiacc graph + the compiler"] and choice.refused(LOSS_DIFFERS, "compiler") == []


def test_compare_codes_which_result_differs():
    one = [np.ones(1), np.ones(3)]
    assert compare(one, one) == ("", "")
    assert compare(one, [np.zeros(1), np.ones(3)])[0] == LOSS_DIFFERS
    assert compare(one, [np.ones(1), np.zeros(3)]) == (GRADIENT_DIFFERS, "gradient 0 differs (1.0e+00 relative)")
    assert compare(one, one[:1])[0] == GRADIENT_DIFFERS


def test_true_and_false_do_not_measure():
    base, fast = Model(0.0, fail=True), Model(0.0, fail=True)  # a measured step would raise
    chosen, choice = choose("g", lambda: fast, step_of, base, False, "c")
    assert chosen is base and choice.reason == "framework_compile=False"
    chosen, choice = choose("g", lambda: fast, step_of, base, True, "c")
    assert chosen is fast and choice.path == "g + c"


def test_option_and_results_checks():
    assert option({}) == "auto" and option({"framework_compile": False}) is False
    with pytest.raises(OptionError, match="framework_compile must be"):
        option({"framework_compile": 3})
    assert same_results([np.ones(3)], [np.ones(3) * (1 + 1e-6)]) == ""
    assert "gradient 0 differs" in same_results([np.ones(1), np.ones(3)], [np.ones(1), np.zeros(3)])
    m = attach(Model(0), choose("g", lambda: None, step_of, Model(0), False, "c")[1])
    assert m.aiacc_train_path == "g"


def test_gradients_compare_by_relative_norm_and_the_loss_elementwise():
    g = np.random.default_rng(0).standard_normal(100_000)
    moved = g.copy()
    moved[:2] = moved[1::-1]  # a gradient routed to the neighbour of a near-tie (max pool under a compiler)
    assert np.abs(moved - g).max() > 1e-4 * np.abs(g).max()  # elementwise it differs; in norm it is noise
    assert same_results([np.ones(1), g], [np.ones(1), moved]) == ""
    assert "gradient 0 differs" in same_results([np.ones(1), g], [np.ones(1), g * 1.05])
    assert "gradient 0 has shape" in same_results([np.ones(1), g], [np.ones(1), g[:10]])
    assert "not finite" in same_results([np.ones(1), g], [np.ones(1), g * np.nan])
    assert "the loss differs" in same_results([np.ones(1), g], [np.ones(1) * (1 + 1e-3), g])


def test_the_fastest_of_several_is_chosen_and_the_warning_gives_every_time():
    base = Model(0.02)
    (chosen, choice), said = run(base, Model(0.01), more={"original": lambda: Model(0.002)})
    assert choice.path == "original" and chosen.seconds == 0.002
    assert set(choice.ms) == {"aiacc graph", "aiacc graph + the compiler", "original"}
    assert len(said) == 1 and all(f"{k} {v:.1f} ms" in said[0] for k, v in choice.ms.items())


def test_a_candidates_name_is_used_unmeasured_and_another_name_is_refused_naming_them():
    base, other = Model(0.0, fail=True), Model(0.0, fail=True)  # a measured step would raise
    more = {"original": lambda: other}
    chosen, choice = choose("g", lambda: None, step_of, base, "original", "c", more=more)
    assert chosen is other and choice.path == "original" and not choice.ms
    assert choose("g", lambda: None, step_of, base, "g", "c", more=more)[0] is base
    with pytest.raises(OptionError, match="'g', 'g \\+ c', 'original'\\), not 'yes'"):
        choose("g", lambda: None, step_of, base, "yes", "c", more=more)


def test_a_gradient_that_rounding_alone_moves_may_differ_by_its_noise_floor_and_no_more():
    """Near-ties (a max pool's argmax after a BatchNorm) make some gradients move by ~1e-2 of their norm
    under a rounding-level change of the inputs; another compiler's rounding moves them as much, so such a
    gradient may differ by NOISE_FACTOR times that floor (capped at NOISE_CAP), a steady one only by GRAD_RTOL."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal(10_000)
    direction = rng.standard_normal(10_000)
    direction *= np.linalg.norm(g) / np.linalg.norm(direction)
    noisy = g + 0.025 * direction  # 2.5e-2 relative: TF's resnet_small BatchNorm gradients under XLA
    assert "gradient 0 differs (2.5e-02 relative)" in same_results([np.ones(1), g], [np.ones(1), noisy])
    floor = noise_floor([np.ones(1), g], [np.ones(1), g + 0.02 * rng.standard_normal(10_000)
                                          * np.linalg.norm(g) / 100])
    assert 0.015 < floor[0] / np.linalg.norm(g) < 0.025
    assert same_results([np.ones(1), g], [np.ones(1), noisy], floor=floor) == ""
    # beyond twice the floor, or the cap on a gradient that rounding moves a lot, it still differs
    far = g + 0.06 * direction
    assert "rounding noise 2.0e-02" in same_results([np.ones(1), g], [np.ones(1), far], floor=floor)
    assert "differs" in same_results([np.ones(1), g], [np.ones(1), g + 0.2 * direction],
                                     floor=[0.5 * np.linalg.norm(g)])
    # the floor is the steady gradient's own: a zero floor keeps GRAD_RTOL
    assert "differs" in same_results([np.ones(1), g], [np.ones(1), noisy], floor=[0.0])


def test_perturb_scales_floats_at_rounding_level_and_leaves_integers():
    x = np.linspace(1.0, 2.0, 1000, dtype=np.float32)
    y = perturb(x)
    assert y.dtype == np.float32 and np.allclose(np.abs(y / x - 1), NOISE_EPS, rtol=0.2)
    ids = np.arange(5, dtype=np.int32)
    assert perturb(ids) is ids or np.array_equal(perturb(ids), ids)


class Noisy(Model):
    """A stand-in whose step returns (loss, gradient): the gradient as given."""

    def __init__(self, seconds, grad):
        super().__init__(seconds)
        self.grad = grad


def noisy_step_of(m):
    def step():
        time.sleep(m.seconds)
        return [np.array(1.0), m.grad]
    return step


def test_choose_uses_the_perturbed_steps_floor_for_a_tie_moved_gradient():
    rng = np.random.default_rng(1)
    g = rng.standard_normal(4096)
    moved = g + 0.025 * np.linalg.norm(g) / 64 * rng.standard_normal(4096)  # 2.5e-2 relative
    perturbed = g + 0.02 * np.linalg.norm(g) / 64 * rng.standard_normal(4096)
    base, fast = Noisy(0.02, g), Noisy(0.002, moved)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refused, why = choose("g", lambda: fast, noisy_step_of, base, "auto", "c", rounds=3, to_arrays=list)
        chosen, choice = choose("g", lambda: fast, noisy_step_of, base, "auto", "c", rounds=3, to_arrays=list,
                                perturbed=lambda: [np.array(1.0), perturbed])
    assert refused is base and "gradient 0 differs" in why.reason
    assert chosen is fast and choice.path == "g + c"


# ------------------------------------------------------------------ decide: the rule on synthetic timings
def test_decide_pairs_rounds_so_a_load_change_over_whole_rounds_cancels():
    from aiacc.plugins.train_choice import decide

    # the machine 5x slower in rounds 2-3: the medians of raw times barely separate, every paired ratio is 0.9
    times = {"g": [1.0, 1.0, 5.0, 5.0, 1.0], "c": [0.9, 0.9, 4.5, 4.5, 0.9]}
    d = decide(times, "g")
    assert d.path == "c" and d.settled and d.rounds == 5
    assert d.ratios["c"] == pytest.approx((0.9, 0.9, 0.9))


def test_decide_keeps_the_kept_candidate_on_a_tie_and_within_the_margin():
    from aiacc.plugins.train_choice import MARGIN, decide

    # within the margin, tightly: settled, not chosen
    d = decide({"g": [1.0] * 5, "c": [0.99, 0.985, 0.99, 0.995, 0.99]}, "g")
    assert d.path == "g" and d.settled
    # the same speed with a wide spread (ratios from 0.8 to 1.2): undecided, the kept one stays
    d = decide({"g": [1.0] * 5, "c": [0.8, 1.2, 0.9, 1.1, 1.0]}, "g")
    assert d.path == "g" and not d.settled and d.ratios["c"][0] < MARGIN < 1.0 < d.ratios["c"][2]
    # the kept candidate need not be the first (nor aiacc's): a tie keeps whichever is named
    times = {"g": [0.8, 1.2, 0.9, 1.1, 1.0], "orig": [1.0] * 5}
    assert decide(times, "orig").path == "orig" and decide(times, "g").path == "g"


def test_decide_needs_the_spread_below_one_and_picks_the_lowest_median_ratio():
    from aiacc.plugins.train_choice import decide

    # median ratio 0.8 but two rounds in five slower than the kept step: not yet clearly faster
    d = decide({"g": [1.0] * 5, "c": [0.8, 1.3, 0.8, 1.3, 0.8]}, "g")
    assert d.ratios["c"][1] == pytest.approx(0.8) and d.ratios["c"][2] > 1.0
    assert d.path == "g" and not d.settled
    # two clearly faster: the lower median ratio wins; a clearly slower one is settled too
    d = decide({"g": [1.0] * 5, "a": [0.9] * 5, "b": [0.7, 0.75, 0.7, 0.72, 0.7], "s": [2.0] * 5}, "g")
    assert d.path == "b" and d.settled and d.ratios["s"][1] == pytest.approx(2.0)


def test_interleaved_times_stops_when_the_callers_rule_is_settled_or_at_the_cap():
    from aiacc.plugins.timing import interleaved_times

    fns = {"a": lambda: None, "b": lambda: None}
    t = interleaved_times(fns, rounds=3, max_rounds=11, settled=lambda ts: len(ts["a"]) >= 7)
    assert len(t["a"]) == len(t["b"]) == 7
    t = interleaved_times(fns, rounds=3, max_rounds=11, settled=lambda ts: False)
    assert len(t["a"]) == 11
    t = interleaved_times(fns, rounds=3, max_rounds=11, settled=lambda ts: True)
    assert len(t["a"]) == 3


def test_the_choice_says_the_paired_ratio_and_the_rounds():
    base, fast = Model(0.02), Model(0.002)
    (chosen, choice), said = run(base, fast)
    assert chosen is fast and "paired ratio" in choice.reason and "interleaved rounds" in choice.reason
    (chosen, choice), said = run(Model(0.002), Model(0.02))
    assert "closest aiacc graph + the compiler: paired ratio" in choice.reason


def test_alternatives_past_the_build_budget_are_left_out_and_build_times_are_kept(monkeypatch):
    """Each alternative's build + first step (a compile) is timed into TrainChoice.build_s and, from a
    second on, said in the reason; once those times pass MAX_BUILD_SECONDS the alternatives not yet built
    are left out (SKIPPED, said), so a plugin offering several compiled candidates bounds optimize's time."""
    from aiacc.plugins import train_choice

    class Slow(Model):  # its first step "compiles" for 1.1 s
        first = True

    def slow_step_of(m):
        step = step_of(m)

        def run_():
            if isinstance(m, Slow) and m.first:
                m.first = False
                time.sleep(1.1)
            return step()
        return run_

    monkeypatch.setattr(train_choice, "MAX_BUILD_SECONDS", 1.0)
    base = Model(0.002)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, choice = choose("aiacc graph", lambda: Slow(0.002), slow_step_of, base, "auto", "the compiler",
                           rounds=3, to_arrays=lambda r: r, more={"later": lambda: Model(0.002)})
    assert set(choice.build_s) == {"aiacc graph + the compiler"} and choice.build_s["aiacc graph + the compiler"] >= 1.1
    assert choice.left_out == {"later": train_choice.SKIPPED} and "later" not in choice.ms
    assert "later not built: the alternatives before it took 1 s" in choice.reason
    assert "built and first step in aiacc graph + the compiler 1.1 s" in choice.reason


def test_perturb_keeps_a_zero_dimensional_array_an_array():
    y = perturb(np.array(1.5, dtype=np.float32))
    assert isinstance(y, np.ndarray) and y.shape == () and y.dtype == np.float32
    assert abs(float(y) / 1.5 - 1) == pytest.approx(NOISE_EPS, rel=0.2)
