"""What a benchmark prints about the machine it ran on (no tracegrad import,
so a script can set its environment first)."""


def blas_info():
    """The BLAS threadpoolctl sees: library, version, kernel and threads."""
    try:
        from threadpoolctl import threadpool_info
        return "; ".join(f"{i.get('internal_api')} {i.get('version')} "
                         f"{i.get('architecture')} threads={i.get('num_threads')}"
                         for i in threadpool_info())
    except ImportError:
        return "threadpoolctl not installed"
