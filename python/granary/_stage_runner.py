"""Granary's Python stage runner: the interpreter side of `python.map` and `python.filter`.

A Granary worker starts one of these per core and talks to it over a Unix socket (fd 3); element
data crosses through a shared-memory file both map (fd 4). It needs only the standard library and
NumPy: the worker ships this file itself, so the protocol always matches the worker that runs it.

Frames are a little-endian u32 length and a body. The worker first sends the setup (JSON: the
stages' functions and arguments, the folders to import from); the runner imports every function
once and answers with what it found (JSON). Then each call frame names a stage and the fields of
one element (or a group of elements), which lie in the shared memory; the runner calls the
function and writes what it returned after the inputs, or answers with the error and its
traceback. A call on several elements of an element-wise stage (op 2) runs the function once per
element, in order, and answers with each call's reply: one round trip carries a group. Input arrays are views of the shared memory, valid until the function returns. A
filter's function answers with one decision per element (status 3: a u32 count and one byte per
element, 1 to keep it), and its elements stay in the worker as they were.
"""

import hashlib
import inspect
import json
import mmap
import os
import socket
import struct
import sys
import traceback

import numpy as np

# Field kinds on the wire.
BYTES, TEXT, TENSOR, SAME = 0, 1, 2, 3
DTYPES = [np.dtype("uint8"), np.dtype("int32"), np.dtype("int64"), np.dtype("float32"), np.dtype("float64")]
DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}
# NumPy types that widen losslessly into one Granary carries.
WIDEN = {
    np.dtype("bool"): np.dtype("uint8"),
    np.dtype("int8"): np.dtype("int32"),
    np.dtype("int16"): np.dtype("int32"),
    np.dtype("uint16"): np.dtype("int32"),
    np.dtype("uint32"): np.dtype("int64"),
    np.dtype("float16"): np.dtype("float32"),
}
ALIGN = 64
CALL = struct.Struct("<BHBQQQI")
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")


MASK64 = (1 << 64) - 1


