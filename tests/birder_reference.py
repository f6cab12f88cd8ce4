"""The single-process Birder reference the tests compare the hook with: it ships with the package
(``birder_repro.references.birder``) so that ``make gpu-check`` can use it on a GPU node."""

from birder_repro.references.birder import ReferenceBirder, quantize  # noqa: F401
