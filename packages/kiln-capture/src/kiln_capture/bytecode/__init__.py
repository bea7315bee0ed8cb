"""Bytecode generation: trampolines for handled frames, continuation (resume) functions."""
