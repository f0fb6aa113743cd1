"""4-bit Hadamard shard storage: exact algebra, round trips, and that the rotation is what makes it work."""

import numpy as np
import pytest

from edge_spec.train.shard_quant import decode, decode_arrays, encode, encode_arrays, hadamard


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_hadamard_is_orthonormal_and_symmetric(n):
    h = hadamard(n)
    np.testing.assert_allclose(h @ h, np.eye(n), atol=1e-6)
    np.testing.assert_array_equal(h, h.T)
    assert set(np.unique(np.abs(h))) == {np.float32(1 / np.sqrt(n))}


def test_hadamard_rejects_other_sizes():
    with pytest.raises(ValueError, match="power of two"):
        hadamard(48)


def test_codes_on_the_grid_come_back_exactly():
    # values already on the int4 grid of their group (scale 0.5, one value at +-7 sets it) decode exactly
    rng = np.random.default_rng(0)
    q = rng.integers(-7, 8, size=(3, 5, 128)).astype(np.float32)
    q[..., 0], q[..., 64] = 7, -7
    x = q * 0.5
    codes, scales = encode(x, rotate=False)
    assert codes.shape == (3, 5, 64) and codes.dtype == np.uint8 and scales.shape == (3, 5, 2)
    np.testing.assert_array_equal(decode(codes, scales, rotate=False), x)


def test_rotation_cuts_the_error_of_outlier_channels():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 576)).astype(np.float32)
    x[:, 7] *= 40  # an outlier channel, as in real hidden states
    errors = {}
    for rotate in (False, True):
        y = decode(*encode(x, rotate=rotate), rotate=rotate)
        errors[rotate] = np.linalg.norm(y - x) / np.linalg.norm(x)
    assert errors[True] < 0.6 * errors[False]
    assert errors[True] < 0.12


def test_zero_groups_and_array_round_trip():
    arrays = {"tokens": np.arange(6, dtype=np.int32).reshape(2, 3), "hidden": np.zeros((2, 3, 64), np.float16),
              "k_29": np.ones((2, 3, 4, 64), np.float16), "v_29": -np.ones((2, 3, 4, 64), np.float16)}
    enc = encode_arrays(arrays)
    assert set(enc) == {"tokens", "hidden.codes", "hidden.scales", "k_29.codes", "k_29.scales", "v_29.codes",
                        "v_29.scales"}
    dec = decode_arrays(enc)
    np.testing.assert_array_equal(dec["tokens"], arrays["tokens"])
    np.testing.assert_array_equal(dec["hidden"], 0)
    np.testing.assert_allclose(dec["k_29"], 1, atol=1e-3)  # a constant row is one Hadamard coefficient
    np.testing.assert_allclose(dec["v_29"], -1, atol=1e-3)
    bits = sum(a.nbytes for k, a in enc.items() if k != "tokens") * 8
    assert bits / sum(a.size for k, a in arrays.items() if k != "tokens") == pytest.approx(4.25)


def test_group_must_divide_the_last_axis_and_small_axes_get_smaller_groups():
    with pytest.raises(ValueError, match="multiple of the group size"):
        encode(np.zeros((2, 100), np.float32), group=64)
    codes, scales = encode(np.ones((2, 48), np.float32))  # 48 = 16 x 3: groups of 16
    assert scales.shape == (2, 3)
    np.testing.assert_allclose(decode(codes, scales), 1, atol=1e-3)
