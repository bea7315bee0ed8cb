"""Tensor arithmetic, comparisons, methods, torch functions, shapes."""

import math
import operator

import torch
import torch.nn.functional as F

from corpus import T, case

SCALE = 0.5


@case()
def add_mul(x):
    return x + x * 2


@case(args=lambda: (T(3, 4), T(3, 4)))
def binary_ops(x, y):
    return x - y, x / (y.abs() + 1), x**2, -x, x // 2.0, x % 3.0


@case(args=lambda: (T(3, 4), T(4, 5)))
def matmul_op(x, y):
    return x @ y


@case()
def reverse_ops(x):
    return 1 - x, 2 / (x.abs() + 1), 3 * x, 2**x


@case()
def comparisons(x):
    return x > 0, x <= 0.5, x == x, x != 0


@case(args=lambda: (T(4, dtype=torch.int64), T(4, dtype=torch.int64)))
def bitwise(a, b):
    return a & b, a | b, a ^ b, ~a, a << 1, a >> 1


@case()
def inplace_on_fresh(x):
    y = x.clone()
    y += 1
    y *= 2
    y.add_(x)
    return y


@case()
def torch_functions(x):
    return torch.sin(x) + torch.cos(x) + torch.exp(-x.abs())


@case()
def functional_ops(x):
    return F.relu(x), F.gelu(x), F.softmax(x, dim=-1), F.silu(x)


@case(args=lambda: (T(2, 3, 4),))
def shape_arith(x):
    b, s, d = x.shape
    return x.view(b * s, d).sum(0) / (b * s)


@case(args=lambda: (T(2, 3, 4),))
def size_methods(x):
    return x.reshape(x.size(0), -1) * x.dim() + x.numel()


@case(args=lambda: (T(2, 3, 4),))
def views_and_permutes(x):
    return x.permute(2, 0, 1).contiguous().transpose(0, 1).flatten(1)


@case()
def tensor_properties(x):
    return x.T + x.mT, x.ndim, x.dtype, x.device, x.shape


@case()
def global_scalar(x):
    return x * SCALE


@case()
def math_module(x):
    return x * math.sqrt(2.0) + math.pi


@case()
def operator_module(x):
    return operator.add(x, 1), operator.mul(x, x)


@case()
def factories(x):
    return x + torch.ones(4, 4) + torch.zeros_like(x) + torch.full((4,), 2.0) + torch.arange(4.0)


@case()
def factory_dtype(x):
    return x.to(torch.float64) + torch.ones(4, 4, dtype=torch.float64)


@case()
def reductions(x):
    return x.sum(), x.mean(dim=1), x.amax(dim=0, keepdim=True), x.var(), x.norm()


@case()
def max_with_dim(x):
    values, indices = torch.max(x, dim=1)
    return values * 2, indices


@case()
def split_chunk(x):
    a, b = x.chunk(2, dim=0)
    c, d = torch.split(x, 2, dim=1)
    return a + b, c * d


@case()
def unbind_loop(x):
    total = torch.zeros(4)
    for row in x:
        total = total + row
    return total


@case()
def cat_stack(x):
    return torch.cat([x, x * 2], dim=0), torch.stack((x, x), dim=1)


@case()
def indexing(x):
    return x[0], x[:, 1], x[1:3, ::2], x[..., -1], x[None, :, 0]


@case(args=lambda: (T(4, 4), torch.tensor([0, 2, 3])))
def index_with_tensor(x, idx):
    return x[idx], x[:, idx]


@case()
def setitem_on_clone(x):
    y = x.clone()
    y[0] = 1.0
    y[:, 1] = y[:, 2] * 2
    return y


@case()
def where_and_clamp(x):
    return torch.where(x > 0, x, x * 0.1), x.clamp(-0.5, 0.5), x.clamp_min(0)


@case()
def dtype_casts(x):
    return x.int().float() + x.half().float(), x.to(dtype=torch.bfloat16)


@case()
def type_as_and_new(x):
    return x.new_zeros(2, 3), x.new_ones((4,)), torch.ones(4).type_as(x)


@case(args=lambda: (T(2, 3, 8, 8), T(4, 3, 3, 3)))
def conv_functional(x, w):
    return F.conv2d(x, w, padding=1)


@case(args=lambda: (T(2, 5, 8),))
def layer_norm_functional(x):
    return F.layer_norm(x, (8,))


@case(args=lambda: (T(2, 4, 6, 8), T(2, 4, 6, 8), T(2, 4, 6, 8)))
def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@case()
def einsum(x):
    return torch.einsum("ij,jk->ik", x, x)


@case()
def chained_methods(x):
    return x.abs().sqrt().log1p().neg().exp()


@case()
def scalar_tensor_mix(x):
    n = x.shape[0]
    return x / n + torch.tensor(3.0)


@case(graphs=1, breaks=0)
def random_ops(x):
    torch.manual_seed(0)  # runs before the graph (variables/rng.py): no break
    return x + torch.randn(4, 4)


@case()
def mean_of_list(x):
    parts = [x * i for i in range(3)]
    return sum(parts) / len(parts)


@case(args=lambda: (T(4, 4, grad=True),))
def requires_grad_input(x):
    return (x * 2).sum()


@case()
def detach_and_data(x):
    return x.detach() + x.data


@case()
def masked_fill(x):
    return x.masked_fill(x > 0, 0.0)


@case()
def triu_tril(x):
    return torch.triu(x) + torch.tril(x, diagonal=-1)


@case()
def expand_repeat(x):
    return x[:, :1].expand(4, 4) + x.repeat(1, 1)


@case()
def cumsum_sort(x):
    s, i = torch.sort(x, dim=-1)
    return x.cumsum(0), s, i, torch.topk(x, 2).values


@case()
def abs_builtin(x):
    return abs(x) + abs(-3)


@case()
def pow_builtin(x):
    return pow(x, 2) + round(2.6)
