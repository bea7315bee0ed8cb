"""kiln-aot: ahead-of-time autograd. Turns a torch-level FX graph (or any callable) into
ATen-level graphs a compiler can lower, and makes compiled graphs trainable.

Contract (what kiln-inductor and other compilers can rely on)
--------------------------------------------------------------

``trace(fn, example_inputs, *, decompositions=None) -> torch.fx.GraphModule``
    Runs ``fn`` on kiln's fake tensors (``FakeTensor``: meta-device data, real device
    reported) under a ``__torch_dispatch__`` tracer: nothing is computed. The graph:

    * placeholders are the flattened ``example_inputs``, in order (when ``fn`` is an
      ``nn.Module``, its parameters and buffers come first: ``TraceInfo.state_names``);
    * every ``call_function`` targets an OpOverload in ``CORE_ATEN_OPS`` or ``KEPT_OPS``, or
      ``operator.getitem`` (items of multi-output ops such as ``max.dim``, ``native_dropout``,
      ``convolution_backward``, ``max_pool2d_with_indices``);
    * it is functional: no op writes to its arguments; views are explicit view ops
      (``view``, ``permute``, ``expand``, ``slice``, ``select``, ``unsqueeze``,
      ``squeeze.dims``, ``as_strided``) and writes through views became ``*_scatter`` ops;
    * every placeholder / ``call_function`` / ``get_attr`` node has ``meta["val"]``: a
      ``kiln_aot.FakeTensor`` with the value's shape, stride, dtype and real device (ops on
      it compute metadata only);
    * it returns a tuple: one tensor per tensor output of ``fn``, then the new value of each
      input ``fn`` wrote to; ``gm.meta["kiln_aot"]`` (a ``TraceInfo``) says which is which;
    * tensor constants are ``get_attr`` nodes.
    Ops whose output shape depends on data (``nonzero``, ``unique``, boolean-mask indexing,
    ``.item()``) raise ``Unsupported`` (``.op`` names the op) so capture can break there.

``aot_graph(gm_or_fn, example_inputs, *, fw_compiler, bw_compiler=None, partition_fn=None,
decompositions=None) -> Callable``
    The backend entry point (what ``aot_module_simplified`` is to torch). ``gm_or_fn`` is a
    torch-level GraphModule (parameters as inputs, or as ``get_attr``s/submodule state; the
    latter become leading graph inputs) or any callable; the result is called like
    ``gm(*args)`` and returns the same outputs.

    * no grad needed (grad mode off, or no input requires grad): a forward-only graph goes to
      ``fw_compiler(aten_gm, example_inputs)``;
    * otherwise the joint forward+backward graph is traced and split by ``partition_fn``
      (default ``min_cut_partition``); ``fw_compiler`` gets the forward graph (returns the
      outputs, then the saved tensors), ``bw_compiler`` (default: ``fw_compiler``) the backward
      graph (takes the saved tensors then the tangents, returns the gradients). The two
      graphs say which they are in ``gm.meta["kiln_aot_training"]``: ``{"role": "forward",
      "outputs": n}`` (the first ``n`` outputs are returned to the caller, the rest saved
      for the backward only) and ``{"role": "backward"}``.

    Compiler protocol: ``compiler(gm, example_inputs) -> callable(*args) -> tuple | list``;
    ``gm`` takes flat positional args and returns a tuple; read shapes from the placeholders'
    ``meta["val"]`` (``example_inputs`` of the backward are those fake values). The runtime
    writes mutated inputs back, rebuilds outputs that alias inputs as real views, and
    compiles again for a new input signature or grad mode.

``aot_function(fn, fw_compiler, bw_compiler=None, partition_fn=min_cut_partition,
decompositions=None)`` / ``aot_module(module, ...)``: the same for plain callables and
modules (parameters and buffers become graph inputs; BatchNorm running stats are written
back like any input mutation).

``min_cut_partition`` / ``save_all_partition``: partitioners,
``partition_fn(joint_gm, joint_inputs, *, num_fwd_outputs) -> (fw_gm, bw_gm)``.
Dropout's mask is always computed once in the forward and saved for the backward.

``annotate(**meta)``: a context manager; ATen nodes traced inside it carry ``meta``
(``op_tracer.CARRIED_META``: ``recompute_in_backward``, ``collective_group``), as those of
a torch-level node carrying that metadata do.

``CORE_ATEN_OPS`` / ``KEPT_OPS``: the declared op sets (``kiln_aot.core_ops``).
``verify_graph(gm)`` checks the contract. ``tangent_copies()`` counts the tangents copied
before a compiled backward (backward_variants.py: the backward is compiled on its first
call, for the strides tangents arrive with, and again for each new set of strides). Settings: ``kiln_aot.config`` (``KILN_AOT_*``).
"""

from importlib.metadata import version as _version

from kiln_aot.api import aot_function, aot_graph, aot_module
from kiln_aot.backward_variants import reset_tangent_copies, tangent_copies
from kiln_aot.core_ops import CORE_ATEN_OPS, KEPT_OPS
from kiln_aot.decompositions import default_decompositions
from kiln_aot.errors import DoubleBackwardError, KilnAotError, PartitionError, Unsupported
from kiln_aot.fake import FakeTensor, fake_like
from kiln_aot.graph_trace import OutputInfo, TraceInfo, trace
from kiln_aot.op_tracer import annotate
from kiln_aot.partition import min_cut_partition, save_all_partition
from kiln_aot.verify import ContractViolation, verify_graph

__version__: str = _version("kiln-aot")

__all__ = [
    "CORE_ATEN_OPS",
    "KEPT_OPS",
    "ContractViolation",
    "DoubleBackwardError",
    "FakeTensor",
    "KilnAotError",
    "OutputInfo",
    "PartitionError",
    "TraceInfo",
    "Unsupported",
    "__version__",
    "aot_function",
    "aot_graph",
    "annotate",
    "aot_module",
    "default_decompositions",
    "fake_like",
    "min_cut_partition",
    "reset_tangent_copies",
    "save_all_partition",
    "tangent_copies",
    "trace",
    "verify_graph",
]
