"""The probes' entry check (`probes._common.checked`): every plain argument of every public probe is bounded, by
name or by default, so a parameter added later is bounded too; a model whose weights are not finite is refused
by every probe with one message; the memory plan refuses sizes that cannot fit before anything is allocated.

The fuzz tests draw values over the whole range of each type (huge and negative integers, NaN, infinities,
wrong types) for one parameter at a time: a stand-in with the probe's signature shows the check itself (every
parameter, no probe code run), and the real probes show that what passes the check runs or is refused as a
ValueError / TypeError, never a crash, a raw allocation error or a hang."""

import functools
import importlib
import inspect
import math
import pkgutil
import typing

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from markov_interp import probes
from markov_interp.sources import HiddenSource, RandomMarkov, hmm_preset
from markov_interp.models.memory import PlanTooLarge
from markov_interp.probes import _common
from markov_interp.probes._common import checked, parameter_limits

from handbuilt import induction_model

VOCAB, SEQ = 2, 12


def _public() -> dict:
    """Every checked public function: the face's by name, and every other function of a probes module's `__all__`
    as "module.name" (`probes.strategies.state_and_counts_probs` is as bounded as `probes.classify_mechanism`)."""
    found = {name: getattr(probes, name) for name in probes.__all__
             if getattr(getattr(probes, name), "__markov_checked__", False)}
    for module in _modules():
        for name in getattr(module, "__all__", ()):
            fn = getattr(module, name)
            if inspect.isfunction(fn) and all(fn is not other for other in found.values()):
                found[f"{module.__name__.rsplit('.', 1)[-1]}.{name}"] = fn
    return found


def _modules() -> list:
    """The public modules of `markov_interp.probes` (walked, so a new module is included)."""
    return [importlib.import_module(info.name) for info in pkgutil.iter_modules(probes.__path__, "markov_interp.probes.")
            if not info.name.rsplit(".", 1)[-1].startswith("_")]


def _hints(fn) -> dict:
    return typing.get_type_hints(fn.__wrapped__)


def _numeric(fn) -> dict:
    """{parameter: (its kind, its limits)} of a probe's int / float parameters."""
    hints, out = _hints(fn), {}
    for name in inspect.signature(fn).parameters:
        kind = _common._plain_kind(hints.get(name, typing.Any))
        if kind in (int, float):
            out[name] = (kind, parameter_limits(name, hints[name]))
    return out


@functools.lru_cache(maxsize=1)
def context() -> dict:
    """One small example of every required argument of the checked probes (a hand-built induction model on 2
    states; Z1R, a hidden Markov source on 2 states, for the belief probes); `test_the_context_covers_every_probe`
    keeps it complete."""
    model = induction_model(VOCAB, n_ctx=16)
    source = RandomMarkov(VOCAB)
    batch = probes.sample_batch(source, n_sequences=4, seq_len=SEQ, seed=0)
    tokens = batch.tokens
    _, cache = model.run_with_cache(tokens)
    graph = probes.discover_circuit(model, source, n_sequences=4, seq_len=SEQ, method="exact")
    scores = probes.attention_scores(model, batch)
    components = probes.interventions.model_components(model)
    activations = cache["blocks.0.hook_resid_post"]
    target = probes.probe_target("state", batch)
    sim = probes.strategy_similarity(model, batch)
    hmm = hmm_preset("z1r")
    probs = probes.next_state_probs(model, tokens)
    hmm_tokens = hmm.sample(8, SEQ, generator=torch.Generator().manual_seed(0))
    return dict(
        model=model, source=source, batch=batch, tokens=tokens, clean_tokens=tokens, corrupted_tokens=tokens.flip(0),
        probs=probs, th=probes.Thresholds(), sim=sim, checkpoints=[(1, model)], edges=graph.kept or graph.edges[:2],
        name="state", where="blocks.0.hook_resid_post", target=target,
        activations=activations, n_sequences=4, seq_len=SEQ, seed=0,
        # the probes modules' other public functions
        hmm=hmm, hmm_tokens=hmm_tokens, table=probes.beliefs.belief_probes(model, hmm_tokens, hmm, n_bootstrap=0),
        reading=probes.circuit.read_circuit(graph, scores, order=1, head_excess=0.1),
        gains=probes.graded_gains(probs, batch), graph=graph, scores=scores, runner=probes.paths.EdgeRunner(model, tokens, tokens.flip(0)),
        active=list(graph.edges[:2]), components=components[:2], groups=[components[:1], components[:2]],
        component=components[0], activation=activations, replacement=activations, replacements={}, reference={},
        pattern=cache["blocks.0.attn.hook_pattern"], kernel=batch.kernels[0], predict=probes.behaviour.model_predictor(
            model), positions=[1, 2], vocab=VOCAB, order=1, alpha=1.0, beta=1.0, max_lag=2, n_base=2,
        values=tokens[..., None].double(), exact=True, first=tokens[:, 0], gen=torch.Generator().manual_seed(0),
        fit=probes.fit_probe(activations, target), temperature=1.0, threshold=0.1, head_excess=0.1,
        in_context_fraction=0.5, in_weights=False, source_order=1, value=0.5, steps=[1, 2], kept=[False, True],
        effects=dict.fromkeys(graph.edges[:2], 0.5), mode="K", src=(0, 0), dst=(1, 0), logits=model(tokens),
        true=probes.next_state_probs(model, tokens), curve=torch.linspace(1.0, 0.5, SEQ - 1), variable="state",
        edge=graph.edges[0], raw_sim=sim, fitted_sim=sim, laws={}, carried={}, profiles={},
        beliefs=torch.full((4, 3), 1 / 3, dtype=torch.float64),
    )


