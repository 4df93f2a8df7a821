# cython: language_level=3
"""Compiled multipart send/receive over libzmq for ``pzq.zmqio`` (optional: zmqio falls back to its
pure-Python functions when this module is missing, fails to load, or PZQ_PURE_PYTHON=1).

No libzmq header or library is needed to build it: pyzmq's wheels bundle libzmq under a mangled name and
ship no zmq.h, so the functions are looked up at import in the libzmq that pyzmq itself loaded (found in
/proc/self/maps), and its version must be the one pyzmq reports. The few declarations used below are
libzmq's stable ABI (zmq.h 4.x: a message is 64 bytes aligned to a pointer).

Every function takes a pyzmq socket and reads its ``underlying`` address after checking ``_closed``, as
pyzmq's own calls do. Frames are bytes; frames of ``big`` bytes or more stay in libzmq's buffer (a
read-only memoryview of it, no copy), as zmqio's ``keep_big_frames`` asks.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_GET_SIZE
from libc.errno cimport EINTR
from libc.stdint cimport uintptr_t
from posix.dlfcn cimport RTLD_NOW, dlerror, dlopen, dlsym

import os

import zmq

cdef extern from *:
    """
    typedef struct { unsigned char _[64]; } __attribute__((aligned(sizeof(void *)))) pzq_msg_t;
    """
    ctypedef struct pzq_msg_t:
        unsigned char _[64]

ctypedef int (*f_msg_init)(pzq_msg_t *) noexcept nogil
ctypedef int (*f_msg_recv)(pzq_msg_t *, void *, int) noexcept nogil
ctypedef int (*f_msg_close)(pzq_msg_t *) noexcept nogil
ctypedef int (*f_msg_copy)(pzq_msg_t *, pzq_msg_t *) noexcept nogil
ctypedef void *(*f_msg_data)(pzq_msg_t *) noexcept nogil
ctypedef size_t (*f_msg_size)(const pzq_msg_t *) noexcept nogil
ctypedef int (*f_msg_more)(const pzq_msg_t *) noexcept nogil
ctypedef int (*f_msg_get)(const pzq_msg_t *, int) noexcept nogil
ctypedef const char *(*f_msg_gets)(const pzq_msg_t *, const char *) noexcept nogil
ctypedef int (*f_send)(void *, const void *, size_t, int) noexcept nogil
ctypedef int (*f_errno)() noexcept nogil
ctypedef void (*f_version)(int *, int *, int *) noexcept nogil

cdef f_msg_init msg_init
cdef f_msg_recv msg_recv
cdef f_msg_close msg_close
cdef f_msg_copy msg_copy
cdef f_msg_data msg_data
cdef f_msg_size msg_size
cdef f_msg_more msg_more
cdef f_msg_get msg_get
cdef f_msg_gets msg_gets
cdef f_send zsend
cdef f_errno zerrno

cdef int NOBLOCK = zmq.NOBLOCK
cdef int SNDMORE = zmq.SNDMORE
cdef int SRCFD = zmq.SRCFD
cdef int EAGAIN_ = zmq.EAGAIN
cdef int EINTR_ = EINTR
cdef int ETERM_ = zmq.ETERM
cdef int ENOTSOCK_ = zmq.ENOTSOCK
Again = zmq.Again


def _libzmq_path():
    """The file of the libzmq this process has loaded (pyzmq loaded it): its own, bundled one or the
    system's; pyzmq's backend module itself when libzmq is linked into it."""
    import zmq.backend.cython._zmq as backend

    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libzmq"):
                return parts[5].strip()
    return backend.__file__


cdef void *_sym(void *lib, const char *name) except NULL:
    cdef void *found = dlsym(lib, name)
    if found == NULL:
        raise ImportError(f"libzmq has no {name.decode()}")
    return found


cdef _load():
    global msg_init, msg_recv, msg_close, msg_copy, msg_data, msg_size, msg_more, msg_get, msg_gets
    global zsend, zerrno
    path = _libzmq_path()
    cdef void *lib = dlopen(os.fsencode(path), RTLD_NOW)
    if lib == NULL:
        raise ImportError(f"cannot open {path}: {dlerror().decode(errors='replace')}")
    cdef int major = 0, minor = 0, patch = 0
    (<f_version>_sym(lib, b"zmq_version"))(&major, &minor, &patch)
    if (major, minor, patch) != zmq.zmq_version_info():
        raise ImportError(f"{path} is libzmq {major}.{minor}.{patch}, pyzmq uses {zmq.zmq_version()}")
    msg_init = <f_msg_init>_sym(lib, b"zmq_msg_init")
    msg_recv = <f_msg_recv>_sym(lib, b"zmq_msg_recv")
    msg_close = <f_msg_close>_sym(lib, b"zmq_msg_close")
    msg_copy = <f_msg_copy>_sym(lib, b"zmq_msg_copy")
    msg_data = <f_msg_data>_sym(lib, b"zmq_msg_data")
    msg_size = <f_msg_size>_sym(lib, b"zmq_msg_size")
    msg_more = <f_msg_more>_sym(lib, b"zmq_msg_more")
    msg_get = <f_msg_get>_sym(lib, b"zmq_msg_get")
    msg_gets = <f_msg_gets>_sym(lib, b"zmq_msg_gets")
    zsend = <f_send>_sym(lib, b"zmq_send")
    zerrno = <f_errno>_sym(lib, b"zmq_errno")


_load()


cdef class _Kept:
    """A received frame left in libzmq's buffer; read it through ``memoryview(kept)``."""

    cdef pzq_msg_t msg

    def __cinit__(self):
        msg_init(&self.msg)

    def __dealloc__(self):
        msg_close(&self.msg)

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, msg_data(&self.msg), msg_size(&self.msg), 1, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass


