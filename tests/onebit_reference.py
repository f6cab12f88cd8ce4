"""The single-process 1-bit Adam / 1-bit LAMB references the tests compare the hooks with: they ship with the
package (``birder_repro.references.onebit``) so that ``make gpu-check`` can use them on a GPU node."""

from birder_repro.references.onebit import (  # noqa: F401
    CompressedAllReduceReference,
    OneBitAdamReference,
    OneBitLambReference,
    compress,
    compressed_allreduce_reference,
    sign,
)
