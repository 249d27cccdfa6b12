"""Writing webdataset shards in tests: a .tar of KEY.EXT members in the order given."""
from __future__ import annotations

import io
import tarfile


def write_shard(path, samples) -> None:
    """A webdataset shard: `samples` is (key, {extension: bytes}), written in this member order."""
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for extension, data in members.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
