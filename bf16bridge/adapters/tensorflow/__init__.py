"""The tensorflow adapter; the registry imports ``convert`` on first use."""