def _required(fn) -> dict:
    """The probe's required arguments, from `context` (a hidden Markov source where the probe takes one)."""
    ctx = context()
    hints = _hints(fn)
    hidden = hints.get("source") is HiddenSource
    return {p.name: ctx[{"source": "hmm", "tokens": "hmm_tokens"}.get(p.name, p.name) if hidden else p.name]
            for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _stand_in(fn):
    """`checked` around a function with `fn`'s signature and annotations that only counts its calls."""
    calls = []

    def stand_in(*args, **kwargs):
        calls.append(kwargs)

    stand_in.__signature__ = inspect.signature(fn.__wrapped__)
    stand_in.__annotations__ = _hints(fn)
    stand_in.__name__ = fn.__name__
    return checked(stand_in), calls


ANY_VALUE = st.one_of(
    st.integers(), st.integers(min_value=-(2**80), max_value=2**80), st.sampled_from([0, 1, 2, 3, -1, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 0.5, 1e300]),
    st.booleans(), st.text(max_size=3), st.none())
NUMERIC = sorted((name, param) for name, fn in _public().items() for param in _numeric(fn))


def _expected(kind, limits: dict, value, param: str = "", given: dict = {}) -> str:  # noqa: B006 (read only)
    """What the check must do with `value` for a parameter of `kind` bounded by `limits`: "type", "value" or "ok"
    (an independent statement of the rule: the type first, then finite and within [minimum, maximum]; a `vocab`
    within them must also cover the states of the tokens `given` and match the laws given: "vocab" when not)."""
    if value is None:
        return "ok-or-type"  # Optional parameters take None, the others refuse it as a type
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and isinstance(value, float)):
        return "type"
    if isinstance(value, float) and not math.isfinite(value):
        return "value"
    if not limits["minimum"] <= value <= limits["maximum"]:
        return "value"
    if param == "vocab":
        tokens = [t.tokens if isinstance(t, probes.ProbeBatch) else t for n, t in given.items()
                  if n in ("tokens", "clean_tokens", "corrupted_tokens")]
        laws = [t for n, t in given.items() if n in ("probs", "true", "logits")]
        if any(int(t.max()) >= value for t in tokens) or any(law.shape[-1] != value for law in laws):
            return "vocab"
    return "ok"


def test_the_context_covers_every_probe():
    """Every function of the face (`probes.__all__`) and of every probes module's `__all__` is checked (the module
    attribute itself: `probes.strategies.state_and_counts_probs` is bounded as the face is), and `context` holds
    every required argument of each one the fuzz calls (a new probe with a new argument fails here first)."""
    functions = {n for n in probes.__all__ if inspect.isfunction(getattr(probes, n))}
    assert functions <= set(_public()) and "edge_content" in functions
    for module in _modules():
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            assert not inspect.isfunction(value) or getattr(value, "__markov_checked__", False), (module, name)
    assert {"strategies.state_and_counts_probs", "belief_probes", "belief_patch",
            "beliefs.simplex_points"} <= set(_public())
    for name in set(n for n, _ in NUMERIC) | set(MODEL_PROBES):
        _required(_public()[name])
    assert {"n_boot", "cut", "max_lag", "n_sequences"} <= set(_numeric(probes.edge_content))


def test_every_numeric_parameter_of_a_public_probe_has_finite_bounds():
    assert len(NUMERIC) > 30
    for name, param in NUMERIC:
        kind, limits = _numeric(_public()[name])[param]
        assert math.isfinite(limits["minimum"]) and math.isfinite(limits["maximum"]), (name, param)
        assert limits["minimum"] <= limits["maximum"], (name, param)


