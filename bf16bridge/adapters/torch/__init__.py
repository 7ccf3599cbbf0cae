"""The torch adapter; the registry imports ``convert`` on first use."""
