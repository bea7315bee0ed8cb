import torch

from kiln_aot import FakeTensor, fake_like


def test_fake_like_keeps_shape_stride_offset_dtype_device():
    base = torch.randn(6, 8, dtype=torch.float64)
    view = base.t()[2:]
    fake = fake_like(view)
    assert fake.shape == view.shape
    assert fake.stride() == view.stride()
    assert fake.storage_offset() == view.storage_offset()
    assert fake.dtype == view.dtype and fake.device == view.device


def test_ops_on_fakes_outside_a_trace_compute_metadata_only():
    a = FakeTensor(torch.empty(4, 5, device="meta"), torch.device("cuda", 1))
    b = FakeTensor(torch.empty(5, 3, device="meta"), torch.device("cuda", 1))
    c = (a @ b).sum(0, keepdim=True).to(torch.float16)
    assert isinstance(c, FakeTensor)
    assert tuple(c.shape) == (1, 3) and c.dtype == torch.float16
    assert c.device == torch.device("cuda", 1)
    assert c.meta.device.type == "meta"


def test_factory_device_argument_is_reported():
    a = FakeTensor(torch.empty(2, device="meta"), torch.device("cpu"))
    b = a.new_zeros(3, device="cuda")
    assert b.device.type == "cuda" and tuple(b.shape) == (3,)


def test_repr_does_not_touch_data():
    a = FakeTensor(torch.empty(2, 3, device="meta"), torch.device("cuda"))
    assert repr(a).startswith("FakeTensor(shape=(2, 3)")
