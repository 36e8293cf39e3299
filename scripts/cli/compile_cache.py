"""--compile's cache. torch.compile writes the code it generates, and the libraries built from it, under a folder it
reuses in later runs. A warm-up cut short (Ctrl-C, a killed process) can leave a library there half written, and
every later compile that finds it fails, minutes in, with an ImportError ("file too short") deep in a traceback.

So the commands compile into a folder of the project's own (`folder`: TORCHINDUCTOR_CACHE_DIR when the user set it,
else gemma4-mtp/torch-compile in the user's cache directory), remove that folder when a warm-up is interrupted, and
turn any failure inside the warm-up into one line that names the folder and both ways out (`compiling`).
"""

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

USER_SET = "TORCHINDUCTOR_CACHE_DIR"  # torch's own variable: a folder the user chose is never removed


def folder() -> tuple[Path, bool]:
    """The cache folder torch.compile will use, and whether it is ours (ours may be removed)."""
    if given := os.environ.get(USER_SET):
        return Path(given), False
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "gemma4-mtp" / "torch-compile", True


class CompileFailed(ValueError):
    """A failure inside torch.compile, as one line: the commands end with it, exit status 2 (a ValueError, as the
    other errors a user can act on are: cli/options.py `USER_ERRORS`)."""


@contextmanager
def compiling() -> Iterator[Path]:
    """Around a warm-up: torch.compile's cache in `folder()`; Ctrl-C removes it (ours only) and goes on up; any
    other failure becomes CompileFailed."""
    path, ours = folder()
    # Read by torch at each compile (torch._inductor.runtime.cache_dir_utils); kept for the rest of the process.
    os.environ[USER_SET] = str(path)
    try:
        yield path
    except KeyboardInterrupt:
        if ours:  # whatever it held may be half written: the next run starts from an empty cache
            shutil.rmtree(path, ignore_errors=True)
        raise
    except Exception as e:  # noqa: BLE001 (whatever torch.compile raises: its messages run to dozens of lines)
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        # torch's message opens with "backend='inductor' raised:"; the cause is the first line naming an error
        cause = next((line for line in lines if re.match(r"\w*(Error|Exception)\b", line)), lines[0] if lines else "")
        raise CompileFailed(f"torch.compile failed ({type(e).__name__}: {cause[:200]}). Its cache at {path} may be "
                            f"damaged (an interrupted warm-up leaves half-written files): remove that folder and run "
                            f"again, or run without --compile") from None
