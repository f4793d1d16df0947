"""Counter-based randomness: the torch and numba hashes agree with the integer specification,
streams are reproducible, distinct and uniform."""
import numpy as np
import pytest
import torch

from qsgd import _kernels, rng

RNG = np.random.default_rng(1234)
WORDS = np.concatenate([np.array([0, 1, 2, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF], dtype=np.uint64),
                        RNG.integers(0, 2**32, 2000, dtype=np.uint64)])


def test_mix32_known_values():
    # lowbias32 maps 0 to 0 (xorshift-multiply of zero); other values by the spec's steps
    assert rng.mix32_int(0) == 0
    h = 1
    h ^= h >> 16
    h = (h * 0x7FEB352D) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x846CA68B) & 0xFFFFFFFF
    h ^= h >> 16
    assert rng.mix32_int(1) == h


def test_torch_mix32_matches_spec():
    got = rng.mix32(torch.from_numpy(WORDS.astype(np.int64))).numpy()
    want = np.array([rng.mix32_int(int(w)) for w in WORDS], dtype=np.int64)
    np.testing.assert_array_equal(got, want)


def test_numba_mix32_matches_spec():
    got = [int(_kernels._mix32(np.uint32(w))) for w in WORDS[:300]]
    assert got == [rng.mix32_int(int(w)) for w in WORDS[:300]]


def test_hash_index_high_bits_match_spec():
    # indices beyond 2**32 mix in their high word: h = mix(mix(lo ^ k0) ^ k1 ^ mix(hi))
    key = rng.stream_key(7, 3, 2, 1)
    index = torch.tensor([5, 2**32 + 5, 2**33 + 5, 2**40 + 123], dtype=torch.int64)
    got = rng.hash_index(index, key).tolist()
    want = []
    for i in index.tolist():
        lo, hi = i & 0xFFFFFFFF, i >> 32
        want.append(rng.mix32_int(rng.mix32_int(lo ^ key[0]) ^ key[1] ^ rng.mix32_int(hi)))
    assert got == want
    assert len(set(got)) == 4


def test_stream_key_deterministic_and_distinct():
    assert rng.stream_key(1, 2, 3, 4) == rng.stream_key(1, 2, 3, 4)
    keys = {rng.stream_key(seed, rank, step, bucket)
            for seed in range(4) for rank in range(4) for step in range(4) for bucket in range(4)}
    assert len(keys) == 256
    # the argument positions are not interchangeable
    assert rng.stream_key(1, 0, 0, 0) != rng.stream_key(0, 1, 0, 0)
    assert all(0 <= k < 2**32 for k in rng.stream_key(2**64 - 1, 5, 6, 7))


@pytest.mark.parametrize("field", ["seed", "rank", "step", "bucket"])
def test_stream_key_errors(field):
    with pytest.raises(ValueError, match=rf"{field} must be in \[0, 2\*\*64\), got -1"):
        rng.stream_key(**{field: -1})
    with pytest.raises(ValueError, match=rf"{field} must be an int, got 1.5"):
        rng.stream_key(**{field: 1.5})


def test_uniforms_are_uniform_and_independent_across_ranks():
    n = 1 << 16
    index = torch.arange(n, dtype=torch.int64)
    u0 = rng.uniforms(index, rng.stream_key(0, 0, 0, 0)).double()
    u1 = rng.uniforms(index, rng.stream_key(0, 1, 0, 0)).double()
    assert u0.min() >= 0 and u0.max() < 1
    # chi-square over 64 equal bins: 63 degrees of freedom, 99.99% quantile ~ 113
    counts = torch.histc(u0, bins=64, min=0, max=1)
    chi2 = float(((counts - n / 64) ** 2 / (n / 64)).sum())
    assert chi2 < 113, chi2
    # correlation of two ranks' streams (sd 1/sqrt(n) = 0.004) and of neighbouring elements
    assert abs(float(torch.corrcoef(torch.stack([u0, u1]))[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(torch.stack([u0[:-1], u0[1:]]))[0, 1])) < 0.02
    assert abs(float(u0.mean()) - 0.5) < 0.01


def test_hash_index_with_a_known_bound_is_the_same_hash():
    # the bound only lets the torch path skip looking at the indices (a CUDA synchronisation)
    key = rng.stream_key(3)
    low = torch.arange(2**32 - 40, 2**32, dtype=torch.int64)
    across = torch.arange(2**32 - 20, 2**32 + 20, dtype=torch.int64)
    assert torch.equal(rng.hash_index(low, key, below=2**32), rng.hash_index(low, key))
    assert torch.equal(rng.hash_index(across, key, below=2**32 + 20), rng.hash_index(across, key))
