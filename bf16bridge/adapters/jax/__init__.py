"""The jax adapter; the registry imports ``convert`` on first use."""