cdef int _raise(int err) except -1:
    """zmq's exception for ``err``, as pyzmq raises it."""
    if err == EAGAIN_:
        raise Again(err)
    if err == ETERM_:
        raise zmq.ContextTerminated(err)
    raise zmq.ZMQError(err)


cdef void *_handle(sock) except NULL:
    if sock._closed:
        _raise(ENOTSOCK_)
    cdef void *handle = <void *><uintptr_t>sock.underlying
    if handle == NULL:
        _raise(ENOTSOCK_)
    return handle


cdef int _recv_frame(pzq_msg_t *msg, void *handle, int flags) except -1:
    """One frame into ``msg`` (initialised here; closed here on failure)."""
    cdef int rc, err
    msg_init(msg)
    while True:
        if flags & NOBLOCK:
            rc = msg_recv(msg, handle, flags)
        else:
            with nogil:
                rc = msg_recv(msg, handle, flags)
        if rc >= 0:
            return 0
        err = zerrno()
        if err == EINTR_:
            PyErr_CheckSignals()  # (a signal handler's exception leaves the frame unread)
            continue
        msg_close(msg)
        _raise(err)


cdef object _frame(pzq_msg_t *msg, Py_ssize_t big):
    """The frame's bytes, or for a big one a view of libzmq's buffer (zmq_msg_copy shares a long
    message's buffer, counting references: no bytes are copied). ``msg`` stays the caller's to close,
    unchanged (its ``more`` and properties are read after this)."""
    cdef size_t size = msg_size(msg)
    cdef _Kept kept
    if <Py_ssize_t>size < big:
        return PyBytes_FromStringAndSize(<char *>msg_data(msg), size)
    kept = _Kept()
    msg_copy(&kept.msg, msg)
    return memoryview(kept)


cdef object _message(void *handle, int flags, Py_ssize_t big, Py_ssize_t most_frames, pzq_msg_t *last):
    """One whole message's frames; its last frame is left open in ``last`` (its properties name the
    connection) for the caller to close. None, with nothing open, when the message has more than
    ``most_frames`` frames: the first ``most_frames`` are read, the rest is zmqio's to drain."""
    cdef list frames = []
    _recv_frame(last, handle, flags)
    while True:
        try:
            frames.append(_frame(last, big))
        except BaseException:
            msg_close(last)
            raise
        if not msg_more(last):
            return frames
        msg_close(last)
        if PyList_GET_SIZE(frames) >= most_frames:
            return None
        _recv_frame(last, handle, flags)


