"""llama.cpp's quantizer in a child process: its C call cannot be interrupted (a signal that
arrives during it was swallowed in a ctypes log callback and the output written anyway), so
the parent waits on the child instead, where Ctrl+C and SIGTERM act at once, and kills it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]  # where the quantize package can be imported from
_CHILD = ("import sys; from quantize.llama_cpp_process import quantize_here; "
          "sys.exit(quantize_here(*sys.argv[1:]))")


def quantize_in_child(src: Path, out: Path, ftype: int, nthread: int) -> int:
    """llama_model_quantize(src, out) in a child process; its return code. Any exception
    here (KeyboardInterrupt, the SIGTERM handler's) kills the child first."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(src), str(out), str(ftype),
                              str(nthread)], stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)  # Ctrl+C reaches the parent only
    try:
        return child.wait()
    except BaseException:
        child.kill()
        child.wait()
        raise


def quantize_here(src: str, out: str, ftype: str, nthread: str) -> int:
    """The child's side: llama.cpp's quantizer with its log kept off the terminal."""
    import ctypes

    from localchat.engine.executors.llama_lib import llama_cpp

    from localchat.engine.executors import llamacpp_vocab  # noqa: F401  (silences llama.cpp's log)

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = int(ftype), int(nthread)
    return llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params))
