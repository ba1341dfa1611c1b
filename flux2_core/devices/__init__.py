"""Where the DiT runs when one device's memory is not enough: block streaming from host memory
(``streaming``), blocks placed across devices in one process (``placement``), and one DiT across processes
with tensor or sequence parallelism (``parallel``, loaded rank by rank by ``parallel_load``)."""