def test_a_new_parameter_is_bounded_by_default():
    def probe(model: probes.ProbeBatch, *, new_size: int = 3, new_weight: float = 0.5, flag: bool = False):
        return new_size

    wrapped, batch = checked(probe), context()["batch"]
    assert wrapped(batch) == 3
    with pytest.raises(ValueError, match=r"^probe: new_size must be in \[0, 1048576\], got 1180591620717411303424$"):
        wrapped(batch, new_size=2**70)
    with pytest.raises(ValueError, match="new_weight must be a finite number, got nan"):
        wrapped(batch, new_weight=math.nan)
    with pytest.raises(TypeError, match="flag must be true or false, got 1"):
        wrapped(batch, flag=1)


@pytest.mark.parametrize("name,param", NUMERIC, ids=[f"{n}-{p}" for n, p in NUMERIC])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=ANY_VALUE)
def test_the_entry_check_bounds_every_numeric_parameter(name, param, value):
    """Every int / float parameter of every public probe, given any value: a TypeError for the wrong type, a
    ValueError naming the probe and the parameter outside its bounds, else the probe's code is reached (or the
    memory plan refuses the size, `PlanTooLarge`); never another exception."""
    fn = _public()[name]
    kind, limits = _numeric(fn)[param]
    wrapped, calls = _stand_in(fn)
    expect = _expected(kind, limits, value, param, _required(fn))
    name = fn.__name__  # what its messages say (a module's function is named without its module)
    try:
        wrapped(**{**_required(fn), param: value})
    except TypeError as err:
        assert expect in ("type", "ok-or-type") and f"{name}: {param}" in str(err), (expect, err)
        return
    except PlanTooLarge as err:
        assert expect == "ok" and "too large" in str(err), (expect, err)
        return
    except ValueError as err:
        if expect == "vocab":  # `check_vocabulary`: the states or laws given, against vocab
            message = str(err)
            assert message.startswith(f"{name}: ") and (message.endswith(f"(vocab={value})") or message.endswith(
                f"but vocab={value}")), (expect, err)
            return
        assert expect == "value" and f"{name}: {param} must be" in str(err), (expect, err)
        return
    assert expect in ("ok", "ok-or-type") and len(calls) == 1, (expect, value)


REAL = sorted(n for n, fn in _public().items() if _numeric(fn))
# small valid values, or far beyond any bound or plan (sizes between them run the real probe for minutes)
SMALL_OR_WILD = st.one_of(st.integers(min_value=-3, max_value=4), st.integers(min_value=2**40, max_value=2**80),
                          st.integers(max_value=-(2**21)), st.floats(min_value=0, max_value=1),
                          st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e300]))


@pytest.mark.slow
@pytest.mark.usefixtures("limited_memory")
@pytest.mark.parametrize("name", REAL)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_real_probes_run_or_refuse_any_value(name, data):
    """The real probe (not a stand-in) given a small valid value or a wild one for one numeric parameter: it returns,
    or raises ValueError / TypeError (PlanTooLarge is a ValueError); never an allocation error, RecursionError,
    OverflowError, IndexError or a hang. The plan runs against a 1 GiB memory (`limited_memory`), so what it lets
    through is small on any machine, and a plan that undercounts a probe's arrays by much shows here as an
    allocation of several GiB."""
    fn = _public()[name]
    param = data.draw(st.sampled_from(sorted(_numeric(fn))))
    value = data.draw(SMALL_OR_WILD)
    try:
        fn(**{**_required(fn), param: value})
    except (ValueError, TypeError):
        pass


MODEL_PROBES = sorted(n for n, fn in _public().items() if {"model", "checkpoints"} & set(inspect.signature(fn).parameters))


def _broken_model():
    """The induction model with one weight NaN and one infinite (every probe must refuse it)."""
    model = induction_model(VOCAB, n_ctx=16)
    params = [p for _, p in model.named_parameters()]
    with torch.no_grad():
        params[-1].view(-1)[0] = math.nan
        params[0].view(-1)[0] = math.inf
    return model