def recv(sock, int flags, Py_ssize_t big, Py_ssize_t most_frames):
    """One message's frames (zmq.Again when none waits, with NOBLOCK); None when it has more than
    ``most_frames`` frames (the first ``most_frames`` read, the rest left to drain)."""
    cdef void *handle = _handle(sock)
    cdef pzq_msg_t last
    frames = _message(handle, flags, big, most_frames, &last)
    if frames is not None:
        msg_close(&last)
    return frames


def recv_props(sock, int flags, Py_ssize_t big, Py_ssize_t most_frames, bint peer, bint user, bint fd):
    """``recv`` plus properties of the connection the message came over, as pyzmq's Frame.get gives
    them (zmq.ZMQError where libzmq has none): (frames, Peer-Address or None, User-Id or None, SRCFD or
    -1, also when libzmq has none), each only when asked for."""
    cdef void *handle = _handle(sock)
    cdef pzq_msg_t last
    cdef const char *text
    cdef int err, number = -1
    frames = _message(handle, flags, big, most_frames, &last)
    if frames is None:
        return None
    address = key = None
    try:
        if peer:
            text = msg_gets(&last, b"Peer-Address")
            if text == NULL:
                _raise(zerrno())
            address = text.decode()
        if user:
            text = msg_gets(&last, b"User-Id")
            if text == NULL:
                _raise(zerrno())
            key = text.decode()
        if fd:
            number = msg_get(&last, SRCFD)  # (-1 when libzmq has no such property, as zmqio's pure path)
    finally:
        msg_close(&last)
    return frames, address, key, number


def recv_many(sock, int flags, Py_ssize_t big, Py_ssize_t most_frames, Py_ssize_t most, Py_ssize_t most_bytes):
    """Up to ``most`` whole messages waiting on ``sock``, stopping once ``most_bytes`` are read, as a
    list of frame lists, and whether the next message had more than ``most_frames`` frames (its first
    ``most_frames`` read and dropped, the rest left to drain). zmq.Again when none waits."""
    cdef void *handle = _handle(sock)
    cdef pzq_msg_t last
    cdef list out = []
    cdef Py_ssize_t size = 0
    while PyList_GET_SIZE(out) < most and size < most_bytes:
        try:
            frames = _message(handle, flags, big, most_frames, &last)
        except Again:
            if PyList_GET_SIZE(out):
                return out, False
            raise
        if frames is None:
            return out, True
        msg_close(&last)
        for frame in <list>frames:
            size += len(frame)
        out.append(frames)
    return out, False


cdef int _send_frame(void *handle, frame, int flags) except -1:
    cdef Py_buffer view
    cdef int rc, err
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        while True:
            if flags & NOBLOCK:
                rc = zsend(handle, view.buf, view.len, flags)
            else:
                with nogil:
                    rc = zsend(handle, view.buf, view.len, flags)
            if rc >= 0:
                return 0
            err = zerrno()
            if err != EINTR_:
                _raise(err)
            PyErr_CheckSignals()
    finally:
        PyBuffer_Release(&view)


def send(sock, frames, int flags=0):
    """Send ``frames`` (a sequence of buffers) as one multipart message, each frame copied into libzmq
    as pyzmq's copying send does (zmq.Again with NOBLOCK when it cannot)."""
    cdef void *handle = _handle(sock)
    cdef Py_ssize_t i, last = len(frames) - 1
    if last < 0:
        raise IndexError("a message of no frames")
    for i in range(last):
        _send_frame(handle, frames[i], flags | SNDMORE)
    _send_frame(handle, frames[last], flags)


def send_many(sock, messages, int flags=0):
    """Send each of ``messages`` (sequences of buffers) as one multipart message, in order; how many were
    sent: fewer than all when the socket could take no more (NOBLOCK: zmq.Again on the first frame of
    the next one, not raised)."""
    cdef void *handle = _handle(sock)
    cdef Py_ssize_t i, last, sent = 0
    for frames in messages:
        last = len(frames) - 1
        if last < 0:
            raise IndexError("a message of no frames")
        try:
            _send_frame(handle, frames[0], flags | SNDMORE if last else flags)
        except Again:
            return sent
        for i in range(1, last + 1):
            _send_frame(handle, frames[i], flags | SNDMORE if i < last else flags)
        sent += 1
    return sent