def splitmix(z):
    """SplitMix64: a bijective mix of 64 bits."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class Rng:
    """One `numpy.random.Generator` per runner, set to each call's seed: setting a PCG64 state
    costs a tenth of building a Generator. The state and the stream (increment) are both derived
    from the 64-bit seed the worker sends, itself drawn from the element's own seeded stream."""

    def __init__(self):
        self.bits = np.random.PCG64(0)
        self.generator = np.random.Generator(self.bits)

    def seeded(self, seed):
        self.bits.state = {
            "bit_generator": "PCG64",
            "state": {"state": (seed << 64) | splitmix(seed), "inc": (splitmix(seed ^ MASK64) << 1) | 1},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self.generator


RNG = None


class ReturnError(Exception):
    """The function returned something Granary cannot carry."""


class SetupError(Exception):
    """A function that cannot be found or called as the stage says, in words."""


class Connection:
    def __init__(self, fd):
        self.sock = socket.socket(fileno=fd)
        self.buffer = bytearray(1 << 16)

    def recv(self):
        """One frame's body. A frame (field descriptors, not data) usually arrives whole, in one
        read; a longer one is read to its end."""
        view = memoryview(self.buffer)
        got = 0
        while got < 4:
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise EOFError
            got += n
        (size,) = U32.unpack_from(self.buffer, 0)
        if 4 + size <= got:
            return self.buffer[4 : 4 + size]
        body = bytearray(size)
        body[: got - 4] = self.buffer[4:got]
        self._fill(memoryview(body)[got - 4 :])
        return body

    def _fill(self, view):
        while len(view):
            got = self.sock.recv_into(view)
            if got == 0:
                raise EOFError
            view = view[got:]

    def send(self, body):
        self.sock.sendall(U32.pack(len(body)) + body)


class Shared:
    """The shared memory, remapped when either side grows it."""

    def __init__(self, fd):
        self.fd = fd
        self.size = 0
        self.map_to(os.fstat(fd).st_size)

    def map_to(self, size):
        if size == self.size:
            return
        # Arrays the user kept may still point into the old mapping: it is dropped, not closed.
        self.mm = mmap.mmap(self.fd, size) if size else None
        self.size = size
        self.bytes = np.frombuffer(self.mm, np.uint8) if size else np.zeros(0, np.uint8)
        self.base = self.bytes.__array_interface__["data"][0] if size else 0

    def ensure(self, end):
        if end > self.size:
            size = max(end, self.size * 2, 1 << 20)
            size = (size + (1 << 20) - 1) & ~((1 << 20) - 1)
            os.ftruncate(self.fd, size)
            self.map_to(size)


class Stage:
    def __init__(self, spec):
        self.function = spec["function"]
        self.batched = bool(spec.get("batched"))
        self.filter = bool(spec.get("filter"))
        self.args = spec.get("args") or {}
        module_name, _, attr = self.function.partition(":")
        try:
            module = __import__(module_name, fromlist=["_"])
        except ModuleNotFoundError as e:
            if e.name is None or not module_name.startswith(e.name):
                raise  # the module itself imports something missing: show where
            raise SetupError(
                f"cannot import `{module_name}`: no module named `{e.name}` on the Python path "
                f"({sys.executable}; path {os.pathsep.join(sys.path[:4])}…)"
            ) from None
        target = module
        for part in attr.split("."):
            if not hasattr(target, part):
                raise SetupError(f"`{module_name}` ({getattr(module, '__file__', '?')}) has no `{attr}`")
            target = getattr(target, part)
        if not callable(target):
            raise SetupError(f"`{self.function}` is a {type(target).__name__}, not a function")
        self.fn = target
        self.file = getattr(module, "__file__", None) or ""
        self.sha256 = ""
        if self.file and os.path.isfile(self.file):
            with open(self.file, "rb") as f:
                self.sha256 = hashlib.sha256(f.read()).hexdigest()
        self.takes_rng = self.takes_key = False
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            params = None
        if params is not None:
            self.takes_rng = "rng" in params
            self.takes_key = ("keys" if self.batched else "key") in params
            extra = {}
            if self.takes_rng:
                extra["rng"] = None
            if self.takes_key:
                extra["keys" if self.batched else "key"] = None
            try:
                inspect.signature(target).bind(None, **self.args, **extra)
            except TypeError as e:
                shown = ", ".join(["element"] + [f"{k}=…" for k in list(self.args) + list(extra)])
                raise SetupError(f"`{self.function}` cannot be called as {attr}({shown}): {e}") from None

    def describe(self):
        return {"file": self.file, "sha256": self.sha256, "rng": self.takes_rng, "key": self.takes_key}


# A field descriptor after its name: kind, dtype, ndim, the extents, offset and size.
HEADS = [struct.Struct(f"<BBB{n}QQQ") for n in range(33)]


def head(ndim):
    if ndim >= len(HEADS):
        raise ReturnError(f"an array of {ndim} dimensions; at most {len(HEADS) - 1}")
    return HEADS[ndim]


def read_fields(body, at, count, shared, n, origins):
    """Decodes `count` fields of a call, as Python values over the shared memory. `origins` maps
    the id of each input array to (offset, array), so that an array returned as it came (or
    changed in place) goes back without a copy."""
    fields = {}
    mm = shared.mm
    for _ in range(count):
        name_len = body[at] | (body[at + 1] << 8)
        at += 2
        name = body[at : at + name_len].decode()
        at += name_len
        ndim = body[at + 2]
        h = HEADS[ndim]
        values = h.unpack_from(body, at)
        at += h.size
        kind, dtype = values[0], values[1]
        offset, nbytes = values[-2], values[-1]
        if kind == TENSOR:
            dt = DTYPES[dtype]
            array = np.frombuffer(mm, dt, nbytes // dt.itemsize, offset)
            if ndim == 0:
                fields[name] = array[0]
                continue
            if ndim != 1:
                array = array.reshape(values[3 : 3 + ndim])
            origins[id(array)] = (offset, array)
            fields[name] = array
            continue
        raw = mm[offset : offset + nbytes]
        if n is None:
            fields[name] = raw.decode() if kind == TEXT else raw
            continue
        lengths = struct.unpack_from(f"<{n}Q", body, at)
        at += 8 * n
        items, start = [], 0
        for length in lengths:
            value = raw[start : start + length]
            items.append(value.decode() if kind == TEXT else value)
            start += length
        fields[name] = items
    return fields, at


def as_array(name, value):
    array = np.asarray(value)
    if array.dtype in WIDEN:
        array = array.astype(WIDEN[array.dtype])
    if array.dtype not in DTYPE_CODE:
        kinds = ", ".join(str(d) for d in DTYPES)
        raise ReturnError(f"field `{name}` is a {array.dtype} array; return one of {kinds}")
    return array


def field_head(name, kind, dtype, shape, offset, nbytes):
    encoded = name.encode()
    return U16.pack(len(encoded)) + encoded + head(len(shape)).pack(kind, dtype, len(shape), *shape, offset, nbytes)


def write_result(result, inputs, origins, shared, out_offset, n):
    """Encodes the returned dict. Input arrays returned as they are stay where they are; other
    values are copied after the inputs (the shared memory grows when needed)."""
    if type(result) is not dict:
        if not isinstance(result, dict):
            raise ReturnError(f"returned {type(result).__name__}; return a dict of field name → value")
    heads = []
    copies = []  # (offset, array or bytes)
    cursor = out_offset
    for name, value in result.items():
        if type(name) is not str or not name:
            raise ReturnError(f"returned a field named {name!r}; field names are non-empty strings")
        kind = type(value)
        if kind is np.ndarray:
            origin = origins.get(id(value))
            if origin is not None and origin[1] is value:
                heads.append(field_head(name, TENSOR, DTYPE_CODE[value.dtype], value.shape, origin[0], value.nbytes))
                continue
        if n is not None:
            if kind in (list, tuple) and value and all(type(v) is str for v in value):
                payload = [v.encode() for v in value]
                kind = TEXT
            elif kind in (list, tuple) and value and all(isinstance(v, (bytes, bytearray)) for v in value):
                payload = [bytes(v) for v in value]
                kind = BYTES
            else:
                array = as_array(name, value)
                if array.ndim == 0 or array.shape[0] != n:
                    raise ReturnError(f"field `{name}` has shape {array.shape}; a batched function returns {n} rows")
                heads.append(field_head(name, TENSOR, DTYPE_CODE[array.dtype], array.shape, cursor, array.nbytes))
                copies.append((cursor, array))
                cursor = (cursor + array.nbytes + ALIGN - 1) // ALIGN * ALIGN
                continue
            joined = b"".join(payload)
            heads.append(
                field_head(name, kind, 0, (), cursor, len(joined)) + struct.pack(f"<{n}Q", *(len(p) for p in payload))
            )
            copies.append((cursor, joined))
            cursor = (cursor + len(joined) + ALIGN - 1) // ALIGN * ALIGN
            continue
        if kind is str or kind is bytes:
            if inputs.get(name) is value:
                heads.append(field_head(name, SAME, 0, (), 0, 0))
                continue
            data = value.encode() if kind is str else value
            heads.append(field_head(name, TEXT if kind is str else BYTES, 0, (), cursor, len(data)))
        elif kind is bytearray or kind is memoryview:
            data = bytes(value)
            heads.append(field_head(name, BYTES, 0, (), cursor, len(data)))
        else:
            array = as_array(name, value)
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            heads.append(field_head(name, TENSOR, DTYPE_CODE[array.dtype], array.shape, cursor, array.nbytes))
            data = array
        copies.append((cursor, data))
        size = data.nbytes if type(data) is np.ndarray else len(data)
        cursor = (cursor + size + ALIGN - 1) // ALIGN * ALIGN
    shared.ensure(cursor)
    whole = shared.bytes
    for at, data in copies:
        if type(data) is np.ndarray:
            if not data.flags.c_contiguous:
                data = np.ascontiguousarray(data)
            whole[at : at + data.nbytes] = data.reshape(-1).view(np.uint8)
        else:
            shared.mm[at : at + len(data)] = data
    return b"".join([b"\x00", U64.pack(shared.size), U16.pack(len(heads))] + heads), cursor


def decisions(result, n):
    """A filter's reply: whether to keep each element. Element-wise (`n` None) the result's truth
    value; batched, one truth value per element of a sequence or 1-D array of length `n`."""
    if n is None:
        try:
            keep = bool(result)
        except Exception as e:  # e.g. an array of several values, whose truth is ambiguous
            raise ReturnError(
                f"returned a {type(result).__name__} whose truth value is ambiguous ({e}); "
                "return True to keep the element, False to drop it"
            ) from None
        return b"\x03" + U32.pack(1) + (b"\x01" if keep else b"\x00")
    if isinstance(result, (list, tuple)):
        items = result
    else:
        array = np.asarray(result)
        if array.ndim != 1:
            raise ReturnError(
                f"returned {type(result).__name__} of shape {array.shape}; a batched filter returns one "
                f"boolean per element: a sequence or 1-D array of {n}"
            )
        items = array.tolist()
    if len(items) != n:
        raise ReturnError(f"returned {len(items)} decisions for a group of {n}; return one boolean per element")
    try:
        flags = bytes(1 if item else 0 for item in items)
    except Exception as e:
        raise ReturnError(f"returned decisions whose truth value is ambiguous ({e}); return booleans") from None
    return b"\x03" + U32.pack(n) + flags


def error_frame(message, raised=True):
    """An error reply: status 1 for an exception (with its traceback), 2 for a bad return."""
    encoded = message.encode("utf-8", "replace")
    return (b"\x01" if raised else b"\x02") + U32.pack(len(encoded)) + encoded


def user_traceback(e):
    """The exception with its traceback, without this runner's own frame."""
    tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(e), e, tb)).rstrip()


