"""What running out of memory or disk while the data is read or indexed becomes: one line and an exit status
(errors.py), not a traceback. `reading_data` wraps the loading of a run's data (preflight, `gradcache eval`):

- MemoryError -> `DataTooLarge`, exit 4 (DATA_ERROR): the data as given does not fit (a format the program
  reads whole, or a held-out set too large to embed);
- an OSError with errno ENOSPC -> `DataDiskFull`, exit 74 (DISK_FULL).

Anonymous memory is what counts here: pages of memory-mapped files (Arrow) are the kernel's to drop.
"""
from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from gradcache.train.data.text.formats import file_suffixes, folder_names, listed
from gradcache.train.errors import DataDiskFull, DataTooLarge


@contextmanager
def reading_data(data: str, eval_data: str | None = None) -> Iterator[None]:
    """Turn MemoryError and ENOSPC raised inside into the program's errors, naming `data` (and `eval_data`)."""
    named = f"--data {data}" + (f" and --eval-data {eval_data}" if eval_data is not None else "")
    try:
        yield
    except MemoryError:
        # raised from None: the MemoryError's frames, and what they held, are released before the message
        raise DataTooLarge(
            f"ran out of memory while loading {named}; nothing was written. Give the data in a format read as "
            f"the run goes ({listed([*file_suffixes(), *folder_names()])} for text; an image folder, "
            "a caption table or webdataset shards for images), hold out fewer examples (--test-size, a smaller "
            "--eval-data, --eval-reference-size), or run where more memory is free") from None
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        where = f" ({error.filename})" if error.filename else ""
        raise DataDiskFull(errno.ENOSPC, f"no space left on the device while reading or indexing {named}{where}; "
                           "nothing was kept of it. Free space, then run the same command again") from None
