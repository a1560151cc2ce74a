"""Where the warehouse and the checkpoints live: a local folder, or a URI of a store that both Hadoop (Spark) and
delta-rs (every reader without a JVM) reach: ``hdfs://``, ``s3a://``/``s3://``, ``abfss://``, ``gs://``,
``file://``.

``location(text, options)`` gives a ``pathlib.Path`` for a plain path (everything local works as it always did)
and a ``RemoteLocation`` for a URI. A ``RemoteLocation`` answers the few path operations the platform uses on
its bookkeeping (``/``, ``name``, ``parent``, ``exists``, ``mkdir``, ``read_text``, ``write_text``, ``replace``,
``iterdir``, ``glob``, ``unlink``) through delta-rs' object store, with the storage options of the settings
(``EVENTLAKE_STORAGE_OPTIONS``: credentials, endpoints). It is deliberately not ``os.PathLike``: code that would
hand it to ``open`` or ``shutil`` fails loudly instead of writing to a local folder named like the URI.

Spark gets ``str(location)`` (the URI); delta-rs gets ``delta_table(location)`` / ``storage_options(location)``.
"""
from __future__ import annotations

import fnmatch
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator, Mapping, Union
from urllib.parse import urlsplit
from lakehouse.errors import Unavailable

__all__ = ["Location", "RemoteLocation", "StorageError", "location", "is_remote", "remove_tree", "tree_bytes",
           "storage_options", "delta_table", "write_chunks", "read_chunks", "file_system"]


class StorageError(Unavailable, OSError):
    """A location that cannot be used as asked."""