def seeded(seed):
    global RNG
    if RNG is None:
        RNG = Rng()
    return RNG.seeded(seed)


def apply(stage, fields, origins, shared, out_offset, group, seed, keys):
    """Calls the stage's function on `fields` and encodes its answer (a reply body); returns it
    with where the next outputs may start, and whether the call failed."""
    extra = {}
    if stage.takes_rng:
        extra["rng"] = seeded(seed)
    if stage.takes_key:
        if stage.batched:
            extra["keys"] = keys
        else:
            extra["key"] = keys[0]
    try:
        result = stage.fn(fields, **stage.args, **extra)
    except Exception as e:  # the user's code: report it, keep serving
        return error_frame(user_traceback(e)), out_offset, True
    try:
        if stage.filter:
            return decisions(result, group), out_offset, False
        reply, cursor = write_result(result, fields, origins, shared, out_offset, group)
        return reply, cursor, False
    except ReturnError as e:
        return error_frame(f"`{stage.function}` {e}", raised=False), out_offset, True


def call(stage, body, shared):
    """A call on one element, or on a group when the stage is batched (op 1)."""
    _, _, _, seed, size, out_offset, n = CALL.unpack_from(body, 0)
    shared.map_to(size)
    at = CALL.size
    keys = []
    for _ in range(n):
        (length,) = U32.unpack_from(body, at)
        at += 4
        keys.append(body[at : at + length].decode())
        at += length
    (count,) = U16.unpack_from(body, at)
    at += 2
    group = n if stage.batched else None
    origins = {}
    fields, at = read_fields(body, at, count, shared, group, origins)
    return apply(stage, fields, origins, shared, out_offset, group, seed, keys)[0]


