"""Tiny random-weight models built locally and loaded through the libraries' real loaders."""
