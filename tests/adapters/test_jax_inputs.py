"""The jax adapter refuses a jax value with no array data to hand over: a PRNG key, by our
UnsupportedDtypeError naming jax.random.key_data."""

import pytest

import bf16bridge as bb


def test_jax_prng_key_is_refused_clearly():
    import jax

    with pytest.raises(bb.UnsupportedDtypeError, match="key_data"):
        bb.to_numpy(jax.random.key(0))
