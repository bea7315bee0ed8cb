"""Every graph-break family (breaks.py) names the user's source line and says what to
change (issue #16): each program below breaks once in a known family, on the line marked
``# <- B0xx``; the report (``explain``, ``str(GraphBreak)``, the fullgraph error) gives
that file and line, the line's text, why, and a hint with something to do. Results are
compared with eager's. The table must cover every family of ``breaks.ALL``.

PYTEST_DONT_REWRITE"""

import contextlib
import io
import re
import zlib

import pytest
import torch

import kiln_capture
from kiln_capture import breaks


@torch.library.custom_op("kiln_break_hints::no_fake", mutates_args=())
def _no_fake(x: torch.Tensor) -> torch.Tensor:
    return x.clone()  # no register_fake: it cannot run on the meta device


class _Manager:  # a context manager kiln does not model
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@kiln_capture.disable
def _disabled(x):
    return x * 2


def prints(x):
    print("value:", x.shape)  # <- B001
    return x + 1


def branches_on_data(x):
    if x.sum() > 0:  # <- B002
        return x + 1
    return x - 1


def data_dependent_op(x):
    counts = torch.bincount(x.flatten().abs().long() % 3)  # <- B003
    return counts + 1


def tensor_to_python(x):
    return x + x.tolist()[0][0]  # <- B004


def unknown_callable(x):
    return x + id(x) % 2  # <- B005


def unsupported_bytecode(x):
    async def later():
        return 1

    pending = later()  # <- B006
    pending.close()
    return x + 1


def calls_disabled(x):
    return _disabled(x) + 1  # <- B007


def op_without_meta(x):
    return torch.ops.kiln_break_hints.no_fake(x) + 1  # <- B008


_BUFFER = bytearray(b"abc")


def unmodeled_value(x):
    return x + len(_BUFFER)  # <- B009


def tensor_error(x):
    try:
        return x @ torch.ones(3, 3)  # <- B010
    except RuntimeError:
        return x - 1


def break_in_unmodeled_with(x):
    with _Manager():  # <- B011
        x = x + 1
        print("inside")
    return x


_PROGRAMS = {
    "B001": prints,
    "B002": branches_on_data,
    "B003": data_dependent_op,
    "B004": tensor_to_python,
    "B005": unknown_callable,
    "B006": unsupported_bytecode,
    "B007": calls_disabled,
    "B008": op_without_meta,
    "B009": unmodeled_value,
    "B010": tensor_error,
    "B011": break_in_unmodeled_with,
}
# not a break: a module compiled as a region of its own (FSDP2 units; kiln's tests)
_NOT_BREAKS = {"B012"}
# words of a hint that says what to do
_ACTIONS = re.compile(
    r"\b(use|move|keep|wrap|rewrite|remove|register|compute|fix|catch|make|mark|accept)\b"
)


def _marked_line(kind_id: str) -> int:
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# <- {kind_id}"):
                return n
    raise AssertionError(f"no line marked {kind_id}")


def test_every_family_is_covered():
    assert {k.id for k in breaks.ALL} == set(_PROGRAMS) | _NOT_BREAKS


@pytest.mark.parametrize("kind", [k for k in breaks.ALL], ids=lambda k: k.id)
def test_every_hint_says_what_to_change(kind):
    assert kind.why and kind.hint
    if kind.id not in _NOT_BREAKS:
        assert _ACTIONS.search(kind.hint), f"{kind.id}: {kind.hint!r} says nothing to do"


@pytest.mark.parametrize("kind_id", sorted(_PROGRAMS))
def test_break_names_the_users_line_and_a_fix(kind_id):
    fn = _PROGRAMS[kind_id]
    x = torch.randn(4, 4)
    with contextlib.redirect_stdout(io.StringIO()):
        expected = fn(x.clone())
        report = kiln_capture.explain(fn)(x.clone())
    torch.testing.assert_close(report.result, expected)
    found = [b for b in report.breaks if b.kind.id == kind_id]
    assert found, f"expected a {kind_id} break, got {[str(b) for b in report.breaks]}"
    brk = found[0]
    line = _marked_line(kind_id)
    assert (brk.filename, brk.lineno) == (__file__, line), str(brk)
    text = str(brk)
    assert f"at {__file__}:{line}" in text
    assert f"# <- {kind_id}" in text  # the line itself
    assert f"why: {brk.kind.why}" in text and f"fix: {brk.kind.hint}" in text


def _helper_breaks(x):
    return x + x.tolist()[0][0]  # <- helper


def calls_a_breaking_helper(x):
    y = x * 2
    return _helper_breaks(y)  # <- caller


def test_break_inside_an_inlined_call_names_both_lines():
    x = torch.randn(2, 2)
    report = kiln_capture.explain(calls_a_breaking_helper)(x)
    torch.testing.assert_close(report.result, calls_a_breaking_helper(x))
    brk = report.breaks[0]
    assert (brk.filename, brk.lineno) == (__file__, _marked_line("helper"))
    assert f"{__file__}:{_marked_line('caller')}" in str(brk)


def test_fullgraph_error_carries_the_same_report():
    fn = kiln_capture.optimize(lambda gm, ex: gm.forward, fullgraph=True)(tensor_to_python)
    with pytest.raises(kiln_capture.GraphBreakError) as info:
        fn(torch.randn(2, 2))
    message = str(info.value)
    assert f"{__file__}:{_marked_line('B004')}" in message
    assert f"fix: {breaks.TENSOR_TO_PYTHON.hint}" in message


def iterates_an_unmodeled_value(x):
    for byte in _BUFFER:  # <- eager
        x = x + byte
    return x


def test_frame_run_eagerly_warns_with_the_breaks_line_and_fix():
    """A break with no continuation runs the rest of the frame eagerly: its warning (and
    explain's eager_frames) names the break's own line and the hint, not only the frame."""
    x = torch.randn(2)
    with pytest.warns(RuntimeWarning) as caught:
        report = kiln_capture.explain(iterates_an_unmodeled_value)(x)
    torch.testing.assert_close(report.result, iterates_an_unmodeled_value(x))
    (frame,) = report.eager_frames
    where = f"{__file__}:{_marked_line('eager')}"
    assert where in frame and "fix: " in frame
    assert any(where in str(w.message) for w in caught)


_CHECKSUM = zlib.crc32  # a C function kiln does not model


def calls_a_c_function(x):
    return x + _CHECKSUM(b"kiln") % 3  # <- named


def test_unknown_callable_is_named():
    x = torch.randn(2)
    report = kiln_capture.explain(calls_a_c_function)(x)
    torch.testing.assert_close(report.result, calls_a_c_function(x))
    (brk,) = report.breaks
    assert brk.kind is breaks.UNKNOWN_CALLABLE and "zlib.crc32" in brk.detail
    assert (brk.filename, brk.lineno) == (__file__, _marked_line("named"))