class RemoteLocation:
    """A file or folder at a URI, handled through delta-rs' object store (no JVM, no libhdfs)."""

    __slots__ = ("uri", "options")

    def __init__(self, uri: str, options: Mapping[str, str] | None = None):
        parts = urlsplit(uri)
        if parts.scheme == "file":
            # Hadoop's own spelling (file:/path): Spark compares table locations as strings, and file:///path
            # is then "another" location than the one it qualifies (DELTA_AMBIGUOUS_PATHS_IN_CREATE_TABLE).
            self.uri = "file:/" + parts.path.strip("/")
        elif not parts.scheme or not parts.netloc:
            raise StorageError(f"{uri!r}: expected scheme://authority/path (e.g. hdfs://namenode:8020/eventlake)")
        else:
            self.uri = uri.rstrip("/") if parts.path.strip("/") else f"{parts.scheme}://{parts.netloc}/"
        self.options = dict(options or {})

    # -- naming -----------------------------------------------------------------------------------
    @property
    def _root(self) -> str:
        parts = urlsplit(self.uri)
        return "file:///" if parts.scheme == "file" else f"{parts.scheme}://{parts.netloc}/"

    @property
    def _key(self) -> str:
        """The path inside the store, without a leading slash ('' for the root)."""
        return urlsplit(self.uri).path.strip("/")

    def __truediv__(self, part) -> "RemoteLocation":
        part = str(part).strip("/")
        if not part:
            return self
        return RemoteLocation(self.uri + ("" if self.uri.endswith("/") else "/") + part, self.options)

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"RemoteLocation({self.uri!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RemoteLocation) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __lt__(self, other: "RemoteLocation") -> bool:
        return self.uri < other.uri

    def relative_to(self, other: "RemoteLocation") -> PurePosixPath:
        if not isinstance(other, RemoteLocation) or not self.uri.startswith(other.uri.rstrip("/") + "/"):
            raise ValueError(f"{self.uri} is not under {other}")
        return PurePosixPath(self.uri[len(other.uri.rstrip("/")) + 1:])

    @property
    def name(self) -> str:
        return self._key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "RemoteLocation":
        key = self._key
        return RemoteLocation(self._root + key.rsplit("/", 1)[0] if "/" in key else self._root, self.options)

    @property
    def parents(self) -> list["RemoteLocation"]:
        found, here = [], self
        while here._key:
            here = here.parent
            found.append(here)
        return found

    # -- the store --------------------------------------------------------------------------------
    def _handler(self):
        from deltalake.fs import DeltaStorageHandler

        try:
            return DeltaStorageHandler(self._root, self.options or None)
        except Exception as e:  # noqa: BLE001 -- delta-rs' errors name the store; say which location it was
            raise StorageError(f"{self.uri}: cannot open the store ({e})") from e

    def _info(self):
        import pyarrow.fs as pafs

        info = self._handler().get_file_info([self._key])[0]
        if info.type == pafs.FileType.NotFound and urlsplit(self.uri).scheme == "file" \
                and Path(urlsplit(self.uri).path).is_dir():
            return pafs.FileType.Directory, pafs.FileType  # the local store does not list an empty folder
        return info.type, pafs.FileType

    def exists(self) -> bool:
        kind, types = self._info()
        return kind != types.NotFound or self._has_children()

    def is_dir(self) -> bool:
        kind, types = self._info()
        return kind == types.Directory or (kind == types.NotFound and self._has_children())

    def _has_children(self) -> bool:
        """An object store has no folders: a prefix with objects under it is one."""
        return next(self.iterdir(), None) is not None

    def is_file(self) -> bool:
        kind, types = self._info()
        return kind == types.File

    def stat(self):
        """Size and modification time (``st_size``, ``st_mtime``), as far as the store keeps them."""
        import os

        info = self._handler().get_file_info([self._key])[0]
        if info.type == info.type.NotFound:
            raise FileNotFoundError(f"no such file: {self.uri}")
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        return os.stat_result((0, 0, 0, 0, 0, 0, info.size or 0, mtime, mtime, mtime))

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """Folders: what an object store does not have (there a folder is there once a file is under it)."""
        if urlsplit(self.uri).scheme == "file":
            Path(urlsplit(self.uri).path).mkdir(parents=parents, exist_ok=exist_ok)
        else:
            self._handler().create_dir(self._key, True)

    def read_bytes(self) -> bytes:
        try:
            stream = self._handler().open_input_stream(self._key)
        except Exception as e:  # noqa: BLE001 -- delta-rs raises FileNotFoundError or OSError, worded for Rust
            if not self.exists():
                raise FileNotFoundError(f"no such file: {self.uri}") from None
            raise StorageError(f"{self.uri}: cannot read ({e})") from e
        try:
            return stream.read()
        finally:
            stream.close()

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def write_bytes(self, data: bytes) -> int:
        # delta-rs' pyarrow wrapper of the output stream passes pyarrow Buffers where its stream takes bytes
        # (TypeError in deltalake 1.6); its own stream object takes bytes.
        stream = self._handler()._handler.open_output_stream(self._key)
        try:
            stream.write(bytes(data))
        finally:
            stream.close()
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    def write_chunks(self, chunks: Iterable[bytes]) -> int:
        """Write the file from ``chunks`` as they come (a file bigger than what the caller holds in memory)."""
        stream = self._handler()._handler.open_output_stream(self._key)
        written = 0
        try:
            for chunk in chunks:
                stream.write(bytes(chunk))
                written += len(chunk)
        finally:
            stream.close()
        return written

    def read_chunks(self, size: int) -> Iterator[bytes]:
        """The file's bytes, ``size`` at a time."""
        try:
            stream = self._handler().open_input_stream(self._key)
        except Exception as e:  # noqa: BLE001 -- as read_bytes
            if not self.exists():
                raise FileNotFoundError(f"no such file: {self.uri}") from None
            raise StorageError(f"{self.uri}: cannot read ({e})") from e
        try:
            while True:
                chunk = stream.read(size)
                if not chunk:
                    return
                yield bytes(chunk)
        finally:
            stream.close()

    def replace(self, target: "RemoteLocation") -> "RemoteLocation":
        """Rename (HDFS, local: atomic; an object store copies then deletes: readers may see both for a while)."""
        if not isinstance(target, RemoteLocation) or target._root != self._root:
            raise StorageError(f"cannot move {self.uri} to {target}: another store")
        handler = self._handler()
        handler.delete_file(target._key) if target.exists() else None
        handler.move(self._key, target._key)
        return target

    def unlink(self, missing_ok: bool = False) -> None:
        if not self.exists():
            if missing_ok:
                return
            raise FileNotFoundError(f"no such file: {self.uri}")
        self._handler().delete_file(self._key)

    def iterdir(self) -> Iterator["RemoteLocation"]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._key, allow_not_found=True, recursive=False)
        for info in self._handler().get_file_info_selector(selector):
            yield RemoteLocation(self._root + info.path.strip("/"), self.options)

    def glob(self, pattern: str) -> Iterator["RemoteLocation"]:
        """One level only (``*``, ``name-*``): all the platform asks of a remote folder."""
        if "/" in pattern or "**" in pattern:
            raise StorageError(f"{self.uri}: glob({pattern!r}) on a URI takes one level only")
        return (p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern))

    def rmdir(self) -> None:
        if urlsplit(self.uri).scheme == "file":  # the object store leaves local folders behind, empty
            Path(urlsplit(self.uri).path).rmdir()
        elif self.exists():
            self._handler().delete_dir(self._key)

    def tree_bytes(self) -> int:
        """The bytes of every file under this folder (0 when there is none)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._key, allow_not_found=True, recursive=True)
        return sum(info.size or 0 for info in self._handler().get_file_info_selector(selector)
                   if info.type == pafs.FileType.File)

    def remove_tree(self) -> None:
        if urlsplit(self.uri).scheme == "file":
            import shutil

            shutil.rmtree(urlsplit(self.uri).path, ignore_errors=True)
        elif self.exists():
            self._handler().delete_dir(self._key)

    def __fspath__(self):  # pragma: no cover -- the point is to refuse
        raise TypeError(f"{self.uri} is a URI, not a local path")


Location = Union[Path, RemoteLocation]


def is_remote(text_or_location) -> bool:
    """A URI (``scheme://...``, ``file:/...``), not a plain local path."""
    if isinstance(text_or_location, RemoteLocation):
        return True
    return len(urlsplit(str(text_or_location)).scheme) > 1 and not isinstance(text_or_location, Path)


def location(text: str | Path, options: Mapping[str, str] | None = None) -> Location:
    """A plain path -> a local ``Path`` (absolute); ``scheme://...`` -> a ``RemoteLocation``."""
    if isinstance(text, (Path, RemoteLocation)):
        return text
    if not is_remote(text):
        return Path(text).expanduser().resolve()
    return RemoteLocation(str(text), options)


def remove_tree(where: Location) -> None:
    """Delete a folder and everything in it; nothing there is fine."""
    if isinstance(where, RemoteLocation):
        where.remove_tree()
    else:
        import shutil

        shutil.rmtree(where, ignore_errors=True)


def tree_bytes(where: Location) -> int:
    """The bytes of every file under a folder (0 when it does not exist), a path or a URI."""
    if isinstance(where, RemoteLocation):
        return where.tree_bytes()
    where = Path(where)
    return sum(f.stat().st_size for f in where.rglob("*") if f.is_file()) if where.is_dir() else 0


def storage_options(where) -> dict[str, str] | None:
    """What delta-rs needs besides the URI to reach ``where`` (None for a local path)."""
    return (where.options or None) if isinstance(where, RemoteLocation) else None


def file_system(where: Location):
    """``(pyarrow.fs.FileSystem, path)``: a file system that reaches ``where`` and ``where``'s path in it (the
    local one and the absolute path; for a URI, delta-rs' object store and the path inside the store), for code
    that lists, reads and deletes files of a table (``lakehouse.erasure``)."""
    import pyarrow.fs as pafs

    if isinstance(where, RemoteLocation):
        return pafs.PyFileSystem(where._handler()), where._key
    return pafs.LocalFileSystem(), str(Path(where).resolve())


def delta_table(where, **kwargs):
    """``deltalake.DeltaTable`` of the table at ``where``, with its storage options."""
    from deltalake import DeltaTable

    return DeltaTable(str(where), storage_options=storage_options(where), **kwargs)


def write_chunks(where: Location, chunks: Iterable[bytes]) -> int:
    """Write the file at ``where`` (local or remote) from ``chunks``, never holding the whole of it."""
    if isinstance(where, RemoteLocation):
        return where.write_chunks(chunks)
    written = 0
    with open(where, "wb") as out:
        for chunk in chunks:
            out.write(chunk)
            written += len(chunk)
    return written


def read_chunks(where: Location, size: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of the file at ``where`` (local or remote), ``size`` at a time."""
    if isinstance(where, RemoteLocation):
        yield from where.read_chunks(size)
        return
    with open(where, "rb") as f:
        while chunk := f.read(size):
            yield chunk
