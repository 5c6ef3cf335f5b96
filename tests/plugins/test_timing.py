"""aiacc.plugins.timing: the interleaved timer every measured choice uses (training step, backend='auto',
torch int8 kernels)."""
import time

from aiacc.plugins.timing import interleaved_medians, interleaved_times


def test_medians_keep_the_faster_and_count_warm_up_plus_rounds():
    calls = {"slow": 0, "fast": 0}

    def slow():
        calls["slow"] += 1
        time.sleep(0.03)

    ms = interleaved_medians({"slow": slow, "fast": lambda: calls.__setitem__("fast", calls["fast"] + 1)},
                             rounds=3, warmup=1)
    assert ms["slow"] > 25 > ms["fast"] and calls == {"slow": 4, "fast": 4}  # one warm-up call, then 3 rounds


def test_rounds_are_rotated_so_no_candidate_always_follows_the_same_one():
    order = []
    interleaved_times({k: (lambda k=k: order.append(k)) for k in "abc"}, rounds=3)
    assert order == list("abc" "bca" "cab")


def test_a_close_call_is_measured_longer_up_to_max_rounds():
    every = float("inf")  # any two medians count as close: the extension itself is what is tested
    fns = {"a": lambda: None, "b": lambda: None}
    assert len(interleaved_times(fns, rounds=2, max_rounds=6, ambiguous=every)["a"]) == 6
    assert len(interleaved_times(fns, rounds=2, max_rounds=50, max_seconds=0.0, ambiguous=every)["a"]) == 2
    clear = {"a": lambda: time.sleep(0.02), "b": lambda: None}  # 20 ms against nothing: never within 50%
    assert len(interleaved_times(clear, rounds=2, max_rounds=6, ambiguous=0.5)["a"]) == 2


def test_a_per_node_kernel_is_kept_only_clearly_below_level_2():
    from aiacc.plugins.timing import KEEP_BELOW, keep_note

    assert keep_note("k", KEEP_BELOW - 0.01) == (True, f"kept: k {KEEP_BELOW - 0.01:.2f}x")
    assert keep_note("k", 0.97) == (False, "dropped: k 0.97x, not below 0.95x")  # within this machine's drift
    assert keep_note("k", 1.3) == (False, "dropped: k slower 1.30x")
