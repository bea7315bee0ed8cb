"""transformers' ModelOutput records built in captured code (objects.py, "records built in
the trace"): the dataclass ``__init__``, ModelOutput's ``__setattr__`` and its
``__post_init__`` (``self.__dict__``, a first field unpacked into entries, the
``past_key_values`` -> ``cache`` rename) run in the trace, so keys, attributes, item
access and ``to_tuple`` equal eager's, and no ModelOutput method runs as a frame of its own.

PYTEST_DONT_REWRITE"""

import warnings

import pytest
import torch
from helpers import CountingBackend, assert_same, clone_args

import kiln_capture

transformers = pytest.importorskip("transformers")
from transformers.modeling_outputs import (  # noqa: E402
    BaseModelOutput,
    BaseModelOutputWithPooling,
    CausalLMOutputWithPast,
)


def same_record(actual, expected, path="out"):
    """Equal as eager's object: class, entries (in order), attributes, to_tuple()."""
    assert type(actual) is type(expected), f"{path}: {type(actual)}"
    assert list(actual.keys()) == list(expected.keys()), f"{path}: {list(actual.keys())}"
    assert sorted(vars(actual)) == sorted(vars(expected)), f"{path}: {vars(actual).keys()}"
    for k in expected:
        assert_same(actual[k], expected[k], f"{path}[{k!r}]")
    for k, v in vars(expected).items():
        assert_same(getattr(actual, k), v, f"{path}.{k}")
    assert_same(actual.to_tuple(), expected.to_tuple(), f"{path}.to_tuple()")


def compare(actual, expected, path="out"):
    if isinstance(expected, transformers.utils.ModelOutput):
        same_record(actual, expected, path)
    elif isinstance(expected, tuple | list):
        assert type(actual) is type(expected) and len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, f"{path}[{i}]")
    else:
        assert_same(actual, expected, path)


PROGRAMS = []


def program(fn):
    PROGRAMS.append(pytest.param(fn, id=fn.__name__))
    return fn


@program
def read_every_way(x):
    out = CausalLMOutputWithPast(logits=x + 1)
    return (
        out.logits * 2,
        out[0],
        out["logits"],
        out.to_tuple(),
        list(out.keys()),
        list(out.items())[0][0],
        "logits" in out,
        "loss" in out,
        out.get("loss", 3),
        len(out),
        [k for k in out],
        out.loss is None,
        out,
    )


@program
def first_field_dict_unpacked(x):
    o = BaseModelOutput({"last_hidden_state": x + 1, "hidden_states": (x,)})
    return o, list(o.keys()), o.hidden_states, o[1], len(o)


@program
def first_field_pairs_and_non_pairs(x):
    pairs = BaseModelOutput([("last_hidden_state", x * 2)])
    not_pairs = BaseModelOutput((x, x))  # not (key, value) pairs: the first field keeps it
    return pairs, not_pairs, list(not_pairs.keys())


@program
def cache_rename_and_writes(x):
    out = CausalLMOutputWithPast(logits=x, past_key_values=((x * 3,),))
    out.loss = x.sum()  # ModelOutput.__setattr__: an entry too
    out["logits"] = x - 1  # ModelOutput.__setitem__: the attribute too
    return out, list(out.keys()), out.cache[0][0], out.logits


@program
def positional_and_slices(x):
    out = BaseModelOutputWithPooling(x, x.mean(0), None, (x, x))
    return out[1:], out[-1], out.to_tuple()[0], out


@pytest.mark.parametrize("fn", PROGRAMS)
def test_program(fn):
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' deprecation notes
        expected = fn(x.clone())
        report = kiln_capture.explain(fn)(x.clone())
    compare(report.result, expected)
    assert (report.graph_count, report.break_count) == (1, 0), str(report)
    assert report.eager_frames == []
    backend = CountingBackend()
    compiled = kiln_capture.optimize(backend)(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(x.clone())
        n = len(backend.graphs)
        compare(compiled(x.clone()), expected)
    assert len(backend.graphs) == n
    assert kiln_capture.stats()["eager_frames"] == 0


@pytest.mark.parametrize(
    "args",
    [
        lambda x: ((x,), {}),
        lambda x: (({"last_hidden_state": x, "hidden_states": (x,)},), {}),
        lambda x: ((), {"last_hidden_state": x, "attentions": (x, x)}),
    ],
)
def test_construction_called_from_eager_code_is_captured(args):
    """Built by eager code while the hook is on (a frame after a break, a library), the
    record's ``__init__`` and ``__post_init__`` are captured frames with no eager frame,
    their writes replayed on the real object."""
    x = torch.randn(3)
    a, kw = args(x)
    compiled = kiln_capture.optimize(CountingBackend())(BaseModelOutput)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = compiled(*clone_args(a), **kw)
        assert not [w for w in caught if "kiln" in str(w.message)]
        same_record(got, BaseModelOutput(*a, **kw))
    assert kiln_capture.stats()["eager_frames"] == 0
    assert kiln_capture.stats()["breaks"] == 0


def _tiny_models():
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    )
    bert = BertModel(
        BertConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=100,
        )
    )
    return {"gpt2": gpt2.eval(), "bert": bert.eval()}


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_forward_returning_model_output_has_no_eager_frame_and_no_break(name):
    model = _tiny_models()[name]
    ids = torch.randint(0, 100, (2, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = kiln_capture.explain(model)(ids)
    expected = model(ids)
    assert isinstance(report.result, transformers.utils.ModelOutput)
    same_record(report.result, expected)
    assert (report.graph_count, report.break_count) == (1, 0), str(report)
    assert report.eager_frames == []
    assert kiln_capture.stats()["eager_frames"] == 0
    assert not [w for w in caught if "kiln" in str(w.message)]


def reads_a_record_passed_in(x, out):
    attrs = out.__dict__
    return x * out.last_hidden_state, list(attrs), attrs.get("extra"), list(out.keys()), out[0]


def test_record_passed_in_is_read_as_it_is():
    """Its attributes (one set outside the fields too) and entries, in their order, are
    the object's own, guarded: another set of attribute names recompiles."""
    t = torch.randn(3)
    out = BaseModelOutput(last_hidden_state=t)
    out.extra = 5
    plain = BaseModelOutput(last_hidden_state=t)
    compiled = kiln_capture.optimize(CountingBackend())(reads_a_record_passed_in)
    for arg in (out, plain, out):
        expected = reads_a_record_passed_in(t, arg)
        report = kiln_capture.explain(reads_a_record_passed_in)(t, arg)
        compare(report.result, expected)
        assert (report.graph_count, report.break_count) == (1, 0), str(report)
        compare(compiled(t, arg), expected)
    assert kiln_capture.stats()["eager_frames"] == 0
