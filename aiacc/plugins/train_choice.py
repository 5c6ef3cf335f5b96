"""mode="train": the step aiacc hands back is the fastest of its own exported graph, the same graph under
the framework's own compiler (torch.compile, XLA jit_compile, MXNet's static hybridize flags) and the
framework's own best path for the original model (the original module eager in torch, the original under
XLA in TF, Gluon's own graph hybridized in MXNet), chosen by measuring a few interleaved training steps
(forward + backward) on the example inputs at optimize time, so aiacc's step is never slower by choice than
the candidates it measured.

Every plugin passes its candidates here; this module imports no framework. The option that steers it is
`framework_compile`: "auto" (measure, the default), True (use the framework's compiler without measuring),
False (never), or a candidate's name as `aiacc_train_path` gives it (that candidate, unmeasured: a choice
measured once can be pinned). The result (`TrainChoice`) is attached to the returned model as `aiacc_train_choice`, its
`path` as `aiacc_train_path`, and a choice other than aiacc's own graph is said (AiaccNotice: not a fallback) with every
candidate's measured time, so the user knows what the step runs through. Why a candidate was left out is
also given as a code (`TrainChoice.left_out`: candidate -> FAILED, LOSS_DIFFERS or GRADIENT_DIFFERS), so a
plugin adds its own explanation without reading the reason's text.
"""
from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from aiacc.errors import AiaccNotice, OptionError, describe
from aiacc.plugins.timing import interleaved_times

OPTION_DOC = ("mode='train': 'auto' measures aiacc's step with and without the framework's compiler (and the "
              "original model's own step) and keeps the fastest; True always uses the compiler; False never; a "
              "candidate's name (as aiacc_train_path gives it) uses that one unmeasured")

# a compiled candidate must be at least this much faster to be chosen (timing noise on a shared machine)
MARGIN = 0.97
# relative L2 error a candidate's gradient may have against aiacc's own step (see same_results)
GRAD_RTOL = 1e-2
# the noise floor (see noise_floor): aiacc's own step on its float inputs perturbed by this relative amount
# (2**-17, 64 float32 ulps: the spread of a float32 reduction over ~1e4 terms summed in another order, as a
# compiler's fused BatchNorm statistics or convolution are); a candidate's gradient may differ from aiacc's by
# NOISE_FACTOR times the perturbed step's difference, never by more than NOISE_CAP of its norm
NOISE_EPS, NOISE_FACTOR, NOISE_CAP = 2.0 ** -17, 2.0, 0.1
# the measurement is extended (up to MAX_ROUNDS rounds, MAX_SECONDS of measuring) while a candidate's paired
# ratio to the kept step is undecided (see decide): comparing medians of 5 steps, a shared machine's load
# spikes flipped a close call between runs
MAX_ROUNDS, MAX_SECONDS = 11, 20.0
# building the alternatives and their first steps (where a compiler compiles: torch.compile of a ResNet-18
# training step is ~13 s on 2 cores) may take this long in all; alternatives not started by then are left
# out (SKIPPED), so optimize's time stays bounded however many compiled candidates a plugin offers
MAX_BUILD_SECONDS = 90.0


# why a candidate was left out (TrainChoice.left_out): it raised while building or running; its first step's
# loss differed from aiacc's own step's; a gradient (or the number or shape of the results) differed
FAILED, LOSS_DIFFERS, GRADIENT_DIFFERS = "failed", "loss differs", "gradient differs"
# left out unbuilt: the build budget (MAX_BUILD_SECONDS) was spent on the alternatives before it
SKIPPED = "build budget spent"


@dataclass
class Decision:
    """What `decide` makes of interleaved step times."""

    path: str  # the candidate to run: the kept one unless another is clearly faster
    # per other candidate: (lower quartile, median, upper quartile) of its time / the kept one's, round by round
    ratios: dict[str, tuple[float, float, float]]
    settled: bool  # every other candidate clearly faster or clearly not (else more rounds would help)
    rounds: int


