"""Every size a public function of the package takes is bounded before anything is allocated: the fuzz walks the
signatures of every function in the `__all__` of every public module (the probes' own walk is
tests/probes/test_probe_bounds.py), so a new function or a new integer parameter is fuzzed by default.

For each integer parameter it calls the real function with small valid arguments and that one parameter wild
(huge, or negative), on a machine of 1 GiB (every plan check sees that limit): the call returns or raises
ValueError / TypeError (`PlanTooLarge` is a ValueError) within a minute; never an allocation error, an
OverflowError, a RecursionError or a hang. An integer that sizes nothing a call holds is listed in `NOT_SIZES`,
one that only counts work (a loop's length: time, not memory) in `WORK`, each with why."""

import functools
import importlib
import inspect
import pkgutil
import signal
import typing

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import markov_interp
from markov_interp.dynamics import StepInterval
from markov_interp.models import build, preset
from markov_interp.probes import _common
from markov_interp.sources import BinaryChain, RandomMarkov, hmm_preset

NOT_SIZES = {  # integer parameters that size nothing a call allocates
    "seed": "a random stream's seed (bounded by config.SEED_MAX)",
    "step": "a step number (compared, recorded)", "layer": "a layer's index (a hook name)",
    "digits": "digits printed", "lead": "a heading's level", "columns": "a figure's columns",
    "budget": "a step budget drawn as a line", "dwell": "steps a crossing must last", "stacklevel": "warnings",
    "depth": "a folder walk's depth", "n_links": "a file's link count", "keep": "resume points kept",
    "checkpoint": "a checkpoint's step", "rounds": "Philox rounds", "workers": "processes (a pool)",
    "group": "runs per stack", "minimum": "a bound", "maximum": "a bound", "successes": "a count (arithmetic)",
    "min_group": "a cluster's size", "t": "a step number", "train_seq_len": "a number written into metadata",
    "total": "a schedule's length (arithmetic)", "steps_since": "compared with a period", "upto": "a step",
    "n": "`dynamics.wilson_interval`, `streams.below`, `training.checkpoint_steps`: arithmetic (the grids' n is "
         "planned: listed apart below)",
    "members": "a plan's own input", "state_floats": "a plan's own input", "optimiser_floats": "a plan's own input",
    "n_checkpoints": "a plan's own input", "pool_size": "a plan's own input",
}
SIZED_N = {"regime_map_pq", "landscape_figure"}  # their `n` is a grid's side: planned
WORK = {  # loop counts: each pass holds the same memory
    ("turnbull", "max_iter"): "EM iterations", ("gradient_descent_outcomes", "steps"): "descent steps, outcomes only",
    ("evaluate", "n_batches"): "batches evaluated one after another",
    ("evaluate_paired", "n_batches"): "batches evaluated one after another",
    ("paired_row", "n_batches"): "a divisor",
    ("mixed_states", "n_tokens"): "the enumeration's depth: each level holds at most max_states beliefs (planned)",
}
NOT_CALLED = {  # functions whose sizes are planned by what they call, tested there
    "report.compare": "report.compare / build read run folders; their probe batch is probes.sample_batch's plan "
                      "(tests/faults/test_faults_bounds.py::test_n2_the_python_api_plans_before_it_allocates)",
    "report.build": "as report.compare", "runs.save_checkpoint": "writes files; train_seq_len is metadata",
    "plan.check_disk": "a plan itself (training.plan)", "batches.data_streams": "its samplers are planned "
                                                                               "(stream_sampler, fuzzed here)",
    "phases.circuit_summary": "reads an AttentionScores; its order indexes its lags",
    "factorial.cell_base": "a cell's base config: its sizes go through the run's plan (training.plan.check_plan)",
}


def _short(module: str, name: str) -> str:
    return f"{module.rsplit('.', 1)[-1]}.{name}"


def _public_functions() -> dict:
    """{(module, name): function} of every public module outside `probes` (which has its own walk) and the CLI."""
    found = {}
    for info in pkgutil.walk_packages(markov_interp.__path__, "markov_interp."):
        parts = info.name.split(".")[1:]
        if any(p.startswith("_") for p in parts) or parts[0] in ("probes", "cli"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            fn = getattr(module, name)
            if inspect.isfunction(fn) and all(fn is not other for other in found.values()):
                found[info.name, name] = fn
    return found


def _int_parameters(fn) -> list[str]:
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):
        hints = {}
    return [p for p in inspect.signature(fn).parameters if _common._plain_kind(hints.get(p, typing.Any)) is int]


