"""Per-layer sizes of the published architectures and their compute-time model."""

import pytest

from tailcut.simulate import architectures


@pytest.mark.parametrize("build, params, layers", [
    (architectures.resnet50, 25_583_592, 54),      # tf.keras ResNet50 trainable params
    (architectures.vgg16, 138_357_544, 16),        # VGG-16 configuration D
    (architectures.inception_v3, 23_817_352, 95),  # tf.keras InceptionV3 trainable params
])
def test_generated_architectures_match_the_published_parameter_counts(build, params, layers):
    arch = build()
    assert arch.params == params
    assert len(arch.layers) == layers


def test_compute_time_is_batch_over_published_throughput_split_by_multiply_adds():
    arch = architectures.resnet50(batch=32)
    assert arch.compute_s == pytest.approx(32 / 53.9)
    big = max(arch.layers, key=lambda l: l.macs)
    small = min(arch.layers, key=lambda l: l.macs)
    assert big.fwd_s / small.fwd_s == pytest.approx(big.macs / small.macs)
    assert all(l.bwd_s == pytest.approx(2 * l.fwd_s) for l in arch.layers)


def test_vgg16_first_dense_layer_is_the_largest_tensor():
    arch = architectures.vgg16()
    fc1 = next(l for l in arch.layers if l.name == "fc1")
    assert fc1.params == 25088 * 4096 + 4096
    assert fc1 == max(arch.layers, key=lambda l: l.params)


def test_project_models_get_measured_compute_time_and_their_tensor_sizes():
    from tailcut.ml import models
    arch = architectures.get("mlp")
    dataset = models.dataset("mlp", seed=0)
    model = models.create("mlp", dataset)
    assert arch.params == model.num_params
    assert [l.name for l in arch.layers] == [l.name for l in model.layers]
    assert arch.compute_s > 0


def test_unknown_model_error_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: .*resnet-50"):
        architectures.get("alexnet")


def test_resnet_v1_200_follows_tf_slims_blocks_and_counts_64_7m_parameters():
    arch = architectures.resnet_v1_200()
    # 3 + 24 + 36 + 3 bottleneck units of 3 convs, a projection shortcut in each
    # block's first unit, conv1 and the logits: 204 messages.
    assert len(arch.layers) == 3 * 66 + 4 + 2
    assert arch.params == 64_673_832   # 64.7M, as timm lists its ResNet-200 (resnet200d)
    logits = arch.layers[-1]
    assert logits.params == 2048 * 1000 + 1000
    # the stride sits in each block's last unit: block2's units see 28x28 until the last
    by_name = {l.name: l for l in arch.layers}
    assert by_name["block2_unit23_conv2"].macs == 28 * 28 * 9 * 128 * 128
    assert by_name["block2_unit24_conv2"].macs == 14 * 14 * 9 * 128 * 128


def test_cifarnet_is_two_small_convs_and_a_big_fc3_timed_like_resnet50_per_mac():
    arch = architectures.cifarnet()
    assert [l.name for l in arch.layers] == ["conv1", "conv2", "fc3", "fc4", "logits"]
    assert [l.params for l in arch.layers] == [
        5 * 5 * 3 * 64 + 64, 5 * 5 * 64 * 64 + 64, 8 * 8 * 64 * 384 + 384,
        384 * 192 + 192, 192 * 10 + 10]
    resnet = architectures.resnet50()
    per_mac = resnet.compute_s / sum(l.macs for l in resnet.layers)
    assert arch.compute_s == pytest.approx(per_mac * sum(l.macs for l in arch.layers))
    assert "scaled by multiply-adds" in arch.source
