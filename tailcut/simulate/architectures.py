"""Per-layer parameter sizes and compute times of real architectures, for the simulator.

Parameter counts are generated from the published layer definitions, not typed in:
ResNet-50 (He et al. 2015, v1 as in tf.keras.applications: conv with bias + batch norm),
VGG-16 (Simonyan & Zisserman 2014, configuration D) and Inception-v3 (Szegedy et al.
2015, as in keras.applications: conv without bias + batch norm with beta only, no
auxiliary head). Only trainable tensors travel between workers and PS; their totals
match the counts tf.keras.applications prints (ResNet-50 25,583,592 trainable of
25,636,712; VGG-16
138,357,544; Inception-v3 23,817,352 trainable of 23,851,784), which the tests pin.

One `Layer` is one conv or dense layer with its bias / batch-norm vectors: the unit a
parameter server holds and a push or pull moves as one message.

Compute time: the TensorFlow benchmark table (tensorflow.org/performance/benchmarks,
April 2017, Google Compute Engine, one NVIDIA K80, synthetic data, batch 32:
Inception-v3 29.3 images/s, ResNet-50 53.9, VGG-16 30.3) gives the time of a whole
iteration, batch / throughput. We split it over the layers by their multiply-adds
(forward) and take backward = 2 x forward, a standard rule of thumb (the backward pass
computes a gradient for both the inputs and the weights). The paper traced its own
runs on a K80 (Azure NC6), so these are the same class of GPU but not its numbers.
The project's own models (tailcut.ml.models) get their compute time measured
on this machine instead (see `from_project_model`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

BYTES_PER_PARAM = 4  # float32
BACKWARD_OVER_FORWARD = 2.0


@dataclass(frozen=True)
class Layer:
    """One message-sized unit of a model: parameters and forward/backward seconds."""

    name: str
    params: int
    macs: int
    fwd_s: float = 0.0
    bwd_s: float = 0.0

    @property
    def bytes(self) -> int:
        return self.params * BYTES_PER_PARAM


@dataclass(frozen=True)
class Architecture:
    """A model as the network sees it: layers in forward order and where the compute
    times come from."""

    name: str
    layers: tuple[Layer, ...]
    batch: int
    source: str

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def compute_s(self) -> float:
        return sum(layer.fwd_s + layer.bwd_s for layer in self.layers)


# images/s on one K80, batch 32 (tensorflow.org/performance/benchmarks, GCE, synthetic).
K80_IMAGES_PER_S = {"inception-v3": 29.3, "resnet-50": 53.9, "vgg-16": 30.3}
K80_SOURCE = ("tensorflow.org/performance/benchmarks (Apr 2017), 1x K80 on GCE, "
              "synthetic data, batch 32; split over layers by multiply-adds, bwd = 2 x fwd")


class _Builder:
    """Tracks channels and spatial size while layers are appended."""

    def __init__(self, size: int, channels: int) -> None:
        self.size = size
        self.channels = channels
        self.layers: list[Layer] = []

    def conv(self, name: str, out: int, kh: int, kw: int | None = None, stride: int = 1,
             valid: bool = False, bias: bool = False, bn: int = 2,
             cin: int | None = None, size: int | None = None) -> int:
        """Append a conv (+ batch norm with `bn` trainable vectors); return out size."""
        kw = kh if kw is None else kw
        cin = self.channels if cin is None else cin
        size = self.size if size is None else size
        if valid:
            out_size = (size - max(kh, kw)) // stride + 1
        else:
            out_size = -(-size // stride)
        params = kh * kw * cin * out + (out if bias else 0) + bn * out
        macs = out_size * out_size * kh * kw * cin * out
        self.layers.append(Layer(name, params, macs))
        return out_size

    def dense(self, name: str, fan_in: int, out: int) -> None:
        self.layers.append(Layer(name, fan_in * out + out, fan_in * out))


def _with_times(name: str, layers: list[Layer], batch: int, iteration_s: float,
                source: str) -> Architecture:
    total = sum(layer.macs for layer in layers) or 1
    fwd_total = iteration_s / (1 + BACKWARD_OVER_FORWARD)
    timed = tuple(Layer(l.name, l.params, l.macs, fwd_total * l.macs / total,
                        BACKWARD_OVER_FORWARD * fwd_total * l.macs / total) for l in layers)
    return Architecture(name, timed, batch, source)


def vgg16(batch: int = 32) -> Architecture:
    b = _Builder(224, 3)
    config: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"]
    block, index = 1, 1
    for item in config:
        if item == "M":
            b.size //= 2
            block, index = block + 1, 1
            continue
        b.conv(f"block{block}_conv{index}", int(item), 3, bias=True, bn=0)
        b.channels = int(item)
        index += 1
    b.dense("fc1", 7 * 7 * 512, 4096)
    b.dense("fc2", 4096, 4096)
    b.dense("predictions", 4096, 1000)
    return _with_times("vgg-16", b.layers, batch, batch / K80_IMAGES_PER_S["vgg-16"],
                       K80_SOURCE)


def resnet50(batch: int = 32) -> Architecture:
    b = _Builder(224, 3)
    b.size = b.conv("conv1", 64, 7, stride=2, bias=True)
    b.channels = 64
    b.size //= 2  # 3x3 max pool, stride 2: 112 -> 56
    stages = [(2, 3, (64, 64, 256)), (3, 4, (128, 128, 512)),
              (4, 6, (256, 256, 1024)), (5, 3, (512, 512, 2048))]
    for stage, blocks, (f1, f2, f3) in stages:
        for i in range(blocks):
            tag = f"res{stage}{'abcdef'[i]}"
            stride = 2 if i == 0 and stage > 2 else 1
            cin, size = b.channels, b.size
            out = b.conv(f"{tag}_branch2a", f1, 1, stride=stride, bias=True)
            b.conv(f"{tag}_branch2b", f2, 3, bias=True, cin=f1, size=out)
            b.conv(f"{tag}_branch2c", f3, 1, bias=True, cin=f2, size=out)
            if i == 0:
                b.conv(f"{tag}_branch1", f3, 1, stride=stride, bias=True, cin=cin, size=size)
            b.channels, b.size = f3, out
    b.dense("fc1000", 2048, 1000)
    return _with_times("resnet-50", b.layers, batch, batch / K80_IMAGES_PER_S["resnet-50"],
                       K80_SOURCE)


def inception_v3(batch: int = 32) -> Architecture:
    b = _Builder(299, 3)

    def cbn(name: str, out: int, kh: int, kw: int | None = None, stride: int = 1,
            valid: bool = False, cin: int | None = None, size: int | None = None) -> int:
        # keras' conv2d_bn: no conv bias, batch norm with scale=False (beta only).
        return b.conv(name, out, kh, kw, stride, valid, bias=False, bn=1, cin=cin, size=size)

    for name, out, k, stride, valid in (("conv1", 32, 3, 2, True), ("conv2", 32, 3, 1, True),
                                        ("conv3", 64, 3, 1, False)):
        b.size = cbn(name, out, k, stride=stride, valid=valid)
        b.channels = out
    b.size = (b.size - 3) // 2 + 1  # max pool 3x3/2: 147 -> 73
    b.size = cbn("conv4", 80, 1, valid=True)
    b.channels = 80
    b.size = cbn("conv5", 192, 3, valid=True)
    b.channels = 192
    b.size = (b.size - 3) // 2 + 1  # 71 -> 35

    for m, pool in enumerate((32, 64, 64)):  # mixed0-2, 35x35
        cin = b.channels
        cbn(f"mixed{m}_1x1", 64, 1)
        cbn(f"mixed{m}_5x5a", 48, 1)
        cbn(f"mixed{m}_5x5b", 64, 5, cin=48)
        cbn(f"mixed{m}_dbl_a", 64, 1)
        cbn(f"mixed{m}_dbl_b", 96, 3, cin=64)
        cbn(f"mixed{m}_dbl_c", 96, 3, cin=96)
        cbn(f"mixed{m}_pool", pool, 1, cin=cin)
        b.channels = 64 + 64 + 96 + pool

    cin, size = b.channels, b.size  # mixed3: 35 -> 17
    out = cbn("mixed3_3x3", 384, 3, stride=2, valid=True)
    cbn("mixed3_dbl_a", 64, 1)
    cbn("mixed3_dbl_b", 96, 3, cin=64)
    cbn("mixed3_dbl_c", 96, 3, stride=2, valid=True, cin=96)
    b.channels, b.size = 384 + 96 + cin, out

    for m, c in ((4, 128), (5, 160), (6, 160), (7, 192)):  # 17x17
        cin = b.channels
        cbn(f"mixed{m}_1x1", 192, 1)
        cbn(f"mixed{m}_7x7a", c, 1)
        cbn(f"mixed{m}_7x7b", c, 1, 7, cin=c)
        cbn(f"mixed{m}_7x7c", 192, 7, 1, cin=c)
        cbn(f"mixed{m}_dbl_a", c, 1, cin=cin)
        cbn(f"mixed{m}_dbl_b", c, 7, 1, cin=c)
        cbn(f"mixed{m}_dbl_c", c, 1, 7, cin=c)
        cbn(f"mixed{m}_dbl_d", c, 7, 1, cin=c)
        cbn(f"mixed{m}_dbl_e", 192, 1, 7, cin=c)
        cbn(f"mixed{m}_pool", 192, 1, cin=cin)
        b.channels = 768

    cin = b.channels  # mixed8: 17 -> 8
    cbn("mixed8_3x3a", 192, 1)
    out = cbn("mixed8_3x3b", 320, 3, stride=2, valid=True, cin=192)
    cbn("mixed8_7x7a", 192, 1, cin=cin)
    cbn("mixed8_7x7b", 192, 1, 7, cin=192)
    cbn("mixed8_7x7c", 192, 7, 1, cin=192)
    cbn("mixed8_7x7d", 192, 3, stride=2, valid=True, cin=192)
    b.channels, b.size = 320 + 192 + cin, out

    for m in (9, 10):  # 8x8
        cin = b.channels
        cbn(f"mixed{m}_1x1", 320, 1)
        cbn(f"mixed{m}_3x3a", 384, 1, cin=cin)
        cbn(f"mixed{m}_3x3b", 384, 1, 3, cin=384)
        cbn(f"mixed{m}_3x3c", 384, 3, 1, cin=384)
        cbn(f"mixed{m}_dbl_a", 448, 1, cin=cin)
        cbn(f"mixed{m}_dbl_b", 384, 3, cin=448)
        cbn(f"mixed{m}_dbl_c", 384, 1, 3, cin=384)
        cbn(f"mixed{m}_dbl_d", 384, 3, 1, cin=384)
        cbn(f"mixed{m}_pool", 192, 1, cin=cin)
        b.channels = 2048
    b.dense("predictions", 2048, 1000)
    return _with_times("inception-v3", b.layers, batch,
                       batch / K80_IMAGES_PER_S["inception-v3"], K80_SOURCE)


def resnet_v1_200(batch: int = 32) -> Architecture:
    """ResNet-v1-200 as TF-slim defines it (nets/resnet_v1.py, the paper's TF-slim
    models): bottleneck units of blocks (64, 3), (128, 24), (256, 36), (512, 3), the
    stride in the 3x3 conv of each block's last unit (blocks 1-3), a 1x1 projection
    shortcut where the depth changes; convs without bias, each followed by batch norm
    with scale and offset (resnet_arg_scope); a 1x1 conv with bias as the 1000-class
    logits. Compute time: ResNet-50's K80 time per multiply-add (see `_k80_like`)."""
    b = _Builder(224, 3)
    b.size = b.conv("conv1", 64, 7, stride=2)
    b.channels = 64
    b.size = -(-b.size // 2)  # 3x3 max pool, stride 2, SAME: 112 -> 56
    for block, (base, units, stride) in enumerate(((64, 3, 2), (128, 24, 2),
                                                  (256, 36, 2), (512, 3, 1)), start=1):
        for unit in range(1, units + 1):
            tag = f"block{block}_unit{unit}"
            step = stride if unit == units else 1
            cin, size = b.channels, b.size
            if cin != 4 * base:
                b.conv(f"{tag}_shortcut", 4 * base, 1, stride=step)
            b.conv(f"{tag}_conv1", base, 1)
            out = b.conv(f"{tag}_conv2", base, 3, stride=step, cin=base)
            b.conv(f"{tag}_conv3", 4 * base, 1, cin=base, size=out)
            b.channels, b.size = 4 * base, out
    b.conv("logits", 1000, 1, bias=True, bn=0, size=1)
    return _k80_like("resnet-v1-200", b.layers, batch)


def cifarnet(batch: int = 32) -> Architecture:
    """CifarNet as TF-slim defines it (nets/cifarnet.py), on 32x32x3 images: conv1 5x5x64
    and conv2 5x5x64 (with bias, SAME), each followed by a 2x2/2 max pool, then fc3 384,
    fc4 192 and 10 logits (all with bias). Small early layers and one big late one
    (fc3 holds 90% of the parameters). Compute time: ResNet-50's K80 time per
    multiply-add (see `_k80_like`)."""
    b = _Builder(32, 3)
    b.conv("conv1", 64, 5, bias=True, bn=0)
    b.channels, b.size = 64, 16
    b.conv("conv2", 64, 5, bias=True, bn=0)
    b.size = 8
    b.dense("fc3", 8 * 8 * 64, 384)
    b.dense("fc4", 384, 192)
    b.dense("logits", 192, 10)
    return _k80_like("cifarnet", b.layers, batch)


def _k80_like(name: str, layers: list[Layer], batch: int) -> Architecture:
    """A model the K80 benchmark table does not list, timed at ResNet-50's K80 seconds
    per multiply-add: batch x (its multiply-adds / ResNet-50's) x ResNet-50's seconds
    per image. An assumption (small layers run below a GPU's peak rate, so CifarNet is
    likely slower than this), stated in the architecture's `source`; the simulator's
    compute_scale sweeps it anyway."""
    reference = resnet50(batch)
    ratio = sum(l.macs for l in layers) / sum(l.macs for l in reference.layers)
    return _with_times(name, layers, batch, reference.compute_s * ratio,
                       f"{K80_SOURCE}; not in that table: ResNet-50's K80 time scaled by "
                       f"multiply-adds (x{ratio:.4g})")


@functools.lru_cache(maxsize=None)
def from_project_model(name: str, batch: int = 32, repeats: int = 5) -> Architecture:
    """A model of tailcut.ml.models with its compute time measured here: the
    median of `repeats` loss_and_grad calls on a real batch, split over its tensors
    by parameter count (dense layers: multiply-adds = parameters per example).
    Measured once per process, so every policy of one run sees the same times."""
    import numpy as np

    from tailcut.ml import models

    dataset = models.dataset(name, seed=0)
    model = models.create(name, dataset)
    params = model.init_params(np.random.default_rng(0))
    x, y = dataset.x_train[:batch], dataset.y_train[:batch]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.loss_and_grad(params, x, y)
        times.append(time.perf_counter() - start)
    iteration_s = sorted(times)[len(times) // 2]
    layers = [Layer(layer.name, layer.size, layer.size * batch) for layer in model.layers]
    return _with_times(name, layers, batch, iteration_s,
                       f"measured on this host: median of {repeats} loss_and_grad calls "
                       f"at batch {batch} ({iteration_s * 1e3:.2f} ms), split by size")


BUILTIN = {"resnet-50": resnet50, "vgg-16": vgg16, "inception-v3": inception_v3,
           "resnet-v1-200": resnet_v1_200, "cifarnet": cifarnet}


def get(name: str, batch: int = 32) -> Architecture:
    """A built-in architecture or one of the project's models, by name."""
    if name in BUILTIN:
        return BUILTIN[name](batch)
    from tailcut.ml import models
    if name in models.names():
        return from_project_model(name, batch)
    known = sorted(BUILTIN) + models.names()
    raise ValueError(f"model {name!r} is unknown to the simulator; known: {', '.join(known)}")
