"""part_of: the plain settings a Dagster config holds, which the Dagster-free cores take."""

from dgx_assets.config_parts import part_of
from dgx_assets.edge.config import EdgeModelConfig
from dgx_assets.edge.convert import ConversionSettings
from dgx_assets.edge.parity import GateSettings


def test_the_part_is_a_plain_settings_object_with_the_configured_values():
    config = EdgeModelConfig(quantization="float16", representative_samples=7, max_negative_flip_rate=0.05)
    conversion, gate = part_of(config, ConversionSettings), part_of(config, GateSettings)
    assert type(conversion) is ConversionSettings and type(gate) is GateSettings  # no Dagster class in what cores get
    assert (conversion.quantization, conversion.representative_samples) == ("float16", 7)
    assert gate.max_negative_flip_rate == 0.05 and gate.max_accuracy_drop_points == GateSettings().max_accuracy_drop_points
    assert not hasattr(conversion, "max_test_images")  # the build's own fields stay behind
