"""QSGDConfig: defaults, bits, from_bits, and one test per validation message."""
import dataclasses

import pytest

from qsgd import ConfigError, QSGDConfig


def test_defaults_and_bits():
    cfg = QSGDConfig()
    assert (cfg.levels, cfg.bucket_size, cfg.norm, cfg.codec) == (7, 512, "max", "packed")
    assert cfg.bits == 4
    # 2s + 1 codes need ceil(log2(2s + 1)) bits
    assert [QSGDConfig(levels=s).bits for s in (1, 2, 3, 4, 7, 8, 127, 128, 32767)] == \
        [2, 3, 3, 4, 4, 5, 8, 9, 16]


@pytest.mark.parametrize("b", range(2, 17))
def test_from_bits(b):
    cfg = QSGDConfig.from_bits(b, bucket_size=128, norm="l2", codec="elias")
    assert cfg.levels == 2 ** (b - 1) - 1
    assert cfg.bits == b
    assert (cfg.bucket_size, cfg.norm, cfg.codec) == (128, "l2", "elias")


def test_frozen_and_to_dict():
    cfg = QSGDConfig(levels=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.levels = 4
    assert cfg.to_dict() == {"levels": 3, "bucket_size": 512, "norm": "max", "codec": "packed", "bits": 3}


@pytest.mark.parametrize("kwargs, match", [
    ({"levels": 0}, r"levels must be in \[1, 32767\], got 0"),
    ({"levels": 32768}, r"levels must be in \[1, 32767\], got 32768"),
    ({"levels": 2.0}, r"levels must be an int, got 2.0 \(float\)"),
    ({"levels": True}, r"levels must be an int, got True \(bool\)"),
    ({"bucket_size": 0}, r"bucket_size must be in \[1, 2147483647\], got 0"),
    ({"bucket_size": 2**31}, r"bucket_size must be in \[1, 2147483647\], got 2147483648"),
    ({"bucket_size": "512"}, r"bucket_size must be an int, got '512' \(str\)"),
    ({"norm": "l1"}, r"norm must be one of \['l2', 'max'\], got 'l1'"),
    ({"codec": "huffman"}, r"codec must be one of \['elias', 'packed'\], got 'huffman'"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        QSGDConfig(**kwargs)


def test_config_error_is_value_error():
    with pytest.raises(ValueError):
        QSGDConfig(levels=-1)


@pytest.mark.parametrize("bits, match", [
    (1, r"bits must be in \[2, 16\], got 1"),
    (17, r"bits must be in \[2, 16\], got 17"),
    (4.0, r"bits must be an int, got 4.0 \(float\)"),
])
def test_from_bits_errors(bits, match):
    with pytest.raises(ConfigError, match=match):
        QSGDConfig.from_bits(bits)


def test_from_bits_refuses_levels():
    with pytest.raises(ConfigError, match=r"from_bits sets levels from bits; got levels=3 too"):
        QSGDConfig.from_bits(4, levels=3)