def call_each(stage, body, shared):
    """A call of an element-wise stage on several elements (op 2): the function runs once per
    element, in order, each with its own seed; the reply holds each call's reply and stops after
    the first that failed. Outputs follow one another after the inputs."""
    _, _, _, _, size, out_offset, n = CALL.unpack_from(body, 0)
    shared.map_to(size)
    at = CALL.size
    replies = []
    for _ in range(n):
        (seed,) = U64.unpack_from(body, at)
        (length,) = U32.unpack_from(body, at + 8)
        at += 12
        key = body[at : at + length].decode()
        at += length
        (count,) = U16.unpack_from(body, at)
        at += 2
        origins = {}
        fields, at = read_fields(body, at, count, shared, None, origins)
        reply, out_offset, failed = apply(stage, fields, origins, shared, out_offset, None, seed, [key])
        replies.append(U32.pack(len(reply)))
        replies.append(reply)
        if failed:
            break
    return b"".join([b"\x04", U64.pack(shared.size), U32.pack(len(replies) // 2)] + replies)


def main():
    conn = Connection(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    shared = Shared(int(sys.argv[2]) if len(sys.argv) > 2 else 4)
    setup = json.loads(conn.recv())
    for path in reversed(setup.get("paths", [])):
        if path not in sys.path:
            sys.path.insert(0, path)
    stages = []
    for i, spec in enumerate(setup["stages"]):
        try:
            stages.append(Stage(spec))
        except SetupError as e:
            conn.send(json.dumps({"ok": False, "stage": i, "error": str(e)}).encode())
            return
        except BaseException as e:  # an import runs arbitrary code; say what it did
            detail = "importing it raised:\n" + user_traceback(e)
            conn.send(json.dumps({"ok": False, "stage": i, "error": detail}).encode())
            return
    conn.send(
        json.dumps(
            {
                "ok": True,
                "pid": os.getpid(),
                "python": sys.version.split()[0],
                "numpy": np.__version__,
                "stages": [s.describe() for s in stages],
            }
        ).encode()
    )
    if setup.get("check"):
        return
    while True:
        try:
            body = conn.recv()
            (stage,) = U16.unpack_from(body, 1)
            run = call_each if body[0] == 2 else call
            conn.send(run(stages[stage], body, shared))
        except (EOFError, ConnectionError):
            return  # the worker is gone (it ended, or was killed): so is this runner


if __name__ == "__main__":
    main()