@pytest.mark.parametrize("name", MODEL_PROBES)
def test_every_probe_refuses_a_model_with_non_finite_weights_in_one_message(name):
    model = _broken_model()
    names = [n.replace("._original_component", "") for n, _ in model.named_parameters()]
    fn = _public()[name]
    arguments = {**_required(fn), **({"model": model} if "model" in inspect.signature(fn).parameters else {}),
                 **({"checkpoints": [(1, model)]} if "checkpoints" in inspect.signature(fn).parameters else {})}
    with pytest.raises(ValueError) as refused:
        fn(**arguments)
    assert str(refused.value) == (f"{fn.__name__}: the model's weights hold NaN or infinity ({names[0]}, {names[-1]}); "
                                  "probes refuse a model whose weights are not finite (a diverged run has no "
                                  "trained model)")


def test_a_finite_model_is_checked_once_until_a_weight_changes():
    model = induction_model(VOCAB, n_ctx=16)
    tokens = context()["tokens"]
    probes.next_state_probs(model, tokens)
    key = model._markov_finite_key
    probes.next_state_probs(model, tokens)
    assert model._markov_finite_key == key
    name, param = list(model.named_parameters())[-1]
    with torch.no_grad():
        param.view(-1)[0] = math.nan  # in place: the version counter moves
    with pytest.raises(ValueError, match=name.replace("._original_component", "")):
        probes.next_state_probs(model, tokens)


@pytest.mark.parametrize("call,param", [
    (lambda c: probes.classify_mechanism(c["model"], c["source"], n_sequences=10**9), "n_sequences"),
    (lambda c: probes.discover_circuit(c["model"], c["source"], n_sequences=10**8), "n_sequences"),
    (lambda c: probes.swap_kernels(c["model"], c["source"], n_sequences=10**10), "n_sequences"),
    (lambda c: probes.sample_batch(c["source"], n_sequences=10**6, seq_len=10**6, seed=0), "n_sequences"),
    (lambda c: probes.classify_mechanism(c["model"], c["source"], circuit_sequences=10**10), "circuit_sequences"),
    (lambda c: probes.edge_content(c["model"], c["batch"], c["edges"], n_boot=10**12), "n_boot"),
    (lambda c: probes.fit_probe(c["activations"], c["target"], n_bootstrap=10**12), "n_bootstrap"),
    (lambda c: probes.linear_probe(c["model"], c["tokens"], c["where"], "state", n_bootstrap=10**12), "n_bootstrap"),
], ids=["classify", "discover", "swap_kernels", "sample_batch", "circuit_sequences", "edge_content-bootstrap",
        "fit_probe-bootstrap", "linear_probe-bootstrap"])
def test_sizes_beyond_the_memory_plan_are_refused_naming_the_parameter_and_the_estimate(call, param):
    with pytest.raises(PlanTooLarge, match=rf": {param}=\d+ is too large: .* would need [\d.]+ [KMGTP]iB of memory.*"
                                           r"refused before anything was allocated"):
        call(context())


@pytest.mark.parametrize("call,message", [
    (lambda c: probes.classify_mechanism(c["model"], c["source"], beta=math.inf), "beta must be a finite number"),
    (lambda c: probes.graded_gains(c["probs"], c["batch"], beta=-1.0), r"beta must be in \[0, 1e\+09\]"),
    (lambda c: probes.discover_circuit(c["model"], c["source"], min_fraction=2), r"min_fraction must be in \[0, 1\]"),
    (lambda c: probes.discover_circuit(c["model"], c["source"], min_fraction=math.inf), "min_fraction must be a fin"),
    (lambda c: probes.discover_circuit(c["model"], c["source"], target_faithfulness=1.5), "target_faithfulness"),
    (lambda c: probes.circuit_formation(c["checkpoints"], c["source"], min_fraction=3.0), "min_fraction must be in"),
    (lambda c: probes.edge_content(c["model"], c["batch"], c["edges"], cut=math.nan), "cut must be a finite number"),
    (lambda c: probes.edge_content(c["model"], c["batch"], c["edges"], cut=1.5), r"cut must be in \[0, 1\]"),
    (lambda c: probes.edge_content(c["model"], c["batch"], c["edges"], max_lag=1000), r"max_lag must be an integer in "
                                                                                      rf"1\.\.{SEQ}, got 1000"),
    (lambda c: probes.fit_probe(c["activations"], c["target"], penalty=-1.0), r"penalty must be in \[0, 1e\+09\]"),
    (lambda c: probes.probe_layers(c["model"], c["tokens"], "state", test_fraction=2), r"test_fraction must be in"),
], ids=["beta-inf", "beta-negative", "min_fraction-2", "min_fraction-inf", "faithfulness", "formation-kwargs",
        "cut-nan", "cut-1.5", "max_lag-beyond-the-sequence", "penalty-negative", "test_fraction-passed-on"])
def test_knobs_are_ranged(call, message):
    with pytest.raises(ValueError, match=message):
        call(context())
