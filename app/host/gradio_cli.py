"""The app's process under ``gradio app/main.py``: served as ``python app/main.py`` serves it, and gone with ``gradio``.

Gradio's CLI (``gradio/cli/commands/reload.py``) runs this file in a child, ``python -u app/main.py`` (``__name__``
is ``"__main__"`` there as well), with ``GRADIO_WATCH_*`` set, and waits on it. Those variables turn ``launch`` into
Gradio's reload mode (``gradio.http_server``, ``gradio.utils.watchfn``): a thread runs the file again in
``__main__`` (``main()`` a second time: a second ``Runtime``, built and dropped), looks for the launched Blocks among
the module's globals (``main()``'s is a local: "GRADIO_HOT_RELOAD: Launching demo not found in __main__"), then lists
and stats every ``.py`` and ``.css`` file under the script's folder and the working directory every 50 ms, which
took 10-25 % of a core with no browser (``benchmarks/gradio_idle.py``). A reload would swap in the module's
``demo``, whose ``Runtime`` is not the one the launch's gate and sweep serve. And on SIGTERM the CLI exits without
stopping its child, which kept serving the port.

``serve_plain`` undoes both before Gradio is imported (it reads the variables at import): the variables go, and the
process dies with its parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# what the CLI sets for its reload mode: GRADIO_WATCH_DIRS, _MODULE_NAME, _DEMO_NAME, _DEMO_PATH, _ENCODING
WATCH_PREFIX = "GRADIO_WATCH_"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def serve_plain(environ=None) -> bool:
    """Under ``gradio app/main.py`` (``GRADIO_WATCH_*`` in ``environ``, default ``os.environ``): drop those variables,
    so that ``launch`` starts no reload watcher, and make the process die with the ``gradio`` process. Whether it
    was under the CLI. Call it before ``gradio`` is imported."""
    environ = os.environ if environ is None else environ
    watch = [name for name in environ if name.startswith(WATCH_PREFIX)]
    for name in watch:
        del environ[name]
    if watch:
        die_with_parent()
    return bool(watch)


def die_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux; elsewhere nothing).

    Linux's ``PR_SET_PDEATHSIG`` rather than a thread that polls ``os.getppid``: the kernel sends it however the
    parent ends (SIGTERM, Ctrl-C, ``kill -9``), at once, with no thread waking an idle server, and the setting
    outlives ``os.execve`` (``app/main.py``'s re-exec for the allocator). SIGTERM, so that the app leaves as a
    host's SIGTERM makes it leave (its folder removed: ``AppFiles.exit_on_sigterm``). The kernel watches the
    thread that started the child; the ``gradio`` CLI starts it from its main thread, so that is the process.
    Elsewhere a child outlives a ``gradio`` process killed alone (Ctrl-C in a terminal reaches both)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    if os.getppid() != parent:  # the parent died before the kernel was asked: nobody would send the signal
        raise SystemExit(128 + signal.SIGTERM)