def decide(times: dict[str, list[float]], keep: str, margin: float = MARGIN) -> Decision:
    """The choice from `times` (candidate -> seconds per round, the rounds interleaved as interleaved_times
    runs them): each other candidate's time divided by `keep`'s in the same round (a paired ratio, so a
    load change that slows a whole round cancels), summarized by its quartiles. A candidate is clearly
    faster when its median ratio is below `margin` and its upper quartile below 1, clearly not when even its
    lower quartile is at or above `margin`; otherwise undecided. The clearly faster one with the lowest
    median ratio is chosen, else `keep` (a tie, or undecided ones at the end of the measuring, keep it)."""
    rounds = min(len(v) for v in times.values()) if times else 0
    ratios, faster, settled = {}, {}, True
    for name, ts in times.items():
        if name == keep:
            continue
        r = sorted(t / max(k, 1e-12) for t, k in zip(ts[:rounds], times[keep][:rounds]))
        q1, med, q3 = (statistics.quantiles(r, n=4, method="inclusive") if len(r) > 1 else r * 3) if r else (
            1.0, 1.0, 1.0)
        ratios[name] = (q1, med, q3)
        if med < margin and q3 < 1.0:
            faster[name] = med
        elif q1 < margin:
            settled = False
    path = min(faster, key=faster.get) if faster else keep
    return Decision(path, ratios, settled, rounds)


@dataclass
class TrainChoice:
    """What mode='train' runs underneath and why."""

    path: str  # the candidate chosen ("aiacc graph", "aiacc graph + torch.compile", ...)
    ms: dict[str, float] = field(default_factory=dict)  # median step milliseconds per candidate measured
    reason: str = ""
    # the candidates left out, each with its code (FAILED, LOSS_DIFFERS, GRADIENT_DIFFERS, SKIPPED); the reason
    # says more
    left_out: dict[str, str] = field(default_factory=dict)
    # seconds each alternative took to build and run its first step (a compiler's compile time)
    build_s: dict[str, float] = field(default_factory=dict)

    def refused(self, code: str, name_contains: str = "") -> list[str]:
        """The candidates left out with `code` whose name contains `name_contains`."""
        return [k for k, v in self.left_out.items() if v == code and name_contains in k]

    def summary(self) -> str:
        times = ", ".join(f"{k} {v:.1f} ms" for k, v in self.ms.items())
        return f"{self.path}: {self.reason}" + (f" ({times})" if times else "")


def option(options: dict) -> Any:
    """The framework_compile option popped from `options` ("auto" when absent), checked (a candidate's name
    is checked by `choose`, which knows the candidates)."""
    value = options.pop("framework_compile", "auto")
    if value not in ("auto", True, False) and not isinstance(value, str):
        raise OptionError(f"framework_compile must be 'auto', True, False or a candidate's name, not {value!r}")
    return value


def same_results(a: list, b: list, rtol: float = 1e-4, atol: float = 1e-6, grad_rtol: float = GRAD_RTOL,
                 floor: list | None = None) -> str:
    """'' when two steps' results agree, else what differs (compare's message)."""
    return compare(a, b, rtol, atol, grad_rtol, floor)[1]


def compare(a: list, b: list, rtol: float = 1e-4, atol: float = 1e-6, grad_rtol: float = GRAD_RTOL,
            floor: list | None = None) -> tuple[str, str]:
    """('', '') when two steps' results (the loss, then the gradients, as numpy arrays) agree, else (LOSS_DIFFERS
    or GRADIENT_DIFFERS, what differs).
    The loss agrees elementwise within `rtol`; each gradient within `grad_rtol` of its own norm (relative
    L2 error): a compiler that recomputes a max pooling's input in the backward routes the gradient of a
    near-tie (two inputs equal to float32 rounding) to the other element, so a conv before a BatchNorm and a
    max pool gets ~1e-3 of its gradient moved to a neighbouring pixel (ResNet's stem under torch.compile:
    2.3e-3 relative L2, 9e-3 of the largest element) while a wrong graph differs by order 1.
    `floor` (noise_floor: per gradient, the L2 distance a rounding-level perturbation of the inputs moves
    aiacc's own step's gradient) raises a gradient's allowance to NOISE_FACTOR times it, at most NOISE_CAP
    of its norm: where near-ties make a gradient move that much under rounding alone, another compiler's
    rounding moves it as much (TF's resnet_small under XLA: BatchNorm gradients 2.5e-2, the 2**-17
    perturbation 2.7e-2)."""
    if len(a) != len(b):
        return GRADIENT_DIFFERS, f"{len(b)} results instead of {len(a)}"
    for k, (x, y) in enumerate(zip(a, b)):
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        what = "the loss" if k == 0 else f"gradient {k - 1}"
        code = LOSS_DIFFERS if k == 0 else GRADIENT_DIFFERS
        if x.shape != y.shape:
            return code, f"{what} has shape {y.shape} instead of {x.shape}"
        if not x.size:
            continue
        if not np.isfinite(y).all() and np.isfinite(x).all():
            return code, f"{what} differs (not finite)"
        if k == 0:
            if float(np.abs(x - y).max()) > rtol * float(np.abs(x).max()) + atol:
                return code, f"{what} differs"
        else:
            norm, err = float(np.linalg.norm(x)), float(np.linalg.norm(x - y))
            noise = floor[k - 1] if floor is not None and k - 1 < len(floor) else None
            allowed = grad_rtol * norm
            if noise is not None:
                allowed = max(allowed, min(NOISE_FACTOR * noise, NOISE_CAP * norm))
            if err > allowed + atol * np.sqrt(x.size):
                return code, f"{what} differs ({err / max(norm, 1e-30):.1e} relative" + (
                    f", rounding noise {noise / max(norm, 1e-30):.1e}" if noise is not None else "") + ")"
    return "", ""


