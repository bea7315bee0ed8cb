"""The language-independent core of kernel code generation, shared by the backends.

``index_printer.IndexPrinter``: sympy index expressions as source text (a language sets its
spellings). ``ops_handler.OpsHandler``: the ops-handler skeleton (named values with common
subexpression elimination, the shape of each virtual op, literals, checked indirect
indices) that kiln-cpp and kiln-triton spell in C++ and Triton.
"""