def _is_size(fn, param: str) -> bool:
    return (param not in NOT_SIZES or (param == "n" and fn.__name__ in SIZED_N)) and \
        (fn.__name__, param) not in WORK


CASES = sorted((module, name, param) for (module, name), fn in _public_functions().items()
               if _short(module, name) not in NOT_CALLED and _short(fn.__module__, name) not in NOT_CALLED for param in _int_parameters(fn) if _is_size(fn, param))


_MEASURE = {"out": {"model": 0.9, "pool_bayes": 0.95, "in_context_bayes": 0.85}, "swap_fraction": 0.6}


@functools.lru_cache(maxsize=1)
def context() -> dict:
    """A small valid value of every required argument of the functions fuzzed, by name."""
    model = build(preset("attn-only-2layer", d_vocab=2, n_ctx=16), seed=0)
    runs = []  # no runs: the plan is checked first (and the function then refuses an empty comparison)
    crossings = [StepInterval(10, 20), StepInterval(12, 30), StepInterval(40, 50)]
    return dict(
        model=model, source=BinaryChain(0.2, 0.3), hmm=hmm_preset("z1r"), sources=[RandomMarkov(2)],
        generators=[torch.Generator().manual_seed(0)], generator=torch.Generator().manual_seed(0),
        keys=torch.zeros(1, 2, dtype=torch.long), tokens=torch.tensor([[0, 1, 1, 0]]), vocab=2, order=1, k=1,
        batch=2, seq_len=8, length=4, n_tokens=2, n_positions=4, batch_size=2, n_batches=1, seq=4, value="uniform",
        kernel=torch.tensor([[0.8, 0.2], [0.3, 0.7]]), e0=0.1, w0=-1.0, p=0.2, q=0.3, lr=0.5, steps=3,
        crossings=crossings, found=crossings, a=runs, b=runs, sizes=[1, 2], values=[[1.0, 2.0], [2.0, 3.0]],
        measures=[[_MEASURE, _MEASURE], [_MEASURE, _MEASURE]], control=[], cfg=preset("attn-only-2layer", d_vocab=2, n_ctx=16),
        n_sequences=4, fields=[], device=torch.device("cpu"), random=True, n_ctx=4, words=torch.zeros(3,
        dtype=torch.long), step=1, seed=0, n=3, totals={}, train_cfg=None, seconds_since=0.0,
    )


def _required(fn) -> dict:
    ctx = context()
    return {p.name: ctx[p.name] for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def test_every_integer_parameter_of_a_public_function_is_fuzzed_or_said_why_not():
    """The walk finds the functions that allocate by a size, and `context` covers every one it calls (a new
    function with a new required argument fails here first)."""
    called = {(m.rsplit(".", 1)[-1], n) for m, n, _ in CASES}
    assert {("theory", "word_law"), ("theory", "bayes_loss_curve"), ("sources", "add_beta_predictions"),
            ("landscape", "regime_map_pq"), ("clamps", "pattern_value"), ("diversity", "transition_interval"),
            ("training", "evaluate")} <= called, sorted(called)
    functions = _public_functions()
    for module, name, _ in CASES:
        _required(functions[module, name])


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang


WILD = st.one_of(st.integers(min_value=2**31, max_value=2**80), st.integers(max_value=-1, min_value=-(2**70)),
                 st.sampled_from([2**62, 10**9, 10**12]))


@pytest.mark.usefixtures("limited_memory")
@pytest.mark.parametrize("module,name,param", CASES, ids=[f"{m.rsplit('.', 1)[-1]}.{n}-{p}" for m, n, p in CASES])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=WILD)
def test_a_wild_size_is_refused_before_it_is_allocated(module, name, param, value):
    fn = _public_functions()[module, name]
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)  # a refusal takes milliseconds; 60 s of wall time allows for a loaded machine
    try:
        fn(**{**_required(fn), param: value})
    except (ValueError, TypeError):
        pass
    except _Hang:
        pytest.fail(f"{name}({param}={value}) ran for 60 s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
