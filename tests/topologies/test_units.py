import math

import pytest

from topologies import SpecError, parse_bandwidth, parse_bytes, parse_time


@pytest.mark.parametrize("text, expected", [
    ("256MB", 256_000_000), ("4KiB", 4096), ("1GiB", 2**30), ("1e6", 1_000_000),
    (1024, 1024), ("12 B", 12), ("1.5kB", 1500), ("2MiB", 2 * 2**20), ("3 bytes", 3),
    # nccl-tests' -b/-e suffixes: a bare K, M or G is binary (all_reduce_perf -e 4G = 4 GiB)
    ("4G", 4 * 2**30), ("64M", 64 * 2**20), ("1K", 1024), ("8k", 8192), ("4GB", 4_000_000_000),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected
    assert isinstance(parse_bytes(text), int)


@pytest.mark.parametrize("text, expected", [
    ("100Gbit", 12.5e9), ("100Gb/s", 12.5e9), ("100Gbps", 12.5e9), ("25GB/s", 25e9),
    ("25GBps", 25e9), ("10Mbit/s", 1.25e6), ("1GiB/s", 2.0**30), ("5e9", 5e9), (3.0, 3.0),
    ("400 Gbit/s", 50e9),
])
def test_parse_bandwidth(text, expected):
    assert math.isclose(parse_bandwidth(text), expected, rel_tol=1e-12)


@pytest.mark.parametrize("text, expected", [
    ("2us", 2e-6), ("2\u00b5s", 2e-6), ("1.5ms", 1.5e-3), ("5ns", 5e-9), ("1s", 1.0),
    ("0.25", 0.25), (1e-6, 1e-6), ("0", 0.0),
])
def test_parse_time(text, expected):
    assert math.isclose(parse_time(text), expected, rel_tol=1e-12)


@pytest.mark.parametrize("func, text, words", [
    (parse_bytes, "12QB", "unit 'QB'"),
    (parse_bytes, "MB", "no leading number"),
    (parse_bytes, "-4KB", "negative"),
    (parse_bytes, "1.5B", "whole number"),
    (parse_bandwidth, "10Gbt", "unit 'Gbt'"),
    (parse_bandwidth, "10G", "unit 'G'"),
    (parse_bandwidth, "0Gbit", "must be positive"),
    (parse_bandwidth, "infGbit", "no leading number"),
    (parse_bandwidth, True, "not understood"),
    (parse_time, "3 fortnights", "unit 'fortnights'"),
    (parse_time, "-1us", "negative"),
    (parse_time, None, "not understood"),
])
def test_unit_errors_say_what_was_not_understood(func, text, words):
    with pytest.raises(SpecError, match=words):
        func(text)


def test_spec_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_time("soon")
