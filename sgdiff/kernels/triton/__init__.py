"""Triton implementations of sgdiff ops. Imported only when a KernelSpec is loaded."""