def noise_floor(base: list, perturbed: list) -> list:
    """Per gradient of two results of aiacc's own step (numpy, as same_results takes them: the loss first),
    the second on its float inputs scaled by (1 +- NOISE_EPS) elementwise: the L2 distance between the two
    gradients, what rounding alone moves each (same_results' `floor`)."""
    return [float(np.linalg.norm(np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)))
            if np.shape(x) == np.shape(y) else 0.0 for x, y in zip(base[1:], perturbed[1:])]


def perturb(array: np.ndarray, seed: int = 0) -> np.ndarray:
    """A floating array times (1 +- NOISE_EPS), the sign drawn per element (seeded); other dtypes as they are."""
    a = np.asarray(array)
    if a.dtype.kind != "f" or not a.size:
        return a
    signs = np.random.default_rng(seed).choice(np.array([-1.0, 1.0]), size=a.shape)
    # np.asarray: numpy turns a 0-d array's arithmetic into a scalar, which callers cannot hand to a framework
    return np.asarray((a.astype(np.float64) * (1.0 + NOISE_EPS * signs)).astype(a.dtype))


def choose(base: str, make_compiled: Callable[[], Any], step_of: Callable[[Any], Callable[[], Any]],
           base_model: Any, setting: Any, compiler: str, rounds: int = 5,
           to_arrays: Callable[[Any], list] | None = None,
           more: dict[str, Callable[[], Any]] | None = None, warmup: int = 2,
           perturbed: Callable[[], Any] | None = None, keep: str | None = None) -> tuple[Any, TrainChoice]:
    """(model, TrainChoice): `base_model`, the model `make_compiled()` builds (named base + compiler) or one
    of `more` (name -> maker: the framework's own best paths, the original model itself), whichever runs
    `step_of(model)` (one forward + backward, side effects undone by the step itself) fastest: `warmup` steps
    each (the first compiles), then `rounds` interleaved rounds, each round in a rotated order so no
    candidate always runs after the same one; each alternative's time paired round by round with the kept
    candidate's (`keep`, aiacc's own step by default), more rounds while one is undecided (MAX_ROUNDS,
    MAX_SECONDS), and one is chosen only when clearly faster by the MARGIN (`decide`); on a tie the kept one
    runs. The choice's reason gives the measured ratio and the number of rounds.
    `setting` is the framework_compile option (True: the compiled model, unmeasured; a candidate's name:
    that candidate, unmeasured; OptionError naming the candidates for another name).
    An alternative that fails to build or run, or whose first step's results (`to_arrays` of what the step
    returns: loss and gradients) differ from aiacc's own (same_results), is left out (warned). `perturbed`
    runs aiacc's own step once on its float inputs perturbed at rounding level (`perturb`): the gradients'
    noise floor (noise_floor) that same_results allows beside GRAD_RTOL."""
    fast = f"{base} + {compiler}"
    if setting is False:
        return base_model, TrainChoice(base, reason="framework_compile=False")
    makers = {fast: make_compiled, **(more or {})}
    if setting is True:
        return make_compiled(), TrainChoice(fast, reason="framework_compile=True")
    if setting != "auto":
        if setting == base:
            return base_model, TrainChoice(base, reason=f"framework_compile={setting!r}")
        if setting not in makers:
            names = ", ".join(repr(k) for k in [base, *makers])
            raise OptionError(f"framework_compile must be 'auto', True, False or a candidate's name ({names}), "
                              f"not {setting!r}")
        return makers[setting](), TrainChoice(setting, reason=f"framework_compile={setting!r}")
    models, steps, warm = {base: base_model}, {base: step_of(base_model)}, {}
    warm[base] = steps[base]()
    for _ in range(warmup - 1):
        steps[base]()
    reasons, left_out = [], {}
    floor = None
    if perturbed is not None and to_arrays is not None:
        try:
            floor = noise_floor(to_arrays(warm[base]), to_arrays(perturbed()))
        except Exception as e:  # noqa: BLE001 - without a floor the GRAD_RTOL rule alone applies
            reasons.append(f"no rounding-noise floor ({describe(e, 120)})")
    build_s: dict[str, float] = {}
    for name, make in makers.items():
        if sum(build_s.values()) > MAX_BUILD_SECONDS:
            left_out[name] = SKIPPED
            reasons.append(f"{name} not built: the alternatives before it took {sum(build_s.values()):.0f} s to "
                           f"build (MAX_BUILD_SECONDS {MAX_BUILD_SECONDS:.0f})")
            continue
        start = time.perf_counter()
        try:
            model = make()
            step = step_of(model)
            result = step()  # warm-up: the compiler compiles here
            build_s[name] = time.perf_counter() - start
            code, problem = compare(to_arrays(warm[base]), to_arrays(result), floor=floor) if to_arrays else ("", "")
            if problem:
                left_out[name] = code
                raise ValueError(f"{problem} from aiacc's own step")
            for _ in range(warmup - 1):
                step()
        except Exception as e:  # noqa: BLE001 - the compiler refusing the graph leaves the others
            build_s.setdefault(name, time.perf_counter() - start)
            left_out.setdefault(name, FAILED)
            warnings.warn(f"aiacc: mode='train' does not use {name}: it failed ({describe(e, 200)})",
                          AiaccNotice, stacklevel=3)
            reasons.append(f"{name} failed: {describe(e, 200)}")
            continue
        models[name], steps[name] = model, step
    slow = {k: v for k, v in build_s.items() if v >= 1.0}  # compiles; a second or less is not worth saying
    if slow:
        reasons.append("built and first step in " + ", ".join(f"{k} {v:.1f} s" for k, v in slow.items()))
    keep = keep if keep in steps else base
    times = interleaved_times(steps, rounds, max_rounds=MAX_ROUNDS, max_seconds=MAX_SECONDS,
                              settled=lambda t: decide(t, keep).settled)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    d = decide(times, keep)
    listing = ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items())
    best = d.path
    if best != keep:
        q1, med, q3 = d.ratios[best]
        measured = (f"paired ratio {med:.2f} (quartiles {q1:.2f}-{q3:.2f}) to {keep} over {d.rounds} "
                    f"interleaved rounds")
        warnings.warn(f"aiacc: mode='train' runs the step as {best}: measured fastest ({listing}, median of "
                      f"{d.rounds} steps each; {measured}; framework_compile=False opts out)", AiaccNotice,
                      stacklevel=3)
        return models[best], TrainChoice(best, ms, "; ".join(reasons + [
            f"measured faster by {1 / med:.2f}x than {keep} ({measured}), so aiacc runs it"]), left_out, build_s)
    others = ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items() if k != keep)
    closest = min(d.ratios, key=lambda k: d.ratios[k][1]) if d.ratios else None
    measured = "" if closest is None else (
        f"; closest {closest}: paired ratio {d.ratios[closest][1]:.2f} (quartiles {d.ratios[closest][0]:.2f}-"
        f"{d.ratios[closest][2]:.2f}) over {d.rounds} interleaved rounds"
        + ("" if d.settled else ", undecided at the cap: a tie keeps " + keep))
    return models[keep], TrainChoice(keep, ms, "; ".join(reasons + [
        f"the alternatives measured no faster ({others or 'none ran'} vs {ms[keep]:.1f} ms{measured})"]), left_out,
        build_s)


def note(report: Any, choice: TrainChoice) -> None:
    """Put a measured choice in the pass report's `train_step` note: what runs, every candidate's median
    time and the reason (nothing where no report, or nothing was measured)."""
    if report is not None and choice.ms:
        report.note("train_step", [f"runs: {choice.path}", *(f"{k}: {v:.1f} ms" for k, v in choice.ms.items()),
                                   choice.reason])


def attach(model: Any, choice: TrainChoice) -> Any:
    """Record the choice on the model (where it takes attributes) and return the model."""
    for name, value in (("aiacc_train_choice", choice), ("aiacc_train_path", choice.path)):
        try:
            setattr(model, name, value)
        except (AttributeError, TypeError):
            pass
    return model
